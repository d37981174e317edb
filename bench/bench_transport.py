"""Pairwise-exchange and allreduce bandwidth of each transport relative to raw mpi4py.

Run under the venv's mpiexec (2 ranks by default; every rank also joins a gloo group)::

    PYTHONPATH=$PWD .venv/bin/mpiexec -n 2 python bench/bench_transport.py [--mib 16] [--reps 10] [--rounds 5]

Every implementation is timed in ``--rounds`` interleaved rounds of ``--reps`` repetitions (so a
burst of load from another process hits all of them alike) and the median round is reported.
Lines:

- ``raw mpi4py``: ``Sendrecv`` / in-place ``Allreduce(SUM)`` of the buffer (the reference);
- ``mpi transport`` / ``gloo transport``: :meth:`Transport.sendrecv` and
  :meth:`Transport.allreduce_sum` (what the driver's gradient allreduce runs; the 1/n is folded
  into the learning rate), and :meth:`Transport.allreduce_mean` (sum, then a divide pass; the
  model allreduces of BSP/BMUF/EASGD use it); the gloo transport three times: ``shm`` with
  its shared-memory data plane (the default, :mod:`psgdlab.runtime.transports.shm.shm`: one copy by
  cross-memory attach where the kernel allows it), ``shm 2-copy`` with the data plane forced to
  copy through its segments (``PSGDLAB_SHM=copy``: what hosts without cross-memory attach get),
  and ``tcp`` without it (``PSGDLAB_SHM=0``: every payload through gloo's TCP loopback);
- ``raw torch gloo``: ``dist.isend``/``dist.irecv`` and ``dist.all_reduce`` of the same buffer on
  a plain gloo group -- the ceiling of anything built on gloo's TCP transport.

Every case moves the same torch-allocated buffers (raw mpi4py through ``tensor.numpy()``), with
``THP_MEM_ALLOC_ENABLE=0`` as the runtime's ranks have it (``runtime.launcher.ranks.RANK_ENV``; set
``THP_MEM_ALLOC_ENABLE=1`` to see buffers on transparent huge pages). Each line prints MB/s and the
ratio to raw MPI (target >= 0.8). Shared machine: noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "0")  # before torch allocates (as the runtime's ranks)

import torch


def timed(fn: Callable[[], object], reps: int, barrier: Callable[[], object]) -> float:
    barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    barrier()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=16.0)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import torch.distributed as dist
    from mpi4py import MPI

    from psgdlab.runtime.launcher.launch import free_port
    from psgdlab.runtime.transports.channels import open_channels
    from psgdlab.runtime.transports.env import launch_env
    from psgdlab.runtime.transports.shm.shm import SHM_ENV
    from psgdlab.runtime.transports.shm.shm_transport import SharedMemoryTransport

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    port = comm.bcast(free_port() if rank == 0 else None, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env = launch_env()
    mpi_t = open_channels("mpi", env=env, groups=[], timeout_s=120)["main"]
    gloo_ts = {}
    for mode in ("1", "copy", "0"):
        os.environ[SHM_ENV] = mode
        gloo_ts[mode] = open_channels("gloo", env=env, groups=[], timeout_s=120)["main"]
    shm_t, copy_t, gloo_t = gloo_ts.values()
    if not (isinstance(shm_t, SharedMemoryTransport) and len(shm_t.plane.local) == size):
        raise SystemExit("the gloo transport did not set up its shared-memory data plane")
    one_copy = "one copy" if shm_t.plane.single_copy else "two copies: no cross-memory attach here"
    raw_gloo = dist.new_group(list(range(size)), backend="gloo")
    n = int(args.mib * 2**20 / 4)
    a, b = torch.ones(n), torch.empty(n)
    peer = rank ^ 1
    group = tuple(range(size))
    nbytes = n * 4

    def gloo_sendrecv() -> None:
        reqs = [dist.isend(a, dst=peer, group=raw_gloo, tag=7), dist.irecv(b, src=peer, group=raw_gloo, tag=7)]
        for r in reqs:
            r.wait()

    c = torch.zeros(n)  # allreduces: zeros stay zeros (no overflow of repeated sums)
    cases: dict[str, Callable[[], object]] = {}
    if peer < size:
        cases |= {
            "pairwise raw mpi4py Sendrecv": lambda: comm.Sendrecv(a.numpy(), dest=peer, recvbuf=b.numpy(), source=peer),
            "pairwise mpi transport": lambda: mpi_t.sendrecv(a, b, peer, 5),
            "pairwise gloo transport (shm)": lambda: shm_t.sendrecv(a, b, peer, 5),
            "pairwise gloo transport (shm 2-copy)": lambda: copy_t.sendrecv(a, b, peer, 5),
            "pairwise gloo transport (tcp)": lambda: gloo_t.sendrecv(a, b, peer, 5),
            "pairwise raw torch gloo isend/irecv": gloo_sendrecv,
        }
    cases |= {
        "allreduce raw mpi4py Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, c.numpy(), op=MPI.SUM),
        "allreduce mpi transport (sum)": lambda: mpi_t.allreduce_sum(c, group),
        "allreduce mpi transport (mean)": lambda: mpi_t.allreduce_mean(c, group),
        "allreduce gloo transport (shm, sum)": lambda: shm_t.allreduce_sum(c, group),
        "allreduce gloo transport (shm, mean)": lambda: shm_t.allreduce_mean(c, group),
        "allreduce gloo transport (shm 2-copy, sum)": lambda: copy_t.allreduce_sum(c, group),
        "allreduce gloo transport (tcp, sum)": lambda: gloo_t.allreduce_sum(c, group),
        "allreduce gloo transport (tcp, mean)": lambda: gloo_t.allreduce_mean(c, group),
        "allreduce raw torch gloo all_reduce": lambda: dist.all_reduce(c, group=raw_gloo),
    }
    for fn in cases.values():  # warm-up: connections, page faults
        fn()
    rounds: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        for key, fn in cases.items():
            rounds[key].append(timed(fn, args.reps, comm.Barrier))
    if rank == 0:
        print(
            f"{size} ranks, {args.mib:g} MiB buffer, median of {args.rounds} interleaved rounds x "
            f"{args.reps} repetitions; THP_MEM_ALLOC_ENABLE={os.environ['THP_MEM_ALLOC_ENABLE']}; "
            f"load average {os.getloadavg()[0]:.2f}; gloo shm: {one_copy}"
        )
        for kind in ("pairwise", "allreduce"):
            keys = [k for k in cases if k.startswith(kind)]
            if not keys:
                continue
            med = {k: statistics.median(rounds[k]) for k in keys}
            raw = med[keys[0]]
            for key in keys:
                print(f"  {key:42s} {nbytes / med[key] / 1e6:9.1f} MB/s   ratio to raw MPI {raw / med[key]:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
