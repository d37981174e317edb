r"""H-ADPSGD: hierarchical ADPSGD with super-learners (ALGORITHMS.md §A.10).

The ``m = gpus_per_node`` workers of a node form a super-learner that applies SSGD (a
synchronous allreduce of gradients inside the node); the ``n_s = n/m`` super-learners run the
ADPSGD rule on a ring. Ranks are node-major (``rank = node * m + local``). Matrix form:

.. math::
    \Theta_{k+1} = \Theta_k (T_k \otimes J_m/m) - \alpha_k G(\Theta_k, \Xi_k)(I_{n_s} \otimes J_m/m)

Sends per step: an allreduce of the gradient among the node's ``m`` workers
(:math:`2(m-1)/m \cdot S`), and the inter-node pairwise average, sharded: local rank ``l``
exchanges slice ``l`` of ``m`` of the model with local rank ``l`` of the partner node
(``S/m`` each way per worker, ``S`` per node, ALGORITHMS.md F.8's sharded option), then the node
allgathers the averaged slices. The inter-node exchange overlaps the gradient computation.
State: none beyond the model; replicas inside a node stay identical. Staleness 0 inside a node,
1 per inter-node merge.

Reductions: one node is SSGD; ``m = 1`` is ADPSGD with the same ring.

Examples
--------
>>> h = HADPSGD(n_workers=8, gpus_per_node=2)
>>> [type(e).__name__ for e in h.exchanges(0, 2)]
['AllReduce', 'PairwiseAverage']
>>> h.exchanges(0, 2)[1].peer  # node 1 pairs with node 0 in round 0; local rank 0 -> rank 0
0

References
----------
Zhang et al., Interspeech 2019 §4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from psgdlab.core.algorithms._matching import matching_period
from psgdlab.core.algorithms.adpsgd import check_even, matching_exchange
from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.errors import TopologyError, require
from psgdlab.core.exchange import AllReduce, Exchange, PairwiseAverage

if TYPE_CHECKING:
    from psgdlab.core.graphs.topology import Topology

__all__ = ["HADPSGD"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HADPSGD(Algorithm):
    """Hierarchical ADPSGD.

    The parameters common to every algorithm are those of :class:`Algorithm`.

    Parameters
    ----------
    gpus_per_node : int
        Workers per super-learner ``m >= 1``; ``n_workers`` must be a multiple of it and the
        number of nodes even (or 1).
    variant : {"fixed", "random"}
        Ring pattern between super-learners.
    """

    name: ClassVar[str] = "hadpsgd"
    gossip: ClassVar[bool] = True
    variants: ClassVar[tuple[str, ...]] = ("fixed", "random")
    asynchronous: ClassVar[bool] = True

    gpus_per_node: int = 1
    variant: str = "fixed"

    def __post_init__(self) -> None:
        Algorithm.__post_init__(self)
        m = self.gpus_per_node
        require(isinstance(m, int) and m >= 1, "gpus_per_node", m, "must be an integer >= 1")
        require(
            self.n_workers % m == 0,
            "workers",
            self.n_workers,
            f"must be divisible by gpus_per_node ({m})",
            error=TopologyError,
        )
        if self.n_nodes > 1:
            check_even(self.n_nodes, "nodes (workers / gpus_per_node)")

    @property
    def n_nodes(self) -> int:
        return self.n_workers // self.gpus_per_node

    def node_group(self, node: int) -> tuple[int, ...]:
        m = self.gpus_per_node
        return tuple(range(node * m, node * m + m))

    def membership_topology(self) -> Topology:
        """The hierarchical topology: nodes of ``gpus_per_node`` on the super-learners' ring."""
        from psgdlab.core.graphs.topology import build_topology

        inner: Literal["fixed-ring", "random-ring"] = "random-ring" if self.variant == "random" else "fixed-ring"
        return build_topology(
            "hierarchical", self.n_workers, gpus_per_node=self.gpus_per_node, seed=self.seed, inner=inner
        )

    @property
    def schedule_period(self) -> int | None:
        if self.n_nodes == 1:
            return 1
        return matching_period("random-ring" if self.variant == "random" else "fixed-ring", self.n_nodes, self.seed)

    def exchanges(self, step: int, rank: int) -> tuple[Exchange, ...]:
        m = self.gpus_per_node
        node, local = divmod(rank, m)
        group = self.node_group(node)
        out: list[Exchange] = []
        if m > 1:
            out.append(AllReduce(group=group, payload="grad"))
        if self.n_nodes > 1:
            kind = "random-ring" if self.variant == "random" else "fixed-ring"
            peer_node, active = matching_exchange(kind, self.n_nodes, self.seed, step, node)
            out.append(
                PairwiseAverage(
                    peer=peer_node * m + local,
                    active=active,
                    shard=local,
                    n_shards=m,
                    gather_group=group if m > 1 else (),
                )
            )
        return tuple(out)
