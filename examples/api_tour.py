"""A tour of psgdlab's Python API (``psgdlab.api``): predict, plan, platforms, topologies, runs.

Run it as ``python examples/api_tour.py [OUT_DIR]``; it writes one prediction's run directory
into OUT_DIR (default: a temporary directory) and prints what each call returns. The test suite
runs it (tests/test_api.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import psgdlab


def main(out: Path) -> None:
    # a platform: a shipped preset (psgdlab preset list) or a TOML file
    config = psgdlab.load_platform("interspeech2019-v100")
    print(f"platform {config.platform.name}: {config.platform.devices_per_host} devices per host")

    # predict: the keywords are predict's flags, the rows what `predict --json` prints
    rows = psgdlab.predict(algorithm=["ssgd", "hadpsgd"], workers=[8, 64], steps=40)
    for r in rows:
        print(
            f"{r['algorithm']:>8} x{r['workers']:<3} speedup {r['speedup']:6.2f} step {r['step_time_s'] * 1e3:7.1f} ms"
        )

    # the same with a straggler and a run directory (no figures)
    slow = psgdlab.predict(
        algorithm="adpsgd", workers=8, steps=40, straggler="1:2", out=out / "predict", no_figures=True
    )
    print(f"adpsgd x8 with rank 1 twice as slow: speedup {slow[0]['speedup']:.2f}")

    # read a run back, typed: its summary, config and trace
    run = psgdlab.read_run(out / "predict" / "runs" / "adpsgd-w8")
    print(f"read back {run.case.label} x{run.case.workers}: {len(run.trace)} trace records")

    # a topology: its mixing matrix and spectral gap
    ring = psgdlab.topology("ring", workers=16)
    print(f"ring of 16: gap {ring.spectral_gap:.4f}, mixing time {ring['mixing_time']} rounds")

    # plan: the Pareto front of time to target against GPU-hours
    answer = psgdlab.plan(algorithm="ssgd,adpsgd", batches=[64], periods=[5], max_gpus=16, steps=20)
    best = answer["recommended"]
    print(f"plan: {best['config']} reaches {answer['target']} in {best['time_to_target_s'] / 3600:.1f} h")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as d:
            main(Path(d))
