"""The statistics of a validation: the seeds each case is predicted with, the ranking on pooled
runs and predictions (a pair ranked only outside two combined standard errors of the measured
means), the spread of repeated runs, the staleness target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psgdlab.validate.plan import TARGETS

__all__ = [
    "hadpsgd_advantage",
    "advantage_holds",
    "relabelled_seeds",
    "pooled_ranking",
    "pooled_mean",
    "predicted_samples_per_s",
    "spread",
    "staleness_ok",
    "mark_intervals",
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
    runs: Mapping[tuple[str, int], Sequence[tuple[float, float | None]]],
    predicted: Mapping[tuple[str, int], Sequence[float]] | None = None,
) -> dict[str, Any]:
    """:func:`psgdlab.analysis.compare.ranking` of ``cases`` on the measured mean samples/s and
    its standard error (:func:`pooled_mean`) of ``runs`` (``(algorithm, workers)`` -> the
    samples/s of each run with its within-run standard error, the case's own first; a case
    absent: its one run in ``cases``) and the mean predicted samples/s of ``predicted`` (the
    same, one entry per simulated seed); a group with a case of more than one run gets
    ``remeasured`` (:func:`spread` per such case), one predicted more than once ``predictions``
    (how many).

    A prediction of a few steps is one draw of the compute times and matchings; the mean over
    seeds (each also with the workers' streams relabelled, :func:`relabelled_seeds`) is the
    prediction's expected value; ties between algorithms that exchange alike, also up to
    renaming the workers, stay exact.

    >>> cases = [{"algorithm": a, "workers": 4, "samples_per_s": {"predicted": p, "measured": m}}
    ...          for a, p, m in (("easgd", 74.0, 73.5), ("bmuf", 73.0, 73.9))]
    >>> runs = {("easgd", 4): [(73.5, 0.1), (74.4, 0.1), (74.3, 0.1)], ("bmuf", 4): [(73.9, 0.1), (73.1, 0.1)]}
    >>> r = pooled_ranking(cases, runs)["4"]
    >>> r["identical"], r["measured"], r["ranked"], r["tied"], [round(r["remeasured"]["bmuf"]["mean"], 2)]
    (True, ['easgd', 'bmuf'], 0, 1, [73.5])
    """
    import numpy as np

    from psgdlab.analysis.compare import ranking

    predicted = predicted or {}
    pooled = []
    for c in cases:
        key, sp = (c["algorithm"], c["workers"]), c["samples_per_s"]
        mean, se = pooled_mean(runs.get(key, [(sp["measured"], sp.get("measured_se"))]))
        pred = np.array(predicted.get(key, [sp["predicted"]]), dtype=float)
        pooled.append(
            {**c, "samples_per_s": {**sp, "measured": mean, "measured_se": se, "predicted": float(pred.mean())}}
        )
    ranked = {str(n): r for n, r in ranking(pooled).items()}
    for n, r in ranked.items():
        more = {a: spread(v) for (a, m), v in sorted(runs.items()) if str(m) == n and len(v) > 1}
        if more:
            r["remeasured"] = more
        counts = {len(v) for (a, m), v in predicted.items() if str(m) == n}
        if counts and max(counts) > 1:
            r["predictions"] = max(counts)
    return ranked


def pooled_mean(runs: Sequence[tuple[float, float | None]]) -> tuple[float, float | None]:
    r"""The mean samples/s of a case's runs and its standard error: the larger of the spread of
    the runs, :math:`\mathrm{sd}(x)/\sqrt{m}` (with two runs or more: what varies from one run
    to the next, launch offsets and the machine's other load, is in it) and the runs' own
    batch-means standard errors combined, :math:`\sqrt{\sum_i s_i^2}/m`
    (:func:`psgdlab.analysis.compare.samples_per_s_se`: the noise within the runs, the only
    measure one run gives). ``None`` when neither is known.

    >>> pooled_mean([(10.0, 0.3)])
    (10.0, 0.3)
    >>> m, se = pooled_mean([(10.0, 0.1), (11.0, 0.1)]); round(m, 2), round(se, 2)
    (10.5, 0.5)
    """
    import math

    import numpy as np

    x = np.array([v for v, _ in runs], dtype=float)
    own = [s for _, s in runs if s is not None]
    within = math.sqrt(sum(s * s for s in own)) / len(own) if own else None
    between = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None
    known = [s for s in (within, between) if s is not None]
    return float(x.mean()), (max(known) if known else None)


def predicted_samples_per_s(trace: Any, samples_per_step: int) -> float:
    """Samples/s of a predicted trace under the comparison's window
    (:func:`psgdlab.analysis.compare.window_summary`, as against a measured run of as many steps)."""
    from psgdlab.analysis.compare import cut_at_first_finish, window_summary

    return float(window_summary(cut_at_first_finish(trace), samples_per_step=samples_per_step)["samples_per_s"])


def spread(runs: Sequence[tuple[float, float | None]]) -> dict[str, Any]:
    """The samples/s of every run of a case, their mean and its standard error
    (:func:`pooled_mean`)."""
    mean, se = pooled_mean(runs)
    return {"samples_per_s": [round(float(x), 4) for x, _ in runs], "mean": mean, "se": se}


def staleness_ok(c: Mapping[str, Any]) -> bool:
    """Whether a case's predicted mean staleness is within :data:`TARGETS` of the measured one
    (within 0.05 updates of a measured 0, a synchronous algorithm)."""
    p, m = c["staleness_mean_predicted"], c["staleness_mean_measured"]
    if p is None or m is None:
        return False
    if m == 0:
        return abs(p) <= 0.05  # both zero (synchronous): an absolute tolerance of 0.05 updates
    return abs(p - m) / m <= TARGETS["staleness_mean_rel_error"]


def mark_intervals(cases: list[dict[str, Any]], rows: Sequence[Mapping[str, Any]]) -> None:
    """Mark which measured step times fall inside their prediction's 90 % interval (issue 16).

    ``rows`` are the predictions' rows (:func:`psgdlab.sim.predict.predict_one`, with
    ``step_time_s_low``/``_high``); ``cases`` the comparison's cases, which compare the traces cut
    at the first finish, not the rows' own figures. The interval is a band of factors around the
    prediction (from the fit's parameter uncertainty and the run-to-run noise), so each case gets
    its row's band applied to its windowed prediction, written into the case as
    ``step_time_interval`` and ``in_interval``, with the row's ``noise_extrapolated``; a case
    whose row has no band is left unmarked.

    >>> case = {"algorithm": "ssgd", "workers": 2, "predicted_step_time_s": 1.0, "measured_step_time_s": 1.08}
    >>> row = {"algorithm": "ssgd", "workers": 2, "step_time_s": 2.0, "step_time_s_low": 1.8, "step_time_s_high": 2.2}
    >>> mark_intervals([case], [row])
    >>> case["step_time_interval"], case["in_interval"]
    ([0.9, 1.1], True)
    """
    bands = {}
    for r in rows:
        if r.get("step_time_s_low") is not None and r.get("step_time_s"):
            bands[(r["algorithm"], r["workers"])] = (
                r["step_time_s_low"],
                r["step_time_s_high"],
                r["step_time_s"],
                r.get("noise_extrapolated"),
            )
    for c in cases:
        band = bands.get((c["algorithm"], c["workers"]))
        pred, meas = c.get("predicted_step_time_s"), c.get("measured_step_time_s")
        if band is None or pred is None or meas is None:
            continue
        low, high, centre, beyond = band
        c["step_time_interval"] = [low / centre * pred, high / centre * pred]
        c["in_interval"] = bool(c["step_time_interval"][0] <= meas <= c["step_time_interval"][1])
        c["noise_extrapolated"] = beyond


def interval_coverage(table: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
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


def advantage_holds(
    predicted: float, measured: float, other_measured: float, se: float | None, other_se: float | None
) -> bool:
    r"""Whether a predicted advantage ``predicted`` (``(a - b) / b`` in samples/s) holds against the
    measured one ``measured``: within 10 % of the measured advantage's size,
    :math:`|p - m| \le 0.1\,|m|`, or within :data:`~psgdlab.analysis.compare.RANK_SE` combined
    standard errors of the measured means, the ranking rule's statistics
    (:func:`psgdlab.analysis.compare.ranking`): the predicted advantage applied to the measured
    ``b`` (``other_measured``) lands within :math:`2\sqrt{s_a^2 + s_b^2}` of the measured ``a``,
    :math:`|p - m|\,m_b \le 2\sqrt{s_a^2 + s_b^2}` (``se``, ``other_se``: the measured means'
    standard errors; ``None`` counts as exact, 0, as in the ranking).

    >>> advantage_holds(0.50, 0.48, 40.0, None, None)  # within 10 % of 0.48
    True
    >>> advantage_holds(0.10, 0.02, 40.0, None, None)  # 5 times the measured advantage, measured exactly
    False
    >>> advantage_holds(0.10, 0.02, 40.0, 1.5, 1.5)  # 3.2 samples/s off, inside 2 x 2.12
    True
    """
    import math

    from psgdlab.analysis.compare import RANK_SE

    off = abs(predicted - measured)
    if off <= 0.1 * abs(measured):
        return True
    combined = math.sqrt((se or 0.0) ** 2 + (other_se or 0.0) ** 2)
    return off * abs(other_measured) <= RANK_SE * combined


def hadpsgd_advantage(cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The advantage of H-ADPSGD in samples/s over AD-PSGD (fixed ring) and SSGD, predicted and
    measured, per group of cases (NIC rate, hosts, straggler, workers) of ``validate.json``'s
    table: ``(hadpsgd - other) / other`` on each side, whether the two agree in sign, whether
    they are within 10 % of each other (``|p - m| <= 0.1 max(|p|, |m|)``), and whether the
    prediction ``holds`` (:func:`advantage_holds`, on the cases' ``measured_samples_per_s_se``;
    the target ``validate --check`` reads).

    >>> rows = [{"algorithm": a, "workers": 4, "hosts": 2, "nic_bandwidth": "1Gbit/s", "straggler": "",
    ...          "predicted_samples_per_s": p, "measured_samples_per_s": m}
    ...         for a, p, m in (("hadpsgd", 60.0, 58.0), ("ssgd", 40.0, 39.0))]
    >>> [(a["over"], round(a["predicted"], 3), round(a["measured"], 3), a["same_sign"], a["within_10pct"], a["holds"])
    ...  for a in hadpsgd_advantage(rows)]
    [('ssgd', 0.5, 0.487, True, True, True)]
    """
    groups: dict[tuple[Any, ...], dict[str, Mapping[str, Any]]] = {}
    for c in cases:
        key = (c.get("nic_bandwidth"), c.get("hosts", 1), c["straggler"], c["workers"])
        groups.setdefault(key, {})[c["algorithm"]] = c
    out = []
    for (rate, hosts, straggler, workers), by in groups.items():
        h = by.get("hadpsgd")
        if h is None:
            continue
        for other in ("adpsgd", "ssgd"):
            o = by.get(other)
            if o is None:
                continue
            p = h["predicted_samples_per_s"] / o["predicted_samples_per_s"] - 1
            m = h["measured_samples_per_s"] / o["measured_samples_per_s"] - 1
            out.append(
                {
                    "nic_bandwidth": rate,
                    "hosts": hosts,
                    "straggler": straggler,
                    "workers": workers,
                    "over": other,
                    "predicted": p,
                    "measured": m,
                    "same_sign": p * m > 0,
                    "within_10pct": abs(p - m) <= 0.1 * max(abs(p), abs(m)),
                    "holds": advantage_holds(
                        p,
                        m,
                        o["measured_samples_per_s"],
                        h.get("measured_samples_per_s_se"),
                        o.get("measured_samples_per_s_se"),
                    ),
                }
            )
    return out
