"""predict --target and plan: the JSON keys the team's checks read, the default workload's verdicts,
bad input in one line (exit 2), and plan's answer the same with 1 or 2 processes and MPI ranks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from psgdlab.cli import main

KEYS = (
    "reaches_target",
    "target_reason",
    "steps_to_target",
    "time_to_target_s",
    "time_to_target_s_low",
    "time_to_target_s_high",
    "gpu_hours_to_target",
    "gpu_hours_to_target_low",
    "gpu_hours_to_target_high",
)
#: a small search: 8 GPUs, two batches, two algorithms, short windows
SMALL = ["--max-gpus", "8", "--batches", "64,256", "--algorithm", "ssgd,hadpsgd", "--steps", "20", "--no-figures"]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_predict_marks_what_the_study_saw_fail_and_times_the_rest(tmp_path, capsys):
    assert main(["predict", "--workers", "16,64", "--steps", "40", "--json", "--out", str(tmp_path / "p")]) == 0
    rows = {(r["algorithm"], r["workers"]): r for r in _json(capsys)["rows"]}
    for r in rows.values():
        assert all(k in r for k in KEYS)
        if r["reaches_target"]:
            assert r["target_reason"] is None
            for k in ("time_to_target_s", "gpu_hours_to_target"):
                assert r[f"{k}_low"] < r[k] < r[f"{k}_high"]
            assert r["time_to_target_s"] == pytest.approx(r["steps_to_target"] * r["step_time_s"])
        else:
            assert r["target_reason"] and all(r[k] is None for k in KEYS[2:])
    assert not rows["ssgd", 64]["reaches_target"] and "4096" in rows["ssgd", 64]["target_reason"]
    assert not rows["adpsgd", 64]["reaches_target"] and "16 learners" in rows["adpsgd", 64]["target_reason"]
    assert rows["hadpsgd", 64]["reaches_target"] and rows["adpsgd", 16]["reaches_target"]
    assert rows["hadpsgd", 64]["target"] == "wer=7.6"


def test_predict_table_shows_time_to_target_or_why_not(tmp_path, capsys):
    assert main(["predict", "--workers", "64", "--steps", "20", "--target", "wer=7.8", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "to wer=7.8 [90 %]" in out and "no: batch>4096" in out and "no: learners>16" in out
    assert "does not reach wer=7.8: ssgdx64: total batch 8192" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--target", "wer"], "target ('wer') must be wer=PCT or loss=VALUE"),
        (["--target", "loss=0.5"], "predicts wer"),
        (["--workload", "dnn-13.5m", "--target", "wer=6"], "workload dnn-13.5m has none"),
        (["--convergence", "/nonexistent"], "is not a run directory"),
    ],
)
def test_predict_bad_target_is_one_line_exit_2(argv, message, tmp_path, capsys):
    assert main(["predict", "--workers", "2", "--steps", "10", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_plan_answers_the_same_with_one_and_two_processes(tmp_path, capsys):
    answers = []
    for jobs in ("1", "2"):
        assert main(["plan", *SMALL, "--jobs", jobs, "--json", "--out", str(tmp_path / jobs)]) == 0
        answers.append(_json(capsys))
    one, two = answers
    for key in ("candidates", "pareto", "recommended", "ties"):
        assert one[key] == two[key]
    assert one["candidates"] >= 10 and one["pareto"]
    assert one["recommended"]["reaches_target"] and all(k in one["recommended"] for k in KEYS)
    times = [r["time_to_target_s"] for r in one["pareto"]]
    hours = [r["gpu_hours_to_target"] for r in one["pareto"]]
    assert times == sorted(times) and hours == sorted(hours, reverse=True)  # a front: faster costs more
    # the objective (time) is what is recommended: the fastest, its ties listed beside it, never traded
    # for a cheaper tie
    assert one["recommended"]["time_to_target_s"] == times[0]
    assert all(t["time_to_target_s"] >= times[0] for t in one["ties"])
    assert (tmp_path / "1" / "summary.json").is_file()


def test_plan_limits_and_figure(tmp_path, capsys):
    assert main(["plan", *SMALL[:-1], "--jobs", "1", "--deadline", "0.001", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no configuration reaches the target within the limits" in out
    assert (tmp_path / "plan.png").is_file()
    assert main(["plan", "--deadline", "-1", "--out", str(tmp_path)]) == 2
    assert "--deadline (-1.0) must be > 0" in capsys.readouterr().err


@pytest.mark.mpi
def test_plan_on_mpi4py_futures_ranks_answers_as_one_process(tmp_path, capsys):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.is_file():
        found = shutil.which("mpiexec")
        if found is None:
            pytest.skip("no mpiexec")
        mpiexec = Path(found)
    cmd = [str(mpiexec), "-n", "3", sys.executable, "-m", "mpi4py.futures", "-m", "psgdlab", "plan", *SMALL]
    res = subprocess.run([*cmd, "--json", "--out", str(tmp_path / "mpi")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    ranks = json.loads(res.stdout)
    assert ranks["parallelism"] == "mpi4py.futures, 2 worker rank(s)"
    assert main(["plan", *SMALL, "--jobs", "1", "--json", "--out", str(tmp_path / "one")]) == 0
    one = _json(capsys)
    for key in ("candidates", "pareto", "recommended", "ties"):
        assert ranks[key] == one[key]
