r"""The training loop of one rank: any algorithm of the core registry over a :class:`Transport`.

The driver dispatches on exchange kinds (:mod:`psgdlab.core.exchange`), never on algorithm
names: :data:`EXCHANGE_HANDLERS` maps the class of each exchange record to its handler, which
the loop calls in the phase the record names (``ex.phase``: ``"mix"`` before the compute,
``"grad"`` after it, ``"post"`` after the local update). It follows the shared step semantics.
One step of worker ``r`` at local step ``s``:

1. under the model lock, take the model (what ``"mix"`` exchanges send) and the count of
   foreign merges -- no copy: the core kernels never modify an array in place, every update
   makes a new one, so the reference stays a snapshot; the gradient is computed on the
   snapshot of ``gradient_delay`` steps ago;
2. hand every *active* :class:`PairwiseAverage` and every :class:`Gossip` of the step to the
   communication thread, which runs it on the snapshot **while** the training thread computes
   the gradient (trace phase ``overlap``); passive entries are answered by the responder thread
   whenever the active peer asks (AD-PSGD's bipartite split: only active sides initiate, a
   passive side never waits, so no schedule can deadlock);
3. wait for the communication thread (trace phase ``comm`` for the time blocked), allreduce the
   gradient over each ``"grad"`` group -- a *sum*, whose ``1/n`` is folded into the update
   (``local_update(..., grad_scale=1/n)``) instead of costing a divide pass. With real compute,
   a :class:`~psgdlab.runtime.loop.workloads.ModuleWorkload` and NCCL (elsewhere on request:
   :data:`OVERLAP_ENV`), a schedule whose every step has one gradient allreduce over the same
   group overlaps it with the backward pass in buckets
   (:mod:`psgdlab.runtime.loop.overlap`, DDP's scheme; trace: one ``overlap`` record with the bytes,
   and a ``comm`` record for the time blocked after the compute);
4. merge mixing results: ``params <- params + (mixed - sent)``, so local updates made during
   the exchange are kept; every merge (active or passive side) counts one foreign merge;
5. apply ``algorithm.local_update``; staleness = foreign merges since the snapshot of step 1;
6. run ``"post"`` exchanges on the training thread: model allreduce then ``algorithm.combine``;
   the parameter-server exchange (staleness is then the server's version difference returned by
   ``server_apply``); barriers.

Where things live: the parameter server of ASGD / asynchronous EASGD is an extra process, rank
``n_workers`` (the last rank; :mod:`psgdlab.runtime.loop.server`, which also holds the worker's side
of its exchange); workers are ranks ``0 .. n_workers-1``. H-ADPSGD's intra-node
groups are ``HADPSGD.node_group``; a sharded inter-node exchange allgathers the averaged
*differences* ``mixed - sent`` of the node's members, and a node applies them at the same point
of its lock-stepped loop on every member (the training threads agree on how many passive merges
have arrived with a tiny allgather), so the replicas of a node stay bit-identical. Under
``--on-failure continue`` a node can lose members, and those groups were made at start-up: there
each member averages the slices the survivors' schedule gives it and the node sums the slices'
differences with the gradient, in one allreduce it can make again over its survivors
(:meth:`_Worker._surviving_allreduce`).

Emulated compute (``compute_time``): the real gradient is computed, then the thread sleeps until
the step's compute phase has lasted the sampled time (times the straggler factor, plus pauses);
when the real compute alone takes longer, rank 0 warns once (:class:`TestbedWarning`).
Real compute: stragglers sleep the extra ``(factor - 1) * duration`` (plus pauses).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import signal
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from psgdlab.core.algorithms.base import Algorithm, WorkerState
from psgdlab.core.errors import ConfigError, TestbedWarning, TransportError
from psgdlab.core.exchange import (
    EXCHANGE_KINDS,
    AllReduce,
    Barrier,
    Exchange,
    Gossip,
    PairwiseAverage,
    ServerExchange,
    wire_bytes,
)
from psgdlab.core.failure import STEP_CHECK_ELEMENTS, sums_node_slices
from psgdlab.core.membership import without_peers
from psgdlab.core.stragglers import StragglerModel
from psgdlab.core.timing import ComputeTime
from psgdlab.core.trace import SERVER_PEER, TraceBuilder
from psgdlab.runtime.failures.flight import FlightRecorder
from psgdlab.runtime.failures.survive.survivors import Survivors
from psgdlab.runtime.loop import checkpoint as ckpt
from psgdlab.runtime.loop.scan import count_passive, overlap_group, shard_bounds
from psgdlab.runtime.loop.server import server_exchange
from psgdlab.runtime.loop.workloads import require_finite_loss
from psgdlab.runtime.transports.env import in_main_thread
from psgdlab.runtime.transports.transport import Tags, Transport

__all__ = [
    "DriverOptions",
    "RankResult",
    "run_worker",
    "EXCHANGE_HANDLERS",
    "CRASH_ENV",
    "OVERLAP_ENV",
    "STOP_CHECK_EVERY",
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

#: synchronous runs agree on a SIGTERM stop (a tiny allreduce) every this many steps
STOP_CHECK_EVERY = 10

_PAIR = EXCHANGE_KINDS[PairwiseAverage]
_GOSSIP = EXCHANGE_KINDS[Gossip]
_ALLREDUCE = EXCHANGE_KINDS[AllReduce]
_SERVER = EXCHANGE_KINDS[ServerExchange]
_BARRIER = EXCHANGE_KINDS[Barrier]


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
    progress : callable (step, loss, samples_per_s) -> None, optional
        Called after every step (rank 0's tqdm bar; under ``--on-failure restart`` every rank's
        progress record, :class:`psgdlab.runtime.launcher.elastic.Progress`).
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
    progress: Callable[[int, float, float], None] | None = None


@dataclass(slots=True)
class RankResult:
    """What a rank hands back to rank 0 at the end."""

    rank: int
    trace: np.ndarray
    final_params: np.ndarray | None
    trajectory: np.ndarray | None
    evaluations: list[dict[str, Any]]
    preempted: bool = False
    snapshots: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was written."""


@dataclass(slots=True)
class _Step:
    """What the phases of one step hand each other (the exchange handlers read and update it)."""

    step: int
    snapshot: torch.Tensor  # the model the "mix" exchanges send (never modified in place)
    jobs: list[tuple[int, Future]] = field(default_factory=list)  # (trace kind, job) on the comm thread
    grad: Any = None
    scale: float = 1.0  # the gradient to apply is scale * grad
    compute_end_s: float = 0.0
    staleness: int = 0
    #: under ``continue``, in a node of several members: this rank's slice deltas of the step (its
    #: active exchanges' and the passive ones since the last step), summed over the node with the
    #: gradient (:meth:`_Worker._surviving_allreduce`); after it, the node's sum
    shared: list[torch.Tensor] | None = None
    #: the exchanges this rank took part in that ``shared`` holds: its staleness counts its own
    #: exchanges, one a node's exchange on every member, as the simulator and ``stop`` count them
    merged: int = 0


# ----- the worker -----------------------------------------------------------------------------------
class _Worker:
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
        #: the membership under ``--on-failure continue`` (None: every rank is needed to the end)
        self.survivors = survivors
        self.workload = workload
        self.main = channels["main"]
        self.comm = channels["comm"]
        self.resp = channels["responder"]
        self.rank = rank
        self.opt = options
        self.origin = origin
        self.device = self.main.device
        x0 = workload.initial_params().to(self.device)
        self.state = state if state is not None else algorithm.init_state(x0, rank)
        self.n_params = int(x0.numel())
        self.itemsize = x0.element_size()
        self.lock = threading.Lock()
        self.merges = merges
        self.trace = TraceBuilder()
        self.step = options.start_step
        self.pending: deque[torch.Tensor] = deque()  # sharded passive deltas awaiting the node's agreement
        self.applied_passive = 0
        self.errors: queue.SimpleQueue[BaseException] = queue.SimpleQueue()
        self.pool: ThreadPoolExecutor | None = None  # the communication thread (during run)
        self.reducer: Any = None  # the bucketed gradient allreduce overlapped with the backward pass
        self._overrun_warned = False
        self.overruns = 0  # steps whose real compute outlasted the emulated compute time
        self.stop_requested = False
        self.jitter = float(os.environ.get(JITTER_ENV, "0") or 0)
        self._jitter_rng = np.random.default_rng([options.seed, rank, 77])
        #: every blocking wait of every thread (:mod:`psgdlab.runtime.failures.flight`); without one, nothing is written
        self.flight = flight if flight is not None else FlightRecorder(rank, out=None, deadline_s=math.inf)
        self.crash_step, self.crash_signal = _crash_hook(rank)
        #: under ``continue``, a rank whose pairwise exchanges move slices of the model (a node of
        #: several members) shares the slices' deltas with its node through the gradient allreduce
        #: (:meth:`_surviving_allreduce`) instead of allgathers over groups made at start-up
        self.node_shares = survivors is not None and sums_node_slices(algorithm, "continue", rank, options.start_step)

    def now(self) -> float:
        return time.time() - self.origin

    def _sleep_jitter(self) -> None:
        if self.jitter > 0:
            time.sleep(float(self._jitter_rng.uniform(0, self.jitter)))

    # --- communication thread: active side ---
    def _active_pairwise(
        self, ex: PairwiseAverage, sent_full: torch.Tensor, step: int
    ) -> tuple[torch.Tensor | None, list]:
        if self.survivors is not None:
            return self._active_pairwise_surviving(ex, sent_full, step)
        t0 = self.now()
        self._sleep_jitter()
        lo, hi = shard_bounds(self.n_params, ex.n_shards)[ex.shard]
        sent = sent_full[lo:hi].contiguous()
        header = torch.tensor([step, self.rank, ex.shard, ex.n_shards], dtype=torch.int64)
        nbytes, _ = wire_bytes(ex, self.n_params, self.itemsize)
        with self.flight.wait("pairwise", what="active", step=step, peers=[ex.peer], nbytes=nbytes):
            self.comm.send(header, ex.peer, Tags.PAIR_HEADER)
            received = torch.empty_like(sent)
            self.comm.sendrecv(sent, received, ex.peer, Tags.PAIR_PAYLOAD)
        delta = self.alg.mix(ex, sent, received) - sent
        if ex.n_shards > 1:
            sizes = [b - a for a, b in shard_bounds(self.n_params, ex.n_shards)]
            with self.flight.wait("allgather", what="shards", step=step, peers=ex.gather_group):
                delta = self.comm.allgather(delta, sizes, ex.gather_group)
        rows = [dict(phase="overlap", start_s=t0, end_s=self.now(), kind=_PAIR, peer=ex.peer, nbytes=nbytes)]
        return delta, rows

    def _gossip(self, ex: Gossip, sent: torch.Tensor, step: int) -> tuple[torch.Tensor, list]:
        if self.survivors is not None:
            return self._gossip_surviving(ex, sent, step)
        t0 = self.now()
        self._sleep_jitter()
        bufs = [torch.empty_like(sent) for _ in ex.peers]
        nbytes, _ = wire_bytes(ex, self.n_params, self.itemsize)
        with self.flight.wait("gossip", step=step, peers=ex.peers, nbytes=nbytes, tag=Tags.GOSSIP):
            self.comm.multi_exchange(sent, bufs, list(ex.peers), Tags.GOSSIP)
        delta = self.alg.mix(ex, sent, bufs) - sent
        return delta, [dict(phase="overlap", start_s=t0, end_s=self.now(), kind=_GOSSIP, peer=-1, nbytes=nbytes)]

    def _active_pairwise_surviving(
        self, ex: PairwiseAverage, sent: torch.Tensor, step: int
    ) -> tuple[torch.Tensor | None, list]:
        """The active side under ``--on-failure continue`` (:mod:`psgdlab.runtime.failures.survive.survivors`):
        request, wait for the reply while the peer is a member, then move the payload. A peer lost
        on the way (its connection closed, silent past the deadline, an error in the payload's
        exchange) is removed from the membership and the step's mix skipped: ``(None, rows)``, the
        model unchanged, so the survivor loses no work."""
        members = self.survivors
        assert members is not None
        t0 = self.now()
        self._sleep_jitter()
        peer, mailbox = ex.peer, members.mailbox
        nbytes, _ = wire_bytes(ex, self.n_params, self.itemsize)
        rows = [dict(phase="overlap", start_s=t0, end_s=t0, kind=_PAIR, peer=peer, nbytes=nbytes)]
        epoch = members.epoch().epoch
        lo, hi = shard_bounds(self.n_params, ex.n_shards)[ex.shard]
        full = sent
        sent = full[lo:hi].contiguous()
        request: tuple = ("request", step, epoch)
        if ex.n_shards > 1 or ex.weight != 0.5:  # a slice, or nodes of different sizes
            request += (ex.shard, ex.n_shards, ex.weight)
        if not mailbox.send(peer, request):
            members.remove(peer, f"rank {peer} could not be reached at step {step}")
            return None, rows
        # the wait's deadline is the mailbox's (a silent peer is given up): the watchdog's is a backstop
        with self.flight.wait(
            "pairwise", what="active", step=step, peers=[peer], deadline_s=2 * self.flight.deadline_s
        ):
            while True:
                try:
                    reply = mailbox.replies[peer].get(timeout=0.1)
                    break
                except queue.Empty:
                    if not members.alive(peer):
                        return None, rows
            if reply[0] != "reply" or not reply[2]:
                members.epoch()  # refused: this rank was given up (Removed), or the peer is gone
                return None, rows
            received = torch.empty_like(sent)
            try:
                self._unless_lost(partial(self.comm.sendrecv, sent, received, peer, Tags.PAIR_PAYLOAD), peer)
            except RuntimeError as exc:  # TransportError included: the peer died in the exchange
                members.remove(peer, f"rank {peer} failed in a pairwise exchange at step {step}: {exc}")
                return None, rows
        members.shared(peer, int(reply[1]))
        delta = self.alg.mix(ex, sent, received) - sent
        rows[0]["end_s"] = self.now()
        return _in_full(delta, lo, hi, full), rows

    def _gossip_surviving(self, ex: Gossip, sent: torch.Tensor, step: int) -> tuple[torch.Tensor, list]:
        """D-PSGD's gossip under ``--on-failure continue``: one pairwise exchange per peer, in
        increasing rank order on every member (the edges in one global order: the lowest edge not
        yet done always has both ends at it, so the order cannot deadlock), so that a peer lost in
        its exchange costs only its own edge: its weight goes to this rank
        (:func:`~psgdlab.core.membership.without_peers`) and the other peers' exchanges go on."""
        members = self.survivors
        assert members is not None
        t0 = self.now()
        self._sleep_jitter()
        lost: list[int] = []
        received: dict[int, torch.Tensor] = {}
        nbytes, _ = wire_bytes(ex, self.n_params, self.itemsize)
        for peer in sorted(ex.peers):
            buf = torch.empty_like(sent)
            try:
                with self.flight.wait(
                    "gossip",
                    step=step,
                    peers=[peer],
                    nbytes=nbytes // max(1, len(ex.peers)),
                    tag=Tags.GOSSIP,
                    deadline_s=2 * self.flight.deadline_s,
                ):
                    self.comm.sendrecv(sent, buf, peer, Tags.GOSSIP)
                received[peer] = buf
                members.shared(peer, step)  # a blocking gossip's neighbours exchange at the same step
            except RuntimeError as exc:  # TransportError included: the peer died or was given up
                members.remove(peer, f"rank {peer} failed in a gossip exchange at step {step}: {exc}")
                lost.append(peer)
        mixing = without_peers(ex, lost) if lost else ex
        delta = self.alg.mix(mixing, sent, [received[p] for p in mixing.peers]) - sent
        return delta, [dict(phase="overlap", start_s=t0, end_s=self.now(), kind=_GOSSIP, peer=-1, nbytes=nbytes)]

    def _unless_lost(self, exchange: Callable[[], None], *peers: int) -> None:
        """Run a payload ``exchange`` with ``peers`` under ``continue``, on a thread of its own, and
        give up waiting for it (:class:`TransportError`) once one of them is given up: gloo cannot
        interrupt a transfer to a stopped process or a host cut off before its own timeout (at
        least the set-up's 60 s), so the transfer is left to end by it, unread. (The shared-memory
        plane ends its own waits on a given-up peer.)"""
        members = self.survivors
        assert members is not None
        outcome: list[BaseException] = []
        others = [p for p in peers if p != self.rank]

        def run() -> None:
            try:
                exchange()
            except BaseException as exc:
                outcome.append(exc)

        name = "-".join(map(str, others))
        worker = threading.Thread(target=run, daemon=True, name=f"psgdlab-payload-{self.rank}-{name}")
        worker.start()
        while True:
            worker.join(timeout=0.05)
            if not worker.is_alive():
                break
            lost = [p for p in others if not members.alive(p)]
            if lost:
                raise TransportError(f"rank {self.rank}: rank {lost[0]} was given up during a payload exchange")
        if outcome:
            raise outcome[0]

    # --- responder thread: passive side ---
    def serve(self, n_requests: int, example: PairwiseAverage | None) -> None:
        try:
            if self.survivors is not None:
                self._serve_surviving()
            else:
                self._serve(n_requests, example)
        except BaseException as exc:
            self.errors.put(exc)

    def _serve_surviving(self) -> None:
        """The passive side under ``--on-failure continue``: answer requests until every living
        member has said it is done; refuse a requester that is no longer a member; a requester
        lost in the payload's exchange is removed and its merge dropped."""
        members = self.survivors
        assert members is not None
        mailbox = members.mailbox
        while True:
            try:
                item = mailbox.requests.get(timeout=0.2)
            except queue.Empty:
                item = None
            if item is None:
                if members.peers_done():
                    return
                continue
            src, (_, step, _epoch, *sliced) = item
            current = members.epoch()  # raises Removed when this rank was given up
            ok = src in current.alive and src not in mailbox.lost
            if not mailbox.send(src, ("reply", self.step, ok, current.epoch)) or not ok:
                continue
            t0 = self.now()
            shard, n_shards, weight = sliced if sliced else (0, 1, 0.5)
            # the requester's view of the two nodes' sizes: its node weighs 1 - its weight here
            ex = PairwiseAverage(peer=src, active=False, shard=shard, n_shards=n_shards, weight=1.0 - weight)
            nbytes, _ = wire_bytes(ex, self.n_params, self.itemsize)
            lo, hi = shard_bounds(self.n_params, n_shards)[shard]
            with self.lock:
                full = self.state.params
                sent = full[lo:hi].clone()
            received = torch.empty_like(sent)
            try:
                with self.flight.wait(
                    "pairwise",
                    what="passive",
                    step=step,
                    peers=[src],
                    nbytes=nbytes,
                    deadline_s=2 * self.flight.deadline_s,
                ):
                    self._unless_lost(partial(self.resp.sendrecv, sent, received, src, Tags.PAIR_PAYLOAD), src)
            except RuntimeError as exc:
                members.remove(src, f"rank {src} failed in a pairwise exchange at its step {step}: {exc}")
                continue
            members.shared(src, step)
            delta = _in_full(self.alg.mix(ex, sent, received) - sent, lo, hi, full)
            self._merge_passive(delta, src=src, t0=t0, nbytes=nbytes, hold=self.node_shares)

    def _serve(self, n_requests: int, example: PairwiseAverage | None) -> None:
        sharded = example is not None and example.n_shards > 1
        group = tuple(example.gather_group) if example is not None and sharded else ()
        for _ in range(n_requests):
            with self.flight.wait("pairwise", what="passive", step=None, peers=group) as rec:
                self._serve_one(sharded, group, rec)

    def _serve_one(self, sharded: bool, group: tuple[int, ...], rec: dict[str, Any]) -> None:
        """Wait for one pairwise request, answer it, merge (or queue) the result; ``rec`` is the
        flight record of the wait (its peer and step filled in once the header names them)."""
        header = torch.zeros(4, dtype=torch.int64)
        if sharded:
            leader = group[0]
            decision = torch.zeros(1, dtype=torch.int64)
            if self.rank == leader:
                src = self.resp.recv(header, None, Tags.PAIR_HEADER)
                decision[0] = src - int(header[2])  # base rank of the active node
            decision = decision.to(self.device)  # a collective: on the backend's device (NCCL: GPU)
            self.resp.broadcast(decision, leader, group)
            local = group.index(self.rank)
            if self.rank != leader:
                src = int(decision[0]) + local
                self.resp.recv(header, src, Tags.PAIR_HEADER)
        else:
            src = self.resp.recv(header, None, Tags.PAIR_HEADER)
        t0 = self.now()
        shard, n_shards = int(header[2]), int(header[3])
        ex = PairwiseAverage(
            peer=src, active=False, shard=shard, n_shards=n_shards, gather_group=group if n_shards > 1 else ()
        )
        nbytes, _ = wire_bytes(ex, self.n_params, self.itemsize)
        rec.update(peers=[src], step=int(header[0]), nbytes=nbytes)
        lo, hi = shard_bounds(self.n_params, n_shards)[shard]
        with self.lock:
            sent = self.state.params[lo:hi].clone()
        received = torch.empty_like(sent)
        self.resp.sendrecv(sent, received, src, Tags.PAIR_PAYLOAD)
        delta = self.alg.mix(ex, sent, received) - sent
        if n_shards > 1:
            sizes = [b - a for a, b in shard_bounds(self.n_params, n_shards)]
            delta = self.resp.allgather(delta, sizes, group)
        self._merge_passive(delta, src=src, t0=t0, nbytes=nbytes, hold=n_shards > 1)

    def _merge_passive(self, delta: torch.Tensor, *, src: int, t0: float, nbytes: int, hold: bool = False) -> None:
        """Merge the result of an answered pairwise request -- or, for a sharded one (``hold``),
        hold it until the node agrees (:meth:`_merge_pending`) -- and trace the exchange."""
        with self.lock:
            if hold:
                self.pending.append(delta)
            else:
                self.state = self.state.replace(params=self.state.params + delta)
                self.merges += 1
        self.trace.add(
            rank=self.rank,
            step=self.step,
            phase="overlap",
            start_s=t0,
            end_s=self.now(),
            kind=_PAIR,
            peer=src,
            nbytes=nbytes,
        )

    def _check_errors(self) -> None:
        if not self.errors.empty():
            exc = self.errors.get()
            raise TransportError(f"rank {self.rank}: communication thread failed: {exc}") from exc

    # --- compute ---
    def _compute(self, weights: torch.Tensor, step: int) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
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

    def _merge_pending(self, group: tuple[int, ...], step: int) -> None:
        """Apply the sharded passive merges every member of the node has received (the agreement
        is a rendezvous of the node each step, recorded as a barrier: the simulator prices it so)."""
        with self.lock:
            have = len(self.pending)
        t0 = self.now()
        with self.flight.wait("barrier", what="passive merges", step=step, peers=group):
            counts = self.main.allgather(
                torch.tensor([have], dtype=torch.int64, device=self.device), [1] * len(group), group
            )
        self.trace.add(rank=self.rank, step=step, phase="comm", start_s=t0, end_s=self.now(), kind=_BARRIER)
        k = int(counts.min())
        with self.lock:
            for _ in range(k):
                self.state = self.state.replace(params=self.state.params + self.pending.popleft())
                self.merges += 1

    # --- the loop ---
    def run(self) -> RankResult:
        alg, opt = self.alg, self.opt
        n_passive, example = count_passive(alg, self.rank, opt.start_step, opt.steps)
        # a node whose members answer sharded requests agrees each step on the merges to apply
        # (under continue: through the gradient allreduce, :meth:`_surviving_allreduce`)
        sharded = example is not None and example.n_shards > 1 and self.survivors is None
        sharded_group = tuple(example.gather_group) if example is not None and sharded else None
        responder = None
        if n_passive or self.survivors is not None:  # survivors: any member may come to ask
            responder = threading.Thread(
                target=self.serve, args=(n_passive, example), daemon=True, name=f"psgdlab-responder-{self.rank}"
            )
            responder.start()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"psgdlab-comm-{self.rank}")
        history: deque[tuple[torch.Tensor, int]] = deque(maxlen=alg.gradient_delay + 1)
        trajectory: list[np.ndarray] = []
        snapshots: list[tuple[int, torch.Tensor]] = []
        samples = self.workload.samples_per_step
        t_prev = None
        # synchronous ranks agree on a SIGTERM stop with an allreduce, which survivors cannot run
        sync = not alg.asynchronous and alg.n_workers > 1 and self.survivors is None
        preempted = False
        choice = os.environ.get(OVERLAP_ENV, "")
        wanted = (
            opt.compute_time is None
            and self.survivors is None  # survivors re-form their groups: one allreduce they can retry
            and (choice == "1" or (choice != "0" and self.main.async_progress))
        )
        group = overlap_group(alg, self.rank, opt.start_step, opt.steps) if wanted else None
        if group is not None and hasattr(self.workload, "overlap_allreduce"):
            self.reducer = self.workload.overlap_allreduce(self.main, group)
        try:
            for s in range(opt.start_step, opt.steps):
                self.step = s
                if self.crash_step == s:
                    _crash(self.rank, s, self.crash_signal)
                self._check_errors()
                exchanges = alg.exchanges(s, self.rank) if self.survivors is None else self.survivors.exchanges(s)
                with self.lock:
                    snapshot = self.state.params  # never modified in place (step 1 of the docstring)
                    history.append((snapshot, self.merges))
                read_w, read_merges = history[0]
                st = _Step(step=s, snapshot=snapshot)
                self._run_phase("mix", exchanges, st)
                t_c0 = self.now()
                st.grad, loss = self._compute(read_w, s)
                t_c1 = st.compute_end_s = self.now()
                deltas = []
                for _, job in st.jobs:
                    delta, rows = job.result()
                    if delta is not None:  # None: a peer lost in the exchange, its mix skipped
                        deltas.append(delta)
                    for row in rows:
                        self.trace.add(rank=self.rank, step=s, **row)
                if st.jobs:
                    t_j = self.now()
                    if t_j > t_c1:
                        kind = _PAIR if any(k == _PAIR for k, _ in st.jobs) else _GOSSIP
                        self.trace.add(rank=self.rank, step=s, phase="comm", start_s=t_c1, end_s=t_j, kind=kind)
                if self.node_shares:  # the node sums its members' slice deltas with the gradient
                    with self.lock:
                        held = list(self.pending)
                        self.pending.clear()
                    st.shared, st.merged, deltas = deltas + held, len(deltas) + len(held), []
                self._run_phase("grad", exchanges, st)
                if st.shared is not None:  # the node's sum (a node of one: this rank's own)
                    deltas = st.shared
                if sharded_group is not None:
                    self._merge_pending(sharded_group, s)
                with self.lock:
                    for delta in deltas:
                        self.state = self.state.replace(params=self.state.params + delta)
                    self.merges += st.merged if st.shared is not None else len(deltas)
                    st.staleness = self.merges - read_merges
                    self.state = alg.local_update(self.state, st.grad, opt.lr_of(s), grad_scale=st.scale)
                self._run_phase("post", exchanges, st)
                self.trace.add(
                    rank=self.rank,
                    step=s,
                    phase="compute",
                    start_s=t_c0,
                    end_s=t_c1,
                    staleness=int(st.staleness),
                    loss=loss,
                )
                if opt.record_params:
                    trajectory.append(self.state.params.detach().cpu().numpy().copy())
                snapshot = bool(opt.evaluate_every) and (s + 1) % opt.evaluate_every == 0
                stop = self.stop_requested and not sync  # synchronous ranks stop together, below
                if sync and ((s + 1) % STOP_CHECK_EVERY == 0 or s + 1 == opt.steps):
                    flag = torch.tensor([1.0 if self.stop_requested else 0.0], device=self.device)
                    with self.flight.wait("allreduce", what="stop check", step=s, peers=alg.all_ranks):
                        self.main.allreduce_mean(flag, alg.all_ranks)
                    stop = bool(flag.item() > 0)
                done = s + 1
                save = opt.run_dir is not None and (
                    (opt.checkpoint_every and done % opt.checkpoint_every == 0) or stop or done == opt.steps
                )
                if snapshot or save:
                    with self.lock:  # one read: a step's scored snapshot and its checkpoint are one model
                        state, merges = self.state, self.merges  # (every update replaces the tensors)
                    if snapshot:
                        snapshots.append((done, state.params.detach().cpu().clone()))
                    if save:
                        self._save(done, state, merges)
                if opt.progress is not None:
                    t = self.now()
                    rate = samples * alg.n_workers / (t - t_prev) if t_prev is not None and t > t_prev else math.nan
                    t_prev = t
                    opt.progress(s, loss, rate)
                if stop:
                    preempted = True
                    break
            if preempted and (alg.asynchronous or self.survivors is not None):
                # partners may be waiting for this rank: leave at once, the launcher stops the rest
                raise Preempted(f"rank {self.rank} stopped by SIGTERM at step {self.step + 1}")
            if self.survivors is not None:
                self.survivors.finish_steps()
            if responder is not None:
                while responder.is_alive():
                    responder.join(timeout=0.5)
                    self._check_errors()
            self._check_errors()
        finally:
            # after a failure the communication thread may wait on a dead peer: do not join it
            self.pool.shutdown(wait=sys.exc_info()[0] is None)
            if self.reducer is not None:
                self.workload.end_overlap()
            self.main.close()
        final = self.state.params.detach().cpu().numpy().copy() if self.n_params <= 2_000_000 else None
        return RankResult(
            rank=self.rank,
            trace=self.trace.array(),
            final_params=final,
            trajectory=np.stack(trajectory) if trajectory else None,
            evaluations=[],
            preempted=preempted,
            extra={
                "merges": self.merges,
                "compute_overruns": self.overruns,
                "allreduce_algorithm": self.main.allreduce_algorithm,
            },
            snapshots=snapshots,
        )

    # --- the exchange handlers (EXCHANGE_HANDLERS), each called in the phase its record names ---
    def _run_phase(self, phase: str, exchanges: tuple[Exchange, ...], st: _Step) -> None:
        """Call the handler of every exchange of ``phase``, in schedule order."""
        for ex in exchanges:
            if ex.phase != phase:
                continue
            handler = EXCHANGE_HANDLERS.get(type(ex))
            if handler is None:
                raise ConfigError(
                    f"exchange {type(ex).__name__} has no handler in the runtime "
                    f"(psgdlab.runtime.loop.driver.EXCHANGE_HANDLERS)"
                )
            handler(self, ex, st)

    def _on_pairwise(self, ex: PairwiseAverage, st: _Step) -> None:
        """Mix: the active side runs on the communication thread during the compute; the
        responder thread answers the passive side whenever its peer asks."""
        assert self.pool is not None  # made by run() before the first step
        if ex.active:
            st.jobs.append((_PAIR, self.pool.submit(self._active_pairwise, ex, st.snapshot, st.step)))

    def _on_gossip(self, ex: Gossip, st: _Step) -> None:
        """Mix: on the communication thread during the compute."""
        assert self.pool is not None  # made by run() before the first step
        st.jobs.append((_GOSSIP, self.pool.submit(self._gossip, ex, st.snapshot, st.step)))

    def _on_allreduce(self, ex: AllReduce, st: _Step) -> None:
        """Grad: sum the gradient over the group; post: average the model and ``combine`` it."""
        if ex.payload == "grad":
            self._gradient_allreduce(ex, st)
        else:
            self._model_allreduce(ex, st)

    def _gradient_allreduce(self, ex: AllReduce, st: _Step) -> None:
        """The gradient's sum over the group; its ``1/n`` goes to ``st.scale`` (folded into the update)."""
        if self.survivors is not None:
            self._surviving_allreduce(ex, st)
            return
        s, t_c1 = st.step, st.compute_end_s
        nbytes = wire_bytes(ex, self.n_params, self.itemsize)[0]
        reducer = self.reducer
        if reducer is not None and tuple(ex.group) == reducer.group:
            with self.flight.wait("allreduce", what="gradient, overlapped", step=s, peers=ex.group, nbytes=nbytes):
                st.grad = reducer.finish()
            t_end = self.now()
            started = reducer.first_start_s - self.origin if reducer.first_start_s else t_c1
            self.trace.add(
                rank=self.rank,
                step=s,
                phase="overlap",
                start_s=min(started, t_end),
                end_s=t_end,
                kind=_ALLREDUCE,
                nbytes=nbytes,
            )
            if t_end > t_c1:
                self.trace.add(rank=self.rank, step=s, phase="comm", start_s=t_c1, end_s=t_end, kind=_ALLREDUCE)
        else:
            if st.scale != 1.0:
                st.grad = st.grad * st.scale
            t0 = self.now()
            self._sleep_jitter()
            with self.flight.wait("allreduce", what="gradient", step=s, peers=ex.group, nbytes=nbytes):
                self.main.allreduce_sum(st.grad, ex.group)
            self.trace.add(
                rank=self.rank, step=s, phase="comm", start_s=t0, end_s=self.now(), kind=_ALLREDUCE, nbytes=nbytes
            )
        st.scale = 1.0 / len(ex.group)

    def _surviving_allreduce(self, ex: AllReduce, st: _Step) -> None:
        """The gradient allreduce under ``--on-failure continue``: a member of the group lost on the
        way is removed and the step's sum made again over the survivors, from this rank's own
        contribution (no survivor's gradient or merge is lost; the dead one's are).

        One buffer goes round: the gradient, then -- in a node whose pairwise exchanges move
        slices (:attr:`node_shares`) -- the sum of this rank's slice deltas (``st.shared``: each
        member holds the slices it averaged, so the node's sum is every slice, applied alike on
        every member and the replicas stay identical), then a check that every member is at the
        same step (``step mod 1024`` and its square: their sums are exact in float32 and float64
        for groups of up to 16, where it is made). A group made at start-up runs on the main
        channel (shared memory on one host), a group of survivors on
        :attr:`Survivors.groups <psgdlab.runtime.failures.survive.survivors.Survivors.groups>`."""
        s, n = st.step, st.grad.numel()
        mark = float(s % 1024)
        shared = st.shared
        size = n + (self.n_params if shared is not None else 0) + STEP_CHECK_ELEMENTS

        def contribution() -> torch.Tensor:
            """This rank's buffer, written in place (made again for each try of the sum)."""
            buf = torch.empty(size, dtype=st.grad.dtype, device=st.grad.device)
            grad = st.grad.reshape(-1)
            if st.scale != 1.0:
                torch.mul(grad, st.scale, out=buf[:n])
            else:
                buf[:n].copy_(grad)
            if shared is not None:
                own = buf[n : n + self.n_params]
                if shared:
                    own.copy_(shared[0])
                    for delta in shared[1:]:
                        own += delta
                else:
                    own.zero_()
            buf[-STEP_CHECK_ELEMENTS:] = torch.tensor([mark, mark * mark], dtype=buf.dtype)
            return buf

        nbytes = wire_bytes(ex, size, self.itemsize)[0]
        t0 = self.now()
        self._sleep_jitter()
        with self.flight.wait(
            "allreduce",
            what="gradient, survivors",
            step=s,
            peers=ex.group,
            nbytes=nbytes,
            deadline_s=2 * self.flight.deadline_s,
        ):
            total, group = self._reduce_over_survivors(contribution, tuple(ex.group), s)
        k = len(group)
        marks, squares = (float(v) for v in total[-STEP_CHECK_ELEMENTS:])
        exact = k <= 16 and torch.finfo(total.dtype).bits >= 32
        if exact and (marks != k * mark or squares != k * mark * mark):
            raise TransportError(
                f"rank {self.rank}: the members {list(group)} summed gradients of different steps (this rank's "
                f"is step {s}): one finished the allreduce a member died in, another did not"
            )
        st.grad = total[:n].view_as(st.grad)
        if shared is not None:
            st.shared = [total[n : n + self.n_params]]
        st.scale = 1.0 / k
        self.trace.add(
            rank=self.rank, step=s, phase="comm", start_s=t0, end_s=self.now(), kind=_ALLREDUCE, nbytes=nbytes
        )

    def _reduce_over_survivors(
        self, contribution: Callable[[], torch.Tensor], group: tuple[int, ...], step: int
    ) -> tuple[torch.Tensor, tuple[int, ...]]:
        """The sum of this rank's ``contribution()`` over ``group``, or over its survivors once
        members die (each try sums a buffer made afresh: a failed allreduce may have written into
        its own, and a transfer left to gloo's timeout may still write); returns the sum and the
        group it was made over."""
        members = self.survivors
        assert members is not None
        while len(group) > 1:
            work = contribution()
            reduce = self.main.allreduce_sum if self.main.has_group(group) else members.groups.allreduce_sum
            try:
                self._unless_lost(partial(reduce, work, group), *group)
                return work, group
            except RuntimeError as exc:  # TransportError included: a member died or was given up
                group = self._regroup(group, step, exc)
        return contribution(), group

    def _regroup(self, group: tuple[int, ...], step: int, exc: BaseException) -> tuple[int, ...]:
        """After ``group``'s allreduce failed: wait (up to the deadline) until the membership names
        a member of it dead, agree on that, and return the group of the step rebuilt over the
        survivors (:func:`~psgdlab.core.membership.survivor_exchanges`; this rank alone when one
        is left). Every member ends at the same group: a membership only shrinks, and a member
        still on an older group cannot finish a collective without those already on the new."""
        members = self.survivors
        assert members is not None
        end = time.monotonic() + min(self.flight.deadline_s, 2 * members.mailbox.deadline_s)
        while not (lost := [r for r in group if r != self.rank and not members.alive(r)]):
            if time.monotonic() > end:
                raise TransportError(
                    f"rank {self.rank}: the allreduce over {list(group)} failed at step {step} ({exc}), "
                    "and no member of it was found dead"
                )
            time.sleep(0.05)
        for r in lost:
            members.remove(r, f"rank {r} failed in the allreduce over {list(group)} at step {step}")
        grads = [e for e in members.exchanges(step) if isinstance(e, AllReduce) and e.payload == "grad"]
        return tuple(grads[0].group) if grads else (self.rank,)

    def _model_allreduce(self, ex: AllReduce, st: _Step) -> None:
        t0 = self.now()
        self._sleep_jitter()
        with self.lock:
            mean = self.state.params.clone()
        nbytes = wire_bytes(ex, self.n_params, self.itemsize)[0]
        with self.flight.wait("allreduce", what="model", step=st.step, peers=ex.group, nbytes=nbytes):
            self.main.allreduce_mean(mean, ex.group)
        with self.lock:
            self.state = self.alg.combine(self.state, ex, mean)
        self.trace.add(
            rank=self.rank,
            step=st.step,
            phase="comm",
            start_s=t0,
            end_s=self.now(),
            kind=_ALLREDUCE,
            nbytes=nbytes,
        )

    def _on_server(self, ex: ServerExchange, st: _Step) -> None:
        """Post: push to the parameter server and ``combine`` its reply; the step's staleness is
        then the server's."""
        t0 = self.now()
        self._sleep_jitter()
        with self.lock:
            message = self.alg.server_message(self.state).contiguous()
        nbytes = wire_bytes(ex, self.n_params, self.itemsize)[0]
        with self.flight.wait("server", what="push and pull", step=st.step, peers=[self.alg.n_workers], nbytes=nbytes):
            reply, st.staleness = server_exchange(
                self.main, self.alg.n_workers, step=st.step, rank=self.rank, message=message
            )
        with self.lock:
            self.state = self.alg.combine(self.state, ex, reply)
        self.trace.add(
            rank=self.rank,
            step=st.step,
            phase="comm",
            start_s=t0,
            end_s=self.now(),
            kind=_SERVER,
            peer=SERVER_PEER,
            nbytes=nbytes,
        )

    def _on_barrier(self, ex: Barrier, st: _Step) -> None:
        t0 = self.now()
        with self.flight.wait("barrier", step=st.step, peers=ex.group):
            self.main.barrier(ex.group)
        self.trace.add(rank=self.rank, step=st.step, phase="comm", start_s=t0, end_s=self.now(), kind=_BARRIER)

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


#: the handler of each exchange kind, keyed by the class of its record (:mod:`psgdlab.core.exchange`);
#: :meth:`_Worker._run_phase` calls it in the phase the record names (``ex.phase``)
EXCHANGE_HANDLERS: dict[type, Callable[[_Worker, Any, _Step], None]] = {
    PairwiseAverage: _Worker._on_pairwise,
    Gossip: _Worker._on_gossip,
    AllReduce: _Worker._on_allreduce,
    ServerExchange: _Worker._on_server,
    Barrier: _Worker._on_barrier,
}


def _in_full(delta: torch.Tensor, lo: int, hi: int, like: torch.Tensor) -> torch.Tensor:
    """``delta`` of the slice ``[lo, hi)`` as a delta of the whole model ``like`` (zero elsewhere)."""
    if lo == 0 and hi == like.numel():
        return delta
    full = torch.zeros_like(like)
    full[lo:hi] = delta
    return full


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
        from psgdlab.core.trace import atomic_write_text

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
    continue`` it goes on over the members of ``survivors`` (:mod:`psgdlab.runtime.failures.survive.survivors`)."""
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
    previous = signal.getsignal(signal.SIGTERM)
    in_main = in_main_thread()

    def _on_term(signum: int, frame: Any) -> None:
        log.warning("rank %d: SIGTERM, checkpointing at the end of step %d", rank, worker.step + 1)
        worker.stop_requested = True

    if in_main:
        signal.signal(signal.SIGTERM, _on_term)
    try:
        return worker.run()
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
