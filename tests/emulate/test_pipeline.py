"""The emulate pipeline: the flags it shares with train (--data synthetic, --period, every LR
schedule, --model least-squares) mean what they mean there."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("psgdlab.sim.engine")

from psgdlab.cli import main
from psgdlab.core.schedules import LR_SCHEDULE_NAMES, ibm_lr, lr_schedule
from psgdlab.emulate import EmulateConfig, emulate


def _run(capsys, tmp_path, *argv):
    status = main(["emulate", *argv, "--out", str(tmp_path / "run"), "--json"])
    captured = capsys.readouterr()
    return status, captured


def test_data_synthetic_is_the_corpus_of_train(tmp_path, monkeypatch):
    import tempfile

    from psgdlab.models.data import load_corpus
    from psgdlab.runtime.config import TrainConfig
    from psgdlab.runtime.train import _corpora

    cfg = EmulateConfig(
        algorithm="ssgd",
        workers=2,
        steps=2,
        batch=4,
        data="synthetic",
        synthetic_utterances=12,
        workdir=str(tmp_path),
        window=5,
        eval_points=1,
        heldout_speakers=0,
    )
    result, resolved = emulate(cfg)
    assert np.isfinite(result.evals["loss"]).all()
    (cached,) = tmp_path.glob("synthetic-*.h5")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    train_corpus, _ = _corpora(TrainConfig(data="synthetic", synthetic_utterances=12, seed=0, steps=1), 0)
    assert not any(scratch.iterdir())  # train's synthetic corpus leaves no file behind
    ours = load_corpus(cached)
    assert np.array_equal(ours.features, train_corpus.features) and np.array_equal(ours.labels, train_corpus.labels)
    assert resolved["data"] == "synthetic"


def test_cli_data_synthetic(tmp_path, capsys):
    status, captured = _run(
        capsys, tmp_path, "--algorithm", "ssgd", "--workers", "2", "--steps", "2", "--batch", "4", "--data", "synthetic"
    )
    assert status == 0, captured.err
    assert json.loads(captured.out)["final_loss"] > 0


def test_cli_period_reaches_the_algorithm_and_is_refused_where_it_does_not_apply(tmp_path, capsys):
    status, captured = _run(
        capsys,
        tmp_path,
        "--algorithm",
        "bmuf",
        "--period",
        "3",
        "--workers",
        "4",
        "--steps",
        "6",
        "--model",
        "least-squares",
    )
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["algorithm"] == "bmuf" and summary["algorithm_params"]["period"] == 3
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["algorithm_params"]["period"] == 3
    status, captured = _run(
        capsys,
        tmp_path,
        "--algorithm",
        "ssgd",
        "--period",
        "3",
        "--workers",
        "4",
        "--steps",
        "2",
        "--model",
        "least-squares",
    )
    assert status == 2
    assert len(captured.err.strip().splitlines()) == 1 and "--period (3) does not apply to ssgd" in captured.err


@pytest.mark.parametrize("schedule", LR_SCHEDULE_NAMES)
def test_every_lr_schedule_runs(schedule, tmp_path, capsys):
    status, captured = _run(
        capsys,
        tmp_path,
        "--algorithm",
        "adpsgd",
        "--workers",
        "4",
        "--epochs",
        "3",
        "--batch",
        "16",
        "--lr",
        "0.02",
        "--lr-schedule",
        schedule,
        "--model",
        "least-squares",
        "--lsq-dim",
        "8",
    )
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    assert np.isfinite(summary["final_loss"]) and summary["epochs"] == pytest.approx(3.0)
    resolved = json.loads((tmp_path / "run" / "config.resolved.json").read_text())
    assert resolved["lr_schedule"] == schedule and resolved["steps_per_epoch"] == 256 // 16


def test_least_squares_emulation_writes_the_run_directory(tmp_path, capsys):
    status, captured = _run(
        capsys,
        tmp_path,
        "--algorithm",
        "hadpsgd",
        "--workers-per-node",
        "2",
        "--workers",
        "4",
        "--steps",
        "10",
        "--model",
        "least-squares",
    )
    assert status == 0, captured.err
    for name in (
        "config.resolved.json",
        "env.json",
        "trace.npz",
        "summary.json",
        "curves.npz",
        "loss.png",
        "consensus.png",
        "timeline.json",
    ):
        assert (tmp_path / "run" / name).is_file(), name
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["source"] == "emulator" and summary["workers"] == 4 and "accuracy" not in summary


def test_ibm_schedule_takes_its_warmup_from_core():
    spe = 7
    f = lr_schedule("ibm", lr=0.1, total_batch=512, steps_per_epoch=spe, warmup_epochs=3)
    assert [f(s) for s in range(0, 6 * spe)] == [
        ibm_lr(s / spe + 1e-12, total_batch=512, base_lr=0.1, warmup_epochs=3) for s in range(0, 6 * spe)
    ]
    nb = lr_schedule("newbob", lr=0.2, total_batch=1, steps_per_epoch=1)
    nb.update(1.0)
    nb.update(0.999)  # < 1 % better: halving starts
    assert nb(123) == pytest.approx(0.1)


def test_no_figures_leaves_out_the_plots_only(tmp_path, capsys):
    status, captured = _run(
        capsys,
        tmp_path,
        "--algorithm",
        "ssgd",
        "--workers",
        "2",
        "--steps",
        "5",
        "--model",
        "least-squares",
        "--no-figures",
    )
    assert status == 0, captured.err
    assert not list((tmp_path / "run").glob("*.png"))
    assert (tmp_path / "run" / "summary.json").is_file() and (tmp_path / "run" / "curves.npz").is_file()
