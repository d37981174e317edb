"""The gloo channel whose pairwise exchanges and allreduces between co-located ranks go through
the shared-memory data plane; the protocol, and what stays on gloo, are in :mod:`psgdlab.runtime.transports.shm.shm`.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from psgdlab.core.errors import TransportError
from psgdlab.runtime.transports.shm.shm import SUM_DTYPES, SharedMemoryPlane
from psgdlab.runtime.transports.torch_dist import TorchTransport, post_exchange, wait_all
from psgdlab.runtime.transports.transport import CHANNELS

__all__ = ["SharedMemoryTransport"]


class SharedMemoryTransport(TorchTransport):
    """A gloo channel (:class:`TorchTransport`) with a shared-memory data plane.

    Parameters are those of :class:`TorchTransport`, plus ``plane``
    (:func:`~psgdlab.runtime.transports.shm.shm.open_plane`, shared by the process's channels) and
    ``channel`` (its index in :data:`~psgdlab.runtime.transports.transport.CHANNELS`).
    ``shm_ops`` counts the operations this channel moved through shared memory.
    """

    def __init__(self, *, plane: SharedMemoryPlane, channel: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.plane = plane
        self._channel = channel
        self.shm_ops = 0

    @property
    def allreduce_algorithm(self) -> str:  # type: ignore[override]  # a property over the base's attribute
        """``direct`` when the world's allreduces go through shared memory: every member reads its
        chunk from each other member, then the reduced chunks, three barriers whatever the group
        size (so the fixed cost does not grow with the group as a ring's does; docs/measurements.md);
        gloo's ring when some rank is on another host. (Tensors over a region in two-copy mode
        also take the ring.)"""
        return "direct" if tuple(range(self.world_size)) in self.plane.groups else "ring"

    # --- what goes through shared memory: decided from what both sides know ---
    def _fits(self, *tensors: torch.Tensor) -> bool:
        """CPU tensors that the data plane can move: any size with one copy (read in place, and
        allreduces in pieces of the region), at most a region with two."""
        return all(
            t.device.type == "cpu" and (self.plane.single_copy or t.nbytes <= self.plane.capacity_bytes)
            for t in tensors
        )

    def _shares(self, peer: int, *tensors: torch.Tensor) -> bool:
        return peer != self.rank and peer in self.plane.local and self._fits(*tensors)

    # --- pairwise ---
    def sendrecv(self, send: torch.Tensor, recv: torch.Tensor, peer: int, tag: int) -> None:
        if not self._shares(peer, send, recv):
            super().sendrecv(send, recv, peer, tag)
            return
        self._exchange(send, [recv], [peer], [True], tag)

    def multi_exchange(self, send: torch.Tensor, recvs: Sequence[torch.Tensor], peers: Sequence[int], tag: int) -> None:
        shared = [self._shares(p, send, buf) for p, buf in zip(peers, recvs)]
        if not any(shared) or len(set(peers)) < len(peers):  # one slot per reader: no repeated peer
            super().multi_exchange(send, recvs, peers, tag)
            return
        self._exchange(send, list(recvs), list(peers), shared, tag)

    def _exchange(
        self, send: torch.Tensor, recvs: list[torch.Tensor], peers: list[int], shared: list[bool], tag: int
    ) -> None:
        """Payloads to the other hosts' peers over gloo; posts, takes and acknowledgements with the others."""
        remote = [(p, buf) for p, buf, s in zip(peers, recvs, shared) if not s]
        reqs = post_exchange(send, [buf for _, buf in remote], [p for p, _ in remote], self._ctrl, tag)
        readers = [p for p, s in zip(peers, shared) if s]
        if self.plane.single_copy and not send.is_contiguous():  # read in place: alive until acknowledged
            send = send.contiguous()
        seqs = self._post(send, readers, tag)
        for p, buf, s in zip(peers, recvs, shared):
            if s:
                self._take(p, buf, tag)
        plane = self.plane
        for p, seq in zip(readers, seqs):
            plane.wait(p, plane.layout.ack(self.rank, self._channel), partial(operator.eq, seq), "exchange")
        wait_all(reqs)
        self.shm_ops += 1

    def _post(self, send: torch.Tensor, readers: list[int], tag: int) -> list[int]:
        """Offer ``send`` to ``readers``: its address (one copy), or a copy in this channel's region."""
        plane, c = self.plane, self._channel
        if plane.single_copy:
            address = send.data_ptr()
        else:
            region = plane.region(self.rank, c)
            region[: send.nbytes].view(send.dtype).view(send.shape).copy_(send)
            address = region.data_ptr()
        seqs = []
        with plane.lock:  # the post counters are shared by this process's channels
            for p in readers:
                seq = plane.posted[(c, p)] = plane.posted.get((c, p), 0) + 1
                plane.write_slot(plane.layout.slot(c, p), tag=tag, address=address, nbytes=send.nbytes, seq=seq)
                plane.publish(plane.layout.post(p), plane.cell(self.rank, plane.layout.post(p)) + 1)
                seqs.append(seq)
        return seqs

    def _take(self, peer: int, buf: torch.Tensor, tag: int) -> None:
        """Receive ``peer``'s first pending message with ``tag`` (any of its channels) into ``buf``."""
        plane, layout = self.plane, self.plane.layout
        while True:
            posted = plane.cell(peer, layout.post(self.rank))  # before the scan: no lost wake-up
            found = self._claim(peer, tag)
            if found is not None:
                break
            plane.wait(peer, layout.post(self.rank), partial(operator.ne, posted), "exchange")
        channel, seq, address, nbytes = found
        if nbytes != buf.nbytes:
            raise TransportError(
                f"rank {self.rank}: rank {peer} sent {nbytes} bytes with tag {tag}, the receive "
                f"buffer holds {buf.nbytes} (mismatched exchange)"
            )
        if plane.single_copy:
            target = buf if buf.is_contiguous() else torch.empty_like(buf, memory_format=torch.contiguous_format)
            plane.read(peer, target.data_ptr(), address, nbytes, "exchange")
            if target is not buf:
                buf.copy_(target)
        else:
            buf.copy_(plane.region(peer, channel)[:nbytes].view(buf.dtype).view(buf.shape))
        plane.publish(layout.ack(peer, channel), seq)

    def _claim(self, peer: int, tag: int) -> tuple[int, int, int, int] | None:
        plane = self.plane
        with plane.lock:  # this process's channels may wait on the same peer
            for c in range(len(CHANNELS)):
                slot = plane.layout.slot(c, self.rank)
                seq = plane.cell(peer, slot)
                if seq != plane.taken.get((peer, c), 0) and plane.cell(peer, slot + 1) == tag:
                    plane.taken[(peer, c)] = seq
                    return c, seq, plane.cell(peer, slot + 2), plane.cell(peer, slot + 3)
        return None

    # --- allreduce ---
    def allreduce_sum(self, tensor: torch.Tensor, group: Sequence[int]) -> None:
        if len(group) > 1:
            self._allreduce_or_gloo(tensor, group, mean=False)

    def allreduce_mean(self, tensor: torch.Tensor, group: Sequence[int]) -> None:
        if len(group) > 1:
            self._allreduce_or_gloo(tensor, group, mean=True)

    def _allreduce_or_gloo(self, tensor: torch.Tensor, group: Sequence[int], *, mean: bool) -> None:
        if self._reduces(tensor, group):
            self._allreduce(tensor, tuple(group), mean=mean)
        elif mean:
            super().allreduce_mean(tensor, group)
        else:
            super().allreduce_sum(tensor, group)

    def _reduces(self, tensor: torch.Tensor, group: Sequence[int]) -> bool:
        """Whether an allreduce of ``tensor`` over ``group`` goes through shared memory."""
        return tuple(group) in self.plane.groups and tensor.dtype in SUM_DTYPES and self._fits(tensor)

    def _allreduce(self, tensor: torch.Tensor, group: tuple[int, ...], *, mean: bool) -> None:
        work = tensor if tensor.is_contiguous() else tensor.contiguous()
        if self.plane.single_copy:
            # the scratch holds the other members' chunks of this rank's part: pieces that fit it
            flat, n = work.view(-1), len(group)
            piece = n * max(1, self.plane.capacity_bytes // ((n - 1) * flat.element_size()))
            for start in range(0, flat.numel(), piece):
                self._allreduce_one_copy(flat[start : start + piece], group, mean)
        else:
            self._allreduce_two_copies(work.view(-1), group, mean)
        if work is not tensor:
            tensor.copy_(work)
        self.shm_ops += 1

    def _allreduce_one_copy(self, flat: torch.Tensor, group: tuple[int, ...], mean: bool) -> None:
        """Member i sums chunk i of every member (read in place), then gathers the others' chunks."""
        plane, c, me = self.plane, self._channel, group.index(self.rank)
        where = plane.layout.address(c, plane.groups[group])
        plane.publish(where, flat.data_ptr())
        plane.barrier(c, group)
        item, bounds = flat.element_size(), _chunks(flat.numel(), len(group))
        lo, hi = bounds[me]
        scratch = plane.region(self.rank, c)[: (len(group) - 1) * (hi - lo) * item].view(flat.dtype)
        ops = []
        for j, peer in enumerate(group):
            if j == me:
                ops.append(flat[lo:hi])
                continue
            k = j if j < me else j - 1
            part = scratch[k * (hi - lo) : (k + 1) * (hi - lo)]
            plane.read(peer, part.data_ptr(), plane.cell(peer, where) + lo * item, part.nbytes, "allreduce")
            ops.append(part)
        _sum_in_order_(ops, me, flat[lo:hi])
        if mean:  # the same divide as the sum-then-divide of the base class, on this rank's chunk only
            flat[lo:hi].div_(len(group))
        plane.barrier(c, group)
        for j, peer in enumerate(group):
            if j != me:
                a, b = bounds[j]
                plane.read(peer, flat[a:b].data_ptr(), plane.cell(peer, where) + a * item, (b - a) * item, "allreduce")
        plane.barrier(c, group)  # no member returns while another still reads its tensor

    def _allreduce_two_copies(self, flat: torch.Tensor, group: tuple[int, ...], mean: bool) -> None:
        """Every member copies its tensor into its region, then sums all regions in group order."""
        plane, c, me = self.plane, self._channel, group.index(self.rank)
        plane.region(self.rank, c)[: flat.nbytes].view(flat.dtype).copy_(flat)
        plane.barrier(c, group)
        ops = [
            flat if j == me else plane.region(peer, c)[: flat.nbytes].view(flat.dtype) for j, peer in enumerate(group)
        ]
        _sum_in_order_(ops, me, flat)
        plane.barrier(c, group)  # every member is done reading the regions
        if mean:
            flat.div_(len(group))

    def allreduce_sum_async(self, tensor: torch.Tensor, group: Sequence[int]) -> Any:
        if tuple(group) in self.plane.groups:
            # one after another on a helper thread: the group's shared-memory and gloo allreduces
            # must start in one order on every rank
            return super(TorchTransport, self).allreduce_sum_async(tensor, group)
        return super().allreduce_sum_async(tensor, group)


def _chunks(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``range(n)``, the first ``n % parts`` one longer."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for j in range(parts):
        stop = start + base + (j < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def _sum_in_order_(ops: list[torch.Tensor], me: int, out: torch.Tensor) -> None:
    r"""``out <- ((ops[0] + ops[1]) + ops[2]) + ...``; ``ops[me]`` may be ``out`` itself (read
    before written only when ``me < 2``; callers pass another copy of it otherwise)."""
    if me < 2 or len(ops) == 2:
        torch.add(ops[0], ops[1], out=out)
        for op in ops[2:]:
            out.add_(op)
        return
    acc = ops[0].clone()
    for op in ops[1:]:
        acc.add_(op)
    out.copy_(acc)
