r"""BMUF: blockwise model-update filtering, classical or Nesterov block momentum (§A.5).

Every worker runs :math:`\tau` local SGD steps from the same model; the models are averaged and
filtered:

.. math::
    G_t = \bar w_t - \tilde w_{t-1}, \qquad
    \Delta_t = \zeta \Delta_{t-1} + \eta G_t, \qquad
    \tilde w_t = \tilde w_{t-1} + \Delta_t .

Classical block momentum (CBM, what Li et al. ran) starts the next block from
:math:`\tilde w_t`; Nesterov (NBM) from :math:`\tilde w_t + \zeta\Delta_t`, stored as the
previous global model (CNTK, fairseq). Setting rule (Li et al. Eq. 6):
:math:`\eta / (N(1-\zeta)) = C` with usually :math:`\eta = C = 1`, hence the default
:math:`\zeta = 1 - 1/N`.

Sends: one blocking allreduce of the ``d``-float model every :math:`\tau` steps. State per
worker: the global model :math:`\tilde w` and block momentum :math:`\Delta` (two extra model
copies, replicated). No gradient staleness; drift up to :math:`\tau` steps. Local momentum is
reset after each block (CNTK's default).

Reductions: ``block_momentum=0, block_lr=1`` is BSP; the summed form with gain
:math:`(1-\zeta)C` (:func:`psgdlab.core.kernels.bmuf_filter_summed`) equals this averaged form
when :math:`\eta = (1-\zeta) N C`.

Examples
--------
>>> BMUF(n_workers=8, period=20).block_momentum
0.875
>>> from psgdlab.core.reference import run_reference, LeastSquaresProblem
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=4, batch=8, seed=0)
>>> result = run_reference(BMUF(n_workers=4, period=5), problem, steps=40, lr=0.05)
>>> bool(result.losses[-1] < result.losses[0])
True

References
----------
Chen & Huo, ICASSP 2016; Li et al., arXiv 1703.05880 §2.3; CNTK BlockMomentumSGD.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from psgdlab.core import kernels
from psgdlab.core.algorithms.base import Algorithm, WorkerState, check_period, is_sync_step
from psgdlab.core.errors import TestbedWarning, require
from psgdlab.core.exchange import AllReduce, Exchange

__all__ = ["BMUF"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BMUF(Algorithm):
    """Blockwise model-update filtering.

    The parameters common to every algorithm are those of :class:`Algorithm`.

    Parameters
    ----------
    period : int
        Local steps per block (:math:`\\tau`), ``>= 1``; default 5.
    block_momentum : float or None
        :math:`\\zeta \\in [0, 1)`; ``None`` applies the setting rule :math:`1 - 1/N`.
    block_lr : float
        :math:`\\eta > 0`; default 1.
    variant : {"classical", "nesterov"}
        Where the next block starts (CBM default, as Li et al. ran).
    """

    name: ClassVar[str] = "bmuf"
    variants: ClassVar[tuple[str, ...]] = ("classical", "nesterov")

    period: int = 5
    block_momentum: float | None = None
    block_lr: float = 1.0
    variant: str = "classical"

    def __post_init__(self) -> None:
        Algorithm.__post_init__(self)
        check_period(self.period)
        momentum = 1.0 - 1.0 / self.n_workers if self.block_momentum is None else self.block_momentum
        object.__setattr__(self, "block_momentum", momentum)
        require(0.0 <= momentum < 1.0, "block_momentum", momentum, "must be in [0, 1)")
        require(self.block_lr > 0.0, "block_lr", self.block_lr, "must be > 0")
        if self.period == 1:
            warnings.warn(
                "bmuf with period 1 filters after every step: it pays one model allreduce "
                "per step (like SSGD) with none of the local-step savings",
                TestbedWarning,
                stacklevel=3,
            )

    def init_state(self, x0: Any, rank: int) -> WorkerState:
        return WorkerState(params=kernels.clone(x0), extras={"global": kernels.clone(x0), "delta": x0 * 0.0})

    def exchanges(self, step: int, rank: int) -> tuple[Exchange, ...]:
        return self._allreduce_all("model") if is_sync_step(step, self.period) else ()

    @property
    def schedule_period(self) -> int:
        return self.period

    def combine(self, state: WorkerState, exchange: Exchange, received: Any) -> WorkerState:
        if not isinstance(exchange, AllReduce):
            return Algorithm.combine(self, state, exchange, received)
        new_global, new_delta = kernels.bmuf_filter(
            received,
            state.extras["global"],
            state.extras["delta"],
            block_momentum=float(self.block_momentum or 0.0),
            block_lr=self.block_lr,
            nesterov=self.variant == "nesterov",
        )
        return WorkerState(
            params=kernels.clone(new_global), momentum=None, extras={"global": new_global, "delta": new_delta}
        )
