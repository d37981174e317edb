"""Figures comparing a prediction with a measurement. Each function returns a matplotlib
``Figure`` (never shows it); callers save it. Use the Agg backend in scripts."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from psgdlab.analysis.load import Run
from psgdlab.core.trace import PHASE_NAMES, PHASES

__all__ = ["step_time_figure", "staleness_figure", "timeline_figure", "error_figure"]


def _step_times(run: Run) -> np.ndarray:
    if run.trace is None:
        return np.array([])
    comp = run.trace[run.trace["phase"] == PHASES["compute"]]
    out = []
    for r in np.unique(comp["rank"]):
        out.append(np.diff(np.sort(comp["start_s"][comp["rank"] == r])))
    return np.concatenate(out) if out else np.array([])


def step_time_figure(pred: Run, meas: Run) -> Figure:
    """Distributions of per-step time (consecutive compute starts of one worker)."""
    fig = Figure(figsize=(6, 3.6), layout="constrained")
    ax = fig.add_subplot()
    for run, label in ((pred, "predicted"), (meas, "measured")):
        d = _step_times(run)
        if d.size:
            ms = d * 1e3
            spread = float(np.ptp(ms))
            bins = 40 if spread > 1e-6 * max(float(np.median(ms)), 1e-12) else 1
            ax.hist(ms, bins=bins, range=None if bins > 1 else (ms.min() - 0.5, ms.max() + 0.5), alpha=0.55,
                    label=f"{label} (median {np.median(ms):.1f} ms)")
    ax.set_xlabel("step time (ms)")
    ax.set_ylabel("steps")
    ax.set_title("{} with {} workers".format(*meas.key))
    ax.legend()
    return fig


def staleness_figure(pred: Run, meas: Run) -> Figure:
    """Staleness histograms (unit: updates), normalised, side by side."""
    fig = Figure(figsize=(6, 3.6), layout="constrained")
    ax = fig.add_subplot()
    width = 0.4
    for i, (run, label) in enumerate(((pred, "predicted"), (meas, "measured"))):
        hist = {int(k): v for k, v in (run.summary.get("staleness_hist") or {}).items()}
        total = sum(hist.values()) or 1
        keys = sorted(hist)
        ax.bar(np.array(keys) + (i - 0.5) * width, [hist[k] / total for k in keys], width=width, label=label)
    ax.set_xlabel("staleness (updates)")
    ax.set_ylabel("fraction of steps")
    ax.legend()
    return fig


def timeline_figure(pred: Run, meas: Run, *, steps: int = 6) -> Figure:
    """The first ``steps`` steps of every worker, prediction above measurement."""
    fig = Figure(figsize=(9, 5), layout="constrained")
    colours = {"compute": "tab:blue", "comm": "tab:red", "wait": "tab:grey", "overlap": "tab:orange"}
    for i, (run, label) in enumerate(((pred, "predicted"), (meas, "measured"))):
        ax = fig.add_subplot(2, 1, i + 1)
        ax.set_title(label)
        if run.trace is None or run.trace.size == 0:
            continue
        tr = run.trace[run.trace["step"] < steps]
        t0 = tr["start_s"].min()
        for rec in tr:
            name = PHASE_NAMES[int(rec["phase"])]
            y = rec["rank"] + (0.35 if name == "overlap" else 0.0)
            ax.barh(y, rec["end_s"] - rec["start_s"], left=rec["start_s"] - t0, height=0.3 if name == "overlap" else 0.6,
                    color=colours[name])
        ax.set_ylabel("rank")
        ax.set_xlabel("seconds")
    handles = [fig.axes[0].barh([], [], color=c, label=k) for k, c in colours.items()]
    fig.axes[0].legend(handles=handles, loc="upper right", fontsize="small")
    return fig


def error_figure(result: dict[str, Any]) -> Figure:
    """Relative step-time error per case."""
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.add_subplot()
    cases = result["cases"]
    labels = [f"{c['algorithm']}/{c['workers']}" for c in cases]
    errs = [100 * (c["step_time_error"] or 0.0) for c in cases]
    ax.bar(labels, errs, color=["tab:red" if abs(e) > 10 else "tab:green" for e in errs])
    ax.axhline(0, color="black", lw=0.8)
    for lim in (-10, 10):
        ax.axhline(lim, color="grey", ls="--", lw=0.8)
    ax.set_ylabel("step-time error (%)")
    ax.tick_params(axis="x", rotation=45)
    return fig
