"""Every figure psgdlab draws. Each function returns a matplotlib ``Figure`` (never shows it,
never switches the process's backend: :class:`matplotlib.figure.Figure` draws on the Agg canvas
by itself); :func:`save_figure` writes one to a PNG atomically.

- comparing a prediction with a measurement: :func:`step_time_figure`, :func:`staleness_figure`,
  :func:`timeline_figure`, :func:`error_figure`;
- a prediction (``psgdlab predict``'s rows): :func:`speedup_figure`,
  :func:`predicted_staleness_figure`; :func:`write_prediction_figures` draws both for a run
  directory;
- an emulation (``psgdlab emulate``'s curves): :func:`emulation_loss_figure`,
  :func:`consensus_figure`;
- a training run (``psgdlab train``'s summary): :func:`training_loss_figure`;
- a plan (``psgdlab plan``'s rows): :func:`plan_figure`.

Examples
--------
>>> import tempfile, pathlib
>>> fig = speedup_figure([{"algorithm": "ssgd", "workers": 1, "speedup": 1.0},
...                       {"algorithm": "ssgd", "workers": 2, "speedup": 1.8}])
>>> with tempfile.TemporaryDirectory() as tmp:
...     path = save_figure(fig, pathlib.Path(tmp) / "speedup.png")
...     path.read_bytes()[1:4]
b'PNG'
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from psgdlab.analysis.load import Run
from psgdlab.core.records.rundir import RunDir
from psgdlab.core.records.trace import PHASE_NAMES, PHASES, atomic_write_bytes

__all__ = [
    "save_figure",
    "step_time_figure",
    "staleness_figure",
    "timeline_figure",
    "error_figure",
    "speedup_figure",
    "predicted_staleness_figure",
    "write_prediction_figures",
    "emulation_loss_figure",
    "consensus_figure",
    "training_loss_figure",
    "plan_figure",
]


def save_figure(fig: Figure, path: str | os.PathLike[str], *, dpi: int = 100, tight: bool = False) -> Path:
    """Write ``fig`` as a PNG to ``path`` atomically (rendered in memory, written to a
    temporary name, renamed: :func:`psgdlab.core.records.trace.atomic_write_bytes`); returns the path.

    ``tight`` crops the canvas to the drawn artists (``bbox_inches="tight"``).
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    return atomic_write_bytes(Path(path), buf.getvalue())


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
            ax.hist(
                ms,
                bins=bins,
                range=None if bins > 1 else (ms.min() - 0.5, ms.max() + 0.5),
                alpha=0.55,
                label=f"{label} (median {np.median(ms):.1f} ms)",
            )
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
            ax.barh(
                y,
                rec["end_s"] - rec["start_s"],
                left=rec["start_s"] - t0,
                height=0.3 if name == "overlap" else 0.6,
                color=colours[name],
            )
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


# ----- a prediction (psgdlab predict) ----------------------------------------------------------
def speedup_figure(rows: Sequence[Mapping[str, Any]], *, title: str = "") -> Figure:
    """Speedup against workers, one line per algorithm, with the ideal line (rows of
    ``psgdlab predict``: ``algorithm``, ``workers``, ``speedup``), and the 90 % interval as a
    band and error bars where the rows carry ``speedup_low`` and ``speedup_high``."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    algos = list(dict.fromkeys(r["algorithm"] for r in rows))
    all_w = sorted({r["workers"] for r in rows})
    ax.plot(all_w, all_w, color="0.7", ls="--", label="ideal")
    banded = False
    for a in algos:
        mine = sorted((r for r in rows if r["algorithm"] == a), key=lambda r: r["workers"])
        x = [r["workers"] for r in mine]
        y = [r["speedup"] for r in mine]
        (line,) = ax.plot(x, y, marker="o", label=a)
        if all("speedup_low" in r and "speedup_high" in r for r in mine):
            lo = [r["speedup_low"] for r in mine]
            hi = [r["speedup_high"] for r in mine]
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
            ax.errorbar(
                x,
                y,
                yerr=[np.subtract(y, lo), np.subtract(hi, y)],
                fmt="none",
                ecolor=line.get_color(),
                capsize=3,
                lw=1,
            )
            banded = True
    if banded:
        ax.fill_between([], [], [], color="0.5", alpha=0.2, lw=0, label="90 % interval")
    if len(all_w) > 1 and all_w[-1] / max(all_w[0], 1) >= 8:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("speedup over 1-worker SGD")
    ax.set_title(title or "predicted speedup")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def predicted_staleness_figure(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Staleness histogram (unit: updates) of each algorithm at its largest worker count (rows
    of ``psgdlab predict``: ``staleness_hist`` maps a staleness to its count). Staleness is an
    integer: the bars of one value are grouped around it and the ticks are integers."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    algos = list(dict.fromkeys(r["algorithm"] for r in rows))
    width = 0.8 / max(len(algos), 1)
    for i, a in enumerate(algos):
        r = max((r for r in rows if r["algorithm"] == a), key=lambda r: r["workers"])
        hist = {int(k): v for k, v in r["staleness_hist"].items()}
        total = sum(hist.values()) or 1
        xs = sorted(hist)
        ax.bar(
            [x + (i - (len(algos) - 1) / 2) * width for x in xs],
            [hist[x] / total for x in xs],
            width=width,
            label=f"{a} ({r['workers']} workers)",
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("staleness (updates between reading the weights and applying the gradient)")
    ax.set_ylabel("fraction of steps")
    ax.set_title("predicted staleness")
    ax.legend()
    return fig


def write_prediction_figures(
    folder: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]], *, title: str = ""
) -> list[Path]:
    """``speedup.png`` and ``staleness.png`` of a prediction's rows, written into ``folder``."""
    run = RunDir(folder)
    return [
        save_figure(speedup_figure(rows, title=title), run / "speedup.png", dpi=110, tight=True),
        save_figure(predicted_staleness_figure(rows), run / "staleness.png", dpi=110, tight=True),
    ]


# ----- an emulation (psgdlab emulate) ---------------------------------------------------------
def emulation_loss_figure(evals: Mapping[str, Any], *, title: str = "") -> Figure:
    """Held-out loss of the workers' mean model (and accuracy, when evaluated) against
    simulated time and against epochs (``evals``: ``time_s``, ``epoch``, ``loss``, optional
    ``accuracy``, as ``curves.npz``'s ``eval_*``)."""
    fig = Figure(figsize=(10, 3.6))
    axes = fig.subplots(1, 2)
    for ax, x, label in ((axes[0], evals["time_s"], "simulated time (s)"), (axes[1], evals["epoch"], "epochs")):
        ax.plot(x, evals["loss"], marker="o", ms=3, label="held-out loss (mean model)")
        ax.set_xlabel(label)
        ax.set_ylabel("loss")
        if "accuracy" in evals:
            ax2 = ax.twinx()
            ax2.plot(x, evals["accuracy"], color="tab:green", ls="--", label="accuracy")
            ax2.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def consensus_figure(rounds: Mapping[str, Any], *, title: str = "") -> Figure:
    """Consensus distance of the workers' models against simulated time, log scale
    (``rounds``: ``time_s``, ``consensus_distance``, as ``curves.npz``'s ``round_*``)."""
    fig = Figure(figsize=(6, 3.6))
    ax = fig.add_subplot()
    if len(rounds["time_s"]):
        ax.semilogy(rounds["time_s"], np.maximum(rounds["consensus_distance"], 1e-30))
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("consensus distance")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# ----- a training run (psgdlab train) ---------------------------------------------------------
def training_loss_figure(
    loss_curve: Mapping[str, Sequence[float]], held_out: Sequence[Mapping[str, Any]] = (), *, title: str = ""
) -> Figure:
    """Training minibatch loss against steps (``loss_curve``: ``step``, ``loss``, as in a
    training summary) and, when the held-out evaluations carry speech scores
    (``frame_accuracy``), the held-out loss and the WER / frame accuracy beside it."""
    held = [e for e in held_out if "frame_accuracy" in e]  # speech scores only
    fig = Figure(figsize=(11 if held else 6, 3.5))
    axes = fig.subplots(1, 2 if held else 1, squeeze=False)
    ax = axes[0, 0]
    ax.plot(loss_curve["step"], loss_curve["loss"], lw=1, label="training minibatch (mean over workers)")
    if held and "loss" in held[0]:
        ax.plot([e["step"] for e in held], [e["loss"] for e in held], "o-", label="held-out (rank 0's model)")
        ax.legend(fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats)")
    ax.set_title(title)
    if held:
        ax = axes[0, 1]
        for key, label in (
            ("wer_viterbi", "WER, HMM decoding"),
            ("wer_vote", "WER, majority vote"),
            ("wer", "WER"),
            ("frame_accuracy", "frame accuracy"),
        ):
            if key in held[0] and not (key == "wer" and "wer_viterbi" in held[0]):
                ax.plot([e["step"] for e in held], [100 * e[key] for e in held], "o-", label=label)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out, %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def spectral_gap_figure(
    curves: Sequence[tuple[str, Sequence[tuple[int, float]], bool]], point: tuple[int, float, str]
) -> Figure:
    """Spectral gap against the number of workers on log-log axes: one line per ``(label,
    [(workers, gap), ...], requested)`` curve (the requested one drawn bold), and ``point``
    ``(workers, gap, label)`` as a star. Empty curves are left out."""
    fig = Figure(figsize=(7.5, 5.0), layout="tight")
    ax = fig.add_subplot()
    for label, curve, requested in curves:
        if not curve:
            continue
        xs, ys = zip(*curve)
        ax.plot(
            xs,
            ys,
            marker="o",
            markersize=3,
            linewidth=2.8 if requested else 1.2,
            alpha=1.0 if requested else 0.75,
            label=label + ("  <- requested" if requested else ""),
            zorder=3 if requested else 2,
        )
    n, gap, label = point
    ax.plot([n], [max(gap, 1e-12)], marker="*", markersize=16, color="black", linestyle="none", zorder=4, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers")
    ax.set_ylabel("spectral gap (1 - rho of W; of E[TT^T] for time-varying kinds)")
    ax.set_title("Spectral gap against the number of workers")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    return fig


def plan_figure(
    rows: Sequence[Mapping[str, Any]],
    pareto: Sequence[Mapping[str, Any]],
    recommended: Mapping[str, Any] | None,
    *,
    title: str = "",
) -> Figure:
    """Time to target against GPU-hours of every configuration that reaches the target (grey), the
    Pareto front with its 90 % intervals on both axes, and the recommended configuration (a star)."""
    fig = Figure(figsize=(7.5, 5.0))
    ax = fig.add_subplot(1, 1, 1)
    if rows:
        ax.scatter(
            [r["gpu_hours_to_target"] for r in rows],
            [r["time_to_target_s"] / 3600 for r in rows],
            s=8,
            color="0.7",
            label=f"reach the target ({len(rows)})",
        )
    for r in pareto:
        x, y = r["gpu_hours_to_target"], r["time_to_target_s"] / 3600
        ax.errorbar(
            x,
            y,
            xerr=[[x - r["gpu_hours_to_target_low"]], [r["gpu_hours_to_target_high"] - x]],
            yerr=[[y - r["time_to_target_s_low"] / 3600], [r["time_to_target_s_high"] / 3600 - y]],
            fmt="o",
            color="C0",
            ms=4,
            capsize=2,
            lw=0.8,
        )
        ax.annotate(str(r["config"]), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    if pareto:
        ax.plot([], [], "o", color="C0", label="Pareto front [90 %]")
    if recommended is not None:
        ax.plot(
            recommended["gpu_hours_to_target"],
            recommended["time_to_target_s"] / 3600,
            "*",
            color="C3",
            ms=14,
            label="recommended",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPU-hours to target")
    ax.set_ylabel("hours to target")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    return fig
