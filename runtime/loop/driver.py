r"""The training loop of one rank: any algorithm of the core registry over a :class:`Transport`.

The loop decides *when* each exchange of a step runs; *how* is the rank's exchange protocol's
(:mod:`psgdlab.runtime.loop.exchange`: the normal one, or the survivors' under ``--on-failure
continue``), which the loop asks what differs (the step's exchanges, whether the gradient
allreduce may overlap the backward pass, whether the ranks stop after a step). It dispatches on
exchange kinds (:mod:`psgdlab.core.exchange`), never on algorithm names:
:data:`~psgdlab.runtime.loop.exchange.protocol.EXCHANGE_HANDLERS` maps the class of each
exchange record to the protocol's handler, which the loop calls in the phase the record names
(``ex.phase``: ``"mix"`` before the compute, ``"grad"`` after it, ``"post"`` after the local
update). It follows the shared step semantics. One step of worker ``r`` at local step ``s``:

1. under the model lock, take the model (what ``"mix"`` exchanges send) and the count of
   foreign merges -- no copy: the core kernels never modify an array in place, every update
   makes a new one, so the reference stays a snapshot; the gradient is computed on the
   snapshot of ``gradient_delay`` steps ago;
2. hand every *active* :class:`PairwiseAverage` and every :class:`Gossip` of the step to the
   communication thread, which runs it on the snapshot **while** the training thread computes
   the gradient (trace phase ``overlap``); passive entries are answered by the protocol's
   responder thread whenever the active peer asks (AD-PSGD's bipartite split: only active sides
   initiate, a passive side never waits, so no schedule can deadlock);
3. wait for the communication thread (trace phase ``comm`` for the time blocked), allreduce the
   gradient over each ``"grad"`` group -- a *sum*, whose ``1/n`` is folded into the update
   (``local_update(..., grad_scale=1/n)``) instead of costing a divide pass. With real compute,
   a :class:`~psgdlab.runtime.loop.workloads.ModuleWorkload` and NCCL (elsewhere on request:
   :data:`OVERLAP_ENV`), a schedule whose every step has one gradient allreduce over the same
   group overlaps it with the backward pass in buckets
   (:mod:`psgdlab.runtime.loop.overlap`, DDP's scheme; trace: one ``overlap`` record with the bytes,
   and a ``comm`` record for the time blocked after the compute), where the protocol allows it;
4. merge mixing results: ``params <- params + (mixed - sent)``, so local updates made during
   the exchange are kept; every merge (active or passive side) counts one foreign merge;
5. apply ``algorithm.local_update``; staleness = foreign merges since the snapshot of step 1;
6. run ``"post"`` exchanges on the training thread: model allreduce then ``algorithm.combine``;
   the parameter-server exchange (staleness is then the server's version difference returned by
   ``server_apply``); barriers;
7. ask the protocol whether the ranks stop here (SIGINT or SIGTERM: a stop they agree on,
   checkpointed at the step they stop at, so ``--resume`` continues from a complete set).

Where things live: the parameter server of ASGD / asynchronous EASGD is an extra process, rank
``n_workers`` (the last rank; :mod:`psgdlab.runtime.loop.server`, which also holds the worker's side
of its exchange); workers are ranks ``0 .. n_workers-1``. H-ADPSGD's intra-node groups are
``HADPSGD.node_group``; how a node merges the slices of its inter-node exchanges is the
protocol's (:mod:`~psgdlab.runtime.loop.exchange.normal`, :mod:`~psgdlab.runtime.loop.exchange.surviving`).
Every payload goes through the run's message transform (:attr:`DriverOptions.transform`).

Measured as it trains (:mod:`psgdlab.runtime.loop.noise`, ``noise_scale_every``): the gradient
noise scale, from the rank's own gradient and the group's mean where the step allreduces the
gradient, else from the two halves of the minibatch every few steps. Snapshots of the model for
held-out scoring after training: every ``evaluate_every`` steps (each epoch), or at regular
points of wall time (``evaluate_every_s``: the end of the first step at or after each multiple
of it since the run's start, the start itself and the end), each with its step and wall time;
the points every worker snapshot are averaged (:func:`psgdlab.runtime.train.train`).

Emulated compute (``compute_time``): the real gradient is computed, then the thread sleeps until
the step's compute phase has lasted the sampled time (times the straggler factor, plus pauses);
when the real compute alone takes longer, rank 0 warns once (:class:`TestbedWarning`).
Real compute: stragglers sleep the extra ``(factor - 1) * duration`` (plus pauses).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from psgdlab.core.algorithms.base import Algorithm, WorkerState
from psgdlab.core.errors import ConfigError, TestbedWarning
from psgdlab.core.exchange import Exchange, kind_of
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.core.platform.timing import ComputeTime
from psgdlab.core.records.trace import TraceBuilder
from psgdlab.runtime.failures.flight import FlightRecorder
from psgdlab.runtime.failures.survive.survivors import Survivors
from psgdlab.runtime.loop import checkpoint as ckpt
from psgdlab.runtime.loop.exchange.normal import STOP_CHECK_EVERY, NormalProtocol
from psgdlab.runtime.loop.exchange.protocol import (
    EXCHANGE_HANDLERS,
    GOSSIP,
    PAIR,
    ExchangeProtocol,
    Preempted,
    Replica,
    Step,
)
from psgdlab.runtime.loop.exchange.surviving import SurvivingProtocol
from psgdlab.runtime.loop.exchange.transform import Identity, MessageTransform, Wire
from psgdlab.runtime.loop.noise import NoiseProbe
from psgdlab.runtime.loop.scan import overlap_group
from psgdlab.runtime.loop.workloads import require_finite_loss
from psgdlab.runtime.transports.env import in_main_thread
from psgdlab.runtime.transports.transport import Transport

__all__ = [
    "DriverOptions",
    "RankResult",
    "Snapshot",
    "FINAL_SNAPSHOT",
    "Preempted",
    "run_worker",
    "EXCHANGE_HANDLERS",
    "CRASH_ENV",
    "OVERLAP_ENV",
    "STOP_CHECK_EVERY",
    "STOP_SIGNALS",
]

log = logging.getLogger(__name__)

#: test hook: ``"RANK:STEP"`` makes that rank kill itself (SIGKILL) at the start of that step;
#: ``"RANK:STEP:STOP"`` makes it stop itself (SIGSTOP) instead; a last field ``N`` fails it only in
#: the first ``N`` attempts of a restarted run (``--on-failure restart``: torchrun's
#: ``TORCHELASTIC_RESTART_COUNT`` < N; default 1, the first attempt only), e.g. ``"1:3:KILL:2"``;
#: ``"2,3:STEP"`` fails ranks 2 and 3 at that step
CRASH_ENV = "PSGDLAB_TEST_CRASH"
#: test hook: ``"MAX_S"`` adds a random delay in [0, MAX_S) to every exchange (deadlock tests)
JITTER_ENV = "PSGDLAB_TEST_JITTER"

#: ``"0"``: no bucketed gradient-allreduce overlap; ``"1"``: overlap on every transport; unset:
#: overlap where the asynchronous allreduce takes no CPU from the compute
#: (:attr:`Transport.async_progress`: NCCL). On CPUs the allreduce's reductions and copies (gloo's
#: threads, the MPI helper thread's polling) compete with the backward pass for the same cores
#: (docs/measurements.md: overlap on CPUs)
OVERLAP_ENV = "PSGDLAB_OVERLAP"

#: the signals that stop a run at a step its ranks agree on (each rank checkpoints there)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: a model snapshot for held-out scoring: ``(key, step, time_s, params)`` -- ``key`` names the
#: point every worker snapshots (the step, for snapshots every ``evaluate_every`` steps; the index
#: ``k`` of the wall-time point ``k * evaluate_every_s``, or :data:`FINAL_SNAPSHOT`), ``step`` the
#: steps the rank had done, ``time_s`` its wall time since the run's start
Snapshot = tuple[int, int, float, torch.Tensor]
#: the key of the snapshot every worker takes after its last step when snapshotting by wall time
FINAL_SNAPSHOT = 1 << 62


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverOptions:
    """What the loop needs besides the algorithm, the workload and the transport.

    Parameters
    ----------
    steps : int
        Local steps per worker (the run ends at this step; resumed runs start later).
    lr_of : callable step -> float
        Learning rate of each local step.
    start_step : int
        First step (``> 0`` when resuming).
    compute_time : ComputeTime, optional
        Emulated compute time per step; None runs real compute only.
    stragglers : StragglerModel
    run_dir : Path, optional
        Where checkpoints go.
    run_id : str
        The run the checkpoints belong to (:func:`psgdlab.runtime.loop.checkpoint.write_run_record`).
    checkpoint_every : int
        Steps between checkpoints (0: only at the end and on SIGTERM).
    record_params : bool
        Keep the model after every step (small models: trajectory tests).
    seed : int
        Seeds the emulated compute-time draws.
    evaluate_every : int
        Steps between snapshots of every worker's model for held-out evaluation (0: never). The
        snapshots come back in :attr:`RankResult.snapshots`; after training the workers average
        them and rank 0 scores the mean (:func:`psgdlab.runtime.train.train`), so scoring neither
        stalls rank 0 -- which would skew an asynchronous run -- nor counts in the measured
        training time.
    evaluate_every_s : float
        Wall seconds between snapshots instead (0: by steps; module docstring): the points a long
        step passed get one snapshot, at its end.
    noise_scale_every : int
        Steps between gradient-noise-scale estimates where the step has no gradient allreduce
        (:mod:`psgdlab.runtime.loop.noise`); 0: no estimate at all.
    progress : callable (step, loss, samples_per_s) -> None, optional
        Called after every step (rank 0's tqdm bar; under ``--on-failure restart`` every rank's
        progress record, :class:`psgdlab.runtime.launcher.elastic.Progress`).
    transform : MessageTransform
        What every payload of every exchange goes through on its way to the wire
        (:mod:`psgdlab.runtime.loop.exchange.transform`; default: the identity).
    """

    steps: int
    lr_of: Callable[[int], float]
    start_step: int = 0
    compute_time: ComputeTime | None = None
    stragglers: StragglerModel = field(default_factory=StragglerModel)
    run_dir: Path | None = None
    run_id: str = ""
    checkpoint_every: int = 0
    record_params: bool = False
    seed: int = 0
    evaluate_every: int = 0
    evaluate_every_s: float = 0.0
    noise_scale_every: int = 0
    progress: Callable[[int, float, float], None] | None = None
    transform: MessageTransform = field(default_factory=Identity)


@dataclass(slots=True)
class RankResult:
    """What a rank hands back to rank 0 at the end."""

    rank: int
    trace: np.ndarray
    final_params: np.ndarray | None
    trajectory: np.ndarray | None
    evaluations: list[dict[str, Any]]
    preempted: bool = False
    snapshots: list[Snapshot] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


# ----- the loop -------------------------------------------------------------------------------------
class _Worker:
    """The step loop of one rank (module docstring): when each exchange runs; how is ``protocol``'s.

    Parameters are those of :func:`run_worker`, with ``state`` and ``merges`` read from a
    checkpoint (None and 0: a fresh start).
    """

    def __init__(
        self,
        algorithm: Algorithm,
        workload: Any,
        channels: dict[str, Transport],
        *,
        rank: int,
        options: DriverOptions,
        origin: float,
        state: WorkerState | None,
        merges: int,
        flight: FlightRecorder | None = None,
        survivors: Survivors | None = None,
    ) -> None:
        self.alg = algorithm
        self.workload = workload
        self.main = channels["main"]
        self.rank = rank
        self.opt = options
        self.origin = origin
        x0 = workload.initial_params().to(self.main.device)
        self.replica = Replica(state if state is not None else algorithm.init_state(x0, rank), merges)
        self.n_params = int(x0.numel())
        self.trace = TraceBuilder()
        #: every blocking wait of every thread (:mod:`psgdlab.runtime.failures.flight`); without one, nothing is written
        self.flight = flight if flight is not None else FlightRecorder(rank, out=None, deadline_s=math.inf)
        self.protocol = _protocol(algorithm, channels, self, survivors)
        self.pool: ThreadPoolExecutor | None = None  # the communication thread (during run)
        self.reducer: Any = None  # the bucketed gradient allreduce overlapped with the backward pass
        self.step = options.start_step
        self.stop_requested = False
        self.overruns = 0  # steps whose real compute outlasted the emulated compute time
        self._overrun_warned = False
        self.crash_step, self.crash_signal = _crash_hook(rank)
        self.trajectory: list[np.ndarray] = []
        self.snapshots: list[Snapshot] = []
        self._next_snapshot = 0  # the index of the next wall-time point to snapshot at
        self._last_progress_s: float | None = None
        self.noise = (
            NoiseProbe(
                rank=rank, batch=int(workload.samples_per_step), every=options.noise_scale_every, workload=workload
            )
            if options.noise_scale_every > 0
            else None
        )

    def now(self) -> float:
        return time.time() - self.origin

    def run(self) -> RankResult:
        """Every step of this rank, then its part of the end of the exchanges."""
        self.protocol.open()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"psgdlab-comm-{self.rank}")
        self._overlap()
        try:
            stopped_at = self._steps()
            self.protocol.finish(stopped_at)
        finally:
            failed = sys.exc_info()[0] is not None
            self.protocol.close()
            # after a failure the communication thread may wait on a dead peer: do not join it
            self.pool.shutdown(wait=not failed)
            if self.reducer is not None:
                self.workload.end_overlap()
            self.main.close()
        return self._result(stopped_at)

    def _overlap(self) -> None:
        """Overlap the gradient allreduce with the backward pass where the compute is real, the
        transport asks for it (:data:`OVERLAP_ENV`) and the protocol allows it."""
        opt, choice = self.opt, os.environ.get(OVERLAP_ENV, "")
        wanted = (
            opt.compute_time is None
            and self.protocol.can_overlap_gradient
            and (choice == "1" or (choice != "0" and self.main.async_progress))
        )
        group = overlap_group(self.alg, self.rank, opt.start_step, opt.steps) if wanted else None
        if group is not None and hasattr(self.workload, "overlap_allreduce"):
            self.reducer = self.workload.overlap_allreduce(self.main, group, transform=self.protocol.wire.transform)
            self.protocol.use_reducer(self.reducer)

    def _steps(self) -> int | None:
        """Run the steps; returns the step count the ranks agreed to stop at (None: all done)."""
        history: deque[tuple[torch.Tensor, int]] = deque(maxlen=self.alg.gradient_delay + 1)
        self._timed_snapshot(self.opt.start_step, final=False)  # the start (wall-time snapshots)
        for s in range(self.opt.start_step, self.opt.steps):
            self.step = s
            if self.crash_step == s:
                _crash(self.rank, s, self.crash_signal)
            self.protocol.check()
            loss = self._step(s, history)
            stop = self.protocol.agree_stop(s, self.stop_requested)
            self._after(s, loss, stop)
            if stop:
                self._timed_snapshot(s + 1, final=True)
                return s + 1
        self._timed_snapshot(self.opt.steps, final=True)
        return None

    def _step(self, s: int, history: deque[tuple[torch.Tensor, int]]) -> float:
        """One step (module docstring, 1-6); returns its loss."""
        exchanges = self.protocol.exchanges(s)
        with self.replica.lock:
            snapshot = self.replica.state.params  # never modified in place (step 1 of the docstring)
            history.append((snapshot, self.replica.merges))
        read_w, read_merges = history[0]
        st = Step(step=s, snapshot=snapshot)
        self._phase("mix", exchanges, st)
        t_c0 = self.now()
        noise = self.noise
        st.grad, loss = self._compute(read_w, s, halves=noise is not None and noise.wants_halves(s, exchanges))
        t_c1 = st.compute_end_s = self.now()
        self._collect(st)
        self.protocol.share(st)
        by_allreduce = noise is not None and noise.wants_allreduce(exchanges)
        local_sq = noise.local(st.grad) if noise is not None and by_allreduce and self.reducer is None else None
        self._phase("grad", exchanges, st)
        if noise is not None and by_allreduce:
            local = local_sq if local_sq is not None else self.reducer.local_sq
            if local is not None:
                noise.add_allreduce(step=s, time_s=t_c1, local_sq=local, summed=st.grad, scale=st.scale)
        deltas, merged = self.protocol.merges(st)
        lr, grad, scale = self.opt.lr_of(s), st.grad, st.scale
        st.staleness = self.replica.step_(
            deltas, merged, lambda state: self.alg.local_update(state, grad, lr, grad_scale=scale), read_merges
        )
        self._phase("post", exchanges, st)
        self.trace.add(
            rank=self.rank, step=s, phase="compute", start_s=t_c0, end_s=t_c1, staleness=int(st.staleness), loss=loss
        )
        return loss

    def _phase(self, phase: str, exchanges: tuple[Exchange, ...], st: Step) -> None:
        """Run every exchange of ``phase``, in schedule order: a ``"mix"`` exchange's active side on
        the communication thread (its passive side is the responder's), the others here."""
        for ex in exchanges:
            if ex.phase != phase:
                continue
            name = EXCHANGE_HANDLERS.get(type(ex))
            if name is None:
                raise ConfigError(
                    f"exchange {type(ex).__name__} has no handler in the runtime "
                    f"(psgdlab.runtime.loop.exchange.protocol.EXCHANGE_HANDLERS)"
                )
            handler = getattr(self.protocol, name)
            if phase != "mix":
                handler(ex, st)
            elif getattr(ex, "active", True):
                assert self.pool is not None  # made by run() before the first step
                st.jobs.append((kind_of(ex), self.pool.submit(handler, ex, st.snapshot, st.step)))

    def _collect(self, st: Step) -> None:
        """Wait for the step's mix exchanges; their deltas go to ``st.deltas``, the time blocked
        after the compute to a ``comm`` record."""
        for _, job in st.jobs:
            delta, rows = job.result()
            if delta is not None:  # None: a peer lost in the exchange, its mix skipped
                st.deltas.append(delta)
            for row in rows:
                self.trace.add(rank=self.rank, step=st.step, **row)
        if st.jobs:
            t_j, t_c1 = self.now(), st.compute_end_s
            if t_j > t_c1:
                kind = PAIR if any(k == PAIR for k, _ in st.jobs) else GOSSIP
                self.trace.add(rank=self.rank, step=st.step, phase="comm", start_s=t_c1, end_s=t_j, kind=kind)

    def _after(self, s: int, loss: float, stop: bool) -> None:
        """After step ``s``: the trajectory, the held-out snapshot, the checkpoint, the progress."""
        opt, done = self.opt, s + 1
        if opt.record_params:
            self.trajectory.append(self.replica.state.params.detach().cpu().numpy().copy())
        snapshot = not opt.evaluate_every_s and bool(opt.evaluate_every) and done % opt.evaluate_every == 0
        save = opt.run_dir is not None and (
            (opt.checkpoint_every and done % opt.checkpoint_every == 0) or stop or done == opt.steps
        )
        if snapshot or save:
            state, merges = self.replica.read()  # one read: a step's scored snapshot and its checkpoint are one model
            if snapshot:
                self.snapshots.append((done, done, self.now(), state.params.detach().cpu().clone()))
            if save:
                self._save(done, state, merges)
        self._timed_snapshot(done, final=False)
        if opt.progress is not None:
            t, t_prev = self.now(), self._last_progress_s
            samples = self.workload.samples_per_step * self.alg.n_workers
            rate = samples / (t - t_prev) if t_prev is not None and t > t_prev else math.nan
            self._last_progress_s = t
            opt.progress(s, loss, rate)

    def _timed_snapshot(self, done: int, *, final: bool) -> None:
        """With ``evaluate_every_s``: a snapshot at the first step end at or after each wall-time
        point (the points a long step passed at once get one, under the last of their keys:
        their models would be the same) and, with ``final``, the last one."""
        every = self.opt.evaluate_every_s
        if not every:
            return
        now = self.now()
        due = []
        while now >= self._next_snapshot * every:
            due.append(self._next_snapshot)
            self._next_snapshot += 1
        if final:
            due.append(FINAL_SNAPSHOT)
        if due:
            params = self.replica.read()[0].params.detach().cpu().clone()
            self.snapshots.append((due[-1], done, now, params))

    def _result(self, stopped_at: int | None) -> RankResult:
        state, merges = self.replica.read()
        final = state.params.detach().cpu().numpy().copy() if self.n_params <= 2_000_000 else None
        return RankResult(
            rank=self.rank,
            trace=self.trace.array(),
            final_params=final,
            trajectory=np.stack(self.trajectory) if self.trajectory else None,
            evaluations=[],
            preempted=stopped_at is not None,
            extra={
                "merges": merges,
                "compute_overruns": self.overruns,
                "allreduce_algorithm": self.main.allreduce_algorithm,
                **(
                    {"noise_rows": self.noise.rows(), "noise_methods": sorted(self.noise.methods)}
                    if self.noise is not None
                    else {}
                ),
            },
            snapshots=self.snapshots,
        )

    # --- compute ---
    def _compute(self, weights: torch.Tensor, step: int, *, halves: bool = False) -> tuple[torch.Tensor, float]:
        """The step's gradient and loss (``halves``: as two backward passes, whose norms go to the
        noise probe), then the emulated compute time and the stragglers' extra."""
        t0 = time.perf_counter()
        if halves:
            assert self.noise is not None
            grad, loss, pair = self.workload.gradient_pair(weights, self.rank, step)
            self.noise.add_halves(step=step, time_s=self.now(), pair=pair)
        else:
            grad, loss = self.workload.gradient(weights, self.rank, step)
        require_finite_loss(loss, rank=self.rank, step=step)  # a NaN loss stops the run (issue 45)
        real = time.perf_counter() - t0
        stragglers = self.opt.stragglers
        if self.opt.compute_time is not None:
            rng = np.random.default_rng([self.opt.seed, self.rank, step, 0xC0])
            target = stragglers.compute_time(float(self.opt.compute_time.sample(rng)), rank=self.rank, step=step)
        else:
            target = stragglers.compute_time(real, rank=self.rank, step=step)
        remaining = target - (time.perf_counter() - t0)
        if remaining > 0:
            time.sleep(remaining)
        elif self.opt.compute_time is not None and step > self.opt.start_step:  # first step: warm-up
            self.overruns += 1
            self._warn_overrun(step, target, time.perf_counter() - t0)
        return grad, loss

    def _warn_overrun(self, step: int, target_s: float, real_s: float) -> None:
        """Say once (rank 0) that the real compute outlasts the emulated compute time."""
        if self.rank != 0 or self._overrun_warned:
            return
        self._overrun_warned = True
        message = (
            f"--compute-time is not honoured: step {step} of rank 0 computed for {real_s:.4g} s, longer than "
            f"the emulated {target_s:.4g} s (a smaller model, or a longer --compute-time, restores it)"
        )
        log.warning(message)
        warnings.warn(message, TestbedWarning, stacklevel=2)

    def _save(self, done: int, st: Any, merges: int) -> None:
        """Checkpoint ``st``, the state after step ``done`` (read under the lock by the caller),
        and the ``merges`` counted by then."""
        payload = {
            "step": done,
            "rank": self.rank,
            "params": st.params,
            "momentum": st.momentum,
            "extras": dict(st.extras),
            "merges": merges,
            "algorithm": self.alg.params(),
        }
        try:
            ckpt.save_checkpoint(
                self.opt.run_dir,  # type: ignore[arg-type]
                step=done,
                rank=self.rank,
                payload=payload,
                run_id=self.opt.run_id,
                n_ranks=self.alg.n_workers,
            )
        except ckpt.CheckpointError as exc:  # a full disk: say so and train on; the next one may fit
            log.warning("%s; training goes on", exc)
            warnings.warn(f"{exc}; training goes on", TestbedWarning, stacklevel=2)


def _protocol(
    algorithm: Algorithm, channels: dict[str, Transport], worker: _Worker, survivors: Survivors | None
) -> ExchangeProtocol:
    """The rank's exchange protocol: the survivors' under ``--on-failure continue``, else the normal one."""
    opt = worker.opt
    common: dict[str, Any] = dict(
        rank=worker.rank,
        replica=worker.replica,
        channels=channels,
        wire=Wire(opt.transform),
        flight=worker.flight,
        trace=worker.trace,
        origin=worker.origin,
        start_step=opt.start_step,
        steps=opt.steps,
        run_dir=opt.run_dir,
        jitter_s=float(os.environ.get(JITTER_ENV, "0") or 0),
        seed=opt.seed,
    )
    if survivors is not None:
        return SurvivingProtocol(algorithm, survivors=survivors, **common)
    return NormalProtocol(algorithm, **common)


def _crash_hook(rank: int) -> tuple[int | None, int]:
    """The step at which :data:`CRASH_ENV` (``RANK[,RANK...]:STEP[:KILL|STOP][:ATTEMPTS]``) makes
    ``rank`` fail in this attempt (None: never), and the signal.

    >>> os.environ[CRASH_ENV] = "1:3:STOP:2"; _crash_hook(1), _crash_hook(0)
    ((3, <Signals.SIGSTOP: 19>), (None, <Signals.SIGSTOP: 19>))
    >>> os.environ[CRASH_ENV] = "2,3:5"; [_crash_hook(r)[0] for r in range(4)]
    [None, None, 5, 5]
    >>> del os.environ[CRASH_ENV]
    """
    spec = os.environ.get(CRASH_ENV, "")
    if not spec:
        return None, signal.SIGKILL
    parts = spec.split(":")
    how = next((p for p in parts[2:] if not p.isdigit()), "KILL")
    attempts = next((int(p) for p in parts[2:] if p.isdigit()), 1)
    ranks = parts[0].split(",")
    if not (
        2 <= len(parts) <= 4 and all(r.isdigit() for r in ranks) and parts[1].isdigit() and how in ("KILL", "STOP")
    ):
        raise ConfigError(f"{CRASH_ENV} ({spec!r}) must be RANK[,RANK...]:STEP[:KILL|STOP][:ATTEMPTS]")
    sig = signal.SIGKILL if how == "KILL" else signal.SIGSTOP
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    return (int(parts[1]) if rank in {int(r) for r in ranks} and restarts < attempts else None), sig


def _crash(rank: int, step: int, sig: int) -> None:
    """The injected failure: note the wall time in ``RANKS_DIR/rank{r}.crash`` (the tests measure
    detection from it), then send ``sig`` to this process."""
    log.error("rank %d: injected %s at step %d", rank, signal.Signals(sig).name, step)
    ranks_dir = os.environ.get("PSGDLAB_RANKS_DIR")
    if ranks_dir:
        from psgdlab.core.records.trace import atomic_write_text

        atomic_write_text(Path(ranks_dir, f"rank{rank}.crash"), f"{time.time()!r} {step}")
    os.kill(os.getpid(), sig)


def state_from_checkpoint(payload: dict[str, Any], device: torch.device) -> tuple[WorkerState, int]:
    def dev(t: Any) -> Any:
        return t.to(device) if isinstance(t, torch.Tensor) else t

    state = WorkerState(
        params=dev(payload["params"]),
        momentum=dev(payload["momentum"]),
        extras={k: dev(v) for k, v in payload["extras"].items()},
    )
    return state, int(payload.get("merges", 0))


def run_worker(
    algorithm: Algorithm,
    workload: Any,
    channels: dict[str, Transport],
    *,
    options: DriverOptions,
    origin: float,
    resume_payload: dict[str, Any] | None = None,
    flight: FlightRecorder | None = None,
    survivors: Survivors | None = None,
) -> RankResult:
    """Run the worker loop of this rank (``channels["main"].rank < algorithm.n_workers``); its
    waits go to ``flight`` (:mod:`psgdlab.runtime.failures.flight`) where given; under ``--on-failure
    continue`` it goes on over the members of ``survivors`` (:mod:`psgdlab.runtime.failures.survive.survivors`).

    A :data:`STOP_SIGNALS` signal asks the rank to stop: the ranks agree on the step they stop
    at (:meth:`~psgdlab.runtime.loop.exchange.protocol.ExchangeProtocol.agree_stop`), checkpoint
    there and end as a finished run does; the result says so (:attr:`RankResult.preempted`)."""
    rank = channels["main"].rank
    state, merges = (None, 0)
    if resume_payload is not None:
        state, merges = state_from_checkpoint(resume_payload, channels["main"].device)
    worker = _Worker(
        algorithm,
        workload,
        channels,
        rank=rank,
        options=options,
        origin=origin,
        state=state,
        merges=merges,
        flight=flight,
        survivors=survivors,
    )

    def _on_stop(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        log.warning("rank %d: %s, stopping at a step the ranks agree on (from step %d)", rank, name, worker.step + 1)
        worker.stop_requested = True

    previous = {sig: signal.signal(sig, _on_stop) for sig in STOP_SIGNALS} if in_main_thread() else {}
    try:
        return worker.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
