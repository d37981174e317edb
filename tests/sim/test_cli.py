"""psgdlab predict: default run, JSON rows, run directory, bad-config errors (exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from psgdlab.cli import main
from psgdlab.core.errors import ConfigError, TopologyError
from psgdlab.core.records.trace import read_trace
from psgdlab.sim.workload import load_config, preset_names, preset_path


def test_default_run_prints_rows_and_writes_the_run_directory(tmp_path, capsys):
    assert main(["predict", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "interspeech2019-v100" in out and "hadpsgd" in out and "8x8" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = summary["rows"]
    assert {(r["algorithm"], r["workers"]) for r in rows} == {
        (a, n) for a in ("ssgd", "adpsgd", "hadpsgd") for n in (1, 2, 4, 8, 16, 32, 64)
    }
    for r in rows:
        for key in (
            "step_time_s",
            "samples_per_s",
            "speedup",
            "epoch_time_s",
            "staleness_mean",
            "time_to_train_s",
            "comm_fraction",
            "idle_fraction",
            "staleness_hist",
        ):
            assert key in r
        for key in ("step_time_s", "samples_per_s", "speedup", "epoch_time_s", "time_to_train_s"):
            assert r[f"{key}_low"] <= r[key] <= r[f"{key}_high"]
        # the preset's values are priors no figure has fitted: all unpinned, and said so
        assert r["interval"]["parameters_exact"] is False and r["has_unpinned_parameters"] is True
        assert "platform.compute_efficiency" in r["interval"]["unpinned"]
        assert r["extrapolation"]["extrapolated"] is True
    assert "speedup [90 %]" in out and "unpinned" in out
    assert summary["has_unpinned_parameters"] is True
    by = {(r["algorithm"], r["workers"]): r for r in rows}
    assert by[("ssgd", 1)]["speedup"] == pytest.approx(1.0, rel=0.02)
    assert by[("adpsgd", 64)]["speedup"] > by[("ssgd", 64)]["speedup"] > 1
    assert by[("hadpsgd", 64)]["node_shape"] == "8x8"
    assert by[("ssgd", 8)]["staleness_mean"] == 0.0
    for name in ("config.resolved.json", "env.json", "speedup.png", "staleness.png"):
        assert (tmp_path / "run" / name).is_file()
    _, meta = read_trace(tmp_path / "run" / "runs" / "hadpsgd-w64" / "trace.npz")
    assert meta["source"] == "simulator" and meta["n_workers"] == 64
    assert json.loads((tmp_path / "run" / "runs" / "hadpsgd-w64" / "timeline.json").read_text())["traceEvents"]


def test_json_output_and_single_configuration(tmp_path, capsys):
    code = main(
        [
            "predict",
            "--algorithm",
            "asgd",
            "--workers",
            "8",
            "--period",
            "4",
            "--straggler",
            "2:3",
            "--steps",
            "40",
            "--json",
            "--out",
            str(tmp_path / "r"),
        ]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    assert row["algorithm"] == "asgd" and row["workers"] == 8 and row["params"]["period"] == 4
    assert row["stragglers"] == "2:3"
    assert row["extrapolation"]["window_steps_per_worker"] == 40
    assert (tmp_path / "r" / "trace.npz").is_file() and (tmp_path / "r" / "timeline.json").is_file()


def test_straggler_costs_ssgd_more_than_adpsgd(tmp_path, capsys):
    args = ["predict", "--algorithm", "ssgd,adpsgd", "--workers", "16", "--steps", "60", "--json"]
    main(args + ["--out", str(tmp_path / "a")])
    base = {r["algorithm"]: r["samples_per_s"] for r in json.loads(capsys.readouterr().out)["rows"]}
    main(args + ["--straggler", "3:2", "--out", str(tmp_path / "b")])
    slow = {r["algorithm"]: r["samples_per_s"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert slow["ssgd"] / base["ssgd"] < 0.7
    assert slow["adpsgd"] / base["adpsgd"] > 0.9


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algorithm", "adpsdg"], "did you mean 'adpsgd'"),
        (["--algorithm", "adpsgd", "--workers", "7"], "must be even"),
        (["--workers-per-node", "16"], "devices per host"),
        (["--workers-per-host", "0"], "workers-per-host (0) must be in [1, 8]"),
        (["--workers", "128", "--algorithm", "ssgd"], "hosts"),
        (["--preset", "interspeech"], "did you mean 'interspeech2019-v100'"),
        (["--algorithm", "ssgd", "--period", "5"], "applies to none"),
        (["--straggler", "3"], "RANK:FACTOR"),
    ],
)
def test_bad_configs_exit_2_with_one_line(tmp_path, capsys, argv, message):
    assert main(["predict", "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("psgdlab: error:")
    assert message in err


def test_platform_file_unknown_key_and_negative_bandwidth(tmp_path, capsys):
    text = preset_path("interspeech2019-v100").read_text()
    bad = tmp_path / "typo.toml"
    bad.write_text(text.replace("bandwidth_bytes_per_s = 12.5e9    # [S000", "bandwith_bytes_per_s = 12.5e9  # [S000"))
    assert main(["predict", "--platform", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "did you mean 'bandwidth_bytes_per_s'" in capsys.readouterr().err
    neg = tmp_path / "neg.toml"
    neg.write_text(text.replace("bandwidth_bytes_per_s = 16.0e9", "bandwidth_bytes_per_s = -16.0e9"))
    with pytest.raises(ConfigError, match=r"bandwidth_bytes_per_s .* must be a positive"):
        load_config(path=neg)
    assert main(["predict", "--platform", str(neg), "--out", str(tmp_path / "y")]) == 2


UNCERTAIN = """
[uncertainty]
parameters = ["platform.pcie.bandwidth_bytes_per_s", "platform.nic.latency_s"]
log_sd = [0.2, 0.5]
unpinned = ["platform.nic.latency_s"]
noise_cv = 0.02
"""


def test_json_rows_carry_the_interval_and_a_profile_with_unpinned_parameters_says_so(tmp_path, capsys):
    path = tmp_path / "cluster.toml"
    text = preset_path("interspeech2019-v100").read_text()
    path.write_text(text[: text.index("[uncertainty]")] + UNCERTAIN)  # this test's uncertainty for the preset's
    args = ["predict", "--platform", str(path), "--algorithm", "ssgd", "--workers", "1,16", "--steps", "40"]
    assert main([*args, "--json", "--out", str(tmp_path / "a")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["has_unpinned_parameters"] is True
    for r in doc["rows"]:
        for key in ("speedup", "step_time_s", "samples_per_s", "time_to_train_s", "epoch_time_s"):
            assert r[f"{key}_low"] <= r[key] <= r[f"{key}_high"]
        assert r["has_unpinned_parameters"] is True and r["interval"]["unpinned"] == ["platform.nic.latency_s"]
        assert r["interval"]["level"] == 0.9 and r["interval"]["noise_cv"] == 0.02
    one, sixteen = doc["rows"]
    # a socket's PCIe bounds the 16 workers' allreduce; one worker only copies its input over it
    sd = [r["interval"]["log_sd"]["step_time_parameters"] for r in (one, sixteen)]
    assert sd[1] > 0.01 > sd[0]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["has_unpinned_parameters"] is True and summary["rows"][1]["speedup_low"] == sixteen["speedup_low"]
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "unpinned parameters" in out and "platform.nic.latency_s" in out and "2 parameter(s)" in out
    assert f"{sixteen['speedup']:.2f} [{sixteen['speedup_low']:.2f}, {sixteen['speedup_high']:.2f}]" in out


def test_platform_file_round_trips_the_preset(tmp_path):
    copy = tmp_path / "mine.toml"
    copy.write_text(preset_path("interspeech2019-v100").read_text())
    assert load_config(path=copy).platform == load_config(preset="interspeech2019-v100").platform


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_rewritten_by_the_profile_writer_loads_the_same(tmp_path, name):
    """The hand-written preset and the generated one alike: values (floats exactly), head notes and
    end-of-line provenance survive the one writer; the generated one is byte for byte its output."""
    shipped = load_config(preset=name)
    again = load_config(path=shipped.write(tmp_path / f"{name}.toml"))
    assert again == shipped and repr(again.platform) == repr(shipped.platform)
    assert repr(again.workload) == repr(shipped.workload) and shipped.provenance
    if name == "librispeech-gtx1080":
        assert (tmp_path / f"{name}.toml").read_text() == preset_path(name).read_text()


def test_hadpsgd_nodes_as_groups_of_one_host(tmp_path, capsys):
    """A calibrated this-machine platform is one host: H-ADPSGD's nodes of 2 fit only as groups."""
    one = tmp_path / "one.toml"
    one.write_text(
        "[platform]\nhosts = 1\ndevices_per_host = 8\nsockets_per_host = 8\n"
        "[platform.host_cpu]\ncores_per_host = 2\nwork_per_byte_s = 1e-9\n[workload]\nn_params = 250000\n"
        'itemsize = 8\ncompute = "0.05"\nreference_batch = 8\nbatch_per_worker = 8\n'
    )
    argv = [
        "predict",
        "--platform",
        str(one),
        "--algorithm",
        "hadpsgd",
        "--workers",
        "8",
        "--workers-per-node",
        "2",
        "--steps",
        "20",
        "--json",
    ]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    assert "hosts" in capsys.readouterr().err
    assert main([*argv, "--workers-per-host", "8", "--out", str(tmp_path / "b")]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["node_shape"] == "1x8" and row["step_time_s"] > 0.05


def test_odd_nodes_for_hadpsgd_is_a_topology_error():
    from psgdlab.sim.predict import predict_one

    with pytest.raises(TopologyError, match="even"):
        predict_one("hadpsgd", 24, load_config(preset="interspeech2019-v100"), steps=10)


def test_help_explains_units(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # as read, whatever the terminal's width
    assert "seconds" in out and "sample unit" in out and "--straggler" in out


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"algorithms": ("ssgd",), "workers": (1, 8, 128)}, "hosts"),
        ({"algorithms": ("ssgd", "bmuf"), "workers": (1, 2), "period": 0}, "period"),
        ({"algorithms": ("ssgd",), "workers": (2, 4), "stragglers": "3:2"}, "rank"),
    ],
)
def test_a_bad_sweep_fails_before_simulating_anything(monkeypatch, kwargs, message):
    """One clear error line, not a half-drawn progress bar after minutes of simulation."""
    import psgdlab.sim.predict as predict

    def no_simulation(*args, **kw):
        raise AssertionError("simulated before validating the sweep")

    monkeypatch.setattr(predict, "simulate", no_simulation)
    with pytest.raises(ConfigError, match=message):
        predict.predict_sweep(load_config(preset="interspeech2019-v100"), **kwargs)


def test_a_sweep_in_several_processes_gives_the_rows_of_one():
    """Each configuration is seeded by itself: simulating them side by side changes no figure,
    nor the order of the rows."""
    import psgdlab.sim.predict as predict

    config = load_config(preset="interspeech2019-v100")
    kwargs = {"algorithms": ("ssgd", "adpsgd", "hadpsgd"), "workers": (1, 4, 8), "steps": 40}
    one = predict.predict_sweep(config, jobs=1, **kwargs)
    three = predict.predict_sweep(config, jobs=3, **kwargs)
    assert [p.row for p in one] == [p.row for p in three]
    for a, b in zip(one, three, strict=True):  # every field of every event (a simulated loss is NaN)
        assert all(
            np.array_equal(a.result.trace[k], b.result.trace[k], equal_nan=True) for k in a.result.trace.dtype.names
        )
    with pytest.raises(ConfigError, match="jobs"):
        predict.predict_sweep(config, jobs=0, **kwargs)


def test_workload_flag_predicts_another_model_on_the_calibrated_platform(tmp_path, capsys):
    """The platform prices the named model's compute by its device law: one worker's step is the
    law's compute time plus the input copy over its socket's PCIe."""
    from psgdlab.sim.workload import with_workload

    args = ["predict", "--preset", "librispeech-gtx1080", "--algorithm", "bmuf", "--workers", "1,4", "--json"]
    assert main([*args, "--workload", "cldnn", "--out", str(tmp_path / "c")]) == 0  # the runtime's --model cldnn
    cldnn = json.loads(capsys.readouterr().out)
    assert main([*args, "--workload", "dnn-13.5m", "--out", str(tmp_path / "d")]) == 0
    dnn = json.loads(capsys.readouterr().out)
    assert cldnn["workload"] == "cldnn-13.8m" and dnn["workload"] == "dnn-13.5m"
    for name, out in (("cldnn-13.8m", cldnn), ("dnn-13.5m", dnn)):
        cfg = with_workload(load_config(preset="librispeech-gtx1080"), name)
        w, p = cfg.workload, cfg.platform
        copy = (
            w.input_bytes_per_sample
            * w.batch_per_worker
            / (p.pcie.effective_bandwidth_bytes_per_s * p.input_efficiency)
        )
        expected = w.mean_compute_s(w.batch_per_worker) + copy + p.pcie.latency_s
        assert out["rows"][0]["step_time_s"] == pytest.approx(expected, rel=0.02)
    assert all(r["sockets"] for r in cldnn["rows"])


def test_workload_flag_errors(tmp_path, capsys):
    assert main(["predict", "--workload", "cldnn-13m", "--out", str(tmp_path / "a")]) == 2
    assert "did you mean 'cldnn-13.8m'" in capsys.readouterr().err
    bare = tmp_path / "bare.toml"
    bare.write_text("[platform]\nhosts = 1\n[workload]\nn_params = 10\n")
    assert main(["predict", "--platform", str(bare), "--workload", "dnn-13.5m", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "device_flops_per_s" in err and len(err.strip().splitlines()) == 1


def test_a_prediction_too_long_to_simulate_asks_for_yes_and_one_too_large_to_hold_is_refused(
    tmp_path, capsys, monkeypatch
):
    """``predict --steps 1e9`` started with no estimate (issue 45): a timed short simulation
    estimates the wall time (past the limit: --yes) and the traces' memory (past what the
    machine has: refused whatever the flags). The limits are lowered here so a small request
    meets them; nothing is written before the answer."""
    from psgdlab.commands import predict
    from psgdlab.core.platform import machine

    monkeypatch.setattr(predict, "ESTIMATE_FROM_WORKER_STEPS", 10)
    monkeypatch.setattr(predict, "CONFIRM_AFTER_S", 0.0)
    out = tmp_path / "run"
    argv = ["predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "20", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists()
    assert "steps (20): this prediction would simulate for about" in err
    assert "past the 0 minutes it runs without asking: add --yes to run it, or use fewer --steps" in err
    assert main([*argv, "--yes", "--json"]) == 0
    assert (out / "complete.json").is_file()
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 1000)
    assert main([*argv, "--yes", "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than the 1e-06 GB available: use fewer --steps" in err
