"""What a run does when a worker dies, defined once for ``train``, ``predict`` and ``validate``.

Three policies (``--on-failure``):

========== ========================================================================================
continue   the survivors detect the dead worker within the deadline, agree on the new membership and
           go on over the topology :func:`psgdlab.core.graphs.membership.rebuild` re-forms without it;
           only algorithms whose schedule is gossip (:attr:`Algorithm.gossip <psgdlab.core.
           algorithms.base.Algorithm.gossip>`: adpsgd, dpsgd, hadpsgd) can, and it is their default
stop       every survivor exits; the error names the dead rank and the step (the default of the
           synchronous and server-based algorithms, whose every step needs every worker)
restart    the run restarts from its last complete checkpoint with the same workers (torchrun's
           elastic agent, ``--max-restarts``); the steps since that checkpoint are lost
========== ========================================================================================

Under ``continue`` a node of several members (H-ADPSGD with ``gpus_per_node > 1``) shares its
slices another way (:func:`sums_node_slices`): the groups made at start-up cannot be re-made
without the dead, so instead of an allgather after each sharded exchange and a per-step agreement
on the passive merges, each member sums its slice deltas with the gradient in the node's
allreduce, which then carries twice the model and a step check (:data:`STEP_CHECK_ELEMENTS`);
the runtime runs it and the simulator prices it.

A failure to inject or to predict is written ``RANK@SECONDS`` (:class:`Failure`): worker ``RANK``
dies ``SECONDS`` after the run's first step; :func:`check_failures` checks a sequence of them
against a run.

Random failures (``psgdlab predict --failure-rate R``, :func:`draw_failures`): each worker fails
after an exponential time of mean :math:`3600 / R` seconds (``R`` failures per worker-hour), drawn
from ``numpy.random.default_rng([seed, draw, rank, 0xFA11])`` so that one worker's draws do not
depend on how many workers there are. Under ``continue`` and ``stop`` a worker fails at most once
(a dead worker does not come back); under ``restart`` the replacement has its own exponential
lifetime from then on, so each rank is a Poisson process of rate ``R`` per hour of run time.

Examples
--------
>>> default_on_failure("adpsgd"), default_on_failure("ssgd")
('continue', 'stop')
>>> check_on_failure("bmuf", "continue")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
psgdlab.core.errors.ConfigError: on-failure ('continue') needs a gossip algorithm (...), not bmuf; use stop or restart
>>> Failure.parse("3@12.5")
Failure(rank=3, time_s=12.5)
>>> [f.rank for f in draw_failures(2.0, 4, horizon_s=3600.0, seed=0)]
[0, 3, 2, 1]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from psgdlab.core.algorithms import ALGORITHMS, Algorithm
from psgdlab.core.errors import ConfigError, require
from psgdlab.core.exchange import PairwiseAverage

__all__ = [
    "ON_FAILURE",
    "STEP_CHECK_ELEMENTS",
    "Failure",
    "check_on_failure",
    "default_on_failure",
    "gossip_algorithms",
    "check_failures",
    "draw_failures",
    "node_sum_elements",
    "sums_node_slices",
]

#: the policies of ``--on-failure`` -> what each does (the one list: the flag's choices and help
#: and every check read it)
ON_FAILURE: dict[str, str] = {
    "continue": "survivors re-form the gossip topology; gossip algorithms only",
    "stop": "every rank exits, the error names the dead rank and the step",
    "restart": "from the last complete checkpoint under torchrun's elastic agent, --max-restarts times",
}


#: what a node's sum under ``continue`` carries beside the gradient and the slices: the step
#: modulo 1024 and its square, whose sums over the members show that all are at one step
STEP_CHECK_ELEMENTS = 2


def sums_node_slices(algorithm: Algorithm, policy: str, rank: int, step: int = 0) -> bool:
    """Whether ``rank`` shares the slices of its pairwise averages with its node through the
    gradient allreduce (module docstring): under ``continue``, when its pairwise averages at
    ``step`` move slices of the model (a node of several members).

    >>> from psgdlab.core.algorithms import make_algorithm
    >>> h = make_algorithm("hadpsgd", n_workers=4, gpus_per_node=2)
    >>> sums_node_slices(h, "continue", 0), sums_node_slices(h, "stop", 0)
    (True, False)
    >>> sums_node_slices(make_algorithm("adpsgd", n_workers=4), "continue", 0)
    False
    """
    return policy == "continue" and any(
        isinstance(ex, PairwiseAverage) and ex.n_shards > 1 for ex in algorithm.exchanges(step, rank)
    )


def node_sum_elements(n_params: int) -> int:
    """The elements of a node's allreduce when it sums slices (:func:`sums_node_slices`): the
    gradient, the slices' deltas and the step check."""
    return 2 * n_params + STEP_CHECK_ELEMENTS


def gossip_algorithms() -> tuple[str, ...]:
    """The registry's algorithms whose survivors can go on without a dead worker."""
    return tuple(name for name, cls in ALGORITHMS.items() if cls.gossip)


def default_on_failure(algorithm: str) -> str:
    """``continue`` for a gossip algorithm, ``stop`` for every other."""
    return "continue" if ALGORITHMS[algorithm].gossip else "stop"


def check_on_failure(algorithm: str, policy: str) -> str:
    """``policy`` if ``algorithm`` can follow it; a :class:`ConfigError` naming the rule if not."""
    require(policy in ON_FAILURE, "on-failure", policy, f"must be one of {', '.join(ON_FAILURE)}")
    if policy == "continue":
        require(
            ALGORITHMS[algorithm].gossip,
            "on-failure",
            policy,
            f"needs a gossip algorithm ({', '.join(gossip_algorithms())}), not {algorithm}",
            hint="use stop or restart",
        )
    return policy


@dataclass(frozen=True, slots=True)
class Failure:
    """Worker ``rank`` dies ``time_s`` seconds after the run's first step."""

    rank: int
    time_s: float

    @classmethod
    def parse(cls, text: str) -> Failure:
        """``"RANK@SECONDS"`` -> :class:`Failure` (rank >= 0, seconds >= 0)."""
        rank, sep, seconds = text.partition("@")
        try:
            if not sep:
                raise ValueError
            out = cls(int(rank), float(seconds))
        except ValueError:
            raise ConfigError(f"fail ({text!r}) must be RANK@SECONDS, like 3@120") from None
        require(out.rank >= 0, "fail", text, "needs a rank >= 0")
        require(out.time_s >= 0 and out.time_s != float("inf"), "fail", text, "needs a finite time >= 0 seconds")
        return out

    def check_rank(self, n_workers: int) -> None:
        """A :class:`ConfigError` unless the rank is one of ``n_workers`` workers."""
        require(self.rank < n_workers, "fail", f"{self.rank}@{self.time_s:g}", f"names no worker of {n_workers}")


def check_failures(failures: Iterable[Failure], n_workers: int, *, policy: str) -> tuple[Failure, ...]:
    """The failures sorted by time, each checked against ``n_workers`` (:meth:`Failure.check_rank`);
    under ``continue`` a rank fails at most once and at least one worker survives."""
    out = tuple(sorted(failures, key=lambda f: (f.time_s, f.rank)))
    for f in out:
        f.check_rank(n_workers)
        require(
            math.isfinite(f.time_s) and f.time_s >= 0,
            "fail",
            f"{f.rank}@{f.time_s}",
            "needs a finite time >= 0 seconds",
        )
    if policy == "continue":
        ranks = [f.rank for f in out]
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        require(not twice, "fail", twice, "names a rank twice: a dead worker does not come back under continue")
        require(len(set(ranks)) < n_workers, "fail", ranks, f"kills all {n_workers} workers: one must survive")
    return out


def draw_failures(
    rate_per_worker_hour: float,
    n_workers: int,
    *,
    horizon_s: float,
    seed: int,
    draw: int = 0,
    restart: bool = False,
) -> tuple[Failure, ...]:
    """Seeded random failures before ``horizon_s`` (module docstring), sorted by time.

    Parameters
    ----------
    rate_per_worker_hour : float
        Failures per worker per hour, ``>= 0`` (0: none).
    n_workers : int
    horizon_s : float
        Only failures before this time are drawn.
    seed, draw : int
        Draw ``draw`` of seed ``seed`` (independent streams per draw and per rank).
    restart : bool
        Each rank may fail again (a replaced worker); else at most once.
    """
    require(
        math.isfinite(rate_per_worker_hour) and rate_per_worker_hour >= 0,
        "failure-rate",
        rate_per_worker_hour,
        "must be a finite number of failures per worker-hour >= 0",
    )
    if rate_per_worker_hour == 0 or horizon_s <= 0:
        return ()
    mean_s = 3600.0 / rate_per_worker_hour
    out: list[Failure] = []
    for rank in range(n_workers):
        rng = np.random.default_rng([seed, draw, rank, 0xFA11])
        t = float(rng.exponential(mean_s))
        while t < horizon_s:
            out.append(Failure(rank=rank, time_s=t))
            if not restart:
                break
            t += float(rng.exponential(mean_s))
    return tuple(sorted(out, key=lambda f: (f.time_s, f.rank)))
