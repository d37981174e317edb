"""Invariants and reductions of ALGORITHMS.md §E for every algorithm, on the reference executor."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core import kernels
from psgdlab.core.algorithms import ALGORITHMS, algorithm_parameters, make_algorithm
from psgdlab.core.errors import ConfigError, SimulationError, TestbedWarning, TopologyError
from psgdlab.core.exchange import AllReduce, Gossip, PairwiseAverage, ServerExchange, wire_bytes
from psgdlab.core.platform.cost import ALLREDUCE_ALGORITHMS, allreduce_messages, allreduce_rounds, allreduce_s
from psgdlab.core.reference import LeastSquaresProblem, run_reference

TOL = dict(rtol=0, atol=1e-12)
seeds = st.integers(min_value=0, max_value=2**16)


def problem(n, seed=0, batch=8, dim=6, merge=1):
    return LeastSquaresProblem(n_samples=64 * n, dim=dim, n_shards=n, batch=batch, seed=seed, merge_shards=merge)


# ----- registry -----------------------------------------------------------------------------------
def test_registry_has_every_algorithm_of_the_issue():
    assert set(ALGORITHMS) == {"sgd", "ssgd", "asgd", "bsp", "bmuf", "easgd", "dpsgd", "adpsgd", "hadpsgd"}


def test_unknown_algorithm_suggests_closest():
    known = r"\(known: sgd, .*hadpsgd\)"
    with pytest.raises(ConfigError, match=rf"^algorithm \('adpsdg'\) is not known {known}; did you mean 'adpsgd'\?$"):
        make_algorithm("adpsdg", n_workers=4)


def test_unknown_parameter_suggests_closest():
    known = r"\(known: n_workers, .*\)"
    with pytest.raises(
        ConfigError, match=rf"^parameter of bmuf \('peroid'\) is not known {known}; did you mean 'period'\?$"
    ):
        make_algorithm("bmuf", n_workers=4, peroid=5)


def test_none_parameters_fall_back_to_defaults():
    assert make_algorithm("bsp", n_workers=2, period=None).period == 5


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("sgd", {"n_workers": 2}, r"workers \(2\) must be 1 for sgd; use ssgd"),
        ("ssgd", {"n_workers": 0}, r"workers \(0\) must be an integer >= 1"),
        ("ssgd", {"n_workers": 2, "momentum": 1.0}, r"momentum \(1.0\) must be in \[0, 1\)"),
        ("bsp", {"n_workers": 2, "period": 0}, r"period \(0\) must be an integer >= 1"),
        ("bmuf", {"n_workers": 2, "block_momentum": 1.0}, r"block_momentum \(1.0\) must be in \[0, 1\)"),
        ("bmuf", {"n_workers": 2, "block_lr": 0.0}, r"block_lr \(0.0\) must be > 0"),
        ("bmuf", {"n_workers": 2, "variant": "adam"}, r"variant \('adam'\) must be one of classical, nesterov$"),
        ("easgd", {"n_workers": 4, "alpha": 0.5, "variant": "sync"}, r"workers \* alpha <= 1"),
        ("easgd", {"n_workers": 4, "variant": "both"}, r"variant \('both'\) must be one of async, sync$"),
        ("asgd", {"n_workers": 4, "server_lr": -1.0}, r"server_lr \(-1.0\) must be > 0"),
        ("adpsgd", {"n_workers": 4, "variant": "ring"}, r"variant \('ring'\) must be one of fixed, random, delay"),
        ("adpsgd", {"n_workers": 4, "variant": "delay", "delay": 0}, r"delay \(0\) must be an integer >= 1"),
        ("adpsgd", {"n_workers": 4, "delay": 2}, r"delay \(2\) only applies to variant 'delay'"),
        ("dpsgd", {"n_workers": 4, "topology": "fixed-ring"}, r"topology \('fixed-ring'\) must be one of"),
        ("hadpsgd", {"n_workers": 8, "gpus_per_node": 0}, r"gpus_per_node \(0\) must be an integer >= 1"),
    ],
)
def test_bad_parameters_are_rejected_with_one_line(name, params, match):
    with pytest.raises(ConfigError, match=match):
        make_algorithm(name, **params)


@pytest.mark.parametrize("n", [3, 5, 7])
def test_odd_workers_rejected_for_matching_schemes_with_reason(n):
    with pytest.raises(TopologyError, match=r"must be even for matching-based schemes.*use an even count, or dpsgd"):
        make_algorithm("adpsgd", n_workers=n)


def test_hadpsgd_needs_divisible_workers_and_even_nodes():
    with pytest.raises(TopologyError, match=r"workers \(6\) must be divisible by gpus_per_node \(4\)"):
        make_algorithm("hadpsgd", n_workers=6, gpus_per_node=4)
    with pytest.raises(TopologyError, match=r"nodes \(workers / gpus_per_node\) \(3\) must be even"):
        make_algorithm("hadpsgd", n_workers=6, gpus_per_node=2)


def test_bmuf_period_one_warns():
    with pytest.warns(TestbedWarning, match="period 1"):
        make_algorithm("bmuf", n_workers=4, period=1)


# ----- schedules ----------------------------------------------------------------------------------
@given(
    n=st.sampled_from([2, 4, 6, 8, 16]),
    step=st.integers(0, 1000),
    seed=seeds,
    variant=st.sampled_from(["fixed", "random", "delay"]),
)
def test_adpsgd_pairs_are_mutual_with_one_active_side(n, step, seed, variant):
    alg = make_algorithm("adpsgd", n_workers=n, variant=variant, seed=seed)
    for r in range(n):
        (ex,) = alg.exchanges(step, r)
        (back,) = alg.exchanges(step, ex.peer)
        assert back.peer == r and ex.peer != r
        assert back.active != ex.active
        if variant != "random":
            assert ex.active == (r % 2 == 1)  # Lian's bipartite rule on the fixed ring


@given(n_nodes=st.sampled_from([2, 4, 8]), m=st.integers(1, 4), step=st.integers(0, 100), seed=seeds)
def test_hadpsgd_schedule_structure(n_nodes, m, step, seed):
    alg = make_algorithm("hadpsgd", n_workers=n_nodes * m, gpus_per_node=m, seed=seed, variant="random")
    for r in range(n_nodes * m):
        exs = alg.exchanges(step, r)
        node, local = divmod(r, m)
        pair = next(e for e in exs if isinstance(e, PairwiseAverage))
        assert pair.peer % m == local and pair.peer // m != node
        assert pair.shard == local and pair.n_shards == m
        if m > 1:
            ar = next(e for e in exs if isinstance(e, AllReduce))
            assert ar.group == tuple(range(node * m, node * m + m)) and ar.payload == "grad"


@given(period=st.integers(1, 9), step=st.integers(0, 200))
def test_periodic_algorithms_sync_exactly_every_period(period, step):
    for name in ("bsp", "bmuf", "easgd", "asgd"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TestbedWarning)
            alg = make_algorithm(name, n_workers=4, period=period)
        assert bool(alg.exchanges(step, 0)) == ((step + 1) % period == 0)


def test_dpsgd_gossip_is_a_column_of_the_ring_matrix():
    alg = make_algorithm("dpsgd", n_workers=5, topology="ring")
    (ex,) = alg.exchanges(0, 2)
    assert isinstance(ex, Gossip) and set(ex.peers) == {1, 3}
    np.testing.assert_allclose(ex.weights + (ex.self_weight,), [1 / 3] * 3, atol=1e-15)


def test_schedule_is_a_pure_function_of_step_rank_seed():
    a = make_algorithm("adpsgd", n_workers=16, variant="random", seed=7)
    b = make_algorithm("adpsgd", n_workers=16, variant="random", seed=7)
    assert [a.exchanges(s, r) for s in range(20) for r in range(16)] == [
        b.exchanges(s, r) for s in range(20) for r in range(16)
    ]


# ----- communication accounting (§E.12) -----------------------------------------------------------
@given(n=st.integers(1, 64), d=st.integers(1, 10_000))
def test_ring_allreduce_bytes(n, d):
    sent, recv = wire_bytes(AllReduce(group=tuple(range(n)), payload="grad"), d, 4)
    assert sent == recv == (2 * (n - 1) * 4 * d) // n


@given(n=st.integers(1, 4096))
def test_allreduce_schedules_order_and_closed_forms(n):
    """Rounds: a ring's 2(n-1) >= halving-doubling's 2 ceil(log2 n) >= direct's 2, equal for a
    pair, none for one rank; halving-doubling doubles exactly at powers of two."""
    ring, hd, direct = (allreduce_rounds(n, a) for a in ALLREDUCE_ALGORITHMS)
    if n == 1:
        assert ring == hd == direct == 0
        return
    assert ring == 2 * (n - 1) and direct == 2 and ring >= hd >= direct
    assert hd == 2 * math.ceil(math.log2(n)) and (n & (n - 1) or 2 ** (hd // 2) == n)
    assert allreduce_messages(n, "direct") == ring and allreduce_messages(n, "halving-doubling") == hd
    assert allreduce_s(n, 0.0, 1.0, 1.0, "direct") == 2.0


def test_unknown_allreduce_schedule_is_refused_with_the_choices():
    with pytest.raises(
        ConfigError, match=r"allreduce algorithm \('tree'\) must be one of ring, halving-doubling, direct"
    ):
        allreduce_rounds(4, "tree")


def test_pairwise_and_server_move_one_model_each_way():
    assert wire_bytes(PairwiseAverage(peer=1, active=True), 100, 4) == (400, 400)
    assert wire_bytes(ServerExchange(op="delta"), 100, 4) == (400, 400)
    sharded = PairwiseAverage(peer=4, active=True, shard=1, n_shards=4, gather_group=(0, 1, 2, 3))
    assert wire_bytes(sharded, 100, 4) == (100, 100)


# ----- reductions (§E.9) ---------------------------------------------------------------------------
@given(n=st.sampled_from([2, 3, 4]), seed=seeds)
def test_ssgd_equals_sgd_with_the_total_batch(n, seed):
    a = run_reference(make_algorithm("ssgd", n_workers=n), problem(n, seed), steps=15, lr=0.05)
    b = run_reference(make_algorithm("sgd"), problem(n, seed, merge=n), steps=15, lr=0.05)
    for r in range(n):
        np.testing.assert_allclose(a.params[:, r], b.params[:, 0], **TOL)


@given(n=st.sampled_from([2, 4]), period=st.integers(2, 5), seed=seeds)
def test_bmuf_without_momentum_and_unit_lr_is_bsp(n, period, seed):
    a = run_reference(
        make_algorithm("bmuf", n_workers=n, period=period, block_momentum=0.0, block_lr=1.0),
        problem(n, seed),
        steps=4 * period,
    )
    b = run_reference(make_algorithm("bsp", n_workers=n, period=period), problem(n, seed), steps=4 * period)
    np.testing.assert_allclose(a.params, b.params, **TOL)


@given(n=st.sampled_from([2, 4]), seed=seeds)
def test_bsp_with_period_one_is_ssgd(n, seed):
    a = run_reference(make_algorithm("bsp", n_workers=n, period=1), problem(n, seed), steps=12)
    b = run_reference(make_algorithm("ssgd", n_workers=n), problem(n, seed), steps=12)
    np.testing.assert_allclose(a.params, b.params, rtol=0, atol=1e-13)


@given(m=st.sampled_from([2, 4]), seed=seeds)
def test_hadpsgd_with_one_node_is_ssgd(m, seed):
    a = run_reference(make_algorithm("hadpsgd", n_workers=m, gpus_per_node=m), problem(m, seed), steps=12)
    b = run_reference(make_algorithm("ssgd", n_workers=m), problem(m, seed), steps=12)
    np.testing.assert_allclose(a.params, b.params, **TOL)


@given(n=st.sampled_from([2, 4, 8]), seed=seeds, variant=st.sampled_from(["fixed", "random"]))
def test_hadpsgd_with_one_gpu_per_node_is_adpsgd(n, seed, variant):
    a = run_reference(
        make_algorithm("hadpsgd", n_workers=n, gpus_per_node=1, variant=variant, seed=seed), problem(n, seed), steps=12
    )
    b = run_reference(make_algorithm("adpsgd", n_workers=n, variant=variant, seed=seed), problem(n, seed), steps=12)
    np.testing.assert_allclose(a.params, b.params, **TOL)


@given(seed=seeds)
def test_dpsgd_on_the_complete_graph_mixes_to_the_mean(seed):
    """With T = J/n every mixed model is the mean of the round's models. (This is not SSGD:
    under Eq. 7 each gradient is still evaluated on the worker's own pre-mixing weights, so the
    §E.9 reduction "D-PSGD with J/n is SSGD" holds only for the mean, with perturbed gradient
    points; H-ADPSGD with one node is the exact reduction, tested above.)"""
    prob = problem(4, seed)
    res = run_reference(make_algorithm("dpsgd", n_workers=4, topology="complete"), prob, steps=6, lr=0.05)
    A, b = prob.data()
    for s in range(1, 6):
        before = res.params[s - 1]
        for r in range(4):
            idx = prob.batch_indices(r, s)
            grad = A[idx].T @ (A[idx] @ before[r] - b[idx]) / len(idx)
            np.testing.assert_allclose(res.params[s, r] + 0.05 * grad, before.mean(axis=0), rtol=0, atol=1e-12)


@given(seed=seeds)
def test_asgd_with_one_worker_is_sequential_sgd(seed):
    a = run_reference(make_algorithm("asgd", n_workers=1, period=1, server_lr=1.0), problem(1, seed), steps=15)
    b = run_reference(make_algorithm("sgd"), problem(1, seed), steps=15)
    np.testing.assert_allclose(a.params, b.params, **TOL)


@given(seed=seeds)
def test_easgd_with_zero_alpha_is_independent_sgd(seed):
    a = run_reference(make_algorithm("easgd", n_workers=2, period=1, alpha=0.0), problem(2, seed), steps=10)
    for r in range(2):
        single = LeastSquaresProblem(n_samples=128, dim=6, n_shards=2, batch=8, seed=seed)
        x = np.zeros(6)
        A, b = single.data()
        for s in range(10):
            idx = single.batch_indices(r, s)
            x = x - 0.05 * A[idx].T @ (A[idx] @ x - b[idx]) / len(idx)
        np.testing.assert_allclose(a.params[-1, r], x, rtol=0, atol=1e-12)


# ----- gradient scale folded into the step ---------------------------------------------------------
@given(n=st.integers(2, 16), mu=st.sampled_from([0.0, 0.5, 0.9]), steps=st.integers(1, 4), seed=seeds)
def test_sgd_step_on_a_summed_gradient_with_scale_equals_the_step_on_the_mean(n, mu, steps, seed):
    """An executor that allreduces the sum of n gradients and passes ``grad_scale=1/n`` follows
    the trajectory (and momentum buffer) of one that passes the mean."""
    rng = np.random.default_rng(seed)
    x_mean = x_sum = rng.standard_normal(6)
    b_mean = b_sum = None
    for _ in range(steps):
        grads = rng.standard_normal((n, 6))
        x_mean, b_mean = kernels.sgd_step(x_mean, grads.mean(axis=0), 0.1, b_mean, mu)
        x_sum, b_sum = kernels.sgd_step(x_sum, grads.sum(axis=0), 0.1, b_sum, mu, grad_scale=1.0 / n)
    np.testing.assert_allclose(x_sum, x_mean, rtol=1e-12, atol=1e-12)
    assert (b_sum is None) == (b_mean is None)
    if b_sum is not None:
        np.testing.assert_allclose(b_sum, b_mean, rtol=1e-12, atol=1e-12)


# ----- BMUF forms (§E.10) --------------------------------------------------------------------------
@given(n=st.integers(2, 16), zeta=st.floats(0.0, 0.95), C=st.floats(0.5, 2.0), nesterov=st.booleans(), seed=seeds)
def test_bmuf_averaged_and_summed_forms_agree(n, zeta, C, nesterov, seed):
    rng = np.random.default_rng(seed)
    workers = rng.standard_normal((n, 5))
    g, delta = rng.standard_normal(5), rng.standard_normal(5)
    eta = (1 - zeta) * n * C
    a = kernels.bmuf_filter(workers.mean(axis=0), g, delta, block_momentum=zeta, block_lr=eta, nesterov=nesterov)
    b = kernels.bmuf_filter_summed(
        (workers - g).sum(axis=0), g, delta, block_momentum=zeta, gain=(1 - zeta) * C, nesterov=nesterov
    )
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("n", "zeta"), [(4, 0.75), (8, 0.875), (64, 0.984375)])
def test_bmuf_setting_rule(n, zeta):
    assert make_algorithm("bmuf", n_workers=n).block_momentum == pytest.approx(zeta)


# ----- EASGD conservation (§E.11) ------------------------------------------------------------------
@given(alpha=st.floats(0.0, 0.99), seed=seeds)
def test_easgd_async_exchange_conserves_sum_and_contracts_difference(alpha, seed):
    rng = np.random.default_rng(seed)
    w, c = rng.standard_normal(7), rng.standard_normal(7)
    w2, c2 = kernels.elastic_pair(w, c, alpha)
    np.testing.assert_allclose(w2 + c2, w + c, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w2 - c2, (1 - 2 * alpha) * (w - c), rtol=1e-12, atol=1e-12)


@given(n=st.integers(1, 12), frac=st.floats(0.0, 1.0), seed=seeds)
def test_easgd_sync_step_conserves_total_and_is_doubly_stochastic(n, frac, seed):
    alpha = frac / n
    rng = np.random.default_rng(seed)
    W, c = rng.standard_normal((n, 3)), rng.standard_normal(3)
    out = [kernels.elastic_sync(W[i], c, W.mean(axis=0), alpha, n) for i in range(n)]
    new_w = np.stack([o[0] for o in out])
    new_c = out[0][1]
    np.testing.assert_allclose(new_w.sum(axis=0) + new_c, W.sum(axis=0) + c, rtol=1e-10, atol=1e-10)
    # the (n+1)x(n+1) matrix: eigenvalues {1, 1-alpha, 1-(n+1)alpha}
    M = np.block(
        [[(1 - alpha) * np.eye(n), alpha * np.ones((n, 1))], [alpha * np.ones((1, n)), np.array([[1 - n * alpha]])]]
    )
    assert (M >= -1e-15).all()
    np.testing.assert_allclose(M.sum(axis=0), 1, atol=1e-12)
    eig = np.sort(np.linalg.eigvalsh(M))
    expect = np.sort([1.0] + [1 - alpha] * (n - 1) + [1 - (n + 1) * alpha])
    np.testing.assert_allclose(eig, expect, atol=1e-10)


# ----- mean preservation, staleness, replicas (§E.4, §E.8) ----------------------------------------
@given(n=st.sampled_from([2, 4, 8]), seed=seeds, variant=st.sampled_from(["fixed", "random"]))
def test_adpsgd_mean_moves_like_ssgd(n, seed, variant):
    """Mean dynamics: the mixing step preserves the mean, so the mean moves by -lr * mean gradient."""
    alg = make_algorithm("adpsgd", n_workers=n, variant=variant, seed=seed)
    prob = problem(n, seed)
    res = run_reference(alg, prob, steps=6, lr=0.05)
    A, b = prob.data()
    for s in range(1, 6):
        before = res.params[s - 1]
        grads = [
            A[prob.batch_indices(r, s)].T
            @ (A[prob.batch_indices(r, s)] @ before[r] - b[prob.batch_indices(r, s)])
            / prob.batch
            for r in range(n)
        ]
        expect = before.mean(axis=0) - 0.05 * np.mean(grads, axis=0)
        np.testing.assert_allclose(res.params[s].mean(axis=0), expect, rtol=0, atol=1e-12)


@given(n_nodes=st.sampled_from([2, 4]), m=st.sampled_from([2, 3]), seed=seeds)
def test_hadpsgd_keeps_the_replicas_of_a_node_identical(n_nodes, m, seed):
    alg = make_algorithm("hadpsgd", n_workers=n_nodes * m, gpus_per_node=m, seed=seed, variant="random")
    res = run_reference(alg, problem(n_nodes * m, seed), steps=10)
    for node in range(n_nodes):
        block = res.params[:, node * m : (node + 1) * m]
        np.testing.assert_array_equal(block, np.repeat(block[:, :1], m, axis=1))


def test_staleness_definitions():
    p = problem(4)
    assert run_reference(make_algorithm("ssgd", n_workers=4), p, steps=5).staleness.max() == 0
    assert (run_reference(make_algorithm("adpsgd", n_workers=4), p, steps=5).staleness == 1).all()
    st_delay = run_reference(make_algorithm("adpsgd", n_workers=4, variant="delay", delay=2), p, steps=8).staleness
    assert (st_delay[2:] == 3).all()  # merges of the current round and the two older ones
    st_asgd = run_reference(make_algorithm("asgd", n_workers=4), p, steps=6).staleness
    assert (st_asgd[1:] == 3).all()  # round-robin service: n - 1 foreign updates between pull and push


def test_server_order_changes_staleness_and_is_validated():
    p = problem(4)
    rev = run_reference(make_algorithm("asgd", n_workers=4), p, steps=3, server_order=lambda s: [3, 2, 1, 0])
    assert rev.staleness[0].tolist() == [3, 2, 1, 0]
    with pytest.raises(ConfigError, match="must be a permutation of the ranks"):
        run_reference(make_algorithm("asgd", n_workers=4), p, steps=2, server_order=lambda s: [0, 0, 1, 2])


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_reduces_the_loss(name):
    n = 1 if name == "sgd" else 4
    params = {"gpus_per_node": 2} if name == "hadpsgd" else {}
    res = run_reference(make_algorithm(name, n_workers=n, **params), problem(n, batch=16, dim=8), steps=80, lr=0.05)
    assert res.losses[-1] < 0.2 * res.losses[0]
    assert res.trace.size > 0 and set(np.unique(res.trace["rank"])) == set(range(n))


def test_inconsistent_schedule_is_detected():
    from dataclasses import dataclass
    from typing import ClassVar

    from psgdlab.core.algorithms import Algorithm

    @dataclass(frozen=True, slots=True, kw_only=True)
    class Broken(Algorithm):
        name: ClassVar[str] = "broken"

        def exchanges(self, step, rank):
            return (PairwiseAverage(peer=(rank + 1) % self.n_workers, active=True),)

    with pytest.raises(SimulationError, match="schedule is inconsistent at rank 0"):
        run_reference(Broken(n_workers=4), problem(4), steps=1)


def test_algorithm_parameters_are_listed():
    assert "period" in algorithm_parameters("bmuf") and "variant" in algorithm_parameters("adpsgd")


@st.composite
def _any_algorithm(draw):
    """Every registry algorithm with valid parameters: periods, variants, rings, nodes."""
    name = draw(st.sampled_from(sorted(ALGORITHMS)))
    seed = draw(st.integers(0, 3))
    if name == "sgd":
        return make_algorithm("sgd")
    if name in ("adpsgd", "hadpsgd"):
        m = draw(st.integers(1, 4)) if name == "hadpsgd" else 1
        nodes = draw(st.sampled_from([1, 2, 4, 6, 8])) if name == "hadpsgd" else draw(st.sampled_from([2, 4, 6, 8]))
        variants = ("fixed", "random") if name == "hadpsgd" else ("fixed", "random", "delay")
        params = {"gpus_per_node": m} if name == "hadpsgd" else {}
        return make_algorithm(name, n_workers=nodes * m, seed=seed, variant=draw(st.sampled_from(variants)), **params)
    n = draw(st.integers(3, 9))  # a ring needs 3
    if name == "dpsgd":
        return make_algorithm(name, n_workers=n, seed=seed, topology=draw(st.sampled_from(["ring", "complete"])))
    params = {"period": draw(st.integers(2 if name == "bmuf" else 1, 6))} if name != "ssgd" else {}  # bmuf at 1 warns
    if name == "easgd":
        params["variant"] = draw(st.sampled_from(["async", "sync"]))
    return make_algorithm(name, n_workers=n, seed=seed, **params)


@given(_any_algorithm())
def test_a_schedule_repeats_after_its_period(algorithm):
    """``schedule_period`` P is a promise an executor may cache on: the exchanges of step s + P
    are those of step s, for every rank; only random matchings have none."""
    P = algorithm.schedule_period
    if P is None:
        assert getattr(algorithm, "variant", None) == "random"
        return
    assert isinstance(P, int) and P >= 1
    for s in range(2 * P + 3):
        for r in range(algorithm.n_workers):
            assert algorithm.exchanges(s + P, r) == algorithm.exchanges(s, r)
