r"""The one interface the step loop talks to for "exchange this with my peers".

The loop (:mod:`psgdlab.runtime.loop.driver`) decides *when*: it calls the handler of every
exchange record of a step (:data:`EXCHANGE_HANDLERS`, keyed by the record's class) in the phase
the record names, hands the ``"mix"`` exchanges to its communication thread, and asks the
protocol what differs between protocols (which exchanges a step has, whether a gradient
allreduce may overlap the backward pass, whether the ranks stop after a step). An
:class:`ExchangeProtocol` decides *how*: it owns the channels, the responder thread that answers
passive pairwise requests, and every payload's way to the wire
(:class:`~psgdlab.runtime.loop.exchange.transform.Wire`). Its two implementations:

- :class:`~psgdlab.runtime.loop.exchange.normal.NormalProtocol`: every rank to the end; a failure
  stops the run (``--on-failure stop`` and ``restart``);
- :class:`~psgdlab.runtime.loop.exchange.surviving.SurvivingProtocol`: ``--on-failure
  continue``, the survivors go on without the dead.

Exchanges neither protocol changes -- the model allreduce, the parameter-server exchange and the
barrier: algorithms that run them cannot go on without a dead rank -- are written once here.

The threads of a rank share its model through a :class:`Replica`: the training thread's step,
the communication thread's mixes and the responder's passive merges all go through its lock.
A :class:`Step` is what the phases of one step hand each other.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from psgdlab.core.algorithms.base import Algorithm, WorkerState
from psgdlab.core.errors import TestbedError, TransportError
from psgdlab.core.exchange import (
    EXCHANGE_KINDS,
    AllReduce,
    Barrier,
    Exchange,
    Gossip,
    PairwiseAverage,
    ServerExchange,
)
from psgdlab.core.records.trace import SERVER_PEER, TraceBuilder
from psgdlab.runtime.failures.flight import FlightRecorder
from psgdlab.runtime.loop.exchange.transform import Wire
from psgdlab.runtime.loop.server import server_exchange
from psgdlab.runtime.transports.transport import Transport

__all__ = [
    "ExchangeProtocol",
    "Replica",
    "Step",
    "Mixed",
    "Preempted",
    "EXCHANGE_HANDLERS",
    "PAIR",
    "GOSSIP",
    "ALLREDUCE",
    "SERVER",
    "BARRIER",
]

PAIR = EXCHANGE_KINDS[PairwiseAverage]
GOSSIP = EXCHANGE_KINDS[Gossip]
ALLREDUCE = EXCHANGE_KINDS[AllReduce]
SERVER = EXCHANGE_KINDS[ServerExchange]
BARRIER = EXCHANGE_KINDS[Barrier]

#: what a mix exchange on the communication thread returns: the delta to merge (None: a peer lost
#: in the exchange, its mix skipped) and the trace rows of the exchange (without rank and step)
Mixed = tuple[torch.Tensor | None, list[dict[str, Any]]]

#: the protocol's method for each exchange kind, keyed by the class of its record
#: (:mod:`psgdlab.core.exchange`); the loop calls it in the phase the record names (``ex.phase``)
EXCHANGE_HANDLERS: dict[type, str] = {
    PairwiseAverage: "pairwise",
    Gossip: "gossip",
    AllReduce: "allreduce",
    ServerExchange: "server",
    Barrier: "barrier",
}


class Preempted(TestbedError, RuntimeError):
    """A stop (SIGINT, SIGTERM) the ranks could not agree on: this rank left at its own step."""


@dataclass(slots=True)
class Step:
    """What the phases of one step hand each other (the exchange handlers read and update it)."""

    step: int
    snapshot: torch.Tensor  # the model the "mix" exchanges send (never modified in place)
    jobs: list[tuple[int, Future]] = field(default_factory=list)  # (trace kind, job) on the comm thread
    deltas: list[torch.Tensor] = field(default_factory=list)  # the mix exchanges' results, once collected
    grad: Any = None
    scale: float = 1.0  # the gradient to apply is scale * grad
    compute_end_s: float = 0.0
    staleness: int = 0
    #: under ``continue``, in a node of several members: this rank's slice deltas of the step (its
    #: active exchanges' and the passive ones since the last step), summed over the node with the
    #: gradient; after the sum, the node's
    shared: list[torch.Tensor] | None = None
    #: the exchanges this rank took part in that ``shared`` holds: its staleness counts its own
    #: exchanges, one a node's exchange on every member, as the simulator and ``stop`` count them
    merged: int = 0


class Replica:
    """The rank's model, shared by its training, communication and responder threads.

    The core kernels never modify an array in place (every update makes a new one), so a model
    read under the lock stays a snapshot. ``merges`` counts the foreign merges applied (the
    staleness of a step is how many arrived between its read and its update); ``held`` are the
    passive deltas a node holds until its members agree to apply them.
    """

    def __init__(self, state: WorkerState, merges: int) -> None:
        self.state = state
        self.merges = merges
        self.lock = threading.Lock()
        self.held: deque[torch.Tensor] = deque()

    def read(self) -> tuple[WorkerState, int]:
        """The state and the merges counted, read together."""
        with self.lock:
            return self.state, self.merges

    def merge_(self, delta: torch.Tensor) -> None:
        """``params <- params + delta``: one foreign merge."""
        with self.lock:
            self.state = self.state.replace(params=self.state.params + delta)
            self.merges += 1

    def hold(self, delta: torch.Tensor) -> None:
        with self.lock:
            self.held.append(delta)

    def held_count(self) -> int:
        with self.lock:
            return len(self.held)

    def take_held(self, k: int | None = None) -> list[torch.Tensor]:
        """The first ``k`` held deltas (all when None), no longer held."""
        with self.lock:
            n = len(self.held) if k is None else k
            return [self.held.popleft() for _ in range(n)]

    def combine_(self, update: Callable[[WorkerState], WorkerState]) -> None:
        with self.lock:
            self.state = update(self.state)

    def step_(
        self,
        deltas: Sequence[torch.Tensor],
        merged: int,
        update: Callable[[WorkerState], WorkerState],
        read_merges: int,
    ) -> int:
        """Merge a step's ``deltas`` (``merged`` foreign merges), then apply its local ``update``;
        returns the step's staleness (foreign merges since the gradient's read, ``read_merges``)."""
        with self.lock:
            for delta in deltas:
                self.state = self.state.replace(params=self.state.params + delta)
            self.merges += merged
            staleness = self.merges - read_merges
            self.state = update(self.state)
        return staleness


class ExchangeProtocol(ABC):
    """How one rank exchanges with its peers (module docstring).

    Parameters
    ----------
    algorithm : Algorithm
    rank : int
        This rank (a worker).
    replica : Replica
        The rank's model.
    channels : dict of str to Transport
        ``main`` (the training thread), ``comm`` (the communication thread), ``responder``.
    wire : Wire
        The run's message transform, which every payload goes through.
    flight : FlightRecorder
        Every blocking wait is recorded there.
    trace : TraceBuilder
        The rank's trace.
    origin : float
        The run's start (wall clock); trace times are seconds since it.
    start_step, steps : int
        The steps this rank runs: ``[start_step, steps)``.
    run_dir : Path, optional
        The run directory (checkpoints, and what a stop is agreed through).
    jitter_s : float
        Test hook: a random delay in ``[0, jitter_s)`` before every exchange (deadlock tests).
    seed : int
        Seeds the jitter.
    """

    #: whether the gradient allreduce may overlap the backward pass in buckets
    #: (:mod:`psgdlab.runtime.loop.overlap`): a group that must be formed again cannot
    can_overlap_gradient: bool = False

    def __init__(
        self,
        algorithm: Algorithm,
        *,
        rank: int,
        replica: Replica,
        channels: dict[str, Transport],
        wire: Wire,
        flight: FlightRecorder,
        trace: TraceBuilder,
        origin: float,
        start_step: int,
        steps: int,
        run_dir: Path | None = None,
        jitter_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.alg = algorithm
        self.replica = replica
        self.main = channels["main"]
        self.comm = channels["comm"]
        self.resp = channels["responder"]
        self.rank = rank
        self.device = self.main.device
        self.wire = wire
        self.flight = flight
        self.trace = trace
        self.origin = origin
        self.start_step = start_step
        self.steps = steps
        self.run_dir = run_dir
        params = replica.state.params
        self.n_params = int(params.numel())
        self.dtype = params.dtype
        #: the training thread's current step (passive merges are traced at it)
        self.step = start_step
        self.errors: queue.SimpleQueue[BaseException] = queue.SimpleQueue()
        self._responder: threading.Thread | None = None
        self._jitter_s = jitter_s
        self._jitter_rng = np.random.default_rng([seed, self.rank, 77])

    # --- what differs between the protocols: the loop asks ---
    @abstractmethod
    def exchanges(self, step: int) -> tuple[Exchange, ...]:
        """This rank's exchanges of ``step``, which it now begins."""

    @abstractmethod
    def agree_stop(self, step: int, requested: bool) -> bool:
        """Whether the ranks stop after ``step`` (just done): ``requested`` says this rank was
        asked to (SIGINT, SIGTERM). Called after every step; may block while the ranks agree."""

    @abstractmethod
    def finish(self, stopped_at: int | None) -> None:
        """The steps are over (``stopped_at``: the step count the ranks stopped at, None: all
        done): end this rank's part of the exchanges and wait for its responder."""

    def open(self) -> None:
        """Start what runs beside the loop (the responder, when this rank answers requests)."""
        if self._serves():
            self._responder = threading.Thread(target=self._respond, daemon=True, name=f"psgdlab-responder-{self.rank}")
            self._responder.start()

    def close(self) -> None:
        """Release what :meth:`open` started that is still running (after a failure); the
        responder is a daemon thread, left to end with the process."""
        return None

    def check(self) -> None:
        """Raise what the responder thread raised."""
        if not self.errors.empty():
            exc = self.errors.get()
            raise TransportError(f"rank {self.rank}: communication thread failed: {exc}") from exc

    def use_reducer(self, reducer: Any) -> None:
        """Sum the gradient over ``reducer.group`` with ``reducer`` (overlapped with the backward
        pass); only where :attr:`can_overlap_gradient`."""
        raise TransportError(f"rank {self.rank}: {type(self).__name__} cannot overlap the gradient allreduce")

    # --- the responder ---
    @abstractmethod
    def _serves(self) -> bool:
        """Whether this rank answers pairwise requests (runs a responder)."""

    @abstractmethod
    def _serve(self) -> None:
        """The responder's body: answer pairwise requests until no more come."""

    def _respond(self) -> None:
        try:
            self._serve()
        except BaseException as exc:
            self.errors.put(exc)

    def _wait_responder(self) -> None:
        responder = self._responder
        if responder is not None:
            while responder.is_alive():
                responder.join(timeout=0.5)
                self.check()
        self.check()

    # --- the exchanges (EXCHANGE_HANDLERS) ---
    @abstractmethod
    def pairwise(self, ex: PairwiseAverage, sent: torch.Tensor, step: int) -> Mixed:
        """The active side of a pairwise average of the model ``sent`` (on the communication thread)."""

    @abstractmethod
    def gossip(self, ex: Gossip, sent: torch.Tensor, step: int) -> Mixed:
        """A gossip of the model ``sent`` with the peers (on the communication thread)."""

    @abstractmethod
    def gradient_allreduce(self, ex: AllReduce, st: Step) -> None:
        """The gradient's sum over the group into ``st.grad``, its ``1/n`` into ``st.scale``."""

    def share(self, st: Step) -> None:
        """Before the ``"grad"`` phase: hand ``st.deltas`` to the gradient's sum where the
        protocol sums them with it (a node of several members under ``continue``); by default
        they are merged after it (:meth:`merges`)."""
        return None

    def merges(self, st: Step) -> tuple[list[torch.Tensor], int]:
        """After the ``"grad"`` phase: the deltas to merge into the model, in order, and the
        foreign merges they count (the step's own mixes, and pending passive ones)."""
        return st.deltas, len(st.deltas)

    def allreduce(self, ex: AllReduce, st: Step) -> None:
        """Grad: sum the gradient over the group; post: average the model and ``combine`` it."""
        if ex.payload == "grad":
            self.gradient_allreduce(ex, st)
        else:
            self.model_allreduce(ex, st)

    def model_allreduce(self, ex: AllReduce, st: Step) -> None:
        t0 = self.now()
        self._sleep_jitter()
        with self.replica.lock:
            mean = self.replica.state.params.clone()
        nbytes = self.nbytes(ex)
        with self.flight.wait("allreduce", what="model", step=st.step, peers=ex.group, nbytes=nbytes):
            mean = self.wire.allreduce_mean(self.main, mean, ex.group)
        self.replica.combine_(lambda state: self.alg.combine(state, ex, mean))
        self.trace.add(
            rank=self.rank, step=st.step, phase="comm", start_s=t0, end_s=self.now(), kind=ALLREDUCE, nbytes=nbytes
        )

    def server(self, ex: ServerExchange, st: Step) -> None:
        """Post: push to the parameter server and ``combine`` its reply; the step's staleness is
        then the server's."""
        t0 = self.now()
        self._sleep_jitter()
        with self.replica.lock:
            message = self.alg.server_message(self.replica.state).contiguous()
        nbytes = self.nbytes(ex)
        server = self.alg.n_workers
        with self.flight.wait("server", what="push and pull", step=st.step, peers=[server], nbytes=nbytes):
            reply, st.staleness = server_exchange(
                self.main, server, step=st.step, rank=self.rank, message=message, wire=self.wire
            )
        self.replica.combine_(lambda state: self.alg.combine(state, ex, reply))
        self.trace.add(
            rank=self.rank,
            step=st.step,
            phase="comm",
            start_s=t0,
            end_s=self.now(),
            kind=SERVER,
            peer=SERVER_PEER,
            nbytes=nbytes,
        )

    def barrier(self, ex: Barrier, st: Step) -> None:
        t0 = self.now()
        with self.flight.wait("barrier", step=st.step, peers=ex.group):
            self.main.barrier(ex.group)
        self.trace.add(rank=self.rank, step=st.step, phase="comm", start_s=t0, end_s=self.now(), kind=BARRIER)

    # --- helpers of both protocols ---
    def now(self) -> float:
        return time.time() - self.origin

    def nbytes(self, ex: Exchange, n_elements: int | None = None) -> int:
        """The bytes this rank sends in ``ex`` (of ``n_elements`` payload elements; default the model's)."""
        return self.wire.nbytes(ex, self.n_params if n_elements is None else n_elements, self.dtype)

    def _sleep_jitter(self) -> None:
        if self._jitter_s > 0:
            time.sleep(float(self._jitter_rng.uniform(0, self._jitter_s)))

    def _merge_passive(self, delta: torch.Tensor, *, src: int, t0: float, nbytes: int, hold: bool) -> None:
        """Merge the result of an answered pairwise request -- or, where the node agrees first
        (``hold``), hold it -- and trace the exchange."""
        if hold:
            self.replica.hold(delta)
        else:
            self.replica.merge_(delta)
        self.trace.add(
            rank=self.rank,
            step=self.step,
            phase="overlap",
            start_s=t0,
            end_s=self.now(),
            kind=PAIR,
            peer=src,
            nbytes=nbytes,
        )


def in_full(delta: torch.Tensor, lo: int, hi: int, like: torch.Tensor) -> torch.Tensor:
    """``delta`` of the slice ``[lo, hi)`` as a delta of the whole model ``like`` (zero elsewhere)."""
    if lo == 0 and hi == like.numel():
        return delta
    full = torch.zeros_like(like)
    full[lo:hi] = delta
    return full
