"""Hypothesis strategy for algorithm specs (re-exported by :mod:`psgdlab.core.strategies`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from psgdlab.core.algorithms import ALGORITHMS, Algorithm, make_algorithm
from psgdlab.core.errors import TestbedWarning

__all__ = ["algorithm_specs"]


def algorithm_specs(
    *, names: Sequence[str] | None = None, min_workers: int = 2, max_workers: int = 16
) -> st.SearchStrategy[Algorithm]:
    """Valid algorithm specs from the registry, with worker counts every scheme accepts.

    Parameters
    ----------
    names : sequence of str, optional
        Registry names to draw from (default: all but ``sgd``, which needs one worker; include
        ``"sgd"`` explicitly to get it with ``n_workers=1``).
    min_workers, max_workers : int
        Bounds on ``n_workers`` (``2 <= min_workers <= max_workers``); matching-based schemes get
        the even counts in range, H-ADPSGD an even number of nodes times ``gpus_per_node``.

    Notes
    -----
    Shrinks towards the first name, the fewest workers, default hyperparameters and seed 0.
    Validated eagerly: unknown names or empty ranges raise ``InvalidArgument`` at once.
    """
    chosen = list(names) if names is not None else [n for n in ALGORITHMS if n != "sgd"]
    unknown = [n for n in chosen if n not in ALGORITHMS]
    if unknown or not chosen:
        raise InvalidArgument(f"names={chosen!r} must be a non-empty subset of {sorted(ALGORITHMS)}")
    if not (isinstance(min_workers, int) and isinstance(max_workers, int) and 2 <= min_workers <= max_workers):
        raise InvalidArgument(f"need 2 <= min_workers ({min_workers!r}) <= max_workers ({max_workers!r})")
    evens = [n for n in range(min_workers, max_workers + 1) if n % 2 == 0]
    if not evens and any(n in ("adpsgd", "hadpsgd") for n in chosen):
        raise InvalidArgument(f"no even worker count in [{min_workers}, {max_workers}] for matching schemes")
    return st.sampled_from(chosen).flatmap(lambda name: _one(name, min_workers, max_workers, evens))


def _one(name: str, lo: int, hi: int, evens: list[int]) -> st.SearchStrategy[Algorithm]:
    seed = st.integers(0, 2**16)
    period = st.integers(1, 16)
    if name == "sgd":
        return st.just(make_algorithm("sgd"))
    if name == "ssgd":
        return st.builds(_make, st.just(name), n_workers=st.integers(lo, hi), seed=seed)
    if name == "bsp":
        return st.builds(_make, st.just(name), n_workers=st.integers(lo, hi), period=period)
    if name == "bmuf":
        return st.builds(
            _make,
            st.just(name),
            n_workers=st.integers(lo, hi),
            period=period,
            block_momentum=st.none() | st.floats(0.0, 0.95),
            block_lr=st.floats(0.1, 2.0),
            variant=st.sampled_from(ALGORITHMS[name].variants),
        )
    if name == "easgd":
        return st.integers(lo, hi).flatmap(
            lambda n: st.builds(
                _make,
                st.just(name),
                n_workers=st.just(n),
                period=period,
                alpha=st.none() | st.floats(0.0, 0.99 / n),
                variant=st.sampled_from(ALGORITHMS[name].variants),
            )
        )
    if name == "asgd":
        return st.builds(
            _make, st.just(name), n_workers=st.integers(lo, hi), period=period, server_lr=st.floats(0.1, 2.0)
        )
    if name == "dpsgd":
        return st.builds(
            _make,
            st.just(name),
            n_workers=st.integers(max(lo, 3), max(hi, 3)),
            topology=st.sampled_from(["ring", "complete", "exponential"]),
            seed=seed,
        )
    if name == "adpsgd":
        return st.sampled_from(ALGORITHMS[name].variants).flatmap(
            lambda v: st.builds(
                _make,
                st.just(name),
                n_workers=st.sampled_from(evens),
                variant=st.just(v),
                seed=seed,
                delay=st.integers(1, 3) if v == "delay" else st.just(None),
            )
        )
    if name == "hadpsgd":
        shapes = [(m, n) for n in evens for m in range(1, n + 1) if n % m == 0 and ((n // m) % 2 == 0 or n == m)]
        return st.sampled_from(shapes).flatmap(
            lambda mn: st.builds(
                _make,
                st.just(name),
                n_workers=st.just(mn[1]),
                gpus_per_node=st.just(mn[0]),
                variant=st.sampled_from(ALGORITHMS[name].variants),
                seed=seed,
            )
        )
    raise InvalidArgument(f"no strategy for algorithm {name!r}")  # a new registry entry needs one


def _make(name: str, **params: Any) -> Algorithm:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TestbedWarning)
        return make_algorithm(name, **params)
