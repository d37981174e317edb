r"""The emulator: replay a trace with real model replicas at the simulated event times.

:func:`replay` walks the records of a trace (:mod:`psgdlab.core.trace` schema; from the
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
:func:`psgdlab.core.reference.run_reference`'s trace on :class:`~psgdlab.sim.replicas.LeastSquaresReplicas`
equals the reference executor bit for bit.

**Staleness** of a gradient is counted as the core defines it: foreign merges applied to the
worker's model between the read of step ``s - D`` and the apply (the server's staleness for
server exchanges), so it emerges from the platform model that produced the trace.

**Gradients are lazy and batched**: a read only records ``(rank, step, snapshot)``; when an
apply or an allreduce needs a gradient that is not computed yet, every pending entry is
computed in one batched call (:meth:`psgdlab.sim.replicas.TorchReplicas.gradients`).

:func:`emulate` runs the simulator (same platform model, seed and straggler model) and replays
its trace on a torch model and a window corpus; ``psgdlab emulate`` is its command.

Examples
--------
>>> from psgdlab.core.algorithms import make_algorithm
>>> from psgdlab.core.reference import LeastSquaresProblem, run_reference
>>> from psgdlab.sim.replicas import LeastSquaresReplicas
>>> alg = make_algorithm("adpsgd", n_workers=4)
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=4, batch=8, seed=0)
>>> ref = run_reference(alg, problem, steps=10, lr=0.05)
>>> emu = replay(alg, ref.trace, LeastSquaresReplicas(problem), lr=0.05, meta={"source": "reference"})
>>> bool((np.stack(emu.params) == ref.params[-1]).all())
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psgdlab.core.algorithms.base import Algorithm, ServerState
from psgdlab.core.errors import SimulationError, require
from psgdlab.core.exchange import AllReduce, Barrier, Gossip, PairwiseAverage, ServerExchange
from psgdlab.core.trace import PHASES, TRACE_DTYPE

__all__ = ["EmulationResult", "replay", "EmulateConfig", "emulate", "write_run", "plot_curves"]

Array = Any

# tie-break phases at equal times (the reference executor's order, reads after posts)
_MERGE, _GRAD, _APPLY, _POST, _READ, _PSEND, _LATE_MERGE = 0, 1, 2, 3, 4, 5, 6
_K_ALLREDUCE, _K_PAIR, _K_GOSSIP, _K_SERVER, _K_BARRIER = 1, 2, 3, 4, 5
_COMPUTE, _COMM, _WAIT, _OVERLAP = PHASES["compute"], PHASES["comm"], PHASES["wait"], PHASES["overlap"]


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
        out["final_batch_loss"] = float(np.mean(self.batch_loss[:, -1][np.isfinite(self.batch_loss[:, -1])])) \
            if losses.size else None
        return out


class _Pair:
    __slots__ = ("active", "passive", "ex_a", "ex_p", "step", "sent_p", "done")

    def __init__(self, active: int, passive: int, ex_a: PairwiseAverage, ex_p: PairwiseAverage, step: int) -> None:
        self.active, self.passive, self.ex_a, self.ex_p, self.step = active, passive, ex_a, ex_p, step
        self.sent_p: Array = None
        self.done = False


def _split(x: Array, n: int, i: int) -> Array:
    if isinstance(x, np.ndarray):
        return np.array_split(x, n)[i]
    return x.tensor_split(n)[i]


def _concat(parts: Sequence[Array]) -> Array:
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    import torch

    return torch.cat(list(parts))


def replay(algorithm: Algorithm, trace: np.ndarray, replicas: Any, *,
           lr: float | Callable[[int], float] = 0.05, meta: Mapping[str, Any] | None = None,
           x0: Array | None = None, steps_per_epoch: float | None = None, eval_every_rounds: int | None = None,
           eval_points: int = 20, on_epoch: Callable[[int, dict[str, float]], None] | None = None) -> EmulationResult:
    """Replay ``trace`` with real replicas (see the module docstring).

    Parameters
    ----------
    algorithm : Algorithm
        The algorithm whose schedule produced the trace (its exchanges are looked up per
        (step, rank) to give the records their meaning).
    trace : structured array of TRACE_DTYPE
    replicas : LeastSquaresReplicas or TorchReplicas (anything with ``initial_point``,
        ``gradients``, ``mean``, ``evaluate``)
    lr : float or callable
        Learning rate, or a function of the worker's local step.
    meta : mapping
        The trace's metadata; ``source == "reference"`` marks a clock-less trace whose
        ``"mix"`` exchanges start with their step.
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
    if trace.dtype != TRACE_DTYPE:
        raise SimulationError(f"trace dtype ({trace.dtype}) must be TRACE_DTYPE")
    n = algorithm.n_workers
    compute = trace[trace["phase"] == _COMPUTE]
    if compute.size == 0:
        raise SimulationError("trace has no compute records to replay")
    if int(compute["rank"].max()) >= n or int(compute["rank"].min()) < 0:
        raise SimulationError(f"trace ranks [{compute['rank'].min()}, {compute['rank'].max()}] do not fit "
                              f"{algorithm.name} with {n} workers")
    n_steps = int(compute["step"].max()) + 1
    logical = meta.get("source") == "reference"
    lr_of = lr if callable(lr) else (lambda _s, _v=float(lr): _v)
    delay = int(algorithm.gradient_delay)

    # ----- index the records ----------------------------------------------------------------
    comp_start = np.full((n, n_steps), np.nan)
    comp_end = np.full((n, n_steps), np.nan)
    comp_start[compute["rank"], compute["step"]] = compute["start_s"]
    comp_end[compute["rank"], compute["step"]] = compute["end_s"]
    if np.isnan(comp_start).any():
        r, s = np.argwhere(np.isnan(comp_start))[0]
        raise SimulationError(f"trace has no compute record for rank {r} step {s} (steps must be contiguous)")
    apply_t = comp_end.copy()
    schedule_cache: dict[tuple[int, int], tuple[Any, ...]] = {}

    def sched(s: int, r: int) -> tuple[Any, ...]:
        key = (s, r)
        out = schedule_cache.get(key)
        if out is None:
            out = schedule_cache[key] = algorithm.exchanges(s, r)
        return out

    events: list[tuple[float, int, int, int, int, int, Any]] = []
    seq = 0

    def push(t: float, phase: int, step: int, rank: int, op: str, data: Any = None) -> None:
        nonlocal seq
        events.append((float(t), phase, step, rank, seq, op, data))  # type: ignore[arg-type]
        seq += 1

    others = trace[(trace["phase"] != _COMPUTE)]
    order = np.lexsort((others["start_s"], others["step"], others["rank"]))
    others = others[order]
    ar_seen: dict[tuple[int, int], int] = {}
    grad_ar: dict[tuple[tuple[int, ...], int], float] = {}
    model_ar: dict[tuple[tuple[int, ...], int], tuple[float, AllReduce]] = {}
    mix_end: dict[tuple[int, int], float] = {}
    pairs: list[_Pair] = []
    gossips: dict[tuple[int, int], Gossip] = {}
    for rec in others:
        r, s, kind, ph = int(rec["rank"]), int(rec["step"]), int(rec["kind"]), int(rec["phase"])
        t0, t1 = float(rec["start_s"]), float(rec["end_s"])
        if s >= n_steps:
            continue
        if kind == _K_ALLREDUCE:
            ars = [e for e in sched(s, r) if isinstance(e, AllReduce)]
            ars.sort(key=lambda e: e.payload != "grad")
            i = ar_seen.get((r, s), 0)
            ar_seen[(r, s)] = i + 1
            if i >= len(ars):
                raise SimulationError(f"trace has an allreduce at rank {r} step {s} that {algorithm.name}'s "
                                      f"schedule does not have")
            ex = ars[i]
            if ex.payload == "grad":
                key = (ex.group, s)
                grad_ar[key] = max(grad_ar.get(key, -math.inf), t1)
                apply_t[r, s] = max(apply_t[r, s], t1)
            else:
                key = (ex.group, s)
                prev = model_ar.get(key)
                model_ar[key] = (max(prev[0] if prev else -math.inf, t1), ex)
        elif kind == _K_PAIR:
            if ph in (_COMM, _WAIT):
                apply_t[r, s] = max(apply_t[r, s], t1)
            if int(rec["peer"]) < 0:
                continue  # a wait for the step's averaging, not an exchange
            p = int(rec["peer"])
            ex = next((e for e in sched(s, r) if isinstance(e, PairwiseAverage) and e.peer == p), None)
            if ex is None:
                raise SimulationError(f"trace has a pairwise exchange of rank {r} with {p} at step {s} that "
                                      f"{algorithm.name}'s schedule does not have")
            if not ex.active:
                continue  # the active side's record stands for the pair
            back = next((e for e in sched(s, p) if isinstance(e, PairwiseAverage) and e.peer == r), None)
            if back is None or back.active:
                raise SimulationError(f"schedule is inconsistent at step {s}: rank {p} does not answer rank {r}")
            pair = _Pair(r, p, ex, back, s)
            pairs.append(pair)
            start = comp_start[r, s] if logical else t0
            end = max(t1, start)
            push(start, _PSEND, s, p, "psend", pair)
            merge_phase = _LATE_MERGE if end <= start else _MERGE
            push(end, merge_phase, s, r, "merge_pair", (pair, True))
            push(end, merge_phase, s, p, "merge_pair", (pair, False))
            mix_end[(r, s)] = max(mix_end.get((r, s), -math.inf), end)
        elif kind == _K_GOSSIP:
            ex = next((e for e in sched(s, r) if isinstance(e, Gossip)), None)
            if ex is None:
                raise SimulationError(f"trace has a gossip at rank {r} step {s} that the schedule does not have")
            gossips[(r, s)] = ex
            end = max(t1, comp_start[r, s])
            push(end, _MERGE if end > comp_start[r, s] else _LATE_MERGE, s, r, "merge_gossip", ex)
            apply_t[r, s] = max(apply_t[r, s], end)
        elif kind in (_K_SERVER, _K_BARRIER):
            if kind == _K_SERVER and ph == _COMM:
                ex = next((e for e in sched(s, r) if isinstance(e, ServerExchange)), None)
                if ex is None:
                    raise SimulationError(f"trace has a server exchange at rank {r} step {s} that the "
                                          f"schedule does not have")
                push(t1, _POST, s, r, "server", ex)
        elif ph in (_COMM, _WAIT):
            apply_t[r, s] = max(apply_t[r, s], t1)
    for (r, s), t in mix_end.items():  # the gradient of step s + D waits for the mix of step s
        if s + delay < n_steps:
            apply_t[r, s + delay] = max(apply_t[r, s + delay], t)
    for (group, s), t in grad_ar.items():  # every member's gradient is ready, and the collective ended
        t = max([t] + [comp_end[g, s] for g in group])
        grad_ar[(group, s)] = t
        for g in group:
            apply_t[g, s] = max(apply_t[g, s], t)
    for (group, s), (t, ex) in model_ar.items():
        t = max([t] + [apply_t[g, s] for g in group])
        push(t, _POST, s, group[0], "model_ar", (group, ex))
    for (group, s), t in grad_ar.items():
        push(t, _GRAD, s, group[0], "grad_ar", group)
    for r in range(n):
        for s in range(n_steps):
            push(comp_start[r, s], _READ, s, r, "read")
            push(apply_t[r, s], _APPLY, s, r, "apply")
    events.sort(key=lambda e: e[:5])

    # ----- state ------------------------------------------------------------------------------
    x0 = replicas.initial_point() if x0 is None else x0
    states = [algorithm.init_state(x0, r) for r in range(n)]
    server = algorithm.server_init(x0) if algorithm.has_server else None
    merges = np.zeros(n, dtype=np.int64)
    reads: dict[tuple[int, int], tuple[Array, int]] = {}     # (r, s) -> (snapshot, merges)
    step_start: dict[tuple[int, int], Array] = {}            # own mix sends: model at step start
    pending: dict[tuple[int, int], Array] = {}               # gradients not computed yet
    grads: dict[tuple[int, int], Array] = {}
    read_merges: dict[tuple[int, int], int] = {}
    shard_results: dict[tuple[int, int], Array] = {}
    staleness = np.full((n, n_steps), -1, dtype=np.int64)
    batch_loss = np.full((n, n_steps), np.nan)
    batches: list[int] = []
    spe = float(steps_per_epoch) if steps_per_epoch else float(n_steps)
    total_rounds = n_steps
    every = eval_every_rounds or max(1, total_rounds // max(eval_points, 1))
    rounds: dict[str, list[float]] = {"time_s": [], "epoch": [], "consensus_distance": []}
    evals: dict[str, list[float]] = {"time_s": [], "epoch": [], "loss": [], "consensus_distance": []}
    applied = 0
    next_epoch = 1

    def flush() -> None:
        if not pending:
            return
        entries = [(r, s, x) for (r, s), x in pending.items()]
        batches.append(len(entries))
        for (r, s, _), (g, loss) in zip(entries, replicas.gradients(entries)):
            grads[(r, s)] = g
            batch_loss[r, s] = loss
        pending.clear()

    def gradient(r: int, s: int) -> Array:
        if (r, s) not in grads:
            if (r, s) not in pending:
                raise SimulationError(f"gradient of rank {r} step {s} is needed before its read")
            flush()
        return grads[(r, s)]

    def merge(r: int, sent: Array, mixed: Array) -> None:
        params = states[r].params
        new = mixed if params is sent else params + (mixed - sent)
        states[r] = states[r].replace(params=new)
        merges[r] += 1

    def pair_mixed(pair: _Pair, active_side: bool) -> tuple[Array, Array]:
        r = pair.active if active_side else pair.passive
        ex = pair.ex_a if active_side else pair.ex_p
        own_sent = step_start.get((pair.active, pair.step)) if active_side else pair.sent_p
        if own_sent is None or pair.sent_p is None:
            raise SimulationError(f"pairwise exchange of ranks {pair.active}/{pair.passive} at step {pair.step} "
                                  f"merges before it was sent")
        if ex.n_shards == 1:
            other = pair.sent_p if active_side else step_start[(pair.active, pair.step)]
            return own_sent, algorithm.mix(ex, own_sent, other)
        parts = []
        for g in ex.gather_group:
            part = shard_results.get((g, pair.step))
            if part is None:
                raise SimulationError(f"rank {r} merges the sharded exchange of step {pair.step} before member "
                                      f"{g} averaged its slice")
            parts.append(part)
        return own_sent, _concat(parts)

    def evaluate(t: float) -> dict[str, float]:
        models = [st.params for st in states]
        from psgdlab.sim.replicas import consensus_distance

        res = replicas.evaluate(replicas.mean(models))
        evals["time_s"].append(t)
        evals["epoch"].append(applied / (n * spe))  # evaluation happens at the end of an instant
        evals["consensus_distance"].append(consensus_distance(models))
        for k, v in res.items():
            evals.setdefault(k, []).append(v)
        return res

    def end_round(t: float, done: int) -> None:
        nonlocal next_epoch
        from psgdlab.sim.replicas import consensus_distance

        k = done // n
        rounds["time_s"].append(t)
        rounds["epoch"].append(done / (n * spe))
        rounds["consensus_distance"].append(consensus_distance([st.params for st in states]))
        epoch_done = done / (n * spe) >= next_epoch - 1e-12
        if epoch_done or (k % every == 0 and done < n * n_steps):
            res = evaluate(t)
            if epoch_done:
                if on_epoch is not None:
                    on_epoch(next_epoch, res)
                next_epoch += 1

    last_t = 0.0
    round_due: tuple[float, int] | None = None
    for t, phase, s, r, _, op, data in events:
        if round_due is not None and (t > round_due[0] or phase >= _READ):
            end_round(*round_due)
            round_due = None
        last_t = t
        if op == "read":
            src = max(s - delay, 0)
            snap = states[r].params if src == s else reads[(r, src)][0]
            snap_merges = merges[r] if src == s else reads[(r, src)][1]
            reads[(r, s)] = (states[r].params, int(merges[r]))
            step_start[(r, s)] = states[r].params
            read_merges[(r, s)] = int(snap_merges)
            pending[(r, s)] = snap
            reads.pop((r, s - delay - 1), None)
            step_start.pop((r, s - 4 - delay), None)
        elif op == "psend":
            pair = data
            pair.sent_p = states[pair.passive].params
            if pair.ex_a.n_shards > 1:
                a_sent = step_start[(pair.active, pair.step)]
                k, sh = pair.ex_a.n_shards, pair.ex_a.shard
                mine, theirs = _split(a_sent, k, sh), _split(pair.sent_p, k, sh)
                shard_results[(pair.active, pair.step)] = algorithm.mix(pair.ex_a, mine, theirs)
                k, sh = pair.ex_p.n_shards, pair.ex_p.shard
                shard_results[(pair.passive, pair.step)] = algorithm.mix(
                    pair.ex_p, _split(pair.sent_p, k, sh), _split(a_sent, k, sh))
        elif op == "merge_pair":
            pair, active_side = data
            sent, mixed = pair_mixed(pair, active_side)
            merge(pair.active if active_side else pair.passive, sent, mixed)
        elif op == "merge_gossip":
            ex = data
            try:
                received = [step_start[(j, s)] for j in ex.peers]
            except KeyError:
                raise SimulationError(f"gossip of rank {r} at step {s} merges before a neighbour started "
                                      f"step {s}") from None
            own = step_start[(r, s)]
            merge(r, own, algorithm.mix(ex, own, received))
        elif op == "grad_ar":
            group = data
            mean = replicas.mean([gradient(g, s) for g in group])
            for g in group:
                grads[(g, s)] = mean
        elif op == "apply":
            g = gradient(r, s)
            staleness[r, s] = merges[r] - read_merges.pop((r, s))
            states[r] = algorithm.local_update(states[r], g, lr_of(s))
            del grads[(r, s)]
            applied += 1
            if applied % n == 0:
                round_due = (t, applied)  # recorded once this instant's post exchanges are done
        elif op == "model_ar":
            group, ex = data
            mean = replicas.mean([states[g].params for g in group])
            for g in group:
                states[g] = algorithm.combine(states[g], ex, mean)
        elif op == "server":
            if server is None:
                raise SimulationError(f"{algorithm.name} has a server exchange in the trace but no server role")
            message = algorithm.server_message(states[r])
            server, reply, st = algorithm.server_apply(server, message, r)
            states[r] = algorithm.combine(states[r], data, reply)
            staleness[r, s] = st
        else:  # pragma: no cover - internal
            raise SimulationError(f"unknown emulator event {op!r}")
    if round_due is not None:
        end_round(*round_due)
    if not evals["time_s"] or evals["time_s"][-1] != last_t or evals["epoch"][-1] != applied / (n * spe):
        evaluate(last_t)

    out_trace = trace.copy()
    sel = out_trace["phase"] == _COMPUTE
    rr, ss = out_trace["rank"][sel], out_trace["step"][sel]
    out_trace["staleness"][sel] = staleness[rr, ss]
    out_trace["loss"][sel] = batch_loss[rr, ss].astype(np.float32)
    out_meta = {**meta, "source": "emulator", "replayed_source": meta.get("source"), "n_workers": n,
                "algorithm": algorithm.params()}
    return EmulationResult(
        params=[st.params for st in states], staleness=staleness, batch_loss=batch_loss,
        rounds={k: np.asarray(v) for k, v in rounds.items()},
        evals={k: np.asarray(v) for k, v in evals.items()},
        trace=out_trace, meta=out_meta, server=server, gradient_batches=batches)


# ----- the full pipeline: simulate, then replay on a torch model ------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class EmulateConfig:
    """One emulation (the flags of ``psgdlab emulate``).

    Parameters
    ----------
    algorithm, variant, workers, gpus_per_node : str, str or None, int, int or None
        The algorithm (``make_algorithm``), its ring variant, the number of virtual workers and
        the workers per node (H-ADPSGD's super-learner size; also the placement).
    preset, platform_file : str or None
        Platform model and workload timing (one of them; default preset
        ``interspeech2019-v100``).
    model : str
        A ``psgdlab.runtime.models`` preset (default ``tiny-blstm``).
    data : str or None
        A corpus file (``psgdlab data`` layout); ``None`` writes a small synthetic corpus.
    epochs, steps : float or None, int or None
        Length: local steps per worker, or epochs of the training corpus (one of them).
    batch : int
        Windows per worker per step.
    lr, lr_schedule : float, {"const", "ibm", "newbob"}
        Learning rate (for ``ibm``: the base rate of a 256-sample batch; the peak is
        ``lr * workers * batch / 256``).
    straggler : str
        A :class:`psgdlab.core.stragglers.StragglerModel` spec.
    seed : int
        Seeds the simulator, the data, the model initialisation and randomised schedules.
    window : int
        Frames per window.
    eval_points : int
        Evaluations of the mean model over the run.
    heldout_speakers : int
        Speakers of the corpus held out for evaluation (the last ones in sorted order).
    synthetic_utterances : int
        Size of the synthetic corpus when ``data`` is None.
    warmup_epochs : int
        Warm-up epochs of the IBM recipe (10 in the paper; shorter for small experiments).
    workdir : str or None
        Where the synthetic corpus is cached.
    """

    algorithm: str = "adpsgd"
    variant: str | None = None
    workers: int = 8
    gpus_per_node: int | None = None
    preset: str | None = None
    platform_file: str | None = None
    model: str = "tiny-blstm"
    data: str | None = None
    epochs: float | None = None
    steps: int | None = None
    batch: int = 32
    lr: float = 0.1
    lr_schedule: str = "const"
    straggler: str = ""
    seed: int = 0
    window: int = 21
    eval_points: int = 20
    heldout_speakers: int = 1
    synthetic_utterances: int = 1000
    warmup_epochs: int = 10
    workdir: str | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.workers, int) and self.workers >= 1, "workers", self.workers, "must be an integer >= 1")
        require(self.preset is None or self.platform_file is None, "platform", self.platform_file,
                "cannot be given together with --preset")
        require(self.epochs is None or self.steps is None, "steps", self.steps, "cannot be given together with --epochs")
        require(self.steps is None or (isinstance(self.steps, int) and self.steps >= 1), "steps", self.steps,
                "must be an integer >= 1")
        require(self.epochs is None or self.epochs > 0, "epochs", self.epochs, "must be > 0")
        require(isinstance(self.batch, int) and self.batch >= 1, "batch", self.batch, "must be an integer >= 1")
        require(self.lr > 0 and math.isfinite(self.lr), "lr", self.lr, "must be a finite number > 0")
        require(self.lr_schedule in ("const", "ibm", "newbob"), "lr-schedule", self.lr_schedule,
                "must be ibm, newbob or const")
        require(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "must be an integer >= 0")
        require(self.eval_points >= 1, "eval_points", self.eval_points, "must be >= 1")
        require(self.heldout_speakers >= 0, "heldout_speakers", self.heldout_speakers, "must be >= 0")
        require(isinstance(self.warmup_epochs, int) and self.warmup_epochs >= 1, "warmup_epochs",
                self.warmup_epochs, "must be an integer >= 1")


def build_algorithm(cfg: EmulateConfig) -> Algorithm:
    from psgdlab.core.algorithms import algorithm_parameters, make_algorithm

    params: dict[str, Any] = {"n_workers": cfg.workers, "seed": cfg.seed}
    known = algorithm_parameters(cfg.algorithm)
    if cfg.variant is not None:
        require("variant" in known, "variant", cfg.variant, f"does not apply to {cfg.algorithm}")
        params["variant"] = cfg.variant
    if cfg.gpus_per_node is not None and "gpus_per_node" in known:
        params["gpus_per_node"] = cfg.gpus_per_node
    return make_algorithm(cfg.algorithm, **params)


def _load_data(cfg: EmulateConfig, workdir: str) -> tuple[Any, Any]:
    from pathlib import Path

    from psgdlab.runtime.data import load_corpus, synthetic_corpus

    if cfg.data is None:
        path = Path(workdir) / f"synthetic-{cfg.seed}-{cfg.synthetic_utterances}.h5"
        if not path.exists():
            synthetic_corpus(path, n_utterances=cfg.synthetic_utterances, frames_per_utt=100, input_dim=40,
                             n_classes=10, seed=cfg.seed, n_speakers=5)
    else:
        path = Path(cfg.data)
        if not path.exists():
            raise FileNotFoundError(f"data file {path} does not exist")
    full = load_corpus(path)
    speakers = sorted(set(full.speakers))
    if cfg.heldout_speakers == 0 or len(speakers) <= cfg.heldout_speakers:
        return full, None
    held = speakers[-cfg.heldout_speakers:]
    return load_corpus(path, exclude_speakers=held), load_corpus(path, speakers=held)


def emulate(cfg: EmulateConfig, *, replicas: Any = None) -> tuple[EmulationResult, dict[str, Any]]:
    """Simulate ``cfg`` with the platform model and replay it on real replicas.

    Returns the result and the resolved configuration (JSON-able).
    """
    import os
    import tempfile

    import torch

    from psgdlab.core.schedules import Newbob, ibm_lr, lr_schedule
    from psgdlab.core.stragglers import StragglerModel
    from psgdlab.runtime.models import build_model
    from psgdlab.sim.replicas import TorchReplicas, check_model_name
    from psgdlab.sim.workload import load_config

    torch.set_num_threads(1)
    check_model_name(cfg.model)
    algorithm = build_algorithm(cfg)
    stragglers = StragglerModel.parse(cfg.straggler, seed=cfg.seed, n_workers=cfg.workers)
    sim_cfg = load_config(path=cfg.platform_file) if cfg.platform_file else \
        load_config(preset=cfg.preset or "interspeech2019-v100")
    workload = sim_cfg.workload.with_batch(cfg.batch)
    workdir = cfg.workdir or os.path.join(tempfile.gettempdir(), "psgdlab-emulate-data")  # reused cache
    os.makedirs(workdir, exist_ok=True)
    train, heldout = _load_data(cfg, workdir)
    if replicas is None:
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, input_dim=train.input_dim, n_classes=train.n_classes, window=cfg.window)
        replicas = TorchReplicas(model, train, n_workers=cfg.workers, window=cfg.window, batch=cfg.batch,
                                 seed=cfg.seed, heldout=heldout)
    spe = replicas.samplers[0].steps_per_epoch()
    steps = cfg.steps if cfg.steps is not None else max(1, math.ceil((cfg.epochs or 1.0) * spe))
    sim = _simulate(algorithm, sim_cfg.platform, workload, steps=steps, seed=cfg.seed, stragglers=stragglers,
                    gpus_per_node=cfg.gpus_per_node)
    trace, sim_meta = sim
    total_batch = cfg.workers * cfg.batch
    on_epoch = None
    if cfg.lr_schedule == "newbob":
        newbob = Newbob(lr=cfg.lr)
        lr_fn: Callable[[int], float] = lambda _s: newbob.lr  # noqa: E731

        def on_epoch(_epoch: int, res: dict[str, float]) -> None:
            newbob.update(res["loss"])
    elif cfg.lr_schedule == "ibm":
        def lr_fn(step: int) -> float:
            return ibm_lr(step / spe + 1e-12, total_batch=total_batch, base_lr=cfg.lr,
                          warmup_epochs=cfg.warmup_epochs)
    else:
        lr_fn = lr_schedule(cfg.lr_schedule, lr=cfg.lr, total_batch=total_batch, steps_per_epoch=spe)
    result = replay(algorithm, trace, replicas, lr=lr_fn, meta=sim_meta, steps_per_epoch=spe,
                    eval_points=cfg.eval_points, on_epoch=on_epoch)
    resolved = {
        "command": "emulate",
        **{k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "algorithm_params": algorithm.params(),
        "platform": sim_cfg.platform.name,
        "workload": workload.name,
        "workload_n_params": workload.n_params,
        "model_n_params": replicas.n_params,
        "steps_per_worker": steps,
        "steps_per_epoch": spe,
        "total_batch": total_batch,
        "train_frames": int(train.n_frames),
        "heldout_frames": int(heldout.n_frames) if heldout is not None else 0,
    }
    result.meta.update({"samples_per_step": cfg.batch, "model": cfg.model})
    return result, resolved


def _simulate(algorithm: Algorithm, platform: Any, workload: Any, *, steps: int, seed: int, stragglers: Any,
              gpus_per_node: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    """The simulator's trace for this configuration (the one place the emulator calls it)."""
    from psgdlab.sim.engine import simulate

    res = simulate(algorithm, platform, workload, steps=steps, seed=seed, stragglers=stragglers,
                   gpus_per_node=gpus_per_node, until="all")
    return res.trace, dict(res.meta)


def write_run(out: str | None, result: EmulationResult, resolved: Mapping[str, Any]) -> dict[str, Any]:
    """Write the run directory of an emulation and return its summary (with ``run_dir``)."""
    import io

    from psgdlab.core.rundir import RunDir, default_run_dir, environment
    from psgdlab.core.trace import atomic_write_bytes, summarize, to_chrome_trace, write_trace

    rd = RunDir(out if out is not None else default_run_dir("emulate"))
    rd.write_json("config.resolved.json", dict(resolved))
    rd.write_json("env.json", environment(source="emulator", world_size=result.meta.get("n_workers")))
    write_trace(rd / "trace.npz", result.trace, result.meta)
    buf = io.BytesIO()
    np.savez_compressed(buf, **{f"eval_{k}": v for k, v in result.evals.items()},
                        **{f"round_{k}": v for k, v in result.rounds.items()},
                        staleness=result.staleness, batch_loss=result.batch_loss)
    atomic_write_bytes(rd / "curves.npz", buf.getvalue())
    to_chrome_trace(result.trace, rd / "timeline.json", meta={"source": "emulator"})
    summary = {**result.summary(),
               "timing": summarize(result.trace, samples_per_step=int(result.meta.get("samples_per_step", 1))),
               "algorithm": resolved.get("algorithm"), "workers": result.meta.get("n_workers"),
               "run_dir": str(rd.path)}
    rd.write_json("summary.json", summary)
    plot_curves(result, rd.path, title=f"{resolved.get('algorithm')} x {result.meta.get('n_workers')}")
    return summary


def plot_curves(result: EmulationResult, folder: Any, *, title: str = "") -> list[Any]:
    """``loss.png`` (held-out loss and accuracy against simulated time and epochs) and
    ``consensus.png`` (consensus distance against simulated time); matplotlib Agg, atomic."""
    import io
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from psgdlab.core.trace import atomic_write_bytes

    folder = Path(folder)
    ev, ro = result.evals, result.rounds
    written = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, x, label in ((axes[0], ev["time_s"], "simulated time (s)"), (axes[1], ev["epoch"], "epochs")):
        ax.plot(x, ev["loss"], marker="o", ms=3, label="held-out loss (mean model)")
        ax.set_xlabel(label)
        ax.set_ylabel("loss")
        if "accuracy" in ev:
            ax2 = ax.twinx()
            ax2.plot(x, ev["accuracy"], color="tab:green", ls="--", label="accuracy")
            ax2.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    written.append(atomic_write_bytes(folder / "loss.png", buf.getvalue()))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if len(ro["time_s"]):
        ax.semilogy(ro["time_s"], np.maximum(ro["consensus_distance"], 1e-30))
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("consensus distance")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    written.append(atomic_write_bytes(folder / "consensus.png", buf.getvalue()))
    return written
