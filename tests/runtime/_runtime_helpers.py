"""Shared helpers of the runtime tests: run a least-squares config and compare with the oracle."""

from __future__ import annotations

import glob
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from psgdlab.core.reference import LeastSquaresProblem, run_reference

#: topology schedules (dpsgd, adpsgd, hadpsgd) come from core/graphs/topology.py (branch `topo`)
HAS_TOPOLOGY = importlib.util.find_spec("psgdlab.core.graphs.topology") is not None
needs_topology = pytest.mark.skipif(not HAS_TOPOLOGY, reason="core.topology (branch topo) not merged yet")

#: float64 trajectories: the runtime and the oracle run the same arithmetic; allreduce sums in a
#: different order than numpy's mean, so allow a few ulps per step
TRAJECTORY_ATOL = 1e-10


def lsq_config(
    tmp_path: Path,
    algorithm: str,
    workers: int,
    *,
    steps: int = 12,
    backend: str = "gloo",
    name: str | None = None,
    **kw,
):
    from psgdlab.runtime.config import TrainConfig

    return TrainConfig(
        algorithm=algorithm,
        workers=workers,
        backend=backend,
        model="least-squares",
        steps=steps,
        batch=8,
        lr=0.05,
        lsq_dim=8,
        lsq_samples_per_worker=64,
        record_params=True,
        out=str(tmp_path / (name or f"{algorithm}-{backend}")),
        timeout_s=60.0,
        **kw,
    )


def reference_for(config) -> np.ndarray:
    from psgdlab.runtime.config import build_algorithm

    problem = LeastSquaresProblem(
        n_samples=config.lsq_samples_per_worker * config.workers,
        dim=config.lsq_dim,
        n_shards=config.workers,
        batch=config.batch,
        seed=config.seed,
    )
    return run_reference(build_algorithm(config), problem, steps=config.steps, lr=config.lr).params


def trajectory(config) -> np.ndarray:
    return np.load(Path(config.out) / "trajectory.npz")["params"]


def initial_full_loss(config) -> float:
    """Full-data loss of the least-squares problem at the starting point (zero weights)."""
    problem = LeastSquaresProblem(
        n_samples=config.lsq_samples_per_worker * config.workers,
        dim=config.lsq_dim,
        n_shards=config.workers,
        batch=config.batch,
        seed=config.seed,
    )
    _, b = problem.data()
    return float(0.5 * np.mean(b**2))


def leftover_segments(run_dir) -> list[str]:
    """What the run's ranks (pids in ``RUN/.ranks``) left in ``/dev/shm``."""
    from psgdlab.runtime.transports.shm.shm import segment_prefix

    pids = [int(f.read_text()) for f in (Path(run_dir) / ".ranks").glob("rank*.pid")]
    assert pids, f"no rank pid files in {run_dir}"
    return [name for pid in pids for name in glob.glob(f"/dev/shm/{segment_prefix(pid)}*")]


def train_fails(capsys, argv, pattern):
    """``psgdlab train ARGV`` exits with status 2 and one line on stderr that matches ``pattern``."""
    import re

    from psgdlab.cli import main

    status = main(["train", *argv])
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert len(err.splitlines()) == 1, err
    assert re.search(pattern, err), err
