r"""Fitting a few positive parameters to observed figures, and what the fit knows about itself.

A model predicts ``n`` figures (speedups, step times) from ``k`` positive parameters; each
parameter has a prior, a value with a spread (a spec-sheet figure, an efficiency of typical size).
:func:`fit_parameters` works on the logarithms :math:`z = \log\theta` and minimises

.. math::
    \sum_i \Bigl(\frac{\log \hat y_i(z) - \log y_i}{\sigma}\Bigr)^2
    + \sum_j \Bigl(\frac{z_j - z_{0j}}{s_j}\Bigr)^2

(a maximum a posteriori fit with log-normal priors :math:`z_j \sim N(z_{0j}, s_j^2)` and relative
errors of the figures of spread :math:`\sigma`). Where the figures cannot tell parameters apart
(a *flat direction*: scaling every speed of a platform leaves its speedups unchanged) the prior
keeps them at their spec-sheet values instead of letting them drift to invented ones.

What it reports (:class:`FitReport`):

- **uncertainty**: the posterior covariance of :math:`z`,
  :math:`(J^\top J/\sigma^2 + \mathrm{diag}(1/s^2))^{-1}` with :math:`J` the Jacobian of the
  log predictions (finite differences); :math:`\sigma` is the larger of the stated figure noise
  and the fit's own residual spread (a model that cannot reach its figures is not more certain
  than its residuals say);
- **unpinned** parameters: those whose posterior spread is more than half their prior's (the data
  narrowed them by less than half), and the **flat directions**: eigenvectors of the data's
  information :math:`J^\top J/\sigma^2` whose spread :math:`1/\sqrt\lambda` exceeds the typical
  prior spread;
- **errors**: relative errors :math:`\hat y/y - 1` in sample, leave-one-out (each figure predicted
  by a fit without it) and leave-one-group-out (each group of figures -- one worker count, one
  algorithm, one batch, one period -- predicted by a fit without the group). A refit takes a few
  Gauss-Newton steps from the full fit with its Jacobian, on the model's own residuals, and the
  left-out figures are then predicted by the model itself.

Examples
--------
>>> import numpy as np
>>> x = np.array([1.0, 2.0, 4.0, 8.0])
>>> y = 3.0 * x**0.5
>>> model = lambda p, rows: p["a"] * x[rows] ** 0.5
>>> r = fit_parameters(model, y, {"a": 1.0}, {"a": 2.0}, noise=0.01)
>>> round(r.values["a"], 3), r.unpinned
(3.0, ())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from psgdlab.core.errors import require

__all__ = ["FitReport", "fit_parameters", "median_abs"]

#: a model: parameter values by name, and the indices of the figures to predict -> predictions
Model = Callable[[dict[str, float], np.ndarray], np.ndarray]
#: posterior spread above this fraction of the prior's: the data did not pin the parameter
UNPINNED_RATIO = 0.5


def median_abs(errors: Mapping[int, float] | Sequence[float] | np.ndarray) -> float:
    values = list(errors.values()) if isinstance(errors, Mapping) else list(errors)
    return float(np.median(np.abs(values))) if values else float("nan")


@dataclass(frozen=True, slots=True)
class FitReport:
    """A fit's values and what it knows about itself (module docstring)."""

    names: tuple[str, ...]
    values: dict[str, float]
    prior: dict[str, float]
    prior_log_sd: dict[str, float]
    log_sd: dict[str, float]
    correlation: tuple[tuple[float, ...], ...]
    unpinned: tuple[str, ...]
    flat_directions: tuple[dict[str, float], ...]
    noise: float
    predictions: np.ndarray
    in_sample: dict[int, float]
    loo: dict[int, float] = field(default_factory=dict)
    logo: dict[str, dict[Hashable, dict[int, float]]] = field(default_factory=dict)

    @property
    def in_sample_error(self) -> float:
        return median_abs(self.in_sample)

    @property
    def loo_error(self) -> float:
        return median_abs(self.loo)

    def logo_errors(self, grouping: str | None = None) -> list[float]:
        """Each figure's error when its group was left out, for one ``grouping`` or pooled over
        every grouping (a figure appears once per grouping)."""
        groups = [self.logo[grouping]] if grouping is not None else list(self.logo.values())
        return [e for by_group in groups for errs in by_group.values() for e in errs.values()]

    @property
    def logo_error(self) -> float:
        return median_abs(self.logo_errors())


@dataclass(frozen=True, slots=True)
class _Problem:
    """The MAP objective of a fit (module docstring) in log parameters ``z``."""

    model: Model
    y: np.ndarray
    names: tuple[str, ...]
    z0: np.ndarray
    s: np.ndarray
    noise: float
    lo: np.ndarray
    hi: np.ndarray

    def log_predictions(self, z: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return np.log(self.model(dict(zip(self.names, np.exp(z).tolist())), rows))

    def residual(self, z: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Scaled misfits of the figures ``rows``, then the prior's."""
        fit = (self.log_predictions(z, rows) - np.log(self.y[rows])) / self.noise
        return np.concatenate([fit, (z - self.z0) / self.s])

    def solve(self, rows: np.ndarray, start: np.ndarray, max_nfev: int, diff_step: float) -> np.ndarray:
        from scipy.optimize import least_squares

        start = np.clip(start, self.lo + 1e-9, self.hi - 1e-9)
        sol = least_squares(
            lambda z: self.residual(z, rows),
            start,
            bounds=(self.lo, self.hi),
            diff_step=diff_step,
            max_nfev=max_nfev,
            x_scale=self.s,
        )
        return np.asarray(sol.x)

    def gauss_newton(self, rows: np.ndarray, start: np.ndarray, J: np.ndarray, steps: int) -> np.ndarray:
        """Gauss-Newton steps on ``rows`` with a fixed Jacobian ``J`` (its rows for ``rows``),
        from ``start``; each step is the bounded linear least-squares step
        (:func:`scipy.optimize.lsq_linear`), so a parameter at a bound stays there and the others
        move as the bounded problem says."""
        from scipy.optimize import lsq_linear

        A = np.vstack([J / self.noise, np.diag(1.0 / self.s)])
        z = start.copy()
        for _ in range(steps):
            dz = lsq_linear(A, -self.residual(z, rows), bounds=(self.lo - z, self.hi - z)).x
            z = np.clip(z + dz, self.lo, self.hi)
            if np.max(np.abs(dz)) < 1e-4:
                break
        return z

    def jacobian(self, z: np.ndarray, rows: np.ndarray, step: float) -> np.ndarray:
        """Central differences of the log predictions in log parameters (one-sided at a bound)."""
        cols = []
        for j in range(len(z)):
            up, down = z.copy(), z.copy()
            up[j] = min(z[j] + step, self.hi[j])
            down[j] = max(z[j] - step, self.lo[j])
            cols.append((self.log_predictions(up, rows) - self.log_predictions(down, rows)) / (up[j] - down[j]))
        return np.column_stack(cols)


def fit_parameters(
    model: Model,
    observed: Sequence[float] | np.ndarray,
    prior: Mapping[str, float],
    prior_log_sd: Mapping[str, float],
    *,
    noise: float = 0.02,
    bounds: Mapping[str, tuple[float, float]] | None = None,
    groups: Mapping[str, Sequence[Hashable]] | None = None,
    loo: bool = False,
    max_nfev: int = 60,
    cv_steps: int = 3,
    diff_step: float = 0.05,
    progress: Callable[[str], None] | None = None,
) -> FitReport:
    """Fit the parameters of ``prior`` to ``observed`` (module docstring).

    Parameters
    ----------
    model : callable
        ``model(values, rows)`` -> predictions of the figures ``rows`` (indices), positive.
    observed : sequence of float
        The figures, positive.
    prior, prior_log_sd : mapping
        Each parameter's prior value (positive) and the spread of its logarithm (> 0).
    noise : float
        Relative spread of the figures (published speedups to two decimals, run-to-run noise).
    bounds : mapping, optional
        ``(low, high)`` per parameter (an efficiency: ``(1e-3, 1.0)``).
    groups : mapping, optional
        For leave-one-group-out: a label per figure for each grouping (``{"workers": [...]}``).
    loo : bool
        Also leave each figure out in turn.
    max_nfev : int
        Model evaluations of the full fit.
    cv_steps : int
        Gauss-Newton steps of each cross-validation refit: from the full fit, with its Jacobian
        and the model's residuals on the kept figures (a linearised refit: exact for a model
        linear in the log parameters; each step costs one evaluation of the kept figures).
    diff_step : float
        Step in log parameters for the finite differences (the simulator is noisy at small ones).
    """
    problem = _problem(model, observed, prior, prior_log_sd, noise=noise, bounds=bounds)
    rows = np.arange(problem.y.size)
    z = problem.solve(rows, problem.z0.copy(), max_nfev, diff_step)
    report, J = _posterior_report(problem, z, prior, prior_log_sd, diff_step=diff_step)
    # the refits of the cross-validation: from the full fit, at the fit's noise
    refits = dataclasses.replace(problem, noise=report.noise)

    def held_out(mask: np.ndarray) -> dict[int, float]:
        return _held_out(refits, mask, z, J, cv_steps)

    n = problem.y.size
    if loo:
        for i in range(n):
            report.loo.update(held_out(rows == i))
            if progress is not None:
                progress(f"leave out figure {i + 1}/{n}")
    for grouping, labels in (groups or {}).items():
        require(len(labels) == n, f"groups[{grouping}]", len(labels), f"must give one label per figure ({n})")
        labels_arr = np.array([str(x) for x in labels])
        distinct = list(dict.fromkeys(labels_arr.tolist()))
        if len(distinct) < 2:
            continue
        report.logo[grouping] = {}
        for g in distinct:
            report.logo[grouping][g] = held_out(labels_arr == g)
            if progress is not None:
                progress(f"leave out {grouping}={g}")
    return report


def _problem(
    model: Model,
    observed: Sequence[float] | np.ndarray,
    prior: Mapping[str, float],
    prior_log_sd: Mapping[str, float],
    *,
    noise: float,
    bounds: Mapping[str, tuple[float, float]] | None,
) -> _Problem:
    """The objective of :func:`fit_parameters`, its inputs checked (positive figures and priors,
    positive spreads and noise) and the bounds in log parameters."""
    y = np.asarray(observed, dtype=float)
    names = tuple(prior)
    require(y.size >= 1 and bool(np.all(y > 0)), "observed", observed, "must be positive figures")
    for k in names:
        require(prior[k] > 0, f"prior of {k}", prior[k], "must be positive")
        require(prior_log_sd.get(k, 0) > 0, f"prior spread of {k}", prior_log_sd.get(k), "must be > 0")
    require(noise > 0, "noise", noise, "must be > 0")
    z0 = np.log([prior[k] for k in names])
    s = np.array([prior_log_sd[k] for k in names])
    b = bounds or {}
    lo = np.array([np.log(b[k][0]) if k in b and b[k][0] > 0 else -np.inf for k in names])
    hi = np.array([np.log(b[k][1]) if k in b else np.inf for k in names])
    return _Problem(model, y, names, z0, s, noise, lo, hi)


def _posterior_report(
    problem: _Problem,
    z: np.ndarray,
    prior: Mapping[str, float],
    prior_log_sd: Mapping[str, float],
    *,
    diff_step: float,
) -> tuple[FitReport, np.ndarray]:
    """What the fit ``z`` knows about itself (module docstring): the report without its
    cross-validation, and the Jacobian of the log predictions at ``z``."""
    y, names, s = problem.y, problem.names, problem.s
    n = y.size
    rows = np.arange(n)
    values = dict(zip(names, np.exp(z).tolist()))
    pred = problem.model(values, rows)
    resid = np.log(pred) - np.log(y)
    dof = max(1, n - len(names))
    sigma = max(problem.noise, float(np.sqrt(np.sum(resid**2) / dof)))
    J = problem.jacobian(z, rows, diff_step)
    info = J.T @ J / sigma**2
    cov = np.linalg.inv(info + np.diag(1.0 / s**2))
    sd = np.sqrt(np.diag(cov))
    corr = cov / np.outer(sd, sd)
    unpinned = tuple(k for k, a, p in zip(names, sd, s) if a > UNPINNED_RATIO * p)
    lam, vec = np.linalg.eigh(info)
    typical = float(np.median(s))
    flat = tuple(
        {k: round(float(v), 3) for k, v in zip(names, vec[:, i])}
        for i in range(len(lam))
        if lam[i] <= 0 or 1.0 / np.sqrt(lam[i]) > typical
    )
    report = FitReport(
        names=names,
        values=values,
        prior=dict(prior),
        prior_log_sd=dict(prior_log_sd),
        log_sd=dict(zip(names, sd.tolist())),
        correlation=tuple(tuple(float(x) for x in row) for row in corr),
        unpinned=unpinned,
        flat_directions=flat,
        noise=sigma,
        predictions=pred,
        in_sample={i: float(pred[i] / y[i] - 1.0) for i in range(n)},
    )
    return report, J


def _held_out(problem: _Problem, mask: np.ndarray, z: np.ndarray, J: np.ndarray, cv_steps: int) -> dict[int, float]:
    """The relative errors of the figures ``mask`` predicted by a refit without them (a few
    Gauss-Newton steps from the full fit ``z`` with its Jacobian ``J``); none when nothing is kept."""
    rows = np.arange(problem.y.size)
    train = rows[~mask]
    test = rows[mask]
    if train.size == 0:
        return {}
    zt = problem.gauss_newton(train, z, J[train], cv_steps)
    p = problem.model(dict(zip(problem.names, np.exp(zt).tolist())), test)
    return {int(i): float(v / problem.y[i] - 1.0) for i, v in zip(test, p)}
