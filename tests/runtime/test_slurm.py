"""The Slurm recipe of ``examples/slurm/`` under a real single-node Slurm on this machine.

A module fixture starts ``munged``, ``slurmctld`` and ``slurmd`` in a temporary directory (their
own key, sockets, ports, state and logs, nothing of the machine's Slurm or munge configuration;
one node of this machine's CPUs, ``proctrack/linuxproc``, ``task/none``, no cgroups) and stops
them afterwards. It skips, saying why, where it cannot: not root, Slurm or munge not installed
(``.ci/run`` installs ``slurm-wlm`` and ``munge`` from Debian), the node's name does not resolve,
or a daemon that does not come up.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psgdlab.runtime.transports.env import SLURM_PORT_BASE, SLURM_PORT_SPAN, expand_hostlist

pytestmark = [pytest.mark.slurm, pytest.mark.distributed]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "slurm"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "sinfo")
#: how long a daemon may take to come up, and a job to run, on a loaded 2-core machine
UP_S, JOB_S = 30.0, 150.0

SLURM_CONF = """\
ClusterName=psgdlab-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
PlugStackConfig={dir}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path.name} not written)"


class Cluster:
    """A one-node Slurm of this machine, its daemons started here and owned by this object."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        self.daemons: list[tuple[str, subprocess.Popen]] = []

    def start(self) -> None:
        (self.root / "state").mkdir()
        (self.root / "spool").mkdir()
        (self.root / "plugstack.conf").write_text("")
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        conf = SLURM_CONF.format(
            node=self.node, dir=self.root, cpus=os.cpu_count() or 1, ctld_port=_free_port(), slurmd_port=_free_port()
        )
        (self.root / "slurm.conf").write_text(conf)
        socket_path = self.root / "munge.socket"
        self._daemon(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={socket_path}", f"--key-file={key}"]
            + [f"--log-file={self.root / 'munged.log'}", f"--pid-file={self.root / 'munged.pid'}"]
            + [f"--seed-file={self.root / 'munged.seed'}"],
        )
        self._wait(lambda: socket_path.exists(), "munged", self.root / "munged.log")
        conf_path = str(self.root / "slurm.conf")
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", conf_path])
        self._daemon("slurmd", ["slurmd", "-D", "-f", conf_path, "-N", self.node])
        self._wait(self._node_idle, "slurmctld and slurmd", self.root / "slurmd.log")

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()
        self.daemons.append((name, proc))

    def _node_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-n", self.node, "-o", "%T"], check=False)
        return out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated")

    def _wait(self, ready, what: str, log: Path) -> None:
        deadline = time.monotonic() + UP_S
        while time.monotonic() < deadline:
            for name, proc in self.daemons:
                if proc.poll() is not None:
                    pytest.skip(f"{name} exited with status {proc.returncode}: {_tail(self.root / f'{name}.out')}")
            if ready():
                return
            time.sleep(0.2)
        pytest.skip(f"{what} did not come up within {UP_S:.0f} s: {_tail(log)}")

    def run(self, argv: list[str], *, check: bool = True, **kw) -> subprocess.CompletedProcess:
        out = subprocess.run(
            argv, env={**self.env, **kw.pop("env", {})}, capture_output=True, text=True, timeout=60, **kw
        )
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited with {out.returncode}: {out.stderr.strip()}")
        return out

    def sbatch(self, script: Path, *args: str, cwd: Path, env: dict[str, str] | None = None) -> dict[str, str]:
        """Submit ``script`` and wait for the job; its fields of ``scontrol show job`` once ended."""
        sub = self.run(["sbatch", "--parsable", "--time=5", str(script), *args], cwd=cwd, env=env or {})
        job = sub.stdout.strip().split(";")[0]
        deadline = time.monotonic() + JOB_S
        while time.monotonic() < deadline:
            fields = dict(
                f.split("=", 1) for f in self.run(["scontrol", "-o", "show", "job", job]).stdout.split() if "=" in f
            )
            if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return fields
            time.sleep(0.5)
        self.run(["scancel", job], check=False)
        raise AssertionError(f"job {job} did not end within {JOB_S:.0f} s")

    def stop(self) -> None:
        if shutil.which("scancel"):
            self.run(["scancel", "--full", "-w", self.node], check=False)
        for _name, proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.terminate()
        for _name, proc in reversed(self.daemons):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the Slurm test starts slurmd, which runs jobs as root here: not root")
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm or munge is not installed ({', '.join(missing)} not on PATH; Debian: slurm-wlm munge)")
    node = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(node)
    except OSError:
        pytest.skip(f"this machine's name {node!r} does not resolve (a Slurm node's name must, for the rendezvous)")
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_an_sbatch_job_of_2_tasks_trains_ssgd_under_srun(cluster, tmp_path):
    job = cluster.sbatch(
        EXAMPLES / "train.sbatch",
        *("--algorithm", "ssgd", "--model", "least-squares", "--steps", "6", "--out", str(tmp_path / "run")),
        cwd=tmp_path,
        env={"PSGDLAB_PYTHON": sys.executable},
    )
    output = tmp_path / f"psgdlab-train-{job['JobId']}.out"
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), _tail(output, 20)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert summary["world_size"] == 2 and summary["steps_per_worker"] == 6 and summary["survivors"] == [0, 1]
    # the ranks found each other through the rendezvous derived from the job, exported by nobody
    port = SLURM_PORT_BASE + (16 * int(job["JobId"]) + 0) % SLURM_PORT_SPAN
    assert (env["launcher"], env["rendezvous"], env["world_size"]) == ("slurm", f"{cluster.node}:{port}", 2)
    assert f"job {job['JobId']} on {cluster.node}, 2 tasks" in output.read_text()


@pytest.mark.slow
def test_the_calibration_job_writes_a_profile_predict_takes(cluster, tmp_path):
    job = cluster.sbatch(
        EXAMPLES / "calibrate.sbatch",
        cwd=tmp_path,
        env={"PSGDLAB_PYTHON": sys.executable, "CALIBRATE_STEPS": "8"},
    )
    output = tmp_path / f"psgdlab-calibrate-{job['JobId']}.out"
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), _tail(output, 20)
    said = output.read_text()
    assert "no nccl-tests" in said  # none on this machine: that part says it skipped
    profile = tmp_path / f"calibration-{job['JobId']}" / "node.toml"
    out = subprocess.run(
        [sys.executable, "-m", "psgdlab", "predict", "--platform", str(profile), "--workers", "2", "--algorithm"]
        + ["ssgd", "--steps", "20", "--json", "--out", str(tmp_path / "pred")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["rows"][0]["step_time_s"] > 0.04  # the emulated compute and more


def test_hostlists_expand_as_scontrol_expands_them(cluster):
    for hostlist in ("gpu[01-03,7],login1", "n[8-011],n[08-9]", "a[1-2]-b[01-02],z[098-101]"):
        said = cluster.run(["scontrol", "show", "hostnames", hostlist]).stdout.split()
        assert expand_hostlist(hostlist) == said
