r"""Prediction intervals: how far a predicted step time, throughput, speedup or time to train
may be off, at 90 %, from the profile's parameter uncertainty and from run-to-run noise.

Everything is done on the log scale, where the three sources add as independent variances, and
an interval is log-normal, :math:`v\,e^{\pm z s}` with :math:`z = 1.645` (so it stays positive
and always holds the point value :math:`v`). For a configuration of ``n`` workers, step time
:math:`T`, and the single-worker baseline's step time :math:`T_b`,

.. math::
    \log \text{samples/s} = \log(n b) - \log T, \qquad
    \log \text{speedup} = \log n + \log T_b - \log T,

so the step time, samples/s, epoch time and time to train share one log-sd :math:`s_T`, and the
speedup has its own, :math:`s_S`:

.. math::
    s_T^2 = \sum_i d_i^2 + \sigma_\text{sim}^2 + \log(1 + c^2), \qquad
    s_S^2 = \sum_i (d_i - d_{b,i})^2 + \sigma_{\text{sim},S}^2 + 2\log(1 + c^2).

**Parameters** (:math:`d_i`). The profile's ``[uncertainty]`` table
(:class:`~psgdlab.core.platform.profile.Uncertainty`) says :math:`\log\theta \sim N(\log\hat\theta,
\Sigma)`. :math:`\Sigma = \sum_i \lambda_i v_i v_i^\top` is split into its principal directions
(:func:`directions`; those with :math:`\lambda_i \le 10^{-12}\max\lambda` are left out); along
:math:`u_i = \sqrt{\lambda_i}\, v_i`, one standard deviation, the log step time is independent
across :math:`i`, and the delta method takes its sensitivity as a central secant,

.. math::
    d_i = \tfrac12\,\bigl(\log T(\hat\theta e^{+u_i}) - \log T(\hat\theta e^{-u_i})\bigr),

each side re-simulated with the same seed (common random numbers: the same compute draws,
peers and straggler events, so the difference is the parameters' effect, not noise) over a
shorter window than the prediction's (:func:`central_sensitivities` takes the simulation as a
function; :mod:`psgdlab.sim.predict` chooses the window). A correlation enters through the
directions: two perfectly correlated parameters are one direction. The speedup uses the
difference of the row's and the baseline's sensitivities *to the same direction* (a parameter
that scales every step's compute moves both and cancels in the ratio), never independent errors.
Parameters act through the simulated step time only: one that changes nothing but the size of
an epoch (``workload.samples_per_epoch``, ``workload.epochs``) has no sensitivity here.
Why finite differences along principal directions: they are what the simulator would say under
each parameter set (queueing, overlap and waiting for the slowest worker included, which a
phase decomposition of one trace misses), and their cost is two short simulations per direction
(:math:`\operatorname{rank}\Sigma \le` the number of parameters), not per Monte-Carlo draw. A
secant over :math:`\pm 1` sd rather than a derivative keeps the curvature that a kink (compute
turning into communication bound) puts inside the interval's range. The tests check the result
against Monte-Carlo quantiles (parameter sets drawn from the log-normal, each simulated).

**Simulator noise** (:math:`\sigma_\text{sim}`). The simulator draws compute times from
distributions, so the mean step time of a finite window is itself random. Its standard error is
taken by *batch means* (:func:`batch_log_step_times`): the timed steps are cut into up to
:data:`BATCHES` batches of equal length, a whole number of the algorithm's sync periods each (so
every batch holds the same number of synchronisations), and :math:`\sigma^2_\text{sim}` is the
variance of the batches' log step times over their number. For the speedup, the row's and the
baseline's batches are paired when they cover the same steps (the baseline and the row share the
random streams of worker 0; a 1-worker row *is* the baseline): the variance of the batches'
log ratio over their number (:func:`simulation_log_var`).

**Run-to-run noise** (:math:`c`): the profile's ``noise_cv``, what a measured mean step time
scatters by about its prediction: between runs of the same configuration or, in a fitted
profile where that is larger, the model's residual over the figures or runs it was fitted from;
a measured speedup is the ratio of two measurements, hence the factor 2. A profile without an
``[uncertainty]`` table takes its parameters as exact and its ``noise_cv`` as 0; the interval
is then the simulator's noise alone, and the row says so (:func:`interval_description`).

Examples
--------
>>> from psgdlab.core.platform.profile import Profile, Platform, Workload, Uncertainty
>>> u = Uncertainty(parameters=("platform.nic.bandwidth_bytes_per_s", "platform.nic.latency_s"),
...                 log_sd=(0.1, 0.2), correlation=((1.0, 1.0), (1.0, 1.0)))
>>> [{k: round(v, 3) for k, v in d.items()} for d in directions(u)]  # one direction: correlated
[{'platform.nic.bandwidth_bytes_per_s': 0.1, 'platform.nic.latency_s': 0.2}]
>>> lo, hi = log_normal_interval(2.0, 0.1)
>>> round(lo, 3), round(hi, 3)
(1.697, 2.358)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.profile import Profile, Uncertainty
from psgdlab.core.records.trace import PHASES

__all__ = [
    "LEVEL",
    "Z",
    "BATCHES",
    "INTERVAL_KEYS",
    "Spread",
    "directions",
    "shifted",
    "central_sensitivities",
    "batch_log_step_times",
    "log_step_time",
    "simulation_log_var",
    "log_normal_interval",
    "row_intervals",
    "interval_description",
]

#: the intervals' coverage
LEVEL = 0.9
#: the standard normal's 95 % quantile: a two-sided 90 % interval is :math:`\pm Z` sd
Z = 1.6448536269514722
#: the most batches a window's timed steps are cut into for the batch-means standard error
BATCHES = 10
#: the row keys that get ``KEY_low`` and ``KEY_high``
INTERVAL_KEYS = ("step_time_s", "samples_per_s", "speedup", "epoch_time_s", "time_to_train_s")
_RELATIVE_EIGEN_FLOOR = 1e-12


@dataclass(frozen=True, slots=True)
class Spread:
    """What one simulated configuration knows about its own uncertainty.

    Parameters
    ----------
    batch_bounds : tuple of int
        Step offsets (from the first timed step) that cut the window into batches; ``()`` when
        the window is too short for two batches.
    log_batches : numpy.ndarray
        The log step time of each batch (one fewer than ``batch_bounds``).
    sensitivities : tuple of float
        :math:`d_i`, the change of the log step time along each of :func:`directions` (one sd).
    """

    batch_bounds: tuple[int, ...]
    log_batches: np.ndarray
    sensitivities: tuple[float, ...]


def directions(uncertainty: Uncertainty | None) -> tuple[dict[str, float], ...]:
    r"""One standard deviation along each principal direction of the parameters' log covariance,
    as log shifts by path: :math:`u_i = \sqrt{\lambda_i} v_i` for the eigenpairs of
    :meth:`~psgdlab.core.platform.profile.Uncertainty.covariance` with :math:`\lambda_i` above
    :math:`10^{-12}` of the largest (a parameter with log-sd 0 or a perfectly correlated pair
    adds no direction). ``()`` without uncertainty."""
    if uncertainty is None or not uncertainty.parameters:
        return ()
    cov = np.asarray(uncertainty.covariance(), dtype=float)
    lam, vec = np.linalg.eigh(cov)
    top = float(lam.max()) if lam.size else 0.0
    if top <= 0:
        return ()
    out = []
    for i in np.argsort(lam)[::-1]:
        if lam[i] <= _RELATIVE_EIGEN_FLOOR * top:
            continue
        u = math.sqrt(float(lam[i])) * vec[:, i]
        u = u if u[np.argmax(np.abs(u))] > 0 else -u  # a fixed sign: the largest entry positive
        out.append({p: float(x) for p, x in zip(uncertainty.parameters, u, strict=True) if x != 0.0})
    return tuple(out)


def shifted(profile: Profile, shift: Mapping[str, float], sign: float = 1.0) -> Profile:
    r"""The profile with each value at a path of ``shift`` multiplied by
    :math:`e^{\text{sign}\cdot\text{shift}}` (an integer value is rounded, and kept >= 1).
    A value the shift takes out of its dataclass's range (an efficiency above 1) raises
    :class:`~psgdlab.core.errors.ConfigError`. The compute time is set again by the device's law
    (:meth:`~psgdlab.core.platform.profile.Profile.resolved`), so a shifted efficiency reaches it."""
    values: dict[str, Any] = {}
    for path, s in shift.items():
        v = profile.get(path)
        x = v * math.exp(sign * s)
        values[path] = max(1, round(x)) if isinstance(v, int) and not isinstance(v, bool) else x
    return profile.with_values(values).resolved()


def central_sensitivities(
    log_step_time: Callable[[Profile], float],
    profile: Profile,
    shifts: Sequence[Mapping[str, float]],
) -> tuple[float, ...]:
    r""":math:`d_i` for each direction of ``shifts`` (module docstring): half the difference of
    ``log_step_time`` at the profile shifted by :math:`+u_i` and :math:`-u_i`. Where one side
    leaves a parameter's range (:class:`~psgdlab.core.errors.ConfigError` from the profile), the
    other side and the unshifted profile give a one-sided secant; where both do, the error is
    raised."""
    out: list[float] = []
    centre: float | None = None
    # comments and the uncertainty play no part in a simulation, and checking them (their paths,
    # with close matches for the error message) costs more than a short simulation
    profile = dataclasses.replace(profile, provenance={}, uncertainty=None)
    for shift in shifts:
        sides: dict[float, float] = {}
        errors: list[ConfigError] = []
        for sign in (1.0, -1.0):
            try:
                p = shifted(profile, shift, sign)
            except ConfigError as exc:
                errors.append(exc)
                continue
            sides[sign] = log_step_time(p)
        if len(sides) == 2:
            out.append(0.5 * (sides[1.0] - sides[-1.0]))
            continue
        if not sides:
            raise errors[0]
        if centre is None:
            centre = log_step_time(profile)
        ((sign, value),) = sides.items()
        out.append(sign * (value - centre))
    return tuple(out)


def batch_log_step_times(
    trace: np.ndarray, *, warmup_steps: int, period: int = 1, batches: int = BATCHES
) -> tuple[tuple[int, ...], np.ndarray]:
    r"""Batch means of a trace's step time: ``(bounds, log step time of each batch)``.

    The timed steps (from ``warmup_steps``) of every worker are cut at the same step offsets
    ``bounds`` into at most ``batches`` batches of equal length, each a whole number of
    ``period`` steps (so every batch holds as many synchronisations). A batch's step time is
    that of :func:`psgdlab.core.records.trace.summarize`'s throughput: :math:`n` over the sum of the
    workers' rates in the batch (steps over the time between the compute starts that bound
    it). Fewer than two batches fit: ``((), empty)``.

    Examples
    --------
    >>> from psgdlab.core.records.trace import TRACE_DTYPE
    >>> t = np.zeros(6, dtype=TRACE_DTYPE)
    >>> t["phase"], t["step"], t["start_s"] = PHASES["compute"], range(6), [0, 1, 2, 4, 6, 8]
    >>> bounds, logs = batch_log_step_times(t, warmup_steps=1, batches=2)
    >>> bounds, np.exp(logs).round(3).tolist()
    ((0, 2, 4), [1.5, 2.0])
    """
    empty: tuple[tuple[int, ...], np.ndarray] = ((), np.zeros(0))
    timed = _timed_starts(trace, warmup_steps)
    intervals = timed.shape[1] - 1  # step intervals every worker has
    period = max(1, int(period))
    units = intervals // period
    k = min(batches, units)
    if k < 2:
        return empty
    size = (units // k) * period
    bounds = tuple(range(0, k * size + 1, size))
    edges = timed[:, list(bounds)]
    durations = np.diff(edges, axis=1)  # (workers, batches)
    if np.any(durations <= 0):
        return empty
    rates = size / durations
    return bounds, np.log(timed.shape[0] / rates.sum(axis=0))


def log_step_time(trace: np.ndarray, *, warmup_steps: int) -> float:
    r"""The log of a window's mean step time as :func:`psgdlab.core.records.trace.summarize` reads its
    throughput (:math:`n` over the sum of the workers' rates over their timed compute starts),
    from the steps every worker has; ``nan`` with fewer than two of them."""
    timed = _timed_starts(trace, warmup_steps)
    if timed.shape[1] < 2:
        return math.nan
    spans = timed[:, -1] - timed[:, 0]
    if np.any(spans <= 0):
        return math.nan
    return math.log(timed.shape[0] / float(np.sum((timed.shape[1] - 1) / spans)))


def _timed_starts(trace: np.ndarray, warmup_steps: int) -> np.ndarray:
    """Compute start times, ``(workers, steps)``, of the steps from ``warmup_steps`` on that every
    worker has (a worker's missing step cuts the window there)."""
    comp = trace[trace["phase"] == PHASES["compute"]]
    if comp.size == 0:
        return np.zeros((0, 0))
    ranks = np.unique(comp["rank"])
    starts = np.full((ranks.size, int(comp["step"].max()) + 1), np.nan)
    starts[np.searchsorted(ranks, comp["rank"]), comp["step"]] = comp["start_s"]
    timed = starts[:, warmup_steps:]
    missing = np.isnan(timed).any(axis=0)
    return timed[:, : int(np.argmax(missing))] if missing.any() else timed


def simulation_log_var(row: Spread, base: Spread | None = None) -> float:
    r"""Variance of the log of a window's mean step time (``base`` ``None``), or of the log ratio
    of the baseline's to the row's (a speedup), by batch means: the batches' variance over their
    number; paired batch by batch when both cut the same steps, else the two added."""

    def var(x: np.ndarray) -> float:
        return float(np.var(x, ddof=1)) / x.size if x.size >= 2 else 0.0

    if base is None:
        return var(row.log_batches)
    if row.batch_bounds and row.batch_bounds == base.batch_bounds:
        return var(base.log_batches - row.log_batches)
    return var(row.log_batches) + var(base.log_batches)


def log_normal_interval(value: float, log_sd: float, z: float = Z) -> tuple[float, float]:
    """``(value * exp(-z log_sd), value * exp(z log_sd))``."""
    return value * math.exp(-z * log_sd), value * math.exp(z * log_sd)


def row_intervals(
    values: Mapping[str, float], row: Spread, base: Spread, *, noise_cv: float = 0.0
) -> tuple[dict[str, float], dict[str, float]]:
    r"""The interval keys of one predicted row and the log-sds behind them.

    Parameters
    ----------
    values : mapping
        The row's :data:`INTERVAL_KEYS`.
    row, base : Spread
        The configuration's and the single-worker baseline's (same directions, same order).
    noise_cv : float
        Run-to-run relative sd of a measured mean step time.

    Returns
    -------
    keys : dict
        ``KEY_low`` and ``KEY_high`` for each of :data:`INTERVAL_KEYS`.
    log_sd : dict
        ``step_time`` (:math:`s_T`) and ``speedup`` (:math:`s_S`), and the parts of each:
        ``*_parameters``, ``*_simulation``, ``*_run_to_run``.
    """
    d = np.asarray(row.sensitivities, dtype=float)
    db = np.asarray(base.sensitivities, dtype=float)
    run = math.log1p(noise_cv * noise_cv)
    parts = {
        "step_time_parameters": float(np.sum(d * d)),
        "step_time_simulation": simulation_log_var(row),
        "step_time_run_to_run": run,
        "speedup_parameters": float(np.sum((d - db) ** 2)),
        "speedup_simulation": simulation_log_var(row, base),
        "speedup_run_to_run": 2.0 * run,
    }
    s_t = math.sqrt(sum(v for k, v in parts.items() if k.startswith("step_time")))
    s_s = math.sqrt(sum(v for k, v in parts.items() if k.startswith("speedup")))
    keys: dict[str, float] = {}
    for key in INTERVAL_KEYS:
        keys[f"{key}_low"], keys[f"{key}_high"] = log_normal_interval(values[key], s_s if key == "speedup" else s_t)
    log_sd = {"step_time": s_t, "speedup": s_s, **{k: math.sqrt(v) for k, v in parts.items()}}
    return keys, log_sd


def interval_description(uncertainty: Uncertainty | None, n_directions: int) -> dict[str, Any]:
    """What a row's interval contains (the ``interval`` key of a prediction's row, without its
    log-sds)."""
    exact = uncertainty is None or not any(uncertainty.log_sd)
    return {
        "level": LEVEL,
        "method": "delta method on the log scale: central secants over +-1 sd along the principal "
        "directions of the parameters' log covariance (re-simulated, common random numbers) + "
        "batch-means standard error of the simulated window + run-to-run noise; log-normal bounds",
        "parameters": list(uncertainty.parameters) if uncertainty is not None else [],
        "parameters_exact": exact,
        "directions": n_directions,
        "unpinned": list(uncertainty.unpinned) if uncertainty is not None else [],
        "noise_cv": uncertainty.noise_cv if uncertainty is not None else 0.0,
        "noise_processes_per_core": uncertainty.noise_processes_per_core if uncertainty is not None else None,
    }
