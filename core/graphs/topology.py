r"""Topologies: which workers mix with which, round by round (ALGORITHMS.md §A.9, §A.10, §B.2).

A :class:`Topology` is a small frozen value (kind, worker count, GPUs per node, seed); the mixing
matrix :math:`T_t` of round ``t`` is derived on demand by :meth:`Topology.matrix`, never stored.
Learners are columns: :math:`\Theta_{t+1} = \Theta_t T_t` (ALGORITHMS.md §A.0). Every matrix is
doubly stochastic; all of them are symmetric.

Kinds
-----
Static (the same ``W`` every round; D-PSGD):

``ring``
    Cycle with weights 1/3 (self and both neighbours); ``n >= 3``.
    :math:`\lambda_2 = (1 + 2\cos(2\pi/n))/3`.
``torus``
    2-D ``r x c`` torus, the most square factorisation of ``n`` with ``r, c >= 3``, weights 1/5.
    For ``k x k``: :math:`\lambda_2 = (3 + 2\cos(2\pi/k))/5`.
``complete``
    :math:`J/n` (SSGD's exact average); gap 1.
``exponential``
    Static undirected exponential graph: ``i`` is joined to ``i ± 2^k (mod n)`` for every
    :math:`2^k \le n - 1`, uniform weights :math:`1/(\deg+1)` (circulant, regular).

Matching-based, time-varying (one peer per round, :math:`T_t = \tfrac12(I + P_t)`; ADPSGD):

``fixed-ring``
    IBM's fixed ring. Even rounds use :math:`P_L` = pairs (0,1), (2,3), ...; odd rounds
    :math:`P_R` = pairs (1,2), (3,4), ..., (n-1,0) ("left or right neighbour", deterministic
    alternation, ALGORITHMS.md F.1). ``n`` even. In every pair the two ranks have **different
    parity**, so odd ranks can be the active and even ranks the passive side (Lian's bipartite rule:
    no two actives ever wait for each other).
``random-ring``
    A uniformly random perfect matching per round, drawn from ``np.random.default_rng([seed,
    round]).permutation(n)`` by pairing consecutive entries, so every rank computes the same one
    without communicating (ALGORITHMS.md F.10). ``n`` even. Pairs may have **equal parity**; an
    asynchronous runtime needs another rule for who is active (e.g. the lower rank).
``hypercube``
    One-peer hypercube: round ``t`` pairs ``i`` with ``i XOR 2^(t mod log2 n)``; ``n`` a power of two.
    The product of ``log2 n`` consecutive matchings is exactly :math:`J/n`.
``hierarchical``
    H-ADPSGD: ``m = gpus_per_node`` workers of a node form a super-learner (exact average inside the
    node); the ``n_nodes`` super-learners follow ``inner`` (``fixed-ring`` or ``random-ring``):
    :math:`W_t = T_t \otimes J_m/m` over ranks ordered node-major (``rank = node * m + local``).
    ``n_nodes`` even, or 1 (then :math:`W = J/n`).

Odd worker counts cannot be perfectly matched (a perfect matching pairs every worker with exactly
one other), so the matching kinds reject them and point to ``ring``, ``torus`` or ``exponential``
(ALGORITHMS.md F.2).

Examples
--------
>>> t = build_topology("fixed-ring", 6)
>>> t.matching(0).tolist(), t.matching(1).tolist(), t.period
([1, 0, 3, 2, 5, 4], [5, 2, 1, 4, 3, 0], 2)
>>> t.peers(0, 1)
(5,)
>>> build_topology("ring", 5).matrix()[0].round(3).tolist()
[0.333, 0.333, 0.0, 0.0, 0.333]
>>> hierarchical(8, 2).matrix(0)[0].tolist()
[0.25, 0.25, 0.25, 0.25, 0.0, 0.0, 0.0, 0.0]
>>> build_topology("fixed-ring", 7)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
psgdlab.core.errors.TopologyError: workers (7) must be even for fixed-ring: a perfect matching pairs ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from psgdlab.core.config import unknown
from psgdlab.core.errors import ConfigError, TopologyError
from psgdlab.core.graphs.mixing import (
    check_adjacency,
    matching_matrix,
    metropolis_hastings_weights,
    support_components,
    uniform_weights,
)

__all__ = [
    "KINDS",
    "STATIC_KINDS",
    "MATCHING_KINDS",
    "INNER_KINDS",
    "Topology",
    "ring",
    "torus",
    "torus_shape",
    "complete",
    "exponential_graph",
    "hypercube",
    "fixed_ring",
    "random_ring",
    "hierarchical",
    "build_topology",
    "from_networkx",
    "MAX_MATRIX_WORKERS",
]

KINDS: tuple[str, ...] = (
    "ring",
    "torus",
    "complete",
    "exponential",
    "hypercube",
    "fixed-ring",
    "random-ring",
    "hierarchical",
)
STATIC_KINDS: tuple[str, ...] = ("ring", "torus", "complete", "exponential")
MATCHING_KINDS: tuple[str, ...] = ("hypercube", "fixed-ring", "random-ring", "hierarchical")
INNER_KINDS: tuple[str, ...] = ("fixed-ring", "random-ring")

_ODD_HINT = "use ring, torus or exponential for odd counts, or an even worker count"


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _unknown_kind(kind: object) -> ConfigError:
    return unknown("topology kind", kind, KINDS)


def torus_shape(n: int) -> tuple[int, int]:
    """The most square factorisation ``n = r * c`` with ``3 <= r <= c`` used by the ``torus`` kind.

    Raises
    ------
    TopologyError
        When ``n`` has no such factorisation (primes, ``2 * p``, ``n < 9``).

    Examples
    --------
    >>> torus_shape(16), torus_shape(24), torus_shape(9)
    ((4, 4), (4, 6), (3, 3))
    """
    for r in range(math.isqrt(max(n, 0)), 2, -1):
        if n % r == 0 and n // r >= 3:
            return r, n // r
    raise TopologyError(
        f"workers ({n}) has no factorisation r x c with r, c >= 3 for a 2-D torus; "
        "use ring or exponential, or a count such as 9, 12, 16"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """A mixing schedule: kind, size and seed; matrices are derived by :meth:`matrix`.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS` (see the module docstring).
    n_workers : int
        Number of workers (all GPUs for ``hierarchical``).
    gpus_per_node : int, default 1
        Workers per node; ``n_workers`` must be a multiple. Only ``hierarchical`` mixes by node.
    seed : int, default 0
        Seed of the ``random-ring`` schedule (non-negative).
    inner : {"fixed-ring", "random-ring"}, default "fixed-ring"
        Schedule of the super-learners of ``hierarchical`` (must stay default for other kinds).

    Raises
    ------
    ConfigError
        Unknown kind (the closest known one is suggested), a non-integer or negative field, an
        ``inner`` kind for a non-hierarchical topology.
    TopologyError
        A worker count the kind cannot use (the message says why and what to use instead).
    """

    kind: str
    n_workers: int
    gpus_per_node: int = 1
    seed: int = 0
    inner: Literal["fixed-ring", "random-ring"] = "fixed-ring"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise _unknown_kind(self.kind)
        for name in ("n_workers", "gpus_per_node", "seed"):
            value = getattr(self, name)
            if not _is_int(value):
                raise ConfigError(f"{name} ({value!r}) must be an integer")
        if self.n_workers < 1:
            raise TopologyError(f"workers ({self.n_workers}) must be >= 1")
        if self.gpus_per_node < 1:
            raise ConfigError(f"gpus_per_node ({self.gpus_per_node}) must be >= 1")
        if self.seed < 0:
            raise ConfigError(f"seed ({self.seed}) must be >= 0")
        if self.inner not in INNER_KINDS:
            raise ConfigError(f"inner ({self.inner!r}) must be one of {', '.join(INNER_KINDS)}")
        if self.kind != "hierarchical" and self.inner != "fixed-ring":
            raise ConfigError(f"inner ({self.inner!r}) only applies to kind 'hierarchical', not {self.kind!r}")
        if self.n_workers % self.gpus_per_node:
            raise TopologyError(
                f"workers ({self.n_workers}) must be divisible by gpus_per_node "
                f"({self.gpus_per_node}); every node holds the same number of workers"
            )
        _check_size(self.kind, self.n_workers, self.n_nodes)

    # -- derived structure ---------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        """Number of nodes, ``n_workers // gpus_per_node``."""
        return self.n_workers // self.gpus_per_node

    @property
    def period(self) -> int | None:
        """Rounds before the schedule repeats exactly; ``None`` for a random schedule.

        1 for static kinds, 2 for ``fixed-ring`` (1 when ``n = 2``: both matchings are the single
        pair), ``log2 n`` for ``hypercube``, ``None`` for ``random-ring`` with ``n >= 4`` (with 2
        workers there is only one matching: 1); ``hierarchical`` takes the value of its inner
        schedule over ``n_nodes`` super-learners (1 for a single node).
        """
        kind, n = self._schedule()
        if kind in STATIC_KINDS or kind == "single":
            return 1
        if kind == "fixed-ring":
            return 2 if n > 2 else 1
        if kind == "hypercube":
            return max(n.bit_length() - 1, 1)
        return None if n > 2 else 1  # random-ring

    @property
    def is_static(self) -> bool:
        """True when every round uses the same matrix (``period == 1``)."""
        return self.period == 1

    @property
    def is_random(self) -> bool:
        """True when rounds are drawn at random (``period is None``)."""
        return self.period is None

    def _schedule(self) -> tuple[str, int]:
        """(kind, size) of the schedule that varies: the node ring for ``hierarchical``."""
        if self.kind != "hierarchical":
            return self.kind, self.n_workers
        return ("single", 1) if self.n_nodes == 1 else (self.inner, self.n_nodes)

    # -- per-round quantities ----------------------------------------------------------------
    def matching(self, round: int) -> NDArray[np.int64] | None:
        """Partner permutation of round ``round`` (``perm[i]`` = partner of ``i``), or ``None``.

        Defined for ``fixed-ring``, ``random-ring``, ``hypercube`` (length ``n_workers``) and
        ``hierarchical`` (the super-learner ring, length ``n_nodes``; ``[0]`` for one node);
        ``None`` for the static kinds. Deterministic in ``(seed, round)``.
        """
        _check_round(round)
        if self.kind in STATIC_KINDS:
            return None
        kind, n = self._schedule()
        return _matching(kind, n, self.seed if kind == "random-ring" else 0, int(round)).copy()

    def matrix(self, round: int = 0) -> NDArray[np.float64]:
        r"""The ``n_workers x n_workers`` mixing matrix :math:`T_{round}` (doubly stochastic, symmetric).

        For ``hierarchical`` this is :math:`T_{round} \otimes J_m/m` with ranks node-major.
        """
        _check_round(round)
        _require_dense(self.n_workers)
        if self.kind in STATIC_KINDS:
            return _static_matrix(self.kind, self.n_workers).copy()
        perm = self.matching(round)
        assert perm is not None
        T = matching_matrix(perm)
        if self.kind == "hierarchical" and self.gpus_per_node > 1:
            m = self.gpus_per_node
            T = np.kron(T, np.full((m, m), 1.0 / m))
        return T

    def peers(self, rank: int, round: int = 0) -> tuple[int, ...]:
        """Workers ``j != rank`` whose model ``rank`` mixes in round ``round`` (``T[j, rank] > 0``), ascending."""
        if not _is_int(rank) or not 0 <= rank < self.n_workers:
            raise ConfigError(f"rank ({rank!r}) must be an integer in [0, {self.n_workers - 1}]")
        column = self.matrix(round)[:, rank]
        return tuple(int(j) for j in np.flatnonzero(column > 0) if j != rank)


#: the most workers whose mixing matrix is built: it is a dense ``n x n`` float64 array (512 MiB
#: at this size, with integer and weight copies of it alive while it is built)
MAX_MATRIX_WORKERS = 8192


def _require_dense(n: int) -> None:
    """Refuse, before any allocation, a dense ``n x n`` matrix of more than :data:`MAX_MATRIX_WORKERS`."""
    if n > MAX_MATRIX_WORKERS:
        raise ConfigError(
            f"workers ({n}) must be at most {MAX_MATRIX_WORKERS} for a mixing matrix: it is a dense n x n "
            f"float64 array, {_bytes(8 * n * n)} for {n} workers"
        )


def _bytes(n: int) -> str:
    """``728 TiB``: ``n`` bytes in binary units, three figures."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            break
        value /= 1024
    return f"{value:.3g} {unit}"


def _check_round(round: Any) -> None:
    if not _is_int(round) or round < 0:
        raise ConfigError(f"round ({round!r}) must be an integer >= 0")


def _check_size(kind: str, n: int, n_nodes: int) -> None:
    if kind == "ring" and n < 3:
        raise TopologyError(
            f"workers ({n}) must be >= 3 for a ring (a 1/3-weighted cycle needs two distinct "
            "neighbours); use complete for 1 or 2 workers"
        )
    if kind == "torus":
        torus_shape(n)
    if kind == "hypercube" and (n < 2 or n & (n - 1)):
        lower = 1 << (n.bit_length() - 1)
        raise TopologyError(
            f"workers ({n}) must be a power of two >= 2 for hypercube (round t pairs i with "
            f"i XOR 2^t); use {max(lower, 2)} or {max(lower * 2, 2)} workers, or exponential"
        )
    if kind in ("fixed-ring", "random-ring") and n % 2:
        raise TopologyError(
            f"workers ({n}) must be even for {kind}: a perfect matching pairs every worker "
            f"with exactly one other, which needs an even number of workers; {_ODD_HINT}"
        )
    if kind == "hierarchical" and n_nodes > 1 and n_nodes % 2:
        raise TopologyError(
            f"nodes ({n_nodes}) must be even (or 1) for hierarchical: the super-learners are "
            "paired by a perfect matching, which needs an even number of nodes; change "
            "gpus_per_node or the worker count"
        )


@lru_cache(maxsize=4096)
def _matching(kind: str, n: int, seed: int, round: int) -> NDArray[np.int64]:
    idx = np.arange(n, dtype=np.int64)
    if kind == "single" or n == 1:
        perm = idx
    elif kind == "hypercube":
        perm = idx ^ (1 << (round % (n.bit_length() - 1)))
    elif kind == "fixed-ring":
        if round % 2 == 0:  # P_L: (0,1), (2,3), ...
            perm = idx ^ 1
        else:  # P_R: (1,2), (3,4), ..., (n-1,0); odd i -> i+1, even i -> i-1
            perm = np.where(idx % 2 == 1, (idx + 1) % n, (idx - 1) % n)
    else:  # random-ring: shared permutation from (seed, round), consecutive entries paired
        order = np.random.default_rng([seed, round]).permutation(n)
        perm = np.empty(n, dtype=np.int64)
        perm[order[0::2]] = order[1::2]
        perm[order[1::2]] = order[0::2]
    perm.setflags(write=False)
    return perm


@lru_cache(maxsize=256)
def _static_matrix(kind: str, n: int) -> NDArray[np.float64]:
    if kind == "complete":
        W = np.full((n, n), 1.0 / n)
    elif kind == "ring":
        W = _circulant_uniform(n, (1,))
    elif kind == "exponential":
        W = _circulant_uniform(n, tuple(1 << k for k in range(max(n - 1, 1).bit_length()) if 1 << k <= n - 1))
    else:  # torus
        r, c = torus_shape(n)
        A = np.kron(_cycle_adjacency(r), np.eye(c, dtype=np.int64)) + np.kron(
            np.eye(r, dtype=np.int64), _cycle_adjacency(c)
        )
        W = uniform_weights(A)
    W.setflags(write=False)
    return W


def _cycle_adjacency(n: int) -> NDArray[np.int64]:
    idx = np.arange(n)
    A = np.zeros((n, n), dtype=np.int64)
    A[idx, (idx + 1) % n] = A[(idx + 1) % n, idx] = 1
    return A


def _circulant_uniform(n: int, hops: tuple[int, ...]) -> NDArray[np.float64]:
    """Uniform weights on the circulant graph joining ``i`` and ``i ± h (mod n)`` for ``h`` in ``hops``."""
    A = np.zeros((n, n), dtype=np.int64)
    idx = np.arange(n)
    for h in hops:
        A[idx, (idx + h) % n] = A[(idx + h) % n, idx] = 1
    np.fill_diagonal(A, 0)
    return uniform_weights(A)


# -- builders -------------------------------------------------------------------------------------
def ring(n: int) -> Topology:
    """D-PSGD ring on ``n >= 3`` workers, weights 1/3."""
    return Topology(kind="ring", n_workers=n)


def torus(n: int) -> Topology:
    """2-D torus on ``n`` workers (shape :func:`torus_shape`), weights 1/5."""
    return Topology(kind="torus", n_workers=n)


def complete(n: int) -> Topology:
    """Complete graph, :math:`J/n`."""
    return Topology(kind="complete", n_workers=n)


def exponential_graph(n: int) -> Topology:
    """Static undirected exponential graph (hops ``± 2^k``), uniform weights."""
    return Topology(kind="exponential", n_workers=n)


def hypercube(n: int) -> Topology:
    """One-peer hypercube schedule; ``n`` a power of two."""
    return Topology(kind="hypercube", n_workers=n)


def fixed_ring(n: int) -> Topology:
    """IBM ADPSGD fixed ring (alternating ``P_L`` / ``P_R`` matchings); ``n`` even."""
    return Topology(kind="fixed-ring", n_workers=n)


def random_ring(n: int, *, seed: int = 0) -> Topology:
    """Uniformly random perfect matching per round, drawn from ``(seed, round)``; ``n`` even."""
    return Topology(kind="random-ring", n_workers=n, seed=seed)


def hierarchical(
    n_workers: int, gpus_per_node: int, *, inner: Literal["fixed-ring", "random-ring"] = "fixed-ring", seed: int = 0
) -> Topology:
    """H-ADPSGD super-learner ring :math:`T_t \\otimes J_m/m` (``m = gpus_per_node``)."""
    return Topology(kind="hierarchical", n_workers=n_workers, gpus_per_node=gpus_per_node, inner=inner, seed=seed)


def build_topology(
    kind: str,
    n_workers: int,
    *,
    gpus_per_node: int = 1,
    seed: int = 0,
    inner: Literal["fixed-ring", "random-ring"] = "fixed-ring",
) -> Topology:
    """Build a :class:`Topology` by its CLI name (one of :data:`KINDS`); fields as in :class:`Topology`.

    Raises
    ------
    ConfigError
        Unknown ``kind``; the message lists the known kinds and suggests the closest.

    Examples
    --------
    >>> build_topology("randm-ring", 8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: topology kind ('randm-ring') is not known (known: ring, ...); did you mean ...
    """
    if kind not in KINDS:
        raise _unknown_kind(kind)
    return Topology(kind=kind, n_workers=n_workers, gpus_per_node=gpus_per_node, seed=seed, inner=inner)


def from_networkx(graph: Any, *, weights: Literal["metropolis", "uniform"] = "metropolis") -> NDArray[np.float64]:
    """Mixing matrix of an undirected networkx graph (nodes in ``graph.nodes`` order).

    Parameters
    ----------
    graph : networkx.Graph
        Undirected and connected; self loops and edge attributes are ignored (the self weight is set
        by the rule), parallel edges of a multigraph count once.
    weights : {"metropolis", "uniform"}, default "metropolis"
        :func:`~psgdlab.core.graphs.mixing.metropolis_hastings_weights` or
        :func:`~psgdlab.core.graphs.mixing.uniform_weights`.

    Raises
    ------
    TopologyError
        Directed, empty or disconnected graphs.
    ConfigError
        Unknown ``weights`` rule.

    Examples
    --------
    >>> import networkx as nx
    >>> from_networkx(nx.path_graph(3), weights="uniform").round(4).tolist()
    [[0.6667, 0.3333, 0.0], [0.3333, 0.3333, 0.3333], [0.0, 0.3333, 0.6667]]
    """
    import networkx as nx

    rules = {"metropolis": metropolis_hastings_weights, "uniform": uniform_weights}
    if weights not in rules:
        raise ConfigError(f"weights ({weights!r}) must be one of {', '.join(rules)}")
    if graph.is_directed():
        raise TopologyError("graph is directed; mixing needs an undirected graph (use graph.to_undirected())")
    nodes = list(graph.nodes)
    if not nodes:
        raise TopologyError("graph has no nodes")
    index = {node: i for i, node in enumerate(nodes)}
    A = np.zeros((len(nodes), len(nodes)), dtype=np.int64)
    for u, v in graph.edges():
        if u != v:
            A[index[u], index[v]] = A[index[v], index[u]] = 1
    if support_components(A) > 1:
        parts = nx.number_connected_components(graph)
        raise TopologyError(
            f"graph is disconnected ({parts} components); workers in different components "
            "never reach consensus (spectral gap 0)"
        )
    return rules[weights](check_adjacency(A))
