r"""The gradient noise scale, estimated from gradient norms at two batch sizes during training.

McCandlish et al. (2018) define the *simple noise scale* of a loss at weights :math:`w`

.. math::
    B_\text{simple} = \frac{\operatorname{tr}\Sigma}{|G|^2},

with :math:`G` the true gradient and :math:`\Sigma` the covariance of one sample's gradient (its
unit is samples: the batch at which the noise of a minibatch gradient is as large as its
signal). A minibatch gradient of :math:`B` samples has :math:`\mathbb{E}|G_B|^2 = |G|^2 +
\operatorname{tr}\Sigma / B`, so squared norms at two batch sizes :math:`B_s < B_b` give
unbiased estimates of both (their appendix A.1, :func:`unbiased_terms`):

.. math::
    |\mathcal{G}|^2 = \frac{B_b |G_{B_b}|^2 - B_s |G_{B_s}|^2}{B_b - B_s}, \qquad
    \mathcal{S} = \frac{|G_{B_s}|^2 - |G_{B_b}|^2}{1/B_s - 1/B_b}.

Each estimate is noisy (:math:`|\mathcal{G}|^2` may be negative), and their ratio is biased, so
the paper smooths the numerator and the denominator *separately* with exponential moving averages
and takes the ratio of the averages (:func:`smoothed_noise_scale`). Where the two batches come from
is the executor's business (the runtime: a worker's own gradient and the average its gradient
allreduce returns, or the two halves of its minibatch as two backward passes); this module holds
the arithmetic, the summary that a run directory records (:func:`summarize_noise_scale`: the
keys of :data:`psgdlab.core.convergence.fit.REFERENCE_KEYS`) and the direct estimate from many
gradient samples at one point (:func:`direct_noise_scale`) that checks it.

References
----------
McCandlish, Kaplan, Amodei and the OpenAI Dota team, "An Empirical Model of Large-Batch
Training", arXiv 1812.06162, 2018, appendix A.1.

Examples
--------
With the expectations themselves (|G|^2 = 4, tr(Sigma) = 32), the estimators are exact:

>>> g2, trace = unbiased_terms(sq_small=4 + 32 / 8, batch_small=8, sq_big=4 + 32 / 64, batch_big=64)
>>> round(g2, 12), round(trace, 12), round(trace / g2, 12)
(4.0, 32.0, 8.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from psgdlab.core.errors import require

__all__ = [
    "NormPair",
    "NOISE_ROWS_DTYPE",
    "EMA_DECAY",
    "HALVES_EVERY",
    "unbiased_terms",
    "smoothed_noise_scale",
    "NoiseScaleSummary",
    "summarize_noise_scale",
    "direct_noise_scale",
]

#: the exponential moving average's weight on the past, per estimate (about 20 estimates' memory)
EMA_DECAY = 0.95
#: steps between two estimates where a step has no gradient allreduce to take them from (the
#: runtime then computes that step's gradient as two halves: ``psgdlab train --noise-scale-every``)
HALVES_EVERY = 4
#: one estimate per row: where and when it was taken, the two batches and their squared norms
NOISE_ROWS_DTYPE = np.dtype(
    [
        ("rank", np.int32),
        ("step", np.int64),
        ("time_s", np.float64),
        ("batch_small", np.float64),
        ("batch_big", np.float64),
        ("sq_small", np.float64),
        ("sq_big", np.float64),
    ]
)
#: at most this many points of the smoothed series go into a summary (the file keeps them all)
CURVE_POINTS = 200


@dataclass(frozen=True, slots=True)
class NormPair:
    """Squared gradient norms at two batch sizes (samples), ``batch_small < batch_big``; the small
    one may be the mean of several gradients' squared norms of that batch (its expectation is
    the same)."""

    sq_small: float
    batch_small: float
    sq_big: float
    batch_big: float

    def __post_init__(self) -> None:
        require(
            0 < self.batch_small < self.batch_big,
            "batches",
            (self.batch_small, self.batch_big),
            "must be 0 < small < big",
        )
        require(
            math.isfinite(self.sq_small) and math.isfinite(self.sq_big) and self.sq_small >= 0 and self.sq_big >= 0,
            "squared norms",
            (self.sq_small, self.sq_big),
            "must be finite and >= 0",
        )


def unbiased_terms(*, sq_small: float, batch_small: float, sq_big: float, batch_big: float) -> tuple[float, float]:
    r"""Unbiased estimates of :math:`(|G|^2, \operatorname{tr}\Sigma)` from one pair of squared
    norms (module docstring); either may come out negative on a noisy pair.

    >>> unbiased_terms(sq_small=3.0, batch_small=1, sq_big=2.0, batch_big=2)
    (1.0, 2.0)
    """
    require(0 < batch_small < batch_big, "batches", (batch_small, batch_big), "must be 0 < small < big")
    g2 = (batch_big * sq_big - batch_small * sq_small) / (batch_big - batch_small)
    trace = (sq_small - sq_big) / (1.0 / batch_small - 1.0 / batch_big)
    return float(g2), float(trace)


def _terms(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bs, bb = rows["batch_small"], rows["batch_big"]
    g2 = (bb * rows["sq_big"] - bs * rows["sq_small"]) / (bb - bs)
    trace = (rows["sq_small"] - rows["sq_big"]) / (1.0 / bs - 1.0 / bb)
    return g2, trace


def smoothed_noise_scale(g2: Sequence[float], trace: Sequence[float], *, decay: float = EMA_DECAY) -> np.ndarray:
    r"""The noise scale after each estimate: the ratio of the exponential moving averages of the
    trace and of :math:`|G|^2` (weights :math:`(1 - \beta)\beta^{k-j}`; the same weights in both,
    so the start-up bias of the averages cancels in the ratio). ``nan`` where the averaged
    :math:`|G|^2` is not positive (the signal not yet resolved).

    >>> smoothed_noise_scale([1.0, 1.0, -5.0], [2.0, 4.0, 3.0], decay=0.5).round(3).tolist()
    [2.0, 3.333, nan]
    """
    require(0.0 <= decay < 1.0, "decay", decay, "must be in [0, 1)")
    g = np.asarray(g2, dtype=float)
    t = np.asarray(trace, dtype=float)
    require(g.shape == t.shape and g.ndim == 1, "g2/trace", (g.shape, t.shape), "must be 1-d of one length")
    out = np.full(g.size, np.nan)
    num = den = 0.0
    for k in range(g.size):
        num = decay * num + (1.0 - decay) * t[k]
        den = decay * den + (1.0 - decay) * g[k]
        if den > 0 and num > 0:
            out[k] = num / den
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class NoiseScaleSummary:
    """What a run records of its noise scale (:func:`summarize_noise_scale`).

    ``noise_scale`` (samples; ``None`` when the run's second half never resolved the signal:
    its summed :math:`|G|^2` estimate not positive) is the ratio of the summed trace and
    :math:`|G|^2` estimates of the run's second half (by step), the smoothing the paper advises
    taken over that whole stretch; ``noise_scale_log_sd`` the standard deviation of the log of
    the smoothed series (:func:`smoothed_noise_scale`) over the same half; ``curve`` the
    smoothed series (``step``, ``time_s``, ``noise_scale``; at most :data:`CURVE_POINTS` points);
    ``estimates`` how many pairs of norms it saw and ``method`` where they came from.
    """

    noise_scale: float | None
    noise_scale_log_sd: float | None
    curve: dict[str, list[Any]]
    estimates: int
    method: str

    def to_json(self) -> dict[str, Any]:
        """The summary.json keys (:data:`~psgdlab.core.convergence.fit.REFERENCE_KEYS`' two, and more)."""
        out: dict[str, Any] = {
            "noise_scale_curve": self.curve,
            "noise_scale_estimates": self.estimates,
            "noise_scale_method": self.method,
        }
        if self.noise_scale is not None:
            out["noise_scale"] = self.noise_scale
        if self.noise_scale_log_sd is not None:
            out["noise_scale_log_sd"] = self.noise_scale_log_sd
        return out


def summarize_noise_scale(rows: np.ndarray, *, method: str, decay: float = EMA_DECAY) -> NoiseScaleSummary:
    """The summary of a run's pairs of norms (``rows`` of :data:`NOISE_ROWS_DTYPE`, every rank's),
    taken in order of wall time (ties by rank).

    >>> rows = np.zeros(4, dtype=NOISE_ROWS_DTYPE)
    >>> rows["step"] = rows["time_s"] = [0, 1, 2, 3]
    >>> rows["batch_small"], rows["batch_big"] = 8, 16
    >>> rows["sq_small"], rows["sq_big"] = 4 + 32 / 8, 4 + 32 / 16     # |G|^2 = 4, tr = 32
    >>> s = summarize_noise_scale(rows, method="halves")
    >>> round(s.noise_scale, 9), s.noise_scale_log_sd, s.estimates
    (8.0, 0.0, 4)
    """
    rows = np.sort(np.asarray(rows, dtype=NOISE_ROWS_DTYPE), order=("time_s", "rank"), kind="stable")
    if rows.size == 0:
        return NoiseScaleSummary(noise_scale=None, noise_scale_log_sd=None, curve={}, estimates=0, method=method)
    g2, trace = _terms(rows)
    smooth = smoothed_noise_scale(g2.tolist(), trace.tolist(), decay=decay)
    steps = rows["step"]
    half = steps >= 0.5 * float(steps.max())
    g_sum, t_sum = float(g2[half].sum()), float(trace[half].sum())
    value = t_sum / g_sum if g_sum > 0 and t_sum > 0 else None
    logs = np.log(smooth[half][np.isfinite(smooth[half])])
    log_sd = float(np.std(logs, ddof=1)) if logs.size >= 2 else None
    stride = max(1, math.ceil(rows.size / CURVE_POINTS))
    keep = np.arange(rows.size)[::-1][::stride][::-1]  # the last estimate always kept
    curve: dict[str, list[Any]] = {
        "step": [int(s) for s in steps[keep]],
        "time_s": [float(t) for t in rows["time_s"][keep]],
        "noise_scale": [float(v) if math.isfinite(v) else None for v in smooth[keep]],
    }
    return NoiseScaleSummary(
        noise_scale=value, noise_scale_log_sd=log_sd, curve=curve, estimates=int(rows.size), method=method
    )


def direct_noise_scale(gradients: np.ndarray, *, batch: float) -> tuple[float, float, float]:
    r"""The noise scale at one point from many independent minibatch gradients there (``gradients``:
    ``(m, p)``, each of ``batch`` samples): with :math:`\bar g` their mean and
    :math:`s^2 = \frac{1}{m-1}\sum_k |g_k - \bar g|^2` (an unbiased estimate of
    :math:`\operatorname{tr}\Sigma / B`), :math:`\operatorname{tr}\Sigma = B s^2` and
    :math:`|G|^2 = |\bar g|^2 - s^2/m` (both unbiased). Returns ``(noise_scale, |G|^2, tr)``;
    the noise scale is ``inf`` where the estimate of :math:`|G|^2` is not positive.

    >>> g = np.array([[1.0, 0.0], [3.0, 0.0], [2.0, 1.0], [2.0, -1.0]])
    >>> [round(x, 4) for x in direct_noise_scale(g, batch=2)]     # s^2 = 4/3: tr = 8/3, |G|^2 = 4 - 1/3
    [0.7273, 3.6667, 2.6667]
    """
    g = np.asarray(gradients, dtype=float)
    require(g.ndim == 2 and g.shape[0] >= 2, "gradients", g.shape, "must be (m >= 2, p)")
    require(batch > 0, "batch", batch, "must be > 0")
    mean = g.mean(axis=0)
    s2 = float(np.sum((g - mean) ** 2) / (g.shape[0] - 1))
    g2 = float(mean @ mean) - s2 / g.shape[0]
    trace = batch * s2
    return (trace / g2 if g2 > 0 else math.inf), g2, trace
