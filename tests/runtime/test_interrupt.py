"""SIGINT (Ctrl-C) and SIGTERM stop a run at a step its ranks agree on.

``psgdlab train`` forwards the signal to every rank; the ranks stop at one step, checkpoint there
(a complete set: ``--resume`` continues from it) and end as a finished run does; the last line
says the run was interrupted, by which signal, and at which step it resumes, and the exit status
is the shell's for the signal (130 for SIGINT).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from psgdlab.cli import main
from psgdlab.core.errors import TransportError
from psgdlab.core.records.trace import read_trace
from psgdlab.runtime.failures.flight import FlightRecorder
from psgdlab.runtime.loop.checkpoint import complete_steps
from psgdlab.runtime.loop.exchange.normal import STOP_CHECK_EVERY
from psgdlab.runtime.loop.exchange.stopping import FileBoard, StopAgreement
from psgdlab.tests.runtime._runtime_helpers import (
    TRAJECTORY_ATOL,
    lsq_config,
    needs_topology,
    reference_for,
    trajectory,
)


# ----- the agreement on a final step, in one process --------------------------------------------------
def _agreements(n: int, starts: list[int], finished: dict[int, int] | None = None) -> list[StopAgreement]:
    """``n`` agreements whose announcements reach each other at once (on the announcing thread)."""
    agreements: list[StopAgreement] = []
    for r in range(n):
        agreements.append(
            StopAgreement(
                rank=r,
                start_step=starts[r],
                announce=lambda step, r=r: [a.heard(r, step) for a in agreements if a.rank != r],
                members=lambda: range(n),
                finished=lambda: finished or {},
                flight=FlightRecorder(r, out=None, deadline_s=5.0),
            )
        )
    return agreements


def test_the_final_step_is_one_past_the_furthest_step_any_rank_began():
    a, b, c = _agreements(3, [0, 0, 0])
    for s in range(4):
        assert not a.after(s, False)  # a begins steps 1..4
    for s in range(9):
        assert not b.after(s, False)  # b begins steps 1..9
    for s in range(2):
        assert not c.after(s, False)  # c begins 1, 2
    assert a.after(4, True) is False  # a asks at its step 4: b had begun 9, so all run to 10
    assert a.final_step() == b.final_step() == c.final_step() == 10
    assert [a.after(s, False) for s in range(5, 10)] == [False] * 4 + [True]
    assert b.after(9, False) and [c.after(s, False) for s in range(2, 10)] == [False] * 7 + [True]


def test_a_rank_that_finished_stands_for_its_last_step_and_a_rank_waits_for_the_others():
    finished: dict[int, int] = {}
    a, b = _agreements(2, [0, 0], finished)
    b.end(29)  # b finished all 30 steps and announced nothing; its end is what a hears
    waiter: dict[str, bool] = {}
    t = threading.Thread(target=lambda: waiter.update(last=a.after(12, True)))
    t.start()
    t.join(timeout=0.3)
    assert t.is_alive()  # a waits: b's end has not reached it yet
    finished[1] = 29
    t.join(timeout=5)
    assert waiter == {"last": False} and a.final_step() == 30  # a runs to the end


def test_a_member_that_never_answers_ends_the_wait_with_an_error_naming_it():
    """Where nothing removes a dead member (the normal protocol: under --on-failure restart the
    agent stops a death's survivors with the same SIGTERM), its announcement never comes."""
    silent = StopAgreement(
        rank=0,
        start_step=0,
        announce=lambda step: None,
        members=lambda: range(3),
        finished=lambda: {1: 8},
        flight=FlightRecorder(0, out=None, deadline_s=5.0),
        answer_s=0.2,
    )
    with pytest.raises(TransportError, match=r"rank 0: ranks \[2\] did not say where they stop within 0.2 s"):
        silent.after(3, True)


def test_the_file_board_holds_one_entry_per_rank(tmp_path):
    boards = [FileBoard(tmp_path, r) for r in range(3)]
    boards[0].post("stop", 7)
    boards[2].post("end", 99)
    (tmp_path / ".stop" / ".rank1.tmp123").write_text("stop")  # a file being written is no entry
    assert boards[1].read() == {0: ("stop", 7), 2: ("end", 99)}
    FileBoard.clear(tmp_path)
    assert boards[0].read() == {}


# ----- psgdlab train, interrupted --------------------------------------------------------------------
def _argv(config) -> list[str]:
    """``psgdlab train`` flags for the least-squares ``config`` of :func:`lsq_config`."""
    argv = [
        *("--algorithm", config.algorithm, "--workers", str(config.workers), "--model", "least-squares"),
        *("--steps", str(config.steps), "--batch", str(config.batch), "--lr", str(config.lr)),
        *("--lsq-dim", str(config.lsq_dim), "--lsq-samples", str(config.lsq_samples_per_worker)),
        *("--out", config.out, "--timeout", str(config.timeout_s), "--on-failure", config.failure_policy),
        *("--checkpoint-every", str(config.checkpoint_every), "--record-params"),
    ]
    if config.compute_time:
        argv += ["--compute-time", config.compute_time]
    if config.period is not None:
        argv += ["--period", str(config.period)]
    if config.variant is not None:
        argv += ["--variant", config.variant]
    return argv


def _interrupt_once(path: Path, sig: int = signal.SIGINT) -> threading.Thread:
    """Send ``sig`` to this process (the launcher: ``psgdlab train`` runs in it) once ``path`` exists."""

    def wait_then_signal() -> None:
        deadline = time.monotonic() + 90
        while not path.is_file() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=wait_then_signal, daemon=True)
    thread.start()
    return thread


def _interrupted_at(capsys, config) -> int:
    """The step the last line of an interrupted ``psgdlab train`` says the run resumes at."""
    err = capsys.readouterr().err.strip().splitlines()[-1]
    match = re.fullmatch(
        rf"psgdlab: run interrupted by Ctrl-C \(SIGINT\) at step (\d+), which every rank checkpointed; "
        rf"continue with --resume {re.escape(config.out)}",
        err,
    )
    assert match, err
    return int(match.group(1))


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_ctrl_c_stops_a_synchronous_run_and_resume_ends_on_the_uninterrupted_model(tmp_path, capsys):
    """The synchronous ranks agree at their next check (every STOP_CHECK_EVERY steps), checkpoint
    there, and the resumed run ends exactly on the oracle's trajectory (an uninterrupted run's:
    test_driver.py). Periodic checkpoints every 7 steps tell the two apart."""
    config = lsq_config(tmp_path, "ssgd", 2, steps=70, compute_time="0.02", checkpoint_every=7, name="sync")
    _interrupt_once(Path(config.out) / "checkpoints" / "step00000007" / "rank1.pt")
    assert main(["train", *_argv(config)]) == 130
    stopped = _interrupted_at(capsys, config)
    assert stopped % STOP_CHECK_EVERY == 0 and stopped % 7 != 0 and stopped < 70, stopped
    assert complete_steps(config.out, 2)[0] == stopped
    assert main(["train", "--resume", config.out, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 * 70
    np.testing.assert_allclose(trajectory(config)[-1], reference_for(config)[-1], rtol=0, atol=TRAJECTORY_ATOL)


ASYNC_CASES = [
    pytest.param("adpsgd", 4, {"on_failure": "continue"}, id="adpsgd-surviving", marks=needs_topology),
    pytest.param("adpsgd", 4, {"on_failure": "stop"}, id="adpsgd", marks=needs_topology),
    pytest.param("asgd", 3, {}, id="asgd-server"),
]


@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("algorithm", "workers", "params"), ASYNC_CASES)
def test_ctrl_c_stops_an_asynchronous_run_at_one_step_with_a_complete_checkpoint(
    tmp_path, capsys, algorithm, workers, params
):
    """Each rank of an asynchronous run is at its own step when the signal comes: they agree on
    one final step, run to it, and every one checkpoints it -- the newest complete set -- and does
    exactly that many steps. The resumed run does the rest, and its last checkpoint is complete."""
    config = lsq_config(
        tmp_path, algorithm, workers, steps=400, compute_time="0.005", checkpoint_every=40, name="async", **params
    )
    _interrupt_once(Path(config.out) / "checkpoints" / "step00000040" / f"rank{workers - 1}.pt")
    assert main(["train", *_argv(config)]) == 130
    stopped = _interrupted_at(capsys, config)
    assert 40 <= stopped < 400
    out = Path(config.out)
    assert complete_steps(out, workers)[0] == stopped
    assert not [p for p in (out / "checkpoints").glob("step*") if int(p.name[4:]) > stopped]  # nobody went past it
    trace, _ = read_trace(out / "trace.npz")
    compute = trace[trace["phase"] == 0]
    assert [int(np.count_nonzero(compute["rank"] == r)) for r in range(workers)] == [stopped] * workers
    assert main(["train", "--resume", config.out, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == workers * 400 and complete_steps(out, workers)[0] == 400
    if algorithm == "asgd":
        assert summary["server"]["requests"] == workers * (400 - stopped)  # the resumed segment's
