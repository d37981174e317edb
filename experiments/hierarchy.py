"""Hierarchy: ADPSGD with 32 flat workers against H-ADPSGD with 4 nodes x 8 (super-learners).

Same total batch, same steps, interspeech2019-v100 timing, tiny-blstm on the synthetic corpus.
Prints held-out loss / accuracy against simulated time and epochs, consensus distance and
staleness. Expectation (ALGORITHMS.md §A.10, §B.2): the 4-node ring mixes far better (gap
sin^2(pi/4) = 0.5 against sin^2(pi/32) ~ 0.0096), replicas inside a node stay identical.

    PYTHONPATH=$PWD python experiments/hierarchy.py [--steps 60] [--batch 16]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--variant", default="fixed")
    args = ap.parse_args()
    from psgdlab.emulate import EmulateConfig, emulate

    runs = {
        "ADPSGD 32 flat": EmulateConfig(
            algorithm="adpsgd",
            variant=args.variant,
            workers=32,
            steps=args.steps,
            batch=args.batch,
            lr=args.lr,
            eval_points=6,
        ),
        "H-ADPSGD 4 x 8": EmulateConfig(
            algorithm="hadpsgd",
            variant=args.variant,
            workers=32,
            gpus_per_node=8,
            steps=args.steps,
            batch=args.batch,
            lr=args.lr,
            eval_points=6,
        ),
    }
    for label, cfg in runs.items():
        t0 = time.perf_counter()
        res, _ = emulate(cfg)
        ev = res.evals
        s = res.summary()
        print(
            f"{label}: {time.perf_counter() - t0:.0f} s wall; staleness mean {s['staleness_mean']:.2f} "
            f"max {s['staleness_max']}"
        )
        print(f"  {'sim time s':>10s} {'epoch':>7s} {'loss':>8s} {'acc':>6s} {'consensus':>10s}")
        for i in range(len(ev["time_s"])):
            print(
                f"  {ev['time_s'][i]:10.2f} {ev['epoch'][i]:7.2f} {ev['loss'][i]:8.4f} {ev['accuracy'][i]:6.3f} "
                f"{ev['consensus_distance'][i]:10.4g}"
            )
        if cfg.gpus_per_node:
            import torch

            P = torch.stack(res.params).view(32 // cfg.gpus_per_node, cfg.gpus_per_node, -1)
            spread = float((P - P[:, :1]).abs().max())
            print(f"  largest difference between replicas of one node: {spread:.3g}")


if __name__ == "__main__":
    main()
