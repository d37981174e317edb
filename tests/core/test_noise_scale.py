"""The gradient noise scale's estimators: exact on their expectations (hypothesis), unbiased on
simulated gradients, their smoothing and summary, and the direct estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.convergence.noise_scale import (
    NOISE_ROWS_DTYPE,
    NormPair,
    direct_noise_scale,
    smoothed_noise_scale,
    summarize_noise_scale,
    unbiased_terms,
)
from psgdlab.core.errors import ConfigError

positive = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)


@given(g2=positive, trace=positive, small=st.integers(1, 512), factor=st.integers(2, 64))
def test_the_estimators_return_the_truth_on_their_expectations(g2, trace, small, factor):
    # E|G_B|^2 = |G|^2 + tr(Sigma)/B: the estimators are linear, so exact on the expectations
    big = small * factor
    got = unbiased_terms(sq_small=g2 + trace / small, batch_small=small, sq_big=g2 + trace / big, batch_big=big)
    np.testing.assert_allclose(got, (g2, trace), rtol=1e-9, atol=1e-9 * (g2 + trace))


def test_the_estimators_are_unbiased_on_simulated_gradients(rng):
    # per-sample gradients G + noise with covariance diag(s^2): minibatch means of 4 and 32
    G = np.array([1.0, -2.0, 0.5])
    s = np.array([3.0, 1.0, 5.0])
    trace_true, g2_true = float(np.sum(s**2)), float(G @ G)
    draws = 20000
    small = G + s * rng.standard_normal((draws, 4, 3)).mean(axis=1)
    big_rest = G + s * rng.standard_normal((draws, 28, 3)).mean(axis=1)
    big = (4 * small + 28 * big_rest) / 32  # the small batch is part of the big one, as in the runtime
    pairs = [
        unbiased_terms(sq_small=float(a @ a), batch_small=4, sq_big=float(b @ b), batch_big=32)
        for a, b in zip(small, big, strict=True)
    ]
    g2, trace = np.array(pairs).T
    for est, true in ((g2, g2_true), (trace, trace_true)):
        se = float(np.std(est) / math.sqrt(draws))
        assert abs(float(np.mean(est)) - true) < 4 * se, (float(np.mean(est)), true, se)


def test_bad_batches_are_refused():
    with pytest.raises(ConfigError, match="batches"):
        unbiased_terms(sq_small=1.0, batch_small=8, sq_big=1.0, batch_big=8)
    with pytest.raises(ConfigError, match="squared norms"):
        NormPair(sq_small=-1.0, batch_small=1, sq_big=1.0, batch_big=2)


@given(ratio=positive, decay=st.floats(0.0, 0.99), n=st.integers(1, 50))
def test_smoothing_keeps_a_constant_ratio(ratio, decay, n):
    g2 = np.linspace(1.0, 3.0, n)
    out = smoothed_noise_scale(g2, ratio * g2, decay=decay)
    np.testing.assert_allclose(out, ratio, rtol=1e-9)


def test_smoothing_without_memory_is_each_estimates_ratio():
    out = smoothed_noise_scale([2.0, 1.0, -1.0], [4.0, 3.0, 1.0], decay=0.0)
    assert out[:2].tolist() == [2.0, 3.0] and math.isnan(out[2])


def _rows(steps, g2, trace, bs=8.0, bb=32.0):
    rows = np.zeros(len(steps), dtype=NOISE_ROWS_DTYPE)
    rows["step"] = steps
    rows["time_s"] = np.asarray(steps, dtype=float) / 10
    rows["batch_small"], rows["batch_big"] = bs, bb
    rows["sq_small"] = np.asarray(g2) + np.asarray(trace) / bs
    rows["sq_big"] = np.asarray(g2) + np.asarray(trace) / bb
    return rows


def test_the_summary_reads_the_second_half():
    # first half: noise scale 2; second half: 10 (the noise scale grows as training goes on)
    steps = np.arange(100)
    g2 = np.where(steps < 50, 5.0, 1.0)
    trace = np.where(steps < 50, 10.0, 10.0)
    s = summarize_noise_scale(_rows(steps, g2, trace), method="allreduce")
    assert s.noise_scale == pytest.approx(10.0)
    assert s.estimates == 100 and s.method == "allreduce"
    assert s.curve["step"][-1] == 99 and len(s.curve["noise_scale"]) <= 200
    assert s.noise_scale_log_sd is not None and s.noise_scale_log_sd > 0  # the EMA still moving from 2 to 10
    j = s.to_json()
    assert j["noise_scale"] == s.noise_scale and j["noise_scale_method"] == "allreduce"


def test_an_unresolved_signal_has_no_noise_scale():
    steps = np.arange(10)
    s = summarize_noise_scale(_rows(steps, np.full(10, -1.0), np.full(10, 5.0)), method="halves")
    assert s.noise_scale is None and "noise_scale" not in s.to_json()
    empty = summarize_noise_scale(np.zeros(0, dtype=NOISE_ROWS_DTYPE), method="none")
    assert empty.noise_scale is None and empty.estimates == 0


def test_the_direct_estimate_is_unbiased(rng):
    G = np.array([2.0, 0.0, -1.0, 0.5])
    s = np.array([4.0, 2.0, 2.0, 1.0])
    true = float(np.sum(s**2)) / float(G @ G)
    batch = 16
    grads = G + s * rng.standard_normal((4000, batch, 4)).mean(axis=1)
    got, g2, trace = direct_noise_scale(grads, batch=batch)
    assert got == pytest.approx(true, rel=0.05)
    assert g2 == pytest.approx(float(G @ G), rel=0.05) and trace == pytest.approx(float(np.sum(s**2)), rel=0.05)
    with pytest.raises(ConfigError, match="gradients"):
        direct_noise_scale(grads[:1], batch=batch)
