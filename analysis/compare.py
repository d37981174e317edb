r"""Predicted against measured, per ``(algorithm, workers)`` case.

For each case present in both directories: step time, samples/s, communication and idle
fractions, and the staleness distribution (mean, and the total variation distance between the
two histograms, :math:`\tfrac12 \sum_k |p_k - q_k|`), each as the predicted and measured value,
the absolute error and the relative error ``(predicted - measured) / measured``. Across cases:
the median and maximum absolute relative step-time error, and whether ranking the algorithms
by samples/s gives the same order (per worker count) in prediction and measurement
(:func:`ranking`: a pair is ranked only when its measured difference exceeds two combined
standard errors, :func:`samples_per_s_se`; exact ties in the prediction are one class).

Where a step's time goes, per case (``path``, :func:`psgdlab.core.records.trace.step_path`, both
sides): the fastest and slowest worker's own step, how far apart the workers end their compute
and start the next one, and the path from the last compute end to the last next start (the
exchanges and the update on the critical path of a step in which every worker waits for the
others), so that a step-time error can be traced to the place it comes from.

One definition for both sides. When both cases have a trace, every timing figure is recomputed
from the traces with :func:`psgdlab.core.records.trace.summarize` (``step_time_s`` is then the step
the summed rates of the workers imply, for both), over the same window: the
simulator stops its window when the first worker finishes its last step, so both traces are cut
at the end of the last compute record of the worker that finishes first
(:func:`cut_at_first_finish`) before summarizing, and both leave out the same warm-up steps
(a tenth of the shorter run's steps per worker, at least one). The summary files' own figures
(over each whole run, not the shared window) are only used when a trace is missing; ``window``
in each case says which was used.

Examples
--------
>>> total_variation({"0": 5, "1": 5}, {"1": 10})
0.5
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.analysis.load import Run, load_cases
from psgdlab.core.errors import ConfigError
from psgdlab.core.records.trace import PHASES, STEP_PATH_KEYS, step_path, summarize

__all__ = [
    "total_variation",
    "compare_cases",
    "compare_dirs",
    "cut_at_first_finish",
    "windowed_summaries",
    "window_summary",
    "ranking",
    "ranking_counts",
    "samples_per_s_se",
    "METRICS",
    "TIE_REL",
    "RANK_SE",
]

#: summary keys compared for every case
METRICS = ("step_time_s", "samples_per_s", "comm_fraction", "idle_fraction", "staleness_mean")


def total_variation(p: Mapping[str, int], q: Mapping[str, int]) -> float:
    """Total variation distance between two histograms given as ``{value: count}`` (summed in the
    keys' sorted order, so the same histograms give the same float whatever the hash seed)."""
    keys = sorted(set(p) | set(q))
    sp, sq = sum(p.values()), sum(q.values())
    if sp == 0 or sq == 0:
        return 0.0 if sp == sq else 1.0
    return 0.5 * sum(abs(p.get(k, 0) / sp - q.get(k, 0) / sq) for k in keys)


def _error(pred: float | None, meas: float | None) -> dict[str, float | None]:
    if pred is None or meas is None:
        return {"predicted": pred, "measured": meas, "abs_error": None, "rel_error": None}
    rel = (pred - meas) / meas if meas != 0 else (0.0 if pred == 0 else float("inf"))
    return {"predicted": float(pred), "measured": float(meas), "abs_error": float(pred - meas), "rel_error": float(rel)}


def cut_at_first_finish(trace: np.ndarray) -> np.ndarray:
    """The records of ``trace`` that start before the first worker's last compute end."""
    comp = trace[trace["phase"] == PHASES["compute"]]
    if comp.size == 0:
        return trace
    t_cut = min(float(comp["end_s"][comp["rank"] == r].max()) for r in np.unique(comp["rank"]))
    return trace[trace["start_s"] < t_cut]


def _samples_per_step(run: Run) -> int | None:
    for d in (run.summary, run.meta):
        for key in ("samples_per_step", "batch_per_worker"):
            if d.get(key):
                return int(d[key])
    return None


def _steps_per_worker(trace: np.ndarray) -> int:
    comp = trace[trace["phase"] == PHASES["compute"]]
    return min(int(np.count_nonzero(comp["rank"] == r)) for r in np.unique(comp["rank"]))


def windowed_summaries(pred: Run, meas: Run) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """Summaries of both cases under one definition and window (see the module docstring);
    ``(pred, meas, True)``, or the summary files' figures and ``False`` when that is impossible."""
    if pred.trace is None or meas.trace is None:
        return pred.summary, meas.summary, False
    sp, sm = _samples_per_step(pred), _samples_per_step(meas)
    if sp is None or sm is None:
        return pred.summary, meas.summary, False
    cut_p, cut_m = cut_at_first_finish(pred.trace), cut_at_first_finish(meas.trace)
    if not (cut_p["phase"] == PHASES["compute"]).any() or not (cut_m["phase"] == PHASES["compute"]).any():
        return pred.summary, meas.summary, False
    steps = min(_steps_per_worker(cut_p), _steps_per_worker(cut_m))
    return (
        window_summary(cut_p, samples_per_step=sp, steps=steps),
        window_summary(cut_m, samples_per_step=sm, steps=steps),
        True,
    )


def window_summary(cut: np.ndarray, *, samples_per_step: int, steps: int | None = None) -> dict[str, Any]:
    """``summarize`` of a trace cut at the first finish (:func:`cut_at_first_finish`) with the
    comparison's warm-up: a tenth of ``steps`` (default: the cut trace's own steps per worker),
    ``samples_per_s_se`` (:func:`samples_per_s_se`) and ``path``
    (:func:`psgdlab.core.records.trace.step_path` over the same steps)."""
    steps = _steps_per_worker(cut) if steps is None else steps
    warmup = max(1, steps // 10)
    out = summarize(cut, samples_per_step=samples_per_step, warmup_steps=warmup)
    out["samples_per_s_se"] = samples_per_s_se(cut, samples_per_step=samples_per_step, steps=steps)
    out["path"] = step_path(cut, warmup_steps=warmup)
    return out


def compare_cases(pred: Run, meas: Run) -> dict[str, Any]:
    """Errors of one predicted case against its measured twin."""
    algorithm, workers = meas.key
    out: dict[str, Any] = {"algorithm": algorithm, "workers": workers}
    ps, ms, windowed = windowed_summaries(pred, meas)
    out["window"] = (
        "traces cut at the first worker's finish, summarized alike"
        if windowed
        else "summary files (a trace is missing)"
    )
    for name in METRICS:
        out[name] = _error(ps.get(name), ms.get(name))
    for side, summary in (("predicted", ps), ("measured", ms)):
        out["samples_per_s"][f"{side}_se"] = summary.get("samples_per_s_se")
    paths = ps.get("path") or {}, ms.get("path") or {}
    out["path"] = {key: _error(paths[0].get(key), paths[1].get(key)) for key in STEP_PATH_KEYS}
    out["staleness_tv"] = total_variation(ps.get("staleness_hist", {}) or {}, ms.get("staleness_hist", {}) or {})
    out["predicted_step_time_s"] = out["step_time_s"]["predicted"]
    out["measured_step_time_s"] = out["step_time_s"]["measured"]
    out["step_time_error"] = out["step_time_s"]["rel_error"]
    out["staleness_mean_predicted"] = out["staleness_mean"]["predicted"]
    out["staleness_mean_measured"] = out["staleness_mean"]["measured"]
    return out


#: predicted values this close (relative) are one value computed along two paths: a tie
TIE_REL = 1e-9

#: a pair of cases is ranked only when its measured difference exceeds this many combined
#: standard errors of the two measured means (:func:`ranking`)
RANK_SE = 2.0

#: the batch-means standard error of a run's samples/s (:func:`samples_per_s_se`) splits the timed
#: steps into at most this many consecutive batches of at least :data:`MIN_BATCH_STEPS` steps
SE_BATCHES, MIN_BATCH_STEPS = 8, 4


def ranking(cases: list[dict[str, Any]], metric: str = "samples_per_s") -> dict[int, dict[str, Any]]:
    r"""The ranking of the cases by ``metric`` (higher first), per worker count, predicted against
    measured, pair by pair.

    A pair of cases is *ranked* only when its measured difference exceeds :data:`RANK_SE`
    combined standard errors of the measured means,
    :math:`|m_a - m_b| > 2\sqrt{s_a^2 + s_b^2}` (``c[metric]["measured_se"]``; a case without
    one counts as exact, 0); a pair inside that is a *measured tie* and passes whatever order
    the prediction gives. A ranked pair is *misordered* when the prediction orders it the other
    way. Cases whose predicted values are equal up to floating-point rounding (relative
    :data:`TIE_REL`: the simulator gives bit-identical figures when two algorithms exchange
    alike, e.g. H-ADPSGD with a single node and SSGD) form one predicted class, and the
    prediction makes no claim about their order: such a pair is never misordered.

    Returns, per worker count: ``predicted`` (the classes, best first, each a list of
    algorithms), ``measured`` (algorithms by measured mean, best first), ``ranked``, ``tied``
    and ``misordered`` (counts of pairs: ``ranked + tied`` is :math:`n(n-1)/2` for ``n`` cases),
    ``identical`` (no pair misordered), ``swaps`` (``[a, b, predicted (a-b)/b, measured
    (a-b)/b]`` for each misordered pair, ``a`` the one predicted higher) and ``ties``
    (``[a, b, measured (a-b)/b, difference in combined standard errors]`` for each measured
    tie, ``a`` measured higher).

    >>> c = [{"algorithm": a, "workers": 2, "samples_per_s": {"predicted": p, "measured": m, "measured_se": 0.1}}
    ...      for a, p, m in (("x", 10.0, 10.1), ("y", 9.0, 10.2), ("z", 8.0, 9.0))]
    >>> r = ranking(c)[2]
    >>> r["ranked"], r["tied"], r["misordered"], r["identical"]
    (2, 1, 0, True)
    """
    out: dict[int, dict[str, Any]] = {}
    by_workers: dict[int, list[dict[str, Any]]] = {}
    for c in cases:
        by_workers.setdefault(c["workers"], []).append(c)
    for n, group in sorted(by_workers.items()):
        pred = {c["algorithm"]: c[metric]["predicted"] or 0.0 for c in group}
        meas = {c["algorithm"]: c[metric]["measured"] or 0.0 for c in group}
        se = {c["algorithm"]: c[metric].get("measured_se") or 0.0 for c in group}
        classes: list[list[str]] = []
        for name in sorted(pred, key=lambda k: (-pred[k], k)):
            if classes and math.isclose(pred[classes[-1][0]], pred[name], rel_tol=TIE_REL):
                classes[-1].append(name)
            else:
                classes.append([name])
        classes = [sorted(c) for c in classes]
        rank_of = {a: i for i, cls in enumerate(classes) for a in cls}
        names = sorted(pred)
        swaps, ties, ranked = [], [], 0
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                a, b = (first, second) if meas[first] >= meas[second] else (second, first)  # a measured higher
                combined = math.hypot(se[a], se[b])
                diff = meas[a] - meas[b]
                if diff <= RANK_SE * combined:
                    ties.append([a, b, _rel(meas[a], meas[b]), diff / combined if combined else 0.0])
                    continue
                ranked += 1
                if rank_of[b] < rank_of[a]:  # predicted the other way round
                    swaps.append([b, a, _rel(pred[b], pred[a]), _rel(meas[b], meas[a])])
        out[n] = {
            "predicted": classes,
            "measured": sorted(meas, key=lambda k: (-meas[k], k)),
            "ranked": ranked,
            "tied": len(ties),
            "misordered": len(swaps),
            "identical": not swaps,
            "swaps": sorted(swaps),
            "ties": sorted(ties),
        }
    return out


def ranking_counts(groups: Any) -> dict[str, int]:
    """The pairs ranked, measured as ties and misordered, summed over groups of :func:`ranking`."""
    groups = list(groups)
    return {k: sum(int(g[k]) for g in groups) for k in ("ranked", "tied", "misordered")}


def samples_per_s_se(cut: np.ndarray, *, samples_per_step: int, steps: int | None = None) -> float | None:
    r"""The standard error of a trace's samples/s (the sum of the workers' rates, as
    :func:`psgdlab.core.records.trace.summarize` and :func:`window_summary` compute it), by batch means.

    Consecutive steps of a run are correlated (a slow exchange delays the next steps of every
    worker that waits on it), so the steps are not independent draws. The timed steps (after
    :func:`window_summary`'s warm-up) of every worker are cut into ``K`` consecutive batches of
    equal length, ``K`` the largest up to :data:`SE_BATCHES` that leaves at least
    :data:`MIN_BATCH_STEPS` steps in a batch; batch ``k`` gives one estimate of samples/s,
    :math:`b \sum_r 1/\bar\Delta_{r,k}` (:math:`\bar\Delta_{r,k}` worker ``r``'s mean time
    between compute starts in batch ``k``: the workers' rates summed within a batch, so that
    their correlation is kept), and the standard error is the spread of the ``K`` estimates,
    :math:`\mathrm{sd}/\sqrt{K}`. ``None`` with fewer than ``2 * MIN_BATCH_STEPS`` timed steps.
    What varies from one run to the next (the launch offsets, the machine's other load) is not
    in it: repeated runs measure that (:func:`psgdlab.validate.stats.pooled_ranking`).
    """
    steps = _steps_per_worker(cut) if steps is None else steps
    warmup = max(1, steps // 10)
    comp = cut[(cut["phase"] == PHASES["compute"]) & (cut["step"] >= warmup)]
    gaps = [np.diff(np.sort(comp["start_s"][comp["rank"] == r])) for r in np.unique(comp["rank"])]
    m = min((g.size for g in gaps), default=0)
    k = min(SE_BATCHES, m // MIN_BATCH_STEPS)
    if k < 2:
        return None
    edges = [i * m // k for i in range(k + 1)]
    est = [
        samples_per_step * sum((hi - lo) / float(g[lo:hi].sum()) for g in gaps) for lo, hi in itertools.pairwise(edges)
    ]
    return float(np.std(est, ddof=1) / math.sqrt(k))


def _rel(a: float, b: float) -> float | None:
    return (a - b) / b if b else None


def compare_dirs(pred_dir: str | Path, run_dir: str | Path) -> dict[str, Any]:
    """Compare every case present in both run directories."""
    preds = load_cases(pred_dir)
    meas = load_cases(run_dir)
    common = sorted(set(preds) & set(meas))
    if not common:
        raise ConfigError(
            f"no (algorithm, workers) case is in both {pred_dir} ({sorted(preds)}) and {run_dir} ({sorted(meas)})"
        )
    cases = [compare_cases(preds[k], meas[k]) for k in common]
    errs = np.array([abs(c["step_time_error"]) for c in cases if c["step_time_error"] is not None])
    rank = ranking(cases)
    return {
        "predicted_dir": str(pred_dir),
        "measured_dir": str(run_dir),
        "cases": cases,
        "missing_in_measured": [list(k) for k in sorted(set(preds) - set(meas))],
        "missing_in_predicted": [list(k) for k in sorted(set(meas) - set(preds))],
        "median_abs_step_time_error": float(np.median(errs)) if errs.size else None,
        "max_abs_step_time_error": float(errs.max()) if errs.size else None,
        "ranking": {str(n): r for n, r in rank.items()},
        "ranking_counts": ranking_counts(rank.values()),
        "ranking_identical": all(r["identical"] for r in rank.values()),
    }
