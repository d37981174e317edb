"""core.fitting: a MAP fit in log parameters that reports its uncertainty, flat directions and
cross-validated errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.stats.fitting import fit_parameters, median_abs

X = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])


def power_law(values, rows):
    return values["a"] * X[rows] ** (values["b"] - 1.0)


@given(
    a=st.floats(0.2, 5.0),
    b=st.floats(1.1, 1.9),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=25, deadline=None)
def test_known_parameters_are_recovered_within_the_reported_spread(a, b, seed):
    noise = 0.01
    y = power_law({"a": a, "b": b}, np.arange(X.size)) * np.exp(
        noise * np.random.default_rng(seed).standard_normal(X.size)
    )
    r = fit_parameters(power_law, y, {"a": 1.0, "b": 1.5}, {"a": 3.0, "b": 3.0}, noise=noise)
    for name, true in (("a", a), ("b", b)):
        assert abs(np.log(r.values[name] / true)) < 5 * r.log_sd[name] + 1e-9
    assert r.unpinned == () and r.flat_directions == ()
    assert r.log_sd["a"] < 0.1 and r.log_sd["b"] < 0.1


def test_a_product_the_figures_cannot_split_is_unpinned_and_reported_flat():
    y = 6.0 * X**0.5
    model = lambda v, rows: v["p"] * v["q"] * X[rows] ** 0.5
    r = fit_parameters(model, y, {"p": 2.0, "q": 2.0}, {"p": 0.5, "q": 0.5})
    assert r.values["p"] * r.values["q"] == pytest.approx(6.0, rel=1e-3)
    assert set(r.unpinned) == {"p", "q"}
    (d,) = r.flat_directions
    assert d["p"] * d["q"] < 0  # one goes up as the other goes down
    assert r.values["p"] == pytest.approx(r.values["q"], rel=1e-3)  # equal priors share the move
    # unequal priors split it by their variances (0.09 : 0.36), and the tight one pins the other
    r = fit_parameters(model, y, {"p": 2.0, "q": 2.0}, {"p": 0.3, "q": 0.6})
    assert np.log(r.values["q"] / 2) == pytest.approx(4 * np.log(r.values["p"] / 2), rel=1e-2)
    assert r.unpinned == ("p",)


def test_leave_one_group_out_sees_what_in_sample_hides():
    """A figure group that follows another law fits in sample (two parameters, few figures) but is
    mispredicted when left out."""
    x = np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0])
    group = ["g1", "g1", "g1", "g2", "g2", "g2"]
    y = np.where(np.array(group) == "g1", 2.0 * x, 5.0 * x)
    model = lambda v, rows: v["a"] * x[rows]
    r = fit_parameters(model, y, {"a": 3.0}, {"a": 2.0}, groups={"g": group}, loo=True)
    assert set(r.logo["g"]) == {"g1", "g2"}
    assert r.logo_error > 0.5  # left out, each group is predicted from the other: 2 vs 5
    assert r.in_sample_error < r.logo_error
    assert len(r.loo) == 6 and r.loo_error >= r.in_sample_error


def test_median_abs_and_bad_input():
    assert median_abs([0.1, -0.3, 0.2]) == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="must be positive figures"):
        fit_parameters(power_law, [1.0, -1.0], {"a": 1.0, "b": 1.5}, {"a": 1.0, "b": 1.0})
    with pytest.raises(ConfigError, match="prior spread of b"):
        fit_parameters(power_law, [1.0, 2.0], {"a": 1.0, "b": 1.5}, {"a": 1.0})
    with pytest.raises(ConfigError, match="one label per figure"):
        fit_parameters(power_law, [1.0, 2.0], {"a": 1.0, "b": 1.5}, {"a": 1.0, "b": 1.0}, groups={"g": [1]})
