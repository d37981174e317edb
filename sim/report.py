"""Writing predictions: run directories and the stdout table.

Layout written by :func:`write_prediction` (every file atomic; ``summary.json`` written after the
rest; the caller commits the directory and its ``runs/ALG-wN`` once it has drawn the figures:
:func:`psgdlab.core.records.rundir.commit_run`)::

    OUT/
      config.resolved.json    platform, workload and request, fully resolved
      env.json                versions, git SHA, host (psgdlab.core.records.rundir.environment)
      summary.json            a SweepSummary (psgdlab.core.records.summaries): one row per (algorithm, workers)
      speedup.png             (drawn by the command from the rows:
      staleness.png            psgdlab.analysis.figures.write_prediction_figures)
      trace.npz, timeline.json  only when the request is a single configuration
      runs/ALG-wN/            one run directory per configuration: config.resolved.json,
                              env.json, trace.npz, summary.json, timeline.json (first events)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from psgdlab.core.records.rows import IntervalInfo, PredictionRow, TargetColumns
from psgdlab.core.records.rundir import RunDir, Summary, environment, write_summary
from psgdlab.core.records.summaries import SweepSummary
from psgdlab.core.records.trace import to_chrome_trace, write_trace
from psgdlab.sim.predict import Prediction
from psgdlab.sim.workload import SimConfig

__all__ = [
    "write_prediction",
    "sweep_summary",
    "format_table",
    "interval_lines",
    "noise_load_lines",
    "failure_lines",
    "row_flags",
    "target_cell",
    "target_lines",
]

TIMELINE_EVENTS = 4000


def _config_dict(config: SimConfig, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "platform": dataclasses.asdict(config.platform),
        "workload": dataclasses.asdict(config.workload),
        "defaults": dataclasses.asdict(config.defaults),
        "source": config.source,
        "request": request,
    }


def write_prediction(
    out: str | Path,
    config: SimConfig,
    predictions: Sequence[Prediction],
    request: dict[str, Any],
    *,
    per_run: bool = True,
) -> RunDir:
    """Write the run directory of a sweep (see the module docstring)."""
    run = RunDir(out)
    env = environment(
        source="simulator",
        world_size=max(p.row.workers for p in predictions),
        extra={"platform": config.platform.name},
    )
    cfg = _config_dict(config, request)
    run.write_json("config.resolved.json", cfg)
    run.write_json("env.json", env)
    if per_run:
        for p in predictions:
            sub = RunDir(run.path / "runs" / f"{p.row.algorithm}-w{p.row.workers}")
            sub.write_json("config.resolved.json", {**cfg, "algorithm": p.row.params, "workers": p.row.workers})
            sub.write_json("env.json", {**env, "world_size": p.row.workers})
            write_trace(sub / "trace.npz", p.result.trace, p.result.meta)
            to_chrome_trace(p.result.trace, sub / "timeline.json", meta=p.result.meta, max_events=TIMELINE_EVENTS)
            write_summary(sub, _case_summary(p))
    if len(predictions) == 1:
        p = predictions[0]
        write_trace(run / "trace.npz", p.result.trace, p.result.meta)
        to_chrome_trace(p.result.trace, run / "timeline.json", meta=p.result.meta, max_events=50_000)
    write_summary(run, sweep_summary(config, predictions))  # after the rest; the caller commits the whole directory
    return run


def sweep_summary(config: SimConfig, predictions: Sequence[Prediction]) -> SweepSummary:
    """The :class:`~psgdlab.core.records.summaries.SweepSummary` of a sweep's predictions on ``config``."""
    rows = tuple(p.row for p in predictions)
    w, flags = config.workload, row_flags(rows)
    return SweepSummary(
        platform=config.platform.name,
        workload=w.name,
        payload_bytes=w.payload_bytes,
        batch_per_worker=rows[0].batch_per_worker if rows else w.batch_per_worker,
        sample_unit=w.sample_unit,
        samples_per_epoch=w.samples_per_epoch,
        epochs=w.epochs,
        has_unpinned_parameters=flags["has_unpinned_parameters"],
        noise_extrapolated=flags["noise_extrapolated"],
        rows=rows,
    )


def _hms(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def format_table(
    config: SimConfig, rows: Sequence[PredictionRow], *, run_dir: str | None = None, wall_s: float | None = None
) -> str:
    """A readable table of the rows (node shape = hosts used x workers per host)."""
    p, w = config.platform, config.workload
    b = rows[0].batch_per_worker if rows else w.batch_per_worker
    head = (
        f"{p.name}: {p.hosts} hosts x {p.devices_per_host} {p.device}; {w.name} "
        f"({w.payload_bytes / 1e6:.1f} MB); batch {b} {w.sample_unit} per worker; "
        f"{w.epochs:g} epochs of {w.samples_per_epoch:.3g}"
    )
    has_interval = bool(rows) and all(r.intervals is not None for r in rows)
    has_target = bool(rows) and all(r.to_target is not None for r in rows)
    goal = rows[0].to_target.target if has_target and rows[0].to_target is not None else ""
    cols = (
        "algorithm",
        "workers",
        "nodes",
        "step ms",
        "samples/s",
        "speedup [90 %]" if has_interval else "speedup",
        "epoch",
        f"to {goal} [90 %]" if has_target else "train*",
        "comm%",
        "idle%",
        "stale",
    )
    widths = [9] * len(cols)
    if has_interval:
        widths[5] = 22
    if has_target:
        widths[7] = 25
        head += f"; target {goal}"
    lines = [head, _cells(cols, widths)]
    for r in rows:
        name = r.algorithm if r.ran_as == r.algorithm else f"{r.algorithm}({r.ran_as})"
        speedup = f"{r.speedup:.2f}"
        if r.intervals is not None:
            speedup += f" [{r.intervals.speedup_low:.2f}, {r.intervals.speedup_high:.2f}]"
        cells = (
            name,
            str(r.workers),
            r.node_shape,
            f"{r.step_time_s * 1e3:.1f}",
            f"{r.samples_per_s:.0f}",
            speedup,
            _hms(r.epoch_time_s),
            target_cell(r.to_target) if has_target and r.to_target is not None else _hms(r.time_to_train_s),
            f"{100 * r.comm_fraction:.1f}",
            f"{100 * r.idle_fraction:.1f}",
            f"{r.staleness_mean:.2f}",
        )
        lines.append(_cells(cells, widths))
    win = sorted({r.extrapolation.window_steps_per_worker for r in rows})
    unsteady = [f"{r.algorithm}x{r.workers}" for r in rows if not r.extrapolation.steady]
    what = "train time" if not has_target else "time to target: steps to target (convergence model) x step time,"
    lines.append(
        "nodes = hosts used x workers per host; ALG(sgd) = one worker runs plain SGD; "
        "stale = mean staleness in updates; speedup over "
        f"1-worker SGD; {'' if has_target else '* '}{what} extrapolated from a window of {'/'.join(map(str, win))} "
        f"steps per worker" + (f" (not steady: {', '.join(unsteady)})" if unsteady else "")
    )
    if has_target:
        lines.extend(target_lines(rows))
    if rows and rows[0].intervals is not None:
        lines.extend(interval_lines(rows[0].intervals.interval))
        lines.extend(noise_load_lines(rows))
    lines.extend(failure_lines(rows))
    if run_dir is not None:
        lines.append(f"run directory: {run_dir}" + (f"   ({wall_s:.1f} s)" if wall_s is not None else ""))
    return "\n".join(lines)


def target_cell(t: TargetColumns) -> str:
    """A row's time to target with its 90 % interval, or ``no: REASON`` (short) when it does not
    reach the target."""
    if not t.reaches_target:
        return f"no: {t.target_short_reason or 'see below'}"
    low, high = _num(t.time_to_target_s_low), _num(t.time_to_target_s_high)
    return f"{_hms(_num(t.time_to_target_s))} [{_hms(low)}, {_hms(high)}]"


def _num(x: float | None) -> float:
    """A figure a row that reaches its target has (``nan`` where it is missing)."""
    return float("nan") if x is None else float(x)


def target_lines(rows: Sequence[PredictionRow]) -> list[str]:
    """The lines under a table with times to target: the reason of each row that does not reach
    it (once per reason), and the GPU-hours of each that does."""
    lines = []
    reasons: dict[str, list[str]] = {}
    targets = [(r, r.to_target) for r in rows if r.to_target is not None]
    for r, t in targets:
        if not t.reaches_target:
            reasons.setdefault(str(t.target_reason), []).append(f"{r.algorithm}x{r.workers}")
    for reason, names in reasons.items():
        lines.append(f"does not reach {targets[0][1].target}: {', '.join(names)}: {reason}")
    hours = [
        f"{r.algorithm}x{r.workers} {_num(t.gpu_hours_to_target):.0f} "
        f"[{_num(t.gpu_hours_to_target_low):.0f}, {_num(t.gpu_hours_to_target_high):.0f}]"
        for r, t in targets
        if t.reaches_target
    ]
    if hours:
        lines.append("GPU-hours to target [90 %]: " + "; ".join(hours))
    return lines


def _cells(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))


def interval_lines(interval: IntervalInfo) -> list[str]:
    """The lines under the table that say what the ``[90 %]`` intervals hold (a row's
    ``interval``, :func:`psgdlab.core.records.intervals.interval_description`)."""
    if interval.parameters_exact:
        why = "log-sd 0" if interval.parameters else "no [uncertainty] table"
        params = f"no parameter uncertainty (the profile's values taken as exact: {why})"
    else:
        params = (
            f"the uncertainty of {len(interval.parameters)} parameter(s) ({interval.directions} "
            "direction(s), delta method)"
        )
    lines = [
        f"[{100 * interval.level:g} %] intervals hold {params}, the simulated window's noise and "
        f"run-to-run noise (cv {interval.noise_cv:g})"
    ]
    if interval.unpinned:
        lines.append(
            "unpinned parameters (the data did not pin them down: spec-sheet prior, its spread in the "
            f"interval): {', '.join(interval.unpinned)}"
        )
    return lines


def row_flags(rows: Sequence[PredictionRow]) -> dict[str, bool]:
    """Whether any row has unpinned parameters, or noise measured at fewer processes per core
    (the summary's and ``predict --json``'s ``has_unpinned_parameters``, ``noise_extrapolated``)."""
    spans = [r.intervals for r in rows if r.intervals is not None]
    return {
        "has_unpinned_parameters": any(i.has_unpinned_parameters for i in spans),
        "noise_extrapolated": any(i.noise_extrapolated for i in spans),
    }


def noise_load_lines(rows: Sequence[PredictionRow]) -> list[str]:
    """A line naming the rows whose run-to-run noise was measured on a less loaded machine
    (``noise_extrapolated``: more worker processes per core than any run behind the profile's
    noise); none when no row is."""
    beyond = [(r, r.intervals) for r in rows if r.intervals is not None and r.intervals.noise_extrapolated]
    if not beyond:
        return []
    measured_at = beyond[0][1].interval.noise_processes_per_core or 0.0
    names = ", ".join(f"{r.algorithm}x{r.workers} ({r.processes_per_core or 0:g})" for r, _ in beyond)
    return [
        f"noise measured at up to {measured_at:g} worker processes per core; these rows run more, and "
        f"their intervals leave out what sharing a core adds: {names}"
    ]


def failure_lines(rows: Sequence[PredictionRow]) -> list[str]:
    """What failures cost each row that has them (its ``failures``, :mod:`psgdlab.sim.failures`)."""
    lines = []
    for r in rows:
        f = r.failures
        if not f:
            continue
        head = f"{r.algorithm} x{r.workers}: on failure {f['policy']} (detection {f['detection_s']:g} s"
        head += f", restart {f['restart_s']:g} s" if f["restart_s"] is not None else ""
        ckpt = f"checkpoint every {f['checkpoint_every']} steps" if f["checkpoint_every"] else "no checkpoints"
        lines.append(f"{head}, {ckpt}); train {_hms(f['time_to_train_without_failures_s'])} without failures")
        if "membership_changes" in f:
            for c in f["membership_changes"]:
                extra = f", resumed from step {c['resumed_from_step']}" if "resumed_from_step" in c else ""
                extra += f"; survivors stall {c['stall_s']:.1f} s" if "stall_s" in c else ""
                lines.append(
                    f"  rank {','.join(map(str, c['removed']))} dies at {_hms(c['failed_at_s'])} (step {c['step']}), "
                    f"acted on {c['detection_s']:g} s later{extra}"
                )
            lines.append(f"  lost {f['steps_lost']} steps ({f['samples_lost']:.0f} samples); {_outcome(f)}")
        rnd = f.get("random")
        if rnd:
            mean = rnd["time_to_train_mean_s"]
            train = (
                f"the draws that finish train {_hms(mean)} on average [p10 {_hms(rnd['time_to_train_p10_s'])}, "
                f"p90 {_hms(rnd['time_to_train_p90_s'])}]"
                if mean is not None
                else "no draw finishes"
            )
            lines.append(
                f"  {rnd['per_worker_hour']:g} failures per worker-hour ({rnd['draws']} draws, "
                f"{rnd['failures_mean']:.1f} failures each on average): {train}; "
                f"{100 * rnd['finished_fraction']:.0f} % of draws finish"
            )
    return lines


def _outcome(f: dict[str, Any]) -> str:
    if f["stopped_at_s"] is not None:
        return (
            f"the run stops at {_hms(f['stopped_at_s'])} with {f['samples_kept_at_stop']:.0f} samples "
            "checkpointed; it does not finish"
        )
    n_after = len(f["survivors"])
    return (
        f"throughput {f['throughput_before_samples_per_s']:.0f} -> {f['throughput_after_samples_per_s']:.0f} "
        f"samples/s ({f['throughput_after_ratio']:.3f} of {n_after}/{_before(f)} of before); "
        f"train {_hms(f['time_to_train_s'])}"
    )


def _before(f: dict[str, Any]) -> int:
    return len(f["survivors"]) + sum(len(c["removed"]) for c in f["membership_changes"] if "resumed_from_step" not in c)


def _case_summary(p: Prediction) -> Summary:
    """One prediction as the :class:`~psgdlab.core.records.rundir.Summary` of its case directory: the
    trace's summary and the sweep's row as its figures; the row's name is the case's where it is
    not the algorithm's (a sweep's 1-worker point runs as sgd; a validation names its cases)."""
    row = p.row.to_json()
    figures = {k: v for k, v in {**p.summary, **row}.items() if k not in ("algorithm", "workers", "params")}
    name, ran = p.row.algorithm, str(p.row.params["algorithm"])
    return Summary(
        source="simulator",
        algorithm=ran,
        algorithm_params=p.row.params,
        workers=p.row.workers,
        case=name if name != ran else None,
        figures=figures,
    )
