r"""The one small interface every runtime transport implements.

A :class:`Transport` is one *channel* of a process: the communicators one thread uses. The
driver opens several channels on the same processes
(:func:`psgdlab.runtime.transports.channels.open_channels`) so that no
communicator is shared by two threads for collectives -- gloo process groups are not safe to
drive from two threads at once, and collectives issued from two threads could interleave
differently on different ranks:

========== ====================================================================================
channel    used by
========== ====================================================================================
main       the training thread: gradient and model allreduces, barriers, the server exchange
comm       the communication thread: the active side of pairwise averages, gossip, and the
           allgather inside a node that follows a sharded (H-ADPSGD) exchange
responder  the thread that answers pairwise requests on the passive side (and its allgather)
========== ====================================================================================

Point-to-point traffic between an active ``comm`` thread and a passive ``responder`` travels on
one point-to-point communicator shared by both channels (matched by tag and source), which gloo
and MPI (thread level ``MULTIPLE``) both allow.

Operations (all blocking; tensors are flat, contiguous, on the transport's device):

- :meth:`Transport.allreduce_sum` over a group of ranks (in place) -- the driver's gradient
  allreduce, whose 1/n the consumer folds into the learning rate so no divide pass is made --
  and :meth:`Transport.allreduce_mean` (the sum, then one divide pass: model allreduces);
- :meth:`Transport.allgather` of equal or unequal shards over a group;
- :meth:`Transport.broadcast`, :meth:`Transport.barrier`;
- :meth:`Transport.send`, :meth:`Transport.recv` (``src=None``: any source, returns it) and
  :meth:`Transport.sendrecv` (pairwise exchange, both directions at once);
- :meth:`Transport.gather_object` (end of run: traces and results to rank 0).

Implementations: :mod:`psgdlab.runtime.transports.torch_dist` (torch.distributed, NCCL on GPUs
and gloo on CPUs; on gloo, the pairwise exchanges and allreduces of ranks on one host go through
the shared-memory data plane of :mod:`psgdlab.runtime.transports.shm.shm`) and
:mod:`psgdlab.runtime.transports.mpi` (mpi4py; tensors go through the buffer protocol). They
import this module and this module imports none of them; :mod:`psgdlab.runtime.transports.channels`
(the factory) imports them all. Where a process sits in the job (the launcher's environment) is
:mod:`psgdlab.runtime.transports.env`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["Transport", "Tags", "CHANNELS"]

#: the channels of a process (module docstring), in the order of their shared-memory regions and slots
CHANNELS = ("main", "comm", "responder")


class Tags:
    """Message tags of the point-to-point protocols (one namespace for every transport)."""

    PAIR_HEADER = 11
    PAIR_PAYLOAD = 12
    PAIR_REPLY = 13
    GOSSIP = 21
    SERVER_HEADER = 31
    SERVER_PAYLOAD = 32
    SERVER_REPLY = 33
    SERVER_REPLY_HEADER = 34


class Transport(ABC):
    """One channel of a process (see the module docstring)."""

    rank: int
    world_size: int
    device: torch.device
    #: True when :meth:`allreduce_sum_async` progresses without taking CPU time from the compute
    #: (NCCL on GPUs); then the driver overlaps the gradient allreduce with the backward pass
    async_progress: bool = False
    #: how the backend schedules an allreduce (:data:`psgdlab.core.exchange.ALLREDUCE_ALGORITHMS`),
    #: recorded in the run's trace metadata so that ``psgdlab calibrate`` fits the latency per round
    #: of the right schedule: gloo's and NCCL's ring by default
    allreduce_algorithm: str = "ring"
    _world: Any  # the backend's handle for all ranks
    _groups: dict[tuple[int, ...], Any]  # the backend's handles for the groups made at start-up
    _async_pool: ThreadPoolExecutor | None = None  # runs allreduce_sum_async's sums, made on first use

    def _made_handle(self, group: Sequence[int]) -> Any:
        """The backend handle of ``group`` if it was made at start-up (all ranks, or a declared
        group), else ``None``."""
        key = tuple(group)
        if len(key) == self.world_size and key == tuple(range(self.world_size)):
            return self._world
        return self._groups.get(key)

    def _group_handle(self, group: Sequence[int]) -> Any:
        """The backend handle of ``group`` (all ranks, or a group created at start-up)."""
        handle = self._made_handle(group)
        if handle is None:
            raise RuntimeError(f"rank {self.rank}: group {tuple(group)} was not created at start-up")
        return handle

    def has_group(self, group: Sequence[int]) -> bool:
        """Whether ``group``'s collectives were made at start-up (all ranks, or a declared group)."""
        return self._made_handle(group) is not None

    @abstractmethod
    def allreduce_sum(self, tensor: torch.Tensor, group: Sequence[int]) -> None:
        """Replace ``tensor`` by its sum over ``group`` (every member ends with the sum)."""

    def allreduce_mean(self, tensor: torch.Tensor, group: Sequence[int]) -> None:
        """Replace ``tensor`` by its mean over ``group``: :meth:`allreduce_sum`, then one divide pass
        (callers that can fold ``1/len(group)`` into a later step use the sum instead)."""
        if len(group) <= 1:
            return
        self.allreduce_sum(tensor, group)
        tensor.div_(len(group))

    def allreduce_sum_async(self, tensor: torch.Tensor, group: Sequence[int]) -> Any:
        """Start :meth:`allreduce_sum` without blocking; returns a handle whose ``wait()`` blocks
        until ``tensor`` holds the sum (and raises what the allreduce raised).

        Started allreduces complete in start order. Default: one helper thread per channel runs
        them one after another (used by MPI, whose non-blocking collectives progress only inside
        MPI calls); the torch transport uses its backend's asynchronous work instead. Nothing
        else may use the channel's collectives until every handle has been waited for.
        """
        pool = self._async_pool
        if pool is None:
            pool = self._async_pool = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"psgdlab-allreduce-{self.rank}"
            )
        future: Any = pool.submit(self.allreduce_sum, tensor, group)
        future.wait = future.result
        return future

    @abstractmethod
    def allgather(self, shard: torch.Tensor, sizes: Sequence[int], group: Sequence[int]) -> torch.Tensor:
        """Concatenate the shards of ``group`` in group order; ``sizes[i]`` is member i's length."""

    @abstractmethod
    def broadcast(self, tensor: torch.Tensor, src: int, group: Sequence[int]) -> None:
        """Copy ``src``'s ``tensor`` to every member of ``group``."""

    @abstractmethod
    def barrier(self, group: Sequence[int] | None = None) -> None:
        """Wait for every member of ``group`` (all ranks when None)."""

    @abstractmethod
    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        """Send ``tensor`` to ``dst`` (point-to-point communicator)."""

    @abstractmethod
    def recv(self, tensor: torch.Tensor, src: int | None, tag: int) -> int:
        """Receive into ``tensor`` from ``src`` (any source when None); returns the source."""

    @abstractmethod
    def sendrecv(self, send: torch.Tensor, recv: torch.Tensor, peer: int, tag: int) -> None:
        """Send ``send`` to ``peer`` and receive ``recv`` from it, both at once."""

    @abstractmethod
    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Pickle-gather ``obj`` of every rank to ``root`` (``None`` elsewhere)."""

    def multi_exchange(self, send: torch.Tensor, recvs: Sequence[torch.Tensor], peers: Sequence[int], tag: int) -> None:
        """Send ``send`` to every peer and receive one tensor from each (gossip); default:
        pairwise exchanges in peer order, safe because every peer runs the same order."""
        for buf, peer in sorted(zip(recvs, peers), key=lambda bp: bp[1]):
            self.sendrecv(send, buf, peer, tag)

    def close(self) -> None:
        """Release the channel's resources."""
        pool = self._async_pool
        if pool is not None:  # idle after a normal run; after a failure, do not wait for a dead peer
            pool.shutdown(wait=False, cancel_futures=True)
            self._async_pool = None
