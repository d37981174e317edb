"""Cached access to topology schedules for the gossip algorithms (hot path of the simulator)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["partner", "mixing_column"]


@lru_cache(maxsize=8192)
def _matching(kind: str, n: int, seed: int, round_: int) -> tuple[int, ...]:
    from psgdlab.core.topology import build_topology

    topology = build_topology(kind, n, seed=seed)
    period = topology.period
    perm = topology.matching(round_ if period is None else round_ % period)
    return tuple(int(p) for p in perm)


def partner(kind: str, n: int, seed: int, round_: int, rank: int) -> int:
    """Partner of ``rank`` in round ``round_`` of the matching schedule ``kind`` on ``n`` members."""
    if kind == "fixed-ring":  # period 2: keep the cache small and hits certain
        round_ %= 2
    return _matching(kind, n, seed, round_)[rank]


@lru_cache(maxsize=256)
def _matrix(kind: str, n: int, seed: int) -> np.ndarray:
    from psgdlab.core.topology import build_topology

    W = build_topology(kind, n, seed=seed).matrix(0)
    W.setflags(write=False)
    return W


def mixing_column(kind: str, n: int, seed: int, rank: int) -> tuple[tuple[int, ...], tuple[float, ...], float]:
    """``(peers, weights, self_weight)`` of column ``rank`` of a static topology's matrix."""
    W = _matrix(kind, n, seed)
    col = W[:, rank]
    peers = tuple(int(j) for j in np.flatnonzero(col) if j != rank)
    return peers, tuple(float(col[j]) for j in peers), float(col[rank])
