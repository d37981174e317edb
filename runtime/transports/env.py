"""What a process learns from the launcher that started it: its place in the job, its host, the
rendezvous socket it inherited, and whether it runs on the main thread.

The launchers (:mod:`psgdlab.runtime.launcher`) write these variables and the ranks read them
(the transports, the training loop, the per-rank entry), so they live here, below both. No torch:
the launcher that starts the ranks imports this module too.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from psgdlab.core.errors import ConfigError

__all__ = ["LaunchEnv", "launch_env", "HOST_ENV", "host_identity", "STORE_FD_ENV", "in_main_thread"]

#: the environment variable that names a rank's host where the machine's name does not (the
#: launcher of emulated hosts sets it to the host's namespace; read by :func:`host_identity`)
HOST_ENV = "PSGDLAB_HOST_ID"
#: the file descriptor of the rendezvous store's listening socket, which rank 0 inherits
#: (:func:`psgdlab.runtime.launcher.ranks.rendezvous_socket`); every rank of such a launch has it
#: (the others connect to the store)
STORE_FD_ENV = "PSGDLAB_STORE_FD"


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchEnv:
    """Where this process sits in the job, read from the launcher's environment."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "torchrun", "mpi", "slurm", "single"


def launch_env(environ: dict[str, str] | None = None) -> LaunchEnv:
    """Rank, world size and local rank from torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``),
    MPICH/Hydra (``PMI_RANK``/``PMI_SIZE``), Open MPI (``OMPI_COMM_WORLD_*``) or Slurm
    (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``), in that order; a single process
    otherwise.

    >>> launch_env({"PMI_RANK": "2", "PMI_SIZE": "4"})
    LaunchEnv(rank=2, world_size=4, local_rank=2, launcher='mpi')
    """
    env = os.environ if environ is None else environ
    candidates = (
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("mpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
        ("mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    )
    for launcher, rank_key, size_key, local_key in candidates:
        if rank_key in env and size_key in env:
            try:
                rank, size = int(env[rank_key]), int(env[size_key])
                local = int(env.get(local_key, rank))
            except ValueError:
                raise ConfigError(
                    f"launcher variables {rank_key}={env[rank_key]!r}, {size_key}={env[size_key]!r} are not integers"
                ) from None
            return LaunchEnv(rank=rank, world_size=size, local_rank=local, launcher=launcher)
    return LaunchEnv(rank=0, world_size=1, local_rank=0, launcher="single")


def host_identity(environ: dict[str, str] | None = None) -> str:
    """The host this process runs on: :data:`HOST_ENV` where the launcher set it (emulated hosts
    share one machine), else the machine's name. Ranks that share it may share memory.

    >>> host_identity({HOST_ENV: "psgd-1-2-h0"})
    'psgd-1-2-h0'
    """
    env = os.environ if environ is None else environ
    return env.get(HOST_ENV) or socket.gethostname()


def in_main_thread() -> bool:
    """True in the main thread (where signal handlers may be set)."""
    import threading

    return threading.current_thread() is threading.main_thread()
