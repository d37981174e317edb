"""The shipped librispeech-gtx1080 preset reproduces Tables 4 and 5 of Li et al. (ALGORITHMS.md
§D.3) within 5 % when the simulator is re-run with it."""

from __future__ import annotations

import pytest

from psgdlab.sim.fit import PARAM_NAMES, TABLE_TARGETS, gtx1080_profile, simulated_speedups
from psgdlab.sim.workload import load_config


def _fitted_params() -> dict[str, float]:
    cfg = load_config(preset="librispeech-gtx1080")
    w, p = cfg.workload, cfg.platform
    from psgdlab.core.timing import ComputeTime

    return {
        "compute_fixed_s": w.compute_fixed_s,
        "cv": ComputeTime.parse(w.compute).spread,
        "pcie_bandwidth_bytes_per_s": p.pcie.bandwidth_bytes_per_s,
        "input_bytes_per_sample": w.input_bytes_per_sample,
        "loader_s_per_sample": w.loader_s_per_sample,
        "loader_buffer_samples": w.loader_buffer_samples,
        "server_bandwidth_bytes_per_s": p.server.bandwidth_bytes_per_s,
        "service_overhead_s": p.server.service_overhead_s,
    }


def test_preset_is_the_fit_layout():
    params = _fitted_params()
    assert set(params) == set(PARAM_NAMES)
    fitted, shipped = gtx1080_profile(params), load_config(preset="librispeech-gtx1080")
    assert fitted.platform == shipped.platform
    assert fitted.workload == shipped.workload
    assert fitted.defaults == shipped.defaults


@pytest.fixture(scope="module")
def speedups():
    return simulated_speedups(_fitted_params())


@pytest.mark.parametrize("key", list(TABLE_TARGETS), ids=lambda k: f"{k[0]}-mb{k[1]}-p{k[2]}")
def test_table_entry_within_5_percent(speedups, key):
    assert speedups[key] == pytest.approx(TABLE_TARGETS[key], rel=0.05)


def test_predict_uses_the_preset_like_the_fit():
    from dataclasses import replace

    from psgdlab.sim.predict import predict_one

    cfg = load_config(preset="librispeech-gtx1080")
    cfg = replace(cfg, workload=cfg.workload.with_batch(4096))
    row = predict_one("bmuf", 4, cfg, period=80, steps=960).row
    assert row["speedup"] == pytest.approx(TABLE_TARGETS[("bmuf", 4096, 80)], rel=0.05)
