"""Batch size: SSGD against ADPSGD at growing total batch with the IBM learning-rate recipe.

16 workers emulated on the interspeech2019-v100 timing, tiny-blstm on a synthetic corpus. The
learning rate follows the IBM recipe (peak 0.1 * B / 256 with B the total batch, linear warm-up,
then 1/sqrt(2) per epoch), shortened to ``--warmup`` warm-up epochs of ``--epochs`` total so
the sweep runs in minutes. A run "stops converging" when its final held-out loss is not below
the loss of the initial model (or is not finite). Prints one row per (algorithm, batch).

    PYTHONPATH=$PWD python experiments/batch_size.py [--batches 16 64 256 512] [--epochs 4] [--warmup 2]
"""

from __future__ import annotations

import argparse
import math
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256, 512], help="per-worker batches")
    ap.add_argument("--epochs", type=float, default=4.0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--utterances", type=int, default=3000)
    ap.add_argument("--window", type=int, default=11)
    ap.add_argument("--algorithms", nargs="+", default=["ssgd", "adpsgd"])
    args = ap.parse_args()
    from psgdlab.emulate import EmulateConfig, emulate

    n = args.workers
    print(
        f"{n} workers, tiny-blstm (window {args.window}), synthetic corpus of {args.utterances} utterances, "
        f"IBM recipe: warm-up {args.warmup} epochs, {args.epochs:g} epochs"
    )
    print(
        f"{'algorithm':9s} {'B/worker':>8s} {'total B':>8s} {'peak lr':>8s} {'steps':>6s} {'sim s':>8s} "
        f"{'loss@e1':>7s} {'loss':>8s} {'acc':>6s} {'consensus':>10s}  verdict"
    )
    for b in args.batches:
        for alg in args.algorithms:
            t0 = time.perf_counter()
            cfg = EmulateConfig(
                algorithm=alg,
                workers=n,
                batch=b,
                epochs=args.epochs,
                lr=0.1,
                lr_schedule="ibm",
                warmup_epochs=args.warmup,
                synthetic_utterances=args.utterances,
                window=args.window,
                eval_points=8,
            )
            res, resolved = emulate(cfg)
            loss0, loss = float(res.evals["loss"][0]), float(res.evals["loss"][-1])  # loss0: first evaluation
            ok = math.isfinite(loss) and loss < 0.9 * 2.302585  # below chance level log(10) with margin
            print(
                f"{alg:9s} {b:8d} {n * b:8d} {0.1 * n * b / 256:8.3g} {resolved['steps_per_worker']:6d} "
                f"{res.evals['time_s'][-1]:8.2f} {loss0:7.3f} {loss:8.4g} {res.evals['accuracy'][-1]:6.3f} "
                f"{res.evals['consensus_distance'][-1]:10.3g}  {'converges' if ok else 'DOES NOT CONVERGE'}"
                f"  ({time.perf_counter() - t0:.0f} s wall)",
                flush=True,
            )


if __name__ == "__main__":
    main()
