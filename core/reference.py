r"""The reference executor: every worker in one process, on numpy, in lock-step rounds.

It is the oracle the simulator, the emulator and the runtime are tested against. It has no clock:
step ``s`` of every worker happens in round ``s`` and follows the step semantics of
:mod:`psgdlab.core.exchange` in a fixed order:

1. every worker reads its weights (``gradient_delay`` rounds old for delayed variants) and
   computes its minibatch gradient;
2. ``"mix"`` exchanges: each pairwise average / gossip is computed from the models at the start
   of the round (sharded exchanges average one slice and the node allgathers the slices);
3. ``"grad"`` allreduces average the gradients of each group;
4. each worker applies its gradient to its mixed model;
5. ``"post"`` exchanges: model allreduces (mean over the group, then the algorithm's
   ``combine``) and server exchanges, served one at a time in an explicit order
   (``server_order``: rank order by default, or any permutation per round), which is where the
   staleness of parameter-server algorithms comes from.

The problem is a small least-squares regression with per-worker data shards
(:class:`LeastSquaresProblem`); minibatches are drawn from ``(seed, rank, step)`` so two runs
that should agree draw the same samples.

Examples
--------
>>> from psgdlab.core.algorithms import make_algorithm
>>> problem = LeastSquaresProblem(n_samples=512, dim=8, n_shards=4, batch=16, seed=1)
>>> result = run_reference(make_algorithm("adpsgd", n_workers=4), problem, steps=60, lr=0.05)
>>> bool(result.losses[-1] < 0.5 * result.losses[0]), int(result.staleness.max())
(True, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from psgdlab.core.algorithms.base import Algorithm, ServerState, WorkerState
from psgdlab.core.errors import ConfigError, SimulationError, require
from psgdlab.core.exchange import (
    EXCHANGE_KINDS,
    AllReduce,
    Barrier,
    Exchange,
    Gossip,
    PairwiseAverage,
    ServerExchange,
    wire_bytes,
)
from psgdlab.core.records.trace import SERVER_PEER, TraceBuilder
from psgdlab.core.replicas import NumpyArrays, consensus_distance

__all__ = [
    "LeastSquaresProblem",
    "require_lsq_shape",
    "LeastSquaresReplicas",
    "ReferenceResult",
    "run_reference",
    "consensus_distance",
]


def require_lsq_shape(dim: object, samples_per_worker: object) -> None:
    """The least-squares model's columns (``--lsq-dim``) and rows per worker (``--lsq-samples``)
    as a run configures them: integers >= 1, or :class:`~psgdlab.core.errors.ConfigError` naming
    the flag."""
    for flag, value in (("lsq-dim", dim), ("lsq-samples", samples_per_worker)):
        require(isinstance(value, int) and value >= 1, flag, value, "must be an integer >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class LeastSquaresProblem:
    r"""Least squares :math:`f(x) = \frac{1}{2N}\|Ax - b\|^2` split into ``n_shards`` equal shards.

    Parameters
    ----------
    n_samples, dim : int
        Rows and columns of ``A``.
    n_shards : int
        Number of disjoint shards (one per worker); ``n_samples`` must be divisible by it.
    batch : int
        Samples per minibatch per worker.
    seed : int
        Seeds the data and every minibatch draw.
    noise : float
        Standard deviation of the label noise.
    merge_shards : int
        If > 1, worker 0's minibatch at step ``s`` is the concatenation of the minibatches
        ranks ``0 .. merge_shards-1`` would draw at ``s`` (single-learner SGD with batch ``n m``
        on the same samples as SSGD with ``n`` workers of batch ``m``).
    """

    n_samples: int = 1024
    dim: int = 16
    n_shards: int = 1
    batch: int = 16
    seed: int = 0
    noise: float = 0.1
    merge_shards: int = 1

    def __post_init__(self) -> None:
        require(
            self.n_samples % self.n_shards == 0,
            "n_samples",
            self.n_samples,
            f"must be divisible by n_shards ({self.n_shards})",
        )
        require(self.batch >= 1, "batch", self.batch, "must be >= 1")

    @property
    def data_bytes(self) -> int:
        """Bytes :meth:`data` builds: ``A`` and ``b``, float64.

        >>> LeastSquaresProblem(n_samples=4, dim=3, n_shards=2, batch=1).data_bytes
        128
        """
        return self.n_samples * (self.dim + 1) * 8

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        A, b, _ = self.data_and_truth()
        return A, b

    def data_and_truth(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r"""``(A, b, x_true)``: the rows (standard normal), the labels ``A x_true + noise`` and the
        point they were made from, whose loss on a fresh row is the noise's, :math:`\sigma^2/2`."""
        rng = np.random.default_rng([self.seed, 0xDA7A])
        A = rng.standard_normal((self.n_samples, self.dim))
        x_true = rng.standard_normal(self.dim)
        b = A @ x_true + self.noise * rng.standard_normal(self.n_samples)
        return A, b, x_true

    def initial_point(self) -> np.ndarray:
        return np.zeros(self.dim)

    def batch_indices(self, rank: int, step: int) -> np.ndarray:
        if self.merge_shards > 1:
            return np.concatenate([self._draw(r, step) for r in range(self.merge_shards)])
        return self._draw(rank, step)

    def _draw(self, rank: int, step: int) -> np.ndarray:
        shard = self.n_samples // self.n_shards
        rng = np.random.default_rng([self.seed, rank, step])
        return rank * shard + rng.integers(0, shard, size=self.batch)


class _Bound:
    """A problem with its data materialised once."""

    def __init__(self, problem: LeastSquaresProblem) -> None:
        self.problem = problem
        self.A, self.b = problem.data()

    def gradient(self, x: np.ndarray, rank: int, step: int) -> tuple[np.ndarray, float]:
        idx = self.problem.batch_indices(rank, step)
        A, b = self.A[idx], self.b[idx]
        r = A @ x - b
        return A.T @ r / len(idx), float(0.5 * r @ r / len(idx))

    def loss(self, x: np.ndarray) -> float:
        r = self.A @ x - self.b
        return float(0.5 * r @ r / len(r))


class LeastSquaresReplicas(NumpyArrays):
    """The problem's replicas for the emulator (:class:`psgdlab.core.replicas.Replicas`): numpy
    float64, the reference executor's own gradient and reduction arithmetic, so a replay of
    :func:`run_reference`'s trace equals it bit for bit.

    Examples
    --------
    >>> reps = LeastSquaresReplicas(LeastSquaresProblem(n_samples=64, dim=3, n_shards=2, batch=4))
    >>> [g.shape for g, _ in reps.gradients([(0, 0, reps.initial_point()), (1, 0, reps.initial_point())])]
    [(3,), (3,)]
    """

    def __init__(self, problem: LeastSquaresProblem) -> None:
        self.problem = problem
        self._bound = _Bound(problem)
        self.n_params = int(problem.dim)

    def initial_point(self) -> np.ndarray:
        return self.problem.initial_point()

    def gradients(self, entries: Sequence[tuple[int, int, np.ndarray]]) -> list[tuple[np.ndarray, float]]:
        """``(gradient, minibatch loss)`` of each ``(rank, step, params)`` entry."""
        return [self._bound.gradient(x, r, s) for r, s, x in entries]

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """Full-data loss of ``params`` (the reference's ``losses`` column)."""
        return {"loss": self._bound.loss(params)}

    def steps_per_epoch(self) -> int:
        """Local steps in which a worker draws as many samples as its shard holds."""
        return max(1, self.problem.n_samples // self.problem.n_shards // self.problem.batch)


@dataclass(slots=True)
class ReferenceResult:
    """What :func:`run_reference` returns.

    ``params[s]`` holds the (n_workers, dim) models after round ``s``; ``losses`` the full-data
    loss of the workers' mean model after each round; ``staleness[s, r]`` the staleness of the
    gradient rank ``r`` applied in round ``s``; ``server`` the final server state (or None);
    ``trace`` the records in the shared schema (clock = round index).
    """

    params: np.ndarray
    losses: np.ndarray
    consensus_distance: np.ndarray
    staleness: np.ndarray
    server: ServerState | None
    trace: np.ndarray
    states: list[WorkerState]


def run_reference(
    algorithm: Algorithm,
    problem: LeastSquaresProblem,
    *,
    steps: int,
    lr: float | Callable[[int], float] = 0.05,
    x0: np.ndarray | None = None,
    server_order: Callable[[int], Sequence[int]] | None = None,
) -> ReferenceResult:
    """Run ``algorithm`` for ``steps`` rounds on ``problem`` (see the module docstring)."""
    n = algorithm.n_workers
    require(steps >= 1, "steps", steps, "must be >= 1")
    require(
        problem.n_shards in (1, n) or problem.merge_shards > 1,
        "n_shards",
        problem.n_shards,
        f"must be 1 or the number of workers ({n})",
    )
    bound = _Bound(problem)
    x0 = problem.initial_point() if x0 is None else np.asarray(x0, dtype=np.float64)
    states = [algorithm.init_state(x0, r) for r in range(n)]
    server = algorithm.server_init(x0) if algorithm.has_server else None
    lr_of = lr if callable(lr) else (lambda _s, _v=float(lr): _v)
    delay = algorithm.gradient_delay
    history: list[list[np.ndarray]] = []  # models at the start of recent rounds
    merges = np.zeros(n, dtype=np.int64)  # cumulative foreign merges per worker
    merges_at_round_start: list[np.ndarray] = []
    trace = TraceBuilder()
    itemsize = 8
    out_params, out_losses, out_cd, out_st = [], [], [], []

    for s in range(steps):
        schedule = [algorithm.exchanges(s, r) for r in range(n)]
        history.append([st.params for st in states])
        merges_at_round_start.append(merges.copy())
        if len(history) > delay + 1:
            history.pop(0)
            merges_at_round_start.pop(0)
        read = history[0]  # the oldest kept round: `delay` rounds back once history is full
        read_merges = merges_at_round_start[0]
        grads, batch_losses = zip(*(bound.gradient(read[r], r, s) for r in range(n)))
        grads = list(grads)

        mixed = _mix_phase(algorithm, schedule, [st.params for st in states], merges)
        _grad_phase(schedule, grads)
        staleness = merges - read_merges
        for r in range(n):
            states[r] = algorithm.local_update(states[r].replace(params=mixed[r]), grads[r], lr_of(s))
            trace.add(
                rank=r,
                step=s,
                phase="compute",
                start_s=s,
                end_s=s + 1,
                staleness=int(staleness[r]),
                loss=batch_losses[r],
            )
            for ex in schedule[r]:
                sent, _ = wire_bytes(ex, x0.size, itemsize)
                peer = getattr(ex, "peer", SERVER_PEER if isinstance(ex, ServerExchange) else -1)
                trace.add(
                    rank=r,
                    step=s,
                    phase="comm",
                    start_s=s + 1,
                    end_s=s + 1,
                    kind=EXCHANGE_KINDS[type(ex)],
                    peer=peer,
                    nbytes=sent,
                )
        server, server_staleness = _post_phase(algorithm, schedule, states, server, s, server_order)
        for r, st_r in server_staleness.items():
            staleness[r] = st_r
        models = [st.params for st in states]
        out_params.append(np.stack(models))
        out_losses.append(bound.loss(np.mean(models, axis=0)))
        out_cd.append(consensus_distance(models))
        out_st.append(staleness.copy())
    return ReferenceResult(
        params=np.stack(out_params),
        losses=np.array(out_losses),
        consensus_distance=np.array(out_cd),
        staleness=np.stack(out_st),
        server=server,
        trace=trace.array(),
        states=states,
    )


def _mix_phase(
    algorithm: Algorithm, schedule: list[tuple[Exchange, ...]], models: list[np.ndarray], merges: np.ndarray
) -> list[np.ndarray]:
    n = len(models)
    mixed = list(models)
    shard_results: dict[int, np.ndarray] = {}
    for r in range(n):
        for ex in schedule[r]:
            if isinstance(ex, PairwiseAverage):
                back = [e for e in schedule[ex.peer] if isinstance(e, PairwiseAverage)]
                if not back or back[0].peer != r or back[0].active == ex.active:
                    raise SimulationError(
                        f"schedule is inconsistent at rank {r}: its pairwise peer "
                        f"{ex.peer} does not name it back as the opposite side"
                    )
                if ex.n_shards == 1:
                    mixed[r] = algorithm.mix(ex, models[r], models[ex.peer])
                else:
                    own = np.array_split(models[r], ex.n_shards)[ex.shard]
                    other = np.array_split(models[ex.peer], ex.n_shards)[ex.shard]
                    shard_results[r] = algorithm.mix(ex, own, other)
                merges[r] += 1
            elif isinstance(ex, Gossip):
                mixed[r] = algorithm.mix(ex, models[r], [models[j] for j in ex.peers])
                merges[r] += 1
    for r in range(n):  # sharded exchanges: allgather the averaged slices inside the node
        sharded = next((e for e in schedule[r] if isinstance(e, PairwiseAverage) and e.n_shards > 1), None)
        if sharded is not None:
            mixed[r] = np.concatenate([shard_results[g] for g in sharded.gather_group])
    return mixed


def _grad_phase(schedule: list[tuple[Exchange, ...]], grads: list[np.ndarray]) -> None:
    done: set[tuple[int, ...]] = set()
    for exs in schedule:
        for ex in exs:
            if isinstance(ex, AllReduce) and ex.payload == "grad" and ex.group not in done:
                _check_group(schedule, ex, "grad")
                mean = np.mean([grads[g] for g in ex.group], axis=0)
                for g in ex.group:
                    grads[g] = mean
                done.add(ex.group)


def _post_phase(
    algorithm: Algorithm,
    schedule: list[tuple[Exchange, ...]],
    states: list[WorkerState],
    server: ServerState | None,
    step: int,
    server_order: Callable[[int], Sequence[int]] | None,
) -> tuple[ServerState | None, dict[int, int]]:
    n = len(states)
    done: set[tuple[int, ...]] = set()
    for r in range(n):
        for ex in schedule[r]:
            if isinstance(ex, AllReduce) and ex.payload == "model" and ex.group not in done:
                _check_group(schedule, ex, "model")
                mean = np.mean([states[g].params for g in ex.group], axis=0)
                for g in ex.group:
                    states[g] = algorithm.combine(states[g], ex, mean)
                done.add(ex.group)
            elif isinstance(ex, Barrier):
                pass  # lock-step rounds: every barrier is already met
    staleness: dict[int, int] = {}
    order = list(server_order(step)) if server_order is not None else list(range(n))
    if sorted(order) != list(range(n)):
        raise ConfigError(f"server_order({step}) ({order}) must be a permutation of the ranks")
    for r in order:
        for ex in schedule[r]:
            if isinstance(ex, ServerExchange):
                if server is None:
                    raise SimulationError(f"{algorithm.name} scheduled a server exchange without a server role")
                message = algorithm.server_message(states[r])
                server, reply, staleness[r] = algorithm.server_apply(server, message, r)
                states[r] = algorithm.combine(states[r], ex, reply)
    return server, staleness


def _check_group(schedule: list[tuple[Exchange, ...]], ex: AllReduce, payload: str) -> None:
    for g in ex.group:
        if not any(isinstance(e, AllReduce) and e.payload == payload and e.group == ex.group for e in schedule[g]):
            raise SimulationError(
                f"schedule is inconsistent: rank {g} is in allreduce group {ex.group} but does not take part in it"
            )
