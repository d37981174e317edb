"""``validate --check``: the targets a validation missed, one line each.

A CI gates on ``psgdlab validate --check`` (exit 1 when any line is returned). Each line names
the target, the figure and the rule it missed; a target of ``targets_met`` this module does not
know is named as missed by its key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psgdlab.validate.plan import case_name
from psgdlab.validate.stats import staleness_ok

__all__ = ["missed_targets", "missed_convergence_targets"]


def missed_targets(report: Mapping[str, Any]) -> list[str]:
    """One line per target of ``report`` (a :class:`~psgdlab.validate.results.ValidationReport`
    or its JSON, ``validate.json``) that ``targets_met`` marks missed, in ``targets_met``'s order;
    ``[]`` when every target is met.

    >>> report = {"targets": {"max_abs_step_time_error": 0.2}, "targets_met": {"max_abs_step_time_error": False,
    ...           "ranking_identical": True}, "max_abs_step_time_error": 0.25, "cases": []}
    >>> missed_targets(report)
    ['max_abs_step_time_error: the largest |step-time error| is 25.0%, the target at most 20%']
    """
    lines = []
    for name, met in report["targets_met"].items():
        if not met:
            lines.append(f"{name}: {_why(name, report)}")
    return lines


def _pct(x: float | None) -> str:
    return "not measured" if x is None else f"{x * 100:.1f}%"


def _label(c: Mapping[str, Any]) -> str:
    return case_name(c["algorithm"], c["workers"], c.get("straggler", ""), c.get("hosts", 1), c.get("nic_bandwidth"))


def _why(name: str, r: Mapping[str, Any]) -> str:
    """The figure behind a missed target and the rule it broke."""
    t = r["targets"]
    if name == "median_abs_step_time_error":
        return f"the median |step-time error| is {_pct(r[name])}, the target at most {t[name] * 100:g}%"
    if name == "max_abs_step_time_error":
        return f"the largest |step-time error| is {_pct(r[name])}, the target at most {t[name] * 100:g}%"
    if name == "staleness_mean":
        off = [_label(c) for c in r["cases"] if not staleness_ok(c)]
        rule = t.get("staleness_mean_rel_error", 0.1) * 100
        return f"mean staleness off by more than {rule:g}% (0.05 updates of a synchronous 0) in {', '.join(off)}"
    if name == "ranking_identical":
        swaps = [
            f"{a} over {b} (workers {n}, {group})"
            for group, per_n in r.get("ranking_detail", {}).items()
            for n, g in per_n.items()
            for a, b, *_ in g.get("swaps", [])
        ]
        return f"{r['ranking']['misordered']} ranked pair(s) predicted in the wrong order: {', '.join(swaps)}"
    if name == "interval_coverage":
        return (
            f"{_pct(r['interval_coverage'])} of measured step times inside their 90% interval, "
            f"the target at least {t['interval_coverage'] * 100:g}%"
        )
    if name == "interval_max_half_width":
        return (
            f"the widest 90% interval is +-{_pct(r['interval_max_half_width'])}, "
            f"the target at most +-{t['interval_half_width'] * 100:g}%"
        )
    if name == "hadpsgd_advantage":
        off = [
            f"over {a['over']} ({a['hosts']} hosts, {a['workers']} workers, nic {a['nic_bandwidth'] or 'unshaped'}, "
            f"straggler {a['straggler'] or 'none'}: predicted {a['predicted'] * 100:+.1f}%, "
            f"measured {a['measured'] * 100:+.1f}%)"
            for a in (r.get("hosts") or {}).get("advantage", [])
            if not a.get("holds", False)
        ]
        return (
            "H-ADPSGD's predicted advantage is neither within 10% of the measured one nor within two "
            f"combined standard errors of the measured means: {', '.join(off)}"
        )
    return "missed"


def missed_convergence_targets(report: Mapping[str, Any]) -> list[str]:
    """One line per target of ``validate --convergence``'s report (``validate_convergence.json``)
    that its ``targets_met`` marks missed, with the figure and the rule
    (:data:`psgdlab.validate.convergence_plan.TARGETS`); ``[]`` when every target is met.

    >>> missed_convergence_targets({"targets_met": {"median_abs_time_to_target_error": False, "coverage": True},
    ...                             "median_abs_time_to_target_error": 0.142})
    ['median_abs_time_to_target_error: the median |time-to-target error| is 14.2%, the target at most 10%']
    """
    from psgdlab.validate.convergence_plan import TARGETS

    rules = {
        "median_abs_time_to_target_error": lambda: (
            f"the median |time-to-target error| is {_pct(report.get('median_abs_time_to_target_error'))}, "
            f"the target at most {TARGETS['median_abs_time_to_target_error'] * 100:g}%"
        ),
        "max_abs_time_to_target_error": lambda: (
            f"the largest |time-to-target error| is {_pct(report.get('max_abs_time_to_target_error'))}, "
            f"the target at most {TARGETS['max_abs_time_to_target_error'] * 100:g}%"
        ),
        "coverage": lambda: (
            f"{_pct(report.get('coverage'))} of runs' times to target inside their 90% interval, "
            f"the target at least {TARGETS['coverage'] * 100:g}%"
        ),
        "ranking_identical": lambda: (
            f"{(report.get('ranking') or {}).get('misordered', '?')} ranked pair(s) measured in the other order"
        ),
        "non_converging": lambda: (
            "reached the target though predicted not to: "
            + ", ".join(map(str, report.get("reached_though_predicted_not") or ["?"]))
        ),
    }
    return [f"{name}: {rules.get(name, lambda: 'missed')()}" for name, met in report["targets_met"].items() if not met]
