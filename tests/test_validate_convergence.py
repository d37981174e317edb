"""psgdlab validate --convergence: its configuration checks, its grid, and one tiny end-to-end
loop (real training of least squares to a target, predicted from a reference run, seconds)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.validate.convergence_plan import WORKLOADS, ConvergenceConfig, cases

#: the interface the team's checks read (issue 42)
KEYS = ("median_abs_time_to_target_error", "max_abs_time_to_target_error", "coverage", "ranking", "cases")


def test_the_default_grid_and_the_full_one():
    assert {c.workload for c in cases(ConvergenceConfig(out="x"))} == {"lsq"}  # fsdd only when named
    default = cases(ConvergenceConfig(out="x", data="fsdd.h5", workloads=("fsdd", "lsq")))
    full = cases(
        ConvergenceConfig(out="x", data="fsdd.h5", workloads=("fsdd", "lsq"), full=True, stragglers=("", "1:2"))
    )
    fsdd = [c for c in default if c.workload == "fsdd"]
    assert {(c.workers, c.batch) for c in fsdd} == {(8, 4)} and len(fsdd) == 5
    assert {(c.workers, c.batch) for c in default if c.workload == "lsq"} == {(2, 4), (8, 4)}
    assert len([c for c in default if c.workload == "lsq"]) == 5 * 2
    assert len(full) == 2 * 5 * 3 * 2 * 2  # workloads x algorithms x workers x batches x straggler
    assert len({c.name for c in full}) == len(full)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"workloads": ("fsdd",)}, "must name the FSDD corpus"),
        ({"workloads": ("mnist",)}, "workloads ('mnist') must be one of"),
        ({"algorithms": ("easgd",)}, "algorithms ('easgd') must be one of"),
        ({"workers": (3,)}, "workers (3) must be even"),
        ({"scales": "guessed"}, "scales ('guessed') must be one of"),
        ({"workloads": ("lsq",), "targets": (("fsdd", 1.0),)}, "target workload ('fsdd')"),
    ],
)
def test_bad_configurations_say_why(kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ConvergenceConfig(out="x", **kw)


def test_the_command_refuses_what_does_not_apply_in_one_line(tmp_path, capsys):
    for argv, message in (
        (["--workloads", "fsdd"], "must name the FSDD corpus"),
        (["--hosts", "2"], "--hosts does not apply to --convergence"),
        (["--target-loss", "lsq"], "target-loss ('lsq') must be WORKLOAD=LOSS"),
    ):
        assert main(["validate", "--convergence", "--out", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err


def test_a_tiny_validation_end_to_end(tmp_path):
    from psgdlab.core.platform.profile import Profile
    from psgdlab.sim.workload import preset_path
    from psgdlab.validate.convergence import validate_convergence

    # a small least-squares problem, a platform from a preset (no calibration: seconds)
    tiny = dataclasses.replace(
        WORKLOADS["lsq"], lsq_dim=16, lsq_rows=1024, reference_epochs=1.0, reference_every_s=0.05,
        compute_s=(0.004, 0.0005), lr_per_sample=4e-3, eval_points=12,
    )  # fmt: skip
    platform = tmp_path / "platform.toml"
    Profile.read(preset_path("interspeech2019-v100")).write(platform)
    cc = ConvergenceConfig(
        out=str(tmp_path / "v"), workloads=("lsq",), algorithms=("ssgd", "adpsgd"), workers=(2,), batches=(4,),
        seeds=2, specs=(tiny,), platform_file=str(platform), scales="emulated",
    )  # fmt: skip
    report = validate_convergence(cc)
    assert all(k in report for k in KEYS)
    assert set(report["ranking"]) == {"ranked", "tied", "misordered"}
    on_disk = json.loads((tmp_path / "v" / "validate_convergence.json").read_text())
    assert on_disk["cases"] == report["cases"] and on_disk["schema_version"]
    names = [c["name"] for c in report["cases"]]
    assert names == ["lsq-ssgd-w2-b4", "lsq-adpsgd-w2-b4"]
    ref = report["workloads"]["lsq"]["reference"]
    assert ref["noise_scale"] > 0 and ref["noise_scale_method"] == "allreduce"
    for c in report["cases"]:
        assert c["predicted"]["reaches"] and c["predicted"]["factors"]["emulated"] > 0
        assert len(c["measured"]["runs"]) == 2
        # the target is reached by the reference at 60 % of its epochs: every case gets there
        assert all(c["measured"]["reached"]), c
    assert (tmp_path / "v" / "emulated" / "lsq-adpsgd-w2-b4" / "curves.npz").is_file()
    assert report["plan"]["lsq"]["none"]["recommended"] in names


def test_a_case_the_simulator_cannot_emulate_keeps_the_priors():
    from psgdlab.validate.convergence import _brief, _factor

    failed = {"epochs_to_target": None, "emulation_error": "placement", "baseline": 2.0, "steps": 10}
    assert _factor(failed, 0.1) is None  # not "predicted not to reach": nothing was emulated
    assert _brief(failed)["emulation_error"] == "placement"
    missed = {"epochs_to_target": None, "baseline": 2.0, "steps": 10}
    assert not _factor(missed, 0.1).reaches
    assert _factor({"epochs_to_target": 3.0, "baseline": 2.0, "steps": 10}, 0.1).value == 1.5
