r"""Fit a platform's efficiencies to published or measured figures, with cross-validated errors.

A *figures table* (CSV, ``#`` comment lines allowed) has one row per configuration: the columns
``algorithm``, ``workers``, ``batch`` (per worker), ``period`` (empty where the algorithm has
none) and one of ``speedup`` (over one-worker SGD at the same batch) or ``step_time_s`` (mean
time per local step). :func:`read_figures` reads it; :func:`simulate_figures` predicts each row
with the simulator (:func:`~psgdlab.sim.predict.predict_one`, the mean over ``seeds``, windows of
``blocks`` sync periods and at least ``MIN_STEPS`` steps, common random numbers across
parameter values).

:func:`fit_profile` fits a few positive values of a base profile, named by dotted path (the
efficiencies of :class:`~psgdlab.core.platform.profile.Platform` and its links, a jitter), with
:func:`psgdlab.core.stats.fitting.fit_parameters`: log-normal priors at the base profile's values,
the posterior uncertainty of each, the parameters the figures cannot pin down (kept near their
prior and marked unpinned), and the errors in sample, leave-one-out and leave-one-group-out
(groups: each worker count, algorithm, batch and period the table has more than one of). The
fitted profile carries them in its ``[uncertainty]`` table and its header.

``psgdlab fit`` is the command; ``python -m psgdlab.sim.fit`` regenerates the shipped
``librispeech-gtx1080`` preset from ``sim/presets/fit/`` (the base profile with spec-sheet values
and priors, and Tables 4 and 5 of Li et al.) with :data:`GTX1080_PARAMETERS`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError, require
from psgdlab.core.platform.profile import Profile, Uncertainty
from psgdlab.core.stats.fitting import FitReport, fit_parameters

__all__ = [
    "Figure",
    "FigureFit",
    "FitResult",
    "write_fitted",
    "METRICS",
    "GROUPINGS",
    "GTX1080_PARAMETERS",
    "read_figures",
    "simulate_figures",
    "fit_profile",
    "fitted_profile",
    "gtx1080_paths",
]

METRICS = ("speedup", "step_time_s")
#: the groupings of leave-one-group-out
GROUPINGS = ("workers", "algorithm", "batch", "period")
FIT_BLOCKS = 24  # simulated window: this many sync periods
MIN_STEPS = 960  # and at least this many steps
FIT_SEEDS = (0, 1)
#: relative spread of a published speedup given to two decimals, with run-to-run noise [INF]
FIGURE_NOISE = 0.02
#: the fitted values of the shipped GTX1080 preset and the spread of their priors' logarithms
GTX1080_PARAMETERS: dict[str, float] = {
    "platform.compute_efficiency": 0.4,
    "platform.memory_efficiency": 0.7,
    "platform.pcie.efficiency": 0.7,
    "platform.input_efficiency": 0.7,
    "platform.server.efficiency": 0.7,
    "workload.compute_jitter_s": 1.0,
}


@dataclass(frozen=True, slots=True)
class Figure:
    """One row of a figures table."""

    algorithm: str
    workers: int
    batch: int
    period: int | None
    metric: str
    value: float

    def label(self) -> str:
        period = f" period={self.period}" if self.period is not None else ""
        return f"{self.algorithm} x{self.workers} batch={self.batch}{period}: {self.metric}"


def read_figures(path_or_text: str | Path) -> list[Figure]:
    """Read a figures table (module docstring) from a path or from the CSV text itself."""
    text = str(path_or_text)
    where = "figures"
    if "\n" not in text:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"figures table {path} does not exist")
        text, where = path.read_text(encoding="utf-8"), str(path)
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    cols = reader.fieldnames or []
    missing = [c for c in ("algorithm", "workers", "batch", "period") if c not in cols]
    if missing:
        raise ConfigError(
            f"{where}: needs the columns algorithm, workers, batch, period (missing {', '.join(missing)})"
        )
    metrics = [m for m in METRICS if m in cols]
    if len(metrics) != 1:
        raise ConfigError(f"{where}: needs exactly one of the columns {', '.join(METRICS)}")
    metric = metrics[0]
    out = []
    for i, row in enumerate(reader, start=2):
        try:
            workers, batch = int(row["workers"]), int(row["batch"])
            period = int(row["period"]) if (row["period"] or "").strip() else None
            value = float(row[metric])
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: row {i} ({dict(row)}) has a value that is not a number") from None
        require(workers >= 1, f"{where}: row {i} workers", workers, "must be >= 1")
        require(batch >= 1, f"{where}: row {i} batch", batch, "must be >= 1")
        require(np.isfinite(value) and value > 0, f"{where}: row {i} {metric}", value, "must be a positive number")
        out.append(Figure(row["algorithm"].strip(), workers, batch, period, metric, value))
    require(len(out) >= 1, "figures table", where, "has no rows")
    return out


def simulate_figures(
    profile: Profile,
    figures: Sequence[Figure],
    rows: Sequence[int] | np.ndarray | None = None,
    *,
    seeds: tuple[int, ...] = FIT_SEEDS,
    blocks: int = FIT_BLOCKS,
) -> np.ndarray:
    """The simulator's value of each figure of ``rows`` (all by default) on ``profile``."""
    from psgdlab.sim.predict import predict_one

    profile = profile.resolved()
    idx = range(len(figures)) if rows is None else [int(r) for r in rows]
    out = []
    for i in idx:
        f = figures[i]
        cfg = dataclasses.replace(profile, workload=profile.workload.with_batch(f.batch))
        steps = max(MIN_STEPS, blocks * (f.period or 1))
        values = [
            predict_one(f.algorithm, f.workers, cfg, steps=steps, period=f.period, seed=seed, intervals=False).row[
                f.metric
            ]
            for seed in seeds
        ]
        out.append(float(np.mean(values)))
    return np.array(out)


def _bounds(path: str) -> tuple[float, float]:
    return (1e-3, 1.0) if path.rsplit(".", 1)[-1].endswith("efficiency") else (0.0, np.inf)


def fit_profile(
    base: Profile,
    figures: Sequence[Figure],
    parameters: dict[str, float],
    *,
    loo: bool = True,
    groupings: Sequence[str] = GROUPINGS,
    noise: float = FIGURE_NOISE,
    max_nfev: int = 20,
    cv_steps: int = 3,
    bounds: dict[str, tuple[float, float]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Profile, FitReport]:
    """Fit ``parameters`` (dotted path -> spread of the log prior, the prior being the base
    profile's value) to ``figures``; returns the fitted profile (with its ``[uncertainty]``) and
    the report. An efficiency is bounded to (0.001, 1]; ``bounds`` adds others."""
    require(len(parameters) >= 1, "parameters", parameters, "must name at least one value to fit")
    for path in parameters:
        value = base.get(path)
        require(
            isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
            "fitted parameter",
            path,
            "must name a positive number of the profile (its prior)",
        )
    prior = {p: float(base.get(p)) for p in parameters}
    for f in figures:  # a bad configuration fails before anything is simulated
        from psgdlab.sim.predict import build_algorithm

        build_algorithm(f.algorithm, f.workers, base, period=f.period)

    def model(values: dict[str, float], rows: np.ndarray) -> np.ndarray:
        return simulate_figures(base.with_values(values), figures, rows)

    groups = {g: [getattr(f, g) for f in figures] for g in groupings}
    report = fit_parameters(
        model,
        [f.value for f in figures],
        prior,
        parameters,
        noise=noise,
        bounds={p: (bounds or {}).get(p, _bounds(p)) for p in parameters},
        groups=groups,
        loo=loo,
        max_nfev=max_nfev,
        cv_steps=cv_steps,
        progress=progress,
    )
    return fitted_profile(base, report), report


def fitted_profile(base: Profile, report: FitReport) -> Profile:
    """``base`` with the fitted values (6 significant digits) and the report's uncertainty."""
    values = {k: float(f"{v:.6g}") for k, v in report.values.items()}
    names = report.names
    uncertainty = Uncertainty(
        parameters=names,
        log_sd=tuple(round(report.log_sd[k], 6) for k in names),
        correlation=tuple(
            tuple(1.0 if i == j else round(report.correlation[i][j], 6) for j in range(len(names)))
            for i in range(len(names))
        ),
        unpinned=report.unpinned,
        noise_cv=round(report.noise, 6),
        in_sample_error=round(report.in_sample_error, 6),
        loo_error=round(report.loo_error, 6) if report.loo else None,
        logo_error=round(report.logo_error, 6) if report.logo else None,
    )
    provenance = dict(base.provenance)
    for k in names:
        provenance[k] = f"fitted (prior {report.prior[k]:.4g}, log-sd {report.prior_log_sd[k]:.2g})" + (
            "; unpinned" if k in report.unpinned else ""
        )
    return dataclasses.replace(base.with_values(values), uncertainty=uncertainty, provenance=provenance).resolved()


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureFit:
    """One figure of a fit: its label (:meth:`Figure.label`), the value given, the simulator's
    value on the fitted profile, and the relative error (simulated / given - 1) in sample and when
    the figure was left out of the fit (``None``: leave-one-out was not run)."""

    label: str
    given: float
    fitted: float
    in_sample_error: float
    loo_error: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "given": self.given,
            "fitted": self.fitted,
            "in_sample_error": self.in_sample_error,
            "loo_error": self.loo_error,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FigureFit:
        return cls(**{k: obj[k] for k in ("label", "given", "fitted", "in_sample_error", "loo_error")})


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """What ``psgdlab fit`` found (:func:`fit_profile`'s report on its figures), what ``fit
    --json`` prints and :meth:`describe` renders for the fitted profile's notes and the terminal.

    Parameters
    ----------
    values, log_sd : dict
        Each fitted value (by dotted path, in the profile's unit) and the posterior spread of its
        logarithm.
    prior, prior_log_sd : dict
        Its prior's value and log spread.
    unpinned : tuple of str
        The values the figures did not pin down (kept near their prior).
    flat_directions : tuple of dict
        Directions (log shifts by path) the figures cannot tell apart.
    noise : float
        The residual spread of the log figures the fit used.
    in_sample_error, loo_error, logo_error : float or None
        Median absolute relative error in sample, leave-one-out and leave-one-group-out
        (``None``: not run).
    logo_by_grouping : dict
        Per grouping (``workers``, ``algorithm``, ``batch``, ``period``) with more than one group,
        the ``median`` and ``max`` absolute error of its leave-one-group-out.
    figures : tuple of FigureFit
        Each figure, in the table's order.
    out : str or None
        The fitted profile written (``None``: not written).
    """

    values: dict[str, float]
    log_sd: dict[str, float]
    prior: dict[str, float]
    prior_log_sd: dict[str, float]
    unpinned: tuple[str, ...]
    flat_directions: tuple[dict[str, float], ...]
    noise: float
    in_sample_error: float
    loo_error: float | None
    logo_error: float | None
    logo_by_grouping: dict[str, dict[str, float]]
    figures: tuple[FigureFit, ...]
    out: str | None = None

    @classmethod
    def of(cls, report: FitReport, figures: Sequence[Figure], *, out: str | Path | None = None) -> FitResult:
        """The result of ``report`` on ``figures``."""
        grouped = {}
        for grouping in report.logo:
            errs = np.abs(report.logo_errors(grouping))
            grouped[grouping] = {"median": float(np.median(errs)), "max": float(errs.max())}
        return cls(
            values={k: report.values[k] for k in report.names},
            log_sd={k: report.log_sd[k] for k in report.names},
            prior={k: report.prior[k] for k in report.names},
            prior_log_sd={k: report.prior_log_sd[k] for k in report.names},
            unpinned=tuple(report.unpinned),
            flat_directions=tuple(report.flat_directions),
            noise=report.noise,
            in_sample_error=report.in_sample_error,
            loo_error=report.loo_error if report.loo else None,
            logo_error=report.logo_error if report.logo else None,
            logo_by_grouping=grouped,
            figures=tuple(
                FigureFit(
                    label=f.label(),
                    given=f.value,
                    fitted=float(report.predictions[i]),
                    in_sample_error=report.in_sample[i],
                    loo_error=report.loo.get(i),
                )
                for i, f in enumerate(figures)
            ),
            out=None if out is None else str(out),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "out": self.out,
            "values": self.values,
            "log_sd": self.log_sd,
            "unpinned": list(self.unpinned),
            "flat_directions": list(self.flat_directions),
            "in_sample_error": self.in_sample_error,
            "loo_error": self.loo_error,
            "logo_error": self.logo_error,
            "figures": [f.to_json() for f in self.figures],
            "prior": self.prior,
            "prior_log_sd": self.prior_log_sd,
            "noise": self.noise,
            "logo_by_grouping": self.logo_by_grouping,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FitResult:
        plain = ("values", "log_sd", "prior", "prior_log_sd", "noise", "in_sample_error", "loo_error", "logo_error")
        return cls(
            **{k: obj[k] for k in plain},
            unpinned=tuple(obj["unpinned"]),
            flat_directions=tuple(obj["flat_directions"]),
            logo_by_grouping=dict(obj["logo_by_grouping"]),
            figures=tuple(FigureFit.from_json(f) for f in obj["figures"]),
            out=obj.get("out"),
        )

    def describe(self) -> list[str]:
        """The fit as lines of text (values, spreads, errors per figure, flat directions): the
        fitted profile's header notes and what ``psgdlab fit`` prints."""
        lines = [
            "Fitted (value, posterior log-sd, prior value, prior log-sd):",
            *(
                f"  {k} = {v:.4g} (sd {self.log_sd[k]:.3f}; prior {self.prior[k]:.4g}, "
                f"sd {self.prior_log_sd[k]:.2g}){' UNPINNED' if k in self.unpinned else ''}"
                for k, v in self.values.items()
            ),
            f"Median |relative error|: in sample {100 * self.in_sample_error:.1f} %"
            + (f", leave-one-out {100 * self.loo_error:.1f} %" if self.loo_error is not None else "")
            + (f", leave-one-group-out {100 * self.logo_error:.1f} %" if self.logo_error is not None else ""),
            f"Residual spread (log): {self.noise:.3f}",
        ]
        for grouping, e in self.logo_by_grouping.items():
            lines.append(f"  leave one {grouping} out: median {100 * e['median']:.1f} %, max {100 * e['max']:.1f} %")
        lines.append("Per figure: simulated vs given (in sample / leave-one-out):")
        for f in self.figures:
            loo = f" / {100 * f.loo_error:+.1f} %" if f.loo_error is not None else ""
            lines.append(f"  {f.label} {f.fitted:.3f} vs {f.given:g} ({100 * f.in_sample_error:+.1f} %{loo})")
        for d in self.flat_directions:
            lines.append(
                "Flat direction (the figures cannot tell these apart): "
                + ", ".join(f"{k} {v:+.2f}" for k, v in d.items())
            )
        return lines


def write_fitted(profile: Profile, result: FitResult, path: str | Path, *, head: Sequence[str] = ()) -> Path:
    """Write the fitted profile with ``head`` and the fit's description (:meth:`FitResult.describe`)
    as its header notes, atomically."""
    notes = tuple(head) + tuple(result.describe())
    return dataclasses.replace(profile, notes=notes).write(path)


# ----- the shipped preset ---------------------------------------------------------------------------
def gtx1080_paths() -> tuple[Path, Path, Path]:
    """``(base profile, figures table, shipped preset)`` of ``librispeech-gtx1080``."""
    here = Path(__file__).resolve().parent / "presets"
    return (
        here / "fit" / "librispeech-gtx1080.base.toml",
        here / "fit" / "librispeech-gtx1080.csv",
        here / "librispeech-gtx1080.toml",
    )


GTX1080_HEAD = (
    'Li, Zhang, Xie, Yu, "Empirical Evaluation of Parallel Training Algorithms on Acoustic Modeling"',
    "(arXiv 1703.05880; ALGORITHMS.md §D.3): one node of 8 GTX1080, 13.5M-parameter DNN, LibriSpeech.",
    "GENERATED by `python -m psgdlab.sim.fit` from sim/presets/fit/ (the base profile: spec-sheet values",
    "and priors; the figures: Tables 4 and 5); do not edit by hand. Six values are fitted: the device's",
    "compute and memory efficiencies, the PCIe, input-copy and server paths' efficiencies and the step-time jitter.",
)


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - a calibration script
    """``python -m psgdlab.sim.fit [--out FILE]``: regenerate the ``librispeech-gtx1080`` preset."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m psgdlab.sim.fit",
        description="Fit the librispeech-gtx1080 preset's efficiencies to Tables 4 and 5 of Li et al. (2017), "
        "with leave-one-out and leave-one-group-out errors, and write the preset (several minutes).",
    )
    parser.add_argument("--out", metavar="FILE.toml", default=None, help="default: the shipped preset")
    args = parser.parse_args(argv)
    base_path, figures_path, shipped = gtx1080_paths()
    from psgdlab.sim.workload import load_config

    base = load_config(path=base_path)
    figures = read_figures(figures_path)
    profile, report = fit_profile(base, figures, GTX1080_PARAMETERS, progress=lambda s: print(s, flush=True))
    result = FitResult.of(report, figures)
    path = write_fitted(profile, result, args.out or shipped, head=GTX1080_HEAD)
    print(f"wrote {path}")
    print("\n".join(result.describe()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
