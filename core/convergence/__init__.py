r"""Statistical efficiency: how many steps a configuration needs to reach a target, or that it never will.

A prediction of time to accuracy is throughput times statistical efficiency: the simulator gives
the step time and the staleness of a configuration, this module the steps it needs to reach a
target held-out metric (a word error rate or a loss). The form is the gradient noise scale's
(McCandlish et al. 2018) on a learning curve, with one factor for each thing parallel SGD changes
and a region where training does not converge at all.

**Form.** With total batch :math:`B` (samples per step over every worker), the epochs a
configuration needs to bring the held-out metric down to :math:`m` are

.. math::
    E(B, m) = \underbrace{\frac{K}{m - m_\infty}}_{E_\text{min}(m)}
              \Bigl(1 + \frac{B}{B_\text{noise}}\Bigr)\,
              \Bigl(1 + \frac{\bar s}{s_{1/2}}\Bigr)
              \Bigl(1 + \Bigl(\frac{n_g - 1}{n_{1/2}}\Bigr)^2\Bigr)
              \Bigl(1 + \frac{\tau - 1}{\tau_{1/2}}\Bigr),

and the steps per worker are :math:`S = E N / B` (:math:`N` samples per epoch of the data the
profile describes). The second factor is the noise scale's: :math:`S(B) = S_\text{min}(1 +
B_\text{noise}/B)`, equivalently :math:`E(B) = E_\text{min}(1 + B/B_\text{noise})`; small batches
need as many epochs as the smallest, batches far beyond :math:`B_\text{noise}` as many steps.
The learning curve :math:`E_\text{min}(m) = K/(m - m_\infty)` says how the epochs grow as the
target approaches the metric's floor :math:`m_\infty` (an excess over the floor that falls as one
over the training, the rate of SGD with a decaying step). The other factors: the mean staleness
:math:`\bar s` of the updates (foreign updates between reading the weights and applying the
gradient, as the simulator counts it); :math:`n_g`, the learners that gossip (every worker of
AD-PSGD and D-PSGD, the super-learners of H-ADPSGD; 1 for the rest), whose consensus slows with the
ring's spectral gap, :math:`\propto 1/n_g^2`; the averaging period :math:`\tau` (BSP, BMUF, EASGD,
ASGD; 1 for the rest). Each ``*_scale`` is the value that doubles the epochs; a profile without
one leaves its factor at 1.

**Parameters** (:class:`ConvergenceProfile`): :math:`m_\infty` (``floor``), :math:`K`
(``curve``), :math:`B_\text{noise}` (``noise_scale``, in samples) and the three scales, each an
:class:`Estimate` with its source (published, measured by a named run, fitted with named data)
and the standard deviation of its logarithm; ``correlation`` couples the logs of the first three
where a fit estimated them together. ``metric_sd`` is how much the metric of one run scatters
about the curve (run-to-run noise, rounding of a published table).

**Where it does not converge** (:class:`Limits`, per family of algorithms): a total batch beyond
the largest shown to converge (the step size that the linear scaling rule gives at that batch
diverges), more learners on the ring than the largest count shown to converge, a period or a mean
staleness beyond a limit, or a target at or below the floor. A configuration there is not given
a time; :attr:`Outcome.reason` says why.

**Uncertainty.** The log of the epochs is linear in the logs of the parameters; its standard
deviation is the delta method's, :math:`\sqrt{g^\top \Sigma g}` with :math:`g` the derivatives
(closed forms, :func:`predict_steps`) and :math:`\Sigma` the parameters' log covariance, plus the
scatter of one run, ``metric_sd`` over :math:`m - m_\infty`. A time to target adds the throughput's
log-sd in quadrature (:func:`target_columns`).

**Assumptions and limits.** The learning-rate recipe is the one the data came from (the linear
scaling rule and warm-up of the IBM study, ALGORITHMS.md §C.1), so a batch changes the steps
only through the noise scale; the factors multiply (no interaction); staleness is summarised by
its mean; the limits are the data's: a family converges up to the largest batch (learners, period)
it was seen to converge at and the model says nothing beyond, and whether a limit found on one
ring variant holds on another is not known. The model predicts the epochs of a schedule that
decays in time with the training's length; a run stopped early on a schedule tuned for longer is
not what it describes.

Where the parameters come from: :mod:`psgdlab.core.convergence.fit` (a reference run, emulated
runs, published results) and :mod:`psgdlab.core.convergence.published` (the shipped profiles);
what training measures for them: :mod:`psgdlab.core.convergence.noise_scale` (the gradient noise
scale from gradient norms at two batch sizes) and :mod:`psgdlab.core.convergence.curves` (the
time to a target read off a held-out curve).

References
----------
McCandlish, Kaplan, Amodei and the OpenAI Dota team, "An Empirical Model of Large-Batch
Training", arXiv 1812.06162, 2018. Zhang et al., Interspeech 2019 (ALGORITHMS.md §D.1).

The package holds the model; where its parameters come from is apart:
:mod:`~psgdlab.core.convergence.fit` (fits to a reference run, emulated runs, published results)
and :mod:`~psgdlab.core.convergence.published` (the shipped profiles). Importing the model
imports neither.

Examples
--------
>>> p = ConvergenceProfile(workload="toy", metric="loss", target=0.5, samples_per_epoch=1000.0,
...     floor=Estimate(value=0.1, source="[INF]"), curve=Estimate(value=2.0, source="[INF]"),
...     noise_scale=Estimate(value=100.0, source="[INF]"),
...     families=(Family(name="sync", algorithms=("sgd", "ssgd"), limits=Limits(max_batch=Limit(
...         value=400, source="[INF]"))),))
>>> o = predict_steps(p, Setting(algorithm="ssgd", total_batch=100), Target(metric="loss", value=0.5))
>>> o.reaches, round(o.epochs, 2), round(o.steps, 1)    # 2/(0.5-0.1) = 5 epochs, x (1 + 100/100)
(True, 10.0, 100.0)
>>> predict_steps(p, Setting(algorithm="ssgd", total_batch=800), Target(metric="loss", value=0.5)).short
'batch>400'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError, require
from psgdlab.core.records.rows import PredictionRow, TargetColumns, TargetLogSd

__all__ = [
    "METRICS",
    "OBJECTIVES",
    "Target",
    "Estimate",
    "Limit",
    "Limits",
    "Family",
    "ConvergenceProfile",
    "Setting",
    "Outcome",
    "setting_of",
    "predict_steps",
    "target_columns",
    "paired_log_sd",
    "TARGET_KEYS",
]

#: what a target may name: a word error rate in percent, or a held-out loss
METRICS = ("wer", "loss")
#: the row keys that :func:`target_columns` adds (read by the team's checks: keep them)
TARGET_KEYS = (
    "target",
    "reaches_target",
    "target_reason",
    "steps_to_target",
    "epochs_to_target",
    "time_to_target_s",
    "time_to_target_s_low",
    "time_to_target_s_high",
    "gpu_hours_to_target",
    "gpu_hours_to_target_low",
    "gpu_hours_to_target_high",
)
#: what a plan may minimise -> the row key of :func:`target_columns` it reads (``psgdlab plan
#: --objective``'s choices, and :func:`psgdlab.sim.plan.choose`'s)
OBJECTIVES: dict[str, str] = {"time": "time_to_target_s", "gpu-hours": "gpu_hours_to_target"}
#: the standard normal's 95 % quantile (a two-sided 90 % interval), as :mod:`psgdlab.core.records.intervals`
_Z = 1.6448536269514722
_TARGET_RE = re.compile(r"^\s*([a-z]+)\s*=\s*(\S+)\s*$")


def _positive(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A held-out metric to reach: ``wer`` (percent) or ``loss``, and its value (> 0).

    >>> Target.parse("wer=7.6")
    Target(metric='wer', value=7.6)
    >>> Target.parse("accuracy=90")
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: target ('accuracy=90') must be wer=PCT or loss=VALUE (a metric of wer, loss)
    """

    metric: str
    value: float

    def __post_init__(self) -> None:
        require(self.metric in METRICS, "target metric", self.metric, f"must be one of {', '.join(METRICS)}")
        require(_positive(self.value), "target value", self.value, "must be a positive number")

    @classmethod
    def parse(cls, text: str) -> Target:
        """``"wer=PCT"`` or ``"loss=VALUE"``; anything else is a one-line :class:`ConfigError`."""
        m = _TARGET_RE.match(text or "")
        rule = f"must be wer=PCT or loss=VALUE (a metric of {', '.join(METRICS)})"
        if m is None or m.group(1) not in METRICS:
            raise ConfigError(f"target ({text!r}) {rule}")
        try:
            value = float(m.group(2).rstrip("%"))
        except ValueError:
            raise ConfigError(f"target ({text!r}) {rule}; {m.group(2)!r} is not a number") from None
        if not _positive(value):
            raise ConfigError(f"target ({text!r}) must have a positive finite value")
        return cls(metric=m.group(1), value=value)

    def __str__(self) -> str:
        return f"{self.metric}={self.value:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """A positive parameter, the standard deviation of its natural log (``log_sd``, 0: exact) and
    where it comes from (``source``: an ALGORITHMS.md tag, a run directory, a fit's data)."""

    value: float
    source: str
    log_sd: float = 0.0

    def __post_init__(self) -> None:
        require(_positive(self.value), "estimate value", self.value, "must be a positive finite number")
        require(
            isinstance(self.log_sd, (int, float)) and math.isfinite(self.log_sd) and self.log_sd >= 0,
            "estimate log_sd",
            self.log_sd,
            "must be >= 0",
        )
        require(
            isinstance(self.source, str) and self.source.strip() != "",
            "estimate source",
            self.source,
            "must say where it comes from",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Limit:
    """The largest value a family was seen to converge at, and its source."""

    value: float
    source: str

    def __post_init__(self) -> None:
        require(_positive(self.value), "limit value", self.value, "must be a positive finite number")
        require(
            isinstance(self.source, str) and self.source.strip() != "",
            "limit source",
            self.source,
            "must say where it comes from",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Where a family stops converging: total batch (samples), learners that gossip, averaging
    period (steps) and mean staleness (updates); ``None``: no limit known."""

    max_batch: Limit | None = None
    max_learners: Limit | None = None
    max_period: Limit | None = None
    max_staleness: Limit | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """Algorithms that share their limits (``"sync"``: sgd and ssgd; ``"gossip"``: the AD-PSGD family)."""

    name: str
    algorithms: tuple[str, ...]
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        require(len(self.algorithms) >= 1, "family algorithms", self.algorithms, "must name at least one algorithm")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvergenceProfile:
    """One workload's convergence model (module docstring): its parameters, its families' limits,
    and what the fit behind it reported.

    Parameters
    ----------
    workload : str
        The workload it describes (``bilstm-43m``).
    metric : {"wer", "loss"}
        What its curve measures; a :class:`Target` must name the same.
    target : float
        The workload's own target (``predict`` without ``--target``), with ``target_source``.
    samples_per_epoch : float
        :math:`N`, the samples of one epoch of the data the curve was measured on.
    floor, curve, noise_scale : Estimate
        :math:`m_\\infty`, :math:`K` (epochs times metric) and :math:`B_\\text{noise}` (samples).
    staleness_scale, learner_scale, period_scale : Estimate or None
        :math:`s_{1/2}` (updates), :math:`n_{1/2}` (learners), :math:`\\tau_{1/2}` (steps).
    metric_sd : float
        Scatter of one run's metric about the curve, in the metric's units (>= 0).
    correlation : tuple of tuple of float
        Correlation of the logs of (floor, curve, noise_scale); ``()``: independent.
    families : tuple of Family
        The algorithms covered and their limits; an algorithm in none is not covered.
    fit : mapping
        What the fit behind the profile reported (data, in-sample and leave-one-out errors).
    """

    workload: str
    metric: str
    target: float
    samples_per_epoch: float
    floor: Estimate
    curve: Estimate
    noise_scale: Estimate
    families: tuple[Family, ...]
    target_source: str = "[INF]"
    staleness_scale: Estimate | None = None
    learner_scale: Estimate | None = None
    period_scale: Estimate | None = None
    metric_sd: float = 0.0
    correlation: tuple[tuple[float, ...], ...] = ()
    fit: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        require(self.metric in METRICS, "profile metric", self.metric, f"must be one of {', '.join(METRICS)}")
        require(_positive(self.target), "profile target", self.target, "must be a positive number")
        require(_positive(self.samples_per_epoch), "samples_per_epoch", self.samples_per_epoch, "must be > 0")
        require(math.isfinite(self.metric_sd) and self.metric_sd >= 0, "metric_sd", self.metric_sd, "must be >= 0")
        seen: set[str] = set()
        for fam in self.families:
            twice = seen & set(fam.algorithms)
            require(not twice, "families", sorted(twice), "must name each algorithm in one family")
            seen |= set(fam.algorithms)
        if self.correlation:
            c = np.asarray(self.correlation, dtype=float)
            ok = (
                c.shape == (3, 3)
                and np.allclose(c, c.T)
                and np.allclose(np.diag(c), 1.0)
                and np.all(np.abs(c) <= 1 + 1e-9)
            )
            require(bool(ok), "correlation", self.correlation, "must be a symmetric 3 x 3 correlation matrix")

    @property
    def algorithms(self) -> tuple[str, ...]:
        return tuple(a for f in self.families for a in f.algorithms)

    def family_of(self, algorithm: str) -> Family | None:
        for fam in self.families:
            if algorithm in fam.algorithms:
                return fam
        return None

    def own_target(self) -> Target:
        return Target(metric=self.metric, value=self.target)

    def check_target(self, target: Target) -> None:
        """A target of another metric than the profile's is a one-line :class:`ConfigError`."""
        if target.metric != self.metric:
            raise ConfigError(
                f"target ({target}) names {target.metric}, but the convergence profile of {self.workload} "
                f"predicts {self.metric} (give --target {self.metric}=VALUE)"
            )

    def covariance(self) -> np.ndarray:
        """The log covariance of (floor, curve, noise_scale, staleness, learner, period scales)."""
        sd = np.array([e.log_sd if e is not None else 0.0 for e in self._estimates()])
        corr = np.eye(6)
        if self.correlation:
            corr[:3, :3] = np.asarray(self.correlation, dtype=float)
        return corr * np.outer(sd, sd)

    def _estimates(self) -> tuple[Estimate | None, ...]:
        return (self.floor, self.curve, self.noise_scale, self.staleness_scale, self.learner_scale, self.period_scale)

    def parameters(self) -> dict[str, Any]:
        """The parameters as JSON: value, log-sd and source of each."""
        names = ("floor", "curve", "noise_scale", "staleness_scale", "learner_scale", "period_scale")
        return {
            k: {"value": e.value, "log_sd": e.log_sd, "source": e.source}
            for k, e in zip(names, self._estimates(), strict=True)
            if e is not None
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """What the convergence model asks of a configuration: its algorithm (a registry name), total
    batch (samples per step over every worker), learners that gossip, averaging period and the
    mean staleness of its updates (from the simulator)."""

    algorithm: str
    total_batch: float
    learners: int = 1
    period: int = 1
    staleness_mean: float = 0.0

    def __post_init__(self) -> None:
        require(_positive(self.total_batch), "total_batch", self.total_batch, "must be > 0 samples")
        require(isinstance(self.learners, int) and self.learners >= 1, "learners", self.learners, "must be >= 1")
        require(isinstance(self.period, int) and self.period >= 1, "period", self.period, "must be >= 1")
        require(
            math.isfinite(self.staleness_mean) and self.staleness_mean >= 0,
            "staleness_mean",
            self.staleness_mean,
            "must be >= 0",
        )


def setting_of(algorithm: Any, batch_per_worker: int, *, staleness_mean: float = 0.0) -> Setting:
    """The :class:`Setting` of an algorithm spec (:mod:`psgdlab.core.algorithms`), asked of the
    spec: learners that gossip are its ``n_nodes`` (H-ADPSGD's super-learners) or its workers when
    it gossips (``gossip``), else 1; the period is its ``period`` where it has one.

    >>> from psgdlab.core.algorithms import algorithm_from_flags
    >>> setting_of(algorithm_from_flags("hadpsgd", 16, gpus_per_node=4), 128)
    Setting(algorithm='hadpsgd', total_batch=2048, learners=4, period=1, staleness_mean=0.0)
    """
    n = int(algorithm.n_workers)
    learners = int(getattr(algorithm, "n_nodes", n)) if getattr(algorithm, "gossip", False) else 1
    period = int(getattr(algorithm, "period", 1) or 1)
    return Setting(
        algorithm=str(algorithm.name),
        total_batch=n * int(batch_per_worker),
        learners=learners,
        period=period,
        staleness_mean=float(staleness_mean),
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """A configuration's prediction: whether it reaches the target (``reason`` and a ``short``
    form of it when not), its epochs and steps per worker to the target, and the standard
    deviation of their logarithm (``None`` when it does not reach it); ``gradient``, the
    derivatives of the log epochs in the parameters' logs (the order of
    :meth:`ConvergenceProfile.covariance`), and ``scatter_log_sd``, one run's scatter, let two
    configurations be compared with their shared uncertainty cancelled (:func:`paired_log_sd`)."""

    reaches: bool
    reason: str | None = None
    short: str | None = None
    epochs: float | None = None
    steps: float | None = None
    log_sd: float | None = None
    factors: Mapping[str, float] = field(default_factory=dict)
    gradient: tuple[float, ...] = ()
    scatter_log_sd: float = 0.0


def _not(reason: str, short: str) -> Outcome:
    return Outcome(reaches=False, reason=reason, short=short)


def _limit_outcome(profile: ConvergenceProfile, fam: Family, s: Setting) -> Outcome | None:
    """The first limit of ``fam`` that ``s`` is beyond, as an outcome; ``None`` within all."""
    lim = fam.limits
    checks = (
        (lim.max_batch, s.total_batch, "batch", "total batch {v:g} is beyond {f}'s limit {x:g} ({src})"),
        (lim.max_learners, s.learners, "learners", "{v:g} learners gossip, beyond {f}'s limit {x:g} ({src})"),
        (lim.max_period, s.period, "period", "period {v:g} is beyond {f}'s limit {x:g} ({src})"),
        (
            lim.max_staleness,
            s.staleness_mean,
            "staleness",
            "mean staleness {v:.3g} updates is beyond {f}'s limit {x:g} ({src})",
        ),
    )
    for limit, value, what, text in checks:
        if limit is not None and value > limit.value * (1 + 1e-12):
            reason = text.format(v=value, f=f"{s.algorithm} ({fam.name})", x=limit.value, src=limit.source)
            return _not(reason, f"{what}>{limit.value:g}")
    return None


def predict_steps(profile: ConvergenceProfile, setting: Setting, target: Target) -> Outcome:
    """Epochs and steps per worker for ``setting`` to reach ``target`` (module docstring), or
    why it does not.

    Raises
    ------
    ConfigError
        ``target`` names another metric than the profile's.
    """
    profile.check_target(target)
    fam = profile.family_of(setting.algorithm)
    if fam is None:
        covered = ", ".join(profile.algorithms)
        return _not(
            f"no convergence model for {setting.algorithm} on {profile.workload} (its profile covers {covered})",
            "no model",
        )
    limited = _limit_outcome(profile, fam, setting)
    if limited is not None:
        return limited
    m, floor = target.value, profile.floor.value
    if m <= floor:
        return _not(
            f"target {target} is at or below the model's floor {profile.metric}={floor:.4g} "
            f"({profile.floor.source}): no amount of training reaches it",
            "below floor",
        )
    factors, grad = _factors(profile, setting, m)
    epochs = float(np.prod(list(factors.values())))
    cov = profile.covariance()
    scatter = profile.metric_sd / (m - floor)
    var = float(grad @ cov @ grad) + scatter**2
    steps = epochs * profile.samples_per_epoch / setting.total_batch
    return Outcome(
        reaches=True,
        epochs=epochs,
        steps=steps,
        log_sd=math.sqrt(var),
        factors=factors,
        gradient=tuple(float(x) for x in grad),
        scatter_log_sd=scatter,
    )


def _factors(profile: ConvergenceProfile, s: Setting, m: float) -> tuple[dict[str, float], np.ndarray]:
    """The factors of the epochs and the derivatives of their log in the parameters' logs
    (floor, curve, noise_scale, staleness_scale, learner_scale, period_scale)."""
    floor, K, Bn = profile.floor.value, profile.curve.value, profile.noise_scale.value
    b = s.total_batch / Bn
    grad = np.zeros(6)
    factors = {"epochs_min": K / (m - floor), "batch": 1.0 + b}
    grad[0] = floor / (m - floor)
    grad[1] = 1.0
    grad[2] = -b / (1.0 + b)
    extra = (
        (3, profile.staleness_scale, s.staleness_mean, 1, "staleness"),
        (4, profile.learner_scale, float(s.learners - 1), 2, "learners"),
        (5, profile.period_scale, float(s.period - 1), 1, "period"),
    )
    for i, est, x, power, name in extra:
        if est is None:
            continue
        u = (x / est.value) ** power
        factors[name] = 1.0 + u
        grad[i] = -power * u / (1.0 + u)
    return factors, grad


def paired_log_sd(a: PredictionRow, b: PredictionRow, covariance: np.ndarray) -> float:
    r"""The standard deviation of :math:`\log(t_a/t_b)`, the ratio of two rows' times to target
    (rows that reach it, :func:`target_columns`): the convergence parameters both share cancel but
    for the difference of their effects, :math:`(g_a - g_b)^\top\Sigma(g_a - g_b)`; each run's
    scatter and each row's simulated-window and run-to-run noise add; the throughput's parameter
    parts are taken as moving both rows the same way (:math:`(s_a - s_b)^2`). A row without
    intervals has none of those parts; a row that does not reach the target is a
    :class:`ConfigError` (it has no time to compare).
    """
    ta, tb = _log_sd_of(a), _log_sd_of(b)
    d = np.asarray(ta.gradient, dtype=float) - np.asarray(tb.gradient, dtype=float)
    var = float(d @ covariance @ d) + ta.scatter**2 + tb.scatter**2
    la, lb = _interval_log_sd(a), _interval_log_sd(b)
    for part in ("step_time_simulation", "step_time_run_to_run"):
        var += la.get(part, 0.0) ** 2 + lb.get(part, 0.0) ** 2
    var += (la.get("step_time_parameters", 0.0) - lb.get("step_time_parameters", 0.0)) ** 2
    return math.sqrt(var)


def _log_sd_of(row: PredictionRow) -> TargetLogSd:
    got = row.to_target.target_log_sd if row.to_target is not None else None
    if got is None:
        raise ConfigError(f"row {row.algorithm} x{row.workers} does not reach a target: it has no time to compare")
    return got


def _interval_log_sd(row: PredictionRow) -> dict[str, float]:
    return row.intervals.interval.log_sd.to_json() if row.intervals is not None else {}


def target_columns(
    outcome: Outcome, target: Target, *, step_time_s: float, step_time_log_sd: float, workers: int
) -> TargetColumns:
    r"""The time to ``target`` (:class:`~psgdlab.core.records.rows.TargetColumns`, the row keys of
    :data:`TARGET_KEYS` and more) of a configuration whose mean step time is
    ``step_time_s`` (log-sd ``step_time_log_sd``, the throughput's interval) on ``workers``
    devices: time to target :math:`= S\,T`, GPU-hours :math:`= S\,T\,n/3600`, and their 90 %
    intervals :math:`v e^{\pm z s}` with :math:`s^2` the sum of the two log variances (the
    convergence model's and the throughput's are independent). Every figure is ``None`` where
    the target is not reached.

    >>> o = Outcome(reaches=True, epochs=2.0, steps=100.0, log_sd=0.3)
    >>> c = target_columns(o, Target(metric="loss", value=1.0), step_time_s=0.5, step_time_log_sd=0.4, workers=4)
    >>> c["time_to_target_s"], round(c["time_to_target_s_high"] / c["time_to_target_s"], 3)  # e^(1.645 * 0.5)
    (50.0, 2.276)
    """
    if not outcome.reaches:
        return TargetColumns(
            target=str(target), reaches_target=False, target_reason=outcome.reason, target_short_reason=outcome.short
        )
    assert outcome.steps is not None and outcome.log_sd is not None
    s = math.sqrt(outcome.log_sd**2 + step_time_log_sd**2)
    t = outcome.steps * step_time_s
    gpu_h = t * workers / 3600.0
    spread = math.exp(_Z * s)
    return TargetColumns(
        target=str(target),
        reaches_target=True,
        target_reason=outcome.reason,
        steps_to_target=outcome.steps,
        epochs_to_target=outcome.epochs,
        time_to_target_s=t,
        time_to_target_s_low=t / spread,
        time_to_target_s_high=t * spread,
        gpu_hours_to_target=gpu_h,
        gpu_hours_to_target_low=gpu_h / spread,
        gpu_hours_to_target_high=gpu_h * spread,
        target_log_sd=TargetLogSd(
            convergence=outcome.log_sd,
            throughput=step_time_log_sd,
            total=s,
            gradient=tuple(outcome.gradient),
            scatter=outcome.scatter_log_sd,
        ),
        target_factors=dict(outcome.factors),
    )
