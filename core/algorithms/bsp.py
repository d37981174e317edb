r"""BSP: periodic model averaging every ``period`` local steps (ALGORITHMS.md §A.4).

Update rule: local SGD on each worker's shard; at the end of every block of :math:`\tau` steps

.. math:: \theta^i \leftarrow \bar\theta = \frac{1}{n}\sum_j \theta^j .

Sends: one blocking allreduce of the ``d``-float model every :math:`\tau` steps. State: none
beyond the local momentum, which is reset after each averaging (CNTK's default). Mixing: ``J/n``
at sync steps, ``I`` otherwise. No gradient staleness; local models drift for up to
:math:`\tau` steps. Shards are assumed equal (uniform weights, ALGORITHMS.md F.16).

Reductions: ``period=1`` with plain SGD is SSGD; BMUF with block momentum 0 and block lr 1 is BSP.

Examples
--------
>>> from psgdlab.core.reference import run_reference, LeastSquaresProblem
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=4, batch=8, seed=0)
>>> result = run_reference(BSP(n_workers=4, period=5), problem, steps=20, lr=0.05)
>>> float(result.consensus_distance[-1])  # step 20 ends a block: all replicas agree
0.0

References
----------
Li et al., arXiv 1703.05880, Eq. 1; Zinkevich et al. 2010.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from psgdlab.core.algorithms.base import Algorithm, WorkerState, check_period, is_sync_step
from psgdlab.core.exchange import AllReduce, Exchange

__all__ = ["BSP"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BSP(Algorithm):
    """Periodic model averaging.

    The parameters common to every algorithm are those of :class:`Algorithm`.

    Parameters
    ----------
    period : int
        Local steps between averagings (:math:`\\tau`), ``>= 1``. Default 5 (ALGORITHMS.md §A.4).
    """

    name: ClassVar[str] = "bsp"

    period: int = 5

    def __post_init__(self) -> None:
        Algorithm.__post_init__(self)
        check_period(self.period)

    def exchanges(self, step: int, rank: int) -> tuple[Exchange, ...]:
        return self._allreduce_all("model") if is_sync_step(step, self.period) else ()

    @property
    def schedule_period(self) -> int:
        return self.period

    def combine(self, state: WorkerState, exchange: Exchange, received: Any) -> WorkerState:
        if isinstance(exchange, AllReduce):
            return state.replace(params=received, momentum=None)
        return Algorithm.combine(self, state, exchange, received)
