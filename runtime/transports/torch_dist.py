"""The torch.distributed transport: gloo on CPUs, NCCL on GPUs.

Every channel gets its own process group per sub-group (``dist.new_group``, created in one
order on every rank by :func:`psgdlab.runtime.transports.channels.open_channels`), so the training thread
and the communication threads never drive one gloo group concurrently. Point-to-point messages
use one shared group (``p2p``); with NCCL the small control headers (and any-source receives,
which NCCL lacks) go over a gloo group and the payloads over NCCL, each on its own group (and so
its own CUDA stream). On gloo, the payloads between ranks of one host go through shared memory
instead (:mod:`psgdlab.runtime.transports.shm.shm`; off with ``PSGDLAB_SHM=0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from psgdlab.runtime.transports.transport import Transport

__all__ = ["TorchTransport", "post_exchange", "wait_all"]


class TorchTransport(Transport):
    """One channel on torch.distributed (see :mod:`psgdlab.runtime.transports.transport`)."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        p2p: Any,
        ctrl: Any,
        world: Any,
        groups: dict[tuple[int, ...], Any],
        backend: str,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self._p2p = p2p
        self._ctrl = ctrl
        self._world = world
        self._groups = groups
        self._backend = backend
        # NCCL reduces on the GPU; gloo's reductions and socket copies need the CPU cores the
        # backward pass runs on (docs/measurements.md: overlap on CPUs)
        self.async_progress = device.type == "cuda"

    def allreduce_sum(self, tensor: torch.Tensor, group: Sequence[int]) -> None:
        if len(group) <= 1:
            return
        dist.all_reduce(tensor, group=self._group_handle(group))

    def allreduce_sum_async(self, tensor: torch.Tensor, group: Sequence[int]) -> Any:
        if len(group) <= 1:
            return _Done()
        return dist.all_reduce(tensor, group=self._group_handle(group), async_op=True)

    def allgather(self, shard: torch.Tensor, sizes: Sequence[int], group: Sequence[int]) -> torch.Tensor:
        if len(group) <= 1:
            return shard.clone()
        width = max(sizes)
        padded = torch.zeros(width, dtype=shard.dtype, device=shard.device)
        padded[: shard.numel()] = shard
        parts = [torch.empty_like(padded) for _ in group]
        dist.all_gather(parts, padded, group=self._group_handle(group))
        return torch.cat([p[:n] for p, n in zip(parts, sizes)])

    def broadcast(self, tensor: torch.Tensor, src: int, group: Sequence[int]) -> None:
        if len(group) <= 1:
            return
        dist.broadcast(tensor, src=src, group=self._group_handle(group))

    def barrier(self, group: Sequence[int] | None = None) -> None:
        ranks = tuple(range(self.world_size)) if group is None else tuple(group)
        if len(ranks) <= 1:
            return
        token = torch.zeros(1, device=self.device)
        dist.all_reduce(token, group=self._group_handle(ranks))

    def _p2p_group(self, tensor: torch.Tensor) -> Any:
        return self._p2p if tensor.is_cuda else self._ctrl

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        dist.send(tensor, dst=dst, group=self._p2p_group(tensor), tag=tag)

    def recv(self, tensor: torch.Tensor, src: int | None, tag: int) -> int:
        return int(dist.recv(tensor, src=src, group=self._p2p_group(tensor), tag=tag))

    def sendrecv(self, send: torch.Tensor, recv: torch.Tensor, peer: int, tag: int) -> None:
        wait_all(post_exchange(send, [recv], [peer], self._p2p_group(send), tag))

    def multi_exchange(self, send: torch.Tensor, recvs: Sequence[torch.Tensor], peers: Sequence[int], tag: int) -> None:
        wait_all(post_exchange(send, recvs, peers, self._p2p_group(send), tag))

    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        out: list[Any] | None = [None] * self.world_size if self.rank == root else None
        dist.gather_object(obj, out, dst=root, group=self._ctrl)
        return out


def post_exchange(
    send: torch.Tensor, recvs: Sequence[torch.Tensor], peers: Sequence[int], group: Any, tag: int
) -> list[Any]:
    """Post ``send`` to every peer and a receive from each into ``recvs``; the requests.

    On gloo the receives go first. gloo's TCP pair sends a payload only once the peer has said
    that its receive is posted, and that word travels on the same byte stream as this rank's own
    payloads: posted after a send that the peer was already waiting for, it reaches the peer
    behind the whole payload, and the two directions of the exchange run one after the other
    instead of at once (``bench/bench_netns.py --pairwise``). NCCL keeps the sends first, its
    order before; it runs a pair's operations in order on one stream, and ungrouped it may hold
    a send that it cannot buffer until the peer's receive is posted (NVIDIA/nccl#479), which
    neither order avoids for large payloads: the grouped form is ``dist.batch_isend_irecv``.
    """
    sends = [partial(dist.isend, send, dst=p, group=group, tag=tag) for p in peers]
    receives = [partial(dist.irecv, buf, src=p, group=group, tag=tag) for buf, p in zip(recvs, peers)]
    order = [*sends, *receives] if send.is_cuda else [*receives, *sends]
    return [post() for post in order]


def wait_all(reqs: Sequence[Any]) -> None:
    """Wait for every request of :func:`post_exchange`."""
    for req in reqs:
        if req is not None:  # None only for a rank outside the group, which no caller is
            req.wait()


class _Done:
    """The handle of an allreduce over one rank (nothing to wait for)."""

    def wait(self) -> bool:
        return True
