"""The mpi4py transport (thread level ``MULTIPLE``; CPU tensors go through the buffer protocol).

Each channel owns duplicates of ``COMM_WORLD`` and of every sub-group communicator, created
collectively in one order on every rank by :func:`psgdlab.runtime.transports.channels.open_channels`; the
point-to-point communicator is shared by the ``comm`` and ``responder`` channels (MPI matches by
source and tag, and ``MULTIPLE`` makes concurrent calls safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from psgdlab.core.errors import ConfigError, TransportError
from psgdlab.runtime.transports.transport import Transport

__all__ = ["MPITransport", "mpi_module"]


def mpi_module() -> Any:
    """``mpi4py.MPI``, imported on first use with thread level ``MULTIPLE`` requested.

    Raises
    ------
    ConfigError
        mpi4py is missing, or finds no MPI library (neither the ``mpich`` wheel's in this
        environment nor a system MPI's where the dynamic loader looks).
    """
    try:
        import mpi4py

        mpi4py.rc.thread_level = "multiple"
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:  # mpi4py's wheel raises RuntimeError without a libmpi
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"backend ('mpi') needs mpi4py and an MPI library ({first}): load your cluster's MPI (its library "
            "where the dynamic loader finds it), or install MPICH from pip: pip install 'psgdlab[mpich]'"
        ) from None
    return MPI


def _buf(t: torch.Tensor) -> np.ndarray:
    if t.is_cuda:
        raise TransportError("the mpi transport moves CPU tensors only; use --backend nccl on GPUs")
    return t.detach().numpy()


class MPITransport(Transport):
    """One channel on MPI (see :mod:`psgdlab.runtime.transports.transport`)."""

    #: MPICH (and Open MPI) reduce large messages by recursive halving then doubling (Rabenseifner)
    allreduce_algorithm = "halving-doubling"

    def __init__(self, *, MPI: Any, world: Any, p2p: Any, groups: dict[tuple[int, ...], Any]) -> None:
        self._MPI = MPI
        self._world = world
        self._p2p = p2p
        self._groups = groups
        self.rank = world.Get_rank()
        self.world_size = world.Get_size()
        self.device = torch.device("cpu")

    def allreduce_sum(self, tensor: torch.Tensor, group: Sequence[int]) -> None:
        if len(group) <= 1:
            return
        self._group_handle(group).Allreduce(self._MPI.IN_PLACE, _buf(tensor), op=self._MPI.SUM)

    def allgather(self, shard: torch.Tensor, sizes: Sequence[int], group: Sequence[int]) -> torch.Tensor:
        if len(group) <= 1:
            return shard.clone()
        out = torch.empty(int(sum(sizes)), dtype=shard.dtype)
        counts = [int(s) for s in sizes]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        self._group_handle(group).Allgatherv(_buf(shard.contiguous()), [_buf(out), counts, displs, None])
        return out

    def broadcast(self, tensor: torch.Tensor, src: int, group: Sequence[int]) -> None:
        if len(group) <= 1:
            return
        self._group_handle(group).Bcast(_buf(tensor), root=list(group).index(src))

    def barrier(self, group: Sequence[int] | None = None) -> None:
        comm = self._world if group is None else self._group_handle(group)
        comm.Barrier()

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        self._p2p.Send(_buf(tensor), dest=dst, tag=tag)

    def recv(self, tensor: torch.Tensor, src: int | None, tag: int) -> int:
        status = self._MPI.Status()
        source = self._MPI.ANY_SOURCE if src is None else src
        self._p2p.Recv(_buf(tensor), source=source, tag=tag, status=status)
        return int(status.Get_source())

    def sendrecv(self, send: torch.Tensor, recv: torch.Tensor, peer: int, tag: int) -> None:
        self._p2p.Sendrecv(_buf(send), dest=peer, sendtag=tag, recvbuf=_buf(recv), source=peer, recvtag=tag)

    def multi_exchange(self, send: torch.Tensor, recvs: Sequence[torch.Tensor], peers: Sequence[int], tag: int) -> None:
        MPI = self._MPI
        # the receives first, as MPI_Sendrecv posts them: a peer's payload finds its buffer waiting
        reqs = [self._p2p.Irecv(_buf(b), source=p, tag=tag) for b, p in zip(recvs, peers)]
        reqs += [self._p2p.Isend(_buf(send), dest=p, tag=tag) for p in peers]
        MPI.Request.Waitall(reqs)

    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        return self._world.gather(obj, root=root)
