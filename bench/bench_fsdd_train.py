"""Training throughput on FSDD: single-worker SGD against 4-worker AD-PSGD and H-ADPSGD (gloo).

Runs ``psgdlab train`` for a few steps of each case with the same *total* batch (``--batch`` for
SGD, ``--batch / 4`` per worker for the 4-worker runs; H-ADPSGD with 2 workers per node) on the
speaker-disjoint split, no held-out scoring, one torch thread per rank, and prints windows/s
(the trace's samples/s after the first step) and the ratio to SGD. Real compute: on a machine
with fewer cores than ranks the ratio measures contention as much as the algorithm. Run it
under ``flock /work/timing.lock`` on a shared machine::

    PYTHONPATH=$PWD flock /work/timing.lock python bench/bench_fsdd_train.py [--data runs/fsdd.h5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CASES = (("sgd", 1, ()), ("adpsgd", 4, ()), ("hadpsgd", 4, ("--gpus-per-node", "2")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / "runs" / "fsdd.h5")
    parser.add_argument("--model", default="blstm-small")
    parser.add_argument("--batch", type=int, default=32, help="total batch (windows per step over all workers)")
    parser.add_argument("--steps", type=int, default=30, help="local steps per worker")
    args = parser.parse_args()
    if not args.data.exists():
        sys.exit(
            f"corpus {args.data} not found: build it with `psgdlab data fsdd ../shared/data/fsdd --out {args.data}`"
        )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    rates = {}
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[0]}")
    for algorithm, workers, extra in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [
                sys.executable,
                "-m",
                "psgdlab",
                "train",
                "--algorithm",
                algorithm,
                "--workers",
                str(workers),
                *extra,
                "--model",
                args.model,
                "--data",
                str(args.data),
                "--held-out-speakers",
                "theo,george",
                "--steps",
                str(args.steps),
                "--batch",
                str(args.batch // workers),
                "--lr",
                "0.1",
                "--momentum",
                "0.9",
                "--out",
                str(Path(tmp) / "run"),
                "--json",
            ]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"{algorithm}: exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
            summary = json.loads(out.stdout)
        rates[algorithm] = summary["samples_per_s"]
        print(
            f"{algorithm:8s} {workers} worker(s) x batch {args.batch // workers:3d}: "
            f"{summary['samples_per_s']:8.1f} windows/s, step {summary['step_time_s'] * 1e3:7.1f} ms, "
            f"comm fraction {summary['comm_fraction']:.2f}, "
            f"ratio to sgd {summary['samples_per_s'] / rates['sgd']:.2f}"
        )
    with open("/proc/loadavg") as f:
        print(f"load average after: {f.read().split()[0]}")


if __name__ == "__main__":
    main()
