"""Topologies: schedules, structure, determinism and every documented error (ALGORITHMS.md §A.9, §A.10, §E)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core import strategies as pst
from psgdlab.core.errors import ConfigError, TopologyError
from psgdlab.core.graphs.mixing import check_mixing_matrix, matching_matrix
from psgdlab.core.graphs.topology import (
    KINDS,
    Topology,
    build_topology,
    complete,
    exponential_graph,
    fixed_ring,
    from_networkx,
    hierarchical,
    hypercube,
    random_ring,
    ring,
    torus,
    torus_shape,
)

MATCHING = ["fixed-ring", "random-ring", "hypercube", "hierarchical"]


# -- every topology matrix: doubly stochastic and symmetric (§E.1, §E.2) --------------------------
@given(topology=pst.topologies(max_workers=24), round_=st.integers(0, 10_000))
def test_every_round_is_symmetric_doubly_stochastic(topology, round_):
    T = topology.matrix(round_)
    assert T.shape == (topology.n_workers, topology.n_workers) and T.dtype == np.float64
    check_mixing_matrix(T, symmetric=True, atol=1e-12)
    np.testing.assert_array_equal(T, T.T)


@given(topology=pst.topologies(kinds=MATCHING, max_workers=24), round_=st.integers(0, 10_000))
def test_matching_kinds_give_projections_with_one_zero_eigenvalue_per_pair(topology, round_):
    """§E.3 on the schedules themselves (hierarchical at node level, then Kronecker)."""
    perm = topology.matching(round_)
    assert perm.dtype == np.int64 and perm.size == (
        topology.n_nodes if topology.kind == "hierarchical" else topology.n_workers
    )
    np.testing.assert_array_equal(perm[perm], np.arange(perm.size))
    T = topology.matrix(round_)
    np.testing.assert_allclose(T @ T, T, rtol=0, atol=1e-12)
    ev = np.linalg.eigvalsh(T)
    assert np.all(np.isclose(ev, 0, atol=1e-10) | np.isclose(ev, 1, atol=1e-10))
    if topology.kind != "hierarchical":
        assert np.sum(np.isclose(ev, 0, atol=1e-10)) == topology.n_workers // 2  # perfect matching
        assert np.all(perm != np.arange(perm.size))


def test_product_of_two_different_matchings_is_generally_not_symmetric():
    """§E.2: code must not assume that products of symmetric matrices are symmetric."""
    for n in (6, 8, 16):
        t = fixed_ring(n)
        P = t.matrix(1) @ t.matrix(0)
        check_mixing_matrix(P)  # still doubly stochastic (Birkhoff closure)
        assert not np.allclose(P, P.T)
    r = random_ring(12, seed=5)
    asymmetric = sum(
        not np.allclose(r.matrix(k + 1) @ r.matrix(k), (r.matrix(k + 1) @ r.matrix(k)).T) for k in range(20)
    )
    assert asymmetric >= 18


# -- schedules ------------------------------------------------------------------------------------
def test_fixed_ring_alternates_left_and_right_matchings():
    t = fixed_ring(8)
    np.testing.assert_array_equal(t.matching(0), [1, 0, 3, 2, 5, 4, 7, 6])  # P_L
    np.testing.assert_array_equal(t.matching(1), [7, 2, 1, 4, 3, 6, 5, 0])  # P_R, (7, 0) wraps
    for r in range(6):
        np.testing.assert_array_equal(t.matching(r), t.matching(r % 2))
    assert t.period == 2 and not t.is_static and not t.is_random
    T = t.matrix(1)
    assert T[0, 7] == T[7, 0] == T[0, 0] == 0.5


@given(n=pst.worker_counts(min_workers=2, max_workers=64, even=True), round_=st.integers(0, 1000))
def test_fixed_ring_pairs_have_different_parity_so_odd_ranks_can_be_active(n, round_):
    perm = fixed_ring(n).matching(round_)
    assert np.all(perm % 2 != np.arange(n) % 2)


def test_random_ring_pairs_may_have_equal_parity():
    t = random_ring(8, seed=0)
    same = [r for r in range(50) if np.any(t.matching(r) % 2 == np.arange(8) % 2)]
    assert same  # no parity rule: an asynchronous runtime needs another rule for who is active


def test_fixed_ring_with_two_workers_is_a_single_pair():
    t = fixed_ring(2)
    np.testing.assert_array_equal(t.matching(0), [1, 0])
    np.testing.assert_array_equal(t.matching(1), [1, 0])
    assert t.period == 1 and t.is_static
    np.testing.assert_allclose(t.matrix(7), np.full((2, 2), 0.5))


@given(n=st.sampled_from([2, 4, 8, 16, 32, 64]), round_=st.integers(0, 1000))
def test_hypercube_pairs_i_with_i_xor_2_to_the_t(n, round_):
    t = hypercube(n)
    r = int(np.log2(n))
    assert t.period == r
    np.testing.assert_array_equal(t.matching(round_), np.arange(n) ^ (1 << (round_ % r)))


def test_random_ring_is_deterministic_in_seed_and_round_within_a_process():
    """§E.15: a fresh object (as on another rank) computes the same matching."""
    a, b = random_ring(16, seed=42), Topology(kind="random-ring", n_workers=16, seed=42)
    for r in range(40):
        np.testing.assert_array_equal(a.matching(r), b.matching(r))
        np.testing.assert_array_equal(a.matrix(r), b.matrix(r))
    distinct = {tuple(a.matching(r)) for r in range(50)}
    assert len(distinct) >= 45  # a new matching nearly every round
    other_seed = random_ring(16, seed=43)
    assert sum(np.array_equal(a.matching(r), other_seed.matching(r)) for r in range(50)) <= 2
    assert a.period is None and a.is_random


def test_random_ring_matchings_agree_across_processes():
    """§E.15: ranks are separate processes (different hash seeds); they must draw the same matchings."""
    code = (
        "import json; from psgdlab.core.graphs.topology import random_ring;"
        "t = random_ring(12, seed=7);"
        "print(json.dumps([t.matching(r).tolist() for r in (0, 1, 5, 1000, 2**40)]))"
    )
    here = [random_ring(12, seed=7).matching(r).tolist() for r in (0, 1, 5, 1000, 2**40)]
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=120)
    assert json.loads(out.stdout) == here


def test_random_ring_draws_a_uniform_matching():
    """Partner of worker 0 is uniform over the other n-1 workers (chi-square at a generous level)."""
    n, rounds = 6, 3000
    t = random_ring(n, seed=11)
    counts = np.bincount([int(t.matching(r)[0]) for r in range(rounds)], minlength=n)
    assert counts[0] == 0
    expected = rounds / (n - 1)
    chi2 = float(np.sum((counts[1:] - expected) ** 2 / expected))
    assert chi2 < 20.5  # 0.9996 quantile of chi-square with 4 degrees of freedom


# -- static kinds ---------------------------------------------------------------------------------
def test_ring_weights_are_one_third():
    W = ring(6).matrix()
    np.testing.assert_allclose(W[2], [0, 1 / 3, 1 / 3, 1 / 3, 0, 0])
    assert ring(6).matching(0) is None and ring(6).period == 1 and ring(6).is_static


@pytest.mark.parametrize(
    "n, shape", [(9, (3, 3)), (12, (3, 4)), (16, (4, 4)), (24, (4, 6)), (36, (6, 6)), (45, (5, 9)), (64, (8, 8))]
)
def test_torus_uses_the_most_square_factorisation_with_weights_one_fifth(n, shape):
    assert torus_shape(n) == shape
    W = torus(n).matrix()
    assert np.all(np.sum(W > 0, axis=0) == 5)
    np.testing.assert_allclose(W[W > 0], 0.2)
    r, c = shape
    node = lambda i, j: (i % r) * c + (j % c)
    assert set(np.flatnonzero(W[:, node(1, 1)])) == {node(1, 1), node(0, 1), node(2, 1), node(1, 0), node(1, 2)}


def test_complete_is_J_over_n_and_exponential_hops_are_powers_of_two():
    np.testing.assert_allclose(complete(5).matrix(), np.full((5, 5), 0.2))
    W = exponential_graph(16).matrix()
    assert exponential_graph(16).peers(0) == (1, 2, 4, 8, 12, 14, 15)
    np.testing.assert_allclose(W[W > 0], 1 / 8)
    assert exponential_graph(5).peers(0) == (1, 2, 3, 4)  # hops 1, 2 and -1, -2 cover everything
    np.testing.assert_allclose(exponential_graph(1).matrix(), [[1.0]])


def test_peers_are_the_nonzero_off_diagonal_entries_of_the_column():
    assert ring(5).peers(0) == (1, 4)
    assert fixed_ring(6).peers(3, 0) == (2,) and fixed_ring(6).peers(3, 1) == (4,)
    assert hierarchical(8, 2).peers(0, 0) == (1, 2, 3)
    assert complete(1).peers(0) == ()


# -- hierarchical: Kronecker structure (§E.8) -----------------------------------------------------
@given(topology=pst.topologies(kinds=["hierarchical"], max_workers=32), round_=st.integers(0, 1000))
def test_hierarchical_is_node_ring_kron_J_over_m(topology, round_):
    m = topology.gpus_per_node
    W = topology.matrix(round_)
    T = matching_matrix(topology.matching(round_))
    np.testing.assert_array_equal(W, np.kron(T, np.full((m, m), 1.0 / m)))
    # learners of one node hold identical models after mixing: their columns of W are identical
    for node in range(topology.n_nodes):
        block = W[:, node * m : (node + 1) * m]
        np.testing.assert_array_equal(block, np.repeat(block[:, :1], m, axis=1))
    ev_w = np.sort(np.linalg.eigvalsh(W))
    ev_t = np.linalg.eigvalsh(T)
    products = np.sort(np.concatenate([ev_t, np.zeros(topology.n_nodes * (m - 1))]))
    np.testing.assert_allclose(ev_w, products, rtol=0, atol=1e-10)


def test_hierarchical_inner_random_ring_and_single_node():
    h = hierarchical(16, 2, inner="random-ring", seed=9)
    np.testing.assert_array_equal(h.matching(3), random_ring(8, seed=9).matching(3))
    assert h.period is None and h.n_nodes == 8
    one = hierarchical(8, 8)
    np.testing.assert_allclose(one.matrix(5), np.full((8, 8), 1 / 8))
    np.testing.assert_array_equal(one.matching(5), [0])
    assert one.period == 1


# -- builders and errors --------------------------------------------------------------------------
def test_build_topology_matches_the_named_builders():
    assert build_topology("ring", 5) == ring(5)
    assert build_topology("random-ring", 6, seed=3) == random_ring(6, seed=3)
    assert build_topology("hierarchical", 8, gpus_per_node=2, inner="random-ring") == hierarchical(
        8, 2, inner="random-ring"
    )
    with pytest.raises(FrozenInstanceError):
        ring(5).n_workers = 6  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(kind="rign", n_workers=4),
            ConfigError,
            r"topology kind \('rign'\) is not known \(known: ring, torus, .*hierarchical\); did you mean 'ring'\?$",
        ),
        (dict(kind="zzz", n_workers=4), ConfigError, r"is not known \(known: .*hierarchical\)$"),
        (dict(kind="ring", n_workers=0), TopologyError, r"workers \(0\) must be >= 1"),
        (dict(kind="ring", n_workers=4.0), ConfigError, r"n_workers \(4.0\) must be an integer"),
        (dict(kind="ring", n_workers=True), ConfigError, r"n_workers \(True\) must be an integer"),
        (dict(kind="ring", n_workers=4, seed=-1), ConfigError, r"seed \(-1\) must be >= 0"),
        (dict(kind="ring", n_workers=4, gpus_per_node=0), ConfigError, r"gpus_per_node \(0\) must be >= 1"),
        (
            dict(kind="ring", n_workers=2),
            TopologyError,
            r"workers \(2\) must be >= 3 for a ring .*use complete for 1 or 2 workers",
        ),
        (
            dict(kind="torus", n_workers=14),
            TopologyError,
            r"workers \(14\) has no factorisation r x c with r, c >= 3 for a 2-D torus; use ring or exponential",
        ),
        (
            dict(kind="hypercube", n_workers=12),
            TopologyError,
            r"workers \(12\) must be a power of two >= 2 for hypercube .*use 8 or 16 workers, or exponential",
        ),
        (
            dict(kind="fixed-ring", n_workers=7),
            TopologyError,
            r"workers \(7\) must be even for fixed-ring: a perfect matching pairs every worker with exactly one other, "
            r"which needs an even number of workers; use ring, torus or exponential for odd counts",
        ),
        (
            dict(kind="random-ring", n_workers=9),
            TopologyError,
            r"workers \(9\) must be even for random-ring: a perfect",
        ),
        (
            dict(kind="hierarchical", n_workers=12, gpus_per_node=4),
            TopologyError,
            r"nodes \(3\) must be even \(or 1\) for hierarchical: the super-learners are paired by a perfect matching",
        ),
        (
            dict(kind="hierarchical", n_workers=10, gpus_per_node=4),
            TopologyError,
            r"workers \(10\) must be divisible by gpus_per_node \(4\)",
        ),
        (
            dict(kind="hierarchical", n_workers=8, inner="ring"),
            ConfigError,
            r"inner \('ring'\) must be one of fixed-ring, random-ring",
        ),
        (
            dict(kind="ring", n_workers=8, inner="random-ring"),
            ConfigError,
            r"inner \('random-ring'\) only applies to kind 'hierarchical', not 'ring'",
        ),
    ],
)
def test_topology_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        Topology(**kwargs)


def test_build_topology_unknown_kind_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"did you mean 'fixed-ring'\?"):
        build_topology("fixed_ring", 8)
    assert set(KINDS) == {
        "ring",
        "torus",
        "complete",
        "exponential",
        "hypercube",
        "fixed-ring",
        "random-ring",
        "hierarchical",
    }


def test_round_and_rank_are_validated():
    with pytest.raises(ConfigError, match=r"round \(-1\) must be an integer >= 0"):
        fixed_ring(4).matrix(-1)
    with pytest.raises(ConfigError, match=r"round \(1.5\) must be an integer >= 0"):
        fixed_ring(4).matching(1.5)
    with pytest.raises(ConfigError, match=r"rank \(4\) must be an integer in \[0, 3\]"):
        fixed_ring(4).peers(4)


# -- networkx adapter -----------------------------------------------------------------------------
def test_from_networkx_builds_weights_in_node_order():
    import networkx as nx

    W = from_networkx(nx.cycle_graph(6), weights="uniform")
    np.testing.assert_allclose(W, ring(6).matrix())
    G = nx.star_graph(3)
    G.add_edge(1, 1)  # self loops are ignored
    np.testing.assert_allclose(from_networkx(G)[0], [0.25, 0.25, 0.25, 0.25])
    M = nx.MultiGraph([(0, 1), (0, 1), (1, 2)])
    np.testing.assert_allclose(from_networkx(M), from_networkx(nx.path_graph(3)))


def test_from_networkx_errors():
    import networkx as nx

    with pytest.raises(TopologyError, match=r"graph is disconnected \(2 components\); .* \(spectral gap 0\)"):
        from_networkx(nx.Graph([(0, 1), (2, 3)]))
    with pytest.raises(TopologyError, match=r"graph is directed; .*to_undirected"):
        from_networkx(nx.DiGraph([(0, 1), (1, 0)]))
    with pytest.raises(TopologyError, match=r"graph has no nodes"):
        from_networkx(nx.Graph())
    with pytest.raises(ConfigError, match=r"weights \('max'\) must be one of metropolis, uniform"):
        from_networkx(nx.path_graph(3), weights="max")
