"""The Python API (psgdlab.api): the commands' flags as keywords, the rows the commands print,
nothing written or forked unless asked; examples/api_tour.py runs."""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import psgdlab
from psgdlab.api import API_DEFAULTS, NOT_KEYWORDS, flags_namespace
from psgdlab.cli import command_parser, main
from psgdlab.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _dests(command: str) -> set[str]:
    hidden = {"help", "json", "verbose", "quiet"}
    return {a.dest for a in command_parser(command)._actions if a.dest not in hidden and a.help != argparse.SUPPRESS}


@pytest.mark.parametrize("command", ["predict", "plan", "topology"])
def test_each_function_takes_exactly_its_commands_flags(command):
    """One mapping: the function's keywords are the parser's destinations (a flag added to the
    command and not to the function, or the reverse, fails here)."""
    params = set(inspect.signature(getattr(psgdlab, command)).parameters)
    assert params == _dests(command) - set(NOT_KEYWORDS.get(command, ()))


def test_import_psgdlab_stays_light():
    code = "import sys, psgdlab; print(sorted(m for m in ('numpy', 'scipy', 'simpy', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_predict_rows_are_what_predict_json_prints(tmp_path, capsys, monkeypatch):
    """The issue's call, at a short window: rows usable as mappings, equal to the command's JSON;
    no run directory written without out=."""
    monkeypatch.chdir(tmp_path)
    rows = psgdlab.predict(algorithm=["ssgd", "hadpsgd"], workers=[8, 64], steps=40)
    assert not (tmp_path / "runs").exists()
    argv = ["predict", "--algorithm", "ssgd,hadpsgd", "--workers", "8,64", "--steps", "40", "--json"]
    assert main([*argv, "--out", str(tmp_path / "p"), "--no-figures"]) == 0
    printed = json.loads(capsys.readouterr().out)["rows"]
    assert [json.loads(json.dumps(dict(r), default=float)) for r in rows] == printed
    assert rows[0]["speedup"] == printed[0]["speedup"] == rows[0].speedup
    assert not list((tmp_path / "p").glob("*.png"))  # --no-figures


def test_values_go_through_the_flags_own_types():
    ns = flags_namespace("predict", {"workers": "8,64", "algorithm": ["ssgd"], "force": True}, API_DEFAULTS)
    assert (ns.workers, ns.algorithm, ns.force, ns.jobs, ns.no_progress) == ((8, 64), ("ssgd",), True, 1, True)
    assert flags_namespace("predict", {"workers": 8}).workers == (8,)
    assert flags_namespace("predict", {"fail": ["0@10", "1@20"]}).fail == ["0@10", "1@20"]
    with pytest.raises(ConfigError, match=r"^on_failure \('sometimes'\): must be one of"):
        flags_namespace("predict", {"on_failure": "sometimes"})
    with pytest.raises(ConfigError, match=r"^force \('yes'\): must be True or False"):
        flags_namespace("predict", {"force": "yes"})
    with pytest.raises(ConfigError, match=r"^steps \(2\.5\)"):
        flags_namespace("predict", {"steps": 2.5})
    with pytest.raises(TypeError, match="unexpected keyword argument 'json'"):
        flags_namespace("predict", {"json": True})
    with pytest.raises(ConfigError, match="workers-per-host"):
        psgdlab.predict(workers=8, workers_per_host=99)


def test_out_writes_the_commands_run_directory(tmp_path):
    rows = psgdlab.predict(algorithm="ssgd", workers=4, steps=20, out=tmp_path / "p", no_figures=True)
    run = psgdlab.read_run(tmp_path / "p" / "runs" / "ssgd-w4")
    assert (run.case.label, run.case.workers) == ("ssgd", 4) and run.trace is not None
    assert run.summary["step_time_s"] == pytest.approx(rows[0]["step_time_s"])
    assert psgdlab.read_run(tmp_path / "p" / "runs" / "ssgd-w4", trace=False).trace is None
    with pytest.raises(ConfigError, match="does not exist"):
        psgdlab.read_run(tmp_path / "nowhere")


def test_topology_and_platform():
    ring = psgdlab.topology("ring", workers=8)
    W = ring.mixing_matrix
    assert W.shape == (8, 8) and abs(W.sum(axis=1) - 1).max() < 1e-12
    assert ring.spectral_gap == ring["spectral_gap"] > 0
    fixed = psgdlab.topology("fixed-ring", workers=8)  # time-varying: the gap of E[TT^T]
    assert fixed["matrix"] == "E[TT^T]" and fixed.mixing_matrix.shape == (8, 8)
    config = psgdlab.load_platform("interspeech2019-v100")
    path = ROOT / "sim" / "presets" / "interspeech2019-v100.toml"
    assert psgdlab.load_platform(path).platform == config.platform
    with pytest.raises(ConfigError, match="not known"):
        psgdlab.load_platform("no-such-preset")


def test_plan_writes_nothing_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    answer = psgdlab.plan(algorithm="ssgd", batches=[64], periods=[5], max_gpus=8, steps=20)
    assert answer.run_dir is None and answer["recommended"]["algorithm"] == "ssgd"
    assert not (tmp_path / "runs").exists()


def test_the_api_tour_runs(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "api_tour.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "plan:" in done.stdout and (tmp_path / "predict" / "runs" / "adpsgd-w8" / "summary.json").is_file()
