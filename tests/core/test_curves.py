"""Reading the time to a target off a held-out curve (its decreasing isotonic fit)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.convergence.curves import monotone_fit, time_to_target
from psgdlab.core.errors import ConfigError

values = st.lists(st.floats(0.1, 10.0, allow_nan=False), min_size=1, max_size=30)


@given(values)
def test_the_fit_is_non_increasing_and_idempotent(ys):
    fit = monotone_fit(ys)
    assert np.all(np.diff(fit) <= 1e-12)
    np.testing.assert_allclose(monotone_fit(fit), fit, atol=1e-12)
    assert fit.sum() == pytest.approx(sum(ys))  # pooling keeps the sum


@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=20), st.floats(0.0, 1.0))
def test_a_decreasing_curve_is_read_by_linear_interpolation(drops, where):
    loss = 10.0 - np.cumsum([0.0, *drops])
    t = np.arange(loss.size, dtype=float) * 3.0
    target = float(loss[-1] + where * (loss[0] - loss[-1]))
    c = time_to_target({"time_s": t, "loss": loss, "epoch": t / 3.0}, target)
    assert c.reached
    expected = float(np.interp(-target, -loss, t))
    assert c.time_s == pytest.approx(expected, abs=1e-9)
    assert c.epoch == pytest.approx(expected / 3.0, abs=1e-9)


def test_a_noisy_dip_does_not_reach_the_target_early():
    # one lucky point at 20 s: the raw curve crosses 1.5 there, its trend only at 40 s
    curve = {"time_s": [0, 10, 20, 30, 40, 50], "loss": [3.0, 2.0, 1.45, 1.9, 1.5, 1.2]}
    assert time_to_target(curve, 1.5).time_s > 20.0


def test_a_target_never_reached_and_bad_curves():
    c = time_to_target({"time_s": [0, 1], "loss": [2.0, 1.0]}, 0.5)
    assert not c.reached and c.last_time_s == 1.0 and c.last_value == 1.0
    assert time_to_target({"time_s": [0, 1], "loss": [1.0, 0.9]}, 2.0).time_s == 0.0
    with pytest.raises(ConfigError, match="time_s"):
        time_to_target({"loss": [1.0]}, 0.5)
    with pytest.raises(ConfigError, match="one length"):
        time_to_target({"time_s": [0.0], "loss": [1.0, 2.0]}, 0.5)
