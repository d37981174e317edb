r"""EASGD: elastic averaging SGD, asynchronous (a centre held by a server) or synchronous (§A.6).

Objective: :math:`\min \sum_i f(w^i) + \frac{\lambda}{2}\|w^i - \tilde w\|^2`; with
:math:`\alpha = \eta\lambda` (``alpha``):

- **async** (Li et al. Eq. 9, what they ran): every :math:`\tau` local steps worker ``i`` swaps
  models with the centre and both apply, from pre-exchange values,
  :math:`w^i \leftarrow w^i - \alpha(w^i - \tilde w)`,
  :math:`\tilde w \leftarrow \tilde w + \alpha(w^i - \tilde w)`. Sends ``S`` up and ``S`` down
  through the server, which serves one worker at a time. Staleness: the number of other
  workers' exchanges the centre absorbed since this worker's previous exchange.
- **sync** (Eq. 8): every :math:`\tau` steps an allreduce of the models gives
  :math:`\bar w`; every worker holds a replica of the centre and applies
  :math:`w^i \leftarrow w^i - \alpha(w^i - \tilde w)`,
  :math:`\tilde w \leftarrow \tilde w + \alpha n(\bar w - \tilde w)`. Requires
  :math:`n\alpha \le 1` (the step's matrix is doubly stochastic exactly then). The elastic step
  follows the local update of a sync step.

State: the centre (server model, or a replica per worker for sync). Invariants: an async exchange
preserves :math:`w^i + \tilde w`; a sync step preserves :math:`\sum_i w^i + \tilde w`.
``alpha=0`` makes the workers independent SGD learners. Default :math:`\alpha = 0.9/n`
(EASGD's :math:`\beta = n\alpha \approx 0.9`, ALGORITHMS.md F.13).

Examples
--------
>>> round(EASGD(n_workers=4, period=4).alpha, 3)
0.225
>>> from psgdlab.core.reference import run_reference, LeastSquaresProblem
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=4, batch=8, seed=0)
>>> result = run_reference(EASGD(n_workers=4, period=2), problem, steps=40, lr=0.05)
>>> bool(result.losses[-1] < result.losses[0])
True

References
----------
Zhang, Choromanska & LeCun, NeurIPS 2015; Li et al., arXiv 1703.05880 §2.4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from psgdlab.core import kernels
from psgdlab.core.algorithms.base import Algorithm, ServerState, WorkerState, check_period, is_sync_step
from psgdlab.core.errors import require
from psgdlab.core.exchange import AllReduce, Exchange, ServerExchange

__all__ = ["EASGD"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EASGD(Algorithm):
    """Elastic averaging SGD.

    The parameters common to every algorithm are those of :class:`Algorithm`.

    Parameters
    ----------
    period : int
        Local steps between elastic exchanges (:math:`\\tau`), ``>= 1``; default 4.
    alpha : float or None
        Elastic coefficient :math:`\\alpha = \\eta\\lambda \\in [0, 1)`; ``None`` gives ``0.9/n``.
    variant : {"async", "sync"}
        Server-based asynchronous exchanges (default) or the synchronous allreduce form.
    """

    name: ClassVar[str] = "easgd"
    variants: ClassVar[tuple[str, ...]] = ("async", "sync")

    period: int = 4
    alpha: float | None = None
    variant: str = "async"

    def __post_init__(self) -> None:
        Algorithm.__post_init__(self)
        check_period(self.period)
        alpha = 0.9 / self.n_workers if self.alpha is None else self.alpha
        object.__setattr__(self, "alpha", alpha)
        require(0.0 <= alpha < 1.0, "alpha", alpha, "must be in [0, 1)")
        if self.variant == "sync":
            require(
                self.n_workers * alpha <= 1.0 + 1e-12,
                "alpha",
                alpha,
                f"must satisfy workers * alpha <= 1 for sync easgd (workers={self.n_workers})",
                hint="otherwise the elastic step is not doubly stochastic and the centre overshoots",
            )

    @property
    def asynchronous(self) -> bool:  # type: ignore[override]
        return self.variant == "async"

    @property
    def has_server(self) -> bool:
        return self.variant == "async"

    def init_state(self, x0: Any, rank: int) -> WorkerState:
        extras = {"centre": kernels.clone(x0)} if self.variant == "sync" else {}
        return WorkerState(params=kernels.clone(x0), extras=extras)

    def exchanges(self, step: int, rank: int) -> tuple[Exchange, ...]:
        if not is_sync_step(step, self.period):
            return ()
        if self.variant == "async":
            return self._server_exchange("elastic")
        return (AllReduce(group=self.all_ranks, payload="model"),)

    @property
    def schedule_period(self) -> int:
        return self.period

    def combine(self, state: WorkerState, exchange: Exchange, received: Any) -> WorkerState:
        a = float(self.alpha or 0.0)
        if isinstance(exchange, AllReduce):
            worker, centre = kernels.elastic_sync(state.params, state.extras["centre"], received, a, self.n_workers)
            return state.replace(params=worker, extras={"centre": centre})
        if isinstance(exchange, ServerExchange):
            # ``received`` is the centre as it was before this exchange (pre-exchange values)
            worker, _ = kernels.elastic_pair(state.params, received, a)
            return state.replace(params=worker)
        return Algorithm.combine(self, state, exchange, received)

    def server_message(self, state: WorkerState) -> Any:
        return state.params

    def server_apply(self, server: ServerState, message: Any, rank: int) -> tuple[ServerState, Any, int]:
        _, centre = kernels.elastic_pair(message, server.params, float(self.alpha or 0.0))
        staleness = server.version - server.last_pull.get(rank, 0)
        version = server.version + 1
        last_pull = {**server.last_pull, rank: version}
        return ServerState(params=centre, version=version, last_pull=last_pull), server.params, staleness
