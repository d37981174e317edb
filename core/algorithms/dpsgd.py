r"""D-PSGD: synchronous decentralised (gossip) SGD on a static topology (ALGORITHMS.md §A.7).

Update rule (learners as columns, ``W`` doubly stochastic):

.. math:: \theta^i_{k+1} = \sum_j W_{ji} \theta^j_k - \alpha_k g(\theta^i_k, \xi^i_k)

Both terms read :math:`\Theta_k`, so the neighbour exchange overlaps the gradient computation
inside an iteration, but every learner waits for its neighbours each step (blocking).
Sends: the model to every neighbour and receives theirs (``deg * S`` each way). No extra state.
Staleness (counted as foreign merges, :mod:`psgdlab.core.exchange`): 1 per step.
Assumptions on W: doubly stochastic (symmetric for the built-in kinds); convergence rate enters
through :math:`\rho = \max(|\lambda_2|, |\lambda_n|)`.

Reduction: with ``topology="complete"`` (``W = J/n``) it equals SSGD.

Examples
--------
>>> from psgdlab.core.reference import run_reference, LeastSquaresProblem
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=4, batch=8, seed=0)
>>> result = run_reference(DPSGD(n_workers=4, topology="ring"), problem, steps=30, lr=0.05)
>>> bool(result.losses[-1] < result.losses[0])
True

References
----------
Lian et al., NeurIPS 2017.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from psgdlab.core.algorithms._matching import mixing_column
from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.errors import require
from psgdlab.core.exchange import Exchange, Gossip
from psgdlab.core.graphs.topology import STATIC_KINDS

if TYPE_CHECKING:
    from psgdlab.core.graphs.topology import Topology

__all__ = ["DPSGD"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DPSGD(Algorithm):
    """Synchronous gossip SGD.

    The parameters common to every algorithm are those of :class:`Algorithm`.

    Parameters
    ----------
    topology : {"ring", "torus", "complete", "exponential"}
        Static topology whose mixing matrix ``W`` is used (:mod:`psgdlab.core.graphs.topology`).
    """

    name: ClassVar[str] = "dpsgd"
    gossip: ClassVar[bool] = True

    topology: str = "ring"

    def __post_init__(self) -> None:
        Algorithm.__post_init__(self)
        require(
            self.topology in STATIC_KINDS,
            "topology",
            self.topology,
            f"must be one of {', '.join(STATIC_KINDS)} for dpsgd",
        )
        if self.n_workers > 1:
            from psgdlab.core.graphs.topology import build_topology

            build_topology(self.topology, self.n_workers, seed=self.seed)  # validates the size

    def membership_topology(self) -> Topology:
        """The static topology whose mixing matrix the gossip uses."""
        from psgdlab.core.graphs.topology import build_topology

        return build_topology(self.topology, self.n_workers, seed=self.seed)

    @property
    def schedule_period(self) -> int:
        return 1  # a static topology: every step mixes with the same neighbours

    def exchanges(self, step: int, rank: int) -> tuple[Exchange, ...]:
        if self.n_workers == 1:
            return ()
        peers, weights, self_weight = mixing_column(self.topology, self.n_workers, self.seed, rank)
        return (Gossip(peers=peers, weights=weights, self_weight=self_weight),)
