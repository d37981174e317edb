r"""AD-PSGD on the IBM rings: fixed ring, randomized ring, delay-by-D (§A.8, §A.9).

Update rule in matrix form (Zhang et al. Eq. 7), learners as columns:

.. math:: \Theta_{k+1} = \Theta_k T_k - \alpha_k G(\Theta_{k-D}, \Xi_k)

with :math:`T_k = \tfrac12(I + P_k)` for the perfect matching :math:`P_k` of round ``k``:

- ``fixed``: rounds alternate :math:`P_L` = (0,1),(2,3),… and :math:`P_R` = (1,2),…,(n-1,0);
  odd ranks are active, even ranks passive (Lian's bipartite rule; every pair mixes parities);
- ``random``: a uniformly random perfect matching drawn from ``(seed, round)`` so every rank
  agrees without communicating; the lower rank of a pair is active (an asynchronous runtime
  serves passive requests from a responder, so a rank may be active one round and passive the
  next without risk of deadlock) -- ALGORITHMS.md F.10 marks this formalisation as inferred;
- ``delay``: the fixed ring with the gradient computed on weights ``delay`` steps older
  (delay-by-one for ``delay=1``; inferred formalisation, F.11).

The gradient is computed on the pre-averaging weights and applied after the averaging (one
foreign merge per step: staleness 1, plus the merges of the ``delay`` older steps).
Sends: the full model to one peer and back (``S`` each way), overlapping the gradient
computation (non-blocking). No extra state. Mean dynamics equal SSGD with the total batch, so
the learning rate is scaled by the total batch. Requires an even number of workers.

Spectral gap of :math:`E[T T^\top]`: :math:`\sin^2(\pi/n)` (fixed), :math:`n/(2(n-1))` (random).

Examples
--------
>>> a = ADPSGD(n_workers=4)
>>> [ex.peer for ex in a.exchanges(0, 1)], [ex.peer for ex in a.exchanges(1, 1)]
([0], [2])
>>> from psgdlab.core.reference import run_reference, LeastSquaresProblem
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=4, batch=8, seed=0)
>>> result = run_reference(ADPSGD(n_workers=4, variant="random"), problem, steps=30, lr=0.05)
>>> bool(result.losses[-1] < result.losses[0])
True

References
----------
Lian et al., ICML 2018; Zhang et al., Interspeech 2019; Zhang et al., ICASSP 2020; Cui et al.,
TASLP 2021.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from psgdlab.core.algorithms._matching import matching_period, partner
from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.errors import TopologyError, require
from psgdlab.core.exchange import Exchange, PairwiseAverage

if TYPE_CHECKING:
    from psgdlab.core.graphs.topology import Topology

__all__ = ["ADPSGD", "matching_exchange", "check_even"]

VARIANTS = ("fixed", "random", "delay")


def check_even(count: int, what: str) -> None:
    """Matching-based schemes need an even number of members (ALGORITHMS.md F.2)."""
    require(
        count % 2 == 0,
        what,
        count,
        "must be even for matching-based schemes: a perfect matching pairs every member with exactly one other",
        hint="use an even count, or dpsgd with ring/torus/exponential for odd counts",
        error=TopologyError,
    )


def matching_exchange(kind: str, n: int, seed: int, round_: int, member: int) -> tuple[int, bool]:
    """``(partner, active)`` of ``member`` in round ``round_``: odd members are active on the
    fixed ring; the lower member of a pair is active in a random matching."""
    other = partner(kind, n, seed, round_, member)
    active = (member % 2 == 1) if kind == "fixed-ring" else member < other
    return other, active


@dataclass(frozen=True, slots=True, kw_only=True)
class ADPSGD(Algorithm):
    """Asynchronous decentralised parallel SGD on a ring.

    The parameters common to every algorithm are those of :class:`Algorithm`.

    Parameters
    ----------
    variant : {"fixed", "random", "delay"}
        Ring pattern (see the module docstring); default ``"fixed"``.
    delay : int or None
        Extra gradient delay ``D`` (only for ``variant="delay"``; default 1 there, 0 otherwise).
    """

    name: ClassVar[str] = "adpsgd"
    gossip: ClassVar[bool] = True
    variants: ClassVar[tuple[str, ...]] = VARIANTS
    asynchronous: ClassVar[bool] = True

    variant: str = "fixed"
    delay: int | None = None

    def __post_init__(self) -> None:
        Algorithm.__post_init__(self)
        if self.delay is None:
            object.__setattr__(self, "delay", 1 if self.variant == "delay" else 0)
        if self.variant == "delay":
            require(
                isinstance(self.delay, int) and self.delay >= 1,
                "delay",
                self.delay,
                "must be an integer >= 1 for the delay variant",
            )
        else:
            require(self.delay == 0, "delay", self.delay, f"only applies to variant 'delay', not {self.variant!r}")
        check_even(self.n_workers, "workers")

    @property
    def ring_kind(self) -> str:
        return "random-ring" if self.variant == "random" else "fixed-ring"

    def membership_topology(self) -> Topology:
        """The ring's matching schedule (``fixed-ring`` or ``random-ring``)."""
        from psgdlab.core.graphs.topology import build_topology

        return build_topology(self.ring_kind, self.n_workers, seed=self.seed)

    @property
    def schedule_period(self) -> int | None:
        return matching_period(self.ring_kind, self.n_workers, self.seed)

    @property
    def gradient_delay(self) -> int:
        return int(self.delay or 0)

    def exchanges(self, step: int, rank: int) -> tuple[Exchange, ...]:
        peer, active = matching_exchange(self.ring_kind, self.n_workers, self.seed, step, rank)
        return (PairwiseAverage(peer=peer, active=active),)
