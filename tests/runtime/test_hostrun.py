"""``psgdlab hosts``: one command on each emulated host (:mod:`psgdlab.runtime.launcher.hostrun`).

The tests that make namespaces need root, ``ip`` and ``tc`` and skip with the reason otherwise.
Every way a run ends (done, a host's command failing, SIGINT) leaves nothing in ``ip netns list``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from psgdlab.cli import main
from psgdlab.runtime.launcher import netns

REASON = netns.unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    status = main(["hosts", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def _mine() -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout.split()
    return [n for n in names if n.startswith(f"psgd-{os.getpid()}-")]


def test_an_unknown_field_is_one_line(capsys):
    status, _, err = _run(capsys, ["--", "echo", "{rank}"])
    assert status == 2 and err.count("\n") == 1
    assert re.search(r"command word '\{rank\}' names 'rank', not one of the fields \{host\}, \{hosts\}", err), err


def test_no_command_and_bad_hosts_are_one_line(capsys):
    status, _, err = _run(capsys, ["--hosts", "2"])
    assert status == 2 and "give the command to run on each host after --" in err
    status, _, err = _run(capsys, ["--hosts", "0", "--", "true"])
    assert status == 2 and "hosts (0) must be an integer from 1" in err


def test_without_root_the_command_says_so(capsys, monkeypatch):
    monkeypatch.setattr(netns, "unavailable_reason", lambda: "emulated hosts need root (CAP_NET_ADMIN)")
    status, _, err = _run(capsys, ["--hosts", "2", "--", "true"])
    assert status == 2 and err.strip().endswith(
        "emulated hosts need root (CAP_NET_ADMIN); run as root, or without --hosts"
    )


@needs_netns
def test_each_host_runs_the_command_with_its_fields_and_environment(tmp_path, capsys):
    out = tmp_path / "h{host}.txt"
    script = f"echo {{host}} {{hosts}} {{address}} {{master}} $MASTER_ADDR $GLOO_SOCKET_IFNAME $PSGDLAB_HOST_ID > {out}"
    status, _, err = _run(capsys, ["--hosts", "3", "--", "sh", "-c", script])
    assert status == 0, err
    for h in range(3):
        words = (tmp_path / f"h{h}.txt").read_text().split()
        assert words[:6] == [str(h), "3", f"10.213.0.{h + 1}", "10.213.0.1", "10.213.0.1", "nic0"]
        assert words[6].startswith(f"psgd-{os.getpid()}-") and words[6].endswith(f"-h{h}")
    assert _mine() == []


@needs_netns
def test_a_failing_host_is_named_and_stops_the_others(capsys):
    start = time.monotonic()
    status, _, err = _run(capsys, ["--hosts", "2", "--", "sh", "-c", "[ {host} = 1 ] && exit 3; sleep 60"])
    assert status == 1 and "the command on host 1 exited with status 3; the other hosts' commands were stopped" in err
    assert time.monotonic() - start < 30  # host 0's sleep was stopped, not waited for
    assert _mine() == []


@needs_netns
def test_sigint_stops_every_host_and_removes_the_namespaces(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "psgdlab",
        "hosts",
        "--hosts",
        "2",
        "--",
        "sh",
        "-c",
        f"touch {tmp_path}/{{host}}; sleep 60",
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not all((tmp_path / str(h)).exists() for h in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "stopped by signal SIGINT" in err
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not [n for n in names if n.startswith(f"psgd-{proc.pid}-")]


@needs_netns
@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_torchrun_on_two_emulated_nodes_trains_across_the_link(tmp_path, capsys):
    """The per-rank entry under torchrun, one agent per emulated host, rendezvous on host 0: a real
    two-node launch; the summary places two ranks on each host."""
    out = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "{hosts}", "--node-rank", "{host}"]
    torchrun += ["--nproc-per-node", "2", "--master-addr", "{master}", "--master-port", "29500"]
    torchrun += ["--log-dir", str(tmp_path / "agent-{host}")]  # torchrun's default is a new /tmp/torchelastic_*
    entry = ["-m", "psgdlab.runtime", "--algorithm", "hadpsgd", "--workers", "4", "--workers-per-node", "2"]
    entry += ["--model", "least-squares", "--steps", "10", "--out", str(out)]
    status, _, err = _run(capsys, ["--hosts", "2", "--nic-bandwidth", "1Gbit/s", "--", *torchrun, *entry])
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["hosts"] == 2 and summary["placement"] == [0, 0, 1, 1] and summary["steps"] == 40
    assert _mine() == []
