r"""Membership changes: the topology of a gossip run rebuilt over the workers that survive.

When workers die, the survivors go on with a schedule over themselves. :func:`rebuild` takes the
original :class:`~psgdlab.core.graphs.topology.Topology` and the surviving ranks and returns a
:class:`Rebuilt` topology over them: its mixing matrix of every round is doubly stochastic (the
survivors' average is kept) and symmetric, indexed by the survivors in ascending rank order, and
:meth:`Rebuilt.peers` speaks in the original ranks.

Rules, by kind (ALGORITHMS.md §A.7-§A.10 for the original schedules):

- **static** (``ring``, ``torus``, ``complete``, ``exponential``): the same kind over the ``k``
  survivors, relabelled; where ``k`` is too small for the kind (a ring of 2, a torus without a
  3 x 3 factorisation) the next kind that exists: ``torus`` -> ``ring`` -> ``complete``;
- **matchings** (``fixed-ring``, ``random-ring``, ``hypercube``): the same kind over an even
  number of survivors (``hypercube`` needs a power of two, else ``fixed-ring``). An **odd**
  number is not refused: each round one survivor sits out -- survivor ``t mod k`` in round ``t``,
  so each sits out once every ``k`` rounds -- and the others are matched by the kind's rule over
  the ``k - 1`` in ring order from the one after it. The idle survivor's row is :math:`e_i` (it
  keeps its model), so the matrix stays doubly stochastic, and over ``k`` rounds every pair of
  ring neighbours meets, so the product of the rounds mixes everyone;
- **hierarchical** (H-ADPSGD): a node that lost some GPUs goes on with the rest of its node (its
  super-learner is the exact average over its surviving members); a node that lost all of them
  leaves the super-ring; the surviving nodes follow the inner matching rule above (an odd number
  of nodes: one node sits out per round). Two nodes that mix take the exact average over their
  union, :math:`J/(m_a + m_b)` on it: for equal node sizes this is :math:`T_t \otimes J_m/m`,
  and for unequal ones it is still doubly stochastic (weights by member, not by node).

Examples
--------
>>> from psgdlab.core.graphs.topology import build_topology
>>> r = rebuild(build_topology("fixed-ring", 6), alive=(0, 1, 2, 4, 5))
>>> r.members, r.idle(0)
((0, 1, 2, 4, 5), 0)
>>> [r.peers(rank, 0) for rank in r.members]
[(), (2,), (1,), (5,), (4,)]
>>> h = rebuild(build_topology("hierarchical", 8, gpus_per_node=2), alive=(0, 1, 2, 4, 5, 6, 7))
>>> h.nodes
((0, 1), (2,), (4, 5), (6, 7))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from psgdlab.core.errors import TopologyError, require
from psgdlab.core.exchange import AllReduce, Barrier, Exchange, Gossip, PairwiseAverage
from psgdlab.core.graphs.topology import STATIC_KINDS, Topology, build_topology, torus_shape

__all__ = ["Rebuilt", "rebuild", "survivor_exchanges", "without_peers"]

_MATCHING = ("fixed-ring", "random-ring", "hypercube")


def _static_kind(kind: str, k: int) -> str:
    """The static kind that exists over ``k`` workers, falling back torus -> ring -> complete."""
    if kind == "torus":
        try:
            torus_shape(k)
            return "torus"
        except TopologyError:
            kind = "ring"
    if kind in ("ring", "exponential") and k < 3:
        return "complete"
    return kind


def _matching_kind(kind: str, k: int) -> str:
    if kind == "hypercube" and (k & (k - 1)) != 0:
        return "fixed-ring"
    return kind


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """A topology over the survivors (module docstring).

    ``members`` are the surviving original ranks in ascending order (matrix index ``i`` is
    ``members[i]``); ``nodes`` the surviving members of each surviving node (hierarchical; one
    node per member otherwise); ``kind`` the rule the survivors follow and ``inner`` the
    :class:`Topology` it uses over ``units`` (members, or nodes) when their count allows one.
    """

    original: Topology
    members: tuple[int, ...]
    nodes: tuple[tuple[int, ...], ...]
    kind: str
    inner: Topology | None

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def units(self) -> int:
        """What the inner rule matches: nodes (hierarchical) or members."""
        return len(self.nodes)

    @property
    def is_static(self) -> bool:
        return self.kind in STATIC_KINDS

    def idle(self, round: int) -> int | None:
        """The unit (node index, or member index) that sits out ``round`` when a matching rule
        has an odd number of units; ``None`` otherwise."""
        if self.is_static or self.units % 2 == 0 or self.units == 1:
            return None
        return round % self.units

    def unit_pairs(self, round: int) -> list[tuple[int, int]]:
        """Pairs ``(a, b)``, ``a < b``, of units (indices into :attr:`nodes`) that mix in
        ``round`` under a matching rule; the static kinds have none (they mix by
        :meth:`matrix`)."""
        return [] if self.is_static else [(min(a, b), max(a, b)) for a, b in self._unit_pairs(round)]

    def _unit_pairs(self, round: int) -> list[tuple[int, int]]:
        """Pairs of units that mix in ``round``."""
        u = self.units
        if u <= 1:
            return []
        idle = self.idle(round)
        if idle is None:
            assert self.inner is not None
            perm = self.inner.matching(round)
            assert perm is not None
            return [(i, int(perm[i])) for i in range(u) if i < int(perm[i])]
        order = [(idle + 1 + j) % u for j in range(u - 1)]  # ring order from the one after the idle unit
        assert self.inner is not None
        perm = self.inner.matching(round // u)
        assert perm is not None
        return [(order[i], order[int(perm[i])]) for i in range(u - 1) if i < int(perm[i])]

    def matrix(self, round: int = 0) -> NDArray[np.float64]:
        """The ``size x size`` mixing matrix of ``round`` (index ``i`` is ``members[i]``)."""
        k = self.size
        if self.is_static:
            assert self.inner is not None
            return self.inner.matrix(round)
        index = {r: i for i, r in enumerate(self.members)}
        W = np.zeros((k, k))
        groups = [list(node) for node in self.nodes]
        paired: set[int] = set()
        for a, b in self._unit_pairs(round):
            union = [index[r] for r in groups[a] + groups[b]]
            W[np.ix_(union, union)] = 1.0 / len(union)
            paired.update((a, b))
        for u, node in enumerate(groups):
            if u not in paired:
                own = [index[r] for r in node]
                W[np.ix_(own, own)] = 1.0 / len(own)
        return W

    def peers(self, rank: int, round: int = 0) -> tuple[int, ...]:
        """The original ranks ``rank`` mixes with in ``round`` (not itself)."""
        require(rank in self.members, "rank", rank, f"must be a survivor ({', '.join(map(str, self.members))})")
        i = self.members.index(rank)
        row = self.matrix(round)[i]
        return tuple(self.members[j] for j in np.flatnonzero(row) if j != i)

    def mean_square_matrix(self) -> NDArray[np.float64]:
        r""":math:`E[W_t^\top W_t]` over one full cycle of the rebuilt schedule (the rounds after
        which the idle unit and the inner matching repeat; for random kinds, 64 rounds)."""
        if self.is_static:
            W = self.matrix(0)
            return np.asarray(W.T @ W)
        inner_period = self.inner.period if self.inner is not None else 1
        rounds = 64 if inner_period is None else max(1, inner_period) * max(1, self.units)
        return np.mean([self.matrix(t).T @ self.matrix(t) for t in range(rounds)], axis=0)  # type: ignore[no-any-return]

    def spectral_gap(self) -> float:
        r"""``1 - λ_2`` of :meth:`mean_square_matrix` (ALGORITHMS.md §B.1); 1 for one survivor."""
        if self.size == 1:
            return 1.0
        lam = np.sort(np.linalg.eigvalsh(self.mean_square_matrix()))[::-1]
        return float(1.0 - lam[1])


def rebuild(topology: Topology, alive: Iterable[int]) -> Rebuilt:
    """The topology of ``topology``'s schedule over the surviving ranks ``alive`` (module
    docstring); at least one must survive."""
    members = tuple(sorted({int(r) for r in alive}))
    n = topology.n_workers
    require(len(members) >= 1, "survivors", members, "must hold at least one rank")
    require(all(0 <= r < n for r in members), "survivors", members, f"must be ranks in [0, {n})")
    kind = topology.kind
    k = len(members)
    if kind == "hierarchical":
        m = topology.gpus_per_node or 1
        nodes = tuple(
            tuple(r for r in members if r // m == node)
            for node in range(n // m)
            if any(r // m == node for r in members)
        )
        inner_kind = topology.inner or "fixed-ring"
        return Rebuilt(topology, members, nodes, "hierarchical", _inner(inner_kind, len(nodes), topology.seed))
    singles = tuple((r,) for r in members)
    if kind in STATIC_KINDS:
        static = _static_kind(kind, k)
        return Rebuilt(topology, members, singles, static, build_topology(static, k) if k >= 1 else None)
    require(kind in _MATCHING, "topology kind", kind, "has no rebuild rule")
    matching = _matching_kind(kind, k)
    return Rebuilt(topology, members, singles, matching, _inner(matching, k, topology.seed))


def _inner(kind: str, units: int, seed: int) -> Topology | None:
    """The matching over ``units`` (or its even part ``units - 1``); ``None`` below two."""
    even = units if units % 2 == 0 else units - 1
    if even < 2:
        return None
    kind = _matching_kind(kind, even)
    extra: dict[str, Any] = {"seed": seed} if kind == "random-ring" else {}
    return build_topology(kind, even, **extra)


def survivor_exchanges(rebuilt: Rebuilt, template: Sequence[Exchange], rank: int, round: int) -> tuple[Exchange, ...]:
    r"""The exchanges of survivor ``rank`` in ``round`` of the schedule rebuilt over the survivors.

    ``template`` is what the original schedule gives ``rank`` at that step
    (:meth:`~psgdlab.core.algorithms.Algorithm.exchanges`): its exchange *kinds* are kept, their
    peers, weights and groups come from ``rebuilt`` (so the rule depends on no algorithm name):

    - :class:`AllReduce`, :class:`Barrier` -- over the group's survivors (dropped when one is left:
      a node that lost all but one GPU);
    - :class:`Gossip` -- column ``rank`` of :meth:`Rebuilt.matrix` (peers, their weights, the self
      weight);
    - :class:`PairwiseAverage` -- with the partner of ``rank``'s unit in :meth:`Rebuilt.unit_pairs`
      (none when its unit sits out the round); the unit of lower index is active. Two nodes of
      ``m`` and ``m'`` survivors split the model into ``k = max(m, m')`` slices; slice ``j`` is
      averaged by survivor ``j mod m`` of one and ``j mod m'`` of the other (equal nodes: the
      original rule, one slice each, ``l`` with ``l``; a member of the smaller node averages
      several, one record each), each node weighted by its size (``weight``: the partner's
      ``m' / (m + m')``), so every member of the union ends with its mean, :meth:`Rebuilt.matrix`.

    Examples
    --------
    >>> from psgdlab.core.algorithms import make_algorithm
    >>> a = make_algorithm("adpsgd", n_workers=6)
    >>> r = rebuild(a.membership_topology(), alive=(0, 1, 2, 4, 5))
    >>> survivor_exchanges(r, a.exchanges(1, 0), 0, 1)  # round 1: rank 1 sits out, 0 pairs with 5
    (PairwiseAverage(peer=5, active=True, blocking=False, shard=0, n_shards=1, gather_group=(), weight=0.5),)
    >>> survivor_exchanges(r, a.exchanges(1, 1), 1, 1)
    ()

    H-ADPSGD nodes of 2 GPUs, rank 1 dead: rank 0, alone on its node, averages both slices, with
    ranks 2 and 3, and weighs theirs 2:1.

    >>> h = make_algorithm("hadpsgd", n_workers=4, gpus_per_node=2)
    >>> r = rebuild(h.membership_topology(), alive=(0, 2, 3))
    >>> [(e.peer, e.shard, e.n_shards, round(e.weight, 3)) for e in survivor_exchanges(r, h.exchanges(0, 0), 0, 0)]
    [(2, 0, 2, 0.667), (3, 1, 2, 0.667)]
    """
    require(rank in rebuilt.members, "rank", rank, "must be a survivor")
    alive = set(rebuilt.members)
    out: list[Exchange] = []
    for ex in template:
        if isinstance(ex, (AllReduce, Barrier)):
            group = tuple(r for r in ex.group if r in alive)
            if len(group) > 1:
                out.append(
                    AllReduce(group=group, payload=ex.payload, blocking=ex.blocking)
                    if isinstance(ex, AllReduce)
                    else Barrier(group=group)
                )
        elif isinstance(ex, Gossip):
            out.append(_gossip_column(rebuilt, ex, rank, round))
        elif isinstance(ex, PairwiseAverage):
            out.extend(_pairwise(rebuilt, ex, rank, round))
        else:
            raise TopologyError(f"exchange {type(ex).__name__} has no rule over survivors")
    return tuple(out)


def _gossip_column(rebuilt: Rebuilt, ex: Gossip, rank: int, round: int) -> Gossip:
    i = rebuilt.members.index(rank)
    col = rebuilt.matrix(round)[:, i]
    peers = [j for j in np.flatnonzero(col) if j != i]
    return Gossip(
        peers=tuple(rebuilt.members[j] for j in peers),
        weights=tuple(float(col[j]) for j in peers),
        self_weight=float(col[i]),
        blocking=ex.blocking,
    )


def _pairwise(rebuilt: Rebuilt, ex: PairwiseAverage, rank: int, round: int) -> tuple[PairwiseAverage, ...]:
    """``rank``'s slices of its unit's pairwise average in ``round`` (none when its unit sits out)."""
    unit = next(u for u, node in enumerate(rebuilt.nodes) if rank in node)
    for a, b in rebuilt.unit_pairs(round):
        if unit in (a, b):
            own, other = rebuilt.nodes[unit], rebuilt.nodes[b if unit == a else a]
            k = max(len(own), len(other))  # slices: one per member of the larger node
            local = own.index(rank)
            return tuple(
                PairwiseAverage(
                    peer=other[j % len(other)],
                    active=unit == a,
                    blocking=ex.blocking,
                    shard=j,
                    n_shards=k,
                    gather_group=own if len(own) > 1 else (),
                    weight=len(other) / (len(own) + len(other)),  # exactly 0.5 between equal nodes
                )
                for j in range(local, k, len(own))
            )
    return ()


def without_peers(ex: Gossip, dead: Iterable[int]) -> Gossip:
    r"""``ex`` without its ``dead`` peers, their weights added to the self weight.

    Applied by every member to the same matrix :math:`W`, this sets :math:`W_{ij} = 0` for a dead
    :math:`j` and adds it to :math:`W_{ii}`: still symmetric and doubly stochastic over the living.
    It is what members of a blocking gossip do between a death and the step at which they all
    switch to the :func:`rebuild` schedule (they cannot all switch at once without a barrier).

    >>> without_peers(Gossip(peers=(1, 3), weights=(0.25, 0.25), self_weight=0.5), dead=[3])
    Gossip(peers=(1,), weights=(0.25,), self_weight=0.75, blocking=True)
    """
    dead = set(dead)
    keep = [(p, w) for p, w in zip(ex.peers, ex.weights) if p not in dead]
    gone = sum(w for p, w in zip(ex.peers, ex.weights) if p in dead)
    return Gossip(
        peers=tuple(p for p, _ in keep),
        weights=tuple(w for _, w in keep),
        self_weight=ex.self_weight + gone,
        blocking=ex.blocking,
    )
