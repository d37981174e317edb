"""Time from a rank's death to the first step after the restart (``--on-failure restart``).

A small synchronous run (least squares, 2 workers, gloo) whose rank 1 is killed (SIGKILL) at
step ``--crash-step``, restarted by torchrun's elastic agent from the newest complete
checkpoint. Prints, per repeat, the summary's ``time_to_first_step_s`` and the cold start of the
same run (agent start to the end of the first step of the first attempt), and the median ratio
restart / cold start: a restart costs about one cold start (processes, ``import torch``, gloo's
set-up), plus the time the agent takes to see the failure and stop the survivors. The machine
is shared: compare the ratio.

    PYTHONPATH=$PWD python bench/bench_restart.py [--repeats 3] [--workers 2] [--crash-step 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from psgdlab.runtime.config import TrainConfig
from psgdlab.runtime.launcher.elastic import AGENT_START_FILE
from psgdlab.runtime.launcher.launch import RANKS_DIR, launch


def cold_start_s(run: Path) -> float:
    """Agent start to the end of the first attempt's first step (on the fastest rank)."""
    ranks = run / RANKS_DIR
    started = float((ranks / AGENT_START_FILE).read_text())
    ends = [np.frombuffer(p.read_bytes(), dtype=np.float64)[2] for p in ranks.glob("progress.a0.rank*")]
    return min(float(e) for e in ends if e > 0) - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--crash-step", type=int, default=20)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="psgdlab-bench-restart-"))
    ratios = []
    for i in range(args.repeats):
        config = TrainConfig(
            algorithm="ssgd",
            workers=args.workers,
            model="least-squares",
            steps=2 * args.crash_step,
            batch=8,
            lsq_dim=64,
            checkpoint_every=8,
            compute_time="0.005",
            on_failure="restart",
            out=str(out / f"run{i}"),
            evaluate=False,
        )
        summary = launch(config, quiet=True, extra_env={"PSGDLAB_TEST_CRASH": f"1:{args.crash_step}"})
        (restart,) = summary["restarts"]
        cold = cold_start_s(out / f"run{i}")
        ratios.append(restart["time_to_first_step_s"] / cold)
        print(
            f"repeat {i}: failure at {restart['time_s']:.2f} s, time to the first step after the restart "
            f"{restart['time_to_first_step_s']:.2f} s (resumed from step {restart['resumed_from_step']}, "
            f"{restart['steps_lost']} steps lost); cold start {cold:.2f} s"
        )
    print(f"restart / cold start, median of {args.repeats}: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
