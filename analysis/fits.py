r"""Fitting a platform profile from measured traces.

- :func:`fit_compute_time`: the per-step compute-time distribution from compute records,
  as a log-normal matched to the measured median and 95th percentile (the form
  :class:`psgdlab.core.timing.ComputeTime` reads), with the sample mean and the
  Kolmogorov–Smirnov distance between the sample and the fitted law as the residual.
- :func:`fit_link`: latency :math:`\alpha` and bandwidth :math:`\beta` of one link class from
  exchanges of different sizes, by least squares on the cost model of each exchange kind
  (pairwise: :math:`t = \alpha + S/\beta`; allreduce over ``n``:
  :math:`t = R(n)\alpha + 2(n-1)/n \cdot S/\beta` with :math:`R` the rounds of the
  implementation's schedule, :func:`psgdlab.core.exchange.allreduce_rounds`: :math:`2(n-1)` for a
  ring), with per-record residuals.

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

from psgdlab.core.cost import (
    allreduce_terms,
    transfer_terms,
)
from psgdlab.core.errors import ConfigError
from psgdlab.core.trace import PHASES

__all__ = [
    "MIN_RECORDS",
    "fit_compute_time",
    "fit_link",
    "fit_links",
    "fit_overhead_per_byte",
    "overhead_line",
]


MIN_RECORDS = 8


def fit_compute_time(trace: np.ndarray, *, warmup_steps: int = 2) -> dict[str, Any]:
    r"""Fit the compute-time distribution of ``trace``'s compute records (after ``warmup_steps``).

    A log-normal matched to the sample's median and 95th percentile,
    :math:`\mu = \ln t_{50}`, :math:`\sigma = \ln(t_{95}/t_{50}) / 1.645`: the tail up to p95 is
    kept, but a few steps stretched by another process's burst on a shared machine do not move
    it, whereas they inflate a moment fit's coefficient of variation (docs/measurements.md,
    "The cost model"). The sample mean is reported beside it.
    """
    sel = trace[(trace["phase"] == PHASES["compute"]) & (trace["step"] >= warmup_steps)]
    d = (sel["end_s"] - sel["start_s"]).astype(float)
    d = d[d > 0]
    if d.size < MIN_RECORDS:
        raise ConfigError(
            f"too little data to fit compute time: {d.size} compute records after "
            f"{warmup_steps} warm-up steps (need >= {MIN_RECORDS}); run more steps"
        )
    p50, p95 = float(np.median(d)), float(np.percentile(d, 95))
    mu, sigma = math.log(p50), math.log(p95 / p50) / stats.norm.ppf(0.95)
    mean, cv = math.exp(mu + sigma * sigma / 2), math.sqrt(math.expm1(sigma * sigma))
    ks = float(stats.kstest(d, "lognorm", args=(sigma, 0, p50)).statistic) if sigma > 0 else 0.0
    return {
        "kind": "lognormal",
        "mean_s": mean,
        "cv": cv,
        "p50_s": p50,
        "p95_s": p95,
        "sample_mean_s": float(d.mean()),
        "samples": int(d.size),
        "ks_distance": ks,
        "spec": f"lognormal:{mean:.6g}:{cv:.6g}",
    }


def fit_link(
    durations_s: np.ndarray,
    payload_bytes: np.ndarray,
    *,
    group_sizes: np.ndarray | None = None,
    pairwise: np.ndarray | None = None,
    records: int | None = None,
    algorithm: str = "ring",
) -> dict[str, Any]:
    r"""Least-squares latency and bandwidth from exchange durations and payloads.

    Parameters
    ----------
    durations_s, payload_bytes : array
        One entry per measured exchange (``S`` is the model bytes moved, not the wire bytes).
    group_sizes : array, optional
        Ranks in each exchange's allreduce group (``None`` or 2 entries mean pairwise exchanges).
    pairwise : bool array, optional
        Marks the pairwise exchanges explicitly; every other entry is then an allreduce over
        its ``group_sizes`` entry, a group of 2 included (:math:`2\alpha + S/\beta`).
    records : int, optional
        Measured exchanges behind the entries when each entry summarizes several (default: one
        each); at least :data:`MIN_RECORDS` are needed.
    algorithm : str
        The allreduces' schedule (:data:`psgdlab.core.exchange.ALLREDUCE_ALGORITHMS`), which sets
        their latency rounds; alike for groups of 2.
    """
    t = np.asarray(durations_s, dtype=float)
    S = np.asarray(payload_bytes, dtype=float)
    if t.size != S.size:
        raise ConfigError(f"durations ({t.size}) and payloads ({S.size}) must have the same length")
    records = t.size if records is None else int(records)
    if records < MIN_RECORDS or t.size == 0:
        raise ConfigError(f"too little data to fit a link: {records} exchanges (need >= {MIN_RECORDS})")
    if np.unique(S).size < 2:  # also one point summarizing many exchanges of one size
        raise ConfigError(
            f"cannot separate latency from bandwidth with a single payload size ({records} exchanges, all of "
            f"{S[0]:.0f} bytes); measure exchanges of at least two sizes"
        )
    if group_sizes is None:
        a_coef, b_coef = transfer_terms(S)
    else:
        n = np.asarray(group_sizes, dtype=float)
        pair = n <= 2 if pairwise is None else np.asarray(pairwise, dtype=bool)
        rounds, sent = allreduce_terms(n, S, algorithm)
        a_coef = np.where(pair, transfer_terms(S)[0], rounds)
        b_coef = np.where(pair, transfer_terms(S)[1], sent)
    X = np.column_stack([a_coef, b_coef])
    (alpha, inv_beta), *_ = np.linalg.lstsq(X, t, rcond=None)
    if inv_beta <= 0:
        raise ConfigError(
            f"fitted bandwidth is not positive (1/beta = {inv_beta:.3g} s/B): the durations do not "
            "grow with payload size; measure larger payloads"
        )
    pred = X @ np.array([alpha, inv_beta])
    resid = t - pred
    return {
        "latency_s": float(max(alpha, 0.0)),
        "bandwidth_bytes_per_s": float(1.0 / inv_beta),
        "samples": records,
        "points": int(t.size),
        "rms_residual_s": float(np.sqrt(np.mean(resid**2))),
        "max_rel_residual": float(np.max(np.abs(resid) / np.maximum(t, 1e-12))),
    }


def fit_links(
    t: np.ndarray, S: np.ndarray, n: np.ndarray, pair: np.ndarray, rec: np.ndarray, *, algorithm: str = "ring"
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The point-to-point link and, apart from it, the allreduce's (``collective``) from the
    points of :func:`link_samples` (durations, payloads, group sizes, pairwise mask, records).

    An implementation's allreduce need not move bytes as its point-to-point transfers do (gloo's
    ring against its ``isend``/``irecv``, docs/measurements.md): with at least two payload sizes
    and :data:`MIN_RECORDS` records of each kind,
    the pairwise points fit the link and the allreduce points the collective; otherwise one fit
    over every point is the link and the collective is ``None`` (the simulator then derives it
    from the link). ``algorithm``: the allreduces' schedule, as in :func:`fit_link`.
    """

    def enough(sel: np.ndarray) -> bool:
        return np.unique(S[sel]).size >= 2 and int(rec[sel].sum()) >= MIN_RECORDS

    def one(sel: np.ndarray) -> dict[str, Any]:
        fit = fit_link(
            t[sel], S[sel], group_sizes=n[sel], pairwise=pair[sel], records=int(rec[sel].sum()), algorithm=algorithm
        )
        fit["allreduce_samples"] = int(rec[sel & ~pair].sum())
        fit["pairwise_samples"] = int(rec[sel & pair].sum())
        fit["payload_sizes_bytes"] = sorted({int(x) for x in S[sel]})
        return fit

    if enough(pair) and enough(~pair):
        return one(pair), one(~pair)
    return one(np.ones(t.shape, dtype=bool)), None


def fit_overhead_per_byte(points: list[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)`` of the step overhead :math:`a + bS` from ``(payload bytes, overhead)`` per run:
    the update and the weight snapshots pass over the model, so the host work grows with it.
    The median per payload size,
    then a line through those medians (``b >= 0``); one size gives ``(median, 0)``."""
    if not points:
        return 0.0, 0.0
    S = np.array([p[0] for p in points])
    g = np.array([p[1] for p in points])
    sizes = np.unique(S)
    med = np.array([np.median(g[S == x]) for x in sizes])
    if sizes.size < 2:
        return max(float(med[0]), 0.0), 0.0
    b, a = np.polyfit(sizes, med, 1)
    if b <= 0:
        return max(float(np.median(g)), 0.0), 0.0
    return max(float(a), 0.0), float(b)


def overhead_line(points: list[tuple[float, float]]) -> dict[str, Any]:
    """:func:`fit_overhead_per_byte` of ``(payload bytes, excess)`` per run, with the points
    behind it (the fold of an averaged model, the merge of a pairwise one)."""
    a, b = fit_overhead_per_byte(points)
    return {
        "fixed_s": a,
        "s_per_byte": b,
        "runs": len(points),
        "excess_s": [round(x, 6) for _, x in sorted(points)],
        "payloads_bytes": [int(S) for S, _ in sorted(points)],
    }
