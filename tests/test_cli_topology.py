"""``psgdlab topology``: table, JSON, plot and exit status 2 on bad input."""

from __future__ import annotations

import json
import math
import re

import pytest

from psgdlab.cli import main
from psgdlab.commands import topology as command


def run_json(capsys, *argv: str) -> dict:
    assert main(["topology", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one JSON object on one line
    return json.loads(out)


def test_fixed_ring_16_gap_is_sin2_pi_over_16(capsys):
    s = run_json(capsys, "fixed-ring", "--workers", "16")
    assert s["spectral_gap"] == pytest.approx(math.sin(math.pi / 16) ** 2, abs=1e-12)
    assert s["spectral_gap"] == pytest.approx(0.03806, abs=1e-5)
    assert s["workers"] == 16 and s["matrix"] == "E[TT^T]" and s["period"] == 2
    assert s["lambda2"] == pytest.approx(math.cos(math.pi / 16) ** 2, abs=1e-12)
    assert s["rho"] == pytest.approx(s["lambda2"])
    assert s["mixing_time"] == 357 and s["mixing_tol"] == 1e-6


def test_hierarchical_json(capsys):
    s = run_json(
        capsys, "hierarchical", "--workers", "64", "--workers-per-node", "8", "--inner", "random-ring", "--seed", "3"
    )
    assert (s["workers"], s["nodes"], s["gpus_per_node"], s["inner"], s["seed"]) == (64, 8, 8, "random-ring", 3)
    assert s["spectral_gap"] == pytest.approx(8 / 14, abs=1e-12)
    assert s["period"] is None


def test_static_kind_reports_the_gap_of_w(capsys):
    s = run_json(capsys, "ring", "--workers", "9")
    assert s["matrix"] == "W"
    assert s["lambda2"] == pytest.approx((1 + 2 * math.cos(2 * math.pi / 9)) / 3, abs=1e-12)


def test_human_table(capsys):
    assert main(["topology", "torus", "--workers", "16"]) == 0
    out = capsys.readouterr().out
    lines = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert lines["workers"] == "16"
    assert lines["nodes"] == "16 x 1 GPU"
    assert lines["matrix"].startswith("W")
    assert lines["lambda2"] == "0.6" and lines["lambda_min"] == "-0.6" and lines["period"] == "1"
    assert lines["spectral gap"].startswith("0.4")
    assert lines["mixing time"].endswith("rounds to 1e-06")


@pytest.mark.parametrize(
    "argv, match",
    [
        (
            ["fixed-ring", "--workers", "7"],
            r"psgdlab: error: workers \(7\) must be even for fixed-ring: a perfect matching pairs every worker "
            r"with exactly one other, which needs an even number of workers; "
            r"use ring, torus or exponential for odd counts",
        ),
        (["rnig", "--workers", "8"], r"topology kind \('rnig'\) is not known \(known: .*\); did you mean 'ring'\?"),
        (["hypercube", "--workers", "12"], r"must be a power of two"),
        (["hierarchical", "--workers", "12", "--workers-per-node", "5"], r"must be divisible by gpus_per_node \(5\)"),
        (["ring", "--workers", "8", "--inner", "random-ring"], r"inner \('random-ring'\) only applies to kind"),
        (["ring", "--workers", "8", "--plot", "out.jpg"], r"plot \('out.jpg'\) must be a .png file"),
        (
            ["ring", "--workers", "8", "--plot", "out.png", "--plot-max-workers", "2"],
            r"plot-max-workers \(2\) must be >= 4",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, match):
    assert main(["topology", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert re.search(match, err)


@pytest.mark.parametrize("argv", [["ring", "--workers", "x"], ["ring"], ["ring", "--workers", "4", "--inner", "tree"]])
def test_argparse_errors_exit_2(capsys, argv):
    """A usage error is one line naming the command, with a pointer to its help."""
    with pytest.raises(SystemExit) as info:
        main(["topology", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("psgdlab topology: error: ") and err.rstrip().endswith("(see psgdlab topology --help)")


def test_plot_writes_a_png_atomically(tmp_path, capsys):
    target = tmp_path / "figs" / "gaps.png"
    assert (
        main(["topology", "random-ring", "--workers", "8", "--plot", str(target), "--plot-max-workers", "32", "--json"])
        == 0
    )
    s = json.loads(capsys.readouterr().out)
    assert s["plot"] == str(target)
    data = target.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert [p.name for p in target.parent.iterdir()] == ["gaps.png"]  # no temporary file left behind


def test_plot_counts_cover_each_kind_with_valid_sizes():
    assert command._plot_counts("hypercube", 64, 1) == [4, 8, 16, 32, 64]
    assert command._plot_counts("fixed-ring", 256, 1)[:4] == [4, 6, 8, 10]
    assert all(n % 8 == 0 and (n // 8 == 1 or n // 8 % 2 == 0) for n in command._plot_counts("hierarchical", 256, 8))
    assert command._plot_counts("torus", 16, 1) == [12, 16]


def test_closed_stdout_pipe_is_not_a_traceback():
    """`psgdlab topology ... --json | head -c 20`: the reader leaving early ends the command quietly."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "psgdlab", "topology", "complete", "--workers", "64", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader goes away before the JSON is written: every write gets EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err
