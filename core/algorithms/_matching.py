"""Cached access to topology schedules for the gossip algorithms (hot path of the simulator)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from psgdlab.core.errors import ConfigError

if TYPE_CHECKING:
    from psgdlab.core.graphs.topology import Topology

__all__ = ["partner", "mixing_column", "matching_period"]


@lru_cache(maxsize=256)
def _topology(kind: str, n: int, seed: int) -> Topology:
    from psgdlab.core.graphs.topology import build_topology

    return build_topology(kind, n, seed=seed)


@lru_cache(maxsize=8192)
def _matching(kind: str, n: int, seed: int, round_: int) -> tuple[int, ...]:
    perm = _topology(kind, n, seed).matching(round_)
    if perm is None:
        raise ConfigError(f"topology {kind!r} has no matching schedule (a static kind)")
    return tuple(int(p) for p in perm)


def matching_period(kind: str, n: int, seed: int) -> int | None:
    """Rounds after which the matching schedule ``kind`` on ``n`` members repeats (``None``: never)."""
    return _topology(kind, n, seed).period


def partner(kind: str, n: int, seed: int, round_: int, rank: int) -> int:
    """Partner of ``rank`` in round ``round_`` of the matching schedule ``kind`` on ``n`` members.

    Finite schedules are reduced by their period first, so the cache holds one entry per distinct
    round and every later round hits it."""
    period = _topology(kind, n, seed).period
    if period is not None:
        round_ %= period
    return _matching(kind, n, seed, round_)[rank]


@lru_cache(maxsize=256)
def _matrix(kind: str, n: int, seed: int) -> np.ndarray:
    W = np.asarray(_topology(kind, n, seed).matrix(0))
    W.setflags(write=False)
    return W


def mixing_column(kind: str, n: int, seed: int, rank: int) -> tuple[tuple[int, ...], tuple[float, ...], float]:
    """``(peers, weights, self_weight)`` of column ``rank`` of a static topology's matrix."""
    W = _matrix(kind, n, seed)
    col = W[:, rank]
    peers = tuple(int(j) for j in np.flatnonzero(col) if j != rank)
    return peers, tuple(float(col[j]) for j in peers), float(col[rank])
