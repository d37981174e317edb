r"""Single-learner SGD, the baseline every speedup is measured against (ALGORITHMS.md §A.1).

Update rule: :math:`\theta_{k+1} = \theta_k - \alpha_k g(\theta_k, \xi_k)`.
Sends nothing; no staleness. Reduction: SSGD with ``n`` workers of batch ``m`` equals this with
batch ``n m`` on the same samples.

Examples
--------
>>> from psgdlab.core.reference import run_reference, LeastSquaresProblem
>>> problem = LeastSquaresProblem(n_samples=256, dim=4, n_shards=1, batch=8, seed=0)
>>> result = run_reference(SGD(), problem, steps=50, lr=0.05)
>>> bool(result.losses[-1] < result.losses[0])
True

References
----------
Robbins & Monro 1951; ALGORITHMS.md §A.1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.errors import require

__all__ = ["SGD"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SGD(Algorithm):
    """One learner, plain (or momentum) SGD. Parameters are as in :class:`Algorithm`;
    ``n_workers`` must be 1."""

    name: ClassVar[str] = "sgd"

    @property
    def schedule_period(self) -> int:
        return 1

    def __post_init__(self) -> None:
        Algorithm.__post_init__(self)
        require(
            self.n_workers == 1,
            "workers",
            self.n_workers,
            "must be 1 for sgd",
            hint="use ssgd for synchronous data parallelism",
        )
