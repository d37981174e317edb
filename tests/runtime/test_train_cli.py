"""``psgdlab train``: every bad input is one line on stderr and exit status 2, before any
process starts; a good run prints the summary (``--json``: the summary object)."""

from __future__ import annotations

import json
import socket

import h5py
import numpy as np
import pytest

from psgdlab.cli import main
from psgdlab.tests.runtime._runtime_helpers import needs_topology, train_fails

_fails = train_fails


@needs_topology
def test_odd_workers_for_a_matching_scheme(capsys, tmp_path):
    _fails(capsys, ["--algorithm", "adpsgd", "--workers", "3", "--out", str(tmp_path)], r"workers \(3\) must be even")


def test_workers_not_divisible_by_gpus_per_node(capsys, tmp_path):
    _fails(
        capsys,
        ["--algorithm", "hadpsgd", "--workers", "4", "--workers-per-node", "3", "--out", str(tmp_path)],
        r"workers \(4\) must be divisible by gpus_per_node \(3\)",
    )


def test_nccl_without_cuda(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _fails(capsys, ["--backend", "nccl", "--out", str(tmp_path)], r"nccl.*needs CUDA")


def test_nccl_with_more_ranks_than_gpus_is_refused_before_anything_starts(capsys, tmp_path, monkeypatch):
    """NCCL refuses two ranks on one GPU at its initialisation ("Duplicate GPU detected", seen on
    one H200): the launcher says so first, counting the parameter server's rank."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    out = tmp_path / "run"
    _fails(
        capsys,
        ["--backend", "nccl", "--workers", "2", "--out", str(out)],
        r"workers \(2\) need 2 GPUs on this machine with --backend nccl \(one per worker\), which has 1; use fewer",
    )
    _fails(
        capsys,
        ["--backend", "nccl", "--algorithm", "asgd", "--workers", "1", "--out", str(out)],
        r"workers \(1\) need 2 GPUs .*one per worker and the parameter server\), which has 1",
    )
    assert not out.exists()


def test_an_nccl_rank_without_a_gpu_of_its_own_is_refused(monkeypatch):
    """Under torchrun or mpiexec, a local rank beyond the host's GPUs (which used to share GPU
    ``local_rank`` modulo the count, and then fail in NCCL's initialisation)."""
    import torch

    from psgdlab.core.errors import ConfigError
    from psgdlab.runtime.transports.channels import rank_device
    from psgdlab.runtime.transports.env import launch_env

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    env = launch_env({"RANK": "5", "WORLD_SIZE": "6", "LOCAL_RANK": "2"})
    with pytest.raises(
        ConfigError, match=r"local rank \(2\) of rank 5 has no GPU of its own on this host, which has 2;"
    ):
        rank_device("nccl", env)
    second = launch_env({"RANK": "1", "WORLD_SIZE": "6", "LOCAL_RANK": "1"})
    assert rank_device("nccl", second) == torch.device("cuda", 1)
    assert rank_device("gloo", env) == torch.device("cpu") == rank_device("mpi", env)


def test_missing_hdf5_file(capsys, tmp_path):
    _fails(capsys, ["--data", str(tmp_path / "nope.h5"), "--out", str(tmp_path)], r"not found: .*nope\.h5")


def test_malformed_hdf5_names_the_missing_dataset(capsys, tmp_path):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f["features"] = np.zeros((4, 3), dtype=np.float32)
    _fails(capsys, ["--data", str(path), "--out", str(tmp_path)], r"dataset 'offsets' is missing")


def test_unknown_model(capsys, tmp_path):
    _fails(
        capsys,
        ["--model", "blstn", "--out", str(tmp_path)],
        r"model \('blstn'\) is not known .*; did you mean 'blstm'\?",
    )


def test_flag_that_does_not_apply_to_the_algorithm(capsys, tmp_path):
    _fails(capsys, ["--algorithm", "ssgd", "--period", "3", "--out", str(tmp_path)], r"--period \(3\) does not apply")


def test_least_squares_data_beyond_the_machines_memory_is_refused_before_anything_starts(capsys, tmp_path, monkeypatch):
    """Every rank builds all workers' rows: 8 ranks of 8 x 256 rows of 250 000 float64 columns need
    33 GB; with 10 GB available the run stops at once, one line, nothing written."""
    from psgdlab.runtime.launcher import launch

    monkeypatch.setattr(launch, "available_memory_bytes", lambda: 10 * 10**9)
    out = tmp_path / "run"
    argv = ["--model", "least-squares", "--workers", "8", "--lsq-dim", "250000", "--out", str(out)]
    _fails(capsys, argv, r"least-squares data of 4\.1 GB per rank .* 32\.8 GB, more than the 10 GB available")
    assert not out.exists()


def test_bad_straggler_and_compute_time(capsys, tmp_path):
    _fails(capsys, ["--straggler", "9:2", "--workers", "2", "--out", str(tmp_path)], r"straggler rank \(9\)")
    _fails(capsys, ["--compute-time", "fast", "--out", str(tmp_path)], r"compute time 'fast'")


def test_newbob_is_refused_not_run_as_a_constant_rate(capsys, tmp_path):
    _fails(
        capsys,
        ["--lr-schedule", "newbob", "--out", str(tmp_path)],
        r"lr-schedule \('newbob'\) needs every worker to agree on a held-out loss.*use const, ibm or exp",
    )


def test_continue_after_a_failure_needs_a_gossip_algorithm(capsys, tmp_path):
    _fails(
        capsys,
        ["--algorithm", "bmuf", "--on-failure", "continue", "--out", str(tmp_path)],
        r"on-failure \('continue'\) needs a gossip algorithm \(.*adpsgd.*\), not bmuf; use stop or restart",
    )


def test_negative_max_restarts_is_refused(capsys, tmp_path):
    _fails(capsys, ["--max-restarts", "-1", "--out", str(tmp_path)], r"max-restarts \(-1\) must be an integer >= 0")


def test_resume_without_a_run_directory(capsys, tmp_path):
    _fails(capsys, ["--resume", str(tmp_path / "none")], r"has no config.resolved.json")


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_resume_refuses_a_flag_that_would_change_the_run(capsys, tmp_path):
    """--resume continues the run as it was configured: another --workers (or --algorithm, or any
    flag but the run's length and deadline) is refused in one line naming it and the run's value;
    the run's own value, --steps and --timeout are taken."""
    import argparse

    from psgdlab.runtime.config import TrainConfig

    saved = TrainConfig(algorithm="ssgd", workers=2, gpus_per_node=1, model="least-squares", steps=4, out=str(tmp_path))
    (tmp_path / "config.resolved.json").write_text(json.dumps({"train": saved.to_json()}))
    _fails(capsys, ["--resume", str(tmp_path), "--workers", "4"], r"--workers \(4\) cannot change the run .*has 2\)")
    _fails(capsys, ["--resume", str(tmp_path), "--algorithm", "adpsgd"], r"--algorithm \(adpsgd\) cannot change")
    parser = argparse.ArgumentParser()
    TrainConfig.add_arguments(parser, launcher=True)
    _fails(capsys, ["--resume", str(tmp_path), "--workers-per-node", "2"], r"--workers-per-node \(2\) cannot change")
    args = parser.parse_args(
        ["--resume", str(tmp_path), "--workers", "2", "--workers-per-node", "1", "--steps", "9", "--timeout", "30"]
    )
    resumed = TrainConfig.from_args(args)
    assert (resumed.workers, resumed.steps, resumed.resume) == (2, 9, True)


def test_train_prints_the_summary_as_json(capsys, tmp_path):
    out = tmp_path / "run"
    status = main(
        [
            "train",
            "--algorithm",
            "ssgd",
            "--workers",
            "2",
            "--model",
            "tiny-blstm",
            "--steps",
            "6",
            "--batch",
            "8",
            "--out",
            str(out),
            "--json",
            "--held-out-speakers",
            "spk03",
        ]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    for key in (
        "samples_per_s",
        "step_time_s",
        "staleness_mean",
        "loss_first",
        "loss_last",
        "loss_curve",
        "comm_fraction",
        "idle_fraction",
    ):
        assert key in summary
    for name in ("config.resolved.json", "env.json", "trace.npz", "summary.json", "timeline.json", "loss.png"):
        assert (out / name).is_file(), name
    assert summary["workers"] == 2 and summary["steps"] == 12
    # real compute on a module, gloo: one gradient allreduce after the backward pass by default;
    # with the bucketed overlap asked for, the allreduce rides on the backward pass (an overlap
    # record with the bytes per step and rank) and the run ends on the same weights
    from psgdlab.core.exchange import ExchangeKind
    from psgdlab.core.records.trace import PHASES, read_trace
    from psgdlab.runtime.config import TrainConfig
    from psgdlab.runtime.launcher.launch import launch
    from psgdlab.runtime.loop.driver import OVERLAP_ENV

    trace, _ = read_trace(out / "trace.npz")
    assert not np.any((trace["kind"] == ExchangeKind.ALLREDUCE) & (trace["phase"] == PHASES["overlap"]))
    assert (
        np.count_nonzero(
            (trace["kind"] == ExchangeKind.ALLREDUCE) & (trace["phase"] == PHASES["comm"]) & (trace["nbytes"] > 0)
        )
        == 12
    )
    overlap = TrainConfig.load(out / "launch.json").replace(out=str(tmp_path / "overlap"))
    launch(overlap, quiet=True, timeout_s=90, extra_env={OVERLAP_ENV: "1"})
    trace, _ = read_trace(tmp_path / "overlap" / "trace.npz")
    overlapped = trace[(trace["kind"] == ExchangeKind.ALLREDUCE) & (trace["phase"] == PHASES["overlap"])]
    assert (
        overlapped.size == 12
        and np.all(overlapped["nbytes"] == overlapped["nbytes"][0])
        and overlapped["nbytes"][0] > 0
    )
    np.testing.assert_allclose(
        np.load(tmp_path / "overlap" / "final_params.npz")["params"],
        np.load(out / "final_params.npz")["params"],
        rtol=0,
        atol=1e-6,
    )


def test_the_held_out_line_reads_as_figures():
    from psgdlab.commands.train import _held_out_line

    last = {
        "wer": 0.176,
        "wer_by_speaker": {"theo": 0.122, "george": 0.23},
        "frame_accuracy": 0.5858,
        "loss": 1.69,
        "step": 640,
    }
    assert (
        _held_out_line(last) == "WER 17.6 % (george 23.0 %, theo 12.2 %), frame accuracy 0.586, loss 1.69 at step 640"
    )


def test_the_rendezvous_port_stays_bound_from_its_choice_to_rank_0s_store():
    """The launcher binds the store's port and rank 0 inherits the listening socket: no other
    process can take the port in between (with a port that was only free a moment ago, a run
    starting beside another one failed in rank 0's set-up: the port was taken while it imported
    torch)."""
    from psgdlab.runtime.launcher.ranks import rendezvous_socket, store_environment
    from psgdlab.runtime.transports.env import STORE_FD_ENV

    with rendezvous_socket() as sock:
        port = sock.getsockname()[1]
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        env = store_environment(sock)
        assert env == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), STORE_FD_ENV: str(sock.fileno())}
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # it listens: early clients queue
            pass


def test_more_ranks_than_one_machine_runs_are_refused_before_anything_starts(capsys, tmp_path):
    """``--workers 10000000`` started one process per rank until the machine gave out (issue 45)."""
    out = tmp_path / "run"
    _fails(
        capsys,
        ["--model", "least-squares", "--workers", "10000000", "--out", str(out)],
        r"workers \(10000000\) must be at most 512 ranks on one machine .* every rank is a process of its own",
    )
    assert not out.exists()


def test_ranks_beyond_the_machines_memory_are_refused_with_what_a_rank_holds(capsys, tmp_path, monkeypatch):
    """The memory of a rank of a torch model: the interpreter, the model (its parameters counted on
    torch's meta device, nothing allocated) times its copies, the data."""
    from psgdlab.runtime.config import TrainConfig
    from psgdlab.runtime.launcher import launch

    per_rank, _ = launch.rank_memory_bytes(TrainConfig(model="blstm-small", workers=2, steps=10))
    monkeypatch.setattr(launch, "available_memory_bytes", lambda: int(per_rank * 3.5))
    out = tmp_path / "run"
    _fails(
        capsys,
        ["--model", "blstm-small", "--workers", "4", "--out", str(out)],
        r"workers \(4\): 4 ranks of about \d+ MB each \(\d+ MB of interpreter, [\d.]+ MB for \d+ parameters x 5 "
        r"copies, 0 MB of data\) need [\d.]+ GB, more than the [\d.]+ GB this machine has available",
    )
    assert not out.exists()


def test_sigint_while_the_ranks_start_stops_the_starting_and_the_ranks_started(tmp_path, monkeypatch):
    """SIGINT did not stop the spawn loop: the launcher forwarded it to the ranks started so far
    and went on starting the others. Here the second start brings a SIGINT: no third rank starts,
    the two started are stopped, and the interruption says so (exit status 130, as Ctrl-C of a
    running run)."""
    import os
    import signal
    import subprocess
    import sys

    from psgdlab.core.errors import RunInterrupted
    from psgdlab.runtime.launcher import launch, ranks
    from psgdlab.tests.runtime._runtime_helpers import lsq_config

    real = subprocess.Popen
    started: list[subprocess.Popen] = []

    def popen(cmd, **kwargs):  # a rank that only sleeps; the second start is interrupted
        kwargs.pop("pass_fds", None)
        proc = real([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs)
        started.append(proc)
        if len(started) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return proc

    monkeypatch.setattr(ranks.subprocess, "Popen", popen)
    with pytest.raises(
        RunInterrupted, match=r"Ctrl-C \(SIGINT\) while its ranks were starting: 2 of 6 had started, and were stopped"
    ) as stopped:
        launch.launch(lsq_config(tmp_path, "ssgd", 6), quiet=True)
    assert stopped.value.exit_status == 130
    assert len(started) == 2 and all(p.poll() is not None for p in started)


def test_a_loss_that_becomes_non_finite_stops_the_run_saying_at_which_step_and_rank(capfd, tmp_path):
    """A diverged run trained on to an inf loss and exited 0 (issue 45): it stops at the first
    non-finite loss, exit 1, the launcher's line naming the rank, its error and the step; nothing
    is committed."""
    import re

    out = tmp_path / "run"
    argv = ["train", "--model", "least-squares", "--lr", "1000", "--steps", "400", "--workers", "2", "--out", str(out)]
    assert main(argv) == 1
    lines = capfd.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in lines)
    assert re.match(
        r"psgdlab: error: run failed: rank (\d) exited with status 1 \(rank \1: the loss became non-finite \(inf\) "
        r"at step (\d+): the run diverged",
        lines[-1],
    ), lines[-1]
    assert not (out / "complete.json").exists()
