"""The validation's case table and target lines as plain text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psgdlab.analysis.calibration_report import MAX_REL_RESIDUAL, Calibration
from psgdlab.analysis.compare import RANK_SE
from psgdlab.validate.plan import case_name
from psgdlab.validate.results import ValidationCase

__all__ = ["MAX_REL_RESIDUAL", "case_row", "format_table"]


def case_row(
    c: Mapping[str, Any], *, straggler: str = "", hosts: int = 1, nic_bandwidth: str | None = None
) -> ValidationCase:
    """One case of ``validate.json``'s table from a case of the comparison
    (:func:`psgdlab.analysis.compare.compare_cases`), run with ``straggler`` on ``hosts`` hosts
    joined at ``nic_bandwidth``."""
    sm = c["staleness_mean"]
    band = c.get("step_time_interval")
    return ValidationCase(
        algorithm=c["algorithm"],
        workers=c["workers"],
        predicted_step_time_s=c["predicted_step_time_s"],
        measured_step_time_s=c["measured_step_time_s"],
        step_time_error=c["step_time_error"],
        staleness_mean_predicted=c["staleness_mean_predicted"],
        staleness_mean_measured=c["staleness_mean_measured"],
        staleness_mean_rel_error=sm["rel_error"] if sm["measured"] else None,
        predicted_samples_per_s=c["samples_per_s"]["predicted"],
        measured_samples_per_s=c["samples_per_s"]["measured"],
        measured_samples_per_s_se=c["samples_per_s"].get("measured_se"),
        # the prediction's 90 % step-time interval, relative to the prediction, and whether the
        # measured step time fell inside (None: the prediction had no interval)
        interval_low=band[0] / c["predicted_step_time_s"] if band is not None else None,
        interval_high=band[1] / c["predicted_step_time_s"] if band is not None else None,
        in_interval=c.get("in_interval"),
        # the interval's run-to-run noise was measured at fewer worker processes per core
        noise_extrapolated=c.get("noise_extrapolated"),
        # where the step went on each side (psgdlab.core.records.trace.step_path; compare/report.md's table)
        path={k: {side: v[side] for side in ("predicted", "measured")} for k, v in (c.get("path") or {}).items()},
        straggler=straggler,
        hosts=hosts,
        nic_bandwidth=nic_bandwidth,
    )


def _interval_line(summary: Mapping[str, Any]) -> str:
    """The coverage of the 90 % intervals and their widest half-width, against issue 16's targets."""
    cov, width = summary.get("interval_coverage"), summary.get("interval_max_half_width")
    if cov is None or width is None:
        return "90% intervals: none (the platform has no [uncertainty] table)"
    met, target = summary["targets_met"], summary["targets"]
    beyond = sum(1 for c in summary["cases"] if c.get("noise_extrapolated"))
    return (
        f"measured inside the 90% interval {cov * 100:.0f}% of cases "
        f"(target >= {target['interval_coverage'] * 100:g}%: {'met' if met['interval_coverage'] else 'MISSED'}); "
        f"widest half-width {width * 100:.1f}% "
        f"(target <= {target['interval_half_width'] * 100:g}%: {'met' if met['interval_max_half_width'] else 'MISSED'})"
        + (
            f"; {beyond} of {len(summary['cases'])} intervals carry noise measured at fewer worker processes per core"
            if beyond
            else ""
        )
    )


def format_table(summary: Mapping[str, Any]) -> str:
    """The case table and the target lines as plain text, of a
    :class:`~psgdlab.validate.results.ValidationReport` or its JSON (``validate.json``, or what
    ``validate --json`` printed: without the calibration, whose lines are then left out)."""
    head = (
        f"{'case':<28} {'pred step s':>11} {'meas step s':>11} {'error':>8} {'stale pred':>10} "
        f"{'stale meas':>10} {'pred samples/s':>14} {'meas samples/s':>14} {'error':>8}"
    )
    lines = [head, "-" * len(head)]
    for c in summary["cases"]:
        label = case_name(c["algorithm"], c["workers"], c["straggler"], c.get("hosts", 1), c.get("nic_bandwidth"))
        err = c["step_time_error"]
        ps, ms = c["predicted_samples_per_s"], c["measured_samples_per_s"]
        lines.append(
            f"{label:<28} {c['predicted_step_time_s']:>11.4f} {c['measured_step_time_s']:>11.4f} "
            f"{(err * 100 if err is not None else float('nan')):>7.1f}% "
            f"{c['staleness_mean_predicted']:>10.3f} {c['staleness_mean_measured']:>10.3f} "
            f"{ps:>14.1f} {ms:>14.1f} {(ps - ms) / ms * 100:>7.1f}%"
        )
    med, mx = summary["median_abs_step_time_error"], summary["max_abs_step_time_error"]
    met, target = summary["targets_met"], summary["targets"]
    lines += [
        "",
        f"median |step-time error| {med * 100:.1f}% "
        f"(target <= {target['median_abs_step_time_error'] * 100:g}%: "
        f"{'met' if met['median_abs_step_time_error'] else 'MISSED'})",
        f"max    |step-time error| {mx * 100:.1f}% "
        f"(target <= {target['max_abs_step_time_error'] * 100:g}%: "
        f"{'met' if met['max_abs_step_time_error'] else 'MISSED'})",
        f"mean staleness within 10%: {'met' if met['staleness_mean'] else 'MISSED'}",
        _interval_line(summary),
        f"ranking by samples/s: {summary['ranking']['ranked']} pairs ranked, {summary['ranking']['tied']} "
        f"measured ties (within {RANK_SE:g} combined standard errors), {summary['ranking']['misordered']} "
        f"misordered ({'met' if met['ranking_identical'] else 'MISSED'})",
    ]
    for straggler, per_n in summary.get("ranking_detail", {}).items():
        for n, r in per_n.items():
            pred = " > ".join(" = ".join(c) for c in r["predicted"])
            seeds = f" (mean of {r['predictions']} predictions)" if r.get("predictions") else ""
            group = straggler if "hosts" in straggler else f"straggler {straggler}"
            lines.append(
                f"  {group}, {n} workers: predicted{seeds} {pred}; measured {' > '.join(r['measured'])} "
                f"({r['ranked']} ranked, {r['tied']} tied, {r['misordered']} misordered)"
            )
            for a, b, dp, dm in r["swaps"]:
                lines.append(f"    misordered: {a} predicted {dp * 100:+.2f}% over {b}, measured {dm * 100:+.2f}%")
            for a, sp in r.get("remeasured", {}).items():
                se = f"{sp['se']:.2f}" if sp["se"] is not None else "?"
                lines.append(
                    f"    re-measured {a}: {sp['mean']:.2f} +- {se} samples/s (mean +- standard "
                    f"error of {len(sp['samples_per_s'])} runs: "
                    f"{', '.join(f'{x:.1f}' for x in sp['samples_per_s'])})"
                )
    for a in summary.get("hosts", {}).get("advantage", []):
        lines.append(
            f"hadpsgd over {a['over']} ({a['hosts']} hosts, {a['workers']} workers, nic {a['nic_bandwidth']}, "
            f"straggler {a['straggler'] or 'none'}): predicted {a['predicted'] * 100:+.1f}%, measured "
            f"{a['measured'] * 100:+.1f}% (same sign: {a['same_sign']}, within 10 % of each other: {a['within_10pct']}"
            + (f", holds: {a['holds']})" if "holds" in a else ")")
        )
    calibration = summary.get("calibration") or {}
    if "link" not in calibration and calibration:  # one calibration per NIC rate
        calibration = next(iter(calibration.values()))
    if calibration:
        lines += [f"calibration: {line.strip()}" for line in Calibration.from_json(calibration).describe()[1:]]
    load = summary.get("load_average", {})
    if load:
        idle = [v["idle_cores"] for v in load.values() if isinstance(v, dict) and v.get("idle_cores") is not None]
        lines.append(
            f"load average (1, 5, 15 min) at the start {load['start']}, at the end {load['end']}"
            + (
                f"; idle cores before the runs: median {sorted(idle)[len(idle) // 2]:.2f}, min {min(idle):.2f}"
                if idle
                else ""
            )
        )
    return "\n".join(lines)
