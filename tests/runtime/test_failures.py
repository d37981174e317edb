"""Failures: the flight recorder, the watchdog, and ``--on-failure stop`` on real runs.

The distributed cases inject a failure with ``PSGDLAB_TEST_CRASH=RANK:STEP[:STOP]`` (the rank
notes the wall time in ``.ranks/rank{r}.crash``, then SIGKILLs or SIGSTOPs itself) and check
that the run stops with one error naming that rank and the step, soon after, with the
survivors' flight records, ``failure.json`` and nothing left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from psgdlab.core.errors import TransportError
from psgdlab.runtime.failures.flight import FlightRecorder, describe_wait, flight_path
from psgdlab.runtime.failures.stop import (
    FAILURE_FILE,
    RankWatch,
    _say_waits,
    _step_of,
    process_state,
    remove_partial_files,
)
from psgdlab.tests.runtime._runtime_helpers import leftover_segments, lsq_config, needs_topology

# ----- the recorder and the launcher's bookkeeping (no processes) ----------------------------------


def test_the_recorder_keeps_the_last_records_and_the_pending_ones(tmp_path):
    rec = FlightRecorder(2, out=tmp_path, deadline_s=60.0, capacity=3)
    for step in range(5):
        with rec.wait("allreduce", what="gradient", step=step, peers=(0, 1, 2), nbytes=64):
            pass
    with pytest.raises(RuntimeError), rec.wait("pairwise", what="active", step=5, peers=[1]):
        raise RuntimeError("peer vanished")
    with rec.wait("pairwise", what="passive", step=None) as pending:
        pending.update(peers=[3], step=6)  # the header named them
        snap = rec.snapshot()
        path = rec.dump("deadline", "rank 2: waited")
        assert rec.dump("error", "second") is None  # the first reason wins
    assert [r["step"] for r in snap["records"]] == [4, 5, 6]  # a ring of 3
    assert [r["state"] for r in snap["records"]] == ["done", "failed", "pending"]
    assert [(p["step"], p["peers"]) for p in snap["pending"]] == [(6, [3])]
    assert path == flight_path(tmp_path, 2)
    written = json.loads(path.read_text())
    assert written["reason"] == "deadline" and written["rank"] == 2 and written["error"] == "rank 2: waited"
    assert written["pending"][0]["kind"] == "pairwise" and written["pending"][0]["waited_s"] >= 0
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # renamed into place


def test_a_wait_is_overdue_past_its_deadline():
    rec = FlightRecorder(0, out=None, deadline_s=60.0)
    with rec.wait("gossip", step=6, peers=[1, 2]):
        assert rec.overdue() is None  # younger than the deadline
        with rec.wait("setup", step=0, deadline_s=0.0):  # a wait's own deadline
            time.sleep(0.01)
            overdue = rec.overdue()
        assert overdue is not None and overdue[0]["kind"] == "setup" and overdue[1] > 0
        assert rec.overdue() is None


def test_times_are_shifted_to_the_run_origin():
    rec = FlightRecorder(0, out=None, deadline_s=1.0)
    with rec.wait("setup", step=0):
        pass
    before = rec.snapshot()["records"][0]["start_s"]
    rec.set_origin(rec.origin + 10.0)
    assert rec.snapshot()["records"][0]["start_s"] == pytest.approx(before - 10.0)
    assert rec.dump("error") is None  # no run directory: nothing written


def test_waits_are_described_in_one_phrase():
    assert describe_wait({"kind": "allreduce", "what": "gradient", "peers": [0, 1, 2], "step": 17}) == (
        "allreduce (gradient) with ranks [0, 1, 2] at step 17"
    )
    assert describe_wait({"kind": "server", "what": "request", "peers": [], "step": None}) == (
        "server (request) from any rank"
    )


def test_a_dead_rank_is_named_before_a_survivor_that_erred_first():
    """A survivor whose peer vanished may exit with its error before the dead rank is seen."""
    watch = RankWatch(deadline_s=5.0)
    watch.saw(0, "rank 0 exited with status 1", dead=False, when=100.0)
    watch.saw(2, "rank 2 was killed by signal SIGKILL", dead=True, when=100.2)
    watch.saw(1, "rank 1 died", dead=True, when=100.1, known=False)
    watch.saw(2, "ignored: the first note of a rank stays", dead=False)
    assert [f.rank for f in watch.culprits()] == [1, 2, 0]


def test_the_step_is_the_collective_the_survivors_waited_on_else_the_newest():
    wait = {"kind": "allreduce", "what": "gradient", "peers": [0, 1, 2], "step": 7, "state": "pending"}
    waits = [dict(wait, rank=0, waited_s=0.1), dict(wait, rank=2, waited_s=0.3)]
    assert _step_of(waits, {}, [1]) == (7, "collective")
    assert _say_waits(waits) == ["ranks [0, 2] waited 0.1-0.3 s on allreduce (gradient) with ranks [0, 1, 2] at step 7"]
    records = {0: {"records": [{"kind": "pairwise", "step": 3}, {"kind": "gather", "step": 99}]}}
    pairwise = [dict(waits[0], kind="pairwise", peers=[1], step=2)]
    assert _step_of(pairwise, records, [1]) == (3, "front")  # asynchronous: the newest step reached
    records[2] = {"records": [{"kind": "pairwise", "what": "passive", "peers": [1], "step": 2}]}
    assert _step_of(pairwise, records, [1]) == (2, "request")  # rank 1 asked at its step 2


def test_partial_files_of_the_killed_ranks_are_removed(tmp_path):
    (tmp_path / "checkpoints" / "step00000004").mkdir(parents=True)
    killed = tmp_path / "checkpoints" / "step00000004" / ".rank1.pt.tmp4242"
    other = tmp_path / ".summary.json.tmp42"  # another process's: kept
    for path in (killed, other):
        path.write_bytes(b"x")
    assert remove_partial_files(tmp_path, [4242]) == [killed]
    assert other.exists() and not killed.exists()


def test_every_temporary_file_of_a_rank_is_found_by_its_process(tmp_path):
    """An epoch proposal, a corpus and any atomic write are written under ``temporary_path``: what
    a rank killed while writing left is removed by its process id (a 200-fault campaign found an
    epoch proposal's ``.epochN.RANK.PID.tmp`` that the sweep, which looked for ``tmpPID``, missed)."""
    from psgdlab.core.records.trace import temporary_path

    left = [
        temporary_path(tmp_path / "membership" / "epoch00000002.json", tag="2"),
        temporary_path(tmp_path / "corpus.h5"),
        temporary_path(tmp_path / "summary.json"),
    ]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    assert sorted(remove_partial_files(tmp_path, [os.getpid()])) == sorted(left)
    assert not any(path.exists() for path in left)


def test_a_stopped_process_is_seen_stopped_and_killed_past_the_deadline():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        watch = RankWatch(deadline_s=0.2)
        os.kill(proc.pid, signal.SIGSTOP)
        for _ in range(50):
            if process_state(proc.pid) == "T":
                break
            time.sleep(0.01)
        assert watch.check_stopped({3: proc.pid}) == []
        time.sleep(0.3)
        assert watch.check_stopped({3: proc.pid}) == [3]
        watch.kill_stopped({3: proc.pid}, [3])
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert "rank 3 was stopped" in watch.culprits()[0].text
    finally:
        proc.kill()
        proc.wait()


def test_the_watchdog_ends_a_rank_whose_wait_passed_the_deadline(tmp_path):
    """In a process of its own: the watchdog leaves with os._exit."""
    script = textwrap.dedent(
        f"""
        import time
        from psgdlab.runtime.failures.flight import FlightRecorder, Watchdog
        rec = FlightRecorder(1, out={str(tmp_path)!r}, deadline_s=0.3)
        Watchdog(rec, ranks_dir=None).start()
        with rec.wait("allreduce", what="gradient", step=4, peers=[0, 1]):
            time.sleep(20)
        """
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert time.monotonic() - start < 10
    assert "rank 1: waited 0." in done.stderr
    assert "s on allreduce (gradient) with ranks [0, 1] at step 4, past the deadline of 0.3 s" in done.stderr
    record = json.loads(flight_path(tmp_path, 1).read_text())
    assert record["reason"] == "deadline" and record["pending"][0]["step"] == 4


def test_the_watchdog_ends_a_rank_when_the_launcher_aborts(tmp_path):
    script = textwrap.dedent(
        f"""
        import time
        from psgdlab.runtime.failures.flight import FlightRecorder, Watchdog
        rec = FlightRecorder(0, out={str(tmp_path)!r}, deadline_s=60)
        Watchdog(rec, ranks_dir={str(tmp_path)!r}).start()
        with rec.wait("barrier", step=2, peers=[0, 1]):
            time.sleep(20)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    threading.Timer(0.5, lambda: (tmp_path / "abort").write_text("rank 1 died\n")).start()
    assert proc.wait(timeout=15) == 1
    record = json.loads(flight_path(tmp_path, 0).read_text())
    assert record["reason"] == "abort" and record["error"] == "rank 1 died"


# ----- real runs ---------------------------------------------------------------------------------
def _fail_run(config, crash: str):
    """Launch ``config`` with the injected failure; returns (error, seconds from the failure to the
    launcher's return, failure.json)."""
    from psgdlab.runtime.launcher.launch import launch

    with pytest.raises(TransportError) as info:
        launch(config, quiet=True, timeout_s=60, extra_env={"PSGDLAB_TEST_CRASH": crash})
    ended = time.time()
    stamp = Path(config.out) / ".ranks" / f"rank{crash.split(':')[0]}.crash"
    assert stamp.is_file(), f"the run failed before the injected failure: {info.value}"
    injected = float(stamp.read_text().split()[0])
    return str(info.value), ended - injected, json.loads((Path(config.out) / FAILURE_FILE).read_text())


def _check_left_nothing(config, removed: list[int], world: int) -> None:
    assert not leftover_segments(config.out)
    assert not list(Path(config.out).rglob(".*.tmp*"))  # no partial file
    assert not list(Path(config.out).glob("summary.json"))  # a failed run writes no summary
    for r in range(world):
        if r not in removed:  # every survivor wrote a complete record
            record = json.loads(flight_path(config.out, r).read_text())
            assert record["rank"] == r and record["reason"] in ("abort", "error", "deadline")
            assert record["records"], record


@pytest.mark.distributed
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("algorithm", "workers", "rank", "exact"),
    [
        pytest.param("ssgd", 3, 0, True, id="ssgd-rank0"),
        pytest.param("adpsgd", 4, 1, False, id="adpsgd-rank1", marks=needs_topology),
    ],
)
def test_a_killed_rank_is_named_with_its_step(tmp_path, algorithm, workers, rank, exact):
    """Rank 0 holds gloo's rendezvous store: its death must be named as any other's."""
    config = lsq_config(tmp_path, algorithm, workers, steps=100000, compute_time="0.002")
    config = config.replace(record_params=False, on_failure="stop")  # adpsgd's default goes on (test_continue)
    error, detection_s, failure = _fail_run(config, f"{rank}:5")
    assert error.startswith(f"run failed: rank {rank} was killed by signal SIGKILL "), error
    if exact:  # every survivor waits on it in the gradient allreduce of step 5
        assert "at step 5;" in error and "waited" in error, error
    else:  # asynchronous: its peers' steps differ
        assert re.search(r" (by step \d+ \(the newest|at step [0-5] or after)", error), error
    assert detection_s < 3 + 2  # the survivors' grace for their records, and slack
    (change,) = failure["membership_changes"]
    assert change["removed"] == [rank] and change["detection_s"] < 1.0
    assert failure["survivors"] == [r for r in range(workers) if r != rank]
    assert all(w["rank"] != rank for w in failure["waits"])
    _check_left_nothing(config, [rank], workers)


@pytest.mark.distributed
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_a_stopped_rank_is_dead_after_the_deadline(tmp_path, backend):
    """SIGSTOP: alive to every liveness check, silent to its peers. MPI has no timeout of its own:
    the watchdog ends the survivors."""
    deadline = 2.0
    config = lsq_config(tmp_path, "ssgd", 3, steps=100000, backend=backend, compute_time="0.002").replace(
        timeout_s=deadline, record_params=False
    )
    mpich_before = set(Path("/dev/shm").glob("mpich_shm_*"))
    error, detection_s, failure = _fail_run(config, "1:5:STOP")
    assert error.startswith("run failed: rank 1 was stopped (SIGSTOP or a debugger) for "), error
    assert "at step 5;" in error and "allreduce (gradient) with ranks [0, 1, 2] at step 5" in error, error
    assert deadline <= detection_s < deadline + 3
    (change,) = failure["membership_changes"]
    assert change["removed"] == [1] and change["step"] == 5
    assert deadline - 0.5 < change["detection_s"] < deadline + 1
    pid = int((Path(config.out) / ".ranks" / "rank1.pid").read_text())
    assert process_state(pid) is None  # killed, not left stopped
    _check_left_nothing(config, [1], 3)
    assert set(Path("/dev/shm").glob("mpich_shm_*")) <= mpich_before


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_a_failure_record_that_cannot_be_written_still_ends_in_one_error(tmp_path, monkeypatch):
    """A full disk (often what failed the run) must not turn the launcher's error into a traceback."""
    from psgdlab.runtime.failures import stop
    from psgdlab.runtime.launcher.launch import launch

    def full(path, obj):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(stop, "atomic_write_json", full)
    config = lsq_config(tmp_path, "ssgd", 2, steps=100000, compute_time="0.002").replace(record_params=False)
    with pytest.raises(TransportError) as info:
        launch(config, quiet=True, timeout_s=60, extra_env={"PSGDLAB_TEST_CRASH": "1:5"})
    message = str(info.value)
    assert message.startswith("run failed: rank 1 was killed by signal SIGKILL"), message
    assert message.endswith("; failure.json not written: No space left on device") and "\n" not in message
    assert not (Path(config.out) / "failure.json").exists()


def test_a_sigkill_while_the_oom_killer_struck_says_so(monkeypatch):
    """A rank killed by SIGKILL is named with its signal; when the kernel's out-of-memory killer
    has killed processes since the run began (``oom_kill`` of /proc/vmstat), the error says that
    this is the likely cause -- nothing else tells a user why the run lost a rank."""
    from psgdlab.runtime.launcher import ranks

    kills = iter([7])
    monkeypatch.setattr(ranks, "oom_kills", lambda: next(kills))
    text = ranks.describe_exit(-signal.SIGKILL, oom_kills_before=5)
    assert text.startswith("was killed by signal SIGKILL (the kernel's out-of-memory killer killed 2 process(es)")
    monkeypatch.setattr(ranks, "oom_kills", lambda: 5)  # none since: the plain signal
    assert ranks.describe_exit(-signal.SIGKILL, oom_kills_before=5) == "was killed by signal SIGKILL"
    assert ranks.describe_exit(-signal.SIGTERM, oom_kills_before=0) == "was killed by signal SIGTERM"
    assert ranks.describe_exit(1) == "exited with status 1"
