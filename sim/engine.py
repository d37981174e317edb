r"""The discrete-event simulator: run any registry algorithm's schedule on a platform model.

:func:`simulate` runs ``steps`` local steps of every worker of an
:class:`~psgdlab.core.algorithms.Algorithm` on a :class:`~psgdlab.sim.platform.Platform` with a
:class:`~psgdlab.sim.workload.Workload`, moving sizes only, and returns the trace in the shared
schema (:mod:`psgdlab.core.trace`). Workers follow the step semantics of
:mod:`psgdlab.core.exchange` and the simulator dispatches on the exchange *kind*, never on the
algorithm's name:

=================  ===========================================================================
exchange           simulated as
=================  ===========================================================================
PairwiseAverage    non-blocking (``"mix"``): the active side starts it with the step from its
                   communication thread and it runs beside the compute (trace phase
                   ``overlap``); the passive side answers from its *responder*. Each thread
                   carries one average at a time in arrival order; where a process is active
                   and passive at once (the random ring) its two averages share it, their
                   work going on at the processes' fair shares (the runtime's two threads
                   share the process's interpreter and cores: docs/validation.md). Each
                   average takes its link's law times a draw from the link's ``scatter``
                   (none: the law). A worker applies its gradient only when both its compute
                   and its step's exchange are done (phase ``comm`` for the tail).
                   An average in flight on the responder does not hold the update back: the
                   runtime's responder takes the model's lock only to copy it and to add the
                   average's difference back (so an update in between is kept: the atomic
                   average of ALGORITHMS.md §A.8, then the gradient).
                   ``blocking=True`` ones run after the compute (phase ``comm``).
Gossip             blocking: after the compute, wait for the neighbours to reach the same step,
                   then exchange with all of them (phase ``comm``).
AllReduce          a rendezvous of the group; one event per collective with the ring formula
                   (phase ``comm``, waiting for the slowest member included); inside a host
                   times a draw from ``platform.collective``'s ``scatter`` (none: the law).
ServerExchange     the server role: one request at a time in arrival order (phase ``wait``
                   while queued, ``comm`` while served); staleness = server updates since this
                   worker's last pull.
Barrier            a rendezvous of the group with no payload (phase ``comm``): an allreduce of
                   no bytes, its latency rounds. A node that answers sharded pairwise requests
                   in the run (H-ADPSGD) has one each step after the gradient allreduce: it
                   agrees on which passive merges every member has received (the runtime's
                   tiny allgather that keeps the node's replicas identical).
=================  ===========================================================================

Under ``on_failure="continue"`` a node of several members shares its slices as the runtime's
survivors do (:func:`psgdlab.core.failure.sums_node_slices`): its pairwise averages have no
allgather after them, it has no merge barrier, and its gradient allreduce carries
:func:`~psgdlab.core.failure.node_sum_elements` elements (the gradient, the slices, the step check).

Staleness (unit: *updates*, :mod:`psgdlab.core.exchange`) of a step is the number of foreign
merges (pairwise averages on either side, gossip merges) whose completion falls between the
start of the step whose weights the gradient reads (``gradient_delay`` steps back) and the
gradient's application; for server exchanges it is the server's staleness.

Failures
--------
A :class:`FailureSpec` kills workers at given times (:mod:`psgdlab.core.failure`). A dead
worker does nothing from its death on: its step in flight is never applied, an exchange it has
not reached never sees it (one it had reached before dying still counts it: its model or
gradient was sent). The survivors act on a death ``detection_s`` later (the runtime's watchdog
deadline):

- ``continue``: waits on the dead worker are released (a gossip wait goes on without it; a
  collective whose other members are all waiting runs over them; a pairwise average with it holds
  the requester's communication thread until then, and merges nothing), and every step that
  begins from then on follows the schedule rebuilt over the survivors
  (:func:`psgdlab.core.membership.rebuild`, :func:`~psgdlab.core.membership.survivor_exchanges`);
  ``dead`` ranks are absent from the start, their rebuilt schedule in force from step 0;
- ``stop``: the run ends ``detection_s`` after the first death (a restart is priced from this
  by :mod:`psgdlab.sim.failures`).

Accounting, per rank, in ``SimResult.extras["failures"]``: steps *started*, *applied* (the
gradient applied), *kept* and *lost*. A survivor loses nothing (the steps the window cuts are
``started - applied``). A dead worker under ``continue`` loses its step in flight and its
*unshared* applied steps: those applied after the model read of its last exchange that
completed before its death (a pairwise average or a gossip reads the model when it starts; a
gradient allreduce holds its own step's gradient), so ``kept = applied - unshared`` and
``kept + lost = started``. Under ``stop`` every rank keeps the steps of the last complete
checkpoint, :math:`c = K \lfloor \min_r \text{applied}_r / K \rfloor` (``checkpoint_every``
:math:`= K`; 0 without checkpoints), and loses ``started - c``. ``membership_changes`` lists
``{failed_at_s, time_s, step, removed, detection_s}`` per detection (``time_s`` when the
survivors act; ``step`` the first step of the slowest survivor that may run on the new schedule).

A process's pairwise averages and the server queue are analytical FIFO queues (a
``busy_until`` time per resource): with service times known when a request is made, this gives
exactly the schedule of a simpy ``Resource(capacity=1)`` without its events, so an AD-PSGD
learner step inside a host costs one or two simpy events. A pairwise average between hosts
has no service time known in advance -- its bytes share the NICs with transfers that join
later (:class:`~psgdlab.sim.network.FairLinks`) -- nor has one on a schedule whose processes
are active and passive at once -- its work shares its processes with averages that join later
(a second :class:`~psgdlab.sim.network.FairLinks`, one link a process, capacity 1) -- so it,
and any average queued behind it, is a process of its own (:meth:`_Sim.pair` returns a pending
end that the worker waits on), and the next departure of each is one timer event, replaced
whenever a transfer or an average joins or leaves.

Examples
--------
>>> from psgdlab.core.algorithms import make_algorithm
>>> from psgdlab.sim.workload import load_config
>>> cfg = load_config(preset="interspeech2019-v100")
>>> res = simulate(make_algorithm("ssgd", n_workers=8), cfg.platform, cfg.workload, steps=20, seed=0)
>>> int(res.trace["rank"].max())
7
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import simpy

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.cost import host_work_s
from psgdlab.core.errors import SimulationError, require
from psgdlab.core.exchange import (
    AllReduce,
    Barrier,
    ExchangeKind,
    Gossip,
    PairwiseAverage,
    ServerExchange,
    trainer_merges,
    wire_bytes,
)
from psgdlab.core.failure import STEP_CHECK_ELEMENTS, Failure, node_sum_elements, sums_node_slices
from psgdlab.core.membership import Rebuilt, rebuild, survivor_exchanges
from psgdlab.core.stragglers import StragglerModel
from psgdlab.core.trace import PHASES, SERVER_PEER, TraceBuilder
from psgdlab.sim.network import FairLinks, Network
from psgdlab.sim.platform import Placement, Platform
from psgdlab.sim.workload import Workload, loader_pauses

__all__ = ["SimResult", "FailureSpec", "simulate", "compute_times"]

_COMPUTE = PHASES["compute"]
_COMM = PHASES["comm"]
_WAIT = PHASES["wait"]
_OVERLAP = PHASES["overlap"]
_NAN = math.nan
_K_NONE, _K_ALLREDUCE, _K_PAIR, _K_GOSSIP, _K_SERVER, _K_BARRIER = (
    int(ExchangeKind.NONE),
    int(ExchangeKind.ALLREDUCE),
    int(ExchangeKind.PAIRWISE),
    int(ExchangeKind.GOSSIP),
    int(ExchangeKind.SERVER),
    int(ExchangeKind.BARRIER),
)  # plain ints in the hot loop


@dataclass(slots=True)
class SimResult:
    """What :func:`simulate` returns: the trace (shared schema), its metadata, and counters."""

    trace: np.ndarray
    meta: dict[str, Any]
    events: int = 0
    placement: Placement | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureSpec:
    """Workers that die in a simulation (the *Failures* section of the module docstring).

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


def compute_times(
    workload: Workload,
    n_workers: int,
    steps: int,
    *,
    seed: int,
    stragglers: StragglerModel | None = None,
    network: Network | None = None,
    streams: Sequence[int] | None = None,
) -> np.ndarray:
    """Per-(worker, step) compute times in seconds, drawn up front (shape ``(n, steps)``).

    Worker ``r`` draws from ``numpy.random.default_rng([seed, r])`` so adding workers does not
    change the draws of the others (``streams``, a permutation of the ranks: worker ``r`` takes
    the streams of rank ``streams[r]``, the same law relabelled; straggler terms stay with the
    rank they name); straggler terms multiply and pause; the input copy over the
    shared socket PCIe (``input_bytes_per_sample * batch``) and the blocking data-loader refills
    (:func:`~psgdlab.sim.workload.loader_pauses`, their own stream per worker) are added, so a
    step's compute record covers all three.
    """
    dist = workload.compute_time
    order = list(range(n_workers)) if streams is None else [int(x) for x in streams]
    require(
        sorted(order) == list(range(n_workers)), "streams", streams, f"must be a permutation of the {n_workers} ranks"
    )
    out = np.empty((n_workers, steps))
    for r in range(n_workers):
        out[r] = dist.sample(np.random.default_rng([seed, order[r], 0x5EED]), steps)
    if stragglers is not None and not stragglers.is_empty:
        for f in stragglers.fixed:
            out[f.rank] *= f.factor
        if stragglers.random or stragglers.periodic:
            only = StragglerModel(random=stragglers.random, periodic=stragglers.periodic, seed=stragglers.seed)
            for r in range(n_workers):
                row = out[r]
                for s in range(steps):
                    row[s] = only.compute_time(row[s], rank=r, step=s)
    if workload.loader_buffer_samples > 0 and workload.loader_s_per_sample > 0:
        for r in range(n_workers):
            out[r] += loader_pauses(workload, steps, np.random.default_rng([seed, order[r], 0x10AD]))
    if network is not None and workload.input_bytes_per_sample > 0:
        nbytes = workload.input_bytes_per_sample * workload.batch_per_worker
        for r in range(n_workers):
            out[r] += network.input_copy_s(r, nbytes)
    return out


_schedule = simpy.Environment.schedule


class _CountingEnvironment(simpy.Environment):
    """A simpy environment that counts the events it schedules (:attr:`SimResult.events`)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(
        self, event: simpy.Event, priority: simpy.events.EventPriority = simpy.events.NORMAL, delay: float = 0
    ) -> None:
        self.scheduled += 1
        _schedule(self, event, priority, delay)


def _gathers(r: int, ex: PairwiseAverage) -> int:
    """The slices whose allgather inside the node follows ``r``'s exchange ``ex``: all of them
    after the last slice ``r`` averages in the step (one per member between equal nodes; a member
    of the smaller of two unequal nodes averages several, :func:`~psgdlab.core.membership.survivor_exchanges`),
    none after the others; 1 when ``r`` averages the whole model itself.

    >>> slice_ = lambda j: PairwiseAverage(peer=9, active=True, shard=j, n_shards=3, gather_group=(4, 5))
    >>> [_gathers(4, slice_(0)), _gathers(4, slice_(2)), _gathers(5, slice_(1))]  # rank 4 averages slices 0 and 2
    [1, 3, 3]
    """
    group = ex.gather_group
    if not group:
        return 1
    k, i = len(group), group.index(r)
    last = i + k * ((ex.n_shards - 1 - i) // k)
    return ex.n_shards if ex.shard == last else 1


@functools.lru_cache(maxsize=256)
def _both_sides(algorithm: Algorithm, steps: int) -> bool:
    """Whether some process of ``algorithm``'s schedule is active in one pairwise average and
    passive in another (AD-PSGD's random ring; not its fixed ring, whose processes keep their
    side), over its first ``steps`` steps (callers pass at most 64: a schedule's pattern shows
    by then). Cached: a prediction simulates one schedule with many seeds."""
    active, passive = set(), set()
    for s in range(steps):
        for r in range(algorithm.n_workers):
            for ex in algorithm.exchanges(s, r):
                if type(ex) is PairwiseAverage and ex.active:
                    active.add(r)
                    passive.add(ex.peer)
        if active & passive:
            return True
    return False


def _release_after(env: simpy.Environment, waiting: simpy.Event, delay: float) -> simpy.Event:
    """A timeout ``delay`` from now that resumes, in the order they began to wait, the processes
    waiting on ``waiting`` (the group's earlier arrivals), then whoever yields it (the last one):
    one event for the whole group, scheduled now, so the group leaves at the same place among
    simultaneous events as a timeout of the last arrival's would."""
    timeout = env.timeout(delay)
    timeout.callbacks.extend(waiting.callbacks)
    waiting.callbacks.clear()
    return timeout


class _Pending:
    """A pairwise average whose end is not known when it is asked for (:meth:`_Sim.pair`):
    ``end`` is set, and ``done`` succeeds, when it ends."""

    __slots__ = ("done", "end")

    def __init__(self, done: simpy.Event) -> None:
        self.done = done
        self.end: float | None = None


def _end(x: float | _Pending) -> float:
    """When a process's pairwise averages held by ``x`` are free."""
    if type(x) is _Pending:
        assert x.end is not None
        return x.end
    return x  # type: ignore[return-value]


def _merge_at(queue: deque[float], t: float) -> None:
    """Add a merge completing at ``t`` to a worker's sorted queue of merge times."""
    if queue and queue[-1] > t:
        bisect.insort(queue, t)
    else:
        queue.append(t)


class _Flows:
    """Simpy events over a :class:`~psgdlab.sim.network.FairLinks`: :meth:`join` starts a flow
    and returns an event that succeeds, with the time, when it has gone through; the next
    departure is one timer, voided whenever a flow joins or leaves."""

    __slots__ = ("clock", "env", "events", "key", "links")

    def __init__(self, env: simpy.Environment, links: FairLinks) -> None:
        self.env = env
        self.links = links
        self.events: dict[int, simpy.Event] = {}
        self.key = 0
        self.clock = 0  # the timer in force (an arrival or departure voids the earlier one)

    def join(self, links: tuple[int, ...], amount: float, cap: float) -> simpy.Event:
        """A flow of ``amount`` over ``links`` at most ``cap`` a second, from now."""
        key = self.key = self.key + 1
        ev = self.events[key] = simpy.Event(self.env)
        self._ended(self.links.add(key, links, amount, cap, self.env.now))
        return ev

    def _ended(self, ended: list[tuple[int, float]]) -> None:
        for key, end in ended:
            self.events.pop(key).succeed(end)
        self.clock += 1
        t = self.links.next_end()
        if t < math.inf:
            clock = self.clock
            timer = self.env.timeout(max(0.0, t - self.env.now))
            timer.callbacks.append(lambda _ev: self._timer(clock))

    def _timer(self, clock: int) -> None:
        if clock == self.clock:
            self._ended(self.links.advance(self.env.now))


class _Sim:
    """One simulation's state; :meth:`worker` is the simpy process of one worker."""

    def __init__(
        self,
        algorithm: Algorithm,
        network: Network,
        workload: Workload,
        comp: np.ndarray,
        steps: int,
        record: bool,
        policy: str = "stop",
        scatter_streams: Sequence[np.random.Generator] = (),
    ) -> None:
        self.env = _CountingEnvironment()
        self.alg = algorithm
        self.net = network
        n = algorithm.n_workers
        self.n = n
        self.S = float(workload.payload_bytes)
        self.itemsize = workload.itemsize
        self.n_params = workload.n_params
        self.steps = steps
        self.comp = [row.tolist() for row in comp]
        # a process's pairwise averages: its communication thread's (active) one at a time, its
        # responder's (passive) one at a time, each lane free from a time or when the _Pending
        # average holding it ends; where a schedule has no process on both sides, one lane each
        self.lane: list[Any] = [0.0] * n
        self.passive: list[Any] = self.lane
        # where some process is on both sides (AD-PSGD's random ring), its two averages at once
        # share it: their CPU work goes on at the processes' fair shares (FairLinks of capacity 1)
        self.shares_process = _both_sides(algorithm, min(steps, 64))
        if self.shares_process:
            self.passive = [0.0] * n
        self.cpu = _Flows(self.env, FairLinks(1.0))
        self.scatter = list(scatter_streams)  # each worker's draws of its averages' scatter
        self.wires = _Flows(self.env, network.nics)  # transfers between hosts on the NICs
        self.mq: list[deque[float]] = [deque() for _ in range(n)]  # pending merge completion times
        self.mdone = [0] * n  # merges completed so far
        # collectives gathering: (release, group, arrival time by rank of those arrived so far)
        self.coll: dict[tuple[Any, ...], tuple[Any, tuple[int, ...], dict[int, float]]] = {}
        self.arrive: dict[tuple[int, int], simpy.Event] = {}
        self.server_busy = 0.0
        self.server_version = 0
        self.last_pull = [0] * n
        self.server_s = network.server_s(self.S)
        self.server_per_request = network.server_per_request
        self.delay = int(algorithm.gradient_delay)
        self.rows: list[tuple[Any, ...]] = []
        self.record = record
        self.pair_bytes: dict[int, int] = {}  # wire bytes of a pairwise average by its number of shards
        # under continue a node of several members sums its slices with the gradient (module docstring)
        self.sums = [sums_node_slices(algorithm, policy, r) for r in range(n)]
        self.sum_elements = node_sum_elements(self.n_params)
        self.sum_bytes = 2 * self.S + STEP_CHECK_ELEMENTS * self.itemsize
        # failures (FailureSpec): death and detection times, the schedules rebuilt over survivors
        self.death = [math.inf] * n
        self.detect = [math.inf] * n
        self.detected: set[int] = set()
        self.switch_s: list[float] = []  # when each rebuilt schedule takes over (sorted)
        self.epochs: list[tuple[Rebuilt, int | None]] = []  # rebuilt topology, its cycle of rounds
        self.survivor_cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.started = [0] * n
        self.applied: list[list[float]] = [[] for _ in range(n)]  # apply time of each step's gradient
        self.tracked: frozenset[int] = frozenset()  # ranks that die: their shares are recorded
        self.shares: dict[int, list[tuple[float, float]]] = {}  # (model read at, exchange done at)
        self.covered: dict[int, list[tuple[float, int]]] = {}  # (allreduce done at, steps it covers)
        self.changes: list[dict[str, Any]] = []
        self.failing = False

    # ----- failures ---------------------------------------------------------------------------
    def plan(self, spec: FailureSpec) -> float:
        """Set up ``spec``'s deaths and rebuilt schedules; returns when a stop ends the run
        (``inf`` under continue)."""
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
        self.failing = bool(self.tracked or self.detected)
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
        self.switch_s.append(t)
        self.epochs.append((rebuilt, cycle))

    def schedule(self, s: int, r: int) -> tuple[Any, ...]:
        """The exchanges of step ``s`` of ``r``: the algorithm's, or after a detected failure
        the schedule rebuilt over the survivors (:func:`psgdlab.core.membership.survivor_exchanges`)."""
        template = self.alg.exchanges(s, r)
        i = bisect.bisect_right(self.switch_s, self.env.now) - 1 if self.switch_s else -1
        if i < 0:
            return template
        rebuilt, cycle = self.epochs[i]
        key = (i, s if cycle is None else s % cycle, r, template)
        out = self.survivor_cache.get(key)
        if out is None:
            out = self.survivor_cache[key] = survivor_exchanges(rebuilt, template, r, s)
        return out

    def failure_process(self):
        """At each detection time: the dead are known, waits on them are released."""
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
            for (j, _s), ev in list(self.arrive.items()):
                if j in newly and not ev.triggered:
                    ev.succeed()  # a gossip partner waiting on the dead goes on without it
            for key, entry in list(self.coll.items()):
                ev, group, times = entry
                living = tuple(g for g in group if g not in self.detected)
                if living == group:
                    continue
                del self.coll[key]
                here = {a: t for a, t in times.items() if a not in self.detected}
                kind, payload, _first, _size, step = key
                if len(here) == len(living):  # every survivor of the group is waiting: go
                    size = self.S if kind == _K_ALLREDUCE else 0.0
                    arrived = tuple(here[g] for g in living)
                    dur = self._allreduce(kind, payload, living, size, arrived) if len(living) > 1 else 0.0
                    _release_after(env, ev, dur)
                else:
                    self.coll[(kind, payload, living[0], len(living), step)] = (ev, living, here)

    def lost_steps(self, r: int) -> tuple[int, int]:
        """``(in_flight, unshared)`` of a worker that died: its step begun but not applied, and
        its applied steps whose update no exchange completed before its death carried to
        another worker (the *Failures* section of the module docstring)."""
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

    # ----- staleness bookkeeping --------------------------------------------------------------
    def merges_done(self, r: int, t: float) -> int:
        q = self.mq[r]
        done = self.mdone[r]
        while q and q[0] <= t:
            q.popleft()
            done += 1
        self.mdone[r] = done
        return done

    # ----- exchanges --------------------------------------------------------------------------
    def pair(self, r: int, ex: PairwiseAverage, t: float, s: int, phase: int) -> float | _Pending:
        """Start an active pairwise average of step ``s`` at ``t``, queued behind the averages of
        ``r`` and of the peer, active or passive (FIFO, :attr:`lane`), and record it (``phase``:
        ``overlap`` from its start, ``comm`` from ``t``). Returns its end, or a :class:`_Pending`
        when that is not known yet: it crosses the NICs (whose transfers end as others join and
        leave, or shares a process with another average) or waits for one that does."""
        peer = ex.peer
        mine, theirs = self.lane[r], self.passive[peer]
        if type(mine) is not float or type(theirs) is not float or self.shares_process or self.net.crosses(r, peer):
            h = _Pending(simpy.Event(self.env))
            self.lane[r] = self.passive[peer] = h
            self.env.process(self._pair_later(r, ex, t, s, phase, mine, theirs, h))
            return h
        start = max(t, mine, theirs)
        if start >= self.detect[peer]:  # a peer known dead: nothing to average with
            return self._settle(r, ex, s, phase, t, start, start)[0]
        nbytes = self._pair_nbytes(ex)
        dur = self.net.pair_average_s(r, peer, nbytes, start, gather=self._gather(r, ex), model_bytes=self.S)
        dur *= self._scatter(r, peer)
        end, merged = self._settle(r, ex, s, phase, t, start, start + dur)
        self.lane[r] = end
        if merged:
            self.passive[peer] = end
        return end

    def _pair_later(
        self, r: int, ex: PairwiseAverage, t: float, s: int, phase: int, mine: Any, theirs: Any, h: _Pending
    ):
        """The process of a pairwise average whose end is not known when it is asked for
        (:meth:`pair`): it waits for the averages ahead of it on ``r`` and on the peer, then
        (between hosts) for its device-to-host copies, its bytes' time on the NICs at their fair
        share (:attr:`Network.nics`), the path's latency, its CPU work's stretch, the host average
        and copies back, its scatter (:meth:`_scatter`, past its bytes' time), and the allgather
        after it. Where processes are shared (:attr:`shares_process`) what follows the bytes --
        inside a host, the whole average -- is work of both processes at their fair shares
        (:meth:`on_cpu`)."""
        env, net, peer = self.env, self.net, ex.peer
        for x in (mine, theirs):
            if type(x) is _Pending and x.end is None:
                yield x.done
        start = max(t, _end(mine), _end(theirs))
        if start > env.now:
            yield env.timeout(start - env.now)
        if start < self.detect[peer]:
            nbytes, gather = self._pair_nbytes(ex), self._gather(r, ex)
            if net.crosses(r, peer):
                before = net.pair_before_wire(r, peer, nbytes, start)
                if before > 0.0:
                    yield env.timeout(before)
                links, cap, after = net.wire(r, peer, nbytes, env.now)
                yield self.on_wire(links, nbytes, cap)
                after += net.pair_after_wire(r, peer, nbytes, env.now + after)
                factor = self._scatter(r, peer)
                if factor != 1.0:  # the law is the whole average; the bytes' time stays
                    after = max(0.0, after + (factor - 1.0) * (before + nbytes / cap + after))
                if gather > 1:
                    after += net.allgather_s(r, gather, self.S, env.now + after)
                yield self.on_cpu((r, peer), after) if self.shares_process else env.timeout(after)
            else:
                dur = net.pair_average_s(r, peer, nbytes, start, gather=gather, model_bytes=self.S)
                dur *= self._scatter(r, peer)
                yield self.on_cpu((r, peer), dur) if self.shares_process else env.timeout(dur)
        end = self._settle(r, ex, s, phase, t, start, env.now)[0]
        if end > env.now:  # the peer died first: the request hangs until the deadline
            yield env.timeout(end - env.now)
        for lane, x in ((self.lane, r), (self.passive, peer)):
            if lane[x] is h:  # nothing queued behind it: the lane is free from its end
                lane[x] = end
        h.end = end
        h.done.succeed()

    def _scatter(self, r: int, peer: int) -> float:
        """The factor of ``r``'s next active average with ``peer`` over its law: a draw from its
        link's ``scatter`` (:meth:`Network.pair_scatter`, :meth:`_draw`) from ``r``'s stream."""
        return self._draw(self.net.pair_scatter(r, peer), r)

    def _draw(self, q: tuple[float, ...], r: int) -> float:
        """A draw from the ``scatter`` quantiles ``q``, linear between them, from ``r``'s stream;
        1 without them."""
        if not q:
            return 1.0
        x = float(self.scatter[r].random()) * (len(q) - 1)
        i = min(int(x), len(q) - 2)
        return q[i] + (q[i + 1] - q[i]) * (x - i)

    def _allreduce(
        self, kind: int, payload: str, group: tuple[int, ...], size: float, times: tuple[float, ...]
    ) -> float:
        """How long a collective over ``group`` takes from now, its last member's arrival
        (``times``: each member's): the allreduce (:meth:`Network.allreduce_s`) times a draw
        from its ``scatter`` (:meth:`Network.allreduce_scatter`, from the first member's
        stream), then for a model allreduce the fold of the mean into each member."""
        env = self.env
        dur = self.net.allreduce_s(group, size, env.now, times)
        if kind == _K_ALLREDUCE:
            dur *= self._draw(self.net.allreduce_scatter(group), group[0])
            if payload == "model":
                dur += self.net.model_average_s(group, self.S, env.now + dur)
        return dur

    def on_cpu(self, procs: tuple[int, ...], work_s: float) -> simpy.Event:
        """An event that succeeds, with the time, when ``work_s`` of work of the processes
        ``procs`` begun now is done, each process shared fairly among the averages it carries
        (max-min over ``procs``: an average goes at the pace of its busier process)."""
        return self.cpu.join(procs, work_s, 1.0)

    def _settle(self, r: int, ex: PairwiseAverage, s: int, phase: int, t: float, start: float, end: float):
        """Close ``r``'s active average ``ex`` of step ``s``, asked for at ``t``, begun at ``start``,
        its transfer over at ``end`` (``start`` itself when the peer was known dead by then:
        nothing was sent). A peer that died before ``end`` leaves the request hanging until its
        deadline, with nothing merged; otherwise both sides merge (:meth:`_merged`). Records it
        (``phase``: ``overlap`` from its start, ``comm`` from ``t``); returns its end and whether
        it merged."""
        peer = ex.peer
        merged = start < self.detect[peer] and end <= self.death[peer]
        if merged:
            self._merged(r, peer, start, end)
        elif start < self.detect[peer]:
            end = self.detect[peer]
        if self.record:
            nbytes = self._pair_nbytes(ex) if merged else 0
            self.rows.append((r, s, phase, _K_PAIR, t if phase == _COMM else start, end, peer, nbytes, -1, _NAN))
        return end, merged

    def _gather(self, r: int, ex: PairwiseAverage) -> int:
        """Shards of the allgather after ``r``'s average ``ex`` (1: none; a node that sums its
        slices with the gradient has none, :func:`_gathers` otherwise)."""
        return 1 if self.sums[r] else _gathers(r, ex)

    def _pair_nbytes(self, ex: PairwiseAverage) -> int:
        nbytes = self.pair_bytes.get(ex.n_shards)
        if nbytes is None:
            nbytes = self.pair_bytes[ex.n_shards] = wire_bytes(ex, self.n_params, self.itemsize)[0]
        return nbytes

    def _merged(self, r: int, peer: int, start: float, end: float) -> None:
        """Book a pairwise average of ``r`` and ``peer`` that read the models at ``start`` and
        merged at ``end``: the merge on both sides, the shares of the workers that die."""
        if self.tracked:
            for x in (r, peer):
                if x in self.tracked:
                    self.shares[x].append((start, end))
        _merge_at(self.mq[r], end)
        _merge_at(self.mq[peer], end)

    def on_wire(self, links: tuple[int, ...], nbytes: float, cap: float) -> simpy.Event:
        """An event that succeeds, with the time, when ``nbytes`` put on the NIC ``links`` now
        at most ``cap`` bytes/s have left them at their fair share (:class:`~psgdlab.sim.network.FairLinks`)."""
        return self.wires.join(links, nbytes, cap)

    def collective(self, r: int, s: int, ex: AllReduce | Barrier, kind: int):
        group = ex.group
        if self.detected:
            group = tuple(g for g in group if g not in self.detected)
        if len(group) <= 1:
            return
        env = self.env
        key = (kind, getattr(ex, "payload", ""), group[0], len(group), s)
        entry = self.coll.get(key)
        if entry is None:
            entry = self.coll[key] = (simpy.Event(env), group, {})
        ev, _group, times = entry
        t_arr = times[r] = env.now
        payload = getattr(ex, "payload", "")
        summed = payload == "grad" and self.sums[r]  # the node's slices ride with the gradient
        nbytes = wire_bytes(ex, self.sum_elements if summed else self.n_params, self.itemsize)[0]
        if len(times) == len(group):
            del self.coll[key]
            size = 0.0 if kind != _K_ALLREDUCE else self.sum_bytes if summed else self.S
            ev = _release_after(env, ev, self._allreduce(kind, payload, group, size, tuple(times[g] for g in group)))
        yield ev
        if self.tracked and r in self.tracked and kind == _K_ALLREDUCE and payload == "grad":
            self.covered[r].append((env.now, s + 1))  # the group holds this step's gradient
        if self.record:
            self.rows.append((r, s, _COMM, kind, t_arr, env.now, -1, nbytes, -1, _NAN))

    def gossip(self, r: int, s: int, ex: Gossip):
        env = self.env
        t_arr = env.now
        key = (r, s)
        ev = self.arrive.pop(key, None)
        if ev is None:
            ev = simpy.Event(env)
        ev.succeed()
        self.arrive[key] = ev
        waits = []
        peers = ex.peers
        if self.detected:
            peers = tuple(j for j in peers if j not in self.detected)
        for j in peers:
            e = self.arrive.get((j, s))
            if e is None:
                e = simpy.Event(env)
                self.arrive[(j, s)] = e
            if not e.triggered:
                waits.append(e)
        if waits:
            yield simpy.AllOf(env, waits)
        start = env.now
        end = start
        wires = []
        for j in peers:
            if j in self.detected:  # a peer found dead while waiting sends nothing
                continue
            if self.net.crosses(r, j):  # on the NICs at their fair share, then the path's latency
                links, cap, after = self.net.wire(r, j, self.S, start, both_ways=False)  # j sends its own
                wires.append((self.on_wire(links, self.S, cap), after))
            else:
                end = max(end, start + self.net.transfer_s(r, j, self.S, start))
        if wires:
            yield simpy.AllOf(env, [w for w, _ in wires])
            end = max(end, *(cast(float, w.value) + after for w, after in wires))  # each value: when it left the NICs
        if end > env.now:
            yield env.timeout(end - env.now)
        if r in self.tracked:
            self.shares[r].append((start, env.now))
        _merge_at(self.mq[r], env.now)
        self.arrive.pop((r, s - 2), None)
        if self.record:
            sent = wire_bytes(ex, self.n_params, self.itemsize)[0]
            self.rows.append((r, s, _COMM, _K_GOSSIP, t_arr, env.now, -1, sent, -1, _NAN))

    def server(self, r: int, s: int):
        env = self.env
        now = env.now
        start = max(now, self.server_busy)
        end = start + (self.net.server_s(self.S, rank=r, start=start) if self.server_per_request else self.server_s)
        self.server_busy = end
        stale = self.server_version - self.last_pull[r]
        self.server_version += 1
        self.last_pull[r] = self.server_version
        if self.record:
            if start > now:
                self.rows.append((r, s, _WAIT, _K_SERVER, now, start, SERVER_PEER, 0, -1, _NAN))
            self.rows.append((r, s, _COMM, _K_SERVER, start, end, SERVER_PEER, int(self.S), -1, _NAN))
        yield env.timeout(end - now)
        return stale

    def _agreement(self, r: int) -> Barrier | None:
        """The node rendezvous of a worker that answers sharded pairwise requests in this run
        (H-ADPSGD's passive nodes): every step, after the gradient allreduce, its node agrees on
        the passive merges every member has received, as the runtime does; ``None`` otherwise."""
        for s in range(self.steps):
            pairs = [ex for ex in self.alg.exchanges(s, r) if type(ex) is PairwiseAverage]
            if not pairs and s == 0:
                return None  # the registry's pairwise algorithms exchange every step: none here
            for ex in pairs:
                if ex.n_shards <= 1 or len(ex.gather_group) <= 1:
                    return None  # unsharded: the merges are the worker's own, nothing to agree on
                if not ex.active:
                    return Barrier(group=ex.gather_group)
        return None

    # ----- the worker process -----------------------------------------------------------------
    def worker(self, r: int):
        env = self.env
        failing = self.failing
        sched = self.schedule if failing else self.alg.exchanges
        death = self.death[r]
        applied = self.applied[r]
        comp = self.comp[r]
        rows = self.rows
        record = self.record
        delay = self.delay
        mix_ends: deque[tuple[float, list[_Pending] | None]] = deque()  # a step's mix: known end, pending ones
        reads: deque[int] = deque()
        timeout = env.timeout
        agree = None if self.sums[r] else self._agreement(r)
        plat = self.net.platform
        merge_s = host_work_s(plat.mix_merge_s, plat.mix_merge_s_per_byte, self.S)  # folding an average back
        overhead_s = host_work_s(plat.step_overhead_s, plat.step_overhead_s_per_byte, self.S)  # update, snapshot, loop
        for s in range(self.steps):
            t0 = env.now
            if failing:
                if t0 >= death:
                    return
                self.started[r] = s + 1
            reads.append(self.merges_done(r, t0))
            exs: Sequence[Any] = sched(s, r)  # dispatched on exact type below (faster than isinstance)
            mix_end = t0
            pending: list[_Pending] | None = None
            late: list[Any] = []
            grad: list[Any] = []
            post: list[Any] = []
            for ex in exs:
                T = type(ex)
                if T is PairwiseAverage:
                    if ex.blocking:
                        late.append(ex)
                    elif ex.active:
                        got = self.pair(r, ex, t0, s, _OVERLAP)
                        if isinstance(got, _Pending):
                            pending = [got] if pending is None else [*pending, got]
                        elif got > mix_end:
                            mix_end = got
                elif T is AllReduce:
                    (grad if ex.payload == "grad" else post).append(ex)
                elif T is Gossip:
                    late.append(ex)
                elif T is ServerExchange or T is Barrier:
                    post.append(ex)
                else:
                    raise SimulationError(f"exchange kind {T.__name__} is not simulated")
            mix_ends.append((mix_end, pending))
            yield timeout(comp[s])
            t_c = env.now
            for ex in late:
                if env.now >= death:
                    return
                if type(ex) is Gossip:
                    yield from self.gossip(r, s, ex)
                elif ex.active:
                    got = self.pair(r, ex, env.now, s, _COMM)
                    if isinstance(got, _Pending):
                        yield got.done
                    else:
                        yield timeout(got - env.now)
            for ex in grad:
                if env.now >= death:
                    return
                yield from self.collective(r, s, ex, _K_ALLREDUCE)
            if agree is not None and env.now < death:  # the node agrees on the sharded passive merges to apply
                yield from self.collective(r, s, agree, _K_BARRIER)
            # the gradient of step s is applied after the mix of step s - delay has merged
            need, pending = mix_ends.popleft() if len(mix_ends) > delay else (t0, None)
            now = env.now
            if pending is not None:
                for h in pending:
                    if h.end is None:
                        yield h.done
                    assert h.end is not None
                    need = max(need, h.end)
            if need > now:
                if record:
                    rows.append((r, s, _COMM, _K_PAIR, now, need, -1, 0, -1, _NAN))
                if need > env.now:
                    yield timeout(need - env.now)
                now = need
            if failing:
                if now >= death:
                    return
                applied.append(now)
            read = reads.popleft() if len(reads) > delay else reads[0]
            stale = self.merges_done(r, now) - read
            if merge_s > 0.0 and trainer_merges(exs):
                # host work of the training thread (no record: step overhead, as in the runtime);
                # a passive side merges in its responder, off the step
                yield timeout(self.net.process_work_s(r, merge_s, env.now))
            for ex in post:
                if env.now >= death:
                    return
                T = type(ex)
                if T is ServerExchange:
                    stale = yield from self.server(
                        r,
                        s,
                    )
                elif T is AllReduce:
                    yield from self.collective(r, s, ex, _K_ALLREDUCE)
                else:
                    yield from self.collective(r, s, ex, _K_BARRIER)
            if record:
                rows.append((r, s, _COMPUTE, _K_NONE, t0, t_c, -1, 0, stale, _NAN))
            if overhead_s > 0.0:  # the host work between this step's exchanges and the next compute
                yield timeout(self.net.process_work_s(r, overhead_s, env.now))


def simulate(
    algorithm: Algorithm,
    platform: Platform,
    workload: Workload,
    *,
    steps: int,
    seed: int = 0,
    stragglers: StragglerModel | None = None,
    gpus_per_node: int | None = None,
    record: bool = True,
    until: str = "first",
    streams: Sequence[int] | None = None,
    failures: FailureSpec | None = None,
    on_failure: str | None = None,
) -> SimResult:
    """Simulate ``steps`` local steps of every worker of ``algorithm``.

    Parameters
    ----------
    algorithm : Algorithm
        Any registry algorithm (its schedule is all the simulator reads).
    platform, workload : Platform, Workload
    steps : int
        Local steps per worker (the simulated window).
    seed : int
        Seeds the compute-time draws (``(seed, rank)`` per worker) and stragglers.
    stragglers : StragglerModel or None
    gpus_per_node : int or None
        Workers per host (default: the algorithm's ``gpus_per_node`` if it has one, else every
        device of a host).
    record : bool
        Keep trace rows (turn off for pure throughput benchmarks).
    until : {"first", "all"}
        ``"first"`` (predictions): the window ends when the first worker has done ``steps``
        steps, so a straggler does not stretch it, and records ending later are dropped;
        ``"all"`` (the emulator): run until every worker has done all its steps, so every
        worker's steps 0 .. steps-1 are in the trace.
    streams : sequence of int, optional
        A permutation of the ranks: worker ``r`` draws its compute times from rank
        ``streams[r]``'s random streams (:func:`compute_times`). The law is the same; a
        prediction averaged over relabellings (:func:`psgdlab.sim.predict.predict_one`'s
        ``streams``) gives two configurations that are one system with the workers renamed the
        same figure.
    failures : FailureSpec, optional
        Workers that die (the *Failures* section of the module docstring); ``until`` then
        counts the survivors only, and ``extras["failures"]`` says what happened.
    on_failure : {"continue", "stop", "restart"}, optional
        The run's failure policy, for the protocol it runs (module docstring: under continue a
        node of several members sums its slices with the gradient); default: ``failures``'
        policy, else stop.

    Returns
    -------
    SimResult
        ``trace`` in :data:`psgdlab.core.trace.TRACE_DTYPE`, sorted by start time.
    """
    if steps < 1:
        raise SimulationError(f"steps ({steps}) must be >= 1")
    n = algorithm.n_workers
    per_host = gpus_per_node if gpus_per_node is not None else getattr(algorithm, "gpus_per_node", None)
    placement = Placement.pack(platform, n, per_host)
    network = Network(platform, placement)
    if stragglers is not None:
        stragglers.validate(n)
    comp = compute_times(workload, n, steps, seed=seed, stragglers=stragglers, network=network, streams=streams)
    policy = on_failure or (failures.policy if failures is not None else "stop")
    order = range(n) if streams is None else streams
    scatter = [np.random.default_rng([seed, int(order[r]), 0x5CA7]) for r in range(n)] if network.scatters else []
    sim = _Sim(algorithm, network, workload, comp, steps, record, policy, scatter)
    require(until in ("first", "all"), "until", until, "must be 'first' or 'all'")
    t_end = math.inf
    if failures is not None:
        for f in failures.failures:
            require(0 <= f.rank < n, "failure rank", f.rank, f"must be in [0, {n})")
        require(all(0 <= r < n for r in failures.dead), "dead", failures.dead, f"must be ranks in [0, {n})")
        t_end = sim.plan(failures)
    procs = [sim.env.process(sim.worker(r)) for r in range(n)]
    survivors = [p for r, p in enumerate(procs) if sim.death[r] == math.inf]
    require(len(survivors) >= 1, "failures", failures, "leave no worker alive")
    if sim.failing and failures is not None and failures.policy == "continue":
        sim.env.process(sim.failure_process())
    # the window ends when the first worker has done ``steps`` steps: every worker is active over
    # the whole window, so a straggler does not stretch it (asynchronous workers drift apart)
    done = simpy.AnyOf(sim.env, survivors) if until == "first" else simpy.AllOf(sim.env, survivors)
    try:
        sim.env.run(until=done if t_end == math.inf else simpy.AnyOf(sim.env, [done, sim.env.timeout(t_end)]))
    except RuntimeError as exc:
        raise SimulationError(
            f"simulation of {algorithm.name} stalled with {len(sim.coll)} collectives "
            f"waiting for members: the schedule is inconsistent ({exc})"
        ) from None
    t_stop = sim.env.now
    tb = TraceBuilder()
    tb.extend(row for row in sim.rows if row[5] <= t_stop)  # tuples already in TRACE_DTYPE order
    trace = tb.array()
    meta = {
        "source": "simulator",
        "n_workers": n,
        "samples_per_step": workload.batch_per_worker,
        "algorithm": algorithm.params(),
        "platform": platform.name,
        "workload": workload.name,
        "steps_per_worker": steps,
        "window_end_s": t_stop,
        "seed": seed,
        **({"streams": [int(x) for x in streams]} if streams is not None else {}),
        "gpus_per_node": placement.per_host,
        "hosts_used": placement.hosts_used,
        "stragglers": stragglers.spec() if stragglers is not None else "",
        "payload_bytes": workload.payload_bytes,
    }
    extras: dict[str, Any] = {}
    if failures is not None:
        extras["failures"] = _failure_extras(sim, failures, t_stop, stopped=t_end < math.inf and t_stop >= t_end)
    return SimResult(trace=trace, meta=meta, events=sim.env.scheduled, placement=placement, extras=extras)


def _failure_extras(sim: _Sim, spec: FailureSpec, t_stop: float, *, stopped: bool) -> dict[str, Any]:
    """What the failures did to a simulation: membership changes, survivors, steps begun,
    applied, kept and lost per rank (the *Failures* section of the module docstring)."""
    n = sim.n
    started = list(sim.started)
    applied = [len(a) for a in sim.applied]
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
        for r in sim.tracked:
            if sim.death[r] <= t_stop:
                flying, unshared = sim.lost_steps(r)
                in_flight[r] = flying
                lost[r] = flying + unshared
                kept[r] = applied[r] - unshared
    return {
        "policy": spec.policy,
        "detection_s": spec.detection_s,
        "membership_changes": list(sim.changes),
        "survivors": [r for r in range(n) if sim.death[r] == math.inf],
        "dead": [r for r in range(n) if sim.death[r] <= t_stop],
        "stopped_at_s": t_stop if stopped else None,
        "checkpoint_step": checkpoint,
        "steps_started": started,
        "steps_applied": applied,
        "steps_kept": kept,
        "steps_lost": lost,
        "steps_in_flight": in_flight,
        "applied_at_s": [np.asarray(a) for a in sim.applied],
    }
