r"""Hypothesis strategies for topologies, mixing matrices and staleness schedules (public API).

Use them in your own property tests::

    from hypothesis import given
    from psgdlab.core import strategies as pst

    @given(pst.topologies(kinds=["fixed-ring", "random-ring"], max_workers=16))
    def test_my_schedule_keeps_the_mean(topology): ...

Every strategy takes keyword-only arguments, validates them **eagerly** (a bad argument raises
``hypothesis.errors.InvalidArgument`` when the strategy is built, naming the bound that is broken)
and says in its docstring what its examples shrink towards. Only this module imports hypothesis
(install the ``psgdlab[testing]`` extra).

Examples
--------
>>> worker_counts(min_workers=5, max_workers=3)
Traceback (most recent call last):
...
hypothesis.errors.InvalidArgument: min_workers=5 must be <= max_workers=3
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra import numpy as hnp
from numpy.typing import NDArray

from psgdlab.core._algorithm_strategies import algorithm_specs
from psgdlab.core.errors import TopologyError
from psgdlab.core.graphs.topology import INNER_KINDS, KINDS, Topology

__all__ = [
    "worker_counts",
    "topologies",
    "mixing_matrices",
    "doubly_stochastic_matrices",
    "symmetric_doubly_stochastic_matrices",
    "staleness_schedules",
    "algorithm_specs",
]

_MAX_SEED = 2**32 - 1
_MAX_ROUND = 2**20


def _check_int(name: str, value: Any, *, low: int, high: int | None = None) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be an integer")
    if value < low:
        raise InvalidArgument(f"{name}={value!r} must be >= {low}")
    if high is not None and value > high:
        raise InvalidArgument(f"{name}={value!r} must be <= {high}")


def _check_range(lo_name: str, lo: Any, hi_name: str, hi: Any, *, low: int) -> None:
    _check_int(lo_name, lo, low=low)
    _check_int(hi_name, hi, low=low)
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo!r} must be <= {hi_name}={hi!r}")


def _size_strategy(name: str, value: Any, *, low: int) -> st.SearchStrategy[int]:
    """A fixed integer (checked now) or a strategy of integers (checked when drawn)."""
    if isinstance(value, st.SearchStrategy):

        def checked(drawn: Any) -> int:
            _check_int(f"{name} (drawn)", drawn, low=low)
            return int(drawn)

        return value.map(checked)
    _check_int(name, value, low=low)
    return st.just(int(value))


# -- sizes and topologies -------------------------------------------------------------------------
def worker_counts(*, min_workers: int = 2, max_workers: int = 64, even: bool = False) -> st.SearchStrategy[int]:
    """Worker counts in ``[min_workers, max_workers]``, only even ones when ``even``.

    Parameters
    ----------
    min_workers, max_workers : int
        Inclusive bounds, ``1 <= min_workers <= max_workers``.
    even : bool, default False
        Only even counts (matching-based schemes); the range must contain one.

    Notes
    -----
    Shrinks towards the smallest allowed count.
    """
    _check_range("min_workers", min_workers, "max_workers", max_workers, low=1)
    if not isinstance(even, bool):
        raise InvalidArgument(f"even={even!r} must be a bool")
    if not even:
        return st.integers(min_workers, max_workers)
    lo = min_workers + (min_workers % 2)
    if lo > max_workers:
        raise InvalidArgument(f"no even count in [min_workers={min_workers}, max_workers={max_workers}]")
    return st.integers(lo // 2, max_workers // 2).map(lambda k: 2 * k)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


@lru_cache(maxsize=64)
def _valid_shapes(kind: str, lo: int, hi: int) -> tuple[tuple[int, int], ...]:
    """(n_workers, gpus_per_node) pairs in range that ``kind`` accepts, smallest first."""
    shapes = []
    for n in range(lo, hi + 1):
        for m in _divisors(n) if kind == "hierarchical" else (1,):
            try:
                Topology(kind=kind, n_workers=n, gpus_per_node=m)
            except TopologyError:
                continue
            shapes.append((n, m))
    return tuple(shapes)


def topologies(
    *, kinds: Sequence[str] | None = None, min_workers: int = 2, max_workers: int = 32
) -> st.SearchStrategy[Topology]:
    """Valid :class:`~psgdlab.core.graphs.topology.Topology` values with ``min_workers <= n_workers <= max_workers``.

    Every drawn topology is connected in the sense that matters for mixing: the gap of its ``W``
    (static kinds) or of :math:`E[TT^T]` (schedules) is positive. Worker counts respect each kind's
    rule (ring ``>= 3``; torus ``r x c`` with ``r, c >= 3``; hypercube a power of two; fixed/random
    ring even; hierarchical ``n_workers = n_nodes * gpus_per_node`` with ``n_nodes`` even or 1).

    Parameters
    ----------
    kinds : sequence of str, optional
        Kinds to draw from (default: every kind that has a valid size in range). Each named kind
        must have at least one valid size in range.
    min_workers, max_workers : int
        Inclusive bounds, ``1 <= min_workers <= max_workers <= 4096``.

    Notes
    -----
    Shrinks towards the first kind (in the order given, default ``ring`` first), the fewest workers,
    the fewest GPUs per node, ``inner="fixed-ring"`` and seed 0.
    """
    _check_range("min_workers", min_workers, "max_workers", max_workers, low=1)
    _check_int("max_workers", max_workers, low=1, high=4096)
    if kinds is None:
        chosen = list(KINDS)
    else:
        if isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds):
            raise InvalidArgument(f"kinds={kinds!r} must be a sequence of kind names")
        chosen = list(dict.fromkeys(kinds))
        unknown = [k for k in chosen if k not in KINDS]
        if unknown or not chosen:
            raise InvalidArgument(f"kinds={list(kinds)!r} must be a non-empty subset of {list(KINDS)}")
    shapes = {k: _valid_shapes(k, min_workers, max_workers) for k in chosen}
    empty = [k for k in chosen if not shapes[k]]
    if kinds is not None and empty:
        raise InvalidArgument(
            f"kind(s) {empty} have no valid worker count in [min_workers={min_workers}, max_workers={max_workers}]"
        )
    usable = [k for k in chosen if shapes[k]]
    if not usable:
        raise InvalidArgument(
            f"no kind has a valid worker count in [min_workers={min_workers}, max_workers={max_workers}]"
        )

    def one(kind: str) -> st.SearchStrategy[Topology]:
        inner = st.sampled_from(INNER_KINDS) if kind == "hierarchical" else st.just("fixed-ring")
        return st.builds(
            lambda shape, seed, inner_kind: Topology(
                kind=kind, n_workers=shape[0], gpus_per_node=shape[1], seed=seed, inner=inner_kind
            ),
            st.sampled_from(shapes[kind]),
            st.integers(0, _MAX_SEED),
            inner,
        )

    return st.sampled_from(usable).flatmap(one)


def mixing_matrices(
    *, topology: Topology | st.SearchStrategy[Topology] | None = None
) -> st.SearchStrategy[NDArray[np.float64]]:
    """The mixing matrix of a drawn round of a (drawn) topology.

    Parameters
    ----------
    topology : Topology or strategy of Topology, optional
        Default :func:`topologies` with its defaults.

    Notes
    -----
    Shrinks towards round 0 of the simplest topology (see :func:`topologies`).
    """
    if topology is None:
        source: st.SearchStrategy[Topology] = topologies()
    elif isinstance(topology, Topology):
        source = st.just(topology)
    elif isinstance(topology, st.SearchStrategy):
        source = topology
    else:
        raise InvalidArgument(f"topology={topology!r} must be a Topology, a strategy of them, or None")
    return st.builds(lambda topo, t: topo.matrix(t), source, st.integers(0, _MAX_ROUND))


# -- generic doubly stochastic matrices -----------------------------------------------------------
def _convex_combination(n: int, max_terms: int, symmetric: bool) -> st.SearchStrategy[NDArray[np.float64]]:
    term = st.tuples(st.permutations(range(n)), st.integers(1, 1000))

    def combine(terms: list[tuple[list[int], int]]) -> NDArray[np.float64]:
        total = float(sum(w for _, w in terms))
        W = np.zeros((n, n))
        for perm, w in terms:
            P = np.zeros((n, n))
            P[np.arange(n), perm] = 1.0
            W += (w / total) * (0.5 * (P + P.T) if symmetric else P)
        return W

    return st.lists(term, min_size=1, max_size=max_terms).map(combine)


def doubly_stochastic_matrices(
    *, n: int | st.SearchStrategy[int], max_terms: int = 8
) -> st.SearchStrategy[NDArray[np.float64]]:
    r"""``n x n`` doubly stochastic matrices built by Birkhoff's theorem.

    A convex combination :math:`\sum_k w_k P_k` of 1 to ``max_terms`` permutation matrices with
    positive rational weights (every doubly stochastic matrix is one, with at most
    :math:`(n-1)^2 + 1` terms). Generally **not** symmetric. Row and column sums equal 1 to within a
    few ulp.

    Parameters
    ----------
    n : int or strategy of int
        Size, ``n >= 1`` (a drawn value is checked when drawn).
    max_terms : int, default 8
        Most permutations combined, ``>= 1``.

    Notes
    -----
    Shrinks towards the identity matrix (one term, the identity permutation).
    """
    _check_int("max_terms", max_terms, low=1)
    return _size_strategy("n", n, low=1).flatmap(lambda k: _convex_combination(k, max_terms, False))


def symmetric_doubly_stochastic_matrices(
    *, n: int | st.SearchStrategy[int], max_terms: int = 8
) -> st.SearchStrategy[NDArray[np.float64]]:
    r"""``n x n`` symmetric doubly stochastic matrices: convex combinations of :math:`(P + P^\top)/2`.

    Exactly symmetric (bit for bit). Parameters are as in :func:`doubly_stochastic_matrices`.

    Notes
    -----
    Shrinks towards the identity matrix.
    """
    _check_int("max_terms", max_terms, low=1)
    return _size_strategy("n", n, low=1).flatmap(lambda k: _convex_combination(k, max_terms, True))


# -- staleness ------------------------------------------------------------------------------------
def staleness_schedules(
    *,
    n_workers: int | st.SearchStrategy[int],
    max_staleness: int,
    steps: int | st.SearchStrategy[int],
    causal: bool = True,
) -> st.SearchStrategy[NDArray[np.int64]]:
    """Per-step, per-worker staleness arrays of shape ``(steps, n_workers)``, dtype int64.

    Entry ``[k, r]`` is the staleness (in steps) of worker ``r``'s gradient at step ``k``, in
    ``[0, max_staleness]``; with ``causal`` also ``<= k`` (no gradient can be older than step 0).

    Parameters
    ----------
    n_workers : int or strategy of int
        Workers, ``>= 1``.
    max_staleness : int
        Largest staleness, ``>= 0``.
    steps : int or strategy of int
        Steps, ``>= 1``.
    causal : bool, default True
        Cap step ``k``'s staleness at ``k``.

    Notes
    -----
    Shrinks towards all zeros (fresh gradients).
    """
    _check_int("max_staleness", max_staleness, low=0)
    if not isinstance(causal, bool):
        raise InvalidArgument(f"causal={causal!r} must be a bool")
    workers = _size_strategy("n_workers", n_workers, low=1)
    n_steps = _size_strategy("steps", steps, low=1)

    def build(shape: tuple[int, int]) -> st.SearchStrategy[NDArray[np.int64]]:
        arrays = hnp.arrays(np.int64, shape, elements=st.integers(0, max_staleness))
        if not causal:
            return arrays
        cap = np.arange(shape[0], dtype=np.int64)[:, None]
        return arrays.map(lambda a: np.minimum(a, cap))

    return st.tuples(n_steps, workers).flatmap(build)
