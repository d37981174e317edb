"""core.membership: a topology rebuilt over the survivors of any sequence of removals stays a valid
gossip schedule (doubly stochastic, symmetric, mixing), equals the original when nobody left, and
handles an odd number of survivors on a matching by a rotating idle worker."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.exchange import Gossip
from psgdlab.core.graphs.membership import rebuild, without_peers
from psgdlab.core.graphs.mixing import is_doubly_stochastic
from psgdlab.core.graphs.topology import build_topology
from psgdlab.core.strategies import topologies


@st.composite
def removals(draw):
    """A topology and the survivors after removing workers one or a few at a time."""
    topology = draw(topologies(max_workers=16))
    alive = list(range(topology.n_workers))
    for _ in range(draw(st.integers(0, topology.n_workers - 1))):
        dead = draw(st.lists(st.sampled_from(alive), min_size=1, max_size=max(1, len(alive) - 1), unique=True))
        if len(dead) < len(alive):
            alive = [r for r in alive if r not in dead]
    return topology, tuple(alive)


@given(removals(), st.integers(0, 50))
@settings(max_examples=150, deadline=None)
def test_every_matrix_after_any_removals_is_doubly_stochastic_symmetric_and_mixes(case, round):
    topology, alive = case
    r = rebuild(topology, alive)
    assert r.members == tuple(sorted(alive))
    for t in (round, round + 1):
        W = r.matrix(t)
        assert W.shape == (len(alive), len(alive))
        assert is_doubly_stochastic(W) and np.allclose(W, W.T)
        for rank in r.members:  # peers are mutual and survivors only
            for peer in r.peers(rank, t):
                assert peer in alive and rank in r.peers(peer, t)
    gap = r.spectral_gap()
    assert 0.0 < gap <= 1.0 + 1e-12  # the survivors still reach a consensus


@given(topologies(max_workers=16), st.integers(0, 20))
@settings(max_examples=80, deadline=None)
def test_nobody_removed_is_the_original_schedule(topology, round):
    r = rebuild(topology, range(topology.n_workers))
    np.testing.assert_allclose(r.matrix(round), topology.matrix(round), atol=1e-12)


@pytest.mark.parametrize("kind", ["fixed-ring", "random-ring", "hypercube"])
def test_an_odd_number_of_survivors_rotates_who_sits_out(kind):
    r = rebuild(build_topology(kind, 8), alive=(0, 1, 2, 3, 5, 6, 7))
    k = r.size
    idle = [r.idle(t) for t in range(k)]
    assert sorted(idle) == list(range(k))  # each survivor sits out once every k rounds
    for t in range(k):
        W = r.matrix(t)
        i = r.idle(t)
        assert W[i, i] == 1.0 and np.count_nonzero(W[i]) == 1
        assert all(np.count_nonzero(W[j]) == 2 for j in range(k) if j != i)  # one peer each, half-half


def test_hierarchical_nodes_shrink_and_empty_nodes_leave_the_ring():
    t = build_topology("hierarchical", 8, gpus_per_node=2)
    r = rebuild(t, alive=(0, 1, 3, 6, 7))  # node 1 lost a GPU, node 2 lost both
    assert r.nodes == ((0, 1), (3,), (6, 7))
    W = r.matrix(0)
    assert is_doubly_stochastic(W)
    # two mixing nodes take the exact average over their union: 1/3 each for nodes of 2 and 1
    idle = r.idle(0)
    pair = [u for u in range(3) if u != idle]
    union = [r.members.index(x) for u in pair for x in r.nodes[u]]
    np.testing.assert_allclose(W[np.ix_(union, union)], 1.0 / len(union))


def test_static_kinds_fall_back_when_too_few_survive_and_bad_input():
    assert rebuild(build_topology("torus", 9), range(8)).kind == "ring"
    assert rebuild(build_topology("ring", 5), (1, 4)).kind == "complete"
    assert rebuild(build_topology("fixed-ring", 4), (2,)).spectral_gap() == 1.0
    with pytest.raises(ConfigError, match="at least one rank"):
        rebuild(build_topology("ring", 5), ())
    with pytest.raises(ConfigError, match=r"must be ranks in \[0, 5\)"):
        rebuild(build_topology("ring", 5), (0, 7))
    with pytest.raises(ConfigError, match="must be a survivor"):
        rebuild(build_topology("ring", 5), (0, 1, 2)).peers(4)


@given(removals(), st.integers(0, 50), st.data())
@settings(max_examples=100, deadline=None)
def test_a_gossip_without_its_dead_peers_is_still_doubly_stochastic(case, round, data):
    """Between a death and the switch step, blocking gossip's members drop the dead from the
    schedule they follow, each giving the dead's weight to itself: the matrix over the living stays
    symmetric and doubly stochastic, whichever ranks died."""
    topology, alive = case
    r = rebuild(topology, alive)
    W = r.matrix(round)
    dead = set(data.draw(st.lists(st.sampled_from(r.members), max_size=len(r.members) - 1, unique=True)))
    living = [m for m in r.members if m not in dead]
    index = {m: i for i, m in enumerate(r.members)}
    V = np.zeros((len(living), len(living)))
    for a, rank in enumerate(living):
        col = W[:, index[rank]]
        peers = [m for m in r.members if m != rank and col[index[m]] > 0]
        ex = Gossip(peers=tuple(peers), weights=tuple(col[index[p]] for p in peers), self_weight=col[index[rank]])
        kept = without_peers(ex, dead)
        assert set(kept.peers) == set(peers) - dead
        V[a, a] = kept.self_weight
        for p, w in zip(kept.peers, kept.weights):
            V[living.index(p), a] = w
    assert is_doubly_stochastic(V) and np.allclose(V, V.T)


@given(
    nodes=st.sampled_from([2, 4, 6]),  # a matching of nodes
    gpus=st.integers(1, 4),
    round=st.integers(0, 20),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_the_pairwise_slices_of_unequal_nodes_compose_into_the_rebuilt_matrix(nodes, gpus, round, data):
    """H-ADPSGD after removals: every slice record has one counterpart (same slice, peer swapped,
    one active side, weights summing to 1), every slice of a paired node is averaged once, and
    applying the records to replicas equal within each node (what the node's allreduce keeps) gives
    :meth:`Rebuilt.matrix` applied to them: the union's mean, each node weighted by its size."""
    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.core.exchange import PairwiseAverage
    from psgdlab.core.graphs.membership import survivor_exchanges

    n = nodes * gpus
    alg = make_algorithm("hadpsgd", n_workers=n, gpus_per_node=gpus)
    dead = data.draw(st.sets(st.integers(0, n - 1), max_size=n - 1), label="dead")
    rb = rebuild(alg.membership_topology(), [r for r in range(n) if r not in dead])
    dim = 2 * n + 3  # every slice non-empty
    rng = np.random.default_rng(round)
    node_models = {node: rng.normal(size=dim) for node in rb.nodes}
    X = np.stack([node_models[next(nd for nd in rb.nodes if r in nd)] for r in rb.members])
    records = {
        r: [e for e in survivor_exchanges(rb, alg.exchanges(round, r), r, round) if isinstance(e, PairwiseAverage)]
        for r in rb.members
    }
    mixed = X.copy()
    held: dict[tuple[int, int], np.ndarray] = {}  # (rank, slice) -> its averaged slice
    for r, exs in records.items():
        i = rb.members.index(r)
        for e in exs:
            (back,) = [b for b in records[e.peer] if b.peer == r and b.shard == e.shard]
            assert back.n_shards == e.n_shards and back.active != e.active
            assert back.weight + e.weight == pytest.approx(1.0)
            j = rb.members.index(e.peer)
            own = np.array_split(X[i], e.n_shards)[e.shard]
            theirs = np.array_split(X[j], e.n_shards)[e.shard]
            held[(r, e.shard)] = alg.mix(e, own, theirs)
    for r, exs in records.items():
        if not exs:
            continue
        e = exs[0]
        group = e.gather_group or (r,)
        parts = [held[(group[s % len(group)], s)] for s in range(e.n_shards)]  # each slice once, from its holder
        mixed[rb.members.index(r)] = np.concatenate(parts)
    np.testing.assert_allclose(mixed, rb.matrix(round) @ X, atol=1e-12)
