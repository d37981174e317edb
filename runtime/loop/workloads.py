r"""What a worker trains: a flat parameter vector and a minibatch gradient on it.

The driver only needs a :class:`Workload`: the initial flat parameters, and the minibatch
gradient and loss at given weights for ``(rank, step)``. Two implementations:

- :class:`LeastSquaresWorkload` -- :class:`psgdlab.core.reference.LeastSquaresProblem` computed
  in torch (float64 by default) from the *same* ``batch_indices(rank, step)`` as the reference
  executor, so runtime trajectories can be compared with the oracle's;
- :class:`ModuleWorkload` -- any ``torch.nn.Module`` (built by a factory) with a sampler whose
  ``sample(step) -> (x, y)`` gives the rank's minibatch and a loss function (cross-entropy by
  default). Its parameters live in one contiguous buffer; the driver copies the weights it
  computes on into that buffer, so the training thread never reads a model that a
  communication thread is changing. :meth:`ModuleWorkload.overlap_allreduce` makes its
  backward passes allreduce the gradient in buckets as they go (:mod:`psgdlab.runtime.loop.overlap`).

Both offer ``gradient_pair``: the minibatch's gradient computed over its two halves, with the
squared norms that the gradient noise scale is estimated from (:mod:`psgdlab.runtime.loop.noise`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from psgdlab.core.errors import TransportError
from psgdlab.core.reference import LeastSquaresProblem
from psgdlab.runtime.loop.exchange.transform import MessageTransform
from psgdlab.runtime.loop.overlap import OverlappedAllreduce
from psgdlab.runtime.transports.transport import Transport

__all__ = ["Workload", "LeastSquaresWorkload", "ModuleWorkload", "NormPairTensors", "require_finite_loss"]

#: ``(sq_small, batch_small, sq_big, batch_big)``: the mean squared norm of the two halves'
#: gradients and their effective batch :math:`2 n_a n_b / (n_a + n_b)` (the batch whose
#: :math:`\mathbb{E}|G_B|^2` their mean has), and the whole minibatch's squared norm and batch
NormPairTensors = tuple[torch.Tensor, float, torch.Tensor, float]


def _halves(n: int) -> tuple[int, int]:
    """The sizes of a minibatch's two halves (the first the smaller by one when ``n`` is odd)."""
    if n < 2:
        raise ValueError(f"a minibatch of {n} sample cannot be split into two halves (batch must be >= 2)")
    return n // 2, n - n // 2


def _pair(ga: torch.Tensor, gb: torch.Tensor, na: int, nb: int) -> tuple[torch.Tensor, NormPairTensors]:
    """The whole minibatch's gradient from its halves' (means over ``na`` and ``nb`` samples) and
    the :data:`NormPairTensors` of the three."""
    n = na + nb
    g = ga * (na / n) + gb * (nb / n)
    sq = [torch.dot(v.reshape(-1), v.reshape(-1)).to(torch.float64) for v in (ga, gb, g)]
    return g, ((sq[0] + sq[1]) / 2, 2.0 * na * nb / n, sq[2], float(n))


class Workload(Protocol):
    """The driver's view of a model and its data."""

    n_params: int
    dtype: torch.dtype
    samples_per_step: int

    def initial_params(self) -> torch.Tensor:
        """The flat starting point (identical on every rank)."""

    def gradient(self, weights: torch.Tensor, rank: int, step: int) -> tuple[torch.Tensor, float]:
        """``(flat gradient, minibatch loss)`` at ``weights`` for ``rank``'s minibatch of ``step``."""

    def evaluate(self, weights: torch.Tensor) -> dict[str, float]:
        """Held-out or full-data figures at ``weights`` (may be empty)."""


def require_finite_loss(loss: float, *, rank: int, step: int) -> None:
    """Stop a rank whose minibatch loss is NaN or infinite, saying when: a run that diverged (a
    learning rate too large) or met a non-finite value trained on to a NaN loss and exited 0.

    >>> require_finite_loss(float("inf"), rank=1, step=12)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.TransportError: rank 1: the loss became non-finite (inf) at step 12: the run diverged ...
    """
    if not math.isfinite(loss):
        raise TransportError(
            f"rank {rank}: the loss became non-finite ({loss}) at step {step}: the run diverged (is the learning rate "
            "too large?) or a value it computed is not finite; it is stopped"
        )


class LeastSquaresWorkload:
    """The reference executor's least-squares problem in torch (same samples, same gradients).

    >>> w = LeastSquaresWorkload(LeastSquaresProblem(n_samples=64, dim=3, n_shards=2, batch=4))
    >>> g, loss = w.gradient(w.initial_params(), rank=1, step=0)
    >>> g.shape, g.dtype
    (torch.Size([3]), torch.float64)
    """

    def __init__(
        self, problem: LeastSquaresProblem, *, dtype: torch.dtype = torch.float64, device: torch.device | None = None
    ) -> None:
        self.problem = problem
        A, b, x_true = problem.data_and_truth()
        self.device = device or torch.device("cpu")
        self.A = torch.as_tensor(A, dtype=dtype, device=self.device)
        self.b = torch.as_tensor(b, dtype=dtype, device=self.device)
        self.x_true = torch.as_tensor(x_true, dtype=dtype, device=self.device)
        self.n_params = problem.dim
        self.dtype = dtype
        self.samples_per_step = problem.batch * max(problem.merge_shards, 1)
        #: samples of one epoch of the training data (the rows of every shard)
        self.samples_per_epoch: float | None = float(problem.n_samples)

    def initial_params(self) -> torch.Tensor:
        return torch.as_tensor(self.problem.initial_point(), dtype=self.dtype, device=self.device).clone()

    def gradient(self, weights: torch.Tensor, rank: int, step: int) -> tuple[torch.Tensor, float]:
        idx = torch.as_tensor(self.problem.batch_indices(rank, step), device=self.device)
        A, b = self.A[idx], self.b[idx]
        r = A @ weights - b
        return A.T @ r / len(idx), float(0.5 * (r @ r) / len(idx))

    def gradient_pair(self, weights: torch.Tensor, rank: int, step: int) -> tuple[torch.Tensor, float, NormPairTensors]:
        """:meth:`gradient` computed over the two halves of the minibatch: ``(gradient, loss,
        norms)`` (:data:`NormPairTensors`); the gradient and loss are :meth:`gradient`'s up to rounding."""
        idx = torch.as_tensor(self.problem.batch_indices(rank, step), device=self.device)
        na, nb = _halves(len(idx))
        parts = []
        for sel in (idx[:na], idx[na:]):
            r = self.A[sel] @ weights - self.b[sel]
            parts.append((self.A[sel].T @ r / len(sel), float(0.5 * (r @ r))))
        g, norms = _pair(parts[0][0], parts[1][0], na, nb)
        return g, (parts[0][1] + parts[1][1]) / len(idx), norms

    def evaluate(self, weights: torch.Tensor) -> dict[str, float]:
        r"""``full_loss`` over the data, and ``loss``: the expected loss on a fresh row of the
        problem's distribution (standard normal rows, labels with noise ``sigma``), the held-out loss
        in closed form, :math:`\tfrac12(|x - x^*|^2 + \sigma^2)`."""
        w = weights.to(self.device)
        r = self.A @ w - self.b
        err = w - self.x_true
        return {
            "full_loss": float(0.5 * (r @ r) / len(r)),
            "loss": float(0.5 * (err @ err + self.problem.noise**2)),
        }


class ModuleWorkload:
    """Any ``nn.Module`` with a sampler.

    Parameters
    ----------
    model_factory : callable () -> nn.Module
        Builds the model; called once per rank after seeding torch with ``seed`` so every rank
        starts from the same weights.
    sampler : object with ``sample(step) -> (x, y)``
        The rank's minibatches (sharded by the sampler, e.g. ``WindowSampler``).
    loss_fn : callable (output, y) -> scalar tensor
        Default: cross-entropy over frames.
    samples_per_step : int
        Samples (frames or windows) per minibatch, for throughput.
    evaluator : callable (model) -> dict, optional
        Held-out scoring (frame accuracy, WER), run with the weights loaded.
    """

    def __init__(
        self,
        model_factory: Callable[[], torch.nn.Module],
        sampler: Any,
        *,
        samples_per_step: int,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        seed: int = 0,
        device: torch.device | None = None,
        evaluator: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    ) -> None:
        torch.manual_seed(seed)
        self.device = device or torch.device("cpu")
        self.model = model_factory().to(self.device)
        from psgdlab.runtime.loop.flat import flat_gradients, flat_parameters

        self.flat = flat_parameters(self.model)
        self.flat_grad = flat_gradients(self.model)
        self._params = list({id(p): p for p in self.model.parameters()}.values())
        self._reducer: OverlappedAllreduce | None = None
        self._init = self.flat.detach().clone()
        self.sampler = sampler
        self.loss_fn = loss_fn or _frame_cross_entropy
        self.n_params = int(self.flat.numel())
        self.dtype = self.flat.dtype
        self.samples_per_step = int(samples_per_step)
        self.evaluator = evaluator
        #: samples of one epoch of the training data, where the caller knows it (summary.json's
        #: ``samples_per_epoch``: :data:`psgdlab.core.convergence.fit.REFERENCE_KEYS`)
        self.samples_per_epoch: float | None = None

    def initial_params(self) -> torch.Tensor:
        return self._init.clone()

    def overlap_allreduce(
        self, transport: Transport, group: Sequence[int], *, transform: MessageTransform | None = None
    ) -> OverlappedAllreduce:
        """Sum the gradient over ``group`` during every later backward pass (DDP's buckets), each
        bucket through ``transform`` (default: the identity).

        From then on :meth:`gradient` returns the flat gradient buffer itself while buckets may
        still be in flight: the caller reads it only after ``finish()`` of the returned
        :class:`~psgdlab.runtime.loop.overlap.OverlappedAllreduce`, and then it holds the *sum*.
        """
        if self._reducer is not None:
            self._reducer.remove()
        self._reducer = OverlappedAllreduce(transport, group, self._params, self.flat_grad, transform=transform)
        return self._reducer

    def end_overlap(self) -> None:
        """Back to plain backward passes (:meth:`gradient` returns a copy of the local gradient)."""
        if self._reducer is not None:
            self._reducer.remove()
            self._reducer = None

    def gradient(self, weights: torch.Tensor, rank: int, step: int) -> tuple[torch.Tensor, float]:
        with torch.no_grad():
            self.flat.copy_(weights)
        self.flat_grad.zero_()
        x, y = self.sampler.sample(step)
        x = torch.as_tensor(x, device=self.device)
        y = torch.as_tensor(y, device=self.device)
        self.model.train()
        if self._reducer is not None:
            self._reducer.arm()
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        grad = self.flat_grad if self._reducer is not None else self.flat_grad.clone()
        return grad, float(loss.detach())

    def gradient_pair(self, weights: torch.Tensor, rank: int, step: int) -> tuple[torch.Tensor, float, NormPairTensors]:
        """:meth:`gradient` as two backward passes over the two halves of the minibatch: ``(gradient,
        loss, norms)`` (:data:`NormPairTensors`). The loss must be a mean over the samples (as the
        default's is), so the halves' weighted mean is the whole minibatch's gradient and loss; with
        the bucketed overlap armed it is refused (that step's one backward pass is the allreduce's)."""
        if self._reducer is not None:
            raise RuntimeError("gradient_pair with the overlapped gradient allreduce armed")
        with torch.no_grad():
            self.flat.copy_(weights)
        x, y = self.sampler.sample(step)
        x = torch.as_tensor(x, device=self.device)
        y = torch.as_tensor(y, device=self.device)
        na, nb = _halves(int(x.shape[0]))
        self.model.train()
        grads, loss = [], 0.0
        for lo, hi in ((0, na), (na, na + nb)):
            self.flat_grad.zero_()
            part = self.loss_fn(self.model(x[lo:hi]), y[lo:hi])
            part.backward()
            grads.append(self.flat_grad.clone())
            loss += float(part.detach()) * (hi - lo)
        g, norms = _pair(grads[0], grads[1], na, nb)
        return g, loss / (na + nb), norms

    def evaluate(self, weights: torch.Tensor) -> dict[str, float]:
        if self.evaluator is None:
            return {}
        with torch.no_grad():
            self.flat.copy_(weights)
        self.model.eval()
        return dict(self.evaluator(self.model))


def _frame_cross_entropy(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if output.dim() > 2:  # (batch, time, classes) against (batch, time)
        output = output.reshape(-1, output.shape[-1])
        y = y.reshape(-1)
    return torch.nn.functional.cross_entropy(output, y.long())


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
