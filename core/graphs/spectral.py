r"""Spectral quantities of mixing matrices and schedules (ALGORITHMS.md §B, F.12).

For a doubly stochastic ``W`` with eigenvalues :math:`1 = \lambda_1, \lambda_2, \dots, \lambda_n`
(sorted descending for symmetric ``W``):

.. math::

    \rho = \max(|\lambda_2|, |\lambda_n|), \qquad \text{spectral gap} = 1 - \rho, \qquad
    \sigma_2(W) = \max_{x \perp \mathbf 1,\ \|x\| = 1} \|W^\top x\| = \|W - J/n\|_2 .

With learners as columns and :math:`C(\Theta) = \|\Theta - \bar\theta\mathbf 1^\top\|_F^2`, one step
gives :math:`C(\Theta T) \le \sigma_2(T)^2\, C(\Theta)`. For time-varying or random schedules, with
:math:`T` drawn independently of :math:`\Theta`,

.. math::

    \mathbb E\, C(\Theta T) \le \lambda_2\!\left(\mathbb E[T T^\top]\right) C(\Theta),

so the primary gap of such schedules is :math:`1 - \lambda_2(\mathbb E[TT^\top])`
(:math:`\mathbb E[TT^\top] = \mathbb E[T^\top T]` when every :math:`T` is symmetric; for matchings,
which are projections, both equal :math:`\mathbb E[T]`). For a static symmetric ``W`` the same
quantity is :math:`\rho^2`.

A gap below ``1e-9`` warns with :class:`~psgdlab.core.errors.TestbedWarning` ("effectively
disconnected").

Examples
--------
>>> from psgdlab.core.graphs.topology import fixed_ring, random_ring, ring
>>> round(spectral_gap(ring(8).matrix()), 6)
0.195262
>>> s = topology_spectrum(fixed_ring(16))
>>> s["matrix"], round(s["spectral_gap"], 5)
('E[TT^T]', 0.03806)
>>> round(topology_spectrum(random_ring(16))["spectral_gap"], 5)
0.53333
>>> mixing_time(fixed_ring(16), 1e-6)
357
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from psgdlab.core.errors import ConfigError, InvalidMixingMatrixError, TestbedWarning
from psgdlab.core.graphs.mixing import check_mixing_matrix
from psgdlab.core.graphs.topology import STATIC_KINDS, Topology, build_topology

__all__ = [
    "DISCONNECTED_GAP",
    "eigenvalues",
    "lambda2",
    "second_largest_modulus",
    "spectral_gap",
    "sigma2",
    "expected_gram",
    "estimate_expected_gram",
    "topology_spectrum",
    "spectral_gap_curve",
    "consensus_rate_bound",
    "mixing_time",
]

DISCONNECTED_GAP = 1e-9
"""Gaps below this warn as "effectively disconnected"."""

_SYMMETRY_ATOL = 1e-12


def _is_symmetric(M: NDArray[np.float64]) -> bool:
    return bool(np.allclose(M, M.T, rtol=0.0, atol=_SYMMETRY_ATOL))


def eigenvalues(W: ArrayLike) -> NDArray[Any]:
    r"""Eigenvalues of ``W``, sorted descending.

    Parameters
    ----------
    W : array_like, shape (n, n)
        A doubly stochastic mixing matrix (checked with
        :func:`~psgdlab.core.graphs.mixing.check_mixing_matrix`, default tolerance).

    Returns
    -------
    ndarray, shape (n,)
        For symmetric ``W`` (within 1e-12): real eigenvalues from ``numpy.linalg.eigvalsh``, sorted
        descending, so ``lambda_1 = 1`` comes first and ``lambda_n`` last. Otherwise: complex
        eigenvalues from ``numpy.linalg.eig`` sorted by descending **modulus** (ties by descending
        real part).

    Raises
    ------
    InvalidMixingMatrixError
        ``W`` is not a doubly stochastic square matrix.

    Examples
    --------
    >>> eigenvalues([[0.5, 0.5], [0.5, 0.5]])
    array([1., 0.])
    """
    M = check_mixing_matrix(W)
    if _is_symmetric(M):
        return np.sort(np.linalg.eigvalsh(0.5 * (M + M.T)))[::-1]
    # numpy casts to a real array when every imaginary part is exactly zero, which depends on the
    # LAPACK build; the documented return type must not.
    ev = np.linalg.eigvals(M).astype(np.complex128, copy=False)
    order = np.lexsort((-ev.real, -np.abs(ev)))
    return ev[order]


def lambda2(W: ArrayLike) -> float:
    r"""Second-largest eigenvalue :math:`\lambda_2` of a symmetric doubly stochastic ``W``.

    Parameters are as in :func:`eigenvalues`; ``W`` must also be symmetric. For ``n = 1``
    returns 0 (nothing to mix).

    Raises
    ------
    InvalidMixingMatrixError
        Not doubly stochastic, or not symmetric (use :func:`second_largest_modulus` or
        :func:`sigma2` for non-symmetric matrices such as products of matchings).
    """
    M = check_mixing_matrix(W)
    if not _is_symmetric(M):
        raise InvalidMixingMatrixError(
            "lambda2 needs a symmetric matrix (its eigenvalues may be complex "
            "otherwise); use second_largest_modulus or sigma2"
        )
    ev = eigenvalues(M)
    return float(ev[1]) if ev.size > 1 else 0.0


def second_largest_modulus(W: ArrayLike) -> float:
    r""":math:`\rho = \max(|\lambda_2|, |\lambda_n|)`: the second-largest eigenvalue modulus.

    Parameters are as in :func:`eigenvalues` (any doubly stochastic ``W``; for non-symmetric ``W``
    the moduli of the complex eigenvalues are used). 0 for ``n = 1``.
    """
    ev = np.abs(eigenvalues(W))
    return float(np.sort(ev)[::-1][1]) if ev.size > 1 else 0.0


def spectral_gap(W: ArrayLike) -> float:
    r"""Spectral gap :math:`1 - \rho` of a doubly stochastic ``W``, :math:`\rho` as in :func:`second_largest_modulus`.

    Parameters
    ----------
    W : array_like, shape (n, n)
        Doubly stochastic mixing matrix (symmetric or not), learners as columns.

    Returns
    -------
    float
        :math:`1 - \max(|\lambda_2|, |\lambda_n|)` in ``[0, 1]``.

    Raises
    ------
    InvalidMixingMatrixError
        ``W`` is not a doubly stochastic square matrix.

    Warns
    -----
    TestbedWarning
        When the gap is below ``1e-9`` (the support graph is effectively disconnected, e.g. a
        single matching of ``n > 2`` workers).

    Examples
    --------
    >>> from psgdlab.core.graphs.mixing import matching_matrix
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     gap = spectral_gap(matching_matrix([1, 0, 3, 2]))
    >>> gap, caught[0].category.__name__
    (0.0, 'TestbedWarning')
    """
    gap = max(0.0, 1.0 - second_largest_modulus(W))
    _warn_if_disconnected(gap, "W")
    return gap


def sigma2(W: ArrayLike) -> float:
    r"""Largest singular value of ``W`` on :math:`\mathbf 1^\perp`, :math:`\|W - J/n\|_2`.

    Parameters are as in :func:`spectral_gap`. :math:`\sigma_2(W)^2 = \lambda_2(WW^\top)` bounds one
    step's consensus contraction: :math:`C(\Theta W) \le \sigma_2(W)^2 C(\Theta)`.
    """
    M = check_mixing_matrix(W)
    n = M.shape[0]
    return float(np.linalg.norm(M - 1.0 / n, 2)) if n > 1 else 0.0


def _warn_if_disconnected(gap: float, what: str) -> None:
    if gap < DISCONNECTED_GAP:
        warnings.warn(
            f"spectral gap of {what} is {gap:.3g} < {DISCONNECTED_GAP:g}: effectively disconnected, "
            "consensus is never reached (a single matching of more than 2 workers is; use its "
            "expectation over rounds)",
            TestbedWarning,
            stacklevel=3,
        )


# -- schedules ------------------------------------------------------------------------------------
def expected_gram(
    topology: Topology, *, samples: int | None = None, rng: np.random.Generator | int | None = None
) -> NDArray[np.float64]:
    r""":math:`\mathbb E[T T^\top]` of a topology's schedule (learners as columns).

    Equal to :math:`\mathbb E[T^\top T]` because every topology matrix is symmetric.

    Parameters
    ----------
    topology : Topology
        The schedule.
    samples : int, optional
        ``None`` (default): exact. Static kinds give :math:`WW^\top`; periodic schedules the mean of
        :math:`T_tT_t^\top` over one period; ``random-ring`` the closed form
        :math:`\mathbb E[T] = \tfrac12 I + \tfrac12 (J - I)/(n-1)` (a uniformly random perfect
        matching pairs ``i`` with each ``j != i`` with probability :math:`1/(n-1)`; ``T`` is a
        projection, so :math:`\mathbb E[TT^\top] = \mathbb E[T]`); ``hierarchical`` the inner
        expectation :math:`\otimes J_m/m`. An integer ``>= 2``: a Monte Carlo estimate over that many
        rounds drawn uniformly with ``rng`` (see :func:`estimate_expected_gram` for its error).
    rng : numpy.random.Generator or int, optional
        Randomness for ``samples``; normalised with ``numpy.random.default_rng``.

    Returns
    -------
    ndarray of float64, shape (n_workers, n_workers)
        Symmetric, positive semi-definite, doubly stochastic.
    """
    if not isinstance(topology, Topology):
        raise ConfigError(f"topology ({topology!r}) must be a Topology")
    if samples is not None:
        gen = np.random.default_rng(rng)
        period = topology.period
        high = period if period is not None else 2**62

        def draw(g: np.random.Generator) -> NDArray[np.float64]:
            return topology.matrix(int(g.integers(high)))

        return estimate_expected_gram(draw, samples=samples, rng=gen)[0]
    if topology.kind == "hierarchical" and topology.n_nodes > 1 and topology.gpus_per_node > 1:
        inner = Topology(kind=topology.inner, n_workers=topology.n_nodes, seed=topology.seed)
        m = topology.gpus_per_node
        return np.kron(expected_gram(inner), np.full((m, m), 1.0 / m))
    period = topology.period
    if period is None:  # random-ring (directly or as the inner schedule with one GPU per node)
        n = topology.n_nodes if topology.kind == "hierarchical" else topology.n_workers
        return 0.5 * np.eye(n) + 0.5 * (np.ones((n, n)) - np.eye(n)) / (n - 1)
    total = np.zeros((topology.n_workers, topology.n_workers))
    for t in range(period):
        T = topology.matrix(t)
        total += T @ T.T
    return total / period


def estimate_expected_gram(
    sample_matrix: Callable[[np.random.Generator], ArrayLike],
    *,
    samples: int,
    rng: np.random.Generator | int | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    r"""Monte Carlo estimate of :math:`\mathbb E[TT^\top]` for any random mixing matrix ``T``.

    Parameters
    ----------
    sample_matrix : callable
        ``sample_matrix(rng) -> T``: one independent draw of the ``n x n`` matrix.
    samples : int
        Number of draws, ``>= 2``.
    rng : numpy.random.Generator or int, optional
        Passed to ``sample_matrix`` after ``numpy.random.default_rng``.

    Returns
    -------
    estimate : ndarray, shape (n, n)
        Sample mean :math:`\hat G = \frac1S\sum_s T_sT_s^\top`.
    standard_error : ndarray, shape (n, n)
        Entrywise standard error :math:`\hat s_{ij}/\sqrt S` (sample standard deviation with
        ``ddof=1``). By Weyl's inequality :math:`|\lambda_k(\hat G) - \lambda_k(G)| \le \|\hat G -
        G\|_2 \le \|\hat G - G\|_F`, and :math:`\|\hat G - G\|_F` is of the order of the Frobenius
        norm of ``standard_error`` (a CLT statement, not a bound; use a few times that norm as a
        tolerance on :math:`\lambda_2`).

    Examples
    --------
    >>> from psgdlab.core.graphs.topology import random_ring
    >>> topo = random_ring(8, seed=3)
    >>> est, se = estimate_expected_gram(lambda g: topo.matrix(int(g.integers(2**62))), samples=2000, rng=0)
    >>> exact = expected_gram(topo)
    >>> bool(np.abs(est - exact).max() < 6 * se.max())
    True
    """
    if not isinstance(samples, (int, np.integer)) or isinstance(samples, bool) or samples < 2:
        raise ConfigError(f"samples ({samples!r}) must be an integer >= 2 (a standard error needs two draws)")
    gen = np.random.default_rng(rng)
    mean: NDArray[np.float64] | None = None
    m2: NDArray[np.float64] | None = None
    for s in range(1, int(samples) + 1):  # Welford: O(n^2) memory whatever the sample count
        T = np.asarray(sample_matrix(gen), dtype=np.float64)
        G = T @ T.T
        if mean is None or m2 is None:
            mean, m2 = G.copy(), np.zeros_like(G)
            continue
        delta = G - mean
        mean += delta / s
        m2 += delta * (G - mean)
    assert mean is not None and m2 is not None
    return mean, np.sqrt(m2 / (samples - 1) / samples)


def _symmetric_spectrum(M: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.sort(np.linalg.eigvalsh(0.5 * (M + M.T)))[::-1]


def topology_spectrum(topology: Topology) -> dict[str, Any]:
    r"""Every spectral number of a topology (ALGORITHMS.md F.12), as a JSON-ready dict.

    Keys: ``kind``, ``workers``, ``nodes``, ``gpus_per_node``, ``period``, ``matrix``, ``lambda2``,
    ``lambda_min``, ``rho``, ``spectral_gap`` (:math:`1-\rho`), ``gap_1_minus_lambda2``,
    ``gap_expected_gram`` (:math:`1 - \lambda_2(\mathbb E[TT^\top])`) and ``consensus_rate``
    (:func:`consensus_rate_bound`). For static kinds (``matrix == "W"``) the eigenvalues are those
    of ``W`` (symmetric, so the consensus rate is :math:`\rho^2`); for time-varying and random kinds
    (``matrix == "E[TT^T]"``) they are those of :math:`\mathbb E[TT^\top]` from :func:`expected_gram`,
    so ``spectral_gap`` is the primary gap of §B.2 (e.g. :math:`\sin^2(\pi/n)` for the fixed ring)
    and equals ``gap_expected_gram``.

    Warns
    -----
    TestbedWarning
        When ``spectral_gap`` is below 1e-9.
    """
    static, ev = _primary_spectrum(topology)
    lam2 = float(ev[1]) if ev.size > 1 else 0.0
    lam_min = float(ev[-1]) if ev.size > 1 else 0.0
    rho = max(abs(lam2), abs(lam_min))
    rate = min(rho**2, 1.0) if static else float(np.clip(lam2, 0.0, 1.0))
    gap = max(0.0, 1.0 - rho)
    _warn_if_disconnected(gap, f"{topology.kind} with {topology.n_workers} workers")
    return {
        "kind": topology.kind,
        "workers": topology.n_workers,
        "nodes": topology.n_nodes,
        "gpus_per_node": topology.gpus_per_node,
        "period": topology.period,
        "matrix": "W" if static else "E[TT^T]",
        "lambda2": lam2,
        "lambda_min": lam_min,
        "rho": rho,
        "spectral_gap": gap,
        "gap_1_minus_lambda2": 1.0 - lam2,
        "gap_expected_gram": 1.0 - rate,
        "consensus_rate": rate,
    }


def _primary_spectrum(topology: Topology) -> tuple[bool, NDArray[np.float64]]:
    """(static?, descending eigenvalues of W or of E[TT^T]); hierarchical uses the node-level matrix,
    whose nonzero spectrum is the same (the Kronecker factor J_m/m only adds zeros, and E[TT^T] is PSD)."""
    if topology.kind in STATIC_KINDS:
        return True, _symmetric_spectrum(topology.matrix(0))
    if topology.kind == "hierarchical" and topology.gpus_per_node > 1:
        if topology.n_nodes == 1:
            return False, np.array([1.0, 0.0]) if topology.n_workers > 1 else np.array([1.0])
        inner = Topology(kind=topology.inner, n_workers=topology.n_nodes, seed=topology.seed)
        ev = _symmetric_spectrum(expected_gram(inner))
        return False, np.concatenate([ev, np.zeros(topology.n_workers - ev.size)])
    return False, _symmetric_spectrum(expected_gram(topology))


def spectral_gap_curve(
    kind: str,
    worker_counts: Sequence[int],
    *,
    gpus_per_node: int = 1,
    inner: Literal["fixed-ring", "random-ring"] = "fixed-ring",
    seed: int = 0,
) -> list[tuple[int, float]]:
    """``(n_workers, spectral_gap)`` for every count in ``worker_counts`` that ``kind`` accepts.

    ``spectral_gap`` is that of :func:`topology_spectrum` (of ``W`` for static kinds, of
    :math:`E[TT^T]` otherwise). Counts the kind rejects (odd counts for matchings, non-powers of two
    for the hypercube, ...) are skipped. Other parameters are as in
    :func:`~psgdlab.core.graphs.topology.build_topology` (``inner`` only for ``hierarchical``).

    Examples
    --------
    >>> [(n, round(g, 4)) for n, g in spectral_gap_curve("hypercube", [4, 6, 8, 16])]
    [(4, 0.5), (8, 0.3333), (16, 0.25)]
    """
    from psgdlab.core.errors import TopologyError

    curve = []
    for n in worker_counts:
        try:
            topology = build_topology(
                kind, n, gpus_per_node=gpus_per_node, seed=seed, inner=inner if kind == "hierarchical" else "fixed-ring"
            )
        except TopologyError:
            continue
        _, ev = _primary_spectrum(topology)
        rho = max(abs(float(ev[1])), abs(float(ev[-1]))) if ev.size > 1 else 0.0
        curve.append((int(n), max(0.0, 1.0 - rho)))
    return curve


def consensus_rate_bound(topology: Topology) -> float:
    r"""Per-round contraction factor of the expected consensus distance, :math:`\lambda_2(\mathbb E[TT^\top])`.

    :math:`\mathbb E\,C(\Theta T) \le \text{bound}\cdot C(\Theta)` when the round's ``T`` is drawn
    independently of :math:`\Theta` (random schedules, or a periodic schedule entered at a uniformly
    random round). For a static symmetric ``W`` this is :math:`\rho^2`. For deterministic alternation
    over a whole period the realised contraction can only be better on the kinds here (fixed ring:
    :math:`\cos^2(2\pi/n) \le \cos^4(\pi/n)` per two rounds; hypercube: exact consensus after
    :math:`\log_2 n` rounds).

    Parameters
    ----------
    topology : Topology
        The schedule.
    """
    if not isinstance(topology, Topology):
        raise ConfigError(f"topology ({topology!r}) must be a Topology")
    ev = _symmetric_spectrum(expected_gram(topology))
    return float(np.clip(ev[1], 0.0, 1.0)) if ev.size > 1 else 0.0


def mixing_time(topology: Topology, tol: float = 1e-6) -> int | float:
    r"""Smallest ``k`` with :math:`\text{bound}^k \le \text{tol}`, ``bound`` from :func:`consensus_rate_bound`.

    Rounds after which the expected consensus distance has shrunk by at least ``tol``.

    Parameters
    ----------
    topology : Topology
        The schedule.
    tol : float, default 1e-6
        Target reduction factor, ``0 < tol < 1``.

    Returns
    -------
    int or float
        ``k`` (an int), or ``math.inf`` when the gap is 0.

    Warns
    -----
    TestbedWarning
        When the bound is 1 (disconnected): the result is ``inf``.
    """
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not 0.0 < tol < 1.0:
        raise ConfigError(f"tol ({tol!r}) must be a number in (0, 1)")
    bound = consensus_rate_bound(topology)
    if bound <= 0.0:
        return 1
    if bound >= 1.0 - DISCONNECTED_GAP:
        _warn_if_disconnected(1.0 - bound, f"E[TT^T] of {topology.kind}")
        return math.inf
    k = max(1, math.ceil(math.log(tol) / math.log(bound)))
    while k > 1 and bound ** (k - 1) <= tol:  # guard against rounding in the logarithms
        k -= 1
    while bound**k > tol:
        k += 1
    return k
