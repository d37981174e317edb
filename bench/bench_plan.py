"""``psgdlab plan`` wall time: 2 mpi4py.futures worker ranks against 1, side by side in one run.

Each repeat runs the same plan (default workload and cluster, ``--max-gpus``) as
``mpiexec -n K python -m mpi4py.futures -m psgdlab plan --json --no-figures`` with K = 2 (one
worker rank beside the main rank, which only hands out chunks) and K = 3 (two worker ranks), in
alternating order, and prints each run's wall time (the command's own ``wall_s``, from parsing to
the answer, and the process's, interpreter start included), the ratios 1 rank / 2 ranks (target
>= 1.8 on 2 free cores; the machine is shared, so the median over repeats is the figure) and
whether every run gave the same answer. ``--jobs`` adds the same comparison for forked processes.

Run: ``.venv/bin/python bench/bench_plan.py [--max-gpus 64] [--repeats 2] [--jobs]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _mpiexec() -> str:
    """mpiexec beside the interpreter (the mpich wheel's), else on PATH."""
    import shutil

    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.is_file() else shutil.which("mpiexec")
    if found is None:
        raise SystemExit("no mpiexec beside the interpreter or on PATH (pip install mpich)")
    return found


def _plan(prefix: list[str], extra: list[str], out: Path) -> tuple[float, float, dict]:
    cmd = [*prefix, "plan", "--json", "--no-figures", "--out", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr[-2000:]}")
    answer = json.loads(res.stdout)
    return float(answer["wall_s"]), wall, answer


def _key(a: dict) -> str:
    return json.dumps({k: a[k] for k in ("candidates", "pareto", "recommended", "ties")}, sort_keys=True, default=float)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-gpus", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--jobs", action="store_true", help="also --jobs 1 against --jobs 2")
    args = ap.parse_args()
    extra = ["--max-gpus", str(args.max_gpus)]
    py = [sys.executable, "-m", "mpi4py.futures", "-m", "psgdlab"]
    cases = {"mpi 1 rank": [_mpiexec(), "-n", "2", *py], "mpi 2 ranks": [_mpiexec(), "-n", "3", *py]}
    if args.jobs:
        cli = [sys.executable, "-m", "psgdlab"]
        cases["jobs 1"] = [*cli]
        cases["jobs 2"] = [*cli]
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    answers = set()
    candidates = 0
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            names = list(cases) if rep % 2 == 0 else list(reversed(cases))
            for name in names:
                more = ["--jobs", name.split()[1]] if name.startswith("jobs") else []
                inner, outer, answer = _plan(cases[name], extra + more, Path(tmp) / f"{name}-{rep}".replace(" ", "_"))
                times[name].append((inner, outer))
                answers.add(_key(answer))
                candidates = answer["candidates"]
                print(f"{name:12s} repeat {rep}: {inner:6.1f} s in the command, {outer:6.1f} s in all", flush=True)
    print(f"{candidates} candidates; the same answer in every run: {len(answers) == 1}")
    for one, two in (("mpi 1 rank", "mpi 2 ranks"), ("jobs 1", "jobs 2")):
        if one not in times:
            continue
        ratios = [a[0] / b[0] for a, b in zip(times[one], times[two], strict=True)]
        outer = [a[1] / b[1] for a, b in zip(times[one], times[two], strict=True)]
        print(
            f"{one} / {two}: {statistics.median(ratios):.2f}x faster (command), {statistics.median(outer):.2f}x "
            f"(interpreters included); repeats {', '.join(f'{r:.2f}' for r in ratios)}"
        )


if __name__ == "__main__":
    main()
