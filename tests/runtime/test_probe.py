"""psgdlab calibrate --probe: pairwise exchanges and allreduces timed on the real transport (2 ranks)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from psgdlab.analysis.probe import fit_probe, read_probe
from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.runtime.probe import KINDS, ProbeConfig


def _status(argv):
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's usage errors
        return exc.code


@pytest.mark.distributed
def test_probe_on_two_ranks_writes_its_samples_and_fits_the_links(tmp_path, capsys):
    out = tmp_path / "probe"
    argv = ["calibrate", "--probe", "--probe-out", str(out), "--sizes", "1k,32k", "--repeats", "4", "--json"]
    assert main(argv) == 0
    fit = json.loads(capsys.readouterr().out)
    records, env = read_probe(out)
    # 2 sizes x (pairwise + allreduce of 2) x 4 timed repetitions x 2 ranks
    assert records.size == 2 * 2 * 4 * 2
    assert set(np.unique(records["kind"]).tolist()) == set(KINDS.values())
    assert np.all(records["wall_s"] > 0) and np.all(records["cpu_s"] >= 0)
    assert env["world_size"] == 2 and env["allreduce_algorithm"] in ("direct", "ring")
    assert {(p["kind"], p["group"], p["size_bytes"]) for p in fit["points"]} == {
        (k, 2, s) for k in KINDS.values() for s in (1024, 32768)
    }
    for law in (fit["link"], fit["collective"]):
        assert law["latency_s"] >= 0 and law["bandwidth_bytes_per_s"] > 0
    assert fit_probe(out)["host_cpu"]["work_per_message_s"] >= 0
    assert sorted(p.name for p in out.iterdir()) == ["env.json", "probe.json", "probe.npz"]  # no progress file left


def test_probe_flags_are_checked_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "p"
    for argv, what in (
        (["--probe", "--sizes", "7,16"], r"sizes \(7\) must be positive multiples of 8"),
        (["--probe", "--sizes", "8k,8k"], "at least two different sizes"),
        (["--probe", "--groups", "1"], r"groups \(1\) must be integers >= 2"),
        (["--probe", "--repeats", "1"], r"repeats \(1\) must be an integer >= 3"),
        (["--probe", "--sizes", "x"], "must be comma-separated byte counts"),
        (["--probe", "--out", str(tmp_path / "x.toml")], "needs a RUN_DIR of psgdlab train"),
        ([], "give RUN_DIRs of psgdlab train, or --probe"),
        (["--sizes", "8k,64k"], "add --probe"),
        (["--probe", str(tmp_path / "missing"), "--out", str(tmp_path / "x.toml")], "missing does not exist"),
    ):
        assert (
            _status(["calibrate", *argv, "--probe-out", str(out)] if "--probe" in argv else ["calibrate", *argv]) == 2
        )
        last = capsys.readouterr().err.strip().splitlines()[-1]  # one line (argparse prints its usage above)
        assert re.search(what, last), (argv, last)
    assert not out.exists()
    with pytest.raises(ConfigError, match="backend"):
        ProbeConfig(out=str(out), backend="tcp")
