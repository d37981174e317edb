"""``train``'s gradient noise scale against the closed form of least squares at a frozen point
(both routes: a gradient allreduce, two half-batch passes), and its held-out curve in wall time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from psgdlab.core.convergence.curves import time_to_target
from psgdlab.core.convergence.fit import REFERENCE_KEYS
from psgdlab.core.reference import LeastSquaresProblem

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


def _launch(config):
    from psgdlab.runtime.launcher.launch import launch

    return launch(config, quiet=True, timeout_s=90)


def _exact_noise_scale(config) -> float:
    """tr(Sigma)/|G|^2 of one sample's gradient at the start, x = 0: g_i = -a_i b_i."""
    problem = LeastSquaresProblem(
        n_samples=config.lsq_samples_per_worker * config.workers,
        dim=config.lsq_dim,
        n_shards=config.workers,
        batch=config.batch,
        seed=config.seed,
    )
    A, b = problem.data()
    g = -A * b[:, None]
    G = g.mean(axis=0)
    return float(np.sum(g.var(axis=0)) / (G @ G))


@pytest.mark.parametrize(("algorithm", "workers", "method"), [("ssgd", 2, "allreduce"), ("adpsgd", 2, "halves")])
def test_the_noise_scale_matches_the_closed_form_at_a_frozen_point(tmp_path, algorithm, workers, method):
    from psgdlab.runtime.config import TrainConfig

    # a rate of 1e-12 keeps every replica at x = 0, where the noise scale is known exactly
    config = TrainConfig(
        algorithm=algorithm,
        workers=workers,
        model="least-squares",
        lsq_dim=32,
        lsq_samples_per_worker=1024,
        batch=16,
        lr=1e-12,
        steps=300,
        noise_scale_every=1,
        out=str(tmp_path / algorithm),
        timeout_s=60.0,
    )
    summary = _launch(config)
    assert summary["noise_scale_method"] == method
    assert summary["noise_scale_estimates"] == workers * 300
    assert summary["noise_scale"] == pytest.approx(_exact_noise_scale(config), rel=0.05)
    rows = np.load(Path(config.out) / "noise_scale.npz")["rows"]
    assert rows.size == workers * 300 and set(np.unique(rows["rank"])) == set(range(workers))
    # every key a reference run needs (psgdlab.core.convergence.fit.REFERENCE_KEYS)
    on_disk = json.loads((Path(config.out) / "summary.json").read_text())
    assert set(REFERENCE_KEYS) <= set(on_disk)


def test_the_held_out_curve_in_wall_time_reads_a_time_to_target(tmp_path):
    from psgdlab.runtime.config import TrainConfig

    config = TrainConfig(
        algorithm="adpsgd",
        workers=2,
        model="least-squares",
        lsq_dim=16,
        lsq_samples_per_worker=512,
        batch=8,
        lr=0.02,
        steps=150,
        compute_time="0.02",  # 3 s: past the first pairwise exchange's connection (up to a second here)
        evaluate_every_s=0.2,
        out=str(tmp_path / "curve"),
        timeout_s=60.0,
    )
    summary = _launch(config)
    curve = summary["heldout_curve"]
    t = np.array(curve["time_s"])
    assert t[0] < 0.5 and np.all(np.diff(t) >= 0)  # from the start, in order
    assert curve["step"][-1] == 150 and len(t) >= 4  # the end, and the points between
    assert curve["epoch"][-1] == pytest.approx(150 * 2 * 8 / (512 * 2))
    assert curve["loss"][0] > 4 * curve["loss"][-1]  # the population loss of least squares falls
    assert summary["samples_per_epoch"] == 1024 and summary["batch_per_worker"] == 8
    half = 0.5 * (curve["loss"][0] + curve["loss"][-1])
    c = time_to_target(curve, half)
    assert c.reached and 0 < c.time_s < t[-1] and 0 < c.epoch < curve["epoch"][-1]
