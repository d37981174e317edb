r"""The normal protocol: every rank runs to the end, and a failure stops the run.

Exchanges run over the groups made at start-up (:func:`psgdlab.runtime.transports.channels.open_channels`):

- pairwise average, active side (communication thread): a header ``[step, rank, shard,
  n_shards]`` to the peer's responder, then one exchange of the payload; a sharded (H-ADPSGD)
  exchange allgathers the averaged *differences* ``mixed - sent`` of the node's members after it;
- pairwise average, passive side (responder thread): it answers, one at a time, the requests the
  schedule gives this rank (:func:`~psgdlab.runtime.loop.scan.count_passive`); a node whose
  members answer slices of a request has its first member take the header and broadcast the
  active node to the others, and holds the allgathered result until the node agrees to apply it
  (:meth:`NormalProtocol.merges`: a tiny allgather each step, recorded as a barrier, so the
  replicas of a node apply the same merges at the same point and stay bit-identical);
- gossip: one multi-peer exchange;
- gradient allreduce: a *sum* (its ``1/n`` is folded into the update), or the buckets of an
  allreduce overlapped with the backward pass (:mod:`psgdlab.runtime.loop.overlap`);
- model allreduce, server exchange, barrier: :class:`~psgdlab.runtime.loop.exchange.protocol.ExchangeProtocol`'s.

Stopping on SIGINT or SIGTERM: synchronous ranks check together every :data:`STOP_CHECK_EVERY`
steps (an allreduce of one flag); asynchronous ones with a run directory agree on the final step
through it (:mod:`~psgdlab.runtime.loop.exchange.stopping`); without a run directory there is no
checkpoint to agree on, and a rank leaves at its own step (:class:`~psgdlab.runtime.loop.exchange.protocol.Preempted`).
A run stopped before its last step tells each responder, and the parameter server, that no
requests of the steps from the final one on will come (:func:`~psgdlab.runtime.loop.server.end_requests`):
each rank tells the next rank's responder (the first member's, for a node), rank 0 the server,
and only where the schedule still held requests for them.
"""

from __future__ import annotations

from typing import Any

import torch

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.exchange import AllReduce, Gossip, PairwiseAverage
from psgdlab.runtime.loop.exchange.protocol import (
    ALLREDUCE,
    BARRIER,
    GOSSIP,
    PAIR,
    ExchangeProtocol,
    Mixed,
    Preempted,
    Step,
)
from psgdlab.runtime.loop.exchange.stopping import BoardWatch, FileBoard, StopAgreement
from psgdlab.runtime.loop.scan import count_passive, count_server_requests, first_passive, shard_bounds
from psgdlab.runtime.loop.server import END_OF_REQUESTS, end_requests
from psgdlab.runtime.transports.transport import Tags

__all__ = ["NormalProtocol", "STOP_CHECK_EVERY", "ANSWER_S"]

#: synchronous ranks agree on a stop (a tiny allreduce) every this many steps
STOP_CHECK_EVERY = 10
#: how long an asynchronous rank that announced a stop waits for every other's announcement: a
#: living rank's watch answers within a poll, a dead one never (nothing here removes it: under
#: ``--on-failure restart`` the agent stops the survivors of a death with the same SIGTERM)
ANSWER_S = 10.0


class NormalProtocol(ExchangeProtocol):
    """Every rank to the end (module docstring); parameters are those of
    :class:`~psgdlab.runtime.loop.exchange.protocol.ExchangeProtocol`."""

    can_overlap_gradient = True

    def __init__(self, algorithm: Algorithm, **kw: Any) -> None:
        super().__init__(algorithm, **kw)
        self.n_passive, example = count_passive(algorithm, self.rank, self.start_step, self.steps)
        #: the members of this rank's node when they answer slices of requests together
        self.node = tuple(example.gather_group) if example is not None and example.n_shards > 1 else ()
        self._reducer: Any = None
        self._collective_stop = not algorithm.asynchronous and algorithm.n_workers > 1
        self._agreement: StopAgreement | None = None
        self._watch: BoardWatch | None = None
        if algorithm.asynchronous and self.run_dir is not None:
            self._board = FileBoard(self.run_dir, self.rank)
            self._agreement = StopAgreement(
                rank=self.rank,
                start_step=self.start_step,
                announce=lambda step: self._board.post("stop", step),
                members=lambda: range(algorithm.n_workers),
                finished=lambda: self._watch.ended if self._watch is not None else {},
                flight=self.flight,
                answer_s=ANSWER_S,
            )
            self._watch = BoardWatch(self._board, self._agreement)

    # --- what the loop asks ---
    def exchanges(self, step: int) -> tuple:
        self.step = step
        return self.alg.exchanges(step, self.rank)

    def open(self) -> None:
        super().open()
        if self._watch is not None:
            self._watch.start()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()

    def use_reducer(self, reducer: Any) -> None:
        self._reducer = reducer

    def agree_stop(self, step: int, requested: bool) -> bool:
        if self._collective_stop:
            if (step + 1) % STOP_CHECK_EVERY and step + 1 != self.steps:
                return False
            flag = torch.tensor([1.0 if requested else 0.0], device=self.device)
            with self.flight.wait("allreduce", what="stop check", step=step, peers=self.alg.all_ranks):
                self.main.allreduce_mean(flag, self.alg.all_ranks)
            return bool(flag.item() > 0)
        if self._agreement is not None:
            return self._agreement.after(step, requested)
        return requested

    def finish(self, stopped_at: int | None) -> None:
        agreed = self._collective_stop or self._agreement is not None or not self.alg.asynchronous
        if stopped_at is None:
            if self._agreement is not None and self._agreement.end(self.steps - 1):
                self._board.post("end", self.steps - 1)  # stands for its announcement
        elif not agreed:  # partners may be waiting for this rank: leave at once, the launcher stops the rest
            raise Preempted(
                f"stopped at step {stopped_at} by a signal: without a run directory the ranks of an "
                "asynchronous run cannot agree on a final step, so each leaves at its own"
            )
        elif stopped_at < self.steps:
            self._end_requests(stopped_at)
        self.close()
        self._wait_responder()

    def _end_requests(self, stop_step: int) -> None:
        """Tell the next rank's responder (a node's first member) and, from rank 0, the server that
        no requests of the steps from ``stop_step`` on will come, where they still expected some."""
        alg, start = self.alg, self.start_step
        peer = (self.rank + 1) % alg.n_workers
        example = first_passive(alg, peer, start, self.steps) if peer != self.rank else None
        listens = example is not None and (example.n_shards == 1 or example.gather_group[0] == peer)
        if listens and count_passive(alg, peer, start, stop_step)[0] < count_passive(alg, peer, start, self.steps)[0]:
            with self.flight.wait("pairwise", what="end of requests", step=stop_step, peers=[peer]):
                end_requests(self.main, peer, stop_step=stop_step, tag=Tags.PAIR_HEADER)
        if alg.has_server and self.rank == 0:
            if count_server_requests(alg, start, stop_step) < count_server_requests(alg, start, self.steps):
                with self.flight.wait("server", what="end of requests", step=stop_step, peers=[alg.n_workers]):
                    end_requests(self.main, alg.n_workers, stop_step=stop_step, tag=Tags.SERVER_HEADER)

    # --- communication thread ---
    def pairwise(self, ex: PairwiseAverage, sent_full: torch.Tensor, step: int) -> Mixed:
        t0 = self.now()
        self._sleep_jitter()
        lo, hi = shard_bounds(self.n_params, ex.n_shards)[ex.shard]
        sent = sent_full[lo:hi].contiguous()
        header = torch.tensor([step, self.rank, ex.shard, ex.n_shards], dtype=torch.int64)
        nbytes = self.nbytes(ex)
        with self.flight.wait("pairwise", what="active", step=step, peers=[ex.peer], nbytes=nbytes):
            self.comm.send(header, ex.peer, Tags.PAIR_HEADER)
            received = self.wire.sendrecv(self.comm, sent, ex.peer, Tags.PAIR_PAYLOAD)
        delta = self.alg.mix(ex, sent, received) - sent
        if ex.n_shards > 1:
            sizes = [b - a for a, b in shard_bounds(self.n_params, ex.n_shards)]
            with self.flight.wait("allgather", what="shards", step=step, peers=ex.gather_group):
                delta = self.wire.allgather(self.comm, delta, sizes, ex.gather_group)
        return delta, [dict(phase="overlap", start_s=t0, end_s=self.now(), kind=PAIR, peer=ex.peer, nbytes=nbytes)]

    def gossip(self, ex: Gossip, sent: torch.Tensor, step: int) -> Mixed:
        t0 = self.now()
        self._sleep_jitter()
        nbytes = self.nbytes(ex)
        with self.flight.wait("gossip", step=step, peers=ex.peers, nbytes=nbytes, tag=Tags.GOSSIP):
            received = self.wire.multi_exchange(self.comm, sent, ex.peers, Tags.GOSSIP)
        delta = self.alg.mix(ex, sent, received) - sent
        return delta, [dict(phase="overlap", start_s=t0, end_s=self.now(), kind=GOSSIP, peer=-1, nbytes=nbytes)]

    # --- training thread ---
    def gradient_allreduce(self, ex: AllReduce, st: Step) -> None:
        s, t_c1 = st.step, st.compute_end_s
        nbytes = self.nbytes(ex)
        reducer = self._reducer
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
                kind=ALLREDUCE,
                nbytes=nbytes,
            )
            if t_end > t_c1:
                self.trace.add(rank=self.rank, step=s, phase="comm", start_s=t_c1, end_s=t_end, kind=ALLREDUCE)
        else:
            if st.scale != 1.0:
                st.grad = st.grad * st.scale
            t0 = self.now()
            self._sleep_jitter()
            with self.flight.wait("allreduce", what="gradient", step=s, peers=ex.group, nbytes=nbytes):
                st.grad = self.wire.allreduce_sum(self.main.allreduce_sum, st.grad, ex.group)
            self.trace.add(
                rank=self.rank, step=s, phase="comm", start_s=t0, end_s=self.now(), kind=ALLREDUCE, nbytes=nbytes
            )
        st.scale = 1.0 / len(ex.group)

    def merges(self, st: Step) -> tuple[list[torch.Tensor], int]:
        """The step's mixes, after the node's held passive merges that every member has received
        (the agreement is a rendezvous of the node each step, recorded as a barrier: the
        simulator prices it so)."""
        if not self.node:
            return st.deltas, len(st.deltas)
        have = self.replica.held_count()
        t0 = self.now()
        with self.flight.wait("barrier", what="passive merges", step=st.step, peers=self.node):
            counts = self.main.allgather(
                torch.tensor([have], dtype=torch.int64, device=self.device), [1] * len(self.node), self.node
            )
        self.trace.add(rank=self.rank, step=st.step, phase="comm", start_s=t0, end_s=self.now(), kind=BARRIER)
        held = self.replica.take_held(int(counts.min()))
        return held + st.deltas, len(held) + len(st.deltas)

    # --- responder thread ---
    def _serves(self) -> bool:
        return self.n_passive > 0

    def _serve(self) -> None:
        limit, served = self.n_passive, 0
        while served < limit:
            with self.flight.wait("pairwise", what="passive", step=None, peers=self.node) as rec:
                stop_step = self._serve_one(rec)
            if stop_step is None:
                served += 1
            else:  # a stopped run: only the requests of the steps before its final step come
                limit = count_passive(self.alg, self.rank, self.start_step, stop_step)[0]

    def _serve_one(self, rec: dict[str, Any]) -> int | None:
        """Wait for one pairwise request, answer it, merge (or hold) the result; ``rec`` is the
        flight record of the wait (its peer and step filled in once the header names them).
        Returns the final step when the message was the end of the requests instead."""
        header = torch.zeros(4, dtype=torch.int64)
        group = self.node
        if group:
            src = self._node_request(header)
            if src < 0:
                return -1 - src
        else:
            src = self.resp.recv(header, None, Tags.PAIR_HEADER)
            if int(header[0]) == END_OF_REQUESTS:
                return int(header[2])
        t0 = self.now()
        shard, n_shards = int(header[2]), int(header[3])
        ex = PairwiseAverage(
            peer=src, active=False, shard=shard, n_shards=n_shards, gather_group=group if n_shards > 1 else ()
        )
        nbytes = self.nbytes(ex)
        rec.update(peers=[src], step=int(header[0]), nbytes=nbytes)
        lo, hi = shard_bounds(self.n_params, n_shards)[shard]
        with self.replica.lock:
            sent = self.replica.state.params[lo:hi].clone()
        received = self.wire.sendrecv(self.resp, sent, src, Tags.PAIR_PAYLOAD)
        delta = self.alg.mix(ex, sent, received) - sent
        if n_shards > 1:
            sizes = [b - a for a, b in shard_bounds(self.n_params, n_shards)]
            delta = self.wire.allgather(self.resp, delta, sizes, group)
        self._merge_passive(delta, src=src, t0=t0, nbytes=nbytes, hold=n_shards > 1)
        return None

    def _node_request(self, header: torch.Tensor) -> int:
        """The next request to the node, into ``header``: the node's first member takes it from
        any rank and broadcasts the active node's base rank; each member then takes the header of
        its counterpart. Returns the requester, or ``-1 - T`` for the end of the requests of a run
        stopped at step ``T``."""
        group = self.node
        leader = group[0]
        decision = torch.zeros(1, dtype=torch.int64)
        src = -1
        if self.rank == leader:
            src = self.resp.recv(header, None, Tags.PAIR_HEADER)
            ended = int(header[0]) == END_OF_REQUESTS
            decision[0] = -1 - int(header[2]) if ended else src - int(header[2])  # base rank of the active node
        decision = decision.to(self.device)  # a collective: on the backend's device (NCCL: GPU)
        self.resp.broadcast(decision, leader, group)
        base = int(decision[0])
        if base < 0:
            return base
        if self.rank != leader:
            src = base + group.index(self.rank)
            self.resp.recv(header, src, Tags.PAIR_HEADER)
        return src
