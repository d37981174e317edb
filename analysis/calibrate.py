r"""Fitting a platform profile from measured traces.

- :func:`fit_compute_time`: the per-step compute-time distribution from compute records,
  as a log-normal with the measured mean and coefficient of variation (the form
  :class:`psgdlab.core.timing.ComputeTime` reads), with its median, 95th percentile, and the
  Kolmogorov–Smirnov distance between the sample and the fitted law as the residual.
- :func:`fit_link`: latency :math:`\alpha` and bandwidth :math:`\beta` of one link class from
  exchanges of different sizes, by least squares on the cost model of each exchange kind
  (pairwise: :math:`t = \alpha + S/\beta`; ring allreduce over ``n``:
  :math:`t = 2(n-1)\alpha + 2(n-1)/n \cdot S/\beta`), with per-record residuals.

Both refuse to guess: too few records, a single payload size (bandwidth and latency cannot be
separated), or a negative fitted bandwidth raise :class:`psgdlab.core.errors.ConfigError` saying
what more data is needed.

Examples
--------
>>> import numpy as np
>>> sizes = np.array([1e3, 1e5, 1e6, 1e7] * 3)
>>> times = 20e-6 + sizes / 2e9
>>> fit = fit_link(times, sizes)
>>> round(fit["latency_s"] * 1e6, 3), round(fit["bandwidth_bytes_per_s"] / 1e9, 3)
(20.0, 2.0)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from psgdlab.core.errors import ConfigError
from psgdlab.core.trace import PHASES

__all__ = ["fit_compute_time", "fit_link", "MIN_RECORDS"]

MIN_RECORDS = 8


def fit_compute_time(trace: np.ndarray, *, warmup_steps: int = 2) -> dict[str, Any]:
    """Fit the compute-time distribution of ``trace``'s compute records (after ``warmup_steps``)."""
    sel = trace[(trace["phase"] == PHASES["compute"]) & (trace["step"] >= warmup_steps)]
    d = (sel["end_s"] - sel["start_s"]).astype(float)
    d = d[d > 0]
    if d.size < MIN_RECORDS:
        raise ConfigError(f"too little data to fit compute time: {d.size} compute records after "
                          f"{warmup_steps} warm-up steps (need >= {MIN_RECORDS}); run more steps")
    mean, std = float(d.mean()), float(d.std(ddof=1))
    cv = std / mean
    sigma = math.sqrt(math.log1p(cv * cv))
    mu = math.log(mean) - sigma * sigma / 2
    ks = float(stats.kstest(d, "lognorm", args=(sigma, 0, math.exp(mu))).statistic) if cv > 0 else 0.0
    return {"kind": "lognormal", "mean_s": mean, "cv": cv, "p50_s": float(np.median(d)),
            "p95_s": float(np.percentile(d, 95)), "samples": int(d.size), "ks_distance": ks,
            "spec": f"lognormal:{mean:.6g}:{cv:.6g}"}


def fit_link(durations_s: np.ndarray, payload_bytes: np.ndarray, *, group_sizes: np.ndarray | None = None,
             ) -> dict[str, Any]:
    r"""Least-squares latency and bandwidth from exchange durations and payloads.

    Parameters
    ----------
    durations_s, payload_bytes : array
        One entry per measured exchange (``S`` is the model bytes moved, not the wire bytes).
    group_sizes : array, optional
        Ranks in each exchange's allreduce group (``None`` or 2 entries mean pairwise exchanges).
    """
    t = np.asarray(durations_s, dtype=float)
    S = np.asarray(payload_bytes, dtype=float)
    if t.size != S.size:
        raise ConfigError(f"durations ({t.size}) and payloads ({S.size}) must have the same length")
    if t.size < MIN_RECORDS:
        raise ConfigError(f"too little data to fit a link: {t.size} exchanges (need >= {MIN_RECORDS})")
    if np.unique(S).size < 2:
        raise ConfigError("cannot separate latency from bandwidth with a single payload size; "
                          "measure exchanges of at least two sizes")
    if group_sizes is None:
        a_coef, b_coef = np.ones_like(S), S
    else:
        n = np.asarray(group_sizes, dtype=float)
        pair = n <= 2
        a_coef = np.where(pair, 1.0, 2 * (n - 1))
        b_coef = np.where(pair, S, 2 * (n - 1) / n * S)
    X = np.column_stack([a_coef, b_coef])
    (alpha, inv_beta), *_ = np.linalg.lstsq(X, t, rcond=None)
    if inv_beta <= 0:
        raise ConfigError(f"fitted bandwidth is not positive (1/beta = {inv_beta:.3g} s/B): the durations do not "
                          "grow with payload size; measure larger payloads")
    pred = X @ np.array([alpha, inv_beta])
    resid = t - pred
    return {"latency_s": float(max(alpha, 0.0)), "bandwidth_bytes_per_s": float(1.0 / inv_beta),
            "samples": int(t.size), "rms_residual_s": float(np.sqrt(np.mean(resid ** 2))),
            "max_rel_residual": float(np.max(np.abs(resid) / np.maximum(t, 1e-12)))}
