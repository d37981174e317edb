"""Shared links (sim.network.FairLinks): the bookkeeping is free to change, the arithmetic is not."""

from __future__ import annotations

import math
import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.platform.cost import max_min_rates
from psgdlab.sim.network import FairLinks


class _Reference:
    """FairLinks as simply as it can be written: after any join or departure that shares a link,
    every group's rates from the progressive filling over that group (no closed form, no
    bookkeeping of counts or of who is where), every end from one pass per quantity."""

    def __init__(self, capacity: float) -> None:
        self._capacity = capacity
        self._flows: dict[int, list[Any]] = {}
        self._now = 0.0
        self._count: dict[int, int] = {}

    def add(self, key: int, links: tuple[int, ...], nbytes: float, cap: float, t: float) -> list[tuple[int, float]]:
        ended = self.advance(t)
        alone = all(self._count.get(link, 0) == 0 for link in links)
        self._flows[key] = [links, float(nbytes), cap, min(cap, self._capacity)]
        for link in links:
            self._count[link] = self._count.get(link, 0) + 1
        if not alone:
            self._rates()
        return ended

    def advance(self, t: float) -> list[tuple[int, float]]:
        ended: list[tuple[int, float]] = []
        flows = self._flows
        while flows:
            first = min(f[1] / f[3] for f in flows.values())
            if self._now + first > t:
                dt = t - self._now
                if dt > 0.0:
                    for f in flows.values():
                        f[1] -= f[3] * dt
                break
            self._now += first
            done = [key for key, f in flows.items() if f[1] / f[3] <= first * (1.0 + 1e-9) + 1e-15]
            for f in flows.values():
                f[1] -= f[3] * first
            shared = False
            for key in done:
                for link in flows.pop(key)[0]:
                    self._count[link] -= 1
                    shared = shared or self._count[link] > 0
                ended.append((key, self._now))
            if shared:
                self._rates()
        self._now = max(self._now, t)
        return ended

    def next_end(self) -> float:
        if not self._flows:
            return math.inf
        return self._now + min(f[1] / f[3] for f in self._flows.values())

    def _rates(self) -> None:
        for group in _groups(list(self._flows.values())):
            rates = max_min_rates([f[0] for f in group], self._capacity, [f[2] for f in group])
            for f, rate in zip(group, rates):
                f[3] = rate


def _groups(flows: list[list[Any]]) -> list[list[list[Any]]]:
    """The transfers linked through links they share, transitively."""
    groups: list[tuple[set[int], list[list[Any]]]] = []
    for f in flows:
        links, members = set(f[0]), [f]
        for g in [g for g in groups if g[0] & links]:
            groups.remove(g)
            links |= g[0]
            members += g[1]
        groups.append((links, members))
    return [members for _links, members in groups]


#: a transfer: its links (distinct), its bytes, its cap as a multiple of the capacity, and the
#: time from the previous event at which it joins
_transfers = st.tuples(
    st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True),
    st.floats(1e3, 1e9),
    st.sampled_from([1.0, 1.0, 1.0, 3.0, 0.3, 0.71]),
    st.floats(0.0, 2.0),
)


@given(
    transfers=st.lists(_transfers, min_size=1, max_size=40),
    capacity=st.sampled_from([1.0, 1.125e10, 6.25e8]),
    shape=st.sampled_from(["any", "pairs", "paths"]),
)
def test_fair_links_end_every_transfer_where_the_progressive_filling_does(transfers, capacity, shape):
    """The same joins give the same ends, bit for bit, as the plain rule: rates from the
    filling over each group, whether they come from the closed form (no link with more than
    two transfers, none capped below the capacity: ``pairs`` keeps the draws near there, the
    processes' and a fixed ring's case), from one path's share (``paths``: transfers between
    two hosts' NICs, H-ADPSGD's node pairs), from the filling over the one group a join or a
    departure touches, or are kept."""
    new, ref = FairLinks(capacity), _Reference(capacity)
    t = 0.0
    for key, (links, nbytes, cap, gap) in enumerate(transfers):
        if shape == "pairs":
            links = [links[0] % 4, 4 + links[0] % 4] if key % 2 else [links[0] % 4]
            cap = max(cap, 1.0)
        elif shape == "paths":
            links = [(0, 1, 2, 3), (2, 3, 0, 1), (4, 5, 6, 7), (2, 3, 4, 5)][links[0] % 4]
            cap = max(cap, 1.0)
        t += gap * 1e9 / capacity
        got = new.add(key, tuple(links), nbytes, cap * capacity, t)
        assert got == ref.add(key, tuple(links), nbytes, cap * capacity, t)
        assert new.next_end() == ref.next_end()
        assert all(new.active(link) == ref._count.get(link, 0) for link in range(8))
    end = new.next_end()
    while end < math.inf:
        assert new.advance(end) == ref.advance(end)
        end = new.next_end()
        assert end == ref.next_end()


def test_fair_links_match_the_plain_rule_over_long_seeded_runs():
    """Long runs where groups form, bridge and split (a departing transfer that linked two
    groups leaves two to fill apart), with caps below and above the capacity: ends bit for bit."""
    rng = random.Random(7)
    paths = [(0, 1, 2, 3), (2, 3, 0, 1), (4, 5, 6, 7), (2, 3, 4, 5), (8, 9), (9, 10), (0,), (11, 12, 13, 14)]
    for _ in range(200):
        capacity = rng.choice([1.0, 1.125e10, 6.25e8])
        new, ref = FairLinks(capacity), _Reference(capacity)
        t = 0.0
        for key in range(rng.randint(1, 60)):
            links = rng.choice(paths) if rng.random() < 0.6 else tuple(rng.sample(range(16), rng.randint(1, 4)))
            cap = rng.choice([1.0, 1.0, 2.0, 0.5, 0.9]) * capacity
            t += rng.expovariate(1.0) * 1e9 / capacity * rng.choice([0.0, 0.3, 1.0])
            nbytes = rng.uniform(1e3, 2e9)
            assert new.add(key, links, nbytes, cap, t) == ref.add(key, links, nbytes, cap, t)
            assert new.next_end() == ref.next_end()
        end = new.next_end()
        while end < math.inf:
            assert new.advance(end) == ref.advance(end)
            end = new.next_end()
            assert end == ref.next_end()
