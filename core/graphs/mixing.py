r"""Mixing matrices: validation, weight rules for undirected graphs, pairwise and matching matrices.

Learners are the **columns** of :math:`\Theta = [\theta^1 \dots \theta^n]` (ALGORITHMS.md §A.0), so
one mixing step :math:`\Theta \leftarrow \Theta T` gives learner ``i`` the combination
:math:`\sum_j T_{ji}\,\theta^j`. Every matrix built here is **doubly stochastic**,

.. math::

    T \ge 0, \qquad T\mathbf 1 = \mathbf 1, \qquad \mathbf 1^\top T = \mathbf 1^\top,

so each new model is a convex combination and the mean model :math:`\Theta\mathbf 1/n` is preserved.

Weight rules for an undirected graph with degrees :math:`d_i` (``deg`` = number of neighbours,
self loops excluded):

- Metropolis--Hastings: :math:`W_{ij} = 1/(1 + \max(d_i, d_j))` on edges,
  :math:`W_{ii} = 1 - \sum_{j \ne i} W_{ij}`.
- Uniform: :math:`W_{ij} = 1/(d_{\max} + 1)` on edges, :math:`W_{ii} = 1 - d_i/(d_{\max} + 1)`.
  Doubly stochastic and symmetric for *any* undirected graph, and equal to the familiar
  :math:`1/(d+1)` everywhere on a ``d``-regular graph (D-PSGD ring 1/3, 2-D torus 1/5).

Both rules give a positive diagonal, hence an aperiodic chain: :math:`\lambda_n > -1`.

Examples
--------
>>> import numpy as np
>>> ring4 = np.array([[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]])
>>> uniform_weights(ring4)[0]
array([0.33333333, 0.33333333, 0.        , 0.33333333])
>>> matching_matrix([1, 0, 3, 2])[0]
array([0.5, 0.5, 0. , 0. ])
>>> check_mixing_matrix([[0.5, 0.5], [0.5, 0.4]])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
psgdlab.core.errors.InvalidMixingMatrixError: row 1 sums to 0.9 (misses 1 by -0.1, atol 1e-10); did you ...
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from psgdlab.core.errors import InvalidMixingMatrixError, TopologyError

__all__ = [
    "check_mixing_matrix",
    "is_doubly_stochastic",
    "check_adjacency",
    "metropolis_hastings_weights",
    "uniform_weights",
    "pairwise_matrix",
    "matching_matrix",
    "check_matching",
    "support_components",
    "is_connected",
]


def check_mixing_matrix(W: ArrayLike, *, symmetric: bool = False, atol: float = 1e-10) -> NDArray[np.float64]:
    r"""Validate a (doubly stochastic) mixing matrix and return it as float64.

    Parameters
    ----------
    W : array_like, shape (n, n)
        Candidate mixing matrix (learners as columns).
    symmetric : bool, default False
        Also require :math:`W = W^\top` (within ``atol``).
    atol : float, default 1e-10
        Absolute tolerance for negative entries, row/column sums and asymmetry.

    Returns
    -------
    ndarray of float64, shape (n, n)
        ``W`` converted to float64 (a new array when a conversion was needed).

    Raises
    ------
    InvalidMixingMatrixError
        One line that says what failed and where: not a square 2-D matrix (with the shape),
        a non-finite entry, a negative entry (position and value), a row or column whose sum
        misses 1 (index, sum and miss; hint about the self weight), or, with ``symmetric=True``,
        the largest asymmetry and its position.

    Examples
    --------
    >>> check_mixing_matrix([[0.5, 0.5], [0.5, 0.5]], symmetric=True).dtype
    dtype('float64')
    >>> check_mixing_matrix([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.InvalidMixingMatrixError: mixing matrix must be a square 2-D matrix; got shape (2, 3)
    """
    try:
        M = np.asarray(W, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidMixingMatrixError(f"mixing matrix must be a numeric array; {exc}") from None
    if M.ndim != 2 or M.shape[0] != M.shape[1] or M.shape[0] == 0:
        raise InvalidMixingMatrixError(f"mixing matrix must be a square 2-D matrix; got shape {M.shape}")
    if not np.all(np.isfinite(M)):
        i, j = np.argwhere(~np.isfinite(M))[0]
        raise InvalidMixingMatrixError(f"mixing matrix entry [{i}, {j}] is {M[i, j]}; entries must be finite")
    if M.min() < -atol:
        i, j = np.unravel_index(int(np.argmin(M)), M.shape)
        raise InvalidMixingMatrixError(
            f"mixing matrix entry [{i}, {j}] is {M[i, j]:.6g} < 0 (atol {atol:g}); mixing weights must be non-negative"
        )
    _check_sums(M.sum(axis=1), "row", atol)
    _check_sums(M.sum(axis=0), "column", atol)
    if symmetric:
        asym = np.abs(M - M.T)
        if asym.max() > atol:
            i, j = np.unravel_index(int(np.argmax(asym)), M.shape)
            raise InvalidMixingMatrixError(
                f"mixing matrix is not symmetric: largest asymmetry |W[{i}, {j}] - W[{j}, {i}]| = "
                f"{asym[i, j]:.6g} (atol {atol:g})"
            )
    return M


def _check_sums(sums: NDArray[np.float64], what: str, atol: float) -> None:
    miss = sums - 1.0
    bad = int(np.argmax(np.abs(miss)))
    if abs(miss[bad]) > atol:
        raise InvalidMixingMatrixError(
            f"{what} {bad} sums to {sums[bad]:.6g} (misses 1 by {miss[bad]:+.3g}, atol {atol:g}); "
            "did you forget the self weight?"
        )


def is_doubly_stochastic(W: ArrayLike, *, atol: float = 1e-10) -> bool:
    """Whether ``W`` passes :func:`check_mixing_matrix` (parameters as there).

    Examples
    --------
    >>> is_doubly_stochastic([[0.5, 0.5], [0.5, 0.5]]), is_doubly_stochastic([[1.0, 0.0], [1.0, 0.0]])
    (True, False)
    """
    try:
        check_mixing_matrix(W, atol=atol)
    except InvalidMixingMatrixError:
        return False
    return True


def check_adjacency(adjacency: ArrayLike) -> NDArray[np.int64]:
    """Validate an undirected simple-graph adjacency matrix and return it as int64 (0/1).

    Parameters
    ----------
    adjacency : array_like, shape (n, n)
        Square, symmetric, entries 0/1 (or booleans), zero diagonal (no self loops).

    Raises
    ------
    TopologyError
        Naming the first violated rule and where.
    """
    try:
        A = np.asarray(adjacency)
    except (TypeError, ValueError) as exc:  # ragged input
        raise TopologyError(f"adjacency must be a numeric array; {exc}") from None
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] == 0:
        raise TopologyError(f"adjacency must be a square 2-D matrix; got shape {A.shape}")
    if A.dtype == bool:
        A = A.astype(np.int64)
    if not np.issubdtype(A.dtype, np.number):
        raise TopologyError(f"adjacency must be numeric; got dtype {A.dtype}")
    bad = (A != 0) & (A != 1)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise TopologyError(f"adjacency entry [{i}, {j}] is {A[i, j]}; entries must be 0 or 1")
    A = A.astype(np.int64)
    if np.any(np.diag(A)):
        i = int(np.flatnonzero(np.diag(A))[0])
        raise TopologyError(f"adjacency has a self loop at node {i}; the self weight is set by the weight rule")
    asym = A != A.T
    if asym.any():
        i, j = np.argwhere(asym)[0]
        raise TopologyError(
            f"adjacency is not symmetric: A[{i}, {j}] = {A[i, j]} but A[{j}, {i}] = {A[j, i]}; "
            "the graph must be undirected"
        )
    return A


def metropolis_hastings_weights(adjacency: ArrayLike) -> NDArray[np.float64]:
    r"""Metropolis--Hastings weights of an undirected graph (symmetric, doubly stochastic).

    :math:`W_{ij} = 1/(1+\max(d_i, d_j))` for each edge ``{i, j}``, :math:`W_{ii} = 1 - \sum_{j\ne i}
    W_{ij} > 0`; uses only the degrees of the two endpoints, so each worker can compute its weights
    locally.

    Parameters
    ----------
    adjacency : array_like, shape (n, n)
        As in :func:`check_adjacency`.

    Examples
    --------
    >>> star = [[0, 1, 1], [1, 0, 0], [1, 0, 0]]
    >>> metropolis_hastings_weights(star)
    array([[0.33333333, 0.33333333, 0.33333333],
           [0.33333333, 0.66666667, 0.        ],
           [0.33333333, 0.        , 0.66666667]])
    """
    A = check_adjacency(adjacency)
    deg = A.sum(axis=1)
    W = A / (1.0 + np.maximum.outer(deg, deg))
    np.fill_diagonal(W, 1.0 - W.sum(axis=1))
    return np.asarray(W, dtype=float)


def uniform_weights(adjacency: ArrayLike) -> NDArray[np.float64]:
    r"""Uniform weights :math:`1/(d_{\max}+1)` on every edge, the rest on the diagonal.

    :math:`W_{ij} = 1/(d_{\max}+1)` for each edge, :math:`W_{ii} = 1 - d_i/(d_{\max}+1) \ge
    1/(d_{\max}+1)`. Symmetric and doubly stochastic for any undirected graph; on a ``d``-regular graph
    every nonzero weight is :math:`1/(d+1)` (D-PSGD ring: 1/3; 2-D torus: 1/5).

    Parameters
    ----------
    adjacency : array_like, shape (n, n)
        As in :func:`check_adjacency`.
    """
    A = check_adjacency(adjacency)
    deg = A.sum(axis=1)
    dmax = float(deg.max())
    W = A / (1.0 + dmax)
    np.fill_diagonal(W, (1.0 + dmax - deg) / (1.0 + dmax))  # one rounding: exactly 1/(d+1) if regular
    return W


def pairwise_matrix(n: int, i: int, j: int) -> NDArray[np.float64]:
    r"""The pairwise-averaging matrix :math:`A_{ij} = I - \tfrac12 (e_i - e_j)(e_i - e_j)^\top`.

    Workers ``i`` and ``j`` both end with the mean of their two models; everybody else keeps theirs.

    Parameters
    ----------
    n : int
        Number of workers, ``n >= 2``.
    i, j : int
        The two distinct workers, ``0 <= i, j < n``.

    Raises
    ------
    TopologyError
        ``n < 2``, an index out of range, or ``i == j``.

    Examples
    --------
    >>> pairwise_matrix(3, 0, 2)
    array([[0.5, 0. , 0.5],
           [0. , 1. , 0. ],
           [0.5, 0. , 0.5]])
    """
    for name, value in (("n", n), ("i", i), ("j", j)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TopologyError(f"{name} ({value!r}) must be an integer")
    if n < 2:
        raise TopologyError(f"n ({n}) must be >= 2 for a pairwise average")
    for name, value in (("i", i), ("j", j)):
        if not 0 <= value < n:
            raise TopologyError(f"{name} ({value}) must be in [0, {n - 1}]")
    if i == j:
        raise TopologyError(f"i and j ({i}) must differ; a worker cannot average with itself")
    W = np.eye(n)
    W[i, i] = W[j, j] = W[i, j] = W[j, i] = 0.5
    return W


def check_matching(perm: ArrayLike | Sequence[int]) -> NDArray[np.int64]:
    """Validate an involutive permutation (``perm[perm[i]] == i``) and return it as int64.

    Fixed points (``perm[i] == i``) are allowed: such a worker sits the round out.

    Raises
    ------
    TopologyError
        Not a 1-D integer array, not a permutation of ``0..n-1``, or not an involution.
    """
    p = np.asarray(perm)
    if p.ndim != 1 or p.size == 0 or not np.issubdtype(p.dtype, np.integer):
        raise TopologyError(f"matching must be a non-empty 1-D integer array; got {p!r}")
    n = p.size
    p = p.astype(np.int64)
    if not np.array_equal(np.sort(p), np.arange(n)):
        raise TopologyError(f"matching {p.tolist()} is not a permutation of 0..{n - 1}")
    bad = np.flatnonzero(p[p] != np.arange(n))
    if bad.size:
        i = int(bad[0])
        raise TopologyError(
            f"matching is not symmetric: perm[{i}] = {p[i]} but perm[{p[i]}] = {p[p[i]]}; "
            "partners must point at each other"
        )
    return p


def matching_matrix(perm: ArrayLike | Sequence[int]) -> NDArray[np.float64]:
    r"""The matching matrix :math:`T = \tfrac12(I + P)` of an involutive permutation.

    ``perm[i]`` is the partner of worker ``i``. Paired workers average; a fixed point keeps its model.
    ``T`` is a symmetric orthogonal projection (:math:`T^2 = T = T^\top T`), eigenvalues in
    {0, 1}, with one zero eigenvalue per pair.

    Parameters
    ----------
    perm : array_like of int, shape (n,)
        As in :func:`check_matching`.
    """
    p = check_matching(perm)
    n = p.size
    T = 0.5 * np.eye(n)
    T[p, np.arange(n)] += 0.5
    return T


def support_components(W: ArrayLike, *, atol: float = 0.0) -> int:
    """Number of strongly connected components of the support graph (off-diagonal ``|W_ij| > atol``).

    Examples
    --------
    >>> support_components(matching_matrix([1, 0, 3, 2]))
    2
    """
    from scipy.sparse.csgraph import connected_components

    M = np.asarray(W, dtype=np.float64)
    support = np.abs(M) > atol
    np.fill_diagonal(support, False)
    n_components, _ = connected_components(support, directed=True, connection="strong")
    return int(n_components)


def is_connected(W: ArrayLike, *, atol: float = 0.0) -> bool:
    """Whether the support graph of ``W`` (or an adjacency matrix) is strongly connected.

    Parameters are as in :func:`support_components`.
    """
    return support_components(W, atol=atol) == 1
