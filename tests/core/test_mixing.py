"""Mixing matrices: validation messages, weight rules, pairwise and matching matrices (ALGORITHMS.md §E 1-5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core import strategies as pst
from psgdlab.core.errors import InvalidMixingMatrixError, TopologyError
from psgdlab.core.graphs.mixing import (
    check_adjacency,
    check_matching,
    check_mixing_matrix,
    is_connected,
    is_doubly_stochastic,
    matching_matrix,
    metropolis_hastings_weights,
    pairwise_matrix,
    support_components,
    uniform_weights,
)
from psgdlab.core.graphs.spectral import sigma2

TOL = 1e-12


def consensus_distance(theta: np.ndarray) -> float:
    """C(Theta) = ||Theta - mean 1^T||_F^2 with learners as columns."""
    return float(np.sum((theta - theta.mean(axis=1, keepdims=True)) ** 2))


def assert_doubly_stochastic(W: np.ndarray, atol: float = TOL) -> None:
    assert W.min() >= -atol
    np.testing.assert_allclose(W.sum(axis=0), 1.0, rtol=0, atol=atol)
    np.testing.assert_allclose(W.sum(axis=1), 1.0, rtol=0, atol=atol)


# -- check_mixing_matrix: every documented message ------------------------------------------------
@pytest.mark.parametrize(
    "W, match",
    [
        (np.ones((2, 3)) / 3, r"must be a square 2-D matrix; got shape \(2, 3\)"),
        (np.ones(4) / 4, r"must be a square 2-D matrix; got shape \(4,\)"),
        (np.zeros((0, 0)), r"must be a square 2-D matrix; got shape \(0, 0\)"),
        ([[1.0, np.nan], [0.0, 1.0]], r"entry \[0, 1\] is nan; entries must be finite"),
        ([[1.2, -0.2], [-0.2, 1.2]], r"entry \[0, 1\] is -0.2 < 0 \(atol 1e-10\); mixing weights must be non-negative"),
        (
            [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.9]],
            r"row 2 sums to 0.9 \(misses 1 by -0.1, atol 1e-10\); did you forget the self weight\?",
        ),
        ([[0.5, 0.5], [0.3, 0.7]], r"column 0 sums to 0.8 \(misses 1 by -0.2, atol 1e-10\); did you forget"),
        ([["a", "b"], ["c", "d"]], r"must be a numeric array"),
    ],
)
def test_check_mixing_matrix_messages(W, match):
    with pytest.raises(InvalidMixingMatrixError, match=match):
        check_mixing_matrix(W)


def test_check_mixing_matrix_symmetry_message_names_largest_asymmetry():
    W = np.array([[0.2, 0.5, 0.3], [0.3, 0.2, 0.5], [0.5, 0.3, 0.2]])  # doubly stochastic, circulant
    assert check_mixing_matrix(W).dtype == np.float64
    with pytest.raises(
        InvalidMixingMatrixError,
        match=r"not symmetric: largest asymmetry \|W\[0, 1\] - W\[1, 0\]\| = 0.2 \(atol 1e-10\)",
    ):
        check_mixing_matrix(W, symmetric=True)


def test_check_mixing_matrix_tolerance_is_a_keyword():
    W = np.array([[0.5, 0.5], [0.5, 0.5 + 1e-8]])
    with pytest.raises(InvalidMixingMatrixError, match="row 1"):
        check_mixing_matrix(W)
    assert check_mixing_matrix(W, atol=1e-6) is not None
    assert not is_doubly_stochastic(W) and is_doubly_stochastic(W, atol=1e-6)


def test_is_doubly_stochastic_rejects_only_stochastic_matrices():
    row_stochastic = np.array([[0.5, 0.5], [1.0, 0.0]])
    assert not is_doubly_stochastic(row_stochastic)
    assert is_doubly_stochastic(np.eye(3))


# -- adjacency and weight rules -------------------------------------------------------------------
@pytest.mark.parametrize(
    "A, match",
    [
        (np.zeros((2, 3)), r"adjacency must be a square 2-D matrix; got shape \(2, 3\)"),
        ([[0, 2], [2, 0]], r"adjacency entry \[0, 1\] is 2; entries must be 0 or 1"),
        ([[1, 1], [1, 0]], r"self loop at node 0; the self weight is set by the weight rule"),
        (
            [[0, 1, 0], [0, 0, 1], [0, 1, 0]],
            r"not symmetric: A\[0, 1\] = 1 but A\[1, 0\] = 0; the graph must be undirected",
        ),
        ([["x"]], r"adjacency must be numeric"),
    ],
)
def test_check_adjacency_messages(A, match):
    with pytest.raises(TopologyError, match=match):
        check_adjacency(A)
    with pytest.raises(TopologyError, match=match):
        metropolis_hastings_weights(A)
    with pytest.raises(TopologyError, match=match):
        uniform_weights(A)


@st.composite
def undirected_graphs(draw, max_n=12):
    n = draw(st.integers(1, max_n))
    upper = draw(st.lists(st.booleans(), min_size=n * (n - 1) // 2, max_size=n * (n - 1) // 2))
    A = np.zeros((n, n), dtype=bool)
    A[np.triu_indices(n, 1)] = upper
    return A | A.T


@given(A=undirected_graphs(), rule=st.sampled_from([metropolis_hastings_weights, uniform_weights]))
def test_weight_rules_are_symmetric_doubly_stochastic_with_positive_diagonal(A, rule):
    W = rule(A)
    assert_doubly_stochastic(W)
    np.testing.assert_array_equal(W, W.T)
    assert np.all(np.diag(W) > 0)
    off = ~np.eye(len(A), dtype=bool)
    np.testing.assert_array_equal(W[off] > 0, A[off])  # support is exactly the graph


@given(n=st.integers(3, 30), k=st.integers(1, 4))
def test_uniform_weights_of_a_regular_graph_are_one_over_degree_plus_one(n, k):
    hops = sorted({h for h in range(1, k + 1) if h % n and (n - h) % n})
    A = np.zeros((n, n), dtype=int)
    for h in hops:
        for i in range(n):
            A[i, (i + h) % n] = A[(i + h) % n, i] = 1
    deg = int(A[0].sum())
    W = uniform_weights(A)
    np.testing.assert_allclose(W[A == 1], 1.0 / (deg + 1), rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.diag(W), 1.0 / (deg + 1), rtol=0, atol=1e-15)
    np.testing.assert_allclose(metropolis_hastings_weights(A), W, rtol=0, atol=1e-15)  # regular: same rule


def test_uniform_weights_on_an_irregular_graph_uses_the_maximum_degree():
    star = np.zeros((4, 4), dtype=int)
    star[0, 1:] = star[1:, 0] = 1
    W = uniform_weights(star)
    np.testing.assert_allclose(W[0], [0.25, 0.25, 0.25, 0.25])
    np.testing.assert_allclose(W[1], [0.25, 0.75, 0.0, 0.0])
    M = metropolis_hastings_weights(star)
    np.testing.assert_allclose(M, W)  # on a star both rules coincide (max degree at every edge)


# -- pairwise and matching matrices ---------------------------------------------------------------
def test_pairwise_matrix_is_identity_plus_averaging_block():
    W = pairwise_matrix(4, 1, 3)
    e = np.eye(4)
    np.testing.assert_array_equal(W, np.eye(4) - 0.5 * np.outer(e[1] - e[3], e[1] - e[3]))


@pytest.mark.parametrize(
    "args, match",
    [
        ((1, 0, 1), r"n \(1\) must be >= 2 for a pairwise average"),
        ((4, 0, 4), r"j \(4\) must be in \[0, 3\]"),
        ((4, -1, 2), r"i \(-1\) must be in \[0, 3\]"),
        ((4, 2, 2), r"i and j \(2\) must differ; a worker cannot average with itself"),
        ((4.0, 0, 1), r"n \(4.0\) must be an integer"),
    ],
)
def test_pairwise_matrix_errors(args, match):
    with pytest.raises(TopologyError, match=match):
        pairwise_matrix(*args)


@pytest.mark.parametrize(
    "perm, match",
    [
        ([1, 2, 0], r"matching is not symmetric: perm\[0\] = 1 but perm\[1\] = 2; partners must point at each other"),
        ([0, 0, 1], r"matching \[0, 0, 1\] is not a permutation of 0..2"),
        ([[1, 0]], r"must be a non-empty 1-D integer array"),
        ([], r"must be a non-empty 1-D integer array"),
        ([0.0, 1.0], r"must be a non-empty 1-D integer array"),
    ],
)
def test_matching_errors(perm, match):
    with pytest.raises(TopologyError, match=match):
        check_matching(perm)
    with pytest.raises(TopologyError, match=match):
        matching_matrix(perm)


@st.composite
def involutions(draw, max_n=16):
    """Random involutive permutations (some fixed points allowed)."""
    n = draw(st.integers(1, max_n))
    order = draw(st.permutations(range(n)))
    n_pairs = draw(st.integers(0, n // 2))
    perm = np.arange(n)
    for a, b in zip(order[0 : 2 * n_pairs : 2], order[1 : 2 * n_pairs : 2]):
        perm[a], perm[b] = b, a
    return perm


@given(perm=involutions())
def test_matching_matrix_is_a_symmetric_projection(perm):
    """§E.3: T^2 = T = T^T T; eigenvalues in {0, 1}; one zero eigenvalue per pair."""
    T = matching_matrix(perm)
    assert_doubly_stochastic(T)
    np.testing.assert_array_equal(T, T.T)
    np.testing.assert_allclose(T @ T, T, rtol=0, atol=TOL)
    np.testing.assert_allclose(T.T @ T, T, rtol=0, atol=TOL)
    ev = np.linalg.eigvalsh(T)
    assert np.all(np.isclose(ev, 0, atol=1e-12) | np.isclose(ev, 1, atol=1e-12))
    n_pairs = int(np.sum(perm > np.arange(perm.size)))
    assert int(np.sum(np.isclose(ev, 0, atol=1e-12))) == n_pairs


@given(perm=involutions())
def test_matching_matrix_is_a_product_of_commuting_pairwise_averages(perm):
    n = perm.size
    W = np.eye(n)
    for i in range(n):
        if perm[i] > i:
            W = W @ pairwise_matrix(n, i, int(perm[i]))
    np.testing.assert_allclose(matching_matrix(perm), W, rtol=0, atol=0)


# -- §E.1, §E.4, §E.5 on generic doubly stochastic matrices ---------------------------------------
@given(
    A=pst.doubly_stochastic_matrices(n=st.integers(1, 8)),
    B=pst.doubly_stochastic_matrices(n=8),
    weight=st.floats(0.0, 1.0),
)
def test_birkhoff_closure_products_and_convex_combinations(A, B, weight):
    assert_doubly_stochastic(A)
    assert_doubly_stochastic(B)
    assert_doubly_stochastic(B @ B.T)
    assert_doubly_stochastic(weight * B + (1 - weight) * B.T)
    assert_doubly_stochastic(np.kron(A, B))


@given(W=pst.doubly_stochastic_matrices(n=st.integers(1, 10)), data=st.data())
def test_mixing_preserves_the_mean_and_contracts_by_sigma2_squared(W, data):
    """§E.4 and §E.5 for any doubly stochastic W (symmetric or not)."""
    n = W.shape[0]
    seed = data.draw(st.integers(0, 2**32 - 1))
    theta = np.random.default_rng(seed).normal(size=(5, n))
    mixed = theta @ W
    np.testing.assert_allclose(mixed.mean(axis=1), theta.mean(axis=1), rtol=0, atol=1e-12)
    before, after = consensus_distance(theta), consensus_distance(mixed)
    s2 = sigma2(W)
    assert s2 <= 1 + 1e-12
    assert after <= before * (1 + 1e-12)
    assert after <= s2**2 * before * (1 + 1e-9) + 1e-12


def test_support_components_and_is_connected():
    assert support_components(matching_matrix([1, 0, 3, 2])) == 2
    assert not is_connected(matching_matrix([1, 0, 3, 2]))
    assert is_connected(matching_matrix([1, 0, 3, 2]) @ matching_matrix([3, 2, 1, 0]))
    assert is_connected(np.ones((1, 1)))
