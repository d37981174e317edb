r"""The gradient noise scale measured as a rank trains: pairs of gradient norms at two batch sizes.

The estimators and their smoothing are core's (:mod:`psgdlab.core.convergence.noise_scale`); this module
takes the pairs of squared norms where the step already has them, or makes them where it does
not:

- **a gradient allreduce** (SSGD; H-ADPSGD inside a node of several GPUs): the rank's own
  gradient (``batch`` samples) and the group's mean the allreduce returns (``k * batch``), at the
  same weights -- every step, for the cost of two squared norms of the gradient (one pass over
  it each; with the bucketed overlap the bucket's norm is taken as it is sent,
  :attr:`~psgdlab.runtime.loop.overlap.OverlappedAllreduce.local_sq`);
- **no gradient allreduce** (AD-PSGD, BMUF, D-PSGD, EASGD, ASGD, one worker): every
  ``every``-th step the minibatch's gradient is computed as two backward passes over its two
  halves (:meth:`~psgdlab.runtime.loop.workloads.ModuleWorkload.gradient_pair`), whose mean is the
  step's gradient as one pass would give it (the update does not change) and whose norms are
  the small batch's; the cost is that step's second, smaller pass
  (``docs/time-to-accuracy.md`` has the figures).

The squared norms stay tensors until the run ends (no device synchronisation per step); the
rank hands its rows (:data:`~psgdlab.core.convergence.noise_scale.NOISE_ROWS_DTYPE`) to rank 0, which
summarises every rank's together (:func:`~psgdlab.core.convergence.noise_scale.summarize_noise_scale`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from psgdlab.core.convergence.noise_scale import NOISE_ROWS_DTYPE
from psgdlab.core.exchange import AllReduce, Exchange

__all__ = ["NoiseProbe", "method_of", "has_gradient_allreduce"]


def _sq(t: torch.Tensor) -> torch.Tensor:
    """The squared norm of ``t`` as a float64 0-d tensor on its device (no synchronisation)."""
    flat = t.reshape(-1)
    return torch.dot(flat, flat).to(torch.float64)


def has_gradient_allreduce(exchanges: Sequence[Exchange]) -> bool:
    """Whether a step's exchanges sum the gradient over a group of two or more."""
    return any(isinstance(ex, AllReduce) and ex.payload == "grad" and len(ex.group) >= 2 for ex in exchanges)


def method_of(rows: np.ndarray, methods: set[str]) -> str:
    """The route every rank's rows came from: ``"allreduce"``, ``"halves"``, ``"mixed"`` or ``"none"``."""
    if rows.size == 0 or not methods:
        return "none"
    return methods.pop() if len(methods) == 1 else "mixed"


class NoiseProbe:
    """One rank's pairs of norms (module docstring).

    Parameters
    ----------
    rank : int
    batch : int
        Samples of one of the rank's minibatches.
    every : int
        Steps between estimates on the halves route (``0``: never estimate).
    workload : object
        The rank's workload: the halves route needs its ``gradient_pair`` and a batch of >= 2.
    """

    def __init__(self, *, rank: int, batch: int, every: int, workload: Any) -> None:
        self.rank = rank
        self.batch = int(batch)
        self.every = int(every)
        self.halves_ok = self.every > 0 and self.batch >= 2 and hasattr(workload, "gradient_pair")
        self._rows: list[tuple[int, float, float, float]] = []  # step, time, batch small, batch big
        self._sq: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.methods: set[str] = set()

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def wants_halves(self, step: int, exchanges: Sequence[Exchange]) -> bool:
        """Whether step ``step`` computes its gradient as two halves (no gradient allreduce in it)."""
        return self.halves_ok and step % self.every == 0 and not has_gradient_allreduce(exchanges)

    def wants_allreduce(self, exchanges: Sequence[Exchange]) -> bool:
        return self.enabled and has_gradient_allreduce(exchanges)

    def local(self, grad: torch.Tensor) -> torch.Tensor:
        """The rank's own gradient's squared norm, taken before the allreduce sums it."""
        return _sq(grad)

    def add_allreduce(
        self, *, step: int, time_s: float, local_sq: torch.Tensor, summed: torch.Tensor, scale: float
    ) -> None:
        """One pair from a gradient allreduce: ``local_sq`` (``batch``) and the group's mean,
        ``scale * summed`` with ``scale = 1/k`` (``k * batch``)."""
        k = round(1.0 / scale)
        if k < 2:
            return
        self._rows.append((step, time_s, float(self.batch), float(k * self.batch)))
        self._sq.append((local_sq, _sq(summed) * (scale * scale)))
        self.methods.add("allreduce")

    def add_halves(self, *, step: int, time_s: float, pair: tuple[torch.Tensor, float, torch.Tensor, float]) -> None:
        """One pair from the halves route: ``(sq_small, batch_small, sq_big, batch_big)``."""
        sq_small, b_small, sq_big, b_big = pair
        self._rows.append((step, time_s, float(b_small), float(b_big)))
        self._sq.append((sq_small.to(torch.float64), sq_big.to(torch.float64)))
        self.methods.add("halves")

    def rows(self) -> np.ndarray:
        """Every pair of this rank (:data:`~psgdlab.core.convergence.noise_scale.NOISE_ROWS_DTYPE`)."""
        out = np.zeros(len(self._rows), dtype=NOISE_ROWS_DTYPE)
        if not self._rows:
            return out
        sq = torch.stack([torch.stack(p) for p in self._sq]).cpu().numpy()  # one synchronisation
        meta = np.asarray(self._rows, dtype=float)
        out["rank"] = self.rank
        out["step"] = meta[:, 0].astype(np.int64)
        out["time_s"] = meta[:, 1]
        out["batch_small"] = meta[:, 2]
        out["batch_big"] = meta[:, 3]
        out["sq_small"] = sq[:, 0]
        out["sq_big"] = sq[:, 1]
        return out
