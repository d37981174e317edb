"""psgdlab calibrate --probe: pairwise exchanges and allreduces timed on the real transport (2 ranks)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from psgdlab.analysis.probe import fit_probe, read_probe
from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.runtime.launcher.probe import KINDS, ProbeConfig


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
    # no progress file or lock left; committed
    assert sorted(p.name for p in out.iterdir()) == ["complete.json", "env.json", "probe.json", "probe.npz"]


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
        (["--hosts", "2"], "add --probe"),
        (["--probe", "--hosts", "2", "--backend", "mpi"], "with --backend gloo only"),
        (["--probe", "--hosts", "2", "--groups", "3"], r"hosts \(2\) must divide the 3 ranks of the probe"),
        (["--probe", "--nic-bandwidth", "1Gbit/s"], "applies only with --hosts 2 or more"),
        (["--probe", "--hosts", "2", "--nic-bandwidth", "fast"], r"nic-bandwidth \('fast'\)"),
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


def _netns_reason():
    from psgdlab.runtime.launcher.netns import unavailable_reason

    return unavailable_reason()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(_netns_reason() is not None, reason=_netns_reason() or "")
def test_probe_between_emulated_hosts_fits_the_nic(tmp_path, capsys):
    """--probe --hosts 2: one rank per emulated host, so every exchange crosses the shaped link;
    its fit is the link between hosts (near the shaped rate), and nothing of the hosts is left."""
    import os
    import subprocess

    out = tmp_path / "probe"
    argv = ["calibrate", "--probe", "--hosts", "2", "--nic-bandwidth", "200Mbit/s", "--probe-out", str(out)]
    # 4 MB takes 0.17 s on the link: a few ms of a busy machine's latency cannot tilt the fit's slope
    assert main([*argv, "--sizes", "256k,4M", "--repeats", "4", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert fit["hosts"] == 2 and fit["rate_bytes_per_s"] == 25e6 and fit["allreduce_algorithm"] == "ring"
    assert 0.3 * 25e6 < fit["link"]["bandwidth_bytes_per_s"] < 1.5 * 25e6  # a 4 MB message took the shaped link
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"psgd-{os.getpid()}-" not in left  # this process's hosts are gone (other runs may have theirs)
