"""What a process learns from the launcher that started it: its place in the job, its host, the
rendezvous socket it inherited, and whether it runs on the main thread.

The launchers (:mod:`psgdlab.runtime.launcher`) write these variables and the ranks read them
(the transports, the training loop, the per-rank entry), so they live here, below both. No torch:
the launcher that starts the ranks imports this module too.

Under Slurm's ``srun`` a task learns its place from ``SLURM_PROCID``, ``SLURM_NTASKS`` and
``SLURM_LOCALID``, and the rendezvous of torch.distributed (``MASTER_ADDR``/``MASTER_PORT``)
from the job itself (:func:`slurm_rendezvous`): the first node of the step's node list (Slurm's
hostlist syntax, :func:`expand_hostlist`) and a port derived from the job and step ids, so a
user exports neither. A variable the user set wins.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from psgdlab.core.errors import ConfigError

__all__ = [
    "LaunchEnv",
    "launch_env",
    "expand_hostlist",
    "slurm_rendezvous",
    "SLURM_PORT_BASE",
    "SLURM_PORT_SPAN",
    "HOST_ENV",
    "host_identity",
    "STORE_FD_ENV",
    "in_main_thread",
]

#: the environment variable that names a rank's host where the machine's name does not (the
#: launcher of emulated hosts sets it to the host's namespace; read by :func:`host_identity`)
HOST_ENV = "PSGDLAB_HOST_ID"
#: the file descriptor of the rendezvous store's listening socket, which rank 0 inherits
#: (:func:`psgdlab.runtime.launcher.ranks.rendezvous_socket`); every rank of such a launch has it
#: (the others connect to the store)
STORE_FD_ENV = "PSGDLAB_STORE_FD"
#: the ports :func:`slurm_rendezvous` derives lie in ``[SLURM_PORT_BASE, SLURM_PORT_BASE +
#: SLURM_PORT_SPAN)``: 10000-29999, below Linux's ephemeral ports (32768-60999), which outgoing
#: connections take
SLURM_PORT_BASE = 10000
SLURM_PORT_SPAN = 20000
#: the steps of one job that get distinct ports (the step id modulo this)
_STEPS_PER_JOB = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchEnv:
    """Where this process sits in the job, read from the launcher's environment.

    ``launcher`` is ``"torchrun"``, ``"mpi"``, ``"slurm"`` (a task of ``srun``), ``"slurm-batch"``
    (the batch script of a Slurm job itself: one process, whatever ``SLURM_NTASKS`` says) or
    ``"single"``. ``master`` is the rendezvous ``(host, port)`` the environment implies where
    ``MASTER_ADDR``/``MASTER_PORT`` do not say it (:func:`slurm_rendezvous`), else ``None``.
    """

    rank: int
    world_size: int
    local_rank: int
    launcher: str
    master: tuple[str, int] | None = None


def launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """Rank, world size and local rank from torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``),
    MPICH/Hydra (``PMI_RANK``/``PMI_SIZE``), Open MPI (``OMPI_COMM_WORLD_*``) or a task of Slurm's
    ``srun`` (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID`` with a step id), in that order;
    a single process otherwise. Inside a Slurm job step (any of them: ``srun --mpi=pmi2`` sets
    ``PMI_RANK`` too) the rendezvous comes from the job where the environment lacks it
    (:func:`slurm_rendezvous`).

    >>> launch_env({"PMI_RANK": "2", "PMI_SIZE": "4"})
    LaunchEnv(rank=2, world_size=4, local_rank=2, launcher='mpi', master=None)
    >>> launch_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
    ...             "SLURM_JOB_ID": "42", "SLURM_STEP_NODELIST": "gpu[07-08]"})
    LaunchEnv(rank=1, world_size=2, local_rank=1, launcher='slurm', master=('gpu07', 10672))

    Raises
    ------
    ConfigError
        Launcher variables that are not integers; under ``srun``, rank 0 on another node than the
        first of the step's node list while the rendezvous is derived from that list.
    """
    env = os.environ if environ is None else environ
    in_step = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    candidates = (
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("mpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
        ("mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("slurm" if in_step else "slurm-batch", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
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
            if launcher == "slurm-batch":  # the batch script is one process; srun starts the tasks
                return LaunchEnv(rank=0, world_size=1, local_rank=0, launcher=launcher)
            master = slurm_rendezvous(env)
            if launcher == "slurm" and rank == 0 and master is not None:
                _require_first_node(env, master[0])
            return LaunchEnv(rank=rank, world_size=size, local_rank=local, launcher=launcher, master=master)
    return LaunchEnv(rank=0, world_size=1, local_rank=0, launcher="single")


def slurm_rendezvous(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The rendezvous ``(host, port)`` of torch.distributed for a task of a Slurm job step, where
    the environment does not set both ``MASTER_ADDR`` and ``MASTER_PORT``; ``None`` outside a step
    (no step id, job id or node list) or where both are set.

    The host is the first node of the step's nodes (``SLURM_STEP_NODELIST``, else
    ``SLURM_JOB_NODELIST`` or ``SLURM_NODELIST``): task 0 runs there under ``srun``'s block and
    cyclic distributions. The port is ``SLURM_PORT_BASE + (16 j + s) mod SLURM_PORT_SPAN`` for job
    id ``j`` and step id ``s``: the steps of one job (up to 16 at once) and consecutive jobs get
    distinct ports; two jobs 1250 ids apart that share their first node at the same time would
    collide, and then one exports ``MASTER_PORT``. A node name that does not resolve to the node
    (``NodeAddr`` in slurm.conf differs from it) needs ``MASTER_ADDR`` exported too.

    >>> slurm_rendezvous({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "2", "SLURM_JOB_NODELIST": "n[3-4],m1"})
    ('n3', 10018)
    >>> slurm_rendezvous({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "2", "SLURM_NODELIST": "n1",
    ...                   "MASTER_ADDR": "n9", "MASTER_PORT": "29500"}) is None
    True
    """
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    job = environ.get("SLURM_JOB_ID", environ.get("SLURM_JOBID"))
    nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if step is None or job is None or not nodes or ("MASTER_ADDR" in environ and "MASTER_PORT" in environ):
        return None
    try:
        job_id, step_id = int(job), int(step)
    except ValueError:
        raise ConfigError(f"Slurm's SLURM_JOB_ID={job!r} and SLURM_STEP_ID={step!r} are not integers") from None
    port = SLURM_PORT_BASE + (_STEPS_PER_JOB * job_id + step_id % _STEPS_PER_JOB) % SLURM_PORT_SPAN
    return expand_hostlist(nodes)[0], port


def _require_first_node(environ: Mapping[str, str], first: str) -> None:
    """Task 0 must run on ``first``, the node the derived rendezvous names."""
    node = environ.get("SLURMD_NODENAME")
    if node is not None and node != first:
        raise ConfigError(
            f"rank 0 runs on node {node}, not on {first}, the first node of the step's node list, where the "
            "rendezvous of torch.distributed is derived; use srun's block or cyclic distribution, or export "
            "MASTER_ADDR (rank 0's node) and MASTER_PORT"
        )


_RANGE = re.compile(r"(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """The host names of a Slurm hostlist (``scontrol show hostnames`` without Slurm), in its order.

    Items are separated by commas outside brackets; in an item each bracket holds numbers and
    ranges (``[01-03,7]``), numbered with the width of the range's first bound (``n[8-11]`` is
    ``n8 .. n11``, ``n[08-11]`` is ``n08 .. n11``), and several brackets multiply, the first
    varying slowest.

    >>> expand_hostlist("gpu[01-03,7],login1,r[1-2]n[8-9]")
    ['gpu01', 'gpu02', 'gpu03', 'gpu7', 'login1', 'r1n8', 'r1n9', 'r2n8', 'r2n9']

    Raises
    ------
    ConfigError
        Unbalanced brackets, an empty item or a range whose first bound exceeds its last.
    """
    hosts: list[str] = []
    for item in _split_outside_brackets(text):
        names = [""]
        for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", item):
            names = [name + literal + number for name in names for number in _numbers(ranges, text)]
        hosts += names
    return hosts


def _split_outside_brackets(text: str) -> list[str]:
    """The comma-separated items of ``text``, whose brackets must balance."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            break
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    if depth != 0 or not all(items):
        raise ConfigError(f"hostlist ({text!r}) is not Slurm's syntax: balanced brackets, items separated by commas")
    return items


def _numbers(ranges: str, text: str) -> list[str]:
    """The numbers of one bracket's ``ranges`` (``""``: none, one empty name), padded as Slurm pads."""
    if not ranges:
        return [""]
    out: list[str] = []
    for part in ranges.split(","):
        match = _RANGE.match(part)
        low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, -1)
        if not match or high < low:
            raise ConfigError(f"hostlist ({text!r}) has a range ({part!r}) that is not N or N-M with N <= M")
        out += [f"{n:0{len(match[1])}d}" for n in range(low, high + 1)]
    return out


def host_identity(environ: Mapping[str, str] | None = None) -> str:
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
