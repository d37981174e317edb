r"""Where a convergence model's parameters come from: a reference run, emulated runs, published results.

Every route fits the same curve (:mod:`psgdlab.core.convergence`): a run at total batch
:math:`B` whose held-out metric is :math:`m` after :math:`e` epochs is one observation of

.. math::
    m = m_\infty + \frac{K\,(1 + B/B_\text{noise})\,P}{e},

with :math:`P` the product of the staleness, learner and period factors at that run's setting
(taken from the profile's scales, not fitted). :func:`fit_curve` fits :math:`(m_\infty, K,
B_\text{noise})` with :func:`psgdlab.core.stats.fitting.fit_parameters` (log-normal priors, relative
errors of spread ``metric_sd`` over the metric) and reports the in-sample, leave-one-out and
leave-one-group-out errors of the metric (a group: one run, one table cell).

**(a) A reference run** of the user's model on 1-2 workers (:func:`from_reference_run`). Its
``summary.json`` must hold the keys of :data:`REFERENCE_KEYS` (the runtime writes them; this is the
one place they are defined): the gradient noise scale measured during training is
:math:`B_\text{noise}` (its log-sd the prior's spread), and the tail of the held-out curve fits
:math:`m_\infty` and :math:`K`. Where the run reached the profile's target, the curve is
**anchored** there (:func:`anchor_curve`): :math:`K` is set so that the model passes through the
epochs at which the run's held-out curve (its decreasing fit, :func:`psgdlab.core.convergence.curves.time_to_target`)
reached the target, the fitted floor and noise scale kept; the law :math:`K/(m - m_\infty)` then
only carries the run to other targets, and a curve that follows another law near the target (the
exponential descent of least squares) does not bias the prediction at it. A single run says
nothing about where training stops converging: the profile it gives has no limits.

**(b) Emulated runs** (``psgdlab emulate`` run directories, :func:`from_emulated_runs`): their
held-out loss against epochs (``curves.npz``: ``eval_epoch``, ``eval_loss``) at several
configurations; runs at different total batches pin :math:`B_\text{noise}`. A run whose loss
ends non-finite or above where it started did not converge: its family's limit is the largest
converging batch (learners) below it.

**(c) Published results** (:func:`from_published`): cells of a table (an algorithm, a total batch,
the epochs trained, the metric reached or "did not converge"); the limits of each family are the
largest converging batch it was published at.

A curve point within the first ``TAIL_FROM`` of a run's epochs is left out of (a) and (b): the
warm-up and the first descent follow other laws than the tail the target lies on.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.convergence import ConvergenceProfile, Estimate, Family, Limit, Limits, Setting, setting_of
from psgdlab.core.convergence.curves import time_to_target
from psgdlab.core.errors import ConfigError, require
from psgdlab.core.records.rundir import require_complete
from psgdlab.core.stats.fitting import FitReport, fit_parameters

__all__ = [
    "REFERENCE_KEYS",
    "DEFAULT_SCALES",
    "TAIL_FROM",
    "Observation",
    "PublishedCell",
    "CurveFit",
    "fit_curve",
    "from_reference_run",
    "from_emulated_runs",
    "from_published",
    "load_convergence",
    "limits_from_runs",
    "anchor_curve",
    "local_scatter",
]

#: the keys of a reference run's ``summary.json`` that route (a) reads, and their units
REFERENCE_KEYS: dict[str, str] = {
    "noise_scale": "the gradient noise scale B_simple = tr(Sigma)/|G|^2 estimated during training (McCandlish "
    "et al. 2018, appendix A's unbiased estimators from per-worker and averaged gradient norms), smoothed, "
    "in samples (the unit of batch_per_worker); a float > 0",
    "noise_scale_log_sd": "optional: the standard deviation of its natural log over the run's second half "
    "(default 0.5)",
    "heldout_curve": "an object of equal-length lists: 'epoch' (samples seen over all workers / "
    "samples_per_epoch), 'loss' (held-out cross-entropy, nats per frame) and optionally 'wer' (percent) "
    "and 'step' (optimizer steps per worker), 'time_s' (wall seconds)",
    "samples_per_epoch": "samples of one epoch of the training data (float > 0)",
    "batch_per_worker": "samples one worker's step consumes (int >= 1)",
    "workers": "workers of the run (summary.json's case key)",
}
#: the default log-sd of a measured noise scale without ``noise_scale_log_sd``
NOISE_SCALE_LOG_SD = 0.5
#: curve points before this fraction of a run's epochs are left out (module docstring)
TAIL_FROM = 0.25
#: the scales of the staleness, learner and period factors where no data give them:
#: (value, log-sd, source)
DEFAULT_SCALES: dict[str, tuple[float, float, str]] = {
    "staleness_scale": (16.0, 0.7, "[INF] prior: 16 updates of mean staleness double the epochs"),
    "learner_scale": (32.0, 0.7, "[INF] prior: ring consensus ~1/n^2; 33 gossiping learners double the epochs"),
    "period_scale": (80.0, 0.7, "[INF] prior: 81-step periods double the epochs (BMUF flat to 80, S003 Tab.4)"),
}
#: an uninformative prior's log-sd
_WIDE = 3.0


def default_scales() -> dict[str, Estimate]:
    return {k: Estimate(value=v, log_sd=s, source=src) for k, (v, s, src) in DEFAULT_SCALES.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """One curve point: total batch (samples), epochs, the metric reached, the run it belongs to
    (``group``) and the product of its setting's non-batch factors (``factor``)."""

    total_batch: float
    epochs: float
    metric: float
    group: str
    factor: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedCell:
    """One published result: an algorithm (registry name), its total batch, the epochs trained
    and the metric reached (``None``: did not converge), and its source."""

    algorithm: str
    total_batch: int
    epochs: float
    metric: float | None
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CurveFit:
    """The fitted (floor, curve, noise_scale), their log correlation, the metric's scatter, and
    the fit's errors (relative errors of the metric; ``loo`` by point, ``logo`` by group)."""

    floor: Estimate
    curve: Estimate
    noise_scale: Estimate
    correlation: tuple[tuple[float, ...], ...]
    metric_sd: float
    report: FitReport
    observations: tuple[Observation, ...]

    def errors(self) -> dict[str, Any]:
        """JSON: each observation and its errors, and their medians and maxima (relative, and in
        the metric's units)."""
        obs = self.observations
        y = np.array([o.metric for o in obs])

        def summary(errs: Mapping[int, float]) -> dict[str, float | None]:
            if not errs:
                return {"median_rel": None, "max_rel": None, "median_abs": None, "max_abs": None}
            rel = np.abs(np.array(list(errs.values())))
            ab = np.abs(np.array([errs[i] * y[i] for i in errs]))
            return {
                "median_rel": float(np.median(rel)),
                "max_rel": float(rel.max()),
                "median_abs": float(np.median(ab)),
                "max_abs": float(ab.max()),
            }

        r = self.report
        by_group: dict[int, float] = {}
        for errs in r.logo.get("run", {}).values():
            by_group.update(errs)
        return {
            "points": [
                {
                    "group": o.group,
                    "total_batch": o.total_batch,
                    "epochs": o.epochs,
                    "metric": o.metric,
                    "fitted": float(r.predictions[i]),
                    "loo": r.loo.get(i),
                    "logo": by_group.get(i),
                }
                for i, o in enumerate(obs)
            ],
            "in_sample": summary(r.in_sample),
            "loo": summary(r.loo),
            "logo": summary(by_group),
        }


def fit_curve(
    observations: Sequence[Observation],
    *,
    metric_sd: float,
    floor: Estimate | None = None,
    noise_scale: Estimate | None = None,
    source: str,
) -> CurveFit:
    """Fit (floor, curve, noise_scale) to ``observations`` (module docstring).

    ``floor`` and ``noise_scale`` are priors (a measured noise scale, an assumed floor); without
    one the fit starts from a guess with an uninformative spread (log-sd 3). ``source`` names the
    data (it becomes each fitted estimate's source). Leave-one-out over points, and
    leave-one-group-out over ``group`` when there are several."""
    obs = tuple(observations)
    require(len(obs) >= 2, "observations", len(obs), "must be at least 2 curve points")
    require(metric_sd > 0, "metric_sd", metric_sd, "must be > 0")
    B = np.array([o.total_batch for o in obs], dtype=float)
    e = np.array([o.epochs for o in obs], dtype=float)
    y = np.array([o.metric for o in obs], dtype=float)
    P = np.array([o.factor for o in obs], dtype=float)
    require(bool(np.all(e > 0) & np.all(y > 0) & np.all(B > 0)), "observations", "...", "must be positive")

    def model(p: dict[str, float], rows: np.ndarray) -> np.ndarray:
        out: np.ndarray = p["floor"] + p["curve"] * (1.0 + B[rows] / p["noise_scale"]) * P[rows] / e[rows]
        return out

    lo = float(y.min())
    prior = {
        "floor": floor.value if floor else 0.5 * lo,
        "noise_scale": noise_scale.value if noise_scale else float(np.median(B)),
    }
    # K from the last point of the prior's curve (any positive start would do)
    i = int(np.argmax(e))
    excess = max(y[i] - prior["floor"], 0.05 * y[i])
    prior["curve"] = excess * e[i] / ((1.0 + B[i] / prior["noise_scale"]) * P[i])
    spread = {
        "floor": floor.log_sd if floor and floor.log_sd > 0 else _WIDE,
        "curve": _WIDE,
        "noise_scale": noise_scale.log_sd if noise_scale and noise_scale.log_sd > 0 else _WIDE,
    }
    prior = {k: prior[k] for k in ("floor", "curve", "noise_scale")}
    groups = {"run": [o.group for o in obs]} if len({o.group for o in obs}) > 1 else None
    noise = metric_sd / float(np.median(y))
    rep = fit_parameters(
        model,
        y,
        prior,
        spread,
        noise=noise,
        bounds={"floor": (1e-9 * lo, 0.999 * lo)},
        groups=groups,
        loo=True,
        max_nfev=400,
        diff_step=1e-3,
        cv_steps=8,
    )

    def est(name: str, given: Estimate | None, what: str) -> Estimate:
        src = f"fitted with {source}" + (f" (prior: {given.source})" if given else f" ({what})")
        return Estimate(value=rep.values[name], log_sd=rep.log_sd[name], source=src)

    return CurveFit(
        floor=est("floor", floor, "no prior"),
        curve=est("curve", None, "no prior"),
        noise_scale=est("noise_scale", noise_scale, "no prior"),
        correlation=_clean_correlation(rep.correlation),
        metric_sd=max(metric_sd, rep.noise * float(np.median(y))),
        report=rep,
        observations=obs,
    )


def _clean_correlation(c: tuple[tuple[float, ...], ...]) -> tuple[tuple[float, ...], ...]:
    """A fit's correlation made exactly symmetric, unit-diagonal and within [-1, 1] (rounding)."""
    a = np.asarray(c, dtype=float)
    a = np.clip(0.5 * (a + a.T), -1.0, 1.0)
    np.fill_diagonal(a, 1.0)
    return tuple(tuple(float(x) for x in row) for row in a)


def _profile(
    fit: CurveFit,
    *,
    workload: str,
    metric: str,
    target: float,
    target_source: str,
    samples_per_epoch: float,
    families: tuple[Family, ...],
    scales: Mapping[str, Estimate] | None,
    extra: Mapping[str, Any],
) -> ConvergenceProfile:
    sc = dict(default_scales() if scales is None else scales)
    return ConvergenceProfile(
        workload=workload,
        metric=metric,
        target=target,
        target_source=target_source,
        samples_per_epoch=samples_per_epoch,
        floor=fit.floor,
        curve=fit.curve,
        noise_scale=fit.noise_scale,
        staleness_scale=sc.get("staleness_scale"),
        learner_scale=sc.get("learner_scale"),
        period_scale=sc.get("period_scale"),
        metric_sd=fit.metric_sd,
        correlation=fit.correlation,
        families=families,
        fit={**extra, "errors": fit.errors()},
    )


def _factor(scales: Mapping[str, Estimate], s: Setting) -> float:
    """The product of the non-batch factors at ``s`` (:func:`psgdlab.core.convergence._factors`)."""
    f = 1.0
    for key, x, power in (
        ("staleness_scale", s.staleness_mean, 1),
        ("learner_scale", float(s.learners - 1), 2),
        ("period_scale", float(s.period - 1), 1),
    ):
        if key in scales:
            f *= 1.0 + (x / scales[key].value) ** power
    return f


# ----- (a) a reference run -----------------------------------------------------------------------
def _summary(path: Path) -> dict[str, Any]:
    p = path / "summary.json"
    if not p.is_file():
        raise ConfigError(f"{path} has no summary.json (is it a run directory?)")
    require_complete(path)
    try:
        return dict(json.loads(p.read_text()))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p} is not valid JSON ({exc})") from None


def _tail(epochs: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(epochs) & np.isfinite(values) & (epochs > 0) & (values > 0)
    epochs, values = epochs[ok], values[ok]
    keep = epochs >= TAIL_FROM * (epochs.max() if epochs.size else 0.0)
    return epochs[keep], values[keep]


def from_reference_run(
    path: str | Path, *, metric: str = "loss", target: float | None = None, workload: str | None = None
) -> ConvergenceProfile:
    """The profile that a reference run of the user's model gives (route (a), module docstring).

    The run's ``summary.json`` must have :data:`REFERENCE_KEYS`; a missing one is a one-line
    :class:`ConfigError` that names it. ``target`` defaults to the best metric the run reached.
    The profile covers every algorithm, with no limits (one run cannot show any)."""
    from psgdlab.core.algorithms import ALGORITHMS

    path = Path(path)
    s = _summary(path)
    missing = [
        k for k in ("noise_scale", "heldout_curve", "samples_per_epoch", "batch_per_worker", "workers") if k not in s
    ]
    if missing:
        raise ConfigError(
            f"reference run {path}: summary.json lacks {', '.join(missing)} (a reference run needs "
            f"{', '.join(REFERENCE_KEYS)}: see psgdlab.core.convergence.fit.REFERENCE_KEYS)"
        )
    curve = s["heldout_curve"]
    if metric not in curve or "epoch" not in curve:
        raise ConfigError(f"reference run {path}: heldout_curve has no 'epoch' and {metric!r} lists")
    epochs, values = _tail(np.asarray(curve["epoch"], dtype=float), np.asarray(curve[metric], dtype=float))
    B = float(s["workers"]) * float(s["batch_per_worker"])
    bn = Estimate(
        value=float(s["noise_scale"]),
        log_sd=float(s.get("noise_scale_log_sd", NOISE_SCALE_LOG_SD)),
        source=f"measured by {path} (noise_scale)",
    )
    setting = Setting(algorithm=str(s.get("algorithm", "sgd")), total_batch=B, learners=1)
    scales = default_scales()
    obs = [
        Observation(total_batch=B, epochs=float(a), metric=float(b), group=path.name, factor=_factor(scales, setting))
        for a, b in zip(epochs, values, strict=True)
    ]
    fit = fit_curve(obs, metric_sd=_curve_sd(values), noise_scale=bn, source=f"the held-out curve of {path}")
    goal = float(target if target is not None else values.min())
    crossing = time_to_target({"time_s": curve["epoch"], metric: curve[metric]}, goal, metric=metric)
    if crossing.reached and crossing.time_s is not None and crossing.time_s > 0 and goal > fit.floor.value:
        all_e = np.asarray(curve["epoch"], dtype=float)
        all_v = np.asarray(curve[metric], dtype=float)
        fit = anchor_curve(
            fit, target=goal, epochs=crossing.time_s, total_batch=B, factor=obs[0].factor,
            metric_sd=local_scatter(all_e, all_v, at=crossing.time_s),
            source=f"{path}'s crossing of {metric}={goal:.4g}",
        )  # fmt: skip
    return _profile(
        fit,
        workload=workload or str(s.get("workload", "model")),
        metric=metric,
        target=goal,
        target_source=f"the best {metric} of {path}" if target is None else "given",
        samples_per_epoch=float(s["samples_per_epoch"]),
        families=(Family(name="any", algorithms=tuple(ALGORITHMS)),),
        scales=scales,
        extra={"route": "reference run", "runs": [str(path)]},
    )


def anchor_curve(
    fit: CurveFit,
    *,
    target: float,
    epochs: float,
    total_batch: float,
    factor: float,
    metric_sd: float,
    source: str,
) -> CurveFit:
    r"""``fit`` with :math:`K` set so that the model gives ``epochs`` at ``target`` and
    ``total_batch`` (module docstring, route (a)):
    :math:`K = E\,(m - m_\infty) / ((1 + B/B_	ext{noise})\,P)`, and ``metric_sd`` the curve's
    own scatter (not the law's misfit elsewhere).

    Its uncertainty is the delta method's: :math:`\log K` moves with the fitted floor and noise
    scale (their log covariance kept) and with the crossing itself, whose log-sd is one run's
    scatter at the target, ``metric_sd`` over :math:`m - m_\infty`. At ``target`` and
    ``total_batch`` the floor's and the noise scale's parts cancel in the predicted epochs, which
    then carry the crossing's uncertainty and the new run's scatter only.
    """
    f, bn = fit.floor, fit.noise_scale
    excess = target - f.value
    require(excess > 0, "target", target, f"must lie above the fitted floor {f.value:.4g}")
    b = total_batch / bn.value
    K = epochs * excess / ((1.0 + b) * factor)
    a = -f.value / excess  # d log K / d log floor
    c = b / (1.0 + b)  # d log K / d log noise_scale
    rho = float(np.asarray(fit.correlation)[0, 2]) if fit.correlation else 0.0
    s_e = metric_sd / excess
    sf, sb = f.log_sd, bn.log_sd
    var_k = (a * sf) ** 2 + (c * sb) ** 2 + 2 * a * c * rho * sf * sb + s_e**2
    cov_fk = a * sf**2 + c * rho * sf * sb
    cov_bk = a * rho * sf * sb + c * sb**2
    sk = math.sqrt(var_k)

    def corr(cov: float, s1: float) -> float:
        return float(np.clip(cov / (s1 * sk), -1.0, 1.0)) if s1 > 0 and sk > 0 else 0.0

    r_fk, r_bk = corr(cov_fk, sf), corr(cov_bk, sb)
    correlation = ((1.0, r_fk, rho), (r_fk, 1.0, r_bk), (rho, r_bk, 1.0))
    return dataclasses.replace(
        fit,
        curve=Estimate(value=K, log_sd=sk, source=f"anchored at {source} ({epochs:.4g} epochs)"),
        correlation=_clean_correlation(correlation),
        metric_sd=metric_sd,
    )


def local_scatter(epochs: np.ndarray, values: np.ndarray, *, at: float) -> float:
    r"""How much a curve's points scatter about a smooth curve near epoch ``at``, in the metric's
    units: the scatter of their logarithm (a curve that falls by orders of magnitude, as least
    squares' does, is smooth in it) from the fourth differences of the positive points within a
    factor 2 of ``at`` in epoch order (white noise of sd :math:`\sigma` gives differences of
    variance :math:`70\sigma^2`, a smooth curve's fourth derivative next to nothing), times
    their median; with fewer than 6 points there, from the second differences of every positive
    point's logarithm (variance :math:`6\sigma^2`). At least 0.1 % of that median.

    >>> e = np.linspace(0.5, 2.0, 16)
    >>> local_scatter(e, 1 / e, at=1.0) < 0.002                           # smooth: next to nothing
    True
    >>> noisy = (1 / e) * np.exp(np.random.default_rng(0).normal(0, 0.05, 16))
    >>> 0.03 < local_scatter(e, noisy, at=1.0) < 0.08                     # 5 % of about 1
    True
    """
    ok = np.isfinite(epochs) & np.isfinite(values) & (values > 0)
    near = ok & (epochs >= 0.5 * at) & (epochs <= 2.0 * at)
    order = np.argsort(epochs[near], kind="stable")
    v = values[near][order]
    if v.size >= 6:
        sd_log = float(np.sqrt(np.mean(np.diff(np.log(v), n=4) ** 2) / 70.0))
        scale = float(np.median(v))
    else:
        every = values[ok][np.argsort(epochs[ok], kind="stable")]
        if every.size < 3:
            return 1e-3 * float(np.median(np.abs(values[np.isfinite(values)])))
        sd_log = float(np.sqrt(np.mean(np.diff(np.log(every), n=2) ** 2) / 6.0))
        scale = float(np.interp(at, np.sort(epochs[ok]), every))
    return max(sd_log * scale, 1e-3 * scale)


def _curve_sd(values: np.ndarray) -> float:
    """The scatter of a curve's points about a smooth curve: the sd of its second differences
    over sqrt(6) (white noise), at least 0.1 % of the metric."""
    if values.size >= 3:
        sd = float(np.std(np.diff(values, n=2), ddof=1) / math.sqrt(6.0)) if values.size > 3 else 0.0
    else:
        sd = 0.0
    return max(sd, 1e-3 * float(np.median(values)))


# ----- (b) emulated runs ------------------------------------------------------------------------
def _emulated(path: Path) -> tuple[Setting, np.ndarray, np.ndarray, float, bool]:
    """A run's setting, its curve (epochs, loss), its samples per epoch and whether it converged."""
    from psgdlab.core.algorithms import make_algorithm

    s = _summary(path)
    cfg_path = path / "config.resolved.json"
    curves_path = path / "curves.npz"
    if not cfg_path.is_file() or not curves_path.is_file():
        raise ConfigError(f"{path} is not a psgdlab emulate run directory (no config.resolved.json or curves.npz)")
    cfg = json.loads(cfg_path.read_text())
    with np.load(curves_path) as z:
        epochs, loss = np.asarray(z["eval_epoch"], dtype=float), np.asarray(z["eval_loss"], dtype=float)
    params = {k: v for k, v in dict(s["algorithm_params"]).items() if k != "algorithm"}
    algorithm = make_algorithm(str(s["algorithm"]), **params)
    batch = int(cfg["batch"])
    setting = setting_of(algorithm, batch, staleness_mean=float(s.get("staleness_mean", 0.0)))
    spe = float(cfg["steps_per_epoch"]) * setting.total_batch
    finite = loss[np.isfinite(loss)]
    converged = bool(loss.size >= 2 and np.isfinite(loss[-1]) and finite.size and loss[-1] < loss[0])
    return setting, epochs, loss, spe, converged


def from_emulated_runs(
    paths: Sequence[str | Path], *, target: float | None = None, workload: str = "model"
) -> ConvergenceProfile:
    """The profile that emulated runs give (route (b), module docstring): the held-out loss of
    ``psgdlab emulate`` run directories at several configurations (at least two converged runs;
    at two or more total batches to pin the noise scale). ``target`` defaults to the median of
    the converged runs' final losses."""
    require(len(paths) >= 2, "emulated runs", len(paths), "must be at least 2 run directories")
    scales = default_scales()
    obs: list[Observation] = []
    runs = []
    spe_all = []
    for p in map(Path, paths):
        setting, epochs, loss, spe, ok = _emulated(p)
        runs.append((p, setting, ok, float(loss[-1]) if loss.size else math.nan))
        if not ok:
            continue
        spe_all.append(spe)
        e, v = _tail(epochs, loss)
        f = _factor(scales, setting)
        obs += [
            Observation(total_batch=setting.total_batch, epochs=float(a), metric=float(b), group=p.name, factor=f)
            for a, b in zip(e, v, strict=True)
        ]
    good = [r for r in runs if r[2]]
    require(len(good) >= 2, "converged emulated runs", len(good), "must be at least 2")
    if max(np.ptp(spe_all), 0.0) > 1e-6 * max(spe_all):
        raise ConfigError(
            f"emulated runs see epochs of different sizes ({sorted(set(spe_all))} samples): one data set please"
        )
    finals = np.array([r[3] for r in good])
    sd = max(float(np.std(finals, ddof=1)) / 4.0 if finals.size > 1 else 0.0, 1e-3 * float(np.median(finals)))
    fit = fit_curve(obs, metric_sd=sd, source=f"{len(good)} emulated runs")
    families = _families_from_runs([(r[1], r[2], str(r[0])) for r in runs])
    return _profile(
        fit,
        workload=workload,
        metric="loss",
        target=float(target if target is not None else np.median(finals)),
        target_source="the median final loss of the emulated runs" if target is None else "given",
        samples_per_epoch=spe_all[0],
        families=families,
        scales=scales,
        extra={"route": "emulated runs", "runs": [str(r[0]) for r in runs]},
    )


def _families_from_runs(runs: Sequence[tuple[Setting, bool, str]]) -> tuple[Family, ...]:
    """One family per algorithm seen; a failed run caps its batch (learners) at the largest that
    converged below it."""
    out = []
    for name in dict.fromkeys(s.algorithm for s, _, _ in runs):
        mine = [(s, ok, where) for s, ok, where in runs if s.algorithm == name]
        out.append(Family(name=name, algorithms=(name,), limits=limits_from_runs(mine, "emulated")))
    return tuple(out)


def limits_from_runs(runs: Sequence[tuple[Setting, bool, str]], what: str) -> Limits:
    """The limits runs of one algorithm show, ``(setting, converged, where)`` each: the largest
    total batch (learners) that converged below the smallest that did not; ``None`` where no
    run failed or none converged below a failure. ``what`` names the runs in the source.

    >>> ok = Setting(algorithm="adpsgd", total_batch=64, learners=4)
    >>> bad = Setting(algorithm="adpsgd", total_batch=256, learners=8)
    >>> lim = limits_from_runs([(ok, True, "a"), (bad, False, "b")], "emulated")
    >>> lim.max_batch.value, lim.max_learners.value
    (64.0, 4.0)
    """

    def cap(key: str) -> Limit | None:
        bad = [getattr(s, key) for s, ok, _ in runs if not ok]
        good = [getattr(s, key) for s, ok, _ in runs if ok]
        if not bad:
            return None
        below = [g for g in good if g < min(bad)]
        if not below:
            return None
        return Limit(
            value=float(max(below)),
            source=f"{what}: converged at {key} {max(below):g}, not at {', '.join(f'{b:g}' for b in sorted(set(bad)))}",
        )

    return Limits(max_batch=cap("total_batch"), max_learners=cap("learners"))


# ----- (c) published results --------------------------------------------------------------------
def from_published(
    cells: Sequence[PublishedCell],
    *,
    workload: str,
    metric: str,
    target: float,
    target_source: str,
    samples_per_epoch: float,
    floor: Estimate,
    metric_sd: float,
    families: Mapping[str, tuple[str, ...]],
    learner_limits: Mapping[str, Limit] | None = None,
    scales: Mapping[str, Estimate] | None = None,
) -> ConvergenceProfile:
    """The profile that published results give (route (c), module docstring). ``families``: a
    family name to its algorithms; each family's batch limit is the largest total batch it
    converged at where a larger one did not; ``learner_limits`` adds published learner limits."""
    sc = dict(default_scales() if scales is None else scales)
    fam_of = {a: f for f, algs in families.items() for a in algs}
    obs = [
        Observation(
            total_batch=float(c.total_batch),
            epochs=c.epochs,
            metric=c.metric,
            group=f"{c.algorithm}@{c.total_batch}#{i}",
            factor=1.0,
        )
        for i, c in enumerate(cells)
        if c.metric is not None
    ]
    fit = fit_curve(obs, metric_sd=metric_sd, floor=floor, source=f"the {workload} table ({len(obs)} cells)")
    out = []
    for name, algs in families.items():
        mine = [c for c in cells if fam_of.get(c.algorithm) == name]
        good = sorted({c.total_batch for c in mine if c.metric is not None})
        bad = sorted({c.total_batch for c in mine if c.metric is None})
        src = ", ".join(sorted({c.source for c in mine}))
        top = good[-1] if good else None
        text = f"{src}: converged up to {top}" + (
            f", not at {', '.join(map(str, bad))}" if bad else " (the largest published)"
        )
        limits = Limits(
            max_batch=Limit(value=float(top), source=text) if top is not None else None,
            max_learners=(learner_limits or {}).get(name),
        )
        out.append(Family(name=name, algorithms=algs, limits=limits))
    return _profile(
        fit,
        workload=workload,
        metric=metric,
        target=target,
        target_source=target_source,
        samples_per_epoch=samples_per_epoch,
        families=tuple(out),
        scales=sc,
        extra={"route": "published", "cells": [vars_of(c) for c in cells]},
    )


def vars_of(c: PublishedCell) -> dict[str, Any]:
    return {
        "algorithm": c.algorithm,
        "total_batch": c.total_batch,
        "epochs": c.epochs,
        "metric": c.metric,
        "source": c.source,
    }


def load_convergence(source: str, *, workload: str, target: float | None = None) -> ConvergenceProfile:
    """A profile from measurement: one reference run directory (route (a): its summary has
    ``noise_scale``), or several emulate run directories separated by commas (route (b))."""
    parts = [p for p in source.split(",") if p.strip()]
    for p in parts:
        if not Path(p).is_dir():
            raise ConfigError(f"convergence source {p!r} is not a run directory")
    if len(parts) == 1:
        s = _summary(Path(parts[0]))
        if "noise_scale" in s or "heldout_curve" in s:
            return from_reference_run(parts[0], target=target, workload=workload)
        raise ConfigError(
            f"convergence source {parts[0]} is neither a reference run (its summary.json has no noise_scale) nor "
            "several emulate run directories (give at least two, separated by commas)"
        )
    return from_emulated_runs(parts, target=target, workload=workload)
