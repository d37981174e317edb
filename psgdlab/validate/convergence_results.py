r"""The results of ``psgdlab validate --convergence``: each case's prediction against its measured
runs, and the figures issue 42 holds them to.

Per **configuration** (a case of the grid, every seed of it): the predicted time to the target
(:class:`Predicted`) and the measured runs (:class:`~psgdlab.validate.convergence_runs.Measured`).
The figures:

- **error**: ``predicted / mean measured - 1`` of each configuration predicted to reach the
  target whose every run reached it (the prediction is of the expected time; one run adds its
  scatter, which the interval carries);
- **coverage**: the fraction of those runs whose measured time lies in the prediction's 90 %
  interval (the interval holds one run's scatter, so it is checked run by run);
- **ranking**: within a workload and straggler, every pair of configurations ordered by the
  measured mean time, ranked only when the means differ by more than two combined standard
  errors (:func:`psgdlab.analysis.compare.ranking`, on the speed :math:`1/t`; the standard
  error of a mean over seeds is their spread over :math:`\sqrt k`); a ranked pair the
  prediction orders the other way is *misordered*;
- **non-converging**: configurations predicted not to reach the target, and which of them did
  when run (issue 42: none should); and the converse, predicted to reach it but missed it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from psgdlab.validate.convergence_plan import TARGETS, Case
from psgdlab.validate.convergence_runs import Measured

__all__ = ["Predicted", "ConfigurationResult", "summarize", "rank_groups", "tie_check", "format_convergence"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Predicted:
    """A configuration's prediction: whether it reaches the target (``reason`` when not), its
    steps and epochs to it, the time to it (steps times the simulated step time) with its 90 %
    interval, the simulated step time and staleness, and the convergence model's factors.
    :meth:`for_run` is what a run that starts counting after some steps is compared with."""

    reaches: bool
    reason: str | None
    steps_to_target: float | None
    epochs_to_target: float | None
    time_to_target_s: float | None
    low_s: float | None
    high_s: float | None
    step_time_s: float
    staleness_mean: float
    factors: Mapping[str, float]

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "factors": dict(self.factors)}

    def for_run(self, start_steps: float) -> tuple[float, float, float] | None:
        """``(time, low, high)`` of the steps left after ``start_steps`` (a run's start-up);
        ``None`` when not reached."""
        t, lo, hi, s = self.time_to_target_s, self.low_s, self.high_s, self.steps_to_target
        if not self.reaches or t is None or lo is None or hi is None or not s:
            return None
        keep = max(s - start_steps, 0.0) / s
        return t * keep, lo * keep, hi * keep


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConfigurationResult:
    """One configuration: its prediction and its runs (module docstring)."""

    case: Case
    predicted: Predicted
    runs: tuple[Measured, ...]
    emulated: Mapping[str, Any] | None = None

    @property
    def all_reached(self) -> bool:
        return bool(self.runs) and all(r.reached for r in self.runs)

    @property
    def any_reached(self) -> bool:
        return any(r.reached for r in self.runs)

    def times(self) -> np.ndarray:
        return np.array([r.time_to_target_s for r in self.runs if r.reached], dtype=float)

    @property
    def measured_mean_s(self) -> float | None:
        t = self.times()
        return float(t.mean()) if self.all_reached and t.size else None

    @property
    def measured_se_s(self) -> float | None:
        t = self.times()
        return float(t.std(ddof=1) / math.sqrt(t.size)) if self.all_reached and t.size >= 2 else None

    @property
    def predicted_mean_s(self) -> float | None:
        """The prediction each run is compared with (the steps left after its start-up), averaged
        over the runs; the whole prediction without runs."""
        got = [self.predicted.for_run(r.start_steps) for r in self.runs]
        times = [g[0] for g in got if g is not None]
        if not times:
            return self.predicted.time_to_target_s
        return float(np.mean(times))

    @property
    def error(self) -> float | None:
        """``predicted / mean measured - 1`` (module docstring), ``None`` where undefined."""
        m, p = self.measured_mean_s, self.predicted_mean_s
        if m is None or p is None or not self.predicted.reaches or m <= 0:
            return None
        return p / m - 1.0

    def inside(self) -> list[bool]:
        """Each reached run: inside its prediction's 90 % interval."""
        out = []
        for r in self.runs:
            band = self.predicted.for_run(r.start_steps)
            if band is not None and r.reached and r.time_to_target_s is not None:
                out.append(bool(band[1] <= r.time_to_target_s <= band[2]))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            **self.case.to_json(),
            "predicted": self.predicted.to_json(),
            "predicted_for_runs_s": self.predicted_mean_s,
            "measured": {
                "runs": [r.to_json() for r in self.runs],
                "reached": [r.reached for r in self.runs],
                "mean_time_to_target_s": self.measured_mean_s,
                "se_time_to_target_s": self.measured_se_s,
                "mean_epochs_to_target": _mean([r.epochs_to_target for r in self.runs if r.reached]),
                "mean_step_time_s": _mean([r.step_time_s for r in self.runs]),
                "mean_staleness": _mean([r.staleness_mean for r in self.runs]),
                "compute_overrun_steps": sum(r.compute_overrun_steps for r in self.runs),
            },
            "time_to_target_error": self.error,
            "inside_interval": self.inside(),
            **({"emulated": dict(self.emulated)} if self.emulated is not None else {}),
        }


def _mean(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.mean(v)) if v else None


def rank_groups(results: Sequence[ConfigurationResult]) -> dict[str, dict[str, Any]]:
    """The ranking of every (workload, straggler) group (module docstring), by group label."""
    from psgdlab.analysis.compare import ranking

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        m, se, p = r.measured_mean_s, r.measured_se_s, r.predicted_mean_s
        if m is None or p is None or not r.predicted.reaches or m <= 0 or p <= 0:
            continue  # no speed to rank (a time of 0: the target met before the clock started, as error() says)
        label = f"{r.case.workload}" + (f", straggler {r.case.straggler}" if r.case.straggler else "")
        groups.setdefault(label, []).append(
            {
                "algorithm": r.case.name,
                "workers": 0,
                "speed": {"predicted": 1.0 / p, "measured": 1.0 / m, "measured_se": (se or 0.0) / (m * m)},
            }
        )
    return {label: ranking(cases, metric="speed")[0] for label, cases in groups.items()}


def tie_check(a: ConfigurationResult, b: ConfigurationResult) -> str:
    """Whether ``a`` is, measured, the fastest of the two (``"fastest"``), tied with ``b`` within
    two combined standard errors (``"tied"``) or slower (``"slower"``)."""
    ma, mb = a.measured_mean_s, b.measured_mean_s
    if ma is None or mb is None:
        return "unmeasured"
    if a.case == b.case or ma <= mb:
        return "fastest"
    se = math.hypot(a.measured_se_s or 0.0, b.measured_se_s or 0.0)
    return "tied" if ma - mb <= 2 * se else "slower"


def summarize(results: Sequence[ConfigurationResult]) -> dict[str, Any]:
    """The figures of ``results`` (module docstring) and whether they meet :data:`TARGETS`."""
    errs = np.array([abs(r.error) for r in results if r.error is not None])
    inside = [x for r in results if r.predicted.reaches for x in r.inside()]
    ranked = rank_groups(results)
    counts = {k: sum(int(g[k]) for g in ranked.values()) for k in ("ranked", "tied", "misordered")}
    predicted_not = [r for r in results if not r.predicted.reaches]
    reached_anyway = [r.case.name for r in predicted_not if r.any_reached]
    missed = [r.case.name for r in results if r.predicted.reaches and not r.all_reached]
    median = float(np.median(errs)) if errs.size else None
    largest = float(errs.max()) if errs.size else None
    coverage = float(np.mean(inside)) if inside else None
    return {
        "median_abs_time_to_target_error": median,
        "max_abs_time_to_target_error": largest,
        "coverage": coverage,
        "ranking": counts,
        "ranking_detail": ranked,
        "configurations": len(results),
        "compared": int(errs.size),
        "runs_in_coverage": len(inside),
        "predicted_not_to_reach": [r.case.name for r in predicted_not],
        "reached_though_predicted_not": reached_anyway,
        "predicted_to_reach_but_missed": missed,
        "targets_met": {
            "median_abs_time_to_target_error": median is not None
            and median <= TARGETS["median_abs_time_to_target_error"],
            "max_abs_time_to_target_error": largest is not None and largest <= TARGETS["max_abs_time_to_target_error"],
            "coverage": coverage is not None and coverage >= TARGETS["coverage"],
            "ranking_identical": counts["misordered"] == 0,
            "non_converging": not reached_anyway,
        },
    }


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def format_convergence(report: dict[str, Any]) -> str:
    """The text of ``psgdlab validate --convergence``: each configuration's predicted time to the
    target (90 % interval) against its measured mean (standard error over seeds), then the figures
    per workload, the plan's recommendation against the measurement, and the targets."""
    lines = [
        f"{'case':34s} {'predicted s':>12s} {'[90 %]':>15s} {'measured s':>11s} {'se':>6s} {'error':>7s} {'in':>5s}"
    ]
    for c in report["cases"]:
        p, m = c["predicted"], c["measured"]
        if p["reaches"]:
            ratio = (c["predicted_for_runs_s"] or 0.0) / p["time_to_target_s"] if p["time_to_target_s"] else 1.0
            pred, band = _s(c["predicted_for_runs_s"]), f"[{_s(p['low_s'] * ratio)}, {_s(p['high_s'] * ratio)}]"
        else:
            pred, band = "no", (p["reason"] or "")[:15]
        err = c["time_to_target_error"]
        reached = m["reached"]
        meas = _s(m["mean_time_to_target_s"]) if all(reached) else f"{sum(reached)}/{len(reached)} reached"
        inside = f"{sum(c['inside_interval'])}/{len(c['inside_interval'])}" if c["inside_interval"] else "-"
        lines.append(
            f"{c['name']:34s} {pred:>12s} {band:>15s} {meas:>11s} {_s(m['se_time_to_target_s']):>6s} "
            f"{'-' if err is None else f'{100 * err:+.1f}%':>7s} {inside:>5s}"
        )
    for w, s in report["by_workload"].items():
        med, mx, cov = (s[k] for k in ("median_abs_time_to_target_error", "max_abs_time_to_target_error", "coverage"))
        r = s["ranking"]
        lines.append(
            f"{w}: median |error| {'-' if med is None else f'{100 * med:.1f} %'}, max "
            f"{'-' if mx is None else f'{100 * mx:.1f} %'}, coverage {'-' if cov is None else f'{100 * cov:.0f} %'} "
            f"({s['runs_in_coverage']} runs); ranking {r['ranked']} ranked, {r['tied']} tied, {r['misordered']} "
            f"misordered; predicted not to reach: {len(s['predicted_not_to_reach'])}, of them reached: "
            f"{len(s['reached_though_predicted_not'])}"
        )
    for w, per in report["plan"].items():
        for straggler, p in per.items():
            lines.append(
                f"plan ({w}, straggler {straggler}): recommends {p.get('recommended')}; measured fastest "
                f"{p.get('measured_fastest')}: {p.get('verdict', '-')}"
            )
    met = report["targets_met"]
    lines.append("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items()))
    return "\n".join(lines)
