"""Emulator throughput: 32 virtual workers of tiny-blstm for 200 steps each, on one core.

Prints the wall time of the emulation (replay only, and simulator + replay), learner-steps per
second, and the same for a plain single-model training loop (torch.optim.SGD, nn.LSTM) doing the
same number of steps (32 x 200) on the same batches; the ratio is the figure of merit (target:
emulator no slower than 1.5x the plain loop). Benchmarks on a shared machine are noisy: compare
the ratio within one run.

    PYTHONPATH=$PWD python bench/bench_emulate.py [--workers 32] [--steps 200] [--batch 32] [--algorithm adpsgd]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--algorithm", default="adpsgd")
    ap.add_argument("--window", type=int, default=21)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.models.data import load_corpus, synthetic_corpus
    from psgdlab.models.networks import build_model
    from psgdlab.models.replicas import TorchReplicas
    from psgdlab.sim.emulate import replay
    from psgdlab.sim.engine import simulate
    from psgdlab.sim.workload import load_config

    n, steps = args.workers, args.steps
    with tempfile.TemporaryDirectory() as tmp:
        corpus = load_corpus(synthetic_corpus(Path(tmp) / "c.h5", n_utterances=1000, input_dim=40, n_classes=10))
    torch.manual_seed(0)
    model = build_model("tiny-blstm", input_dim=40, n_classes=10, window=args.window)
    reps = TorchReplicas(model, corpus, n_workers=n, window=args.window, batch=args.batch, seed=0, eval_windows=1024)
    alg = make_algorithm(args.algorithm, n_workers=n)
    cfg = load_config(preset="interspeech2019-v100")
    t0 = time.perf_counter()
    sim = simulate(alg, cfg.platform, cfg.workload.with_batch(args.batch), steps=steps, seed=0, until="all")
    trace, meta = sim.trace, dict(sim.meta)
    t_sim = time.perf_counter() - t0
    # pre-draw the minibatches so both loops measure training, not sampling
    t0 = time.perf_counter()
    cache = {(r, s): reps.samplers[r].sample(s) for r in range(n) for s in range(steps)}
    t_sample = time.perf_counter() - t0
    reps.batch_of = lambda r, s: cache[(r, s)]
    t0 = time.perf_counter()
    res = replay(alg, trace, reps, lr=0.1, meta=meta, eval_points=5)
    t_replay = time.perf_counter() - t0

    plain = build_model("tiny-blstm", input_dim=40, n_classes=10, window=args.window)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    t0 = time.perf_counter()
    for s in range(steps):
        for r in range(n):
            x, y = cache[(r, s)]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(plain(x), y).backward()
            opt.step()
    t_plain = time.perf_counter() - t0
    total = n * steps
    print(
        f"emulate {args.algorithm}: {n} workers x {steps} steps of tiny-blstm ({reps.n_params} params), "
        f"batch {args.batch}, window {args.window}, 1 thread"
    )
    print(f"  simulator           {t_sim:8.2f} s")
    print(f"  sampling (both)     {t_sample:8.2f} s (excluded below)")
    print(
        f"  replay (emulator)   {t_replay:8.2f} s  {total / t_replay:8.1f} learner-steps/s  "
        f"(mean gradient batch {sum(res.gradient_batches) / len(res.gradient_batches):.1f} replicas, "
        f"{len(res.evals['loss'])} evaluations)"
    )
    print(f"  plain training loop {t_plain:8.2f} s  {total / t_plain:8.1f} steps/s")
    print(f"  ratio emulator / plain = {t_replay / t_plain:.2f} (target <= 1.5)")
    print(
        f"  final held-out loss {res.evals['loss'][-1]:.4f}, accuracy {res.evals['accuracy'][-1]:.3f}, "
        f"simulated time {res.evals['time_s'][-1]:.2f} s"
    )


if __name__ == "__main__":
    main()
