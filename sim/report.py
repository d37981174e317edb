"""Writing predictions: run directories and the stdout table.

Layout written by :func:`write_prediction` (every file atomic)::

    OUT/
      config.resolved.json    platform, workload and request, fully resolved
      env.json                versions, git SHA, host (psgdlab.core.rundir.environment)
      summary.json            {"rows": [...], ...} one row per (algorithm, workers)
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

from psgdlab.core.rundir import RunDir, Summary, environment, write_summary
from psgdlab.core.trace import to_chrome_trace, write_trace
from psgdlab.sim.predict import Prediction
from psgdlab.sim.workload import SimConfig

__all__ = ["write_prediction", "format_table"]

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
        world_size=max(p.row["workers"] for p in predictions),
        extra={"platform": config.platform.name},
    )
    cfg = _config_dict(config, request)
    run.write_json("config.resolved.json", cfg)
    run.write_json("env.json", env)
    rows = [p.row for p in predictions]
    w = config.workload
    summary = {
        "source": "simulator",
        "platform": config.platform.name,
        "workload": w.name,
        "payload_bytes": w.payload_bytes,
        "batch_per_worker": rows[0]["batch_per_worker"] if rows else w.batch_per_worker,
        "sample_unit": w.sample_unit,
        "samples_per_epoch": w.samples_per_epoch,
        "epochs": w.epochs,
        "speedup_baseline": "single-worker SGD on the same platform, workload and per-worker batch",
        "staleness_unit": "updates",
        "extrapolated": True,
        "extrapolation_note": "time_to_train_s and epoch_time_s are extrapolated from a simulated window "
        "of each configuration (rows[i].extrapolation gives the window and "
        "whether it was steady)",
        "rows": rows,
    }
    run.write_json("summary.json", summary)
    if per_run:
        for p in predictions:
            sub = RunDir(run.path / "runs" / f"{p.row['algorithm']}-w{p.row['workers']}")
            sub.write_json("config.resolved.json", {**cfg, "algorithm": p.row["params"], "workers": p.row["workers"]})
            sub.write_json("env.json", {**env, "world_size": p.row["workers"]})
            write_trace(sub / "trace.npz", p.result.trace, p.result.meta)
            write_summary(sub, _case_summary(p))
            to_chrome_trace(p.result.trace, sub / "timeline.json", meta=p.result.meta, max_events=TIMELINE_EVENTS)
    if len(predictions) == 1:
        p = predictions[0]
        write_trace(run / "trace.npz", p.result.trace, p.result.meta)
        to_chrome_trace(p.result.trace, run / "timeline.json", meta=p.result.meta, max_events=50_000)
    return run


def _hms(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def format_table(
    config: SimConfig, rows: Sequence[dict[str, Any]], *, run_dir: str | None = None, wall_s: float | None = None
) -> str:
    """A readable table of the rows (node shape = hosts used x workers per host)."""
    p, w = config.platform, config.workload
    b = rows[0]["batch_per_worker"] if rows else w.batch_per_worker
    head = (
        f"{p.name}: {p.hosts} hosts x {p.devices_per_host} {p.device}; {w.name} "
        f"({w.payload_bytes / 1e6:.1f} MB); batch {b} {w.sample_unit} per worker; "
        f"{w.epochs:g} epochs of {w.samples_per_epoch:.3g}"
    )
    cols = (
        "algorithm",
        "workers",
        "nodes",
        "step ms",
        "samples/s",
        "speedup",
        "epoch",
        "train*",
        "comm%",
        "idle%",
        "stale",
    )
    lines = [head, "  ".join(f"{c:>9}" for c in cols)]
    for r in rows:
        name = r["algorithm"] if r["ran_as"] == r["algorithm"] else f"{r['algorithm']}({r['ran_as']})"
        cells = (
            name,
            str(r["workers"]),
            r["node_shape"],
            f"{r['step_time_s'] * 1e3:.1f}",
            f"{r['samples_per_s']:.0f}",
            f"{r['speedup']:.2f}",
            _hms(r["epoch_time_s"]),
            _hms(r["time_to_train_s"]),
            f"{100 * r['comm_fraction']:.1f}",
            f"{100 * r['idle_fraction']:.1f}",
            f"{r['staleness_mean']:.2f}",
        )
        lines.append("  ".join(f"{c:>9}" for c in cells))
    win = sorted({r["extrapolation"]["window_steps_per_worker"] for r in rows})
    unsteady = [f"{r['algorithm']}x{r['workers']}" for r in rows if not r["extrapolation"]["steady"]]
    lines.append(
        "nodes = hosts used x workers per host; ALG(sgd) = one worker runs plain SGD; "
        "stale = mean staleness in updates; speedup over "
        f"1-worker SGD; * train time extrapolated from a window of {'/'.join(map(str, win))} "
        f"steps per worker" + (f" (not steady: {', '.join(unsteady)})" if unsteady else "")
    )
    if run_dir is not None:
        lines.append(f"run directory: {run_dir}" + (f"   ({wall_s:.1f} s)" if wall_s is not None else ""))
    return "\n".join(lines)


def _case_summary(p: Any) -> Summary:
    """One prediction as the :class:`~psgdlab.core.rundir.Summary` of its case directory: the
    trace's summary and the sweep's row as its figures; the row's name is the case's where it is
    not the algorithm's (a sweep's 1-worker point runs as sgd; a validation names its cases)."""
    figures = {k: v for k, v in {**p.summary, **p.row}.items() if k not in ("algorithm", "workers", "params")}
    name, ran = p.row["algorithm"], str(p.row["params"]["algorithm"])
    return Summary(
        source="simulator",
        algorithm=ran,
        algorithm_params=p.row["params"],
        workers=p.row["workers"],
        case=name if name != ran else None,
        figures=figures,
    )
