"""psgdlab SSGD against plain PyTorch DDP: same workers, model, batch, synthetic data.

    PYTHONPATH=$PWD python bench/bench_ssgd_ddp.py [--workers 2] [--model blstm-small] [--steps 30]
        [--rounds 3] [--backend gloo|mpi]

Each round runs DDP (gloo), psgdlab ssgd with the bucketed gradient allreduce overlapped with the
backward pass (the default) and psgdlab ssgd without it (``PSGDLAB_OVERLAP=0``: one allreduce of
the flat gradient after the backward pass), one after another, so load from other processes
hits all three alike. Prints samples/s of each run and the median over rounds of the per-round
ratio to DDP (target >= 0.95). DDP runs with ``THP_MEM_ALLOC_ENABLE=0`` like psgdlab's ranks
(``runtime.launcher.ranks.RANK_ENV``), so both use the same allocator. Shared machine: compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "0")  # DDP's spawned workers: the allocator of our ranks

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _ddp_worker(rank: int, world: int, port: int, model_name: str, steps: int, batch: int, data: str, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.nn.parallel import DistributedDataParallel as DDP

    from psgdlab.models.batches import WindowSampler
    from psgdlab.models.data import load_corpus
    from psgdlab.models.networks import build_model

    corpus = load_corpus(data)
    sampler = WindowSampler(corpus, window=21, batch=batch, rank=rank, world_size=world, seed=0)
    torch.manual_seed(0)
    model = DDP(build_model(model_name, input_dim=corpus.input_dim, n_classes=corpus.n_classes, window=21))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    t0 = None
    for step in range(steps):
        if step == 1:
            dist.barrier()
            t0 = time.perf_counter()
        x, y = sampler.sample(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.barrier()
    if rank == 0:
        Path(out).write_text(str((steps - 1) * batch * world / (time.perf_counter() - t0)))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default="blstm-small")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "mpi"))
    args = parser.parse_args()
    from psgdlab.models.data import synthetic_corpus
    from psgdlab.runtime.config import TrainConfig
    from psgdlab.runtime.launcher.launch import free_port, launch
    from psgdlab.runtime.loop.driver import OVERLAP_ENV

    tmp = Path(tempfile.mkdtemp(prefix="psgdlab-bench-"))
    data = str(synthetic_corpus(tmp / "synthetic.h5", n_utterances=64, seed=0))
    out = tmp / "ddp.txt"
    rates: dict[str, list[float]] = {"PyTorch DDP (gloo)": [], "ssgd, overlapped": [], "ssgd, not overlapped": []}
    print(
        f"{args.workers} workers, {args.model}, batch {args.batch}, {args.steps} steps, ssgd on {args.backend}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    for i in range(args.rounds):
        mp.spawn(
            _ddp_worker,
            args=(args.workers, free_port(), args.model, args.steps, args.batch, data, str(out)),
            nprocs=args.workers,
        )
        rates["PyTorch DDP (gloo)"].append(float(out.read_text()))
        for key, overlap in (("ssgd, overlapped", "1"), ("ssgd, not overlapped", "0")):
            config = TrainConfig(
                algorithm="ssgd",
                workers=args.workers,
                model=args.model,
                data=data,
                steps=args.steps,
                batch=args.batch,
                backend=args.backend,
                out=str(tmp / f"ssgd{i}{overlap}"),
                evaluate=False,
            )
            rates[key].append(launch(config, quiet=True, extra_env={OVERLAP_ENV: overlap})["samples_per_s"])
        print(f"  round {i}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()) + " samples/s")
    ddp = rates["PyTorch DDP (gloo)"]
    for key, vals in rates.items():
        ratio = statistics.median(v / d for v, d in zip(vals, ddp))
        print(f"  {key:22s} median samples/s {statistics.median(vals):8.1f}   median ratio to DDP {ratio:.2f}")
    print(f"  target: ssgd / DDP >= 0.95; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
