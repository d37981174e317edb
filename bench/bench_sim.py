"""Simulator throughput figures (printed, never a timed test).

- AD-PSGD: simulated learner-steps per wall second at 16, 64 and 256 workers (target >= 20,000 at
  64 on one core; cost must grow at most linearly in workers, i.e. steps/s roughly flat);
- SSGD: wall seconds per simulated iteration (all workers' steps) at 64, 256 and 1024 workers
  (targets <= 0.02 s at 64 and <= 0.1 s at 1024);
- with ``--record``: the Chrome timeline export of the AD-PSGD 64-worker trace
  (:func:`psgdlab.core.trace.to_chrome_trace`, which ``predict`` runs for every row), records/s.

The platform is the interspeech2019-v100 preset widened to 128 hosts so 1024 workers fit.
Run: ``PYTHONPATH=$PWD python bench/bench_sim.py [--record]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from psgdlab.core.algorithms import make_algorithm
from psgdlab.core.trace import to_chrome_trace
from psgdlab.sim.engine import simulate
from psgdlab.sim.workload import load_config


def _timed(algorithm, platform, workload, steps, record):
    t = time.perf_counter()
    res = simulate(algorithm, platform, workload, steps=steps, seed=0, record=record)
    return time.perf_counter() - t, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--record", action="store_true", help="keep trace rows (as predict does)")
    args = ap.parse_args()
    cfg = load_config(preset="interspeech2019-v100")
    platform = dataclasses.replace(cfg.platform, hosts=128)
    w = cfg.workload
    print(f"record trace rows: {args.record}")
    print("AD-PSGD (fixed ring)      workers  learner-steps/s  events/step")
    for n, steps in ((16, 2000), (64, 1000), (256, 300)):
        wall, res = _timed(make_algorithm("adpsgd", n_workers=n), platform, w, steps, args.record)
        done = n * steps
        print(f"{'':26}{n:7d}  {done / wall:15,.0f}  {res.events / done:11.2f}")
    print("AD-PSGD (random matching) workers  learner-steps/s")
    for n, steps in ((64, 300),):
        wall, res = _timed(make_algorithm("adpsgd", n_workers=n, variant="random"), platform, w, steps, args.record)
        print(f"{'':26}{n:7d}  {n * steps / wall:15,.0f}")
    print("SSGD                      workers  wall s/iteration  events/iteration")
    for n, steps in ((64, 200), (256, 60), (1024, 20)):
        wall, res = _timed(make_algorithm("ssgd", n_workers=n), platform, w, steps, args.record)
        print(f"{'':26}{n:7d}  {wall / steps:16.4f}  {res.events / steps:16.0f}")
    print("H-ADPSGD                  workers  learner-steps/s")
    wall, res = _timed(make_algorithm("hadpsgd", n_workers=64, gpus_per_node=8), platform, w, 500, args.record)
    print(f"{'':26}{64:7d}  {64 * 500 / wall:15,.0f}")
    if args.record:
        _, res = _timed(make_algorithm("adpsgd", n_workers=64), platform, w, 300, True)
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            to_chrome_trace(res.trace, Path(tmp) / "timeline.json")
            wall = time.perf_counter() - t
        print("timeline export            records  records/s")
        print(f"{'':26}{len(res.trace):7d}  {len(res.trace) / wall:9,.0f}")


if __name__ == "__main__":
    main()
