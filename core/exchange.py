r"""The closed set of exchange kinds every executor understands.

An algorithm's schedule (:meth:`psgdlab.core.algorithms.Algorithm.exchanges`) returns, for a
(step, rank), a tuple of these frozen records. Executors -- the reference executor, the simulator,
the emulator and the runtime -- dispatch on the record's type, never on the algorithm's name.

Step semantics (shared by every executor)
-----------------------------------------
One step of worker ``r`` at local step ``s``:

1. read the weights the gradient is computed on: the current model, or the model of ``delay``
   steps ago for delayed-gradient variants;
2. compute the minibatch gradient ``g``; **concurrently**, run every exchange with
   ``phase == "mix"`` on the model as it was at the start of the step;
3. run every ``phase == "grad"`` exchange on ``g`` (an allreduce-mean of gradients);
4. merge the ``"mix"`` results: ``params <- params + (mixed - sent)`` (local changes made during
   the exchange are kept, not overwritten by the average);
5. apply the local update ``params <- params - lr * g`` (plus local momentum);
6. run every ``phase == "post"`` exchange on the model (periodic averaging, BMUF filter, elastic
   or parameter-server exchange) and let the algorithm's ``combine`` merge the reply.

Staleness (one definition for every executor) is the number of foreign model merges applied to
a worker's model between reading the weights for a gradient (1) and applying that gradient (5):
each pairwise average (active or passive side), each gossip merge counts one; for server-based
algorithms it is the number of other workers' updates the server applied between this worker's
last pull and its push. Unit: *updates* (an integer per step).

Wire bytes (per rank, per exchange; ``S = n_params * itemsize``) are given by :func:`wire_bytes`,
their time on a platform by :mod:`psgdlab.core.platform.cost`; traces name kinds by :class:`ExchangeKind`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal, TypeAlias

from psgdlab.core.errors import require

__all__ = [
    "AllReduce",
    "PairwiseAverage",
    "Gossip",
    "ServerExchange",
    "Barrier",
    "Exchange",
    "ExchangeKind",
    "EXCHANGE_KINDS",
    "kind_of",
    "kind_name",
    "wire_bytes",
    "trainer_merges",
    "folds_model",
]

Phase: TypeAlias = Literal["grad", "mix", "post"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AllReduce:
    """Average ``payload`` over ``group`` (ranks, sorted); every member ends with the mean.

    ``payload="grad"`` runs in phase ``"grad"`` (SSGD, H-ADPSGD inside a node);
    ``payload="model"`` runs in phase ``"post"`` (BSP, BMUF, synchronous EASGD) and the
    algorithm's ``combine`` receives the mean model.
    """

    group: tuple[int, ...]
    payload: Literal["grad", "model"]
    blocking: bool = True

    def __post_init__(self) -> None:
        require(len(self.group) >= 1, "group", self.group, "must name at least one rank")
        require(self.payload in ("grad", "model"), "payload", self.payload, "must be 'grad' or 'model'")

    @property
    def phase(self) -> Phase:
        return "grad" if self.payload == "grad" else "post"


@dataclass(frozen=True, slots=True, kw_only=True)
class PairwiseAverage:
    """Average the model (or one shard of it) with ``peer``: both end with ``(x_i + x_peer)/2``,
    or with ``(1 - weight) * x_i + weight * x_peer`` where ``weight`` is not one half.

    The ``active`` side initiates; the passive side answers from a responder (AD-PSGD's
    bipartite split, so no schedule can deadlock). Passive entries tell the reference executor
    and the simulator which pairs meet in a round; an asynchronous runtime serves them from its
    responder whenever the active peer asks. ``blocking=False`` means the exchange overlaps the
    gradient computation of the same step (phase ``"mix"``).

    With ``n_shards > 1`` (H-ADPSGD) the rank exchanges only slice ``shard`` of the flat model
    (``numpy.array_split`` into ``n_shards`` parts) with its counterpart, and the members of
    ``gather_group`` then allgather their averaged slices so each holds the whole mixed model:
    slice ``j`` is averaged by member ``gather_group[j % len(gather_group)]`` (one slice each when
    the group has ``n_shards`` members, the registry's schedules; empty: the rank averages every
    slice itself, one record each). ``weight`` is the peer's share: one half between equals, and
    ``m_peer / (m_own + m_peer)`` between nodes of unequal size after a failure
    (:func:`psgdlab.core.graphs.membership.survivor_exchanges`), so the union's average is kept.
    """

    peer: int
    active: bool
    blocking: bool = False
    shard: int = 0
    n_shards: int = 1
    gather_group: tuple[int, ...] = ()
    weight: float = 0.5

    def __post_init__(self) -> None:
        require(self.peer >= 0, "peer", self.peer, "must be a rank >= 0")
        require(self.n_shards >= 1, "n_shards", self.n_shards, "must be >= 1")
        require(0 <= self.shard < self.n_shards, "shard", self.shard, f"must be in [0, {self.n_shards})")
        require(
            len(self.gather_group) <= self.n_shards,
            "gather_group",
            self.gather_group,
            f"must list at most the {self.n_shards} ranks that share the model",
        )
        require(0 < self.weight < 1, "weight", self.weight, "must be in (0, 1)")

    @property
    def phase(self) -> Phase:
        return "mix"


@dataclass(frozen=True, slots=True, kw_only=True)
class Gossip:
    """D-PSGD mixing: send the model to ``peers``, receive theirs, and form
    ``self_weight * x_self + sum_j weights[j] * x_peers[j]`` (one column of W)."""

    peers: tuple[int, ...]
    weights: tuple[float, ...]
    self_weight: float
    blocking: bool = True

    def __post_init__(self) -> None:
        require(
            len(self.peers) == len(self.weights),
            "weights",
            self.weights,
            f"must have one entry per peer ({len(self.peers)})",
        )
        total = self.self_weight + sum(self.weights)
        require(abs(total - 1.0) < 1e-9, "gossip weights", round(total, 12), "must sum to 1")

    @property
    def phase(self) -> Phase:
        return "mix"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerExchange:
    """Send a message to the parameter server (a role, not a worker rank) and merge its reply.

    ``op`` names the server kernel: ``"delta"`` (ASGD: the server adds the pushed accumulated
    update and replies with its model) or ``"elastic"`` (asynchronous EASGD: both sides move
    towards each other by the elastic coefficient). Requests are served one at a time, in
    arrival order.
    """

    op: Literal["delta", "elastic"]
    blocking: bool = True

    def __post_init__(self) -> None:
        require(self.op in ("delta", "elastic"), "op", self.op, "must be 'delta' or 'elastic'")

    @property
    def phase(self) -> Phase:
        return "post"


@dataclass(frozen=True, slots=True, kw_only=True)
class Barrier:
    """Wait until every rank of ``group`` reaches this point."""

    group: tuple[int, ...]
    blocking: bool = True

    @property
    def phase(self) -> Phase:
        return "post"


Exchange: TypeAlias = AllReduce | PairwiseAverage | Gossip | ServerExchange | Barrier


class ExchangeKind(IntEnum):
    """Integer code of an exchange kind in traces (the ``kind`` column); ``NONE`` (0) marks
    records of no exchange (compute). The codes are stored on disk: never renumber them."""

    NONE = 0
    ALLREDUCE = 1
    PAIRWISE = 2
    GOSSIP = 3
    SERVER = 4
    BARRIER = 5


#: the kind of each exchange record type
EXCHANGE_KINDS: dict[type, ExchangeKind] = {
    AllReduce: ExchangeKind.ALLREDUCE,
    PairwiseAverage: ExchangeKind.PAIRWISE,
    Gossip: ExchangeKind.GOSSIP,
    ServerExchange: ExchangeKind.SERVER,
    Barrier: ExchangeKind.BARRIER,
}


def kind_of(exchange: Exchange) -> ExchangeKind:
    """The trace kind of ``exchange``.

    >>> kind_of(Barrier(group=(0, 1)))
    <ExchangeKind.BARRIER: 5>
    """
    return EXCHANGE_KINDS[type(exchange)]


def kind_name(code: int) -> str:
    """Name of a trace ``kind`` code (``0 -> "none"``, ``1 -> "allreduce"``, ...).

    >>> [kind_name(k) for k in ExchangeKind]
    ['none', 'allreduce', 'pairwise', 'gossip', 'server', 'barrier']
    """
    return ExchangeKind(int(code)).name.lower()


def wire_bytes(exchange: Exchange, n_params: int, itemsize: int = 4) -> tuple[int, int]:
    r"""Bytes one rank sends and receives for ``exchange`` (``S = n_params * itemsize``).

    - ring allreduce over ``n`` ranks: :math:`2(n-1)/n \cdot S` each way (0 when ``n == 1``);
    - pairwise average: :math:`S / n_\text{shards}` each way (the allgather inside the node that
      follows a sharded exchange is counted separately by executors as
      :math:`(m-1)/m \cdot S` received);
    - gossip: :math:`\deg \cdot S` each way;
    - server exchange: ``S`` up and ``S`` down (the server link carries ``n S`` per round);
    - barrier: 0.

    Examples
    --------
    >>> wire_bytes(AllReduce(group=(0, 1, 2, 3), payload="grad"), 1000)
    (6000, 6000)
    >>> wire_bytes(PairwiseAverage(peer=1, active=True), 1000)
    (4000, 4000)
    """
    size = int(n_params) * int(itemsize)
    if isinstance(exchange, AllReduce):
        n = len(exchange.group)
        b = (2 * (n - 1) * size) // n if n > 1 else 0
        return b, b
    if isinstance(exchange, PairwiseAverage):
        b = -(-size // exchange.n_shards)
        return b, b
    if isinstance(exchange, Gossip):
        b = len(exchange.peers) * size
        return b, b
    if isinstance(exchange, ServerExchange):
        return size, size
    return 0, 0


def trainer_merges(exchanges: Sequence[Exchange]) -> bool:
    """Whether a rank's training thread folds an average back into its model in a step with
    ``exchanges``: the active side of a pairwise average, every member of a node in a sharded one
    (the passive members apply the allgathered merges after agreeing on them), a gossip step. A
    passive side of an unsharded pairwise average merges in its responder thread instead, while
    the training thread computes. Model allreduces (BMUF, BSP, synchronous EASGD) fold their mean in the collective
    (:func:`folds_model`).

    >>> trainer_merges([PairwiseAverage(peer=1, active=True)]), trainer_merges([PairwiseAverage(peer=0, active=False)])
    (True, False)
    """
    return any(
        (isinstance(ex, PairwiseAverage) and (ex.active or ex.n_shards > 1)) or isinstance(ex, Gossip)
        for ex in exchanges
    )


def folds_model(exchanges: Sequence[Exchange]) -> bool:
    """Whether a step with ``exchanges`` allreduces the *model* (not the gradient) and folds the
    mean back into each member (BSP, BMUF, synchronous EASGD): the allreduce record of such a
    step also holds the fold, which the calibration prices apart (``[platform] model_average_s``).

    >>> folds_model([AllReduce(group=(0, 1), payload="model")]), folds_model([AllReduce(group=(0, 1), payload="grad")])
    (True, False)
    """
    return any(isinstance(ex, AllReduce) and ex.payload == "model" for ex in exchanges)
