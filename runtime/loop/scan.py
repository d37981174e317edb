"""Pure scans of an algorithm's schedule that a rank makes before its loop starts: the groups
its collectives need, the group of an overlappable gradient allreduce, the requests its
responder and the parameter server will serve, and the shard layout of sharded exchanges."""

from __future__ import annotations

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.exchange import AllReduce, Barrier, PairwiseAverage, ServerExchange

__all__ = [
    "collect_groups",
    "overlap_group",
    "count_passive",
    "first_passive",
    "count_server_requests",
    "shard_bounds",
]


def collect_groups(algorithm: Algorithm, steps: int, scan: int = 512) -> list[tuple[int, ...]]:
    """Every sub-group a collective of the schedule uses (allreduce and allgather groups),
    from the first ``scan`` steps of every rank (groups are static in every core algorithm)."""
    groups: set[tuple[int, ...]] = {tuple(range(algorithm.n_workers))}
    for s in range(min(steps, scan)):
        for r in range(algorithm.n_workers):
            for ex in algorithm.exchanges(s, r):
                if isinstance(ex, (AllReduce, Barrier)):
                    groups.add(tuple(ex.group))
                elif isinstance(ex, PairwiseAverage) and ex.n_shards > 1:
                    groups.add(tuple(ex.gather_group))
    return sorted(groups)


def overlap_group(algorithm: Algorithm, rank: int, start: int, steps: int, scan: int = 512) -> tuple[int, ...] | None:
    """The group of ``rank``'s gradient allreduce when every step of ``[start, steps)`` (the first
    ``scan`` of them) has exactly one, over that same group of two or more ranks; else None."""
    group = None
    for s in range(start, min(steps, start + scan)):
        grads = [ex for ex in algorithm.exchanges(s, rank) if isinstance(ex, AllReduce) and ex.payload == "grad"]
        if len(grads) != 1 or len(grads[0].group) < 2 or (group is not None and tuple(grads[0].group) != group):
            return None
        group = tuple(grads[0].group)
    return group


def count_passive(algorithm: Algorithm, rank: int, start: int, steps: int) -> tuple[int, PairwiseAverage | None]:
    """Number of passive pairwise entries of ``rank`` in ``[start, steps)`` (the requests its
    responder will serve) and one of them (for the shard layout)."""
    n, example = 0, None
    for s in range(start, steps):
        for ex in algorithm.exchanges(s, rank):
            if isinstance(ex, PairwiseAverage) and not ex.active:
                n += 1
                example = example or ex
    return n, example


def first_passive(algorithm: Algorithm, rank: int, start: int, steps: int) -> PairwiseAverage | None:
    """The first passive pairwise entry of ``rank`` in ``[start, steps)`` (None: it answers no
    request), found without scanning further."""
    for s in range(start, steps):
        for ex in algorithm.exchanges(s, rank):
            if isinstance(ex, PairwiseAverage) and not ex.active:
                return ex
    return None


def count_server_requests(algorithm: Algorithm, start: int, steps: int) -> int:
    return sum(
        1
        for r in range(algorithm.n_workers)
        for s in range(start, steps)
        for ex in algorithm.exchanges(s, r)
        if isinstance(ex, ServerExchange)
    )


def shard_bounds(n: int, n_shards: int) -> list[tuple[int, int]]:
    """``numpy.array_split`` boundaries."""
    base, extra = divmod(n, n_shards)
    out, lo = [], 0
    for i in range(n_shards):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out
