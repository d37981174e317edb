r"""Worker failures: what a run does when a worker dies, and the failures a prediction injects.

One vocabulary for ``psgdlab train`` and ``psgdlab predict``: the policy (:data:`ON_FAILURE`),
which policies an algorithm allows (:func:`check_on_failure`), a failure ``RANK@SECONDS``
(:class:`Failure`, :func:`parse_failure`) and seeded random failures at a rate per worker-hour
(:func:`draw_failures`).

Policies
--------
- ``continue`` -- the survivors notice the dead worker (within the detection deadline), agree on
  the new membership and go on with the schedule rebuilt over themselves
  (:func:`psgdlab.core.membership.rebuild`). Only algorithms whose schedule follows a topology
  that can be rebuilt allow it (:meth:`~psgdlab.core.algorithms.Algorithm.membership_topology`:
  the gossip algorithms, ``adpsgd``, ``dpsgd``, ``hadpsgd``); it is their default.
- ``stop`` -- the run ends cleanly once the failure is detected; checkpoints on disk allow a
  later ``--resume``. The default of every other algorithm (an allreduce, a block sync or a
  server needs every worker).
- ``restart`` -- the run is relaunched with the same number of workers (torchrun's elastic agent
  replaces the dead one) and resumes from the last complete checkpoint: the steps since it are
  done again.

Random failures
---------------
Each worker fails after an exponential time of mean :math:`3600 / r` seconds (``r`` failures per
worker-hour), drawn from ``numpy.random.default_rng([seed, draw, rank, 0xFA11])`` so that one worker's
draws do not depend on how many workers there are. Under ``continue`` and ``stop`` a worker fails
at most once (a dead worker does not come back); under ``restart`` the replacement worker has its
own exponential lifetime from the restart, so each rank contributes a Poisson process of rate
:math:`r` per hour of run time (``restart=True`` draws its arrivals).

Examples
--------
>>> parse_failure("3@120.5")
Failure(rank=3, time_s=120.5)
>>> parse_failure("3@-1")
Traceback (most recent call last):
...
psgdlab.core.errors.ConfigError: --fail ('3@-1') SECONDS must be a finite number >= 0
>>> [f.rank for f in draw_failures(2.0, 4, horizon_s=3600.0, seed=0)]
[0, 3, 2, 1]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from psgdlab.core.errors import ConfigError, require

if TYPE_CHECKING:
    from psgdlab.core.algorithms.base import Algorithm

__all__ = [
    "ON_FAILURE",
    "OnFailure",
    "Failure",
    "parse_failure",
    "check_failures",
    "default_on_failure",
    "check_on_failure",
    "draw_failures",
    "failure_specs",
]

#: what a run does when a worker dies (module docstring)
ON_FAILURE: tuple[str, ...] = ("continue", "stop", "restart")
OnFailure = Literal["continue", "stop", "restart"]


@dataclass(frozen=True, slots=True, order=True)
class Failure:
    """Worker ``rank`` dies ``time_s`` seconds after the run started (wall or simulated time)."""

    rank: int
    time_s: float


def parse_failure(text: str) -> Failure:
    """``"RANK@SECONDS"`` -> :class:`Failure` (the ``--fail`` flag); one-line
    :class:`ConfigError` for anything else."""
    rank_text, sep, time_text = str(text).partition("@")
    require(bool(sep), "--fail", text, "must be RANK@SECONDS, like 3@120")
    try:
        rank = int(rank_text)
    except ValueError:
        raise ConfigError(f"--fail ({text!r}) RANK must be an integer") from None
    try:
        time_s = float(time_text)
    except ValueError:
        raise ConfigError(f"--fail ({text!r}) SECONDS must be a number") from None
    require(rank >= 0, "--fail", text, "RANK must be >= 0")
    require(math.isfinite(time_s) and time_s >= 0, "--fail", text, "SECONDS must be a finite number >= 0")
    return Failure(rank=rank, time_s=time_s)


def check_failures(failures: Iterable[Failure], n_workers: int, *, policy: str) -> tuple[Failure, ...]:
    """The failures sorted by time, checked against ``n_workers`` and ``policy``: ranks in
    ``[0, n_workers)``, times finite and ``>= 0``; under ``continue`` a rank fails at most once
    and at least one worker survives."""
    out = tuple(sorted(failures, key=lambda f: (f.time_s, f.rank)))
    for f in out:
        require(0 <= f.rank < n_workers, "--fail", f"{f.rank}@{f.time_s:g}", f"RANK must be in [0, {n_workers})")
        require(math.isfinite(f.time_s) and f.time_s >= 0, "--fail", f"{f.rank}@{f.time_s}", "SECONDS must be >= 0")
    if policy == "continue":
        ranks = [f.rank for f in out]
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        require(not twice, "--fail", twice, "names a rank twice: a dead worker does not come back under continue")
        require(len(set(ranks)) < n_workers, "--fail", ranks, f"kills all {n_workers} workers: one must survive")
    return out


def default_on_failure(algorithm: Algorithm) -> str:
    """``continue`` where the schedule can be rebuilt over the survivors, else ``stop``."""
    return "continue" if algorithm.membership_topology() is not None else "stop"


def check_on_failure(algorithm: Algorithm, policy: str | None) -> str:
    """``policy`` (or the algorithm's default when ``None``), refused where it does not apply:
    ``continue`` needs a schedule that can be rebuilt over the survivors."""
    if policy is None:
        return default_on_failure(algorithm)
    require(policy in ON_FAILURE, "--on-failure", policy, f"must be one of {', '.join(ON_FAILURE)}")
    if policy == "continue" and algorithm.membership_topology() is None:
        raise ConfigError(
            f"--on-failure (continue) does not apply to {algorithm.name}: its exchanges need every worker "
            "(an allreduce, a block sync or a server); use stop or restart"
        )
    return policy


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
        "--failure-rate",
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


def failure_specs(failures: Sequence[Failure]) -> list[str]:
    """``RANK@SECONDS`` of each failure (for resolved configs)."""
    return [f"{f.rank}@{f.time_s:g}" for f in failures]
