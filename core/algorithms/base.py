r"""The contract every algorithm implements, and the state objects executors carry.

An algorithm is a frozen, validated dataclass of its hyperparameters bound to a number of
workers. It provides

- its **schedule** -- :meth:`Algorithm.exchanges`, a pure function of ``(step, rank)`` (and the
  algorithm's ``seed``) returning the exchanges of that step from the closed set in
  :mod:`psgdlab.core.exchange`;
- its **kernels** -- :meth:`Algorithm.local_update`, :meth:`Algorithm.mix`,
  :meth:`Algorithm.combine` and the server role (:meth:`Algorithm.server_init`,
  :meth:`Algorithm.server_message`, :meth:`Algorithm.server_apply`), pure functions on flat
  parameter arrays built from :mod:`psgdlab.core.kernels`.

Executors follow the step semantics documented in :mod:`psgdlab.core.exchange` and dispatch on
the exchange type; none of them tests the algorithm's name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

from psgdlab.core import kernels
from psgdlab.core.errors import SimulationError, require
from psgdlab.core.exchange import AllReduce, Exchange, Gossip, PairwiseAverage, ServerExchange

if TYPE_CHECKING:
    from psgdlab.core.graphs.topology import Topology

__all__ = ["Algorithm", "WorkerState", "ServerState", "is_sync_step", "check_period"]

Array = Any


@dataclass(frozen=True, slots=True)
class WorkerState:
    """What one worker carries between steps: its flat model, its local momentum buffer (never
    averaged) and algorithm extras (the BMUF global model and block momentum, the EASGD centre
    replica, the model last pulled from a server)."""

    params: Array
    momentum: Array | None = None
    extras: Mapping[str, Array] = field(default_factory=dict)

    def replace(self, **changes: Any) -> WorkerState:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class ServerState:
    """The parameter-server role: its model, its version (number of updates applied) and the
    version each rank last pulled (for staleness)."""

    params: Array
    version: int = 0
    last_pull: Mapping[int, int] = field(default_factory=dict)


@lru_cache(maxsize=64)
def _ranks(n: int) -> tuple[int, ...]:
    """``tuple(range(n))``, shared: schedules are called once per (step, rank) by executors, and a
    fresh n-tuple per call made a simulated SSGD iteration cost O(n^2)."""
    return tuple(range(n))


def check_period(period: int) -> None:
    """Validate a synchronisation period (shared by every periodic algorithm)."""
    require(
        isinstance(period, int) and not isinstance(period, bool) and period >= 1,
        "period",
        period,
        "must be an integer >= 1",
    )


def is_sync_step(step: int, period: int) -> bool:
    """True when local step ``step`` (0-based) ends a block of ``period`` steps."""
    return (step + 1) % period == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Algorithm:
    """Base class: hyperparameters common to every algorithm and the default kernels.

    Parameters
    ----------
    n_workers : int
        Number of workers (learners), ``>= 1``.
    momentum : float
        Local heavy-ball momentum in ``[0, 1)``; buffers stay local (never averaged). Default 0
        (plain SGD, as in the papers' update rules).
    seed : int
        Seed of randomised schedules (random matchings); every rank derives the same schedule
        from ``(seed, step)`` without communicating.
    """

    name: ClassVar[str] = "base"
    #: True when workers run without a global barrier (gossip, parameter server)
    asynchronous: ClassVar[bool] = False
    #: True when the schedule is gossip over a topology that :func:`psgdlab.core.graphs.membership.rebuild`
    #: can re-form without some workers, so survivors may go on after a worker dies
    gossip: ClassVar[bool] = False
    #: the values of the ``variant`` parameter, for algorithms that have one (checked here, in
    #: :meth:`__post_init__`; the flags' help and errors read it)
    variants: ClassVar[tuple[str, ...]] = ()

    n_workers: int = 1
    momentum: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        require(
            isinstance(self.n_workers, int) and self.n_workers >= 1,
            "workers",
            self.n_workers,
            "must be an integer >= 1",
        )
        require(0.0 <= self.momentum < 1.0, "momentum", self.momentum, "must be in [0, 1)")
        require(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "must be an integer >= 0")
        if self.variants:  # the one check of a variant: against the class's own list
            variant = getattr(self, "variant", None)
            require(variant in self.variants, "variant", variant, f"must be one of {', '.join(self.variants)}")

    # ----- schedule ---------------------------------------------------------------------------
    def exchanges(self, step: int, rank: int) -> tuple[Exchange, ...]:
        """The exchanges of local step ``step`` of ``rank`` (pure; default: none)."""
        return ()

    @property
    def schedule_period(self) -> int | None:
        """Steps after which :meth:`exchanges` repeats: ``exchanges(step + P, rank) ==
        exchanges(step, rank)`` for every step and rank, so an executor may keep the first ``P``
        steps' exchanges instead of asking again; ``None``: it does not repeat (random
        matchings) or is not known to (the default)."""
        return None

    @property
    def gradient_delay(self) -> int:
        """Steps between reading the weights and applying their gradient beyond the overlap of
        one step (``D`` of the delay-by-one variant; 0 for every other algorithm)."""
        return 0

    def membership_topology(self) -> Topology | None:
        """The topology this schedule follows, which :func:`psgdlab.core.graphs.membership.rebuild`
        rebuilds over the survivors when workers die; ``None`` (default): the schedule needs
        every worker (an allreduce, a block sync, a server), so a failure stops or restarts the
        run (:mod:`psgdlab.core.platform.failure`)."""
        return None

    @property
    def has_server(self) -> bool:
        """True when the schedule contains :class:`ServerExchange` (a server role is needed)."""
        return False

    @property
    def all_ranks(self) -> tuple[int, ...]:
        return _ranks(self.n_workers)

    def params(self) -> dict[str, Any]:
        """Hyperparameters as a plain dict (for resolved configs and traces)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"algorithm": self.name, **out}

    # ----- worker kernels ---------------------------------------------------------------------
    def init_state(self, x0: Array, rank: int) -> WorkerState:
        """Every worker starts from a copy of the same model ``x0``."""
        return WorkerState(params=kernels.clone(x0))

    def local_update(self, state: WorkerState, grad: Array, lr: float, grad_scale: float = 1.0) -> WorkerState:
        """SGD step with the local momentum buffer on the gradient ``grad_scale * grad`` (an
        executor holding the allreduced *sum* of ``n`` gradients passes ``1/n``)."""
        params, buf = kernels.sgd_step(state.params, grad, lr, state.momentum, self.momentum, grad_scale)
        return state.replace(params=params, momentum=buf)

    def mix(self, exchange: Exchange, own: Array, received: Array | Sequence[Array]) -> Array:
        """The mixed model (or shard) of a ``"mix"`` exchange, from what was sent and received."""
        if isinstance(exchange, PairwiseAverage):
            if exchange.weight == 0.5:
                return kernels.average(own, received)
            return kernels.weighted_sum(1.0 - exchange.weight, own, (exchange.weight,), (received,))
        if isinstance(exchange, Gossip):
            return kernels.weighted_sum(exchange.self_weight, own, exchange.weights, received)
        raise SimulationError(f"{self.name}: exchange {type(exchange).__name__} has no mix kernel")

    def combine(self, state: WorkerState, exchange: Exchange, received: Array) -> WorkerState:
        """Merge the result of a ``"post"`` exchange (a mean model or a server reply)."""
        raise SimulationError(f"{self.name}: exchange {type(exchange).__name__} has no combine kernel")

    # ----- server role ------------------------------------------------------------------------
    def server_init(self, x0: Array) -> ServerState:
        return ServerState(params=kernels.clone(x0), version=0, last_pull=dict.fromkeys(range(self.n_workers), 0))

    def server_message(self, state: WorkerState) -> Array:
        raise SimulationError(f"{self.name} has no server role")

    def server_apply(self, server: ServerState, message: Array, rank: int) -> tuple[ServerState, Array, int]:
        """Apply one worker's message; returns ``(new_server, reply, staleness)``."""
        raise SimulationError(f"{self.name} has no server role")

    # ----- helpers for subclasses -------------------------------------------------------------
    def _allreduce_all(self, payload: str) -> tuple[Exchange, ...]:
        if self.n_workers == 1:
            return ()
        return (AllReduce(group=self.all_ranks, payload=payload),)  # type: ignore[arg-type]

    @staticmethod
    def _server_exchange(op: str) -> tuple[Exchange, ...]:
        return (ServerExchange(op=op),)  # type: ignore[arg-type]
