r"""SSGD: synchronous SGD with an allreduce of gradients every step (ALGORITHMS.md §A.2).

Update rule (all learners hold identical weights):

.. math:: \theta_{k+1} = \theta_k - \alpha_k \frac{1}{n} \sum_{i=1}^{n} g(\theta_k, \xi^i_k)

Sends per step: one ring allreduce of the ``d``-float gradient among all ``n`` workers
(:math:`2(n-1)/n \cdot S` bytes each way per rank), blocking, lockstep. Carries no extra state.
Mixing-matrix view: ``J/n`` every step. Staleness 0; the step time follows the slowest worker.

Reductions: with ``n`` workers × batch ``m`` it equals single-learner SGD with batch ``n m`` on
the same samples; ADPSGD/D-PSGD with ``T = J/n`` equals it; H-ADPSGD with one node equals it.

Examples
--------
>>> from psgdlab.core.reference import run_reference, LeastSquaresProblem
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=4, batch=8, seed=0)
>>> result = run_reference(SSGD(n_workers=4), problem, steps=30, lr=0.05)
>>> float(result.consensus_distance[-1])
0.0

References
----------
Zhang et al., Interspeech 2019, Eq. 6; Patarasuk & Yuan 2009 (ring allreduce).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.exchange import Exchange

__all__ = ["SSGD"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SSGD(Algorithm):
    """Synchronous allreduce SGD. Parameters are as in :class:`Algorithm`."""

    name: ClassVar[str] = "ssgd"

    def exchanges(self, step: int, rank: int) -> tuple[Exchange, ...]:
        return self._allreduce_all("grad")

    @property
    def schedule_period(self) -> int:
        return 1
