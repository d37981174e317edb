r"""``--on-failure restart``: the ranks run under torchrun's elastic agent, which restarts them all
when one dies; they resume from the newest complete checkpoint.

Three processes' worth of code, each small:

- the **launcher** (:func:`launch_elastic`, called by :func:`psgdlab.runtime.launcher.launch.launch`)
  starts one agent process (``python -m psgdlab.runtime.launcher.elastic``) in its own session, forwards
  SIGINT/SIGTERM to it (the agent stops every rank with SIGTERM: they stop at a step they agree
  on and checkpoint there, as without restarts; the run then raises
  :class:`~psgdlab.core.errors.RunInterrupted`), enforces the time limit, kills what is left if the agent
  itself dies, removes the shared-memory segments of every rank it ever started, and adds
  ``restarts`` to ``summary.json``;
- the **agent** (:func:`agent_main`): torchrun's :class:`~torch.distributed.elastic.agent.server.
  local_elastic_agent.LocalElasticAgent` with a c10d rendezvous on 127.0.0.1 (its store lives in
  the agent, not in a rank: any rank, rank 0 included, may die), ``world_size`` workers running
  ``python -m psgdlab.runtime --config OUT/launch.json`` and ``max_restarts`` = ``--max-restarts``.
  On every failure it writes one line of ``OUT/.ranks/restarts.jsonl`` (when, which rank, why),
  says so on stderr, removes the dead ranks' segments and restarts every worker;
- the **ranks**: with ``TORCHELASTIC_RESTART_COUNT`` > 0 :func:`psgdlab.runtime.train.train`
  resumes from the newest complete checkpoint every rank can read (from step 0 if there is none),
  and every rank keeps a :class:`Progress` record (24 bytes, memory-mapped: no system call per
  step) from which the launcher reads the steps each failure lost and when the first step after
  the restart ended.

Each restart in the summary (``restarts``, in order)::

    {"attempt": 1, "time_s": 3.2, "rank": 1, "cause": "was killed by signal SIGKILL",
     "resumed_from_step": 8, "steps_lost": 3, "time_to_first_step_s": 2.4}

``time_s`` is when the agent saw the failure, in seconds since the agent started;
``time_to_first_step_s`` runs from then to the end of the first step after the restart (on the
fastest rank); ``steps_lost`` = the steps the failed attempt had done (its furthest rank) minus
``resumed_from_step``. A synchronous run restarted so ends bit-identical to one never
interrupted (tests/runtime/test_elastic.py).

Not supported: ``--backend mpi`` (the agent starts processes, not MPI ranks) and emulated hosts
(``--hosts``: the agent cannot start a rank inside a network namespace); both are refused when
the :class:`~psgdlab.runtime.config.TrainConfig` is made.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError, RunInterrupted, TransportError
from psgdlab.core.files import append_text, atomic_write_bytes, atomic_write_text
from psgdlab.core.records.rundir import SUMMARY_FILE
from psgdlab.runtime.launcher.ranks import describe_exit, describe_interruption

__all__ = [
    "launch_elastic",
    "agent_main",
    "restart_count",
    "restart_records",
    "Progress",
    "RESTART_ENV",
    "RESTARTS_FILE",
]

#: set by torchrun's agent in every worker: how many times the workers were restarted
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
#: one JSON line per failure the agent saw, in ``OUT/.ranks``
RESTARTS_FILE = "restarts.jsonl"
#: every worker pid the agent started, one a line, in ``OUT/.ranks``
PIDS_FILE = "worker_pids"
#: the agent's start (wall clock), in ``OUT/.ranks``
AGENT_START_FILE = "agent_start"


def restart_count(environ: dict[str, str] | None = None) -> int:
    """How many times torchrun's agent restarted this process's worker group (0: first attempt)."""
    env = os.environ if environ is None else environ
    try:
        return int(env.get(RESTART_ENV, "0") or 0)
    except ValueError:
        return 0


# ----- the ranks: progress records --------------------------------------------------------------
class Progress:
    """``OUT/.ranks/progress.a{attempt}.rank{rank}``: three float64 kept up to date through a
    shared mapping -- the attempt's first step, the steps done, and when (wall clock) the
    attempt's first step ended (0 until then). Call it after every step (the driver's
    ``progress`` hook)."""

    def __init__(self, ranks_dir: str | Path, *, rank: int, attempt: int, start_step: int) -> None:
        path = Path(ranks_dir) / f"progress.a{attempt}.rank{rank}"
        atomic_write_bytes(path, np.array([start_step, start_step, 0.0], dtype=np.float64).tobytes())
        with open(path, "r+b") as fh:  # the file just renamed into this run's own directory
            self._map = mmap.mmap(fh.fileno(), 24)
        self._values = np.frombuffer(self._map, dtype=np.float64)
        self._first = True

    def __call__(self, step: int, loss: float, rate: float) -> None:
        self._values[1] = step + 1
        if self._first:
            self._values[2] = time.time()
            self._first = False


def _read_progress(ranks_dir: Path, attempt: int) -> list[np.ndarray]:
    out = []
    for path in sorted(ranks_dir.glob(f"progress.a{attempt}.rank*")):
        data = path.read_bytes()
        if len(data) == 24:
            out.append(np.frombuffer(data, dtype=np.float64))
    return out


def restart_records(ranks_dir: str | Path) -> list[dict[str, Any]]:
    """The restarts of a run (module docstring), from the agent's failure lines and the ranks'
    progress records; the last failure is included only if the run was restarted after it."""
    ranks_dir = Path(ranks_dir)
    path = ranks_dir / RESTARTS_FILE
    failures = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    started = float((ranks_dir / AGENT_START_FILE).read_text()) if (ranks_dir / AGENT_START_FILE).is_file() else 0.0
    records = []
    for failure in failures:
        if not failure.get("restarted", True):
            continue
        before = _read_progress(ranks_dir, failure["attempt"])
        after = _read_progress(ranks_dir, failure["attempt"] + 1)
        record: dict[str, Any] = {
            "attempt": failure["attempt"] + 1,
            "time_s": failure["time"] - started,
            "rank": failure["rank"],
            "cause": failure["cause"],
            "resumed_from_step": None,
            "steps_lost": None,
            "time_to_first_step_s": None,
        }
        if after:
            resumed = int(after[0][0])
            record["resumed_from_step"] = resumed
            done = max((int(p[1]) for p in before), default=resumed)
            record["steps_lost"] = max(0, done - resumed)
            ends = [float(p[2]) for p in after if p[2] > 0]
            if ends:
                record["time_to_first_step_s"] = min(ends) - failure["time"]
        records.append(record)
    return records


# ----- the agent ----------------------------------------------------------------------------------
def _make_agent_class() -> type:
    """:class:`LocalElasticAgent` that records every failure and every worker it starts, and
    removes the shared-memory segments of the workers it stops (imported lazily: torch)."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from psgdlab.runtime.transports.shm.shm_sys import remove_segments, start_time

    class RecordingAgent(LocalElasticAgent):
        def __init__(self, *args: Any, ranks_dir: Path, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.ranks_dir = ranks_dir
            self.attempt = 0

        def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
            pids = super()._start_workers(worker_group)
            # with start times: pids are reused
            append_text(self.ranks_dir / PIDS_FILE, "".join(f"{pid} {start_time(pid) or 0}\n" for pid in pids.values()))
            return pids

        def _stop_workers(self, worker_group: WorkerGroup) -> None:
            pids = [int(w.id) for w in worker_group.workers if w.id is not None]
            super()._stop_workers(worker_group)
            remove_segments(pids)

        def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
            result = super()._monitor_workers(worker_group)
            if result.is_failed():
                self._record(result, worker_group)
            return result

        def _record(self, result: RunResult, worker_group: WorkerGroup) -> None:
            spec = worker_group.spec
            # the first to fail: not one the agent stopped (SIGTERM), then the earliest, killed by a
            # signal before exited with an error (survivors exit with 1 finding their peer gone)
            rank, failure = min(
                result.failures.items(),
                key=lambda kv: (kv[1].exitcode == -signal.SIGTERM, kv[1].timestamp, kv[1].exitcode >= 0, kv[0]),
            )
            restarted = self._remaining_restarts > 0
            line = {
                "attempt": self.attempt,
                "time": time.time(),
                "rank": int(rank),
                "cause": describe_exit(int(failure.exitcode)),
                "restarted": restarted,
                "others": sorted(int(r) for r in result.failures if r != rank),
            }
            append_text(self.ranks_dir / RESTARTS_FILE, json.dumps(line) + "\n")
            if restarted:
                n = spec.max_restarts - self._remaining_restarts + 1
                print(
                    f"psgdlab: rank {rank} {line['cause']}; restarting every rank from the newest complete "
                    f"checkpoint (restart {n} of {spec.max_restarts})",
                    file=sys.stderr,
                    flush=True,
                )
            self.attempt += 1

    return RecordingAgent


def agent_main(argv: list[str] | None = None) -> int:
    """``python -m psgdlab.runtime.launcher.elastic``: run the workers of ``--config`` under the agent."""
    parser = argparse.ArgumentParser(
        prog="python -m psgdlab.runtime.launcher.elastic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", required=True, help="OUT/launch.json")
    parser.add_argument("--nproc", type=int, required=True, help="workers (the world size)")
    parser.add_argument("--max-restarts", type=int, required=True)
    parser.add_argument("--port", type=int, required=True, help="the rendezvous port on 127.0.0.1")
    parser.add_argument("--shutdown-timeout", type=int, default=30)
    args = parser.parse_args(argv)
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry as rdzv_registry

    ranks_dir = Path(os.environ["PSGDLAB_RANKS_DIR"])
    atomic_write_text(ranks_dir / AGENT_START_FILE, repr(time.time()))
    rdzv = rdzv_registry.get_rendezvous_handler(
        RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{args.port}",
            run_id=f"psgdlab-{os.getpid()}",
            min_nodes=1,
            max_nodes=1,
        )
    )
    spec = WorkerSpec(
        role="psgdlab",
        local_world_size=args.nproc,
        entrypoint=sys.executable,
        args=("-m", "psgdlab.runtime", "--config", args.config),
        rdzv_handler=rdzv,
        max_restarts=args.max_restarts,
        monitor_interval=0.1,
        master_addr="127.0.0.1",
    )
    logs = tempfile.mkdtemp(prefix="psgdlab-elastic-")
    agent = _make_agent_class()(
        spec=spec,
        logs_specs=DefaultLogsSpecs(log_dir=logs),
        shutdown_timeout=args.shutdown_timeout,
        ranks_dir=ranks_dir,
    )
    try:
        result = agent.run()
    except SignalException as exc:
        return 128 + int(exc.sigval)
    finally:
        rdzv.shutdown()
        shutil.rmtree(logs, ignore_errors=True)
    return 1 if result.is_failed() else 0


# ----- the launcher -------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """``preexec_fn`` of the agent: SIGTERM when the launcher dies (it then stops its workers)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def launch_elastic(
    config: Any, *, extra_env: dict[str, str] | None = None, timeout_s: float | None = None, quiet: bool = False
) -> dict[str, Any]:
    """Run ``config`` (``on_failure == "restart"``) under the agent; rank 0's summary with
    ``restarts`` added. A fresh run (not ``resume``) first removes the checkpoints an earlier run
    left in its directory: a restart must never resume from them."""
    from psgdlab.core.records.rundir import commit_run, read_summary, write_summary
    from psgdlab.runtime.launcher.ranks import RANKS_DIR
    from psgdlab.runtime.loop import checkpoint as ckpt

    if not config.out:
        raise ConfigError("launch needs an output directory (config.out)")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    ranks_dir = out / RANKS_DIR
    shutil.rmtree(ranks_dir, ignore_errors=True)
    ranks_dir.mkdir()
    if not config.resume:
        ckpt.remove_checkpoints(out)
    cmd, env = _agent_command(config, out, extra_env)
    returncode, timed_out, sig = _run_agent(cmd, env, ranks_dir, timeout_s=timeout_s, quiet=quiet)
    records = restart_records(ranks_dir)
    if timed_out:
        raise TransportError(f"run exceeded its time limit of {timeout_s:.0f} s; every rank was stopped")
    if sig is not None:
        from psgdlab.runtime.config import world_size_of

        world = world_size_of(config)
        raise RunInterrupted(
            describe_interruption(sig, out, config.workers, started=world, world=world), signal_number=sig
        )
    if returncode != 0:
        message = _failure_message(ranks_dir, config.max_restarts, returncode, len(records))
        found = ckpt.latest_complete_step(out, config.workers)
        if found is not None:
            message += f"; the newest complete checkpoint is step {found} (continue with --resume {out})"
        raise TransportError(message)
    summary_path = out / SUMMARY_FILE
    if not summary_path.is_file():
        raise TransportError(f"every rank exited but rank 0 wrote no {summary_path}")
    summary = read_summary(out)
    summary.figures["restarts"] = records
    write_summary(out, summary)
    commit_run(out, command="train")  # again, over the summary with its restarts
    return json.loads(summary_path.read_text())


def _agent_command(config: Any, out: Path, extra_env: dict[str, str] | None) -> tuple[list[str], dict[str, str]]:
    """The agent's command line (writing ``OUT/launch.json``, the config its ranks read) and environment."""
    from psgdlab.core.records.trace import atomic_write_json
    from psgdlab.runtime.config import world_size_of
    from psgdlab.runtime.launcher.ranks import RANKS_DIR, STOP_GRACE_S, free_port, rank_environment

    config_path = atomic_write_json(out / "launch.json", {"train": config.to_json()})
    env = rank_environment(out / RANKS_DIR, extra_env)
    env.pop(RESTART_ENV, None)
    # the workers' store: rank 0's own, on a fresh port each attempt. Shared with the rendezvous
    # (torch's default) it outlives an attempt, and a restarted rank can read the dead attempt's
    # gloo addresses from it ("connection refused" in connectFullMesh)
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "psgdlab.runtime.launcher.elastic",
        "--config",
        str(config_path),
        "--nproc",
        str(world_size_of(config)),
        "--max-restarts",
        str(config.max_restarts),
        "--port",
        str(free_port()),
        "--shutdown-timeout",
        str(int(STOP_GRACE_S)),
    ]
    return cmd, env


def _run_agent(
    cmd: list[str], env: dict[str, str], ranks_dir: Path, *, timeout_s: float | None, quiet: bool
) -> tuple[int, bool, int | None]:
    """Run the agent until it exits, forwarding SIGINT and SIGTERM to it and stopping it after
    ``timeout_s``; then stop what it left running. Returns its exit code, whether it timed out and
    the signal forwarded (``None``: none)."""
    from psgdlab.runtime.launcher.ranks import GRACE_S, STOP_GRACE_S, signals_to
    from psgdlab.runtime.transports.shm.shm_sys import remove_segments

    forwarded: dict[str, Any] = {"sig": None}
    agent: subprocess.Popen | None = None

    def _forward(signum: int, frame: Any) -> None:
        forwarded["sig"] = signum
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)  # the agent stops every worker with it

    start = time.monotonic()
    timed_out = False
    with signals_to(_forward):
        try:
            agent = subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL if quiet else None,
                start_new_session=True,  # the terminal's SIGINT reaches the launcher only, which forwards it
                preexec_fn=_die_with_parent,
            )
            if forwarded["sig"] is not None:
                agent.send_signal(signal.SIGTERM)
            while agent.poll() is None:
                if timeout_s is not None and time.monotonic() - start > timeout_s and not timed_out:
                    timed_out = True
                    agent.send_signal(signal.SIGTERM)
                time.sleep(0.1)
        finally:
            if agent is not None and agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
                try:
                    agent.wait(timeout=STOP_GRACE_S + GRACE_S)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()
            workers = _worker_pids(ranks_dir)
            _kill_left(workers)  # the agent was killed before it could stop them
            remove_segments(pid for pid, _ in workers)
    return agent.returncode, timed_out, forwarded["sig"]


def _failure_message(ranks_dir: Path, max_restarts: int, code: int, restarts: int) -> str:
    path = ranks_dir / RESTARTS_FILE
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if not lines:
        return f"run failed: the elastic agent {describe_exit(code)} before any rank failed"
    last = lines[-1]
    others = f" (then: rank {', '.join(map(str, last['others']))} exited too)" if last["others"] else ""
    return (
        f"run failed: rank {last['rank']} {last['cause']}{others}, after {restarts} restart"
        f"{'s' if restarts != 1 else ''} (--max-restarts {max_restarts})"
    )


def _worker_pids(ranks_dir: Path) -> list[tuple[int, int]]:
    """Every worker the agent started: (pid, start time in clock ticks)."""
    path = ranks_dir / PIDS_FILE
    lines = path.read_text().splitlines() if path.is_file() else []
    return [(int(a), int(b)) for a, b in (line.split() for line in lines if line.strip())]


def _kill_left(workers: list[tuple[int, int]]) -> None:
    """SIGKILL the workers still running (same pid and start time: not a reused pid)."""
    from psgdlab.runtime.transports.shm.shm_sys import start_time

    for pid, started in workers:
        if started and start_time(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    sys.exit(agent_main())
