"""The typed calibration: read back from its JSON (property-based), one rendering for the fitted
profile's notes, ``psgdlab calibrate``'s output and ``psgdlab validate``'s table."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from psgdlab.analysis.calibrate import calibration_notes, fit_uncertainty
from psgdlab.analysis.calibration_report import (
    MAX_REL_RESIDUAL,
    Calibration,
    CalibrationNoise,
    LatencyBetweenHosts,
    Residuals,
    RunResidual,
)

positive = st.floats(1e-9, 1e9, allow_nan=False)
maybe_positive = st.none() | positive
paths = st.lists(st.text("abc/-0123", min_size=1, max_size=8), max_size=3).map(tuple)


def _link(**extra):
    return {
        "latency_s": 2e-4,
        "bandwidth_bytes_per_s": 1e9,
        "latency_log_sd": 0.1,
        "bandwidth_log_sd": 0.2,
        "log_correlation": 0.5,
        "samples": 40,
        "allreduce_samples": 20,
        "pairwise_samples": 20,
        "payload_sizes_bytes": [80_000, 1_600_000],
        "points": 4,
        "rms_residual_s": 1e-5,
        "max_rel_residual": 0.02,
        "unpinned": [],
        **extra,
    }


COMPUTE = {
    "kind": "lognormal",
    "mean_s": 0.05,
    "cv": 0.02,
    "p50_s": 0.05,
    "p95_s": 0.052,
    "sample_mean_s": 0.0501,
    "samples": 300,
    "ks_distance": 0.1,
    "spec": "lognormal:0.05:0.02",
    "step_overhead_fixed_s": 1e-5,
    "step_overhead_s_per_byte": 1e-10,
    "step_overhead_s": 1e-5 + 1e-10 * 1_600_000,
}

residuals = st.builds(
    Residuals,
    runs=st.lists(
        st.builds(
            RunResidual,
            run=st.text("abc-0123", min_size=1, max_size=8),
            predicted_step_time_s=positive,
            measured_step_time_s=positive,
            processes_per_core=maybe_positive,
        ),
        max_size=3,
    ).map(tuple),
    residual_cv=maybe_positive,
)
latencies = st.builds(
    LatencyBetweenHosts,
    runs=paths,
    log_latency_s=st.lists(st.floats(-20, 0), max_size=4).map(tuple),
    chi2=st.lists(positive, max_size=4).map(tuple),
    pinned=st.booleans(),
    latency_s=positive,
    latency_log_sd=maybe_positive,
    reduced_chi2=maybe_positive,
    log_errors=st.none() | st.lists(st.floats(-1, 1), max_size=3).map(tuple),
)
calibrations = st.builds(
    Calibration,
    compute=st.just(COMPUTE),
    link=st.just(_link(scatter=[0.8, 1.0, 1.3])),
    collective=st.none() | st.just(_link()),
    nic=st.none() | st.just(_link(collective=None, rate_bytes_per_s=2.5e7, hosts=2, allreduce_algorithm="ring")),
    between_hosts_busy=paths,
    server=st.none()
    | st.just(
        {"samples": 9, "median_excess_s": 1e-3, "memory_bandwidth_bytes_per_s": None, "service_overhead_s": 1e-3}
    ),
    link_source=st.just({"link": "runs", "collective": "runs"}),
    probe=st.none() | st.just("runs/probe"),
    noise=st.builds(
        CalibrationNoise,
        link_cv=maybe_positive,
        step_cv=maybe_positive,
        link_cv_used=positive,
        step_cv_used=positive,
        processes_per_core=maybe_positive,
    ),
    cores=st.none() | st.integers(1, 64),
    allreduce_algorithm=st.sampled_from(["ring", "halving-doubling", "direct"]),
    runs=paths,
    payload_bytes=st.lists(st.integers(8, 10**9), max_size=4).map(tuple),
    itemsize=st.none() | st.sampled_from([4, 8]),
    batch=st.none() | st.integers(1, 512),
    max_workers=st.integers(1, 16),
    residuals=st.none() | residuals,
    latency_between_hosts=st.none() | latencies,
)


@given(calibrations)
def test_a_calibration_is_read_back_from_its_json(calibration):
    obj = json.loads(json.dumps(calibration.to_json()))
    assert Calibration.from_json(obj) == calibration
    assert dict(calibration) == calibration.to_json()  # the mapping view is the JSON object
    assert ("residuals" in obj) == (calibration.residuals is not None)
    assert ("latency_between_hosts" in obj) == (calibration.latency_between_hosts is not None)


@given(calibrations)
def test_one_rendering_for_the_notes_the_terminal_and_the_table(calibration):
    """The fitted profile's notes are the runs, then describe(); every law it has is described,
    and one whose points miss it by more than MAX_REL_RESIDUAL is flagged."""
    u = fit_uncertainty(calibration)
    lines = calibration.describe(u)
    notes = calibration_notes(calibration, u)
    assert notes[0].startswith(f"Platform profile fitted by `psgdlab calibrate` from {len(calibration.runs)} run(s)")
    assert notes[1 + len(calibration.runs) :] == tuple(lines)
    text = "\n".join(lines)
    assert lines[0] == "Residuals of the fit:" and "Kolmogorov-Smirnov" in text and "allreduce schedule:" in text
    assert ("collective (allreduce, fitted apart" in text) and (
        ("not fitted apart" in text) == (calibration.collective is None)
    )
    assert ("between hosts: no runs between hosts" in text) == (calibration.nic is None)
    assert ("uncertainty: " in text) and "disagree" not in text
    has_residual = calibration.residuals is not None and calibration.residuals.residual_cv is not None
    assert ("rms log residual of the mean step" in text) == has_residual
    if has_residual:
        raised = calibration.residuals.residual_cv > calibration.noise.step_cv_used
        assert ("(raised to the residual)" in text) == raised
    bad = Calibration.from_json({**calibration.to_json(), "link": _link(max_rel_residual=2 * MAX_REL_RESIDUAL)})
    assert "the calibration runs disagree" in "\n".join(bad.describe())


def test_a_partial_calibration_takes_the_defaults_of_what_it_lacks():
    c = Calibration.from_json({"compute": {}, "link": {}, "noise": {"step_cv_used": 0.01}})
    assert c.noise == CalibrationNoise(step_cv_used=0.01) and c.nic is None and c.runs == ()
    assert c["between_hosts_busy"] == [] and c.allreduce_algorithm == "ring"
