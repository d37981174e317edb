r"""ASGD: parameter-server asynchronous SGD with a sync period (ALGORITHMS.md §A.3, F.15).

Worker ``i`` runs :math:`\tau` local SGD steps from the model it last pulled, pushes the
accumulated difference :math:`\delta_i = w_\text{local} - w_\text{pulled}`, the server applies

.. math:: \tilde w \leftarrow \tilde w + \alpha_s \delta_i

on arrival and replies with its model, which replaces the worker's (kaldi-aslp behaviour;
:math:`\tau = 1` is classic ASGD, :math:`\tilde w_{t+k+1} = \tilde w_{t+k} - \eta\nabla w^i_t`).

Sends: ``S`` up and ``S`` down per sync, all through the one server (its link carries ``n S``
per direction per round: the bottleneck). State: the model last pulled; the server keeps its
model and version. Staleness: the server's version at the push minus its version at this
worker's last pull (other workers' updates in between; about ``n - 1`` for equally fast
workers served round-robin).

Reduction: one worker, :math:`\tau = 1`, :math:`\alpha_s = 1` is sequential SGD.

Examples
--------
>>> from psgdlab.core.reference import run_reference, LeastSquaresProblem
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=4, batch=8, seed=0)
>>> result = run_reference(ASGD(n_workers=4, period=1), problem, steps=30, lr=0.05)
>>> int(result.staleness[-1].max())  # round-robin service: n - 1 foreign updates
3

References
----------
Dean et al., NeurIPS 2012; Li et al., arXiv 1703.05880 §2.2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from psgdlab.core import kernels
from psgdlab.core.algorithms.base import Algorithm, ServerState, WorkerState, check_period, is_sync_step
from psgdlab.core.errors import require
from psgdlab.core.exchange import Exchange, ServerExchange

__all__ = ["ASGD"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ASGD(Algorithm):
    """Parameter-server ASGD.

    The parameters common to every algorithm are those of :class:`Algorithm`.

    Parameters
    ----------
    period : int
        Local steps between push/pull (:math:`\\tau`), ``>= 1``; default 1 (classic ASGD).
    server_lr : float
        :math:`\\alpha_s > 0` applied to pushed deltas; default 1.
    """

    name: ClassVar[str] = "asgd"
    asynchronous: ClassVar[bool] = True

    period: int = 1
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        Algorithm.__post_init__(self)
        check_period(self.period)
        require(self.server_lr > 0.0, "server_lr", self.server_lr, "must be > 0")

    @property
    def has_server(self) -> bool:
        return True

    def init_state(self, x0: Any, rank: int) -> WorkerState:
        return WorkerState(params=kernels.clone(x0), extras={"pulled": kernels.clone(x0)})

    def exchanges(self, step: int, rank: int) -> tuple[Exchange, ...]:
        return self._server_exchange("delta") if is_sync_step(step, self.period) else ()

    @property
    def schedule_period(self) -> int:
        return self.period

    def server_message(self, state: WorkerState) -> Any:
        return state.params - state.extras["pulled"]

    def server_apply(self, server: ServerState, message: Any, rank: int) -> tuple[ServerState, Any, int]:
        params = kernels.server_apply_delta(server.params, message, self.server_lr)
        staleness = server.version - server.last_pull.get(rank, 0)
        version = server.version + 1
        last_pull = {**server.last_pull, rank: version}
        return ServerState(params=params, version=version, last_pull=last_pull), params, staleness

    def combine(self, state: WorkerState, exchange: Exchange, received: Any) -> WorkerState:
        if isinstance(exchange, ServerExchange):
            return state.replace(params=kernels.clone(received), extras={"pulled": kernels.clone(received)})
        return Algorithm.combine(self, state, exchange, received)
