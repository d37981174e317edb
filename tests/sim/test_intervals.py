"""Prediction intervals (psgdlab.core.records.intervals, psgdlab.sim.predict): they hold their value, vanish
without uncertainty or noise, widen with the parameters' spread, follow correlation, cancel what
the speedup's baseline shares, and agree with Monte-Carlo quantiles on a small case."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.profile import Uncertainty
from psgdlab.core.records.intervals import (
    INTERVAL_KEYS,
    Spread,
    batch_log_step_times,
    central_sensitivities,
    directions,
    row_intervals,
    shifted,
)
from psgdlab.sim import predict as P
from psgdlab.sim.workload import load_config

NIC_BW = "platform.nic.bandwidth_bytes_per_s"
NIC_LAT = "platform.nic.latency_s"
PCIE_BW = "platform.pcie.bandwidth_bytes_per_s"
LOADER = "workload.loader_s_per_sample"

#: 2 hosts x 2 devices, a 20 MB model over 10 Gb/s: a 4-worker allreduce is a third of a step
NOISY = {
    "platform": {
        "name": "two-hosts",
        "hosts": 2,
        "devices_per_host": 2,
        "nic": {"latency_s": 1e-4, "bandwidth_bytes_per_s": 1.25e9},
    },
    "workload": {"n_params": 5_000_000, "compute": "lognormal:0.05:0.1", "batch_per_worker": 32, "reference_batch": 32},
    "defaults": {"algorithms": ["ssgd", "adpsgd"], "workers": [1, 2, 4]},
}
#: the same without randomness: constant compute plus a data loader that refills every step, so its
#: per-sample cost scales every step's compute-side time of every worker and of the baseline alike
STEADY = {
    "platform": NOISY["platform"],
    "workload": {
        "n_params": 2_000_000,
        "compute": "0.001",
        "batch_per_worker": 32,
        "reference_batch": 32,
        "loader_buffer_samples": 32,
        "loader_s_per_sample": 1e-3,
    },
}


def config(data, **uncertainty):
    c = load_config(data=data)
    return dataclasses.replace(c, uncertainty=Uncertainty(**uncertainty)) if uncertainty else c


def width(row, key):
    return math.log(row[f"{key}_high"] / row[f"{key}_low"])


def test_every_row_and_key_holds_its_value_and_says_what_the_interval_holds():
    c = config(
        NOISY,
        parameters=(NIC_BW, NIC_LAT, PCIE_BW),
        log_sd=(0.2, 0.5, 0.1),
        correlation=((1.0, 0.5, 0.0), (0.5, 1.0, 0.0), (0.0, 0.0, 1.0)),
        unpinned=(NIC_LAT,),
        noise_cv=0.03,
    )
    rows = [p.row for p in P.predict_sweep(c, ("ssgd", "adpsgd", "bmuf"), (1, 2, 4), steps=40)]
    for r in rows:
        for key in INTERVAL_KEYS:
            assert 0 < r[f"{key}_low"] <= r[key] <= r[f"{key}_high"], (r["algorithm"], r["workers"], key)
        assert r["interval"]["level"] == 0.9 and r["interval"]["parameters"] == [NIC_BW, NIC_LAT, PCIE_BW]
        assert r["interval"]["unpinned"] == [NIC_LAT] and r["has_unpinned_parameters"] is True
        assert r["interval"]["directions"] == 3 and r["interval"]["noise_cv"] == 0.03
    by = {(r["algorithm"], r["workers"]): r for r in rows}
    # the NIC carries only the 4-worker (2-host) rows' traffic: wider there than within a host
    assert width(by[("ssgd", 4)], "step_time_s") > 1.5 * width(by[("ssgd", 2)], "step_time_s")


def test_without_uncertainty_the_parameters_are_exact_and_only_the_window_noise_is_left():
    row = P.predict_one("ssgd", 4, config(NOISY), steps=60).row
    assert row["interval"]["parameters_exact"] is True and row["interval"]["parameters"] == []
    assert row["has_unpinned_parameters"] is False and row["interval"]["directions"] == 0
    log_sd = row["interval"]["log_sd"]
    assert log_sd["step_time_parameters"] == 0 and log_sd["step_time_run_to_run"] == 0
    assert 0 < log_sd["step_time_simulation"] < 0.02  # lognormal compute: a window has its own noise
    assert row["step_time_s_low"] < row["step_time_s"] < row["step_time_s_high"]


def test_zero_uncertainty_and_no_noise_give_a_degenerate_interval():
    c = config(STEADY, parameters=(NIC_BW, LOADER), log_sd=(0.0, 0.0), noise_cv=0.0)
    for name, n in (("ssgd", 4), ("adpsgd", 4), ("ssgd", 1)):
        row = P.predict_one(name, n, c, steps=40).row
        for key in INTERVAL_KEYS:
            assert row[f"{key}_low"] == pytest.approx(row[key], rel=1e-9)
            assert row[f"{key}_high"] == pytest.approx(row[key], rel=1e-9)


def test_a_wider_log_sd_gives_a_wider_interval():
    widths = []
    for sd in (0.05, 0.1, 0.2, 0.4):
        row = P.predict_one("ssgd", 4, config(NOISY, parameters=(NIC_BW,), log_sd=(sd,)), steps=60).row
        widths.append((width(row, "step_time_s"), width(row, "speedup")))
    for (t0, s0), (t1, s1) in itertools.pairwise(widths):
        assert t1 > t0 and s1 > s0


def test_correlation_decides_whether_two_parameters_add_or_cancel():
    # a dearer loader (log_sd 0.1) lengthens the step; a faster NIC (0.1) shortens it: moving
    # together (rho = +1) they offset, moving apart (rho = -1) they add
    w = {}
    for rho in (1.0, 0.0, -1.0):
        c = config(STEADY, parameters=(LOADER, NIC_BW), log_sd=(0.1, 0.1), correlation=((1, rho), (rho, 1)))
        w[rho] = width(P.predict_one("ssgd", 4, c, steps=60).row, "step_time_s")
    assert w[1.0] < w[0.0] < w[-1.0]
    # with sensitivities a and b: |a - b|, sqrt(a^2 + b^2) and a + b, so w0^2 = (w+^2 + w-^2) / 2
    assert w[0.0] ** 2 == pytest.approx((w[1.0] ** 2 + w[-1.0] ** 2) / 2, rel=0.05)


def test_a_parameter_the_baseline_shares_cancels_in_the_speedup():
    c = config(STEADY, parameters=(LOADER,), log_sd=(0.2,))
    one = P.predict_one("ssgd", 1, c, steps=60).row  # the baseline itself
    assert one["speedup_low"] == pytest.approx(1.0, rel=1e-9) and one["speedup_high"] == pytest.approx(1.0, rel=1e-9)
    assert width(one, "step_time_s") > 0.5  # 2 x 1.645 x 0.2
    overlapped = P.predict_one("adpsgd", 4, c, steps=60).row  # averages overlap: every step is loader time
    assert width(overlapped, "step_time_s") > 0.5
    assert width(overlapped, "speedup") < 0.01 * width(overlapped, "step_time_s")
    # ssgd's allreduce is not loader time: part of the parameter's effect stays in its speedup
    ssgd = P.predict_one("ssgd", 4, c, steps=60).row
    assert 0.05 * width(ssgd, "step_time_s") < width(ssgd, "speedup") < width(ssgd, "step_time_s")


def test_delta_interval_agrees_with_monte_carlo_quantiles():
    """The delta interval against 200 Monte-Carlo draws (parameter sets from the log-normal, each
    simulated with its own seed, so the window's noise is in both): the log half-widths agree
    within 20 % and each end within 4 % (the MC 5 % quantile's own standard error at 200 draws is
    about 0.15 sd, 9 % of the half-width); measured: half-width ratio 1.10 for the step time,
    1.14 for the speedup, ends within 3 %."""
    c = config(
        NOISY,
        parameters=(NIC_BW, NIC_LAT, PCIE_BW),
        log_sd=(0.2, 0.5, 0.1),
        correlation=((1.0, 0.5, 0.0), (0.5, 1.0, 0.0), (0.0, 0.0, 1.0)),
    )
    steps = 100
    row = P.predict_one("ssgd", 4, c, steps=steps).row
    chol = np.linalg.cholesky(np.asarray(c.uncertainty.covariance()))
    rng = np.random.default_rng(1)
    draws: dict[str, list[float]] = {"step_time_s": [], "speedup": []}
    for k in range(200):
        ck = shifted(c, dict(zip(c.uncertainty.parameters, chol @ rng.standard_normal(3), strict=True)))
        r = P.predict_one("ssgd", 4, ck, steps=steps, seed=1000 + k, intervals=False).row
        for key, values in draws.items():
            values.append(r[key])
    P._BASELINES.clear()
    for key, values in draws.items():
        q05, q95 = np.quantile(values, [0.05, 0.95])
        lo, hi = row[f"{key}_low"], row[f"{key}_high"]
        assert math.log(hi / lo) / math.log(q95 / q05) == pytest.approx(1.0, abs=0.2), key
        assert lo == pytest.approx(q05, rel=0.04) and hi == pytest.approx(q95, rel=0.04), key
        inside = np.mean((np.asarray(values) >= lo) & (np.asarray(values) <= hi))
        assert 0.8 <= inside <= 0.98, (key, inside)


def test_the_batch_means_noise_is_the_spread_of_the_window_over_seeds():
    """Measured: over 150 seeds the window's log step time scattered by 0.0047 (adpsgd) and 0.0050
    (ssgd), the batch-means estimate of one window was 0.0054 and 0.0052 on average."""
    c = config(NOISY)
    logs, estimates = [], []
    for seed in range(80):
        row = P.predict_one("adpsgd", 4, c, steps=100, seed=seed).row
        logs.append(math.log(row["step_time_s"]))
        estimates.append(row["interval"]["log_sd"]["step_time_simulation"])
    assert float(np.mean(estimates)) == pytest.approx(float(np.std(logs, ddof=1)), rel=0.3)


# ----- the math alone -------------------------------------------------------------------------
@st.composite
def uncertainties(draw):
    n = draw(st.integers(1, 4))
    sd = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    a = np.asarray(draw(st.lists(st.floats(-1, 1), min_size=n * n, max_size=n * n))).reshape(n, n)
    g = a @ a.T + 1e-3 * np.eye(n)
    d = np.sqrt(np.diag(g))
    corr = np.clip(g / np.outer(d, d), -1, 1)
    corr = (corr + corr.T) / 2
    np.fill_diagonal(corr, 1.0)
    return Uncertainty(
        parameters=tuple(f"p{i}" for i in range(n)),
        log_sd=tuple(sd),
        correlation=tuple(tuple(float(x) for x in row) for row in corr),
    )


@settings(max_examples=60, deadline=None)
@given(uncertainties())
def test_the_directions_rebuild_the_covariance(u):
    cov = np.asarray(u.covariance())
    rebuilt = np.zeros_like(cov)
    for shift in directions(u):
        v = np.asarray([shift.get(p, 0.0) for p in u.parameters])
        rebuilt += np.outer(v, v)
    assert np.allclose(rebuilt, cov, atol=1e-9 + 1e-9 * float(np.abs(cov).max()))


def test_perfectly_correlated_parameters_are_one_direction():
    u = Uncertainty(parameters=("a", "b"), log_sd=(0.1, 0.3), correlation=((1.0, 1.0), (1.0, 1.0)))
    (shift,) = directions(u)
    assert shift == pytest.approx({"a": 0.1, "b": 0.3})
    assert directions(Uncertainty(parameters=("a",), log_sd=(0.0,))) == () and directions(None) == ()


VALUES = {"step_time_s": 0.2, "samples_per_s": 640.0, "speedup": 3.0, "epoch_time_s": 100.0, "time_to_train_s": 5e3}
finite = st.floats(-1.0, 1.0)


def spread(sens, logs):
    logs = np.asarray(logs)
    return Spread(tuple(range(logs.size + 1)) if logs.size >= 2 else (), logs, tuple(sens))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(finite, min_size=0, max_size=4).flatmap(
        lambda d: st.tuples(st.just(d), st.lists(finite, min_size=len(d), max_size=len(d)))
    ),
    st.lists(st.floats(-0.1, 0.1), min_size=0, max_size=10),
    st.floats(0.0, 0.5),
    st.floats(1.0, 3.0),
)
def test_intervals_hold_the_value_and_never_narrow_when_the_sensitivities_grow(sens, logs, cv, factor):
    d, db = sens
    keys, _ = row_intervals(VALUES, spread(d, logs), spread(db, logs), noise_cv=cv)
    for key, v in VALUES.items():
        assert keys[f"{key}_low"] <= v <= keys[f"{key}_high"]
    wider, _ = row_intervals(
        VALUES, spread([factor * x for x in d], logs), spread([factor * x for x in db], logs), noise_cv=cv
    )
    for key in VALUES:
        assert wider[f"{key}_high"] >= keys[f"{key}_high"] * (1 - 1e-12)
        assert wider[f"{key}_low"] <= keys[f"{key}_low"] * (1 + 1e-12)


def test_paired_batches_cancel_and_unpaired_ones_add():
    logs = np.log([1.0, 1.1, 0.9, 1.05])
    same = Spread((0, 1, 2, 3, 4), logs, ())
    _, log_sd = row_intervals(VALUES, same, same)
    assert log_sd["speedup_simulation"] == 0 and log_sd["step_time_simulation"] > 0
    other = Spread((0, 2, 4, 6, 8), logs, ())
    _, log_sd = row_intervals(VALUES, same, other)
    assert log_sd["speedup_simulation"] == pytest.approx(math.sqrt(2) * log_sd["step_time_simulation"])


def test_batches_are_whole_sync_periods():
    from psgdlab.core.records.trace import PHASES, TRACE_DTYPE

    steps = 64
    t = np.zeros(steps, dtype=TRACE_DTYPE)
    t["phase"], t["step"] = PHASES["compute"], np.arange(steps)
    t["start_s"] = np.cumsum([2.0 if s % 8 == 0 else 1.0 for s in range(steps)])  # a sync every 8 steps
    bounds, logs = batch_log_step_times(t, warmup_steps=0, period=8)
    assert all(b % 8 == 0 for b in bounds) and len(bounds) >= 3
    assert np.ptp(logs) == pytest.approx(0.0, abs=1e-12)  # every batch holds one sync: no noise
    _, by_one = batch_log_step_times(t, warmup_steps=0, period=1)
    assert np.ptp(by_one) > 0.01  # batches that cut through periods see a noise that is not there


def test_a_shift_out_of_range_falls_back_to_a_one_sided_secant_and_an_impossible_one_says_so():
    # compute_fixed_s must stay <= the mean compute time (0.05 s): +10 % of 0.049 s leaves the range
    c = load_config(data={"platform": {}, "workload": {"compute": "0.05", "compute_fixed_s": 0.049}})
    seen = []

    def log_t(p):
        seen.append(p.get("workload.compute_fixed_s"))
        return 3.0 * math.log(p.get("workload.compute_fixed_s"))

    (d,) = central_sensitivities(log_t, c, [{"workload.compute_fixed_s": 0.1}])
    assert d == pytest.approx(0.3) and seen == [pytest.approx(0.049 * math.exp(-0.1)), 0.049]
    with pytest.raises(ConfigError, match="itemsize"):  # 4 B x e^(+-0.3) rounds to 5 B and 3 B
        central_sensitivities(log_t, c, [{"workload.itemsize": 0.3}])


def test_rows_with_more_processes_per_core_than_the_noise_was_measured_at_say_so(tmp_path, capsys):
    """This machine's shape (one host, 2 cores): noise measured with a core per worker covers the
    2-worker row; the 4- and 8-worker rows share the cores, and the row, the table and ``--json``
    say that their intervals carry a less loaded machine's noise."""
    import json

    from psgdlab.cli import main
    from psgdlab.core.platform.profile import HostCPU, Profile

    base = load_config(data=STEADY)
    platform = dataclasses.replace(
        base.platform, hosts=1, devices_per_host=8, host_cpu=HostCPU(cores_per_host=2, work_per_message_s=1e-4)
    )
    measured = Uncertainty(noise_cv=0.01, noise_processes_per_core=1.0)
    c = dataclasses.replace(base, platform=platform, uncertainty=measured)
    rows = {n: P.predict_one("ssgd", n, c, steps=20).row for n in (2, 4, 8)}
    assert [rows[n]["processes_per_core"] for n in (2, 4, 8)] == [1.0, 2.0, 4.0]
    assert [rows[n]["noise_extrapolated"] for n in (2, 4, 8)] == [False, True, True]
    assert rows[8]["interval"]["noise_processes_per_core"] == 1.0
    # unrecorded load (published figures) or no host cores (GPUs): nothing to say
    unknown = dataclasses.replace(c, uncertainty=Uncertainty(noise_cv=0.01))
    assert P.predict_one("ssgd", 8, unknown, steps=20).row["noise_extrapolated"] is False
    gpus = dataclasses.replace(c, platform=dataclasses.replace(platform, host_cpu=None))
    row = P.predict_one("ssgd", 8, gpus, steps=20).row
    assert row["processes_per_core"] is None and row["noise_extrapolated"] is False

    path = tmp_path / "p.toml"
    path.write_text(Profile(platform=c.platform, workload=c.workload, uncertainty=c.uncertainty).to_toml())
    args = ["predict", "--platform", str(path), "--algorithm", "ssgd", "--workers", "2,8", "--steps", "20"]
    assert main([*args, "--out", str(tmp_path / "t")]) == 0
    text = capsys.readouterr().out
    assert "noise measured at up to 1 worker processes per core" in text and "ssgdx8 (4)" in text
    assert "ssgdx2" not in text
    assert main([*args, "--json", "--out", str(tmp_path / "j")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["noise_extrapolated"] is True and [r["noise_extrapolated"] for r in out["rows"]] == [False, True]
