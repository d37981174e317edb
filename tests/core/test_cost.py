"""The cost model (core.cost) read forward and backward, and the exchange kinds it prices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.algorithms import ALGORITHMS, make_algorithm
from psgdlab.core.exchange import (
    EXCHANGE_KINDS,
    AllReduce,
    Barrier,
    ExchangeKind,
    Gossip,
    PairwiseAverage,
    ServerExchange,
    folds_model,
    kind_name,
    kind_of,
    wire_bytes,
)
from psgdlab.core.platform.cost import (
    ALLREDUCE_ALGORITHMS,
    allgather_s,
    allreduce_bytes,
    allreduce_group_size,
    allreduce_messages,
    allreduce_rounds,
    allreduce_s,
    allreduce_terms,
    cpu_stretch_s,
    cpu_stretch_terms,
    cpu_work_s,
    max_min_rates,
    ring_allreduce_after_arrivals,
    transfer_s,
    transfer_terms,
)

sizes = st.floats(1.0, 1e9)
latencies = st.floats(0.0, 1e-2)
bandwidths = st.floats(1e6, 1e11)
schedules = st.sampled_from(ALLREDUCE_ALGORITHMS)


@given(n=st.integers(1, 512), S=sizes, beta=bandwidths, alpha=latencies, schedule=schedules)
def test_allreduce_terms_are_the_forward_law(n, S, beta, alpha, schedule):
    """The fit's design row, dotted with (alpha, 1/beta), is the simulator's allreduce time."""
    rounds, sent = allreduce_terms(n, S, schedule)
    assert rounds * alpha + sent / beta == pytest.approx(allreduce_s(n, S, beta, alpha, schedule), rel=1e-12, abs=0)
    if n == 1:
        assert allreduce_s(n, S, beta, alpha, schedule) == 0.0


@given(n=st.lists(st.integers(2, 256), min_size=1, max_size=8), S=st.floats(1e3, 1e9), schedule=schedules)
def test_allreduce_terms_broadcast_over_group_sizes(n, S, schedule):
    rounds, sent = allreduce_terms(np.array(n, dtype=float), S, schedule)
    assert rounds.tolist() == [allreduce_rounds(k, schedule) for k in n]
    assert sent == pytest.approx([allreduce_bytes(k, S) for k in n], rel=1e-15)


@given(n=st.integers(2, 4096), n_params=st.integers(1, 10**8), itemsize=st.sampled_from([1, 2, 4, 8]))
def test_group_size_is_recovered_from_the_bytes_a_rank_sent(n, n_params, itemsize):
    S = n_params * itemsize
    sent, _ = wire_bytes(AllReduce(group=tuple(range(n)), payload="grad"), n_params, itemsize)
    if S * 2 >= 4 * n * n:  # the integer wire count tells groups apart only when S is large beside n^2
        assert allreduce_group_size(float(sent), float(S)) == n
    assert abs(allreduce_bytes(n, S) - sent) < 1.0


@given(S=sizes, beta=bandwidths, alpha=latencies)
def test_transfer_terms_are_the_forward_law(S, beta, alpha):
    a, b = transfer_terms(S)
    assert a * alpha + b / beta == transfer_s(S, beta, alpha)


@given(
    n=st.integers(2, 64),
    cores=st.integers(1, 16),
    S=sizes,
    w_m=st.floats(0, 1e-3),
    w_b=st.floats(0, 1e-8),
    schedule=schedules,
)
def test_cpu_stretch_terms_are_the_forward_law(n, cores, S, w_m, w_b, schedule):
    """The host-CPU fit's design row, dotted with (w_m, w_b), is the stretch the simulator adds."""
    work = cpu_work_s(allreduce_messages(n, schedule), allreduce_bytes(n, S), w_m, w_b)
    a, b = cpu_stretch_terms(np.array([n]), S, cores, schedule)
    expected = cpu_stretch_s(n, cores, work)
    got = float(a[0] * w_m + b[0] * w_b)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-300) if n > cores else got <= 0.0 and expected == 0.0


@given(
    paths=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True), min_size=1, max_size=8),
    caps=st.lists(st.floats(0.1, 20.0), min_size=8, max_size=8),
    capacity=st.floats(1.0, 10.0),
)
def test_max_min_rates_fill_no_link_beyond_capacity_and_give_every_transfer_a_bottleneck(paths, caps, capacity):
    """The max-min fair allocation's characterisation: the rates are feasible (no link carries
    more than its capacity, no transfer more than its cap), and every transfer is either at its
    cap or crosses a full link on which no transfer moves faster than it does."""
    caps = caps[: len(paths)]
    rates = max_min_rates(paths, capacity, caps)
    load: dict[int, float] = {}
    for path, rate in zip(paths, rates):
        for link in path:
            load[link] = load.get(link, 0.0) + rate
    assert all(v <= capacity * (1 + 1e-9) for v in load.values())
    for i, (path, rate) in enumerate(zip(paths, rates)):
        assert 0.0 < rate <= caps[i] * (1 + 1e-9)
        at_cap = rate >= caps[i] * (1 - 1e-9)
        bottleneck = any(
            load[link] >= capacity * (1 - 1e-9)
            and all(rates[j] <= rate * (1 + 1e-9) for j, other in enumerate(paths) if link in other)
            for link in path
        )
        assert at_cap or bottleneck


def test_allgather_is_the_allgather_half_of_an_allreduce():
    for schedule in ALLREDUCE_ALGORITHMS:
        assert allgather_s(8, 8e6, 1e9, 1e-5, schedule) == pytest.approx(
            allreduce_s(8, 8e6, 1e9, 1e-5, schedule) / 2, rel=1e-12
        )


def test_unknown_schedule_is_a_one_line_error():
    with pytest.raises(ValueError, match="allreduce algorithm"):
        allreduce_s(4, 1.0, 1.0, 1.0, "tree")


def test_exchange_kind_codes_are_the_trace_codes():
    """Traces on disk store these integers: the enum must never renumber them."""
    assert {k.name: int(k) for k in ExchangeKind} == {
        "NONE": 0,
        "ALLREDUCE": 1,
        "PAIRWISE": 2,
        "GOSSIP": 3,
        "SERVER": 4,
        "BARRIER": 5,
    }
    assert EXCHANGE_KINDS == {AllReduce: 1, PairwiseAverage: 2, Gossip: 3, ServerExchange: 4, Barrier: 5}
    assert [kind_name(k) for k in range(6)] == ["none", "allreduce", "pairwise", "gossip", "server", "barrier"]
    assert kind_of(ServerExchange(op="delta")) is ExchangeKind.SERVER


#: (registry name, parameters) of every algorithm and variant, and whether its schedule allreduces the model
CASES = [
    ("sgd", {}, False),
    ("ssgd", {}, False),
    ("asgd", {}, False),
    ("bsp", {}, True),
    ("bmuf", {}, True),
    ("bmuf", {"variant": "nesterov"}, True),
    ("easgd", {"variant": "async"}, False),
    ("easgd", {"variant": "sync"}, True),
    ("dpsgd", {}, False),
    ("adpsgd", {}, False),
    ("adpsgd", {"variant": "random"}, False),
    ("hadpsgd", {"gpus_per_node": 2}, False),
]


def test_cases_cover_the_registry():
    assert {name for name, _, _ in CASES} == set(ALGORITHMS)


@pytest.mark.parametrize("name, params, expected", CASES, ids=lambda x: str(x))
def test_folds_model_is_true_exactly_for_model_allreducing_schedules(name, params, expected):
    n = 1 if name == "sgd" else 4
    alg = make_algorithm(name, n_workers=n, **params)
    steps = [alg.exchanges(s, r) for s in range(20) for r in range(n)]
    assert any(folds_model(exs) for exs in steps) is expected
    # the question is the schedule's: a model allreduce in some step, and only then
    assert all(folds_model(exs) == any(type(ex) is AllReduce and ex.payload == "model" for ex in exs) for exs in steps)


def _ring_by_chunks(ahead, slow, step):
    """The ring chunk by chunk, written apart from the law: every (edge, step) transfer starts
    once its sender has arrived, its edge is free and its chunk has come in from upstream."""
    n = len(ahead)
    end: dict[tuple[int, int], float] = {}
    for k in range(2 * (n - 1)):
        for i in range(n):
            ready = [-ahead[i]]
            if k:
                ready += [end[i, k - 1], end[(i - 1) % n, k - 1]]
            end[i, k] = max(ready) + (step if slow[i] else 0.0)
    before = sum(min(step, max(0.0, step - t)) for (i, _k), t in end.items() if slow[i])
    return max(end.values()), before / (2 * (n - 1) * sum(slow) * step)


@given(
    ahead=st.lists(st.floats(0.0, 20.0), min_size=2, max_size=12),
    slow_bits=st.lists(st.booleans(), min_size=12, max_size=12),
    step=st.floats(1e-3, 2.0),
)
def test_a_ring_whose_members_arrive_apart_is_its_chunks_dependencies(ahead, slow_bits, step):
    """The ring's head start agrees with a chunk-by-chunk reference; it never takes longer than
    the ring itself (2(n-1) steps) once the last member is here, and takes just that when
    every member is on time or every edge is slow (the last member's chunk crosses each edge
    twice); what was done before is a fraction."""
    n = len(ahead)
    ahead = [*ahead[:-1], 0.0]  # the last member
    slow = [*slow_bits[: n - 1], True]  # at least one edge between hosts
    left, done = ring_allreduce_after_arrivals(ahead, slow, step)
    ref_left, ref_done = _ring_by_chunks(ahead, slow, step)
    assert left == pytest.approx(ref_left, rel=1e-9, abs=1e-9)
    assert done == pytest.approx(ref_done, rel=1e-9, abs=1e-9)
    ring = 2 * (n - 1) * step
    assert left <= ring * (1 + 1e-12) and 0.0 <= done <= 1.0
    assert ring_allreduce_after_arrivals([0.0] * n, slow, step) == pytest.approx((ring, 0.0))
    assert ring_allreduce_after_arrivals(ahead, [True] * n, step)[0] == pytest.approx(ring)


def test_a_late_member_of_a_ring_across_two_hosts_leaves_the_edges_between_them_less_to_carry():
    """Two hosts of four, member 1 late: of the 14 chunks each edge between hosts carries, the
    one leaving host 0 (3 to 4) sent 2 before member 1 arrived (those without its
    contribution), the one leaving host 1 (7 to 0) sent 6; the ring ends 12 chunk times after
    member 1 arrives. With member 3 late, the edge it sends on has sent nothing: 14."""
    ahead = [9.0] * 8
    ahead[1] = 0.0
    edges = [False, False, False, True] * 2
    assert ring_allreduce_after_arrivals(ahead, edges, 1.0) == pytest.approx((12.0, 8 / 28))
    ahead = [9.0] * 8
    ahead[3] = 0.0
    assert ring_allreduce_after_arrivals(ahead, edges, 1.0)[0] == pytest.approx(14.0)


def _progressive_filling(paths, capacity, caps):
    """max_min_rates as first written (every link's free members listed again after each
    level): the arithmetic the faster bookkeeping must keep bit for bit."""
    rates = [0.0] * len(paths)
    free = dict.fromkeys(range(len(paths)))
    users: dict[int, list[int]] = {}
    for i, path in enumerate(paths):
        for link in path:
            users.setdefault(link, []).append(i)
    room = dict.fromkeys(users, capacity)
    level = 0.0
    while free:
        step = min(caps[i] for i in free) - level
        for link, members in users.items():
            share = room[link] / len(members)
            if share < step:
                step = share
        level += max(step, 0.0)
        done = [i for i in free if caps[i] - level <= 1e-12 * caps[i]]
        for link, members in users.items():
            room[link] -= step * len(members)
            if room[link] <= 1e-12 * capacity:
                done.extend(members)
        for i in done:
            if i in free:
                del free[i]
                rates[i] = level
        if done:
            users = {link: kept for link, members in users.items() if (kept := [i for i in members if i in free])}
    return rates


@given(
    paths=st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=4), min_size=1, max_size=24),
    caps=st.lists(st.sampled_from([1.0, 2.5, 3.0, 7.0, 1e9]) | st.floats(0.1, 20.0), min_size=24, max_size=24),
    capacity=st.sampled_from([1.0, 6.0, 1.125e10]) | st.floats(1.0, 10.0),
)
def test_max_min_rates_are_those_of_the_progressive_filling_bit_for_bit(paths, caps, capacity):
    """The simulator's predictions depend on every bit of these rates (they set when transfers
    end), so the bookkeeping may change but not the arithmetic."""
    caps = caps[: len(paths)]
    assert max_min_rates(paths, capacity, caps) == _progressive_filling(paths, capacity, caps)


@given(
    pairs=st.lists(
        st.tuples(st.integers(0, 7), st.integers(0, 7), st.booleans()).filter(lambda p: p[0] != p[1]),
        min_size=1,
        max_size=30,
    ),
    caps=st.lists(st.sampled_from([1.0, 1.0, 1.0, 2.5, 0.4]), min_size=30, max_size=30),
    capacity=st.sampled_from([1.0, 6.0, 1.125e10]),
)
def test_max_min_rates_of_transfers_between_hosts_are_those_of_the_progressive_filling(pairs, caps, capacity):
    """Transfers between hosts as the NICs carry them (each NIC two links, one a direction; an
    average both ways, a gossip's send one way): the links that carry the same transfers fill
    as one, bit for bit."""
    paths = [(2 * a, 2 * b + 1, 2 * b, 2 * a + 1) if both else (2 * a, 2 * b + 1) for a, b, both in pairs]
    caps = [c * capacity for c in caps[: len(paths)]]
    assert max_min_rates(paths, capacity, caps) == _progressive_filling(paths, capacity, caps)


@given(
    first=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), min_size=1, max_size=10),
    second=st.lists(st.lists(st.integers(6, 11), min_size=1, max_size=3), min_size=1, max_size=10),
    caps=st.lists(st.floats(0.1, 20.0), min_size=20, max_size=20),
    capacity=st.floats(1.0, 10.0),
)
def test_max_min_rates_of_transfers_that_share_no_link_are_those_of_each_group(first, second, caps, capacity):
    """Two groups that share no link do not meet: filling them together gives each group's own
    rates up to rounding (the levels the other group adds change the last bits, no more); so a
    simulator may fill only the group that a join or a departure touches."""
    paths = first + second
    caps = caps[: len(paths)]
    together = max_min_rates(paths, capacity, caps)
    apart = max_min_rates(first, capacity, caps[: len(first)]) + max_min_rates(second, capacity, caps[len(first) :])
    assert together == pytest.approx(apart, rel=1e-12, abs=0)
