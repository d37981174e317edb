r"""Worker deaths in one simulation: who dies when, when the survivors know, the schedule they
rebuild, and what each dead worker loses.

A :class:`FailureSpec` kills workers at given times (:mod:`psgdlab.core.platform.failure`). A dead
worker does nothing from its death on: its step in flight is never applied, an exchange it has
not reached never sees it (one it had reached before dying still counts it: its model or
gradient was sent). The survivors act on a death ``detection_s`` later (the runtime's watchdog
deadline):

- ``continue``: waits on the dead worker are released (a gossip wait goes on without it; a
  collective whose other members are all waiting runs over them; a pairwise average with it holds
  the requester's communication thread until then, and merges nothing), and every step that
  begins from then on follows the schedule rebuilt over the survivors
  (:func:`psgdlab.core.graphs.membership.rebuild`, :func:`~psgdlab.core.graphs.membership.survivor_exchanges`);
  ``dead`` ranks are absent from the start, their rebuilt schedule in force from step 0;
- ``stop``: the run ends ``detection_s`` after the first death (a restart is priced from this
  by :mod:`psgdlab.sim.failures`).

Accounting, per rank, in ``SimResult.extras["failures"]`` (:meth:`Deaths.extras`): steps
*started*, *applied* (the gradient applied), *kept* and *lost*. A survivor loses nothing (the
steps the window cuts are ``started - applied``). A dead worker under ``continue`` loses its step
in flight and its *unshared* applied steps: those applied after the model read of its last
exchange that completed before its death (a pairwise average or a gossip reads the model when it
starts; a gradient allreduce holds its own step's gradient), so ``kept = applied - unshared`` and
``kept + lost = started``. Under ``stop`` every rank keeps the steps of the last complete
checkpoint, :math:`c = K \lfloor \min_r \text{applied}_r / K \rfloor` (``checkpoint_every``
:math:`= K`; 0 without checkpoints), and loses ``started - c``. ``membership_changes`` lists
``{failed_at_s, time_s, step, removed, detection_s}`` per detection (``time_s`` when the
survivors act; ``step`` the first step of the slowest survivor that may run on the new schedule).

A simulation without a :class:`FailureSpec` has no :class:`Deaths`, and its parts ask nothing
of one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.errors import require
from psgdlab.core.graphs.membership import Rebuilt, rebuild, survivor_exchanges
from psgdlab.core.platform.failure import Failure

__all__ = ["FailureSpec", "Deaths"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureSpec:
    """Workers that die in a simulation (module docstring).

    ``failures`` die at their ``time_s``; ``dead`` are absent from the start (a configuration
    that already lost them: its schedule is the rebuilt one from step 0); ``policy`` is
    ``"continue"`` (the survivors switch to the rebuilt schedule ``detection_s`` after each
    death) or ``"stop"`` (the run ends ``detection_s`` after the first death; a restart is
    priced by the predictor from this); ``checkpoint_every`` sets the last complete checkpoint
    that a stop reports (0: none)."""

    failures: tuple[Failure, ...] = ()
    dead: tuple[int, ...] = ()
    policy: str = "continue"
    detection_s: float = 0.0
    checkpoint_every: int = 0

    def __post_init__(self) -> None:
        require(self.policy in ("continue", "stop"), "policy", self.policy, "must be 'continue' or 'stop'")
        require(self.detection_s >= 0, "detection_s", self.detection_s, "must be >= 0 seconds")
        require(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, "must be >= 0")

    def check(self, n: int) -> None:
        """Refuse ranks outside ``n`` workers."""
        for f in self.failures:
            require(0 <= f.rank < n, "failure rank", f.rank, f"must be in [0, {n})")
        require(all(0 <= r < n for r in self.dead), "dead", self.dead, f"must be ranks in [0, {n})")


#: what a death detection releases: ``(newly detected, every detected rank)``
Release = Callable[[set[int], set[int]], None]


class Deaths:
    """The deaths of one simulation (module docstring) and what the engine asks of them.

    ``death[r]`` and ``detect[r]`` are when ``r`` dies and when the survivors know (``inf``:
    never); ``detected`` the ranks known dead by now. Per rank: ``started`` steps and the apply
    time of each step's gradient (``applied``), booked by the worker loop while
    :attr:`failing`; for the ranks that die (``tracked``) the exchanges that carried their model
    (``shares``: model read at, done at) or their gradient (``covered``: done at, steps)."""

    __slots__ = (
        "_cache",
        "_epochs",
        "_switch_s",
        "alg",
        "applied",
        "changes",
        "covered",
        "death",
        "detect",
        "detected",
        "env",
        "failing",
        "n",
        "shares",
        "spec",
        "started",
        "stop_at_s",
        "tracked",
    )

    def __init__(self, env: simpy.Environment, algorithm: Algorithm, spec: FailureSpec) -> None:
        n = algorithm.n_workers
        spec.check(n)
        self.env = env
        self.alg = algorithm
        self.n = n
        self.spec = spec
        self.death = [math.inf] * n
        self.detect = [math.inf] * n
        self.detected: set[int] = set()
        self._switch_s: list[float] = []  # when each rebuilt schedule takes over (sorted)
        self._epochs: list[tuple[Rebuilt, int | None]] = []  # rebuilt topology, its cycle of rounds
        self._cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.started = [0] * n
        self.applied: list[list[float]] = [[] for _ in range(n)]
        self.tracked: frozenset[int] = frozenset()
        self.shares: dict[int, list[tuple[float, float]]] = {}
        self.covered: dict[int, list[tuple[float, int]]] = {}
        self.changes: list[dict[str, Any]] = []
        self.stop_at_s = self._plan(spec)
        #: whether anyone dies: otherwise the run is the failure-free one, and books nothing
        self.failing = bool(self.tracked or self.detected)
        require(any(d == math.inf for d in self.death), "failures", spec, "leave no worker alive")

    # ----- plan ---------------------------------------------------------------------------------
    def _plan(self, spec: FailureSpec) -> float:
        """Set up the deaths and rebuilt schedules; returns when a stop ends the run (``inf``
        under continue)."""
        n, D = self.n, spec.detection_s
        dead = set(spec.dead)
        for r in dead:
            self.death[r] = self.detect[r] = 0.0
        self.detected |= dead
        topo = self.alg.membership_topology()
        if dead:
            require(topo is not None, "dead", spec.dead, f"needs a schedule that {self.alg.name} can rebuild")
            assert topo is not None
            self._add_epoch(0.0, rebuild(topo, [r for r in range(n) if r not in dead]))
        failures = [f for f in spec.failures if f.rank not in dead]
        if spec.policy == "stop":
            failures = failures[:1]
        for f in failures:
            self.death[f.rank] = min(self.death[f.rank], f.time_s)
            self.detect[f.rank] = self.death[f.rank] + D
        self.tracked = frozenset(f.rank for f in failures)
        self.shares = {r: [] for r in self.tracked}
        self.covered = {r: [] for r in self.tracked}
        if spec.policy == "stop":
            return failures[0].time_s + D if failures else math.inf
        assert topo is not None or not failures
        for t in sorted({self.detect[f.rank] for f in failures}):
            gone = dead | {r for r in range(n) if self.detect[r] <= t}
            assert topo is not None
            self._add_epoch(t, rebuild(topo, [r for r in range(n) if r not in gone]))
        return math.inf

    def _add_epoch(self, t: float, rebuilt: Rebuilt) -> None:
        cycle: int | None = 1
        if not rebuilt.is_static and rebuilt.inner is not None:
            period = rebuilt.inner.period
            cycle = None if period is None else max(1, period) * max(1, rebuilt.units)
        self._switch_s.append(t)
        self._epochs.append((rebuilt, cycle))

    @property
    def watches(self) -> bool:
        """Whether the survivors act on deaths while the run goes on (``continue`` with deaths to
        detect): :meth:`process` must run."""
        return self.failing and self.spec.policy == "continue"

    # ----- what the engine asks -----------------------------------------------------------------
    def schedule(self, s: int, r: int) -> tuple[Any, ...]:
        """The exchanges of step ``s`` of ``r`` begun now: the algorithm's, or after a detected
        failure the schedule rebuilt over the survivors."""
        template = self.alg.exchanges(s, r)
        i = bisect.bisect_right(self._switch_s, self.env.now) - 1 if self._switch_s else -1
        if i < 0:
            return template
        rebuilt, cycle = self._epochs[i]
        key = (i, s if cycle is None else s % cycle, r, template)
        out = self._cache.get(key)
        if out is None:
            out = self._cache[key] = survivor_exchanges(rebuilt, template, r, s)
        return out

    def alive(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """``ranks`` less those known dead by now."""
        detected = self.detected
        return tuple(g for g in ranks if g not in detected) if detected else ranks

    def pair_outcome(self, peer: int, start: float, end: float) -> tuple[float, bool]:
        """A pairwise average with ``peer`` begun at ``start`` whose transfer is over at ``end``
        (``start``: none was made): merged when the peer was not known dead at its start and was
        alive at its end; a peer that died first leaves the request hanging until its deadline.
        Returns the average's end and whether it merged."""
        detect = self.detect[peer]
        if start < detect and end <= self.death[peer]:
            return end, True
        return (detect if start < detect else end), False

    def share(self, r: int, peer: int, start: float, end: float) -> None:
        """A pairwise average of ``r`` and ``peer`` read the models at ``start`` and merged at
        ``end``: it carried the model of either that dies."""
        for x in (r, peer):
            if x in self.tracked:
                self.shares[x].append((start, end))

    def cover(self, r: int, t: float, steps: int) -> None:
        """A gradient allreduce that ended at ``t`` holds ``r``'s first ``steps`` steps."""
        if r in self.tracked:
            self.covered[r].append((t, steps))

    def process(self, releases: tuple[Release, ...]) -> Generator[simpy.Event, Any, None]:
        """The simpy process of the survivors: at each detection time the dead are known, and
        each of ``releases`` lets go of the waits on them."""
        env = self.env
        for t in sorted({self.detect[r] for r in self.tracked}):
            yield env.timeout(t - env.now)
            newly = {r for r in self.tracked if self.detect[r] == t}
            self.detected |= newly
            alive = [r for r in range(self.n) if r not in self.detected]
            self.changes.append(
                {
                    "failed_at_s": min(self.death[r] for r in newly),
                    "time_s": t,
                    "step": min(self.started[r] for r in alive) if alive else 0,
                    "removed": sorted(newly),
                    "detection_s": t - min(self.death[r] for r in newly),
                }
            )
            for release in releases:
                release(newly, self.detected)

    # ----- what happened ------------------------------------------------------------------------
    def lost_steps(self, r: int) -> tuple[int, int]:
        """``(in_flight, unshared)`` of a worker that died: its step begun but not applied, and
        its applied steps whose update no exchange completed before its death carried to
        another worker (module docstring)."""
        death = self.death[r]
        applied = self.applied[r]
        covered = 0
        for read_at, done_at in self.shares.get(r, ()):
            if done_at <= death:
                covered = max(covered, bisect.bisect_right(applied, read_at))
        for done_at, steps in self.covered.get(r, ()):
            if done_at <= death:
                covered = max(covered, steps)
        return self.started[r] - len(applied), max(0, len(applied) - covered)

    def extras(self, t_stop: float) -> dict[str, Any]:
        """What the deaths did to a simulation that ended at ``t_stop`` (module docstring)."""
        spec, n = self.spec, self.n
        stopped = self.stop_at_s < math.inf and t_stop >= self.stop_at_s
        started = list(self.started)
        applied = [len(a) for a in self.applied]
        kept = list(applied)
        lost = [0] * n
        in_flight = [0] * n
        checkpoint = None
        if spec.policy == "stop" and stopped:
            k = spec.checkpoint_every
            floor = min(applied[r] for r in range(n) if r not in spec.dead)
            checkpoint = (floor // k) * k if k > 0 else 0
            for r in range(n):
                if r not in spec.dead:
                    kept[r] = checkpoint
                    lost[r] = started[r] - checkpoint
                    in_flight[r] = started[r] - applied[r]
        else:
            for r in self.tracked:
                if self.death[r] <= t_stop:
                    flying, unshared = self.lost_steps(r)
                    in_flight[r] = flying
                    lost[r] = flying + unshared
                    kept[r] = applied[r] - unshared
        return {
            "policy": spec.policy,
            "detection_s": spec.detection_s,
            "membership_changes": list(self.changes),
            "survivors": [r for r in range(n) if self.death[r] == math.inf],
            "dead": [r for r in range(n) if self.death[r] <= t_stop],
            "stopped_at_s": t_stop if stopped else None,
            "checkpoint_step": checkpoint,
            "steps_started": started,
            "steps_applied": applied,
            "steps_kept": kept,
            "steps_lost": lost,
            "steps_in_flight": in_flight,
            "applied_at_s": [np.asarray(a) for a in self.applied],
        }
