"""Opening a process's channels: the one place that knows every transport implementation.

:func:`open_channels` initialises a backend and returns the ``main``, ``comm`` and ``responder``
channels of :mod:`psgdlab.runtime.transports.transport` (why there are three is said there). The interface
(:mod:`psgdlab.runtime.transports.transport`) imports none of its implementations; they import it, and this
module imports them all, so the arrows point one way::

    transport  <-  mpi, torch_dist  <-  shm_transport
        ^              ^                    ^
        +--------------+---- channels ------+

Per backend:

- ``mpi`` (:class:`~psgdlab.runtime.transports.mpi.MPITransport`): each channel duplicates ``COMM_WORLD``
  and creates every sub-group communicator, collectively in one order on every rank; the
  point-to-point communicator is shared by the channels (MPI matches by source and tag, and
  thread level ``MULTIPLE`` makes concurrent calls safe).
- ``gloo`` and ``nccl`` (:class:`~psgdlab.runtime.transports.torch_dist.TorchTransport`): each channel gets
  its own process group per sub-group (``dist.new_group``, in one order on every rank); control
  messages (headers, any-source receives, objects) go over one gloo group and the payloads over
  the backend's. On gloo with CPU tensors the ranks also open the shared-memory data plane
  (:func:`~psgdlab.runtime.transports.shm.shm.open_plane`); where it opens, every channel is a
  :class:`~psgdlab.runtime.transports.shm.shm_transport.SharedMemoryTransport`.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from psgdlab.core.errors import ConfigError, TransportError, require
from psgdlab.runtime.transports.backends import BACKENDS, check_backend, cpu_backends, either
from psgdlab.runtime.transports.env import STORE_FD_ENV, LaunchEnv
from psgdlab.runtime.transports.mpi import MPITransport, mpi_module
from psgdlab.runtime.transports.shm.shm import open_plane
from psgdlab.runtime.transports.shm.shm_transport import SharedMemoryTransport
from psgdlab.runtime.transports.torch_dist import TorchTransport
from psgdlab.runtime.transports.transport import CHANNELS, Transport

__all__ = ["open_channels", "rank_device"]


def open_channels(
    backend: str,
    *,
    env: LaunchEnv,
    groups: Sequence[tuple[int, ...]],
    timeout_s: float,
    device: torch.device | None = None,
    master: tuple[str, int] | None = None,
) -> dict[str, Transport]:
    """Initialise ``backend`` and open the ``main``, ``comm`` and ``responder`` channels.

    Parameters
    ----------
    backend : str
        A name of :data:`~psgdlab.runtime.transports.backends.BACKENDS`.
    env : LaunchEnv
        This process's place in the job.
    groups : sequence of tuple of int
        Every sub-group any collective will use (sorted rank tuples); each channel gets its own
        communicator for each, created collectively here in one order on every rank.
    timeout_s : float
        Collective and point-to-point timeout of the torch process groups; a peer that died
        makes the survivors fail within it instead of hanging.
    device : torch.device, optional
        The channels' device; default: :func:`rank_device`.
    master : (host, port), optional
        Rendezvous for torch.distributed when ``MASTER_ADDR``/``MASTER_PORT`` are not set. Ranks
        started by :func:`psgdlab.runtime.launcher.launch.launch` on one host find
        :data:`~psgdlab.runtime.transports.env.STORE_FD_ENV` set: rank 0 serves the store on the socket
        the launcher bound and handed it (:func:`~psgdlab.runtime.launcher.ranks.rendezvous_socket`).

    Raises
    ------
    ConfigError
        Unknown backend, or NCCL without CUDA.
    TransportError
        torch.distributed could not initialise, or MPI lacks ``MPI_THREAD_MULTIPLE`` or disagrees
        with the launcher on the world size.
    """
    if check_backend(backend).needs_cuda and not torch.cuda.is_available():
        raise ConfigError(
            f"backend ({backend!r}) needs CUDA, which this machine does not have; use {either(cpu_backends())}"
        )
    if backend == "mpi":
        return _open_mpi(env=env, groups=groups)
    try:
        return _open_torch(backend, env=env, groups=groups, timeout_s=timeout_s, device=device, master=master)
    except RuntimeError as exc:
        raise TransportError(f"rank {env.rank}: could not initialise {backend}: {exc}") from exc


def rank_device(backend: str, env: LaunchEnv) -> torch.device:
    """The device of a rank's payloads and workload: GPU ``local_rank`` on NCCL, else the CPU.

    NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"), so a local
    rank without a GPU of its own is an error here, before any rank initialises.

    Raises
    ------
    ConfigError
        NCCL and ``env.local_rank`` at or beyond this host's GPU count.
    """
    if not BACKENDS[backend].needs_cuda:
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    require(
        env.local_rank < gpus,
        "local rank",
        env.local_rank,
        f"of rank {env.rank} has no GPU of its own on this host, which has {gpus}; NCCL needs one GPU per rank",
        hint=f"start at most as many ranks per host as it has GPUs, or use {either(cpu_backends())}",
    )
    return torch.device("cuda", env.local_rank)


def _open_mpi(*, env: LaunchEnv, groups: Sequence[tuple[int, ...]]) -> dict[str, Transport]:
    """Duplicate ``COMM_WORLD`` per channel and create every sub-group communicator."""
    MPI = mpi_module()
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_MULTIPLE:
        raise TransportError(
            f"rank {env.rank}: MPI provides thread level {provided}, the runtime needs "
            f"MPI_THREAD_MULTIPLE ({MPI.THREAD_MULTIPLE})"
        )
    base = MPI.COMM_WORLD
    if base.Get_size() != env.world_size:
        library = MPI.Get_library_version().strip().splitlines()[0]
        raise TransportError(
            f"MPI world size ({base.Get_size()}) differs from the launcher's ({env.world_size}): mpi4py loaded "
            f"{library!r}; start the ranks with that MPI's mpiexec (psgdlab train --mpiexec PATH), or under srun "
            "with --mpi=pmi2 or pmix as that MPI was built"
        )
    p2p = base.Dup()
    unique = sorted({tuple(g) for g in groups if 1 < len(g) < base.Get_size()})
    channels: dict[str, Transport] = {}
    for name in CHANNELS:
        world = base.Dup()
        subgroups = {}
        for g in unique:
            comm = world.Create(world.Get_group().Incl(list(g)))
            if comm != MPI.COMM_NULL:
                subgroups[g] = comm
        channels[name] = MPITransport(MPI=MPI, world=world, p2p=p2p, groups=subgroups)
    return channels


def _open_torch(
    backend: str,
    *,
    env: LaunchEnv,
    groups: Sequence[tuple[int, ...]],
    timeout_s: float,
    device: torch.device | None,
    master: tuple[str, int] | None,
) -> dict[str, Transport]:
    """Initialise the default process group and build the three channels."""
    if master is not None:
        os.environ.setdefault("MASTER_ADDR", master[0])
        os.environ.setdefault("MASTER_PORT", str(master[1]))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    timeout = datetime.timedelta(seconds=timeout_s)
    if device is None:
        device = rank_device(backend, env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        store = None
        fd = os.environ.get(STORE_FD_ENV)
        if fd:  # a launcher's ranks: rank 0 serves the store on the socket it inherited, bound by the launcher
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                env.world_size,
                env.rank == 0,
                timeout,
                master_listen_fd=int(fd) if env.rank == 0 else None,
            )
        dist.init_process_group(
            backend=backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            device_id=device if backend == "nccl" else None,
            store=store,
        )
    world_ranks = list(range(env.world_size))
    # control (headers, any-source receives, objects): always gloo; payload p2p: the backend
    ctrl = dist.new_group(world_ranks, timeout=timeout, backend="gloo")
    p2p = dist.new_group(world_ranks, timeout=timeout, backend=backend) if backend == "nccl" else ctrl
    plane = None
    if backend == "gloo" and device.type == "cpu":
        plane = open_plane(ctrl, rank=env.rank, world_size=env.world_size, groups=groups, timeout_s=timeout_s)
    unique = sorted({tuple(g) for g in groups if 1 < len(g) < env.world_size})
    channels: dict[str, Transport] = {}
    for index, name in enumerate(CHANNELS):
        world = dist.group.WORLD if name == "main" else dist.new_group(world_ranks, timeout=timeout, backend=backend)
        subgroups = {}
        for g in unique:
            pg = dist.new_group(list(g), timeout=timeout, backend=backend)
            if env.rank in g:
                subgroups[g] = pg
        kw: dict[str, Any] = dict(
            rank=env.rank,
            world_size=env.world_size,
            device=device,
            p2p=p2p,
            ctrl=ctrl,
            world=world,
            groups=subgroups,
            backend=backend,
        )
        channels[name] = (
            TorchTransport(**kw) if plane is None else SharedMemoryTransport(plane=plane, channel=index, **kw)
        )
    return channels
