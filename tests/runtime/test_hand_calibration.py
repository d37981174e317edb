"""The hand calibration of README and docs/validation.md, as a user runs it: two short 2-worker
ssgd runs of their model at two sizes, then calibrate, then predict --platform."""

from __future__ import annotations

import json

import pytest

from psgdlab.cli import main
from psgdlab.core.platform.profile import Profile


@pytest.mark.distributed
def test_the_documented_recipe_runs_end_to_end(tmp_path, capsys):
    runs = []
    for dim in (50_000, 500_000):
        out = tmp_path / f"c{dim}"
        argv = ["train", "--algorithm", "ssgd", "--workers", "2", "--model", "least-squares"]
        argv += ["--lsq-dim", str(dim), "--batch", "1", "--steps", "12", "--compute-time", "0.04", "--out", str(out)]
        assert main(argv) == 0
        runs.append(str(out))
    capsys.readouterr()
    platform = tmp_path / "this-machine.toml"
    assert main(["calibrate", *runs, "--devices", "8", "--out", str(platform)]) == 0
    profile = Profile.read(platform)
    unc = profile.uncertainty
    assert unc is not None and "platform.pcie.bandwidth_bytes_per_s" in unc.parameters
    assert all(sd > 0 for sd in unc.log_sd) and unc.noise_cv > 0
    # each run predicted as it ran on the fitted profile: its noise is at least the model's miss on them
    from psgdlab.calibration import run_residuals

    residuals = run_residuals(profile, runs)
    assert [r["run"] for r in residuals["runs"]] == ["c50000", "c500000"]
    assert all(r["predicted_step_time_s"] > 0.04 and r["measured_step_time_s"] > 0.04 for r in residuals["runs"])
    assert unc.noise_cv >= round(residuals["residual_cv"], 6)
    said = capsys.readouterr().out
    assert f"rms log residual of the mean step {residuals['residual_cv']:.3g} over 2 runs" in said
    raised = unc.noise_cv == round(residuals["residual_cv"], 6)
    assert ("(raised to the residual)" in said) == raised
    assert raised == ("calibration runs' rms log residual" in platform.read_text())
    capsys.readouterr()
    argv = ["predict", "--platform", str(platform), "--algorithm", "ssgd", "--workers", "2,8", "--json"]
    assert main([*argv, "--out", str(tmp_path / "pred")]) == 0
    rows = json.loads(capsys.readouterr().out)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert [r["workers"] for r in rows] == [2, 8]
    assert all(r["step_time_s"] > 0.04 for r in rows)  # the emulated compute and the exchanges
