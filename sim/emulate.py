r"""The emulator: replay a trace with real model replicas at the simulated event times.

:func:`replay` walks the records of a trace (:mod:`psgdlab.core.records.trace` schema; from the
simulator, or the reference executor's clock-less trace) in time order and applies the core
kernels of the algorithm to one real replica per worker, following the step semantics of
:mod:`psgdlab.core.exchange`:

=====================  ======================================================================
trace record           emulator event
=====================  ======================================================================
compute start          **read**: the worker's weights are snapshotted; the gradient of step
                       ``s`` is computed on the snapshot of step ``s - D`` (``D`` =
                       ``algorithm.gradient_delay``) with the minibatch of step ``s``. The
                       worker's own ``"mix"`` exchanges of step ``s`` send this model (the
                       model "as it was at the start of the step").
pairwise (active side) the passive side answers with its model at the record's start; both
                       merge at the record's end: ``params <- params + (mixed - sent)``, so
                       local changes made while the exchange ran are kept. Sharded exchanges
                       (H-ADPSGD) average one slice per member; each member merges the
                       allgathered slices.
gossip                 merge at the record's end with the neighbours' step-start models.
allreduce (grad)       the group's gradients are averaged at the last member's record end.
apply                  ``algorithm.local_update`` once the step's compute, its gradient
                       allreduce and its waits have ended (the latest end among the step's
                       compute, ``comm`` and ``wait`` records other than post exchanges).
allreduce (model)      mean of the members' models, then ``algorithm.combine``, at the last
                       member's record end.
server exchange        ``server_message`` / ``server_apply`` / ``combine`` at the record's end,
                       in time order (ties: rank order, as the reference executor).
=====================  ======================================================================

**Ties** at equal times are broken in the reference executor's phase order: merges, gradient
allreduces, applies, post exchanges, reads, passive sends; then step, then rank. A merge whose
exchange took no time at all is moved after the sends of that instant. With this order a
clock-less reference trace (step ``s`` computes from ``s`` to ``s+1``, every exchange at
``s+1``) replays the lock-step rounds exactly, so the replay of
:func:`psgdlab.core.reference.run_reference`'s trace on :class:`~psgdlab.core.reference.LeastSquaresReplicas`
equals the reference executor bit for bit.

**Staleness** of a gradient is counted as the core defines it: foreign merges applied to the
worker's model between the read of step ``s - D`` and the apply (the server's staleness for
server exchanges), so it emerges from the platform model that produced the trace.

**Gradients are lazy and batched**: a read only records ``(rank, step, snapshot)``; when an
apply or an allreduce needs a gradient that is not computed yet, every pending entry is
computed in one call of :meth:`~psgdlab.core.replicas.Replicas.gradients` (batched by the
torch replicas, :class:`psgdlab.models.replicas.TorchReplicas`).

**Structure.** :func:`index_trace` turns the trace into the emulator's events (each a
:class:`ReplayEvent` of one :class:`EventKind`, dispatched on the record's exchange kind) in
the order they are applied; :class:`Applier` holds the workers' state and has one method per
event kind. Nothing here depends on the algorithm's name, nor on the replicas' array type:
the replicas (:class:`psgdlab.core.replicas.Replicas`) do the array work the kernels cannot.
The pipeline that simulates a configuration and replays it on a torch model is
:mod:`psgdlab.emulate` (``psgdlab emulate``).

Examples
--------
>>> from psgdlab.core.algorithms import make_algorithm
>>> from psgdlab.core.reference import LeastSquaresProblem, LeastSquaresReplicas, run_reference
>>> alg = make_algorithm("adpsgd", n_workers=4)
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=4, batch=8, seed=0)
>>> ref = run_reference(alg, problem, steps=10, lr=0.05)
>>> emu = replay(alg, ref.trace, LeastSquaresReplicas(problem), lr=0.05, meta={"source": "reference"})
>>> bool((np.stack(emu.params) == ref.params[-1]).all())
True
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from psgdlab.core.algorithms.base import Algorithm, ServerState
from psgdlab.core.errors import SimulationError
from psgdlab.core.exchange import AllReduce, ExchangeKind, Gossip, PairwiseAverage, ServerExchange
from psgdlab.core.records.trace import PHASES, TRACE_DTYPE
from psgdlab.core.replicas import Replicas

__all__ = ["EmulationResult", "replay", "index_trace", "ReplayIndex", "ReplayEvent", "EventKind", "Applier"]

Array = Any

# tie-break phases at equal times (the reference executor's order, reads after posts)
_MERGE, _GRAD, _APPLY, _POST, _READ, _PSEND, _LATE_MERGE = 0, 1, 2, 3, 4, 5, 6
_COMPUTE, _COMM, _WAIT = PHASES["compute"], PHASES["comm"], PHASES["wait"]


class EventKind(enum.Enum):
    """What the emulator does at an event (one :class:`Applier` method each)."""

    READ = "read"  # a compute record starts: snapshot, pending gradient
    PAIR_SEND = "pair_send"  # the passive side of a pairwise exchange answers
    PAIR_MERGE = "pair_merge"  # one side of a pairwise exchange merges
    GOSSIP_MERGE = "gossip_merge"  # a gossip exchange merges the neighbours' models
    GRAD_ALLREDUCE = "grad_allreduce"  # a group's gradients are averaged
    APPLY = "apply"  # local_update with the step's gradient
    MODEL_ALLREDUCE = "model_allreduce"  # a group's models are averaged and combined
    SERVER = "server"  # a server exchange: message, server apply, combine


class ReplayEvent(NamedTuple):
    """One emulator event; events apply in the order of the first five fields."""

    time_s: float
    phase: int  # tie-break class at equal times (the reference executor's phase order)
    step: int
    rank: int
    seq: int  # creation order: the last tie-break
    kind: EventKind
    data: Any = None


class _Pair:
    """One pairwise exchange (the active side's record stands for both sides)."""

    __slots__ = ("active", "ex_a", "ex_p", "passive", "sent_p", "step")

    def __init__(self, active: int, passive: int, ex_a: PairwiseAverage, ex_p: PairwiseAverage, step: int) -> None:
        self.active, self.passive, self.ex_a, self.ex_p, self.step = active, passive, ex_a, ex_p, step
        self.sent_p: Array = None


@dataclass(slots=True)
class EmulationResult:
    """What :func:`replay` returns.

    ``params``: final model of every worker. ``staleness[r, s]`` / ``batch_loss[r, s]``: per
    (rank, step) as seen by the emulator (-1 / NaN where the trace has no such step).
    ``rounds``: per round (every ``n`` applied gradients) ``time_s``, ``epoch`` and
    ``consensus_distance``. ``evals``: at evaluation points ``time_s``, ``epoch``, ``loss``
    (of the workers' mean model), ``accuracy`` (when the replicas report it),
    ``consensus_distance``. ``trace``: the input trace with the emulator's staleness and
    minibatch losses on compute records. ``gradient_batches``: sizes of the batched gradient
    calls.
    """

    params: list[Array]
    staleness: np.ndarray
    batch_loss: np.ndarray
    rounds: dict[str, np.ndarray]
    evals: dict[str, np.ndarray]
    trace: np.ndarray
    meta: dict[str, Any]
    server: ServerState | None = None
    gradient_batches: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Final figures (JSON-able)."""
        ev = self.evals
        out: dict[str, Any] = {
            "final_loss": float(ev["loss"][-1]) if len(ev["loss"]) else None,
            "final_consensus_distance": float(ev["consensus_distance"][-1]) if len(ev["consensus_distance"]) else None,
            "simulated_time_s": float(ev["time_s"][-1]) if len(ev["time_s"]) else 0.0,
            "epochs": float(ev["epoch"][-1]) if len(ev["epoch"]) else 0.0,
            "staleness_mean": float(self.staleness[self.staleness >= 0].mean()) if (self.staleness >= 0).any() else 0.0,
            "staleness_max": int(self.staleness.max()) if self.staleness.size else 0,
            "gradient_batch_mean": float(np.mean(self.gradient_batches)) if self.gradient_batches else 0.0,
        }
        if "accuracy" in ev and len(ev["accuracy"]):
            out["final_accuracy"] = float(ev["accuracy"][-1])
        losses = self.batch_loss[np.isfinite(self.batch_loss)]
        out["final_batch_loss"] = (
            float(np.mean(self.batch_loss[:, -1][np.isfinite(self.batch_loss[:, -1])])) if losses.size else None
        )
        return out


# ----- the indexer: trace records -> emulator events -------------------------------------------
@dataclass(slots=True)
class ReplayIndex:
    """The events of a trace in application order, and the shape of the run."""

    n_workers: int
    n_steps: int
    events: list[ReplayEvent]


class _Indexer:
    """Builds the events of one trace; one method per exchange kind of a non-compute record."""

    def __init__(self, algorithm: Algorithm, trace: np.ndarray, meta: Mapping[str, Any]) -> None:
        self.algorithm = algorithm
        n = self.n = algorithm.n_workers
        compute = trace[trace["phase"] == _COMPUTE]
        if compute.size == 0:
            raise SimulationError("trace has no compute records to replay")
        if int(compute["rank"].max()) >= n or int(compute["rank"].min()) < 0:
            raise SimulationError(
                f"trace ranks [{compute['rank'].min()}, {compute['rank'].max()}] do not fit "
                f"{algorithm.name} with {n} workers"
            )
        self.n_steps = int(compute["step"].max()) + 1
        self.logical = meta.get("source") == "reference"
        self.delay = int(algorithm.gradient_delay)
        self.comp_start = np.full((n, self.n_steps), np.nan)
        self.comp_end = np.full((n, self.n_steps), np.nan)
        self.comp_start[compute["rank"], compute["step"]] = compute["start_s"]
        self.comp_end[compute["rank"], compute["step"]] = compute["end_s"]
        if np.isnan(self.comp_start).any():
            r, s = np.argwhere(np.isnan(self.comp_start))[0]
            raise SimulationError(f"trace has no compute record for rank {r} step {s} (steps must be contiguous)")
        self.apply_t = self.comp_end.copy()  # when each step's gradient may be applied
        self.events: list[ReplayEvent] = []
        self._schedules: dict[tuple[int, int], tuple[Any, ...]] = {}
        self.ar_seen: dict[tuple[int, int], int] = {}
        self.grad_ar: dict[tuple[tuple[int, ...], int], float] = {}
        self.model_ar: dict[tuple[tuple[int, ...], int], tuple[float, AllReduce]] = {}
        self.mix_end: dict[tuple[int, int], float] = {}
        self.by_kind: dict[int, Callable[[int, int, int, float, float, int], None]] = {
            ExchangeKind.ALLREDUCE: self.allreduce,
            ExchangeKind.PAIRWISE: self.pairwise,
            ExchangeKind.GOSSIP: self.gossip,
            ExchangeKind.SERVER: self.server,
            ExchangeKind.BARRIER: self.barrier,
        }

    def schedule(self, s: int, r: int) -> tuple[Any, ...]:
        out = self._schedules.get((s, r))
        if out is None:
            out = self._schedules[(s, r)] = self.algorithm.exchanges(s, r)
        return out

    def push(self, t: float, phase: int, step: int, rank: int, kind: EventKind, data: Any = None) -> None:
        self.events.append(ReplayEvent(float(t), phase, step, rank, len(self.events), kind, data))

    def extend_apply(self, r: int, s: int, t: float) -> None:
        self.apply_t[r, s] = max(self.apply_t[r, s], t)

    # ----- one method per exchange kind (records of rank r, step s, phase ph, [t0, t1]) ----------
    def no_exchange(self, r: int, s: int, ph: int, t0: float, t1: float, peer: int) -> None:
        if ph in (_COMM, _WAIT):
            self.extend_apply(r, s, t1)

    def allreduce(self, r: int, s: int, ph: int, t0: float, t1: float, peer: int) -> None:
        ars = [e for e in self.schedule(s, r) if isinstance(e, AllReduce)]
        ars.sort(key=lambda e: e.payload != "grad")
        i = self.ar_seen.get((r, s), 0)
        self.ar_seen[(r, s)] = i + 1
        if i >= len(ars):
            raise SimulationError(
                f"trace has an allreduce at rank {r} step {s} that {self.algorithm.name}'s schedule does not have"
            )
        ex = ars[i]
        key = (ex.group, s)
        if ex.payload == "grad":
            self.grad_ar[key] = max(self.grad_ar.get(key, -math.inf), t1)
            self.extend_apply(r, s, t1)
        else:
            prev = self.model_ar.get(key)
            self.model_ar[key] = (max(prev[0] if prev else -math.inf, t1), ex)

    def pairwise(self, r: int, s: int, ph: int, t0: float, t1: float, p: int) -> None:
        if ph in (_COMM, _WAIT):
            self.extend_apply(r, s, t1)
        if p < 0:
            return  # a wait for the step's averaging, not an exchange
        ex = next((e for e in self.schedule(s, r) if isinstance(e, PairwiseAverage) and e.peer == p), None)
        if ex is None:
            raise SimulationError(
                f"trace has a pairwise exchange of rank {r} with {p} at step {s} that "
                f"{self.algorithm.name}'s schedule does not have"
            )
        if not ex.active:
            return  # the active side's record stands for the pair
        back = next((e for e in self.schedule(s, p) if isinstance(e, PairwiseAverage) and e.peer == r), None)
        if back is None or back.active:
            raise SimulationError(f"schedule is inconsistent at step {s}: rank {p} does not answer rank {r}")
        pair = _Pair(r, p, ex, back, s)
        start = self.comp_start[r, s] if self.logical else t0
        end = max(t1, start)
        self.push(start, _PSEND, s, p, EventKind.PAIR_SEND, pair)
        merge_phase = _LATE_MERGE if end <= start else _MERGE
        self.push(end, merge_phase, s, r, EventKind.PAIR_MERGE, (pair, True))
        self.push(end, merge_phase, s, p, EventKind.PAIR_MERGE, (pair, False))
        self.mix_end[(r, s)] = max(self.mix_end.get((r, s), -math.inf), end)

    def gossip(self, r: int, s: int, ph: int, t0: float, t1: float, peer: int) -> None:
        ex = next((e for e in self.schedule(s, r) if isinstance(e, Gossip)), None)
        if ex is None:
            raise SimulationError(f"trace has a gossip at rank {r} step {s} that the schedule does not have")
        start = self.comp_start[r, s]
        end = max(t1, start)
        self.push(end, _MERGE if end > start else _LATE_MERGE, s, r, EventKind.GOSSIP_MERGE, ex)
        self.extend_apply(r, s, end)

    def server(self, r: int, s: int, ph: int, t0: float, t1: float, peer: int) -> None:
        if ph != _COMM:
            return  # the server's waits hold nothing back: the exchange applies at its end
        ex = next((e for e in self.schedule(s, r) if isinstance(e, ServerExchange)), None)
        if ex is None:
            raise SimulationError(f"trace has a server exchange at rank {r} step {s} that the schedule does not have")
        self.push(t1, _POST, s, r, EventKind.SERVER, ex)

    def barrier(self, r: int, s: int, ph: int, t0: float, t1: float, peer: int) -> None:
        """A barrier moves no data; its end holds nothing back beyond the records around it."""

    # ----- the whole trace --------------------------------------------------------------------
    def index(self, trace: np.ndarray) -> ReplayIndex:
        others = trace[trace["phase"] != _COMPUTE]
        others = others[np.lexsort((others["start_s"], others["step"], others["rank"]))]
        for rec in others:
            s = int(rec["step"])
            if s >= self.n_steps:
                continue
            handler = self.by_kind.get(int(rec["kind"]), self.no_exchange)
            handler(
                int(rec["rank"]), s, int(rec["phase"]), float(rec["start_s"]), float(rec["end_s"]), int(rec["peer"])
            )
        n, n_steps, apply_t = self.n, self.n_steps, self.apply_t
        for (r, s), t in self.mix_end.items():  # the gradient of step s + D waits for the mix of step s
            if s + self.delay < n_steps:
                apply_t[r, s + self.delay] = max(apply_t[r, s + self.delay], t)
        for (group, s), t in self.grad_ar.items():  # every member's gradient is ready, and the collective ended
            t = max([t] + [self.comp_end[g, s] for g in group])
            self.grad_ar[(group, s)] = t
            for g in group:
                apply_t[g, s] = max(apply_t[g, s], t)
        for (group, s), (t, ex) in self.model_ar.items():
            t = max([t] + [apply_t[g, s] for g in group])
            self.push(t, _POST, s, group[0], EventKind.MODEL_ALLREDUCE, (group, ex))
        for (group, s), t in self.grad_ar.items():
            self.push(t, _GRAD, s, group[0], EventKind.GRAD_ALLREDUCE, group)
        for r in range(n):
            for s in range(n_steps):
                self.push(self.comp_start[r, s], _READ, s, r, EventKind.READ)
                self.push(apply_t[r, s], _APPLY, s, r, EventKind.APPLY)
        events = sorted(self.events, key=lambda e: e[:5])
        return ReplayIndex(n_workers=n, n_steps=n_steps, events=events)


def index_trace(algorithm: Algorithm, trace: np.ndarray, meta: Mapping[str, Any] | None = None) -> ReplayIndex:
    """The emulator's events for ``trace`` in the order they apply (see the module docstring).

    Raises :class:`SimulationError` when the trace does not fit ``algorithm`` (ranks, missing
    compute records, exchanges its schedule does not have).
    """
    if trace.dtype != TRACE_DTYPE:
        raise SimulationError(f"trace dtype ({trace.dtype}) must be TRACE_DTYPE")
    return _Indexer(algorithm, trace, dict(meta or {})).index(trace)


# ----- the applier: events -> models -----------------------------------------------------------
class Applier:
    """The workers' models and counters under a replay; one method per :class:`EventKind`.

    Parameters
    ----------
    algorithm : Algorithm
    replicas : Replicas
    n_steps : int
        Local steps per worker in the trace.
    lr_of : callable
        The learning rate of a local step.
    x0 : array or None
        Initial model (default: the replicas' initial point).
    """

    def __init__(
        self,
        algorithm: Algorithm,
        replicas: Replicas,
        *,
        n_steps: int,
        lr_of: Callable[[int], float],
        x0: Array | None = None,
    ) -> None:
        n = self.n = algorithm.n_workers
        self.algorithm, self.replicas, self.lr_of = algorithm, replicas, lr_of
        self.delay = int(algorithm.gradient_delay)
        x0 = replicas.initial_point() if x0 is None else x0
        self.states = [algorithm.init_state(x0, r) for r in range(n)]
        self.server_state = algorithm.server_init(x0) if algorithm.has_server else None
        self.merges = np.zeros(n, dtype=np.int64)
        self.reads: dict[tuple[int, int], tuple[Array, int]] = {}  # (r, s) -> (snapshot, merges)
        self.step_start: dict[tuple[int, int], Array] = {}  # own mix sends: model at step start
        self.pending: dict[tuple[int, int], Array] = {}  # gradients not computed yet
        self.grads: dict[tuple[int, int], Array] = {}
        self.read_merges: dict[tuple[int, int], int] = {}
        self.shard_results: dict[tuple[int, int], Array] = {}
        self.staleness = np.full((n, n_steps), -1, dtype=np.int64)
        self.batch_loss = np.full((n, n_steps), np.nan)
        self.batches: list[int] = []
        self.applied = 0
        self.handlers: dict[EventKind, Callable[[ReplayEvent], None]] = {
            kind: getattr(self, kind.value) for kind in EventKind
        }

    def __call__(self, event: ReplayEvent) -> None:
        self.handlers[event.kind](event)

    @property
    def models(self) -> list[Array]:
        return [st.params for st in self.states]

    # ----- gradients ----------------------------------------------------------------------------
    def flush(self) -> None:
        """Compute every pending gradient in one call."""
        if not self.pending:
            return
        entries = [(r, s, x) for (r, s), x in self.pending.items()]
        self.batches.append(len(entries))
        for (r, s, _), (g, loss) in zip(entries, self.replicas.gradients(entries)):
            self.grads[(r, s)] = g
            self.batch_loss[r, s] = loss
        self.pending.clear()

    def gradient(self, r: int, s: int) -> Array:
        if (r, s) not in self.grads:
            if (r, s) not in self.pending:
                raise SimulationError(f"gradient of rank {r} step {s} is needed before its read")
            self.flush()
        return self.grads[(r, s)]

    def merge(self, r: int, sent: Array, mixed: Array) -> None:
        """``params <- params + (mixed - sent)``: local changes made meanwhile are kept."""
        params = self.states[r].params
        new = mixed if params is sent else params + (mixed - sent)
        self.states[r] = self.states[r].replace(params=new)
        self.merges[r] += 1

    # ----- one method per event kind --------------------------------------------------------------
    def read(self, ev: ReplayEvent) -> None:
        r, s, delay = ev.rank, ev.step, self.delay
        params, merges = self.states[r].params, int(self.merges[r])
        src = max(s - delay, 0)
        snap, snap_merges = (params, merges) if src == s else self.reads[(r, src)]
        self.reads[(r, s)] = (params, merges)
        self.step_start[(r, s)] = params
        self.read_merges[(r, s)] = int(snap_merges)
        self.pending[(r, s)] = snap
        self.reads.pop((r, s - delay - 1), None)
        self.step_start.pop((r, s - 4 - delay), None)

    def pair_send(self, ev: ReplayEvent) -> None:
        pair: _Pair = ev.data
        pair.sent_p = self.states[pair.passive].params
        if pair.ex_a.n_shards > 1:
            split, mix = self.replicas.split, self.algorithm.mix
            a_sent = self.step_start[(pair.active, pair.step)]
            k, sh = pair.ex_a.n_shards, pair.ex_a.shard
            self.shard_results[(pair.active, pair.step)] = mix(
                pair.ex_a, split(a_sent, k, sh), split(pair.sent_p, k, sh)
            )
            k, sh = pair.ex_p.n_shards, pair.ex_p.shard
            self.shard_results[(pair.passive, pair.step)] = mix(
                pair.ex_p, split(pair.sent_p, k, sh), split(a_sent, k, sh)
            )

    def pair_merge(self, ev: ReplayEvent) -> None:
        pair, active_side = ev.data
        r = pair.active if active_side else pair.passive
        ex = pair.ex_a if active_side else pair.ex_p
        own_sent = self.step_start.get((pair.active, pair.step)) if active_side else pair.sent_p
        if own_sent is None or pair.sent_p is None:
            raise SimulationError(
                f"pairwise exchange of ranks {pair.active}/{pair.passive} at step {pair.step} merges before it was sent"
            )
        if ex.n_shards == 1:
            other = pair.sent_p if active_side else self.step_start[(pair.active, pair.step)]
            self.merge(r, own_sent, self.algorithm.mix(ex, own_sent, other))
            return
        parts = []
        for g in ex.gather_group:
            part = self.shard_results.get((g, pair.step))
            if part is None:
                raise SimulationError(
                    f"rank {r} merges the sharded exchange of step {pair.step} before member {g} averaged its slice"
                )
            parts.append(part)
        self.merge(r, own_sent, self.replicas.concat(parts))

    def gossip_merge(self, ev: ReplayEvent) -> None:
        r, s, ex = ev.rank, ev.step, ev.data
        try:
            received = [self.step_start[(j, s)] for j in ex.peers]
        except KeyError:
            raise SimulationError(
                f"gossip of rank {r} at step {s} merges before a neighbour started step {s}"
            ) from None
        own = self.step_start[(r, s)]
        self.merge(r, own, self.algorithm.mix(ex, own, received))

    def grad_allreduce(self, ev: ReplayEvent) -> None:
        group, s = ev.data, ev.step
        mean = self.replicas.mean([self.gradient(g, s) for g in group])
        for g in group:
            self.grads[(g, s)] = mean

    def apply(self, ev: ReplayEvent) -> None:
        r, s = ev.rank, ev.step
        g = self.gradient(r, s)
        self.staleness[r, s] = self.merges[r] - self.read_merges.pop((r, s))
        self.states[r] = self.algorithm.local_update(self.states[r], g, self.lr_of(s))
        del self.grads[(r, s)]
        self.applied += 1

    def model_allreduce(self, ev: ReplayEvent) -> None:
        group, ex = ev.data
        mean = self.replicas.mean([self.states[g].params for g in group])
        for g in group:
            self.states[g] = self.algorithm.combine(self.states[g], ex, mean)

    def server(self, ev: ReplayEvent) -> None:
        r = ev.rank
        if self.server_state is None:
            raise SimulationError(f"{self.algorithm.name} has a server exchange in the trace but no server role")
        message = self.algorithm.server_message(self.states[r])
        self.server_state, reply, st = self.algorithm.server_apply(self.server_state, message, r)
        self.states[r] = self.algorithm.combine(self.states[r], ev.data, reply)
        self.staleness[r, ev.step] = st


# ----- the replay: apply the events, record rounds and evaluations ----------------------------
class _Recorder:
    """Rounds (every ``n`` applied gradients) and evaluations of the mean model."""

    def __init__(
        self,
        applier: Applier,
        *,
        n_steps: int,
        steps_per_epoch: float | None,
        eval_every_rounds: int | None,
        eval_points: int,
        on_epoch: Callable[[int, dict[str, float]], None] | None,
    ) -> None:
        self.applier, self.n, self.n_steps, self.on_epoch = applier, applier.n, n_steps, on_epoch
        self.spe = float(steps_per_epoch) if steps_per_epoch else float(n_steps)
        self.every = eval_every_rounds or max(1, n_steps // max(eval_points, 1))
        self.rounds: dict[str, list[float]] = {"time_s": [], "epoch": [], "consensus_distance": []}
        self.evals: dict[str, list[float]] = {"time_s": [], "epoch": [], "loss": [], "consensus_distance": []}
        self.next_epoch = 1

    def epoch(self, applied: int) -> float:
        return applied / (self.n * self.spe)

    def evaluate(self, t: float) -> dict[str, float]:
        models = self.applier.models
        replicas = self.applier.replicas
        res = replicas.evaluate(replicas.mean(models))
        self.evals["time_s"].append(t)
        self.evals["epoch"].append(self.epoch(self.applier.applied))  # evaluation happens at the end of an instant
        self.evals["consensus_distance"].append(replicas.consensus_distance(models))
        for k, v in res.items():
            self.evals.setdefault(k, []).append(v)
        return res

    def end_round(self, t: float, done: int) -> None:
        n = self.n
        k = done // n
        self.rounds["time_s"].append(t)
        self.rounds["epoch"].append(self.epoch(done))
        self.rounds["consensus_distance"].append(self.applier.replicas.consensus_distance(self.applier.models))
        epoch_done = self.epoch(done) >= self.next_epoch - 1e-12
        if epoch_done or (k % self.every == 0 and done < n * self.n_steps):
            res = self.evaluate(t)
            if epoch_done:
                if self.on_epoch is not None:
                    self.on_epoch(self.next_epoch, res)
                self.next_epoch += 1

    def finish(self, last_t: float) -> None:
        ev = self.evals
        if not ev["time_s"] or ev["time_s"][-1] != last_t or ev["epoch"][-1] != self.epoch(self.applier.applied):
            self.evaluate(last_t)


def replay(
    algorithm: Algorithm,
    trace: np.ndarray,
    replicas: Replicas,
    *,
    lr: float | Callable[[int], float] = 0.05,
    meta: Mapping[str, Any] | None = None,
    x0: Array | None = None,
    steps_per_epoch: float | None = None,
    eval_every_rounds: int | None = None,
    eval_points: int = 20,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
) -> EmulationResult:
    """Replay ``trace`` with real replicas (see the module docstring).

    Parameters
    ----------
    algorithm : Algorithm
        The algorithm whose schedule produced the trace (its exchanges are looked up per
        (step, rank) to give the records their meaning).
    trace : structured array of TRACE_DTYPE
    replicas : Replicas
        The model replicas (:class:`psgdlab.core.replicas.Replicas`).
    lr : float or callable
        Learning rate, or a function of the worker's local step.
    meta : mapping
        The trace's metadata; ``source == "reference"`` marks a clock-less trace whose
        ``"mix"`` exchanges start with their step.
    x0 : array or None
        Initial model of every worker (default: ``replicas.initial_point()``).
    steps_per_epoch : float or None
        Local steps per worker that make one epoch (for the epoch axis); default: every
        worker's steps make one epoch.
    eval_every_rounds : int or None
        Evaluate the mean model every this many rounds; default spreads ``eval_points``
        evaluations over the run. The final state is always evaluated.
    on_epoch : callable or None
        Called as ``on_epoch(epoch, evaluation)`` when the applied gradients complete an epoch
        (after an evaluation of the mean model); a Newbob schedule hooks in here.
    """
    meta = dict(meta or {})
    index = index_trace(algorithm, trace, meta)
    n, n_steps = index.n_workers, index.n_steps
    lr_of = lr if callable(lr) else (lambda _s, _v=float(lr): _v)
    applier = Applier(algorithm, replicas, n_steps=n_steps, lr_of=lr_of, x0=x0)
    recorder = _Recorder(
        applier,
        n_steps=n_steps,
        steps_per_epoch=steps_per_epoch,
        eval_every_rounds=eval_every_rounds,
        eval_points=eval_points,
        on_epoch=on_epoch,
    )
    last_t = 0.0
    round_due: tuple[float, int] | None = None  # recorded once this instant's post exchanges are done
    for ev in index.events:
        if round_due is not None and (ev.time_s > round_due[0] or ev.phase >= _READ):
            recorder.end_round(*round_due)
            round_due = None
        last_t = ev.time_s
        applier(ev)
        if ev.kind is EventKind.APPLY and applier.applied % n == 0:
            round_due = (ev.time_s, applier.applied)
    if round_due is not None:
        recorder.end_round(*round_due)
    recorder.finish(last_t)

    out_trace = trace.copy()
    sel = out_trace["phase"] == _COMPUTE
    rr, ss = out_trace["rank"][sel], out_trace["step"][sel]
    out_trace["staleness"][sel] = applier.staleness[rr, ss]
    out_trace["loss"][sel] = applier.batch_loss[rr, ss].astype(np.float32)
    out_meta = {
        **meta,
        "source": "emulator",
        "replayed_source": meta.get("source"),
        "n_workers": n,
        "algorithm": algorithm.params(),
    }
    return EmulationResult(
        params=applier.models,
        staleness=applier.staleness,
        batch_loss=applier.batch_loss,
        rounds={k: np.asarray(v) for k, v in recorder.rounds.items()},
        evals={k: np.asarray(v) for k, v in recorder.evals.items()},
        trace=out_trace,
        meta=out_meta,
        server=applier.server_state,
        gradient_batches=applier.batches,
    )
