"""Markdown report of a comparison, and writing the figures beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from psgdlab.analysis.load import load_cases
from psgdlab.core.records.trace import atomic_write_json, atomic_write_text

__all__ = ["markdown_report", "write_report"]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _num(x: float | None, scale: float = 1.0, fmt: str = "{:.4g}") -> str:
    return "n/a" if x is None else fmt.format(x * scale)


#: the columns of the report's table of where a step goes: key of ``step_path``, heading
_PATH_COLUMNS = (
    ("after_compute_s", "after compute"),
    ("compute_end_spread_s", "compute-end spread"),
    ("restart_spread_s", "restart spread"),
    ("worker_step_min_s", "fastest worker's step"),
    ("worker_step_max_s", "slowest worker's step"),
)


def _path_table(cases: list[dict[str, Any]]) -> list[str]:
    """The table of where each case's step goes (:func:`psgdlab.core.records.trace.step_path`),
    predicted / measured in ms; no lines when no case has it."""
    rows = [c for c in cases if any(v.get("measured") is not None for v in (c.get("path") or {}).values())]
    if not rows:
        return []
    lines = [
        "",
        "Where the step goes (ms, predicted / measured; `after compute`: from the last worker's compute "
        "end to the last worker's next compute, the critical path of a step in which every worker waits "
        "for the others; spreads: how far apart the workers end their compute and start the next):",
        "",
        "| algorithm | workers | " + " | ".join(h for _, h in _PATH_COLUMNS) + " |",
        "|---|---|" + "---|" * len(_PATH_COLUMNS),
    ]
    for c in rows:
        cells = [
            f"{_num(c['path'][k]['predicted'], 1e3)} / {_num(c['path'][k]['measured'], 1e3)}" for k, _ in _PATH_COLUMNS
        ]
        lines.append(f"| {c['algorithm']} | {c['workers']} | " + " | ".join(cells) + " |")
    return lines


def markdown_report(result: dict[str, Any]) -> str:
    lines = [
        "# Prediction against measurement",
        "",
        f"- predicted: `{result['predicted_dir']}`",
        f"- measured: `{result['measured_dir']}`",
        "",
        "| algorithm | workers | step time pred (ms) | meas (ms) | error | samples/s pred | meas | error "
        "| comm pred | comm meas | staleness pred | meas | staleness TV |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        st, sp, cm, sl = c["step_time_s"], c["samples_per_s"], c["comm_fraction"], c["staleness_mean"]
        lines.append(
            f"| {c['algorithm']} | {c['workers']} | {_num(st['predicted'], 1e3)} | {_num(st['measured'], 1e3)} "
            f"| {_pct(st['rel_error'])} | {_num(sp['predicted'])} | {_num(sp['measured'])} | {_pct(sp['rel_error'])} "
            f"| {_num(cm['predicted'], fmt='{:.2f}')} | {_num(cm['measured'], fmt='{:.2f}')} "
            f"| {_num(sl['predicted'], fmt='{:.2f}')} | {_num(sl['measured'], fmt='{:.2f}')} "
            f"| {c['staleness_tv']:.3f} |"
        )
    lines += _path_table(result["cases"])
    lines += [
        "",
        f"Median absolute step-time error: {_pct(result['median_abs_step_time_error'])}; "
        f"maximum: {_pct(result['max_abs_step_time_error'])}.",
        f"Ranking of algorithms by samples/s identical: {'yes' if result['ranking_identical'] else 'no'} "
        "(a pair is ranked only when its measured difference exceeds two combined standard errors; "
        "exact ties in the prediction are one class, in either order).",
        "",
    ]
    for n, r in (result.get("ranking") or {}).items():
        pred = " > ".join(" = ".join(c) for c in r["predicted"])
        lines.append(
            f"- {n} workers: predicted {pred}; measured {' > '.join(r['measured'])} "
            f"({r.get('ranked', '?')} pairs ranked, {r.get('tied', '?')} measured ties, "
            f"{r.get('misordered', len(r['swaps']))} misordered)"
        )
        for a, b, dp, dm in r["swaps"]:
            lines.append(f"  - misordered: {a} predicted {_pct(dp)} over {b}, measured {_pct(dm)}")
        for a, sp in (r.get("remeasured") or {}).items():
            lines.append(
                f"  - {a} measured {len(sp['samples_per_s'])} times (a pair came out of the predicted "
                f"order): mean {_num(sp['mean'])} samples/s, standard error {_num(sp['se'])}"
            )
    lines.append("")
    for key, label in (
        ("missing_in_measured", "predicted but not measured"),
        ("missing_in_predicted", "measured but not predicted"),
    ):
        if result.get(key):
            lines.append(f"Cases {label}: " + ", ".join(f"{a}/{w}" for a, w in result[key]))
    return "\n".join(lines) + "\n"


def write_report(result: dict[str, Any], out_dir: str | Path, *, figures: bool = True) -> Path:
    """Write ``compare.json``, ``report.md`` and (optionally) per-case PNG figures into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "compare.json", result)
    atomic_write_text(out / "report.md", markdown_report(result))
    if figures:
        from psgdlab.analysis.figures import (
            error_figure,
            save_figure,
            staleness_figure,
            step_time_figure,
            timeline_figure,
        )

        preds, meas = load_cases(result["predicted_dir"]), load_cases(result["measured_dir"])
        save_figure(error_figure(result), out / "step_time_error.png", dpi=110)
        for c in result["cases"]:
            key = (c["algorithm"], c["workers"])
            tag = f"{c['algorithm']}-w{c['workers']}"
            save_figure(step_time_figure(preds[key], meas[key]), out / f"{tag}-step_time.png", dpi=110)
            save_figure(staleness_figure(preds[key], meas[key]), out / f"{tag}-staleness.png", dpi=110)
            save_figure(timeline_figure(preds[key], meas[key]), out / f"{tag}-timeline.png", dpi=110)
    return out
