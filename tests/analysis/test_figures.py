"""The figure helpers: Figure objects without pyplot, one atomic writer, integer staleness ticks."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("matplotlib")

from psgdlab.analysis.figures import (
    consensus_figure,
    emulation_loss_figure,
    predicted_staleness_figure,
    save_figure,
    speedup_figure,
    training_loss_figure,
    write_prediction_figures,
)

ROWS = [
    {"algorithm": a, "workers": w, "speedup": 0.9 * w, "staleness_hist": {"0": 5, "1": 10, "2": 3}}
    for a in ("ssgd", "adpsgd")
    for w in (1, 2, 4)
]


def test_the_speedup_figure_draws_the_interval_where_the_rows_carry_one():
    from matplotlib.collections import PolyCollection

    def bands(fig):
        return [c for c in fig.axes[0].collections if isinstance(c, PolyCollection) and len(c.get_paths())]

    assert bands(speedup_figure(ROWS)) == []
    rows = [{**r, "speedup_low": 0.8 * r["speedup"], "speedup_high": 1.1 * r["speedup"]} for r in ROWS]
    fig = speedup_figure(rows)
    ssgd, _ = bands(fig)
    lo, hi = ssgd.get_paths()[0].vertices[:, 1].min(), ssgd.get_paths()[0].vertices[:, 1].max()
    assert (lo, hi) == pytest.approx((0.8 * 0.9, 1.1 * 0.9 * 4))
    assert "90 % interval" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_save_figure_writes_a_png_and_leaves_no_temporary_file(tmp_path):
    path = save_figure(speedup_figure(ROWS), tmp_path / "speedup.png")
    assert path == tmp_path / "speedup.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["speedup.png"]


def test_save_figure_keeps_the_old_file_when_drawing_fails(tmp_path):
    target = tmp_path / "loss.png"
    target.write_bytes(b"old")
    fig = speedup_figure(ROWS)

    def broken(*_args, **_kwargs):
        raise RuntimeError("renderer failed")

    fig.savefig = broken
    with pytest.raises(RuntimeError, match="renderer failed"):
        save_figure(fig, target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["loss.png"]


def test_save_figure_renames_a_temporary_file_in_the_same_folder(tmp_path, monkeypatch):
    import os

    moves = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (moves.append((src, dst)), real(src, dst))[1])
    save_figure(speedup_figure(ROWS), tmp_path / "speedup.png")
    ((src, dst),) = moves
    assert str(dst) == str(tmp_path / "speedup.png") and str(src) != str(dst)
    assert os.path.dirname(src) == str(tmp_path)


@given(st.dictionaries(st.integers(0, 40), st.integers(1, 1000), min_size=1, max_size=6), st.integers(1, 3))
def test_staleness_ticks_are_integers(hist, n_algorithms):
    rows = [
        {"algorithm": f"a{i}", "workers": 4, "staleness_hist": {str(k): v for k, v in hist.items()}}
        for i in range(n_algorithms)
    ]
    fig = predicted_staleness_figure(rows)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_figures_need_no_pyplot_and_switch_no_backend(tmp_path):
    code = f"""
import sys, matplotlib
before = matplotlib.get_backend() if 'matplotlib.pyplot' in sys.modules else None
from psgdlab.analysis import figures as f
rows = {ROWS!r}
f.write_prediction_figures({str(tmp_path)!r}, rows, title="t")
ev = {{"time_s": [0.0, 1.0], "epoch": [0.0, 1.0], "loss": [2.0, 1.0], "accuracy": [0.1, 0.5]}}
f.save_figure(f.emulation_loss_figure(ev), {str(tmp_path / "loss.png")!r})
consensus = {{"time_s": [0.0, 1.0], "consensus_distance": [1.0, 0.1]}}
f.save_figure(f.consensus_figure(consensus), {str(tmp_path / "c.png")!r})
f.save_figure(f.training_loss_figure({{"step": [0, 1], "loss": [2.0, 1.0]}}), {str(tmp_path / "t.png")!r})
print('matplotlib.pyplot' in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.png", "loss.png", "speedup.png", "staleness.png", "t.png"]


def test_emulation_and_training_figures_have_their_panels():
    ev = {
        "time_s": np.array([0.0, 1.0]),
        "epoch": np.array([0.0, 1.0]),
        "loss": np.array([2.0, 1.0]),
        "accuracy": np.array([0.1, 0.5]),
    }
    assert len(emulation_loss_figure(ev).axes) == 4  # two panels, each with an accuracy twin
    assert len(consensus_figure({"time_s": np.array([]), "consensus_distance": np.array([])}).axes) == 1
    held = [{"step": 5, "loss": 1.0, "frame_accuracy": 0.5, "wer": 0.4}]
    assert len(training_loss_figure({"step": [0, 5], "loss": [2.0, 1.0]}, held).axes) == 2
    assert len(training_loss_figure({"step": [0, 5], "loss": [2.0, 1.0]}).axes) == 1
    assert len(write_prediction_figures.__doc__) > 0
