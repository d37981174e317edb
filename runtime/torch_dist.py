"""The torch.distributed transport: gloo on CPUs, NCCL on GPUs.

Every channel gets its own process group per sub-group (``dist.new_group``, created in one
order on every rank), so the training thread and the communication threads never drive one
gloo group concurrently. Point-to-point messages use one shared group (``p2p``); with NCCL the
small control headers (and any-source receives, which NCCL lacks) go over a gloo group and the
payloads over NCCL, each on its own group (and so its own CUDA stream). On gloo, the payloads
between ranks of one host go through shared memory instead (:mod:`psgdlab.runtime.shm`; off
with ``PSGDLAB_SHM=0``).
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Sequence

import torch
import torch.distributed as dist

from psgdlab.runtime.transport import LaunchEnv, Transport

__all__ = ["TorchTransport", "open_torch_channels"]


class TorchTransport(Transport):
    """One channel on torch.distributed (see :mod:`psgdlab.runtime.transport`)."""

    def __init__(self, *, rank: int, world_size: int, device: torch.device, p2p: Any, ctrl: Any, world: Any,
                 groups: dict[tuple[int, ...], Any], backend: str) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self._p2p = p2p
        self._ctrl = ctrl
        self._world = world
        self._groups = groups
        self._backend = backend
        # NCCL reduces on the GPU; gloo's reductions and socket copies need the CPU cores the
        # backward pass runs on (measured slower overlapped on 2 cores: bench_ssgd_ddp.py)
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
        group = self._p2p_group(send)
        reqs = [dist.isend(send, dst=peer, group=group, tag=tag), dist.irecv(recv, src=peer, group=group, tag=tag)]
        for req in reqs:
            req.wait()

    def multi_exchange(self, send: torch.Tensor, recvs: Sequence[torch.Tensor], peers: Sequence[int],
                       tag: int) -> None:
        group = self._p2p_group(send)
        reqs = [dist.isend(send, dst=p, group=group, tag=tag) for p in peers]
        reqs += [dist.irecv(buf, src=p, group=group, tag=tag) for buf, p in zip(recvs, peers)]
        for req in reqs:
            req.wait()

    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        out: list[Any] | None = [None] * self.world_size if self.rank == root else None
        dist.gather_object(obj, out, dst=root, group=self._ctrl)
        return out


class _Done:
    """The handle of an allreduce over one rank (nothing to wait for)."""

    def wait(self) -> bool:
        return True


def open_torch_channels(backend: str, *, env: LaunchEnv, groups: Sequence[tuple[int, ...]], timeout_s: float,
                        device: torch.device | None, master: tuple[str, int] | None) -> dict[str, Transport]:
    """Initialise the default process group and build the three channels."""
    if master is not None:
        os.environ.setdefault("MASTER_ADDR", master[0])
        os.environ.setdefault("MASTER_PORT", str(master[1]))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    timeout = datetime.timedelta(seconds=timeout_s)
    if device is None:
        device = torch.device("cuda", env.local_rank % max(torch.cuda.device_count(), 1)) \
            if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size, timeout=timeout,
                                **({"device_id": device} if backend == "nccl" else {}))
    world_ranks = list(range(env.world_size))
    # control (headers, any-source receives, objects): always gloo; payload p2p: the backend
    ctrl = dist.new_group(world_ranks, timeout=timeout, backend="gloo")
    p2p = dist.new_group(world_ranks, timeout=timeout, backend=backend) if backend == "nccl" else ctrl
    plane = None
    if backend == "gloo" and device.type == "cpu":
        from psgdlab.runtime.shm import open_plane

        plane = open_plane(ctrl, rank=env.rank, world_size=env.world_size, groups=groups, timeout_s=timeout_s)
    unique = sorted({tuple(g) for g in groups if 1 < len(g) < env.world_size})
    channels: dict[str, Transport] = {}
    for index, name in enumerate(("main", "comm", "responder")):
        world = dist.group.WORLD if name == "main" else dist.new_group(world_ranks, timeout=timeout, backend=backend)
        subgroups = {}
        for g in unique:
            pg = dist.new_group(list(g), timeout=timeout, backend=backend)
            if env.rank in g:
                subgroups[g] = pg
        kw = dict(rank=env.rank, world_size=env.world_size, device=device, p2p=p2p, ctrl=ctrl, world=world,
                  groups=subgroups, backend=backend)
        if plane is None:
            channels[name] = TorchTransport(**kw)
        else:
            from psgdlab.runtime.shm_transport import SharedMemoryTransport

            channels[name] = SharedMemoryTransport(plane=plane, channel=index, **kw)
    return channels
