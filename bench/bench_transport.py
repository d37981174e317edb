"""Pairwise-exchange and allreduce bandwidth of each transport relative to raw mpi4py.

Run under the venv's mpiexec (2 ranks by default; every rank also joins a gloo group)::

    PYTHONPATH=$PWD .venv/bin/mpiexec -n 2 python bench/bench_transport.py [--mib 16] [--reps 20]

Prints MB/s of raw ``Sendrecv``/``Allreduce`` and of the ``mpi`` and ``gloo`` transports on the
same buffer, and each transport's ratio to raw MPI (target >= 0.8). Shared machine: noisy.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch


def timed(fn, reps: int, barrier) -> float:
    fn()
    barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    barrier()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=16.0)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from mpi4py import MPI

    from psgdlab.runtime.launch import free_port
    from psgdlab.runtime.transport import launch_env, open_channels

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    port = comm.bcast(free_port() if rank == 0 else None, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env = launch_env()
    mpi_t = open_channels("mpi", env=env, groups=[], timeout_s=120)["main"]
    gloo_t = open_channels("gloo", env=env, groups=[], timeout_s=120)["main"]
    n = int(args.mib * 2**20 / 4)
    a, b = torch.ones(n), torch.empty(n)
    peer = rank ^ 1
    group = tuple(range(size))
    nbytes = n * 4
    results = {}
    barrier = comm.Barrier
    if peer < size:
        results["pairwise raw mpi4py Sendrecv"] = timed(
            lambda: comm.Sendrecv(a.numpy(), dest=peer, recvbuf=b.numpy(), source=peer), args.reps, barrier)
        results["pairwise mpi transport"] = timed(lambda: mpi_t.sendrecv(a, b, peer, 5), args.reps, barrier)
        results["pairwise gloo transport"] = timed(lambda: gloo_t.sendrecv(a, b, peer, 5), args.reps, barrier)
    buf = np.ones(n, dtype=np.float32)
    results["allreduce raw mpi4py Allreduce"] = timed(lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                                                      args.reps, barrier)
    results["allreduce mpi transport"] = timed(lambda: mpi_t.allreduce_mean(a, group), args.reps, barrier)
    results["allreduce gloo transport"] = timed(lambda: gloo_t.allreduce_mean(a, group), args.reps, barrier)
    if rank == 0:
        print(f"{size} ranks, {args.mib:g} MiB buffer, {args.reps} repetitions")
        for kind in ("pairwise", "allreduce"):
            raw = next((v for k, v in results.items() if k.startswith(kind) and "raw" in k), None)
            if raw is None:
                continue
            for key, t in results.items():
                if key.startswith(kind):
                    print(f"  {key:32s} {nbytes / t / 1e6:9.1f} MB/s   ratio to raw MPI {raw / t:.2f}")
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
