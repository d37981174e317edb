r"""The surviving protocol (``--on-failure continue``): the survivors of a gossip run go on.

It owns what :class:`~psgdlab.runtime.failures.survive.survivors.Survivors` gives a rank: the
membership every survivor agrees on, the mailbox of control messages and detection, the schedule
rebuilt over the survivors, and the groups the survivors form alone. Exchange by exchange:

- pairwise average, active side: ``("request", step, epoch)`` through the mailbox, the reply,
  then the payload while the peer is a member; a peer lost on the way is removed from the
  membership and the step's mix skipped (the model unchanged: the survivor loses no work);
- pairwise average, passive side: the responder answers requests until every living member has
  said it is done, refusing a requester that is no longer a member; a requester lost in the
  payload's exchange is removed and its merge dropped;
- gossip: one pairwise exchange per peer in increasing rank order on every member, so that a
  peer lost in its exchange costs only its own edge (its weight goes to this rank);
- gradient allreduce (an H-ADPSGD node): a member lost on the way is removed and the step's sum
  made again over the survivors, from this rank's own contribution. A node of several members
  sums its members' slice deltas with the gradient (:meth:`SurvivingProtocol.share`: each member
  holds the slices it averaged, so the node's sum is every slice, applied alike on every member),
  and a check that every member is at the same step.

Payload exchanges run on a thread the rank leaves once the peer is given up
(:meth:`SurvivingProtocol._unless_lost`): gloo cannot interrupt a transfer to a stopped process.
A stop (SIGINT, SIGTERM) is agreed through the mailbox (``("stop", step)``,
:mod:`~psgdlab.runtime.loop.exchange.stopping`); a member's ``done`` stands for its announcement.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.errors import TransportError
from psgdlab.core.exchange import AllReduce, Gossip, PairwiseAverage
from psgdlab.core.graphs.membership import without_peers
from psgdlab.core.platform.failure import STEP_CHECK_ELEMENTS, sums_node_slices
from psgdlab.runtime.failures.survive.survivors import Survivors
from psgdlab.runtime.loop.exchange.protocol import ALLREDUCE, GOSSIP, PAIR, ExchangeProtocol, Mixed, Step, in_full
from psgdlab.runtime.loop.exchange.stopping import StopAgreement
from psgdlab.runtime.loop.scan import shard_bounds
from psgdlab.runtime.transports.transport import Tags

__all__ = ["SurvivingProtocol", "step_mark_period"]


def step_mark_period(dtype: torch.dtype, members: int) -> int:
    """The period of the step check of a node's sum in messages of ``dtype`` over up to
    ``members`` members: the largest power of two ``p <= 1024`` such that the marks ``step mod p``
    and their squares sum exactly (0: none does, no check).

    >>> step_mark_period(torch.float64, 16), step_mark_period(torch.float32, 16), step_mark_period(torch.float16, 2)
    (1024, 1024, 32)
    """
    if not dtype.is_floating_point:
        return 0
    exact = 2.0 / torch.finfo(dtype).eps  # every integer up to this is exact
    p = 1024
    while p > 1 and members * (p - 1) ** 2 >= exact:
        p //= 2
    return p if p > 1 else 0


class SurvivingProtocol(ExchangeProtocol):
    """The survivors' exchanges (module docstring).

    Parameters
    ----------
    algorithm : Algorithm
        A gossip algorithm.
    survivors : Survivors
        This rank's membership, mailbox and groups of survivors.
    **kw
        As :class:`~psgdlab.runtime.loop.exchange.protocol.ExchangeProtocol`.
    """

    def __init__(self, algorithm: Algorithm, *, survivors: Survivors, **kw: Any) -> None:
        super().__init__(algorithm, **kw)
        self.survivors = survivors
        self.mailbox = survivors.mailbox
        #: in a node of several members, this rank sums its slice deltas with the node's gradient
        #: instead of allgathering them over groups made at start-up
        self.node_shares = sums_node_slices(algorithm, "continue", self.rank, self.start_step)
        self._agreement = StopAgreement(
            rank=self.rank,
            start_step=self.start_step,
            announce=lambda step: self.mailbox.broadcast(range(algorithm.n_workers), ("stop", step)),
            members=self._living,
            finished=self._finished,
            flight=self.flight,
        )
        self.mailbox.listen_stops(self._agreement.heard)

    def _living(self) -> set[int]:
        return set(self.survivors.epoch().alive) - self.mailbox.lost

    def _finished(self) -> Mapping[int, int]:
        return {p: self.mailbox.steps.get(p, 0) for p in set(self.mailbox.done)}

    # --- what the loop asks ---
    def exchanges(self, step: int) -> tuple:
        self.step = step
        return self.survivors.exchanges(step)

    def agree_stop(self, step: int, requested: bool) -> bool:
        return self._agreement.after(step, requested)

    def finish(self, stopped_at: int | None) -> None:
        if stopped_at is None:
            self._agreement.end(self.steps - 1)  # its done, below, stands for its announcement
        self.survivors.finish_steps()
        self._wait_responder()

    def share(self, st: Step) -> None:
        if self.node_shares:  # the node sums its members' slice deltas with the gradient
            held = self.replica.take_held()
            st.shared, st.merged, st.deltas = st.deltas + held, len(st.deltas) + len(held), []

    def merges(self, st: Step) -> tuple[list[torch.Tensor], int]:
        if st.shared is not None:  # the node's sum (a node of one: this rank's own)
            return st.shared, st.merged
        return st.deltas, len(st.deltas)

    # --- communication thread ---
    def pairwise(self, ex: PairwiseAverage, sent_full: torch.Tensor, step: int) -> Mixed:
        """Request, wait for the reply while the peer is a member, then move the payload; a peer
        lost on the way: ``(None, rows)``, the step's mix skipped."""
        members = self.survivors
        t0 = self.now()
        self._sleep_jitter()
        peer, mailbox = ex.peer, self.mailbox
        nbytes = self.nbytes(ex)
        rows = [dict(phase="overlap", start_s=t0, end_s=t0, kind=PAIR, peer=peer, nbytes=nbytes)]
        epoch = members.epoch().epoch
        lo, hi = shard_bounds(self.n_params, ex.n_shards)[ex.shard]
        sent = sent_full[lo:hi].contiguous()
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
            reply = self._reply(peer)
            if reply is None:
                return None, rows
            if reply[0] != "reply" or not reply[2]:
                members.epoch()  # refused: this rank was given up (Removed), or the peer is gone
                return None, rows
            try:
                received = self.wire.sendrecv(
                    self.comm, sent, peer, Tags.PAIR_PAYLOAD, via=lambda op: self._unless_lost(op, peer)
                )
            except RuntimeError as exc:  # TransportError included: the peer died in the exchange
                members.remove(peer, f"rank {peer} failed in a pairwise exchange at step {step}: {exc}")
                return None, rows
        members.shared(peer, int(reply[1]))
        delta = self.alg.mix(ex, sent, received) - sent
        rows[0]["end_s"] = self.now()
        return in_full(delta, lo, hi, sent_full), rows

    def _reply(self, peer: int) -> tuple | None:
        """The peer's reply to this rank's request (None: the peer was lost meanwhile)."""
        while True:
            try:
                return self.mailbox.replies[peer].get(timeout=0.1)
            except queue.Empty:
                if not self.survivors.alive(peer):
                    return None

    def gossip(self, ex: Gossip, sent: torch.Tensor, step: int) -> Mixed:
        """One pairwise exchange per peer, in increasing rank order on every member (the edges in
        one global order: the lowest edge not yet done always has both ends at it, so the order
        cannot deadlock); a peer lost in its exchange costs only its own edge: its weight goes to
        this rank (:func:`~psgdlab.core.graphs.membership.without_peers`)."""
        members = self.survivors
        t0 = self.now()
        self._sleep_jitter()
        lost: list[int] = []
        received: dict[int, torch.Tensor] = {}
        nbytes = self.nbytes(ex)
        for peer in sorted(ex.peers):
            try:
                with self.flight.wait(
                    "gossip",
                    step=step,
                    peers=[peer],
                    nbytes=nbytes // max(1, len(ex.peers)),
                    tag=Tags.GOSSIP,
                    deadline_s=2 * self.flight.deadline_s,
                ):
                    received[peer] = self.wire.sendrecv(self.comm, sent, peer, Tags.GOSSIP)
                members.shared(peer, step)  # a blocking gossip's neighbours exchange at the same step
            except RuntimeError as exc:  # TransportError included: the peer died or was given up
                members.remove(peer, f"rank {peer} failed in a gossip exchange at step {step}: {exc}")
                lost.append(peer)
        mixing = without_peers(ex, lost) if lost else ex
        delta = self.alg.mix(mixing, sent, [received[p] for p in mixing.peers]) - sent
        return delta, [dict(phase="overlap", start_s=t0, end_s=self.now(), kind=GOSSIP, peer=-1, nbytes=nbytes)]

    def _unless_lost(self, exchange: Callable[[], None], *peers: int) -> None:
        """Run a payload ``exchange`` with ``peers`` on a thread of its own, and give up waiting for
        it (:class:`TransportError`) once one of them is given up: gloo cannot interrupt a transfer
        to a stopped process or a host cut off before its own timeout (at least the set-up's
        60 s), so the transfer is left to end by it, unread. (The shared-memory plane ends its own
        waits on a given-up peer.)"""
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
            lost = [p for p in others if not self.survivors.alive(p)]
            if lost:
                raise TransportError(f"rank {self.rank}: rank {lost[0]} was given up during a payload exchange")
        if outcome:
            raise outcome[0]

    # --- responder thread ---
    def _serves(self) -> bool:
        return True  # any member may come to ask

    def _serve(self) -> None:
        """Answer requests until every living member has said it is done."""
        members, mailbox = self.survivors, self.mailbox
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
            if mailbox.send(src, ("reply", self.step, ok, current.epoch)) and ok:
                self._answer(src, step, sliced)

    def _answer(self, src: int, step: int, sliced: list) -> None:
        """The payload of ``src``'s request (of its step ``step``) and the merge."""
        t0 = self.now()
        shard, n_shards, weight = sliced if sliced else (0, 1, 0.5)
        # the requester's view of the two nodes' sizes: its node weighs 1 - its weight here
        ex = PairwiseAverage(peer=src, active=False, shard=shard, n_shards=n_shards, weight=1.0 - weight)
        nbytes = self.nbytes(ex)
        lo, hi = shard_bounds(self.n_params, n_shards)[shard]
        with self.replica.lock:
            full = self.replica.state.params
            sent = full[lo:hi].clone()
        try:
            with self.flight.wait(
                "pairwise", what="passive", step=step, peers=[src], nbytes=nbytes, deadline_s=2 * self.flight.deadline_s
            ):
                received = self.wire.sendrecv(
                    self.resp, sent, src, Tags.PAIR_PAYLOAD, via=lambda op: self._unless_lost(op, src)
                )
        except RuntimeError as exc:
            self.survivors.remove(src, f"rank {src} failed in a pairwise exchange at its step {step}: {exc}")
            return
        self.survivors.shared(src, step)
        delta = in_full(self.alg.mix(ex, sent, received) - sent, lo, hi, full)
        self._merge_passive(delta, src=src, t0=t0, nbytes=nbytes, hold=self.node_shares)

    # --- training thread: the node's sum ---
    def gradient_allreduce(self, ex: AllReduce, st: Step) -> None:
        """A member of the group lost on the way is removed and the step's sum made again over
        the survivors, from this rank's own contribution (no survivor's gradient or merge is
        lost; the dead one's are).

        One payload goes round: the gradient, then -- in a node whose pairwise exchanges move
        slices (:attr:`node_shares`) -- the sum of this rank's slice deltas (``st.shared``), then a
        check that every member is at the same step (``step mod p`` and its square, with the
        period ``p`` whose sums are exact in the messages' dtype: :func:`step_mark_period`). A
        group made at start-up runs on the main channel (shared memory on one host), a group of
        survivors on :attr:`Survivors.groups <psgdlab.runtime.failures.survive.survivors.Survivors.groups>`."""
        s, n = st.step, st.grad.numel()
        shared = st.shared
        size = n + (self.n_params if shared is not None else 0) + STEP_CHECK_ELEMENTS
        period = step_mark_period(self.wire.message_dtype(st.grad.dtype), len(ex.group))
        mark = float(s % period) if period else 0.0

        def contribution() -> torch.Tensor:
            """This rank's payload, written in place (made again for each try of the sum)."""
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

        nbytes = self.nbytes(ex, size)
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
        if period and (marks != k * mark or squares != k * mark * mark):
            raise TransportError(
                f"rank {self.rank}: the members {list(group)} summed gradients of different steps (this rank's "
                f"is step {s}): one finished the allreduce a member died in, another did not"
            )
        st.grad = total[:n].view_as(st.grad)
        if shared is not None:
            st.shared = [total[n : n + self.n_params]]
        st.scale = 1.0 / k
        self.trace.add(
            rank=self.rank, step=s, phase="comm", start_s=t0, end_s=self.now(), kind=ALLREDUCE, nbytes=nbytes
        )

    def _reduce_over_survivors(
        self, contribution: Callable[[], torch.Tensor], group: tuple[int, ...], step: int
    ) -> tuple[torch.Tensor, tuple[int, ...]]:
        """The sum of this rank's ``contribution()`` over ``group``, or over its survivors once
        members die (each try sums a payload made afresh: a failed allreduce may have written into
        its own, and a transfer left to gloo's timeout may still write); returns the sum and the
        group it was made over."""
        groups = self.survivors.groups
        while len(group) > 1:
            work = contribution()
            reduce = self.main.allreduce_sum if self.main.has_group(group) else groups.allreduce_sum
            try:
                total = self.wire.allreduce_sum(
                    reduce,
                    work,
                    group,
                    via=lambda op, g=group: self._unless_lost(op, *g),  # type: ignore[misc]
                )
                return total, group
            except RuntimeError as exc:  # TransportError included: a member died or was given up
                group = self._regroup(group, step, exc)
        return contribution(), group

    def _regroup(self, group: tuple[int, ...], step: int, exc: BaseException) -> tuple[int, ...]:
        """After ``group``'s allreduce failed: wait (up to the deadline) until the membership names
        a member of it dead, agree on that, and return the group of the step rebuilt over the
        survivors (:func:`~psgdlab.core.graphs.membership.survivor_exchanges`; this rank alone when one
        is left). Every member ends at the same group: a membership only shrinks, and a member
        still on an older group cannot finish a collective without those already on the new."""
        members = self.survivors
        end = time.monotonic() + min(self.flight.deadline_s, 2 * self.mailbox.deadline_s)
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
