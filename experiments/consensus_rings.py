"""Consensus: fixed ring against randomized ring ADPSGD at 16, 32 and 64 workers.

Emulates tiny-blstm on the synthetic corpus (interspeech2019-v100 timing) and prints the
consensus distance ||Theta - mean 1^T||_F^2 between the replicas at common simulated times, and
its ratio fixed / random. Expectation (ALGORITHMS.md §B.2): the random matching's spectral gap
n/(2(n-1)) ~ 1/2 does not shrink with n, the fixed ring's sin^2(pi/n) does, so the fixed ring's
replicas drift further apart as n grows.

    PYTHONPATH=$PWD python experiments/consensus_rings.py [--steps 40] [--batch 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from experiments._common import at_times, fmt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--lr", type=float, default=0.2)
    args = ap.parse_args()
    from psgdlab.emulate import EmulateConfig, emulate

    print(f"ADPSGD fixed vs random ring, tiny-blstm, batch {args.batch}/worker, lr {args.lr}, {args.steps} steps")
    for n in args.workers:
        curves = {}
        for variant in ("fixed", "random"):
            t0 = time.perf_counter()
            res, _ = emulate(
                EmulateConfig(
                    algorithm="adpsgd",
                    variant=variant,
                    workers=n,
                    steps=args.steps,
                    batch=args.batch,
                    lr=args.lr,
                    eval_points=4,
                )
            )
            curves[variant] = res
            print(
                f"  n={n:3d} {variant:6s}: final consensus {res.evals['consensus_distance'][-1]:.4g}, "
                f"held-out loss {res.evals['loss'][-1]:.4f}, acc {res.evals['accuracy'][-1]:.3f}, "
                f"simulated {res.evals['time_s'][-1]:.2f} s  ({time.perf_counter() - t0:.1f} s wall)"
            )
        end = min(c.rounds["time_s"][-1] for c in curves.values())
        grid = np.linspace(end / 5, end, 5)
        f = at_times(curves["fixed"].rounds["time_s"], curves["fixed"].rounds["consensus_distance"], grid)
        r = at_times(curves["random"].rounds["time_s"], curves["random"].rounds["consensus_distance"], grid)
        print(f"  n={n:3d} simulated time  " + " ".join(f"{t:9.2f}" for t in grid))
        print("         fixed ring      " + " ".join(fmt(v) for v in f))
        print("         random ring     " + " ".join(fmt(v) for v in r))
        print("         ratio fixed/rand" + " ".join(fmt(v) for v in f / r))


if __name__ == "__main__":
    main()
