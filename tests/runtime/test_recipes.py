"""Each model's recipe is the default of ``psgdlab train`` and ``psgdlab emulate``: shown in
``--help``, written to the resolved configuration, overridden by any flag given."""

from __future__ import annotations

import argparse
import json
import math
import warnings

import numpy as np
import pytest

from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.models.networks import MODEL_PRESETS
from psgdlab.models.recipes import LSQ_MODEL, MODEL_RECIPES, lsq_stable_lr, recipe_of
from psgdlab.runtime.config import TrainConfig


def _config(*argv):
    parser = argparse.ArgumentParser()
    TrainConfig.add_arguments(parser)
    return TrainConfig.from_args(parser.parse_args(list(argv)))


def test_every_model_has_a_recipe():
    assert set(MODEL_RECIPES) == set(MODEL_PRESETS) | {LSQ_MODEL}
    for recipe in MODEL_RECIPES.values():
        assert recipe.total_batch >= 1 and recipe.source


def test_the_recipe_is_the_default_and_its_batch_is_split_over_the_workers():
    config = _config("--model", "blstm-small", "--workers", "4")
    assert (config.batch, config.lr, config.lr_schedule, config.momentum) == (8, 0.2, "exp", 0.9)
    assert config.batch * config.workers == recipe_of("blstm-small").total_batch


def test_a_flag_given_overrides_the_recipe():
    config = _config(
        "--model", "blstm-small", "--batch", "5", "--lr", "0.01", "--lr-schedule", "const", "--momentum", "0"
    )
    assert (config.batch, config.lr, config.lr_schedule, config.momentum) == (5, 0.01, "const", 0.0)


def test_the_recipe_is_in_help_and_the_resolved_config(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert recipe_of("blstm-small").describe() in help_text
    out = tmp_path / "run"
    assert main(["train", "--model", "tiny-blstm", "--steps", "2", "--out", str(out)]) == 0
    resolved = json.loads((out / "config.resolved.json").read_text())["train"]
    assert resolved["batch"] == recipe_of("tiny-blstm").total_batch // 2 and resolved["lr"] == 0.05


def test_unknown_model_and_config_key_name_the_closest():
    with pytest.raises(ConfigError, match=r"'blstm-smal'.*did you mean 'blstm-small'"):
        recipe_of("blstm-smal")
    with pytest.raises(ConfigError, match=r"unknown key 'wrokers'; did you mean 'workers'"):
        TrainConfig.from_json({"wrokers": 2})


def test_least_squares_defaults_to_its_stable_rate():
    config = _config("--model", LSQ_MODEL, "--lsq-dim", "50000")
    assert config.lr == lsq_stable_lr(50000, config.batch) < 1e-3


def test_a_wide_least_squares_run_on_the_default_rate_stays_finite(tmp_path, capsys):
    """The 2-worker ssgd run of 50,000 parameters diverged to inf at the old default rate 0.05."""
    from psgdlab.core.records.trace import read_trace

    out = tmp_path / "lsq"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        status = main(["train", "--model", LSQ_MODEL, "--lsq-dim", "50000", "--steps", "30", "--out", str(out)])
    assert status == 0, capsys.readouterr().err
    trace, _ = read_trace(out / "trace.npz")
    losses = trace["loss"][~np.isnan(trace["loss"])]
    assert losses.size and np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_emulate_takes_the_same_recipe(tmp_path, capsys):
    out = tmp_path / "emu"
    assert (
        main(
            [
                "emulate",
                "--algorithm",
                "ssgd",
                "--workers",
                "2",
                "--model",
                LSQ_MODEL,
                "--steps",
                "5",
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    resolved = json.loads((out / "config.resolved.json").read_text())
    cfg = resolved.get("emulate", resolved)
    batch = recipe_of(LSQ_MODEL).total_batch // 2
    assert cfg["batch"] == batch and math.isclose(cfg["lr"], lsq_stable_lr(16, batch))


@pytest.mark.parametrize("command", ["train", "emulate"])
def test_lsq_samples_sets_the_rows_of_every_worker_in_both_commands(command, tmp_path, capsys):
    """``--lsq-samples 64 --batch 8 --epochs 1``: an epoch of 64 / 8 local steps on each of 2 workers
    (the default 256 rows would give 32)."""
    argv = [command, "--algorithm", "ssgd", "--workers", "2", "--model", LSQ_MODEL, "--batch", "8", "--epochs", "1"]
    argv += ["--compute-time", "0"] if command == "train" else []
    assert main([*argv, "--lsq-samples", "64", "--out", str(tmp_path / command), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["steps"] if command == "train" else summary["timing"]["steps"]) == 2 * 8
    assert main([*argv, "--lsq-samples", "0", "--out", str(tmp_path / "refused")]) == 2
    assert capsys.readouterr().err.strip().endswith("lsq-samples (0) must be an integer >= 1")
