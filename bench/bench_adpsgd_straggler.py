"""AD-PSGD vs SSGD under one 3x straggler, emulated compute 0.05 s, 4 workers (gloo).

Prints samples/s of both and the ratio (ideal about 2.5: SSGD runs at the straggler's pace,
AD-PSGD's fast workers keep going; target >= 1.8). The machine is shared: compare the ratio.

    PYTHONPATH=$PWD python bench/bench_adpsgd_straggler.py [--steps 60] [--backend gloo]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from psgdlab.runtime.config import TrainConfig
from psgdlab.runtime.launcher.launch import launch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--model", default="tiny-blstm")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="psgdlab-bench-"))
    rates = {}
    for algorithm in ("ssgd", "adpsgd"):
        config = TrainConfig(
            algorithm=algorithm,
            workers=4,
            backend=args.backend,
            model=args.model,
            steps=args.steps,
            batch=16,
            compute_time="0.05",
            straggler="3:3",
            out=str(out / algorithm),
            evaluate=False,
        )
        summary = launch(config, quiet=True)
        rates[algorithm] = steady = steady_rate(out / algorithm / "trace.npz", config.batch)
        print(
            f"{algorithm:7s} samples/s while every worker runs {steady:9.1f}  (summary samples_per_s over the "
            f"makespan {summary['samples_per_s']:.1f})  step_time_s {summary['step_time_s']:.4f}"
            f"  staleness_mean {summary['staleness_mean']:.2f}"
        )
    print(f"adpsgd / ssgd samples/s ratio: {rates['adpsgd'] / rates['ssgd']:.2f} (ideal ~2.5, target >= 1.8)")


def steady_rate(trace_path: Path, batch: int) -> float:
    """Samples/s from the first step after warm-up until the first worker finishes its steps
    (with a fixed number of steps per worker, the makespan measures the straggler alone)."""
    import numpy as np

    from psgdlab.core.records.trace import read_trace

    trace, _ = read_trace(trace_path)
    compute = trace[trace["phase"] == 0]
    ranks = np.unique(compute["rank"])
    t0 = max(float(compute["end_s"][(compute["rank"] == r) & (compute["step"] == 0)][0]) for r in ranks)
    t1 = min(float(compute["end_s"][compute["rank"] == r].max()) for r in ranks)
    done = compute[(compute["end_s"] > t0) & (compute["end_s"] <= t1)]
    return done.size * batch / (t1 - t0)


if __name__ == "__main__":
    main()
