"""The survivors' throughput after a failure: the simulator's prediction against the runtime.

::

    python bench/bench_continue.py [--algorithm adpsgd] [--repeats 3] [--steps 600] [--json]
    python bench/bench_continue.py --algorithm hadpsgd --gpus-per-node 2

1. One failure-free ``psgdlab train`` of the least-squares model with emulated compute
   (AD-PSGD on ``--calibrate-workers`` workers, ``--steps`` steps of ``--compute-time``,
   ``--on-failure continue``); ``psgdlab calibrate --probe`` fits this machine's platform from it.
2. ``--repeats`` runs of the same configuration, each with one worker killed (SIGKILL, a rank drawn
   from ``--seed``; ``--fault stop``: SIGSTOP, given up after ``--deadline``) at half its steps:
   the survivors go on (``--on-failure continue``). Each summary gives the survivors' throughput
   before and after the failure (runtime/README.md, "Going on without the dead").
3. For each run, ``psgdlab predict --platform`` of the calibrated platform with ``--fail
   RANK@SECONDS`` at the time the worker was killed (since the run's first step) and the
   detection time the run measured (``failure_detection_s``): the predicted throughput of the
   survivors after the failure (``throughput_after_samples_per_s``) and its ratio to ``(n-1)/n``
   of the throughput before.

4. ``--overhead-pairs`` pairs of failure-free runs, ``--on-failure stop`` then ``continue``: what
   the survivors' protocol (the mailbox, the request and reply of each exchange, D-PSGD's
   exchanges one neighbour at a time) costs a run that loses nobody, as the ratio of samples/s.

It prints, per run and as medians: measured and predicted throughput after the failure (samples
per second), their relative error, the measured and predicted ratios, and the protocol's cost. Figures only; nothing
here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BATCH = 8


def _psgdlab(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "psgdlab", *args], capture_output=True, text=True, env=env, check=False
    )


def _train(
    out: Path,
    args: argparse.Namespace,
    crash: str | None = None,
    workers: int | None = None,
    algorithm: str = "",
    policy: str = "continue",
) -> dict[str, Any]:
    workers = workers or args.workers
    flags = ["train", "--algorithm", algorithm or args.algorithm, "--workers", str(workers), "--model", "least-squares"]
    flags += ["--steps", str(args.steps), "--batch", str(BATCH), "--compute-time", str(args.compute_time)]
    flags += ["--on-failure", policy, "--timeout", str(args.deadline), "--out", str(out), "--json"]
    if (algorithm or args.algorithm) == "hadpsgd":
        flags += ["--gpus-per-node", str(args.gpus_per_node)]
    env = dict(os.environ, **({"PSGDLAB_TEST_CRASH": crash} if crash else {}))
    done = _psgdlab(*flags, env=env)
    if done.returncode != 0:
        raise SystemExit(f"bench_continue: train failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads((out / "summary.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="adpsgd", choices=("adpsgd", "dpsgd", "hadpsgd"))
    parser.add_argument(
        "--gpus-per-node", type=int, default=2, help="H-ADPSGD's workers per node (its super-learner; default 2)"
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--calibrate-workers",
        type=int,
        default=2,
        help="workers of the calibration run (psgdlab calibrate fits from runs with at most one worker per core)",
    )
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--compute-time", type=float, default=0.02)
    parser.add_argument("--deadline", type=float, default=10.0, help="the runs' --timeout, seconds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--fault",
        choices=("kill", "stop"),
        default="kill",
        help="SIGKILL (seen at once) or SIGSTOP (given up after --deadline) of the victim; default kill",
    )
    parser.add_argument(
        "--overhead-pairs",
        type=int,
        default=2,
        help="failure-free pairs of runs, --on-failure stop then continue, for the protocol's cost (default 2)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-continue-") as tmp:
        base = Path(tmp)
        # the platform's laws do not depend on the algorithm; D-PSGD's ring needs 3 workers
        _train(base / "calibration", args, workers=args.calibrate_workers, algorithm="adpsgd")
        platform = base / "platform.toml"
        fit = _psgdlab(
            "calibrate", "--probe", "--probe-out", str(base / "probe"), "--devices", str(args.workers),
            "--out", str(platform), str(base / "calibration"),
        )  # fmt: skip
        if fit.returncode != 0:
            raise SystemExit(f"bench_continue: calibrate failed: {fit.stderr.strip().splitlines()[-1:]}")
        from psgdlab.core.platform.profile import Profile

        profile = Profile.read(platform)
        rows = []
        for i in range(args.repeats):
            victim = rng.randrange(args.workers)
            out = base / f"run{i}"
            summary = _train(out, args, crash=f"{victim}:{args.steps // 2}" + (":STOP" if args.fault == "stop" else ""))
            change = summary["membership_changes"][0]
            epoch = json.loads((out / "membership" / "epoch00000001.json").read_text())
            origin = epoch["time_s"] - change["time_s"]
            killed_wall = float((out / ".ranks" / f"rank{victim}.crash").read_text().split()[0])
            failed_at = killed_wall - origin
            detection = max(1e-3, epoch["time_s"] - killed_wall)
            predicted_platform = base / f"platform{i}.toml"
            profile.with_values({"platform.failure_detection_s": detection}).write(predicted_platform)
            pred = _psgdlab(
                "predict", "--platform", str(predicted_platform), "--algorithm", args.algorithm,
                "--workers", str(args.workers), "--batch", str(BATCH), "--steps", str(args.steps),
                "--fail", f"{victim}@{failed_at:.4f}", "--on-failure", "continue", "--json",
                # H-ADPSGD's nodes as groups of this machine's processes, on the calibrated one host
                *(["--gpus-per-node", str(args.gpus_per_node), "--workers-per-host", str(args.workers)]
                  if args.algorithm == "hadpsgd" else []),
            )  # fmt: skip
            if pred.returncode != 0:
                raise SystemExit(f"bench_continue: predict failed: {pred.stderr.strip().splitlines()[-1:]}")
            failures = json.loads(pred.stdout)["rows"][0]["failures"]
            measured, predicted = summary["throughput_after"], failures["throughput_after_samples_per_s"]
            rows.append(
                {
                    "victim": victim,
                    "failed_at_s": round(failed_at, 3),
                    "detection_s": round(detection, 4),
                    "measured_after_samples_per_s": measured,
                    "predicted_after_samples_per_s": predicted,
                    "after_error": predicted / measured - 1 if measured else None,  # None: no window after
                    "measured_ratio": summary["throughput_after_ratio"],
                    "predicted_ratio": failures["throughput_after_ratio"],
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        overhead = []  # what the survivors' protocol costs a run that loses nobody
        for i in range(args.overhead_pairs):
            stop = _train(base / f"stop{i}", args, policy="stop")["samples_per_s"]
            cont = _train(base / f"continue{i}", args)["samples_per_s"]
            overhead.append(cont / stop)
            print(json.dumps({"pair": i, "stop_samples_per_s": stop, "continue_samples_per_s": cont}), file=sys.stderr)
    rows = [r for r in rows if r["after_error"] is not None]  # runs whose survivors finished before settling
    result = {
        "algorithm": args.algorithm,
        "gpus_per_node": args.gpus_per_node if args.algorithm == "hadpsgd" else 1,
        "fault": args.fault,
        "workers": args.workers,
        "runs": len(rows),
        "median_abs_after_error": statistics.median(abs(r["after_error"]) for r in rows),
        "max_abs_after_error": max(abs(r["after_error"]) for r in rows),
        "measured_ratio_median": statistics.median(r["measured_ratio"] for r in rows),
        "predicted_ratio_median": statistics.median(r["predicted_ratio"] for r in rows),
        "continue_over_stop_samples_per_s": statistics.median(overhead) if overhead else None,
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
