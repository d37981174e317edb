"""psgdlab SSGD against plain PyTorch DDP: same workers, model, batch, synthetic data (gloo).

    PYTHONPATH=$PWD python bench/bench_ssgd_ddp.py [--workers 2] [--model blstm-small] [--steps 30]

Prints samples/s of both and the ratio (target >= 0.95). Shared machine: compare the ratio.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _ddp_worker(rank: int, world: int, port: int, model_name: str, steps: int, batch: int, data: str,
                out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.nn.parallel import DistributedDataParallel as DDP

    from psgdlab.runtime.data import WindowSampler, load_corpus
    from psgdlab.runtime.models import build_model

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
    args = parser.parse_args()
    from psgdlab.runtime.config import TrainConfig
    from psgdlab.runtime.data import synthetic_corpus
    from psgdlab.runtime.launch import free_port, launch

    tmp = Path(tempfile.mkdtemp(prefix="psgdlab-bench-"))
    data = str(synthetic_corpus(tmp / "synthetic.h5", n_utterances=64, seed=0))
    out = tmp / "ddp.txt"
    mp.spawn(_ddp_worker, args=(args.workers, free_port(), args.model, args.steps, args.batch, data, str(out)),
             nprocs=args.workers)
    ddp = float(out.read_text())
    config = TrainConfig(algorithm="ssgd", workers=args.workers, model=args.model, data=data, steps=args.steps,
                         batch=args.batch, out=str(tmp / "ssgd"), evaluate=False)
    ours = launch(config, quiet=True)["samples_per_s"]
    print(f"{args.workers} workers, {args.model}, batch {args.batch}, {args.steps} steps (gloo)")
    print(f"  PyTorch DDP     samples/s {ddp:9.1f}")
    print(f"  psgdlab ssgd    samples/s {ours:9.1f}")
    print(f"  ratio ssgd / DDP: {ours / ddp:.2f} (target >= 0.95)")


if __name__ == "__main__":
    main()
