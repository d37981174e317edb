"""The hand calibration of the README ("Calibrating your own model by hand"), run as written: its
block is read from README.md and each command runs in a fresh directory, as a user on a fresh
clone runs it, with fewer steps (two short 2-worker ssgd runs of a model at two sizes,
``calibrate`` without ``--devices``, ``predict --platform`` for 2 to 8 workers, an unseen case
predicted, measured and compared)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from psgdlab.calibration import run_residuals
from psgdlab.cli import main
from psgdlab.core.platform.profile import Profile

README = Path(__file__).resolve().parents[2] / "README.md"
#: the README's steps, and the ones run here (the measured case needs enough for a window)
STEPS = {"40": "12", "200": "24"}


def readme_example() -> list[list[str]]:
    """The ``psgdlab`` commands of the README's hand calibration, in order."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("**Calibrating your own model by hand**") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "the README's hand calibration has no bash block"
    commands = [shlex.split(line) for line in block[1].splitlines() if line.strip() and not line.startswith("#")]
    assert commands and all(c[0] == "psgdlab" for c in commands), commands
    return [c[1:] for c in commands]


@pytest.mark.distributed
def test_the_readme_example_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a fresh clone's working directory: runs/ and the profile are made here
    said = []
    for argv in readme_example():
        argv = [STEPS.get(a, a) if i and argv[i - 1] == "--steps" else a for i, a in enumerate(argv)]
        assert main(argv) == 0, argv
        said.append((argv[0], capsys.readouterr().out))
    assert [cmd for cmd, _ in said] == ["train", "train", "calibrate", "predict", "predict", "train", "compare"]

    # calibrate: the machine that ran the runs (its cores; this one's env.json), the fit's spreads,
    # and a noise at least the model's own miss on the runs it was fitted from
    profile = Profile.read(tmp_path / "this-machine.toml")
    cores = json.loads((tmp_path / "runs" / "c1" / "env.json").read_text())["cpu_count"]
    assert profile.platform.hosts == 1 and profile.platform.devices_per_host == max(cores, 2)
    unc = profile.uncertainty
    assert unc is not None and "platform.pcie.bandwidth_bytes_per_s" in unc.parameters
    assert all(sd > 0 for sd in unc.log_sd) and unc.noise_cv > 0
    residuals = run_residuals(profile, ["runs/c1", "runs/c2"])
    assert [r["run"] for r in residuals["runs"]] == ["c1", "c2"]
    assert unc.noise_cv >= round(residuals["residual_cv"], 6)
    assert f"rms log residual of the mean step {residuals['residual_cv']:.3g} over 2 runs" in said[2][1]

    # predict: 8 workers on a machine of fewer cores run there as more processes, and it says so
    table = said[3][1]
    assert all(f"       {w}        1x{w}" in table for w in (2, 4, 8)), table
    if cores < 8:
        assert f"calibrated: 1 host of {max(cores, 2)} worker processes (as calibrated) runs 8 workers" in table
        assert "the cores they share are not priced" in table

    # the unseen case, predicted and measured over one window, compared
    compare = json.loads((tmp_path / "runs" / "m" / "compare" / "compare.json").read_text())
    (case,) = compare["cases"]
    assert (case["algorithm"], case["workers"]) == ("adpsgd", 4)
    assert case["samples_per_s"]["predicted"] > 0 and case["samples_per_s"]["measured"] > 0
    assert "| adpsgd | 4 |" in said[6][1] or "| adpsgd | 4 |" in (tmp_path / "runs/m/compare/report.md").read_text()
