r"""The simulation: the worker loop that runs any registry algorithm's schedule on a platform model.

:func:`simulate` runs ``steps`` local steps of every worker of an
:class:`~psgdlab.core.algorithms.Algorithm` on a :class:`~psgdlab.sim.platform.Platform` with a
:class:`~psgdlab.sim.workload.Workload`, moving sizes only, and returns the trace in the shared
schema (:mod:`psgdlab.core.records.trace`). Workers follow the step semantics of
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
survivors do (:func:`psgdlab.core.platform.failure.sums_node_slices`): its pairwise averages have no
allgather after them, it has no merge barrier, and its gradient allreduce carries
:func:`~psgdlab.core.platform.failure.node_sum_elements` elements (the gradient, the slices, the step check).

Staleness (unit: *updates*, :mod:`psgdlab.core.exchange`) of a step is the number of foreign
merges (pairwise averages on either side, gossip merges) whose completion falls between the
start of the step whose weights the gradient reads (``gradient_delay`` steps back) and the
gradient's application; for server exchanges it is the server's staleness.

Workers that die (a :class:`FailureSpec`) are priced by :mod:`psgdlab.sim.engine.deaths`: what a dead
worker does, when the survivors know, the rebuilt schedule, and the steps each loses
(``SimResult.extras["failures"]``).

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

import math
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.errors import SimulationError, require
from psgdlab.core.exchange import (
    AllReduce,
    Barrier,
    ExchangeKind,
    Gossip,
    PairwiseAverage,
    ServerExchange,
    trainer_merges,
)
from psgdlab.core.platform.cost import host_work_s
from psgdlab.core.platform.failure import sums_node_slices
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.core.records.trace import PHASES, TraceBuilder
from psgdlab.sim.engine.deaths import Deaths, FailureSpec
from psgdlab.sim.engine.kernel import Context, CountingEnvironment, Flows, Merges, Scatter
from psgdlab.sim.engine.pairwise import PairwiseAverages, Pending, both_sides
from psgdlab.sim.engine.rendezvous import ALLREDUCE, BARRIER, Collectives, GossipRounds, ServerQueue
from psgdlab.sim.network import Network
from psgdlab.sim.platform import Placement, Platform
from psgdlab.sim.workload import Workload, loader_pauses

__all__ = ["SimResult", "FailureSpec", "simulate", "compute_times"]

_COMPUTE = PHASES["compute"]
_COMM = PHASES["comm"]
_OVERLAP = PHASES["overlap"]
_NAN = math.nan
_K_NONE = int(ExchangeKind.NONE)
_K_PAIR = int(ExchangeKind.PAIRWISE)


@dataclass(slots=True)
class SimResult:
    """What :func:`simulate` returns: the trace (shared schema), its metadata, and counters."""

    trace: np.ndarray
    meta: dict[str, Any]
    events: int = 0
    placement: Placement | None = None
    extras: dict[str, Any] = field(default_factory=dict)


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


class _Simulation:
    """One simulation: its parts (module docstring) and :meth:`worker`, the simpy process of one
    worker, which asks them for each exchange of each step."""

    __slots__ = (
        "alg",
        "collectives",
        "comp",
        "ctx",
        "deaths",
        "delay",
        "env",
        "gossip",
        "merges",
        "pairs",
        "period",
        "server",
        "steps",
        "sums",
    )

    def __init__(
        self,
        env: simpy.Environment,
        algorithm: Algorithm,
        network: Network,
        workload: Workload,
        comp: np.ndarray,
        *,
        steps: int,
        record: bool,
        policy: str,
        scatter: Scatter | None,
        deaths: Deaths | None,
    ) -> None:
        n = algorithm.n_workers
        self.env = env
        self.alg = algorithm
        self.steps = steps
        self.comp = [row.tolist() for row in comp]
        self.delay = int(algorithm.gradient_delay)
        ctx = self.ctx = Context(
            env,
            network,
            n_params=workload.n_params,
            itemsize=workload.itemsize,
            payload_bytes=workload.payload_bytes,
            record=record,
        )
        # the deaths the parts ask about: none in a run where nobody dies
        self.deaths = deaths if deaths is not None and deaths.failing else None
        # under continue a node of several members sums its slices with the gradient (module docstring)
        self.sums = [sums_node_slices(algorithm, policy, r) for r in range(n)]
        self.merges = Merges(n)
        wires = Flows(env, network.nics)  # transfers between hosts on the NICs
        # the schedule repeats every period steps: what it shows, it shows in the first period
        self.period = algorithm.schedule_period
        self.pairs = PairwiseAverages(
            ctx,
            self.merges,
            wires,
            shares_process=both_sides(algorithm, min(steps, 64, self.period or steps)),
            sums=self.sums,
            scatter=scatter,
            deaths=self.deaths,
        )
        self.collectives = Collectives(ctx, sums=self.sums, scatter=scatter, deaths=self.deaths)
        self.gossip = GossipRounds(ctx, self.merges, wires, deaths=self.deaths)
        self.server = ServerQueue(ctx, n)

    def _agreement(self, r: int) -> Barrier | None:
        """The node rendezvous of a worker that answers sharded pairwise requests in this run
        (H-ADPSGD's passive nodes): every step, after the gradient allreduce, its node agrees on
        the passive merges every member has received, as the runtime does; ``None`` otherwise."""
        for s in range(min(self.steps, self.period or self.steps)):
            pairs = [ex for ex in self.alg.exchanges(s, r) if type(ex) is PairwiseAverage]
            if not pairs and s == 0:
                return None  # the registry's pairwise algorithms exchange every step: none here
            for ex in pairs:
                if ex.n_shards <= 1 or len(ex.gather_group) <= 1:
                    return None  # unsharded: the merges are the worker's own, nothing to agree on
                if not ex.active:
                    return Barrier(group=ex.gather_group)
        return None

    def worker(self, r: int) -> Generator[simpy.Event, Any, None]:  # noqa: C901, PLR0915 (hot loop, kept inline)
        """Worker ``r``'s steps (the module docstring's table): start the step's non-blocking
        averages, compute, run the blocking exchanges and the gradient allreduce, apply the
        gradient once the mix it waits for has merged, then the exchanges after the update.

        The hot loop of the simulator: what the steps of the presets' algorithms do stays inline
        (a generator more a step costs them time), what only other steps have (blocking exchanges,
        exchanges after the update) is a generator of its own, entered only where the step has one.
        The plans of a repeating schedule's first period are made before the first step."""
        env = self.env
        timeout = env.timeout
        deaths = self.deaths
        sched = deaths.schedule if deaths is not None else self.alg.exchanges
        death = deaths.death[r] if deaths is not None else math.inf
        comp = self.comp[r]
        ctx = self.ctx
        rows = ctx.rows
        delay = self.delay
        merges = self.merges
        pair = self.pairs.start
        collective = self.collectives.run
        mix_ends: deque[tuple[float, list[Pending] | None]] = deque()  # a step's mix: known end, pending ones
        reads: deque[int] = deque()
        agree = None if self.sums[r] else self._agreement(r)
        merge_s, overhead_s = self._host_work_s()
        merging = merge_s > 0.0
        # the plans of the first period's steps, when the schedule repeats (the deaths' does not)
        period = (self.period if deaths is None else None) or 0
        plans = [_plan(sched(s, r), merging) for s in range(min(period, self.steps))]
        for s in range(self.steps):
            t0 = env.now
            if deaths is not None:
                if t0 >= death:
                    return
                deaths.started[r] = s + 1
            reads.append(merges.count(r, t0))
            actives, late, grad, post, folds = plans[s % period] if period else _plan(sched(s, r), merging)
            mix_end = t0
            pending: list[Pending] | None = None
            for ex in actives:
                got = pair(r, ex, t0, s, _OVERLAP)
                if type(got) is Pending:
                    pending = [got] if pending is None else [*pending, got]
                elif got > mix_end:  # type: ignore[operator]
                    mix_end = got  # type: ignore[assignment]
            mix_ends.append((mix_end, pending))
            yield timeout(comp[s])
            t_c = env.now
            if late and (yield from self._blocking(r, s, late, death)):
                return
            for ex in grad:
                if env.now >= death:
                    return
                yield from collective(r, s, ex, ALLREDUCE)
            if agree is not None and env.now < death:  # the node agrees on the sharded passive merges to apply
                yield from collective(r, s, agree, BARRIER)
            # the gradient of step s is applied after the mix of step s - delay has merged
            need, pending = mix_ends.popleft() if len(mix_ends) > delay else (t0, None)
            now = env.now
            if pending is not None:
                for h in pending:
                    if h.end is None:
                        yield h.wait(env)
                    assert h.end is not None
                    need = max(need, h.end)
            if need > now:
                if rows is not None:
                    rows.append((r, s, _COMM, _K_PAIR, now, need, -1, 0, -1, _NAN))
                if need > env.now:
                    yield timeout(need - env.now)
                now = need
            if deaths is not None:
                if now >= death:
                    return
                deaths.applied[r].append(now)
            read = reads.popleft() if len(reads) > delay else reads[0]
            stale: int | None = merges.count(r, now) - read
            if folds:
                # host work of the training thread (no record: step overhead, as in the runtime);
                # a passive side merges in its responder, off the step
                yield timeout(ctx.net.process_work_s(r, merge_s, env.now))
            if post:
                stale = yield from self._after_update(r, s, post, death, stale)
                if stale is None:
                    return
            if rows is not None:
                rows.append((r, s, _COMPUTE, _K_NONE, t0, t_c, -1, 0, stale, _NAN))
            if overhead_s > 0.0:  # the host work between this step's exchanges and the next compute
                yield timeout(ctx.net.process_work_s(r, overhead_s, env.now))

    def _host_work_s(self) -> tuple[float, float]:
        """The host work of folding an average back into the model and of a step's overhead (the
        update, the snapshot, the loop) at this run's payload, seconds."""
        plat, S = self.ctx.net.platform, self.ctx.S
        return (
            host_work_s(plat.mix_merge_s, plat.mix_merge_s_per_byte, S),
            host_work_s(plat.step_overhead_s, plat.step_overhead_s_per_byte, S),
        )

    def _blocking(self, r: int, s: int, late: tuple[Any, ...], death: float) -> Generator[simpy.Event, Any, bool]:
        """Worker ``r``'s blocking exchanges of step ``s`` after its compute (gossip rounds, blocking
        averages); ``True`` where the worker dies (at ``death``) before one of them."""
        env = self.env
        for ex in late:
            if env.now >= death:
                return True
            if type(ex) is Gossip:
                yield from self.gossip.run(r, s, ex)
            elif ex.active:
                got = self.pairs.start(r, ex, env.now, s, _COMM)
                if type(got) is Pending:
                    yield got.wait(env)
                else:
                    yield env.timeout(got - env.now)  # type: ignore[operator]
        return False

    def _after_update(
        self, r: int, s: int, post: tuple[Any, ...], death: float, stale: int | None
    ) -> Generator[simpy.Event, Any, int | None]:
        """Worker ``r``'s exchanges of step ``s`` after its update (the server's, model allreduces,
        barriers): the step's staleness (the server's where it exchanges with one, else
        ``stale``); ``None`` where the worker dies (at ``death``) before one of them."""
        env = self.env
        for ex in post:
            if env.now >= death:
                return None
            T = type(ex)
            if T is ServerExchange:
                stale = yield from self.server.run(r, s)
            elif T is AllReduce:
                yield from self.collectives.run(r, s, ex, ALLREDUCE)
            else:
                yield from self.collectives.run(r, s, ex, BARRIER)
        return stale


#: what a worker does with one step's exchanges, by when it does it: the active non-blocking
#: averages it starts with the step, the blocking exchanges after the compute, the gradient
#: allreduces, the exchanges after the update, and whether its training thread folds an average
_Plan = tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], bool]


def _plan(exs: Sequence[Any], merging: bool) -> _Plan:
    """The plan of a step with exchanges ``exs`` (dispatched on exact type: faster than
    isinstance); ``merging``: whether folding an average back is host work at all."""
    actives: list[Any] = []
    late: list[Any] = []
    grad: list[Any] = []
    post: list[Any] = []
    for ex in exs:
        T = type(ex)
        if T is PairwiseAverage:
            if ex.blocking:
                late.append(ex)
            elif ex.active:
                actives.append(ex)
        elif T is AllReduce:
            (grad if ex.payload == "grad" else post).append(ex)
        elif T is Gossip:
            late.append(ex)
        elif T is ServerExchange or T is Barrier:
            post.append(ex)
        else:
            raise SimulationError(f"exchange kind {T.__name__} is not simulated")
    return tuple(actives), tuple(late), tuple(grad), tuple(post), merging and trainer_merges(exs)


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
        Seeds the compute-time draws (``(seed, rank)`` per worker), stragglers and the scatter
        draws.
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
        Workers that die (:mod:`psgdlab.sim.engine.deaths`); ``until`` then counts the survivors
        only, and ``extras["failures"]`` says what happened.
    on_failure : {"continue", "stop", "restart"}, optional
        The run's failure policy, for the protocol it runs (module docstring: under continue a
        node of several members sums its slices with the gradient); default: ``failures``'
        policy, else stop.

    Returns
    -------
    SimResult
        ``trace`` in :data:`psgdlab.core.records.trace.TRACE_DTYPE`, sorted by start time.
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
    scatter = Scatter(seed, range(n) if streams is None else streams) if network.scatters else None
    require(until in ("first", "all"), "until", until, "must be 'first' or 'all'")
    env = CountingEnvironment()
    deaths = Deaths(env, algorithm, failures) if failures is not None else None
    sim = _Simulation(
        env,
        algorithm,
        network,
        workload,
        comp,
        steps=steps,
        record=record,
        policy=policy,
        scatter=scatter,
        deaths=deaths,
    )
    t_stop = _run(sim, deaths, until)
    meta = _meta(algorithm, platform, workload, placement, steps, t_stop, seed, streams, stragglers)
    extras: dict[str, Any] = {}
    if deaths is not None:
        extras["failures"] = deaths.extras(t_stop)
    return SimResult(trace=_trace(sim, t_stop), meta=meta, events=env.scheduled, placement=placement, extras=extras)


def _run(sim: _Simulation, deaths: Deaths | None, until: str) -> float:
    """Run every worker of ``sim`` (and the watch of ``deaths``, where there is one) until the window
    ends: when the first surviving worker has done its steps (``until="first"``: every worker is
    active over the whole window, so a straggler does not stretch it; asynchronous workers drift
    apart), or every one has (``"all"``), or a stop under failures; returns the simulated time then."""
    env = sim.env
    procs = [env.process(sim.worker(r)) for r in range(sim.alg.n_workers)]
    survivors = [p for r, p in enumerate(procs) if deaths is None or deaths.death[r] == math.inf]
    if deaths is not None and deaths.watches:
        env.process(deaths.process((sim.gossip.release, sim.collectives.release)))
    done = simpy.AnyOf(env, survivors) if until == "first" else simpy.AllOf(env, survivors)
    t_end = deaths.stop_at_s if deaths is not None else math.inf
    try:
        env.run(until=done if t_end == math.inf else simpy.AnyOf(env, [done, env.timeout(t_end)]))
    except RuntimeError as exc:
        raise SimulationError(
            f"simulation of {sim.alg.name} stalled with {len(sim.collectives.gathering)} collectives "
            f"waiting for members: the schedule is inconsistent ({exc})"
        ) from None
    return env.now


def _trace(sim: _Simulation, t_stop: float) -> np.ndarray:
    """The trace of ``sim``'s rows that end by ``t_stop`` (the window's end), sorted by start time."""
    tb = TraceBuilder()
    if sim.ctx.rows is not None:
        tb.extend(row for row in sim.ctx.rows if row[5] <= t_stop)  # tuples already in TRACE_DTYPE order
    return tb.array()


def _meta(
    algorithm: Algorithm,
    platform: Platform,
    workload: Workload,
    placement: Placement,
    steps: int,
    window_end_s: float,
    seed: int,
    streams: Sequence[int] | None,
    stragglers: StragglerModel | None,
) -> dict[str, Any]:
    """``SimResult.meta`` of a simulation whose window ended at ``window_end_s``."""
    return {
        "source": "simulator",
        "n_workers": algorithm.n_workers,
        "samples_per_step": workload.batch_per_worker,
        "algorithm": algorithm.params(),
        "platform": platform.name,
        "workload": workload.name,
        "steps_per_worker": steps,
        "window_end_s": window_end_s,
        "seed": seed,
        **({"streams": [int(x) for x in streams]} if streams is not None else {}),
        "gpus_per_node": placement.per_host,
        "hosts_used": placement.hosts_used,
        "stragglers": stragglers.spec() if stragglers is not None else "",
        "payload_bytes": workload.payload_bytes,
    }
