"""Simulator throughput figures (printed, never a timed test), and the same cases against another tree.

Cases, each at 64, 256 and 1024 workers, on the interspeech2019-v100 preset widened to 128 hosts
so 1024 workers fit:

- AD-PSGD on the fixed ring and on the random ring, and H-ADPSGD (nodes of 8): simulated
  learner-steps per wall second (target >= 20,000 at 64 on one core; the cost of a step should
  not grow with the workers);
- SSGD: wall seconds per simulated iteration (all workers' steps);
- events per learner-step (SSGD: per iteration), the simpy events the simulation scheduled.

Speeds are per CPU second of the simulating process (``time.process_time``), which a machine
that other processes share disturbs less than the wall clock does.

``--against TREE`` runs every case in this tree and in ``TREE`` (a checkout of another commit,
say ``git worktree add /tmp/base b2d743b``), each run a fresh process, alternating between the
two ``--repeat`` times, and prints each tree's best run and the ratio new/old of the speeds
(above 1: this tree is faster). ``TREE`` is imported through ``PYTHONPATH``, so it must map its
folders into the package as a development checkout does (``psgdlab/core -> ../core``, and so on
for sim, runtime and analysis). With ``--record`` the trace rows are kept (as ``predict`` does)
and the Chrome timeline export of the fixed ring's trace is timed too.

Run: ``python bench/bench_sim.py [--record] [--against TREE] [--repeat K] [--cases NAME,...]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: name -> (algorithm, its arguments, workers, steps, what is reported): steps sized so that a
#: case takes about a second on an idle core on the faster of the trees compared
CASES: dict[str, tuple[str, dict[str, Any], int, int, str]] = {
    "adpsgd-fixed-64": ("adpsgd", {}, 64, 1000, "steps/s"),
    "adpsgd-fixed-256": ("adpsgd", {}, 256, 300, "steps/s"),
    "adpsgd-fixed-1024": ("adpsgd", {}, 1024, 60, "steps/s"),
    "adpsgd-random-64": ("adpsgd", {"variant": "random"}, 64, 400, "steps/s"),
    "adpsgd-random-256": ("adpsgd", {"variant": "random"}, 256, 30, "steps/s"),
    "adpsgd-random-1024": ("adpsgd", {"variant": "random"}, 1024, 4, "steps/s"),
    "hadpsgd-64": ("hadpsgd", {"gpus_per_node": 8}, 64, 500, "steps/s"),
    "hadpsgd-256": ("hadpsgd", {"gpus_per_node": 8}, 256, 100, "steps/s"),
    "hadpsgd-1024": ("hadpsgd", {"gpus_per_node": 8}, 1024, 20, "steps/s"),
    "ssgd-64": ("ssgd", {}, 64, 300, "s/iteration"),
    "ssgd-256": ("ssgd", {}, 256, 80, "s/iteration"),
    "ssgd-1024": ("ssgd", {}, 1024, 20, "s/iteration"),
}


def run_case(name: str, record: bool) -> dict[str, Any]:
    """Simulate case ``name`` once in this process: wall seconds, events, learner-steps."""
    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.sim import engine
    from psgdlab.sim.workload import load_config

    algorithm, kw, n, steps, _unit = CASES[name]
    cfg = load_config(preset="interspeech2019-v100")
    platform = dataclasses.replace(cfg.platform, hosts=128)
    alg = make_algorithm(algorithm, n_workers=n, **kw)
    t, cpu = time.perf_counter(), time.process_time()
    res = engine.simulate(alg, platform, cfg.workload, steps=steps, seed=0, record=record)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - t
    return {"cpu_s": cpu, "wall_s": wall, "events": res.events, "steps": steps, "workers": n, "engine": engine.__file__}


def timeline_export(record: bool) -> None:
    """Time the Chrome timeline export of the fixed ring's 64-worker trace."""
    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.core.records.trace import to_chrome_trace
    from psgdlab.sim.engine import simulate
    from psgdlab.sim.workload import load_config

    cfg = load_config(preset="interspeech2019-v100")
    platform = dataclasses.replace(cfg.platform, hosts=128)
    res = simulate(make_algorithm("adpsgd", n_workers=64), platform, cfg.workload, steps=300, seed=0, record=True)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        to_chrome_trace(res.trace, Path(tmp) / "timeline.json")
        wall = time.perf_counter() - t
    print("timeline export            records  records/s")
    print(f"{'':26}{len(res.trace):7d}  {len(res.trace) / wall:9,.0f}")


def _speed(name: str, got: dict[str, Any]) -> float:
    """Learner-steps per CPU second, or iterations per CPU second for SSGD (higher is faster)."""
    steps = got["steps"] * (1 if CASES[name][4] == "s/iteration" else got["workers"])
    return steps / got["cpu_s"]


def _shown(name: str, got: dict[str, Any]) -> str:
    if CASES[name][4] == "s/iteration":
        return f"{got['cpu_s'] / got['steps']:12.5f} s/it"
    return f"{_speed(name, got):12,.0f} st/s"


def _per_step(name: str, got: dict[str, Any]) -> float:
    return got["events"] / (got["steps"] * (1 if CASES[name][4] == "s/iteration" else got["workers"]))


def _in_process(name: str, record: bool, tree: Path | None) -> dict[str, Any]:
    """Run case ``name`` in a fresh process, importing ``tree``'s package when given."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, *(["--record"] if record else [])]
    out = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def against(tree: Path, names: list[str], repeat: int, record: bool) -> None:
    """Every case in this tree and in ``tree``, alternating, best of ``repeat`` each."""
    if not (tree / "psgdlab" / "sim").is_dir():
        raise SystemExit(
            f"--against {tree}: its package has no psgdlab/sim; make the development links "
            f"(for p in core sim runtime analysis; do ln -sfn ../$p {tree}/psgdlab/$p; done)"
        )
    print(f"this tree against {tree}, best of {repeat} alternating runs each, record={record}")
    print(f"{'case':20} {'this tree':>17} {'other tree':>17} {'new/old':>8} {'events/step new':>16} {'old':>6}")
    for name in names:
        best: dict[str, dict[str, Any]] = {}
        for _ in range(repeat):
            for side, where in (("new", None), ("old", tree)):
                got = _in_process(name, record, where)
                if side not in best or got["cpu_s"] < best[side]["cpu_s"]:
                    best[side] = got
        new, old = best["new"], best["old"]
        assert Path(old["engine"]).resolve().is_relative_to(tree.resolve()), old["engine"]
        ratio = _speed(name, new) / _speed(name, old)
        print(
            f"{name:20} {_shown(name, new):>17} {_shown(name, old):>17} {ratio:8.2f} "
            f"{_per_step(name, new):16.2f} {_per_step(name, old):6.2f}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="keep trace rows (as predict does)")
    ap.add_argument("--against", type=Path, metavar="TREE", help="also run every case in this checkout")
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs per tree with --against (default 3)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case names (default: all)")
    ap.add_argument("--one", metavar="CASE", help=argparse.SUPPRESS)  # a child process of --against
    args = ap.parse_args()
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown or args.repeat < 1:
        ap.error(f"cases {unknown} must be among {', '.join(CASES)}" if unknown else "--repeat must be >= 1")
    if args.one:
        print(json.dumps(run_case(args.one, args.record)))
        return
    if args.against is not None:
        against(args.against, names, args.repeat, args.record)
        return
    print(f"record trace rows: {args.record}")
    print(f"{'case':20} {'speed':>17} {'events/step':>12}")
    for name in names:
        got = run_case(name, args.record)
        print(f"{name:20} {_shown(name, got):>17} {_per_step(name, got):12.2f}", flush=True)
    if args.record:
        timeline_export(args.record)


if __name__ == "__main__":
    main()
