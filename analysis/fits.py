r"""Fitting a platform profile from measured traces.

- :func:`fit_compute_time`: the per-step compute-time distribution from compute records,
  as a log-normal matched to the measured median and 95th percentile (the form
  :class:`psgdlab.core.platform.timing.ComputeTime` reads), with the sample mean and the
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

from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.cost import (
    allreduce_terms,
    transfer_terms,
)
from psgdlab.core.records.trace import PHASES
from psgdlab.core.stats.priors import Prior

__all__ = [
    "MIN_RECORDS",
    "PINNED_SHRINK",
    "fit_compute_time",
    "fit_link",
    "fit_links",
    "fit_bandwidth_at_latency",
    "fit_overhead_per_byte",
    "overhead_line",
    "nonnegative_log_spread",
]


MIN_RECORDS = 8

#: a value with a prior is *unpinned* when the data narrowed the standard deviation of its
#: logarithm to no less than this fraction of the prior's
PINNED_SHRINK = 0.5


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
    sd_s: np.ndarray | None = None,
    bandwidth_prior: Prior | None = None,
    latency_prior: Prior | None = None,
    design: np.ndarray | None = None,
) -> dict[str, Any]:
    r"""Latency and bandwidth from exchange durations and payloads, with their uncertainty.

    Weighted least squares of the cost law (module docstring) in :math:`(\alpha, 1/\beta)` with
    :math:`\alpha \ge 0`, each point weighted by ``1 / sd_s**2``. The covariance is
    :math:`(X^T W X)^{-1}`, scaled up by the reduced :math:`\chi^2` when the points scatter more
    than their ``sd_s`` say (without ``sd_s``: by the residual variance, and unknown without
    spare points); the log-sds follow by the delta method. The bandwidth is *pinned* when the
    data alone give :math:`1/\beta > 0` with a log-sd of at most :data:`PINNED_SHRINK` times the
    prior's, and the latency likewise with ``latency_prior`` (without one, any latency the data
    give is pinned). Otherwise (one payload size, durations that do not grow with the size, a
    spread as wide as the prior's) what is not pinned keeps its prior: the prior's logarithm is
    one more observation (value and ``log_sd``) of a least-squares fit in
    :math:`(\ln\alpha, \ln(1/\beta))`, whose covariance comes from the Jacobian at the
    solution, and the value is reported ``unpinned``; a bandwidth without a prior is refused.

    Parameters
    ----------
    durations_s, payload_bytes : array
        One entry per measured exchange or per summary of several (``S`` is the model bytes
        moved, not the wire bytes).
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
    sd_s : array, optional
        Standard deviation of each entry (default: equal weights).
    bandwidth_prior, latency_prior : Prior, optional
        What the bandwidth and the latency are known to be before the data
        (:mod:`psgdlab.core.stats.priors`).
    design : array of shape (points, 2), optional
        Each point's coefficients of :math:`(\alpha, 1/\beta)` from its cost law, for exchanges
        other than a pairwise one and an allreduce (an allgather,
        :func:`psgdlab.core.platform.cost.allgather_terms`); replaces ``group_sizes``, ``pairwise`` and
        ``algorithm``.

    Returns
    -------
    dict
        ``latency_s``, ``bandwidth_bytes_per_s``; ``latency_log_sd`` and ``bandwidth_log_sd``
        (standard deviations of the logarithms; ``None`` where unknown or the latency is 0),
        ``log_correlation`` (of the two logarithms), ``unpinned`` (names of the values the
        data did not pin down), ``samples``, ``points``, ``rms_residual_s``,
        ``max_rel_residual``, ``reduced_chi2``.
    """
    t, S, records = _link_points(durations_s, payload_bytes, records, bandwidth_prior)
    X = _link_design(S, group_sizes, pairwise, algorithm) if design is None else np.asarray(design, dtype=float)
    if X.shape != (t.size, 2):
        raise ConfigError(f"design must have one row of 2 coefficients per point ({t.size}), not shape {X.shape}")
    sd = np.ones_like(t) if sd_s is None else np.maximum(np.asarray(sd_s, dtype=float), 1e-12)
    post, sd_a, lat_pinned, bw_pinned = _pinned_fit(
        X, t, sd, S, weighted=sd_s is not None, bandwidth_prior=bandwidth_prior, latency_prior=latency_prior
    )
    alpha, inv_beta = post["alpha"], post["inv_beta"]
    resid = t - X @ np.array([alpha, inv_beta])
    unpinned = [name for name, ok in (("latency_s", lat_pinned), ("bandwidth_bytes_per_s", bw_pinned)) if not ok]
    return {
        "latency_s": alpha,
        "bandwidth_bytes_per_s": float(1.0 / inv_beta),
        "latency_log_sd": sd_a,
        "bandwidth_log_sd": post["sd_log_inv_beta"],
        "log_correlation": post["corr"],
        "unpinned": unpinned,
        **_residuals(t, resid, records),
        "reduced_chi2": post["reduced_chi2"],
    }


def _link_points(
    durations_s: np.ndarray, payload_bytes: np.ndarray, records: int | None, bandwidth_prior: Prior | None
) -> tuple[np.ndarray, np.ndarray, int]:
    """The points of :func:`fit_link` checked: durations, payloads and the measured exchanges
    behind them, enough of them, and of two sizes at least unless a bandwidth prior is given."""
    t = np.asarray(durations_s, dtype=float)
    S = np.asarray(payload_bytes, dtype=float)
    if t.size != S.size:
        raise ConfigError(f"durations ({t.size}) and payloads ({S.size}) must have the same length")
    records = t.size if records is None else int(records)
    _require_records(records, t.size)
    if np.unique(S).size < 2 and bandwidth_prior is None:  # also one point summarizing many exchanges
        raise ConfigError(
            f"cannot separate latency from bandwidth with a single payload size ({records} exchanges, all of "
            f"{S[0]:.0f} bytes); measure exchanges of at least two sizes"
        )
    return t, S, records


def _pinned_fit(
    X: np.ndarray,
    t: np.ndarray,
    sd: np.ndarray,
    S: np.ndarray,
    *,
    weighted: bool,
    bandwidth_prior: Prior | None,
    latency_prior: Prior | None,
) -> tuple[dict[str, Any], float | None, bool, bool]:
    """The fit of :func:`fit_link` and what it pinned: the data's own fit where it pins both
    values, else the fit with what the data do not pin kept at its prior. Returns the fit, the
    latency's log-sd, and whether the latency and the bandwidth are pinned."""
    post = _wls(X, t, sd, weighted=weighted) if np.unique(S).size >= 2 else None
    sd_v = post["sd_log_inv_beta"] if post is not None else None
    bw_pinned = post is not None and post["inv_beta"] > 0
    if bw_pinned and bandwidth_prior is not None:
        bw_pinned = sd_v is not None and sd_v <= PINNED_SHRINK * bandwidth_prior.log_sd
    if not bw_pinned and bandwidth_prior is None:
        assert post is not None  # a single size without a prior was refused by fit_link
        raise ConfigError(
            f"fitted bandwidth is not positive (1/beta = {post['inv_beta']:.3g} s/B): the durations do not "
            "grow with payload size; measure larger payloads"
        )
    sd_a = post["sd_alpha"] / post["alpha"] if post and post["sd_alpha"] is not None and post["alpha"] > 0 else None
    lat_pinned = latency_prior is None or (
        bw_pinned and sd_a is not None and sd_a <= PINNED_SHRINK * latency_prior.log_sd
    )
    if not (bw_pinned and lat_pinned):  # what the data do not pin keeps its prior
        post = _posterior(X, t, sd, (latency_prior, None if bw_pinned else bandwidth_prior), weighted=weighted)
        sd_a = post["sd_log_alpha"]
        # the latency is judged given the bandwidth (its data-only spread is meaningless when the
        # bandwidth is not pinned): pinned where the data narrowed its prior's spread enough
        lat_pinned = latency_prior is None or sd_a <= PINNED_SHRINK * latency_prior.log_sd
    assert post is not None
    return post, sd_a, lat_pinned, bw_pinned


def _require_records(records: int, points: int) -> None:
    """Refuse a link fit from fewer than :data:`MIN_RECORDS` measured exchanges."""
    if records < MIN_RECORDS or points == 0:
        raise ConfigError(f"too little data to fit a link: {records} exchanges (need >= {MIN_RECORDS})")


def _residuals(t: np.ndarray, resid: np.ndarray, records: int) -> dict[str, Any]:
    """How a link law fits its points: ``samples``, ``points``, ``rms_residual_s``, ``max_rel_residual``."""
    return {
        "samples": int(records),
        "points": int(t.size),
        "rms_residual_s": float(np.sqrt(np.mean(resid**2))),
        "max_rel_residual": float(np.max(np.abs(resid) / np.maximum(t, 1e-12))),
    }


def _link_design(S: np.ndarray, group_sizes: Any, pairwise: Any, algorithm: str) -> np.ndarray:
    """Rows of the coefficients of :math:`(\alpha, 1/\beta)` of each point (pairwise or allreduce)."""
    if group_sizes is None:
        a_coef, b_coef = transfer_terms(S)
    else:
        n = np.asarray(group_sizes, dtype=float)
        pair = n <= 2 if pairwise is None else np.asarray(pairwise, dtype=bool)
        rounds, sent = allreduce_terms(n, S, algorithm)
        a_coef = np.where(pair, transfer_terms(S)[0], rounds)
        b_coef = np.where(pair, transfer_terms(S)[1], sent)
    return np.column_stack([np.broadcast_to(a_coef, S.shape), b_coef]).astype(float)


def _covariance(J: np.ndarray) -> np.ndarray:
    """:math:`(J^T J)^{-1}` through the singular values of ``J`` (stable when one direction is
    measured far more precisely than another); a direction with no information gets a variance of 1e300."""
    _, sv, vt = np.linalg.svd(J, full_matrices=False)
    inv = np.where(sv > sv.max() * 1e-15, 1.0 / np.maximum(sv, 1e-150) ** 2, 1e300)
    return (vt.T * inv) @ vt


def nonnegative_log_spread(A: np.ndarray, b: np.ndarray, coef: np.ndarray) -> dict[str, Any]:
    r"""What a non-negative least-squares fit of ``b ~ A @ coef`` (rows already weighted as the
    fit weighed them) knows about its coefficients: ``log_sd``, the standard deviation of each
    coefficient's logarithm (``None`` for one at its bound 0, or with no degree of freedom left
    to estimate the scatter), and ``log_correlation`` of the first two when both have one.

    The covariance is :math:`\hat\sigma^2 (A_+^\top A_+)^{-1}` over the positive columns
    :math:`A_+`, with :math:`\hat\sigma^2` the residual sum of squares per degree of freedom:
    the points' own scatter says how noisy they are (the CPU work of communication is measured as
    medians whose noise nothing else states); the delta method divides each standard deviation by
    its coefficient.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = np.column_stack([np.ones(40), np.linspace(1.0, 10.0, 40)])
    >>> b = A @ np.array([2.0, 0.5]) + rng.normal(0.0, 0.1, 40)
    >>> spread = nonnegative_log_spread(A, b, np.linalg.lstsq(A, b, rcond=None)[0])
    >>> [round(x, 3) for x in spread["log_sd"]], round(spread["log_correlation"], 2)
    ([0.015, 0.009], -0.9)
    >>> nonnegative_log_spread(A, b, np.array([0.0, 0.8]))["log_sd"][0] is None
    True
    """
    coef = np.asarray(coef, dtype=float)
    free = [i for i in range(coef.size) if coef[i] > 0]
    dof = A.shape[0] - len(free)
    log_sd: list[float | None] = [None] * coef.size
    out: dict[str, Any] = {"log_sd": log_sd, "log_correlation": None}
    if not free or dof <= 0:
        return out
    sigma2 = float(np.sum((b - A @ coef) ** 2)) / dof
    cov = _covariance(A[:, free]) * sigma2
    for k, i in enumerate(free):
        log_sd[i] = float(math.sqrt(max(cov[k, k], 0.0)) / coef[i])
    if free[:2] == [0, 1]:
        out["log_correlation"] = float(cov[0, 1] / math.sqrt(max(cov[0, 0] * cov[1, 1], 1e-300)))
    return out


def _wls(X: np.ndarray, t: np.ndarray, sd: np.ndarray, *, weighted: bool) -> dict[str, Any]:
    """Weighted linear least squares of ``t ~ X @ (alpha, 1/beta)`` with ``alpha >= 0`` (at the
    bound, ``1/beta`` alone), and the covariance (:func:`fit_link` says how it is scaled)."""
    A, b = X / sd[:, None], t / sd
    coef, *_ = np.linalg.lstsq(A, b, rcond=None)
    free = [0, 1]
    if coef[0] < 0:
        free = [1]
        coef = np.array([0.0, float(np.linalg.lstsq(A[:, 1:], b, rcond=None)[0][0])])
    out: dict[str, Any] = {
        "alpha": float(coef[0]),
        "inv_beta": float(coef[1]),
        "sd_alpha": None,
        "sd_log_inv_beta": None,
        "corr": None,
        "reduced_chi2": None,
    }
    rows = X.shape[0]
    chi2 = float(np.sum((A @ coef - b) ** 2))
    red = chi2 / (rows - len(free)) if rows > len(free) else None
    out["reduced_chi2"] = red
    inflate = (max(1.0, red) if red is not None else 1.0) if weighted else red
    if inflate is None or coef[1] <= 0:
        return out
    cov = _covariance(A[:, free]) * inflate
    u = coef[1]
    if len(free) == 2:
        out["sd_alpha"] = float(math.sqrt(max(cov[0, 0], 0.0)))
        out["sd_log_inv_beta"] = float(math.sqrt(max(cov[1, 1], 0.0))) / u
        denom = math.sqrt(max(cov[0, 0] * cov[1, 1], 1e-300))
        out["corr"] = float(-cov[0, 1] / denom)  # of ln(alpha) and ln(beta) = -ln(1/beta)
    else:
        out["sd_log_inv_beta"] = float(math.sqrt(max(cov[0, 0], 0.0))) / u
    return out


def _posterior(
    X: np.ndarray, t: np.ndarray, sd: np.ndarray, priors: tuple[Prior | None, Prior | None], *, weighted: bool
) -> dict[str, Any]:
    """The weighted least-squares fit of ``t ~ X @ (exp(a), exp(v))`` (latency and inverse
    bandwidth in log terms, so both stay positive), each prior of ``priors`` (latency,
    bandwidth) one more observation of ``a`` or ``-v`` with its ``log_sd``; the covariance
    of ``(a, v)`` from the Jacobian at the solution, the data's rows scaled by their scatter
    (the reduced chi-square; at least 1 when weighted) and the priors' rows as they are."""
    from scipy.optimize import least_squares

    lat, bw = priors

    def resid(theta: np.ndarray) -> np.ndarray:
        r = (X @ np.exp(theta) - t) / sd
        extra = [] if lat is None else [(theta[0] - math.log(lat.value)) / lat.log_sd]
        extra += [] if bw is None else [(theta[1] + math.log(bw.value)) / bw.log_sd]
        return np.append(r, extra)

    a0 = math.log(lat.value) if lat else math.log(max(float(np.min(t / np.maximum(X[:, 0], 1e-30))) * 0.5, 1e-9))
    v0 = -math.log(bw.value) if bw else math.log(max(float(np.median(t / np.maximum(X[:, 1], 1e-30))), 1e-15))
    sol = least_squares(resid, np.array([a0, v0]), xtol=1e-15, ftol=1e-15, gtol=1e-15)
    data_rows = X.shape[0]
    chi2 = float(np.sum(sol.fun[:data_rows] ** 2))
    red = chi2 / (data_rows - 2) if data_rows > 2 else None
    inflate = (max(1.0, red) if red is not None else 1.0) if weighted else (red if red is not None else 1.0)
    # the data's scatter widens what the data say, not the priors: a value the data leave to its
    # prior keeps the prior's spread (scaling the whole covariance had widened it past the prior)
    jac = np.vstack([sol.jac[:data_rows] / math.sqrt(max(inflate, 1e-300)), sol.jac[data_rows:]])
    cov = _covariance(jac)
    sd_a, sd_v = (float(math.sqrt(max(cov[i, i], 0.0))) for i in (0, 1))
    return {
        "alpha": float(math.exp(sol.x[0])),
        "inv_beta": float(math.exp(sol.x[1])),
        "sd_log_alpha": sd_a,
        "sd_log_inv_beta": sd_v,
        "corr": float(-cov[0, 1] / math.sqrt(max(cov[0, 0] * cov[1, 1], 1e-300))),
        "reduced_chi2": red,
    }


def fit_links(
    t: np.ndarray,
    S: np.ndarray,
    n: np.ndarray,
    pair: np.ndarray,
    rec: np.ndarray,
    sd: np.ndarray | None = None,
    *,
    algorithm: str = "ring",
    bandwidth_prior: Prior | None = None,
    collective_prior: Prior | None = None,
    latency_prior: Prior | None = None,
    between_hosts: bool = False,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The point-to-point link and, apart from it, the allreduce's (``collective``) from the
    points of :func:`link_samples` (durations, payloads, group sizes, pairwise mask, records,
    standard deviations).

    An implementation's allreduce need not move bytes as its point-to-point transfers do (gloo's
    ring against its ``isend``/``irecv``, docs/measurements.md): with at least two payload sizes
    and :data:`MIN_RECORDS` records of each kind,
    the pairwise points fit the link and the allreduce points the collective; otherwise one fit
    over every point is the link and the collective is ``None`` (the simulator then derives it
    from the link). ``algorithm`` and ``bandwidth_prior``: as in :func:`fit_link`;
    ``collective_prior`` (default ``bandwidth_prior``) is the allreduce fit's prior;
    ``latency_prior`` that of both.

    ``between_hosts``: every exchange crosses hosts (runs and probes with one rank per host).
    Where the allreduces then all have one group size (2), a cost per round cannot be told from
    one per allreduce, and a per-round latency fitted from them would be paid by a larger
    group's every round: the rounds take the messages' latency and only the allreduce's
    bandwidth is fitted (:func:`fit_bandwidth_at_latency`, the latency's spread and pinning the
    messages').
    """

    def enough(sel: np.ndarray) -> bool:
        return np.unique(S[sel]).size >= 2 and int(rec[sel].sum()) >= MIN_RECORDS

    def counted(fit: dict[str, Any], sel: np.ndarray) -> dict[str, Any]:
        fit["allreduce_samples"] = int(rec[sel & ~pair].sum())
        fit["pairwise_samples"] = int(rec[sel & pair].sum())
        fit["payload_sizes_bytes"] = sorted({int(x) for x in S[sel]})
        return fit

    def one(sel: np.ndarray, prior: Prior | None) -> dict[str, Any]:
        fit = fit_link(
            t[sel],
            S[sel],
            group_sizes=n[sel],
            pairwise=pair[sel],
            records=int(rec[sel].sum()),
            algorithm=algorithm,
            sd_s=None if sd is None else sd[sel],
            bandwidth_prior=prior,
            latency_prior=latency_prior,
        )
        return counted(fit, sel)

    if not (enough(pair) and enough(~pair)):
        return one(np.ones(t.shape, dtype=bool), bandwidth_prior), None
    link = one(pair, bandwidth_prior)
    if not between_hosts or np.unique(n[~pair]).size >= 2:
        return link, one(~pair, collective_prior or bandwidth_prior)
    ring = fit_bandwidth_at_latency(
        t[~pair],
        S[~pair],
        n[~pair],
        link["latency_s"],
        records=int(rec[~pair].sum()),
        algorithm=algorithm,
        sd_s=None if sd is None else sd[~pair],
        latency_log_sd=link["latency_log_sd"],
        latency_unpinned="latency_s" in link["unpinned"],
    )
    return link, counted(ring, ~pair)


def fit_bandwidth_at_latency(
    durations_s: np.ndarray,
    payload_bytes: np.ndarray,
    group_sizes: np.ndarray,
    latency_s: float,
    *,
    records: int,
    algorithm: str = "ring",
    sd_s: np.ndarray | None = None,
    latency_log_sd: float | None = None,
    latency_unpinned: bool = False,
) -> dict[str, Any]:
    r"""The bandwidth of allreduces whose rounds take a given latency: weighted least squares of
    :math:`t - R(n)\alpha` on the bytes sent, :math:`2(n-1)/n \cdot S`, through 0 (the
    :func:`fit_link` law with :math:`\alpha` given). Where every allreduce measured has one group
    size, the data cannot tell a cost per round from a cost per allreduce, and a per-round
    latency fitted from them grows with the rounds of a larger group; the latency of the path
    (a message's over the same link) is the one its rounds take. Returns :func:`fit_link`'s keys,
    ``latency_log_sd`` and ``unpinned`` those given of the latency (it is not this fit's; marked
    ``latency_given``), the bandwidth's spread given the latency scaled by the reduced
    chi-square (at least 1 when weighted), and ``bandwidth_latency_slope``,
    :math:`\partial \ln\beta / \partial \ln\alpha` of the fit (how the bandwidth moves with
    the latency it was given).

    >>> import numpy as np
    >>> S = np.array([1e6, 3e6]); n = np.array([2.0, 2.0])
    >>> t = 2 * 2e-4 + S / 5e8                          # 2 rounds at 0.2 ms, 500 MB/s
    >>> fit = fit_bandwidth_at_latency(t, S, n, 2e-4, records=40)
    >>> round(fit["bandwidth_bytes_per_s"] / 1e6, 3), fit["latency_s"]
    (500.0, 0.0002)
    """
    t = np.asarray(durations_s, dtype=float)
    S = np.asarray(payload_bytes, dtype=float)
    _require_records(records, t.size)
    X = _link_design(S, np.asarray(group_sizes, dtype=float), np.zeros(t.shape, dtype=bool), algorithm)
    sd = np.ones_like(t) if sd_s is None else np.maximum(np.asarray(sd_s, dtype=float), 1e-12)
    x, y = X[:, 1] / sd, (t - X[:, 0] * latency_s) / sd
    inv_beta = float(np.dot(x, y) / np.dot(x, x))
    if inv_beta <= 0:
        raise ConfigError(
            f"fitted bandwidth is not positive (1/beta = {inv_beta:.3g} s/B) at a latency of {latency_s:.3g} s: "
            "the allreduces take less than their latency rounds; measure larger payloads"
        )
    slope = float(latency_s * np.dot(x, X[:, 0] / sd) / np.dot(x, x) / inv_beta)  # d ln(beta) / d ln(alpha)
    resid = t - X @ np.array([latency_s, inv_beta])
    red = float(np.sum((resid / sd) ** 2)) / (t.size - 1) if t.size > 1 else None
    inflate = (max(1.0, red) if red is not None else 1.0) if sd_s is not None else (red or 0.0)
    return {
        "latency_s": float(latency_s),
        "bandwidth_bytes_per_s": 1.0 / inv_beta,
        "latency_log_sd": latency_log_sd,
        "bandwidth_log_sd": float(math.sqrt(inflate / np.dot(x, x))) / inv_beta if inflate else None,
        "log_correlation": None,
        "unpinned": ["latency_s"] if latency_unpinned else [],
        "latency_given": True,
        "bandwidth_latency_slope": slope,
        **_residuals(t, resid, records),
        "reduced_chi2": red,
    }


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
