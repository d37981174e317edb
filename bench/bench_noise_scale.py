"""The gradient noise scale ``train`` estimates as it runs, against a direct estimate at one point,
and what the estimate costs.

1. **Agreement.** ``psgdlab train`` a model (FSDD's BiLSTM by default: ssgd on 2 workers, the
   allreduce route; ``--algorithm adpsgd`` for the halves route) with the noise scale every step,
   checkpointing the end; then, at the checkpointed model of rank 0, a *direct* estimate from
   ``--samples`` independent minibatch gradients of the same batch drawn from the same data
   (:func:`psgdlab.core.convergence.noise_scale.direct_noise_scale`). The training estimate compared with it
   is the pooled ratio of the run's last ``--window`` of steps (the training moves the point, so
   the run's second half, ``summary.json``'s ``noise_scale``, is printed beside it), and the
   smoothed series' last value.
2. **Cost**, side by side in this process on one core: the mean time of a minibatch gradient,
   of the two squared norms the allreduce route adds to a step, and of the same minibatch as two
   half-batch passes (the halves route's step), each over ``--repeat`` alternating rounds.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_noise_scale.py --data runs/fsdd.h5
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _train(args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "psgdlab", "train", "--algorithm", args.algorithm, "--workers", str(args.workers),
        "--model", args.model, "--data", str(args.data), "--held-out-speakers", "theo,george", "--batch",
        str(args.batch), "--steps", str(args.steps), "--lr", str(args.lr), "--lr-schedule", "const",
        "--noise-scale-every", "1", "--checkpoint-every", str(args.steps), "--evaluate-every-s", "1e6",
        "--seed", str(args.seed), "--out", str(out), "--json",
    ]  # fmt: skip
    if args.momentum is not None:
        cmd += ["--momentum", str(args.momentum)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO).stdout
    return json.loads(text[text.index("{") :])


def _window_ratio(rows: np.ndarray, first_step: int) -> float:
    from psgdlab.core.convergence.noise_scale import NOISE_ROWS_DTYPE, summarize_noise_scale

    late = rows[rows["step"] >= first_step]
    shifted = np.array(late, dtype=NOISE_ROWS_DTYPE)
    shifted["step"] = 1  # one "half": the whole window pooled
    got = summarize_noise_scale(shifted, method="window")
    return float(got.noise_scale) if got.noise_scale is not None else float("inf")


class _Moments:
    """Running float64 sums of gradients and of their squared norms: the same estimate as
    :func:`psgdlab.core.convergence.noise_scale.direct_noise_scale`
    (:math:`s^2 = (\\sum_k |g_k|^2 - m|\\bar g|^2)/(m-1)`) without holding the gradients."""

    def __init__(self) -> None:
        self.m = 0
        self.total: np.ndarray | None = None
        self.sq = 0.0

    def add(self, g: np.ndarray) -> None:
        g = np.asarray(g, dtype=np.float64).ravel()
        self.total = g.copy() if self.total is None else self.total + g
        self.sq += float(g @ g)
        self.m += 1

    def merged(self, other: _Moments) -> _Moments:
        out = _Moments()
        assert self.total is not None and other.total is not None
        out.m, out.total, out.sq = self.m + other.m, self.total + other.total, self.sq + other.sq
        return out

    def noise_scale(self, *, batch: float) -> tuple[float, float, float]:
        """``(noise_scale, |G|^2, tr)`` as
        :func:`~psgdlab.core.convergence.noise_scale.direct_noise_scale` gives them."""
        assert self.total is not None and self.m >= 2
        mean = self.total / self.m
        mean_sq = float(mean @ mean)
        s2 = (self.sq - self.m * mean_sq) / (self.m - 1)
        g2 = mean_sq - s2 / self.m
        trace = batch * s2
        return (trace / g2 if g2 > 0 else math.inf), g2, trace


def _check_moments() -> None:
    """:class:`_Moments` against :func:`direct_noise_scale` on random gradients (the bench stops if they differ)."""
    from psgdlab.core.convergence.noise_scale import direct_noise_scale

    g = np.random.default_rng(0).normal(0.3, 1.0, size=(50, 40))
    a, b = _Moments(), _Moments()
    for k, row in enumerate(g):
        (a if k < 25 else b).add(row)
    got, want = a.merged(b).noise_scale(batch=8), direct_noise_scale(g, batch=8)
    assert np.allclose(got, want, rtol=1e-9), (got, want)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / "runs" / "fsdd.h5")
    parser.add_argument("--model", default="blstm-small")
    parser.add_argument("--algorithm", default="ssgd")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16, help="windows per worker per step")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--window", type=int, default=60, help="the run's last steps pooled against the direct one")
    parser.add_argument("--samples", type=int, default=400, help="minibatch gradients of the direct estimate")
    parser.add_argument("--repeat", type=int, default=20, help="rounds of the cost measurement")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    from psgdlab.runtime.config import TrainConfig
    from psgdlab.runtime.loop import checkpoint as ckpt
    from psgdlab.runtime.train import build_workload

    torch.set_num_threads(1)
    _check_moments()
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        summary = _train(args, out)
        rows = np.load(out / "noise_scale.npz")["rows"]
        payload = ckpt.load_checkpoint(out, step=args.steps, rank=0, run_id=None)
    params = payload["params"]
    config = TrainConfig(
        algorithm="sgd", workers=1, model=args.model, data=str(args.data), held_out_speakers=("theo", "george"),
        batch=args.batch, steps=1, seed=args.seed + 1,
    )  # fmt: skip
    workload, _ = build_workload(config, 0)
    t0 = time.perf_counter()
    # the gradients one at a time (400 of them at once do not fit in memory: the process was killed)
    first, second = _Moments(), _Moments()
    for k in range(args.samples):
        g = workload.gradient(params, 0, 10_000 + k)[0].numpy()
        (first if k < args.samples // 2 else second).add(g)
    direct, g2, trace = first.merged(second).noise_scale(batch=args.batch)
    direct_s = time.perf_counter() - t0
    # the direct estimate's own spread: the same estimate on the two halves of the samples
    halves = [first.noise_scale(batch=args.batch)[0], second.noise_scale(batch=args.batch)[0]]
    window = _window_ratio(rows, args.steps - args.window)
    smooth_last = summary["noise_scale_curve"]["noise_scale"][-1]
    print(f"{args.algorithm} x{args.workers}, batch {args.batch}, {args.steps} steps ({summary['noise_scale_method']})")
    print(
        f"  direct at the last step: {direct:.4g} samples (|G|^2 {g2:.4g}, tr {trace:.4g}; {args.samples} "
        f"gradients, {direct_s:.0f} s; its two halves {halves[0]:.4g} and {halves[1]:.4g})"
    )
    print(f"  training, last {args.window} steps pooled: {window:.4g} ({window / direct - 1:+.1%})")
    print(f"  training, smoothed series at the end: {smooth_last:.4g} ({smooth_last / direct - 1:+.1%})")
    print(
        f"  training, second half (summary noise_scale): {summary['noise_scale']:.4g} "
        f"(log-sd {summary.get('noise_scale_log_sd')})"
    )
    # 2. cost, side by side
    x = params.clone()
    costs = {"gradient": [], "two norms": [], "two halves": []}
    for k in range(args.repeat):
        t = time.perf_counter()
        g, _ = workload.gradient(x, 0, k)
        costs["gradient"].append(time.perf_counter() - t)
        t = time.perf_counter()
        float(torch.dot(g, g))
        float(torch.dot(g, g))
        costs["two norms"].append(time.perf_counter() - t)
        t = time.perf_counter()
        workload.gradient_pair(x, 0, k)
        costs["two halves"].append(time.perf_counter() - t)
    base = float(np.median(costs["gradient"]))
    for name, ts in costs.items():
        print(f"  {name}: median {1e3 * float(np.median(ts)):.2f} ms ({float(np.median(ts)) / base:.3f} x a gradient)")


if __name__ == "__main__":
    main()
