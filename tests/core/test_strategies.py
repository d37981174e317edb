"""The exported hypothesis strategies keep their contracts and reject bad arguments eagerly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from psgdlab.core import strategies as pst
from psgdlab.core.graphs.mixing import check_mixing_matrix
from psgdlab.core.graphs.spectral import topology_spectrum
from psgdlab.core.graphs.topology import KINDS, Topology, fixed_ring


# -- worker_counts --------------------------------------------------------------------------------
@given(n=pst.worker_counts(min_workers=3, max_workers=9))
def test_worker_counts_stay_in_range(n):
    assert 3 <= n <= 9


@given(n=pst.worker_counts(min_workers=3, max_workers=11, even=True))
def test_even_worker_counts_are_even(n):
    assert n % 2 == 0 and 4 <= n <= 10


def test_worker_counts_shrink_to_the_smallest():
    assert find(pst.worker_counts(min_workers=5, max_workers=40), lambda n: True) == 5
    assert find(pst.worker_counts(min_workers=5, max_workers=40, even=True), lambda n: True) == 6


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(min_workers=0), r"min_workers=0 must be >= 1"),
        (dict(min_workers=5, max_workers=3), r"min_workers=5 must be <= max_workers=3"),
        (dict(max_workers=2.5), r"max_workers=2.5 must be an integer"),
        (dict(min_workers=3, max_workers=3, even=True), r"no even count in \[min_workers=3, max_workers=3\]"),
        (dict(even="yes"), r"even='yes' must be a bool"),
    ],
)
def test_worker_counts_rejects_bad_arguments_eagerly(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        pst.worker_counts(**kwargs)  # no .example(): raised when the strategy is built


# -- topologies -----------------------------------------------------------------------------------
@given(topology=pst.topologies(min_workers=2, max_workers=24))
def test_topologies_are_valid_connected_and_in_range(topology):
    assert isinstance(topology, Topology)
    assert 2 <= topology.n_workers <= 24
    assert topology_spectrum(topology)["spectral_gap"] > 1e-9  # connected (of W or of E[TT^T])
    if topology.kind in ("fixed-ring", "random-ring"):
        assert topology.n_workers % 2 == 0
    if topology.kind == "hypercube":
        assert topology.n_workers & (topology.n_workers - 1) == 0
    if topology.kind == "hierarchical":
        assert topology.n_nodes == 1 or topology.n_nodes % 2 == 0
    else:
        assert topology.gpus_per_node == 1


@given(topology=pst.topologies(kinds=["hypercube", "torus"], min_workers=8, max_workers=40))
def test_topologies_respect_the_requested_kinds(topology):
    assert topology.kind in ("hypercube", "torus")


def test_topologies_reach_every_kind_and_shrink_to_the_simplest():
    reach = settings(phases=(Phase.generate,), max_examples=300, database=None)  # no shrinking: just reachable
    for kind in KINDS:
        find(pst.topologies(max_workers=16), lambda t, k=kind: t.kind == k, settings=reach)
    simplest = find(pst.topologies(), lambda t: True)
    assert simplest == Topology(kind="ring", n_workers=3)
    h = find(pst.topologies(kinds=["hierarchical"]), lambda t: t.gpus_per_node > 1)
    assert (h.n_workers, h.gpus_per_node, h.seed, h.inner) == (2, 2, 0, "fixed-ring")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kinds=["ring", "rign"]), r"kinds=\['ring', 'rign'\] must be a non-empty subset of"),
        (dict(kinds=[]), r"must be a non-empty subset"),
        (dict(kinds="ring"), r"kinds='ring' must be a sequence of kind names"),
        (
            dict(kinds=["hypercube"], min_workers=9, max_workers=15),
            r"kind\(s\) \['hypercube'\] have no valid worker count in \[min_workers=9, max_workers=15\]",
        ),
        (dict(min_workers=1, max_workers=1, kinds=["ring"]), r"have no valid worker count"),
        (dict(max_workers=5000), r"max_workers=5000 must be <= 4096"),
        (dict(min_workers=8, max_workers=4), r"min_workers=8 must be <= max_workers=4"),
    ],
)
def test_topologies_rejects_bad_arguments_eagerly(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        pst.topologies(**kwargs)


# -- mixing_matrices ------------------------------------------------------------------------------
@given(W=pst.mixing_matrices())
def test_mixing_matrices_are_symmetric_doubly_stochastic(W):
    check_mixing_matrix(W, symmetric=True, atol=1e-12)


@given(W=pst.mixing_matrices(topology=fixed_ring(6)))
def test_mixing_matrices_of_a_given_topology_are_its_rounds(W):
    t = fixed_ring(6)
    assert np.array_equal(W, t.matrix(0)) or np.array_equal(W, t.matrix(1))


def test_mixing_matrices_shrink_to_round_zero_and_reject_bad_topologies():
    W = find(pst.mixing_matrices(topology=st.just(fixed_ring(4))), lambda w: True)
    np.testing.assert_array_equal(W, fixed_ring(4).matrix(0))
    with pytest.raises(InvalidArgument, match=r"topology='ring' must be a Topology, a strategy of them, or None"):
        pst.mixing_matrices(topology="ring")


# -- generic doubly stochastic matrices -----------------------------------------------------------
@given(W=pst.doubly_stochastic_matrices(n=st.integers(1, 9)))
def test_doubly_stochastic_matrices_keep_their_contract(W):
    check_mixing_matrix(W, atol=1e-12)


@given(W=pst.symmetric_doubly_stochastic_matrices(n=7))
def test_symmetric_doubly_stochastic_matrices_are_exactly_symmetric(W):
    assert W.shape == (7, 7)
    check_mixing_matrix(W, symmetric=True, atol=1e-12)
    np.testing.assert_array_equal(W, W.T)


def test_doubly_stochastic_matrices_reach_non_symmetric_ones_and_shrink_to_identity():
    find(
        pst.doubly_stochastic_matrices(n=4),
        lambda w: not np.allclose(w, w.T),
        settings=settings(phases=(Phase.generate,), database=None),
    )
    np.testing.assert_array_equal(find(pst.doubly_stochastic_matrices(n=5), lambda w: True), np.eye(5))
    np.testing.assert_array_equal(find(pst.symmetric_doubly_stochastic_matrices(n=3), lambda w: True), np.eye(3))


@pytest.mark.parametrize("factory", [pst.doubly_stochastic_matrices, pst.symmetric_doubly_stochastic_matrices])
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=0), r"n=0 must be >= 1"),
        (dict(n="4"), r"n='4' must be an integer"),
        (dict(n=3, max_terms=0), r"max_terms=0 must be >= 1"),
    ],
)
def test_matrix_strategies_reject_bad_arguments_eagerly(factory, kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        factory(**kwargs)


def test_a_drawn_size_is_checked_when_drawn():
    strategy = pst.doubly_stochastic_matrices(n=st.just(0))

    @settings(max_examples=1)
    @given(strategy)
    def draw(_):
        pass

    with pytest.raises(InvalidArgument, match=r"n \(drawn\)=0 must be >= 1"):
        draw()


# -- staleness schedules --------------------------------------------------------------------------
@given(s=pst.staleness_schedules(n_workers=st.integers(1, 6), max_staleness=3, steps=st.integers(1, 12)))
def test_staleness_schedules_are_causal_and_bounded(s):
    assert s.dtype == np.int64 and s.ndim == 2 and 1 <= s.shape[0] <= 12 and 1 <= s.shape[1] <= 6
    assert s.min() >= 0 and s.max() <= 3
    assert np.all(s <= np.arange(s.shape[0])[:, None])


@given(s=pst.staleness_schedules(n_workers=3, max_staleness=5, steps=4, causal=False))
def test_non_causal_staleness_schedules_only_respect_the_maximum(s):
    assert s.shape == (4, 3) and 0 <= s.min() and s.max() <= 5


def test_staleness_schedules_reach_the_maximum_and_shrink_to_zeros():
    find(
        pst.staleness_schedules(n_workers=2, max_staleness=4, steps=6),
        lambda s: s.max() == 4,
        settings=settings(phases=(Phase.generate,), database=None),
    )
    z = find(pst.staleness_schedules(n_workers=2, max_staleness=4, steps=6), lambda s: True)
    np.testing.assert_array_equal(z, np.zeros((6, 2), dtype=np.int64))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_workers=0, max_staleness=1, steps=2), r"n_workers=0 must be >= 1"),
        (dict(n_workers=2, max_staleness=-1, steps=2), r"max_staleness=-1 must be >= 0"),
        (dict(n_workers=2, max_staleness=1, steps=0), r"steps=0 must be >= 1"),
        (dict(n_workers=2, max_staleness=1.5, steps=2), r"max_staleness=1.5 must be an integer"),
        (dict(n_workers=2, max_staleness=1, steps=2, causal=1), r"causal=1 must be a bool"),
    ],
)
def test_staleness_schedules_reject_bad_arguments_eagerly(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        pst.staleness_schedules(**kwargs)


def test_strategies_module_exports():
    assert set(pst.__all__) >= {
        "worker_counts",
        "topologies",
        "mixing_matrices",
        "doubly_stochastic_matrices",
        "symmetric_doubly_stochastic_matrices",
        "staleness_schedules",
    }


# ----- algorithm_specs (lead) -----------------------------------------------------------------------
from hypothesis import given as _given  # noqa: E402

from psgdlab.core.algorithms import ALGORITHMS as _ALGORITHMS  # noqa: E402
from psgdlab.core.reference import LeastSquaresProblem as _LSQ  # noqa: E402
from psgdlab.core.reference import run_reference as _run  # noqa: E402
from psgdlab.core.strategies import algorithm_specs  # noqa: E402


@_given(algorithm_specs(max_workers=8))
def test_algorithm_specs_yield_valid_runnable_specs(alg):
    assert alg.name in _ALGORITHMS and 2 <= alg.n_workers <= 8
    n = alg.n_workers
    res = _run(alg, _LSQ(n_samples=16 * n, dim=3, n_shards=n, batch=4, seed=0), steps=3, lr=0.01)
    assert res.params.shape == (3, n, 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"names": ["adam"]}, "must be a non-empty subset"),
        ({"min_workers": 1}, "need 2 <= min_workers"),
        ({"min_workers": 5, "max_workers": 3}, "need 2 <= min_workers"),
        ({"names": ["adpsgd"], "min_workers": 3, "max_workers": 3}, "no even worker count"),
    ],
)
def test_algorithm_specs_validate_eagerly(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        algorithm_specs(**kwargs)
