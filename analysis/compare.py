r"""Predicted against measured, per ``(algorithm, workers)`` case.

For each case present in both directories: step time, samples/s, communication and idle
fractions, and the staleness distribution (mean, and the total variation distance between the
two histograms, :math:`\tfrac12 \sum_k |p_k - q_k|`), each as the predicted and measured value,
the absolute error and the relative error ``(predicted - measured) / measured``. Across cases:
the median and maximum absolute relative step-time error, and whether ranking the algorithms
by samples/s gives the same order (per worker count) in prediction and measurement.

Examples
--------
>>> total_variation({"0": 5, "1": 5}, {"1": 10})
0.5
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from psgdlab.analysis.load import Run, load_cases
from psgdlab.core.errors import ConfigError

__all__ = ["total_variation", "compare_cases", "compare_dirs", "METRICS"]

#: summary keys compared for every case
METRICS = ("step_time_s", "samples_per_s", "comm_fraction", "idle_fraction", "staleness_mean")


def total_variation(p: Mapping[str, int], q: Mapping[str, int]) -> float:
    """Total variation distance between two histograms given as ``{value: count}``."""
    keys = set(p) | set(q)
    sp, sq = sum(p.values()), sum(q.values())
    if sp == 0 or sq == 0:
        return 0.0 if sp == sq else 1.0
    return 0.5 * sum(abs(p.get(k, 0) / sp - q.get(k, 0) / sq) for k in keys)


def _error(pred: float | None, meas: float | None) -> dict[str, float | None]:
    if pred is None or meas is None:
        return {"predicted": pred, "measured": meas, "abs_error": None, "rel_error": None}
    rel = (pred - meas) / meas if meas != 0 else (0.0 if pred == 0 else float("inf"))
    return {"predicted": float(pred), "measured": float(meas), "abs_error": float(pred - meas), "rel_error": float(rel)}


def compare_cases(pred: Run, meas: Run) -> dict[str, Any]:
    """Errors of one predicted case against its measured twin."""
    algorithm, workers = meas.key
    out: dict[str, Any] = {"algorithm": algorithm, "workers": workers}
    for name in METRICS:
        out[name] = _error(pred.summary.get(name), meas.summary.get(name))
    out["staleness_tv"] = total_variation(pred.summary.get("staleness_hist", {}) or {},
                                          meas.summary.get("staleness_hist", {}) or {})
    out["predicted_step_time_s"] = out["step_time_s"]["predicted"]
    out["measured_step_time_s"] = out["step_time_s"]["measured"]
    out["step_time_error"] = out["step_time_s"]["rel_error"]
    out["staleness_mean_predicted"] = out["staleness_mean"]["predicted"]
    out["staleness_mean_measured"] = out["staleness_mean"]["measured"]
    return out


def _ranking_identical(cases: list[dict[str, Any]]) -> bool:
    by_workers: dict[int, list[dict[str, Any]]] = {}
    for c in cases:
        by_workers.setdefault(c["workers"], []).append(c)
    for group in by_workers.values():
        pred = sorted(group, key=lambda c: -(c["samples_per_s"]["predicted"] or 0))
        meas = sorted(group, key=lambda c: -(c["samples_per_s"]["measured"] or 0))
        if [c["algorithm"] for c in pred] != [c["algorithm"] for c in meas]:
            return False
    return True


def compare_dirs(pred_dir: str | Path, run_dir: str | Path) -> dict[str, Any]:
    """Compare every case present in both run directories."""
    preds = load_cases(pred_dir)
    meas = load_cases(run_dir)
    common = sorted(set(preds) & set(meas))
    if not common:
        raise ConfigError(f"no (algorithm, workers) case is in both {pred_dir} ({sorted(preds)}) and "
                          f"{run_dir} ({sorted(meas)})")
    cases = [compare_cases(preds[k], meas[k]) for k in common]
    errs = np.array([abs(c["step_time_error"]) for c in cases if c["step_time_error"] is not None])
    return {
        "predicted_dir": str(pred_dir),
        "measured_dir": str(run_dir),
        "cases": cases,
        "missing_in_measured": [list(k) for k in sorted(set(preds) - set(meas))],
        "missing_in_predicted": [list(k) for k in sorted(set(meas) - set(preds))],
        "median_abs_step_time_error": float(np.median(errs)) if errs.size else None,
        "max_abs_step_time_error": float(errs.max()) if errs.size else None,
        "ranking_identical": _ranking_identical(cases),
    }
