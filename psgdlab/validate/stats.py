"""The statistics of a validation: the seeds each case is predicted with, the ranking on pooled
runs and predictions, the spread of repeated runs, the staleness target."""

from __future__ import annotations

from typing import Any

from psgdlab.validate.plan import TARGETS

__all__ = [
    "relabelled_seeds",
    "pooled_ranking",
    "predicted_samples_per_s",
    "spread",
    "staleness_ok",
    "interval_coverage",
]


def relabelled_seeds(n: int, seeds: int) -> list[tuple[int, list[int] | None]]:
    """The (seed offset, compute-time streams) of a case's predictions: every seed in rank order
    (``None``) and with the streams reversed, seed offset 0 in rank order first.

    The workers' compute times are independent draws of one law, so relabelling whose stream
    each worker takes changes no expectation; averaged over both orders, two configurations
    that are one system with the workers renamed get the same figure (AD-PSGD's two rings with
    2 workers: the fixed ring's active side is rank 1, the random ring's rank 0, and without a
    straggler nothing else tells the ranks apart). With a straggler on rank 1 they are two
    systems (the straggler is active on one ring, passive on the other) and stay apart.
    docs/measurements.md, "Validation", has the figures that asked for it.

    >>> relabelled_seeds(3, 2)
    [(0, None), (0, [2, 1, 0]), (1, None), (1, [2, 1, 0])]
    """
    reverse = list(range(n))[::-1]
    return [(k, order) for k in range(seeds) for order in (None, reverse)]


def pooled_ranking(
    cases: list[dict[str, Any]],
    runs: dict[tuple[str, int], list[float]],
    predicted: dict[tuple[str, int], list[float]] | None = None,
) -> dict[str, Any]:
    """:func:`psgdlab.analysis.compare.ranking` of ``cases`` on the mean measured samples/s of
    ``runs`` (``(algorithm, workers)`` -> the samples/s of each run, the cases' own first) and
    the mean predicted samples/s of ``predicted`` (the same, one entry per simulated seed); a
    group with a case of more than one run gets ``remeasured`` (:func:`spread` per such case),
    one predicted more than once ``predictions`` (how many).

    A prediction of a few steps is one draw of the compute times and matchings; the mean over
    seeds (each also with the workers' streams relabelled, :func:`relabelled_seeds`) is the
    prediction's expected value; ties between algorithms that exchange alike, also up to
    renaming the workers, stay exact.

    >>> cases = [{"algorithm": a, "workers": 4, "samples_per_s": {"predicted": p, "measured": m}}
    ...          for a, p, m in (("easgd", 74.0, 73.5), ("bmuf", 73.0, 73.9))]
    >>> r = pooled_ranking(cases, {("easgd", 4): [73.5, 74.4, 74.3], ("bmuf", 4): [73.9, 73.1, 73.3]})["4"]
    >>> r["identical"], r["measured"], [round(r["remeasured"]["bmuf"]["mean"], 2)]
    (True, ['easgd', 'bmuf'], [73.43])
    """
    import numpy as np

    from psgdlab.analysis.compare import ranking

    predicted = predicted or {}
    pooled = []
    for c in cases:
        key, sp = (c["algorithm"], c["workers"]), c["samples_per_s"]
        meas = np.array(runs.get(key, [sp["measured"]]), dtype=float)
        pred = np.array(predicted.get(key, [sp["predicted"]]), dtype=float)
        pooled.append({**c, "samples_per_s": {**sp, "measured": float(meas.mean()), "predicted": float(pred.mean())}})
    ranked = {str(n): r for n, r in ranking(pooled).items()}
    for n, r in ranked.items():
        more = {a: spread(v) for (a, m), v in sorted(runs.items()) if str(m) == n and len(v) > 1}
        if more:
            r["remeasured"] = more
        counts = {len(v) for (a, m), v in predicted.items() if str(m) == n}
        if counts and max(counts) > 1:
            r["predictions"] = max(counts)
    return ranked


def predicted_samples_per_s(trace: Any, samples_per_step: int) -> float:
    """Samples/s of a predicted trace under the comparison's window
    (:func:`psgdlab.analysis.compare.window_summary`, as against a measured run of as many steps)."""
    from psgdlab.analysis.compare import cut_at_first_finish, window_summary

    return float(window_summary(cut_at_first_finish(trace), samples_per_step=samples_per_step)["samples_per_s"])


def spread(values: list[float]) -> dict[str, Any]:
    """The samples/s of every run of a case, their mean and the standard error of the mean."""
    import numpy as np

    v = np.array(values, dtype=float)
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else None
    return {"samples_per_s": [round(float(x), 4) for x in v], "mean": float(v.mean()), "se": se}


def staleness_ok(c: dict[str, Any]) -> bool:
    """Whether a case's predicted mean staleness is within :data:`TARGETS` of the measured one
    (within 0.05 updates of a measured 0, a synchronous algorithm)."""
    p, m = c["staleness_mean_predicted"], c["staleness_mean_measured"]
    if p is None or m is None:
        return False
    if m == 0:
        return abs(p) <= 0.05  # both zero (synchronous): an absolute tolerance of 0.05 updates
    return abs(p - m) / m <= TARGETS["staleness_mean_rel_error"]


def mark_intervals(cases: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Mark which measured step times fall inside their prediction's 90 % interval (issue 16).

    ``rows`` are the predictions' rows (:func:`psgdlab.sim.predict.predict_one`, with
    ``step_time_s_low``/``_high``); ``cases`` the comparison's cases, which compare the traces cut
    at the first finish, not the rows' own figures. The interval is a band of factors around the
    prediction (from the fit's parameter uncertainty and the run-to-run noise), so each case gets
    its row's band applied to its windowed prediction, written into the case as
    ``step_time_interval`` and ``in_interval``; a case whose row has no band is left unmarked.

    >>> case = {"algorithm": "ssgd", "workers": 2, "predicted_step_time_s": 1.0, "measured_step_time_s": 1.08}
    >>> row = {"algorithm": "ssgd", "workers": 2, "step_time_s": 2.0, "step_time_s_low": 1.8, "step_time_s_high": 2.2}
    >>> mark_intervals([case], [row])
    >>> case["step_time_interval"], case["in_interval"]
    ([0.9, 1.1], True)
    """
    bands = {}
    for r in rows:
        if r.get("step_time_s_low") is not None and r.get("step_time_s"):
            bands[(r["algorithm"], r["workers"])] = (r["step_time_s_low"], r["step_time_s_high"], r["step_time_s"])
    for c in cases:
        band = bands.get((c["algorithm"], c["workers"]))
        pred, meas = c.get("predicted_step_time_s"), c.get("measured_step_time_s")
        if band is None or pred is None or meas is None:
            continue
        low, high, centre = band
        c["step_time_interval"] = [low / centre * pred, high / centre * pred]
        c["in_interval"] = bool(c["step_time_interval"][0] <= meas <= c["step_time_interval"][1])


def interval_coverage(table: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(fraction of ``validate.json``'s cases inside their interval, the widest relative
    half-width); ``(None, None)`` when no case has an interval.

    >>> interval_coverage([{"in_interval": True, "interval_low": 0.9, "interval_high": 1.12},
    ...                    {"in_interval": False, "interval_low": 0.95, "interval_high": 1.05}, {"in_interval": None}])
    (0.5, 0.11000000000000004)
    """
    marked = [c for c in table if c.get("in_interval") is not None]
    if not marked:
        return None, None
    inside = sum(c["in_interval"] for c in marked) / len(marked)
    return inside, max((c["interval_high"] - c["interval_low"]) / 2 for c in marked)
