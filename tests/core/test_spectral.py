"""Spectral gaps: closed forms of ALGORITHMS.md §B.2, DFT oracle, gap>0 iff connected, bounds (§E 5-8)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core import strategies as pst
from psgdlab.core.errors import ConfigError, InvalidMixingMatrixError, TestbedWarning
from psgdlab.core.graphs.mixing import is_connected, matching_matrix, pairwise_matrix
from psgdlab.core.graphs.spectral import (
    consensus_rate_bound,
    eigenvalues,
    estimate_expected_gram,
    expected_gram,
    lambda2,
    mixing_time,
    second_largest_modulus,
    sigma2,
    spectral_gap,
    spectral_gap_curve,
    topology_spectrum,
)
from psgdlab.core.graphs.topology import (
    complete,
    exponential_graph,
    fixed_ring,
    hierarchical,
    hypercube,
    random_ring,
    ring,
    torus,
)

CLOSED = 1e-9
EVEN = list(range(4, 130, 2))
POW2 = [2**r for r in range(1, 8)]


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TestbedWarning)
        return fn(*args, **kwargs)


# -- closed forms (§B.2, §E.7) --------------------------------------------------------------------
@pytest.mark.parametrize("n", EVEN)
def test_fixed_ring_expected_matrix_has_lambda2_cos2_pi_over_n(n):
    t = fixed_ring(n)
    E = expected_gram(t)
    np.testing.assert_allclose(E, 0.5 * (t.matrix(0) + t.matrix(1)), rtol=0, atol=1e-15)  # projections
    assert lambda2(E) == pytest.approx(math.cos(math.pi / n) ** 2, abs=CLOSED)
    assert eigenvalues(E)[-1] == pytest.approx(0.0, abs=CLOSED)
    s = topology_spectrum(t)
    assert s["matrix"] == "E[TT^T]"
    assert s["spectral_gap"] == pytest.approx(math.sin(math.pi / n) ** 2, abs=CLOSED)


@pytest.mark.parametrize("n", EVEN)
def test_deterministic_alternation_two_step_product_has_sigma2_cos_2pi_over_n(n):
    t = fixed_ring(n)
    P = t.matrix(1) @ t.matrix(0)
    assert sigma2(P) == pytest.approx(math.cos(2 * math.pi / n), abs=CLOSED)


@pytest.mark.parametrize("n", EVEN)
def test_random_ring_expected_matrix_closed_form(n):
    t = random_ring(n, seed=1)
    E = expected_gram(t)
    np.testing.assert_allclose(E, 0.5 * np.eye(n) + 0.5 * (np.ones((n, n)) - np.eye(n)) / (n - 1), atol=1e-15)
    assert lambda2(E) == pytest.approx((n - 2) / (2 * (n - 1)), abs=CLOSED)
    assert topology_spectrum(t)["spectral_gap"] == pytest.approx(n / (2 * (n - 1)), abs=CLOSED)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_random_ring_closed_form_agrees_with_monte_carlo(n):
    t = random_ring(n, seed=2)
    est, se = estimate_expected_gram(lambda g: t.matrix(int(g.integers(2**62))), samples=3000, rng=5)
    exact = expected_gram(t)
    assert np.all(np.abs(est - exact) <= 5 * se + 1e-12)
    tol = 5 * float(np.linalg.norm(se))
    assert abs(lambda2(est) - lambda2(exact)) <= tol
    sampled = expected_gram(t, samples=3000, rng=5)  # same draws through the public entry point
    np.testing.assert_allclose(sampled, est, rtol=0, atol=1e-15)


@pytest.mark.parametrize("n", range(3, 130))
def test_dpsgd_ring_lambda2(n):
    W = ring(n).matrix()
    assert lambda2(W) == pytest.approx((1 + 2 * math.cos(2 * math.pi / n)) / 3, abs=CLOSED)
    assert eigenvalues(W)[-1] >= -1 / 3 - CLOSED


@pytest.mark.parametrize("k", range(3, 12))
def test_square_torus_lambda2(k):
    W = torus(k * k).matrix()
    assert lambda2(W) == pytest.approx((3 + 2 * math.cos(2 * math.pi / k)) / 5, abs=CLOSED)
    if k % 2 == 0:
        assert eigenvalues(W)[-1] == pytest.approx(-3 / 5, abs=CLOSED)


@pytest.mark.parametrize("n", [4, 6, 8, 16, 31, 64, 128])
def test_lian_single_random_ring_edge_per_event(n):
    E = np.mean([pairwise_matrix(n, i, (i + 1) % n) for i in range(n)], axis=0)
    L = 2 * np.eye(n) - np.roll(np.eye(n), 1, axis=1) - np.roll(np.eye(n), -1, axis=1)
    np.testing.assert_allclose(E, np.eye(n) - L / (2 * n), atol=1e-15)
    assert lambda2(E) == pytest.approx(1 - 2 * math.sin(math.pi / n) ** 2 / n, abs=CLOSED)


@pytest.mark.parametrize("n, gap", [(8, 2 / 3), (16, 0.5), (32, 0.4), (64, 1 / 3), (128, 2 / 7)])
def test_exponential_graph_pattern(n, gap):
    assert lambda2(exponential_graph(n).matrix()) == pytest.approx(1 - 2 / math.log2(n), abs=CLOSED)
    assert topology_spectrum(exponential_graph(n))["gap_1_minus_lambda2"] == pytest.approx(gap, abs=CLOSED)


@pytest.mark.parametrize("n", [1, 2, 5, 16, 100])
def test_complete_graph(n):
    W = complete(n).matrix()
    assert second_largest_modulus(W) == pytest.approx(0.0, abs=CLOSED)
    assert spectral_gap(W) == pytest.approx(1.0, abs=CLOSED)
    assert topology_spectrum(complete(n))["spectral_gap"] == pytest.approx(1.0, abs=CLOSED)


@pytest.mark.parametrize("n", POW2)
def test_hypercube_product_of_the_r_matchings_is_exact_average(n):
    t = hypercube(n)
    r = int(math.log2(n))
    P = np.eye(n)
    for k in range(r):
        P = P @ t.matrix(k)
    np.testing.assert_allclose(P, np.full((n, n), 1 / n), rtol=0, atol=1e-14)
    assert lambda2(expected_gram(t)) == pytest.approx(1 - 1 / r if n > 2 else 0.0, abs=CLOSED)


@pytest.mark.parametrize("n_nodes, m", [(2, 4), (4, 2), (8, 8), (16, 4)])
def test_hierarchical_gap_is_that_of_the_super_learner_ring(n_nodes, m):
    h = hierarchical(n_nodes * m, m)
    assert lambda2(expected_gram(h)) == pytest.approx(lambda2(expected_gram(fixed_ring(n_nodes))), abs=CLOSED)
    assert topology_spectrum(h)["spectral_gap"] == pytest.approx(
        math.sin(math.pi / n_nodes) ** 2 if n_nodes > 2 else 1.0, abs=CLOSED
    )
    hr = hierarchical(n_nodes * m, m, inner="random-ring", seed=4)
    assert lambda2(expected_gram(hr)) == pytest.approx((n_nodes - 2) / (2 * (n_nodes - 1)), abs=CLOSED)


def test_hierarchical_8x8_is_61_times_better_than_a_flat_64_ring():
    ratio = topology_spectrum(hierarchical(64, 8))["spectral_gap"] / topology_spectrum(fixed_ring(64))["spectral_gap"]
    assert ratio == pytest.approx(math.sin(math.pi / 8) ** 2 / math.sin(math.pi / 64) ** 2, rel=1e-9)
    assert 60 < ratio < 62


@pytest.mark.parametrize(
    "n, fixed, randomized",
    [(8, 0.14645, 0.57143), (16, 0.03806, 0.53333), (64, 0.002408, 0.50794), (128, 0.000602, 0.50394)],
)
def test_table_of_section_b2(n, fixed, randomized):
    assert topology_spectrum(fixed_ring(n))["spectral_gap"] == pytest.approx(fixed, rel=5e-4)
    assert topology_spectrum(random_ring(n))["spectral_gap"] == pytest.approx(randomized, rel=5e-5)


# -- circulant oracle independent of the eigensolver ----------------------------------------------
def dft_spectrum(first_row: np.ndarray) -> np.ndarray:
    """Eigenvalues of a circulant matrix: the DFT of its first row (real for symmetric ones)."""
    lam = np.fft.fft(first_row)
    assert np.max(np.abs(lam.imag)) < 1e-12
    return np.sort(lam.real)[::-1]


def assert_circulant(W: np.ndarray) -> None:
    for i in range(W.shape[0]):
        np.testing.assert_array_equal(W[i], np.roll(W[0], i))


@given(n=st.integers(3, 64), kind=st.sampled_from(["ring", "exponential", "complete", "fixed-ring E", "random-ring E"]))
def test_circulant_spectra_match_the_dft_of_the_first_row(n, kind):
    if kind == "ring":
        W = ring(n).matrix()
    elif kind == "exponential":
        W = exponential_graph(n).matrix()
    elif kind == "complete":
        W = complete(n).matrix()
    else:
        n += n % 2
        W = expected_gram(fixed_ring(n) if kind == "fixed-ring E" else random_ring(n))
    assert_circulant(W)
    np.testing.assert_allclose(eigenvalues(W), dft_spectrum(W[0]), rtol=0, atol=1e-10)


@pytest.mark.parametrize("n", [9, 12, 16, 20, 25, 36])
def test_torus_spectrum_matches_the_2d_dft(n):
    from psgdlab.core.graphs.topology import torus_shape

    r, c = torus_shape(n)
    W = torus(n).matrix()
    kernel = W[0].reshape(r, c)  # block-circulant with circulant blocks
    lam = np.fft.fft2(kernel)
    np.testing.assert_allclose(eigenvalues(W), np.sort(lam.real.ravel())[::-1], rtol=0, atol=1e-10)


# -- gap > 0 iff connected (§E.6) ----------------------------------------------------------------
@given(S=pst.symmetric_doubly_stochastic_matrices(n=st.integers(2, 10), max_terms=4))
def test_gap_is_positive_iff_the_support_graph_is_connected(S):
    W = 0.5 * (np.eye(S.shape[0]) + S)  # positive diagonal -> aperiodic
    ev = eigenvalues(W)
    assert ev[-1] > -1 + 1e-9  # lambda_n > -1 always
    gap = quiet(spectral_gap, W)
    assert (gap > 1e-9) == is_connected(W)


@pytest.mark.parametrize("n", [4, 6, 10, 32])
def test_single_matching_has_gap_zero_and_warns(n):
    T = fixed_ring(n).matrix(0)
    with pytest.warns(TestbedWarning, match=r"spectral gap of W is 0 < 1e-09: effectively disconnected"):
        assert spectral_gap(T) == 0.0
    assert lambda2(T) == pytest.approx(1.0, abs=CLOSED)


def test_two_workers_single_matching_is_the_exact_average():
    assert spectral_gap(matching_matrix([1, 0])) == pytest.approx(1.0)


# -- contraction bounds (§E.5) -------------------------------------------------------------------
@given(W=pst.mixing_matrices(topology=pst.topologies(max_workers=16)), seed=st.integers(0, 2**32 - 1))
def test_one_round_contracts_by_sigma2_squared(W, seed):
    theta = np.random.default_rng(seed).normal(size=(3, W.shape[0]))
    c = lambda x: float(np.sum((x - x.mean(axis=1, keepdims=True)) ** 2))
    assert c(theta @ W) <= sigma2(W) ** 2 * c(theta) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize(
    "topology",
    [
        random_ring(8, seed=3),
        random_ring(16, seed=4),
        hierarchical(16, 2, inner="random-ring", seed=5),
        fixed_ring(10),
        hypercube(8),
    ],
    ids=str,
)
def test_monte_carlo_consensus_contraction_is_below_lambda2_of_expected_gram(topology):
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(4, topology.n_workers))
    x = theta - theta.mean(axis=1, keepdims=True)
    c0 = float(np.sum(x**2))
    period = topology.period
    ratios = np.array(
        [float(np.sum((x @ topology.matrix(int(rng.integers(period or 2**62)))) ** 2)) / c0 for _ in range(1500)]
    )
    bound = consensus_rate_bound(topology)
    assert ratios.mean() <= bound + 4 * ratios.std(ddof=1) / math.sqrt(ratios.size)
    # the bound is the exact expectation for the worst direction: tr(X E X^T)/||X||^2 <= lambda2(E)
    E = expected_gram(topology)
    assert float(np.trace(x @ E @ x.T)) / c0 <= bound + 1e-12


def test_consensus_rate_of_static_symmetric_w_is_rho_squared():
    for t in (ring(9), torus(16), exponential_graph(12)):
        W = t.matrix()
        assert consensus_rate_bound(t) == pytest.approx(second_largest_modulus(W) ** 2, abs=1e-12)
        assert consensus_rate_bound(t) == pytest.approx(sigma2(W) ** 2, abs=1e-12)
        assert topology_spectrum(t)["consensus_rate"] == pytest.approx(consensus_rate_bound(t), abs=1e-12)


# -- mixing time ------------------------------------------------------------------------------------
@pytest.mark.parametrize("topology", [fixed_ring(16), random_ring(16), ring(7), torus(16), hypercube(32)], ids=str)
def test_mixing_time_is_the_smallest_k_with_bound_to_the_k_below_tol(topology):
    bound = consensus_rate_bound(topology)
    for tol in (1e-2, 1e-6, 1e-12):
        k = mixing_time(topology, tol)
        assert isinstance(k, int)
        assert bound**k <= tol < bound ** (k - 1)


def test_mixing_time_of_fixed_ring_16():
    assert mixing_time(fixed_ring(16), 1e-6) == math.ceil(math.log(1e-6) / math.log(math.cos(math.pi / 16) ** 2))


def test_mixing_time_of_exact_average_is_one_round():
    assert mixing_time(complete(8)) == 1
    assert mixing_time(hierarchical(8, 8)) == 1


@pytest.mark.parametrize("tol", [0.0, 1.0, -1e-3, "x", True])
def test_mixing_time_rejects_bad_tolerances(tol):
    with pytest.raises(ConfigError, match=r"tol \(.*\) must be a number in \(0, 1\)"):
        mixing_time(ring(5), tol)


# -- eigenvalues, lambda2 and friends ------------------------------------------------------------
def test_eigenvalues_of_a_non_symmetric_matrix_are_sorted_by_modulus():
    t = fixed_ring(8)
    P = t.matrix(1) @ t.matrix(0)
    ev = eigenvalues(P)
    assert np.iscomplexobj(ev) and ev[0] == pytest.approx(1.0)
    assert np.all(np.diff(np.abs(ev)) <= 1e-12)
    assert second_largest_modulus(P) == pytest.approx(abs(ev[1]))
    with pytest.raises(InvalidMixingMatrixError, match=r"lambda2 needs a symmetric matrix.*second_largest_modulus"):
        lambda2(P)


def test_spectral_functions_validate_their_input():
    with pytest.raises(InvalidMixingMatrixError, match=r"row 0 sums to 2"):
        spectral_gap([[1.0, 1.0], [0.0, 1.0]])
    with pytest.raises(InvalidMixingMatrixError, match="square"):
        sigma2(np.ones((2, 3)))


def test_one_worker_has_nothing_to_mix():
    assert lambda2([[1.0]]) == 0.0 and second_largest_modulus([[1.0]]) == 0.0 and sigma2([[1.0]]) == 0.0


def test_topology_spectrum_keys_and_static_vs_expected():
    s = topology_spectrum(ring(8))
    assert s["matrix"] == "W" and s["period"] == 1
    assert s["rho"] == pytest.approx(max(abs(s["lambda2"]), abs(s["lambda_min"])))
    assert s["spectral_gap"] == pytest.approx(1 - s["rho"])
    assert s["gap_expected_gram"] == pytest.approx(1 - s["rho"] ** 2)
    assert {"workers", "lambda2", "rho", "spectral_gap", "gap_1_minus_lambda2", "period"} <= set(s)
    r = topology_spectrum(random_ring(8))
    assert r["matrix"] == "E[TT^T]" and r["period"] is None
    assert r["spectral_gap"] == pytest.approx(r["gap_expected_gram"])


def test_expected_gram_and_estimator_errors():
    with pytest.raises(ConfigError, match=r"samples \(1\) must be an integer >= 2"):
        estimate_expected_gram(lambda g: np.eye(2), samples=1)
    with pytest.raises(ConfigError, match=r"topology \('ring'\) must be a Topology"):
        expected_gram("ring")
    with pytest.raises(ConfigError, match=r"must be a Topology"):
        consensus_rate_bound(np.eye(3))


def test_expected_gram_of_a_periodic_schedule_is_the_period_average():
    t = hypercube(8)
    np.testing.assert_allclose(expected_gram(t), np.mean([t.matrix(k) for k in range(3)], axis=0), atol=1e-15)
    # a Monte Carlo estimate over uniformly drawn rounds converges to the same matrix
    est = expected_gram(t, samples=4000, rng=1)
    np.testing.assert_allclose(est, expected_gram(t), rtol=0, atol=0.03)


def test_spectral_gap_curve_skips_invalid_counts():
    curve = spectral_gap_curve("fixed-ring", [3, 4, 5, 8])
    assert [n for n, _ in curve] == [4, 8]
    assert curve[1][1] == pytest.approx(math.sin(math.pi / 8) ** 2, abs=CLOSED)
    h = spectral_gap_curve("hierarchical", [8, 12, 16], gpus_per_node=4, inner="random-ring")
    assert [n for n, _ in h] == [8, 16]
    assert h[1][1] == pytest.approx(topology_spectrum(hierarchical(16, 4, inner="random-ring"))["spectral_gap"])


def test_mixing_time_is_infinite_and_warns_when_the_bound_is_one(monkeypatch):
    """No built-in topology is disconnected, so force the bound to 1 to reach this documented path."""
    import psgdlab.core.graphs.spectral as spectral

    monkeypatch.setattr(spectral, "consensus_rate_bound", lambda topology: 1.0)
    with pytest.warns(TestbedWarning, match=r"effectively disconnected"):
        assert spectral.mixing_time(ring(5)) == math.inf
