"""What a run does when a worker dies, defined once for ``train``, ``predict`` and ``validate``.

Three policies (``--on-failure``):

========== ========================================================================================
continue   the survivors detect the dead worker within the deadline, agree on the new membership and
           go on over the topology :func:`psgdlab.core.membership.rebuild` re-forms without it;
           only algorithms whose schedule is gossip (:attr:`Algorithm.gossip <psgdlab.core.
           algorithms.base.Algorithm.gossip>`: adpsgd, dpsgd, hadpsgd) can, and it is their default
stop       every survivor exits; the error names the dead rank and the step (the default of the
           synchronous and server-based algorithms, whose every step needs every worker)
restart    the run restarts from its last complete checkpoint with the same workers (torchrun's
           elastic agent, ``--max-restarts``); the steps since that checkpoint are lost
========== ========================================================================================

A failure to inject or to predict is written ``RANK@SECONDS`` (:class:`Failure`): worker ``RANK``
dies ``SECONDS`` after the run's first step.

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
"""

from __future__ import annotations

from dataclasses import dataclass

from psgdlab.core.algorithms import ALGORITHMS
from psgdlab.core.errors import ConfigError, require

__all__ = ["ON_FAILURE", "Failure", "check_on_failure", "default_on_failure", "gossip_algorithms"]

#: the values of ``--on-failure``
ON_FAILURE = ("continue", "stop", "restart")


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
