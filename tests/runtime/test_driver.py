"""The runtime driver against the core reference executor, on gloo and on MPI.

Synchronous algorithms must reproduce the oracle's float64 trajectory step by step (within
``TRAJECTORY_ATOL``); asynchronous ones must train, record staleness > 0 and never deadlock;
H-ADPSGD must keep the replicas of a node bit-identical.
"""

from __future__ import annotations

import json
import os
import time
import warnings

import numpy as np
import pytest

from psgdlab.core.errors import RunInterrupted, TransportError
from psgdlab.core.exchange import ExchangeKind
from psgdlab.core.records.trace import PHASES, read_trace
from psgdlab.tests.runtime._runtime_helpers import (
    TRAJECTORY_ATOL,
    initial_full_loss,
    leftover_segments,
    lsq_config,
    needs_topology,
    reference_for,
    trajectory,
)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

SYNC_CASES = [
    pytest.param("ssgd", 2, {}, id="ssgd"),
    pytest.param("bsp", 2, {"period": 3}, id="bsp"),
    pytest.param("bmuf", 2, {"period": 4}, id="bmuf"),
    pytest.param("easgd", 2, {"period": 2, "variant": "sync"}, id="easgd-sync"),
    pytest.param("dpsgd", 4, {}, id="dpsgd", marks=needs_topology),
    pytest.param("hadpsgd", 2, {"gpus_per_node": 2}, id="hadpsgd-1node", marks=needs_topology),
]


def _launch(config, **kw):
    from psgdlab.runtime.launcher.launch import launch

    return launch(config, quiet=True, timeout_s=90, **kw)


@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
@pytest.mark.parametrize(("algorithm", "workers", "params"), SYNC_CASES)
def test_synchronous_algorithms_follow_the_reference_trajectory(tmp_path, backend, algorithm, workers, params):
    config = lsq_config(tmp_path, algorithm, workers, backend=backend, **params)
    summary = _launch(config)
    expected = reference_for(config)
    got = trajectory(config)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=TRAJECTORY_ATOL)
    assert not leftover_segments(config.out)  # gloo: the shared-memory segments were unlinked at setup
    assert summary["staleness_max"] == (1 if algorithm == "dpsgd" else 0)
    assert summary["steps"] == workers * config.steps
    assert summary["membership_changes"] == [] and summary["survivors"] == list(range(workers))
    assert not (tmp_path / f"{algorithm}-{backend}" / "flight").exists()  # records only after a failure


@needs_topology
@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_hadpsgd_keeps_node_replicas_identical_and_averages_between_nodes(tmp_path, backend):
    # the protocol of stop (continue's, which sums the slices with the gradient: tests/runtime/test_continue.py)
    config = lsq_config(tmp_path, "hadpsgd", 4, backend=backend, gpus_per_node=2, steps=16, on_failure="stop")
    summary = _launch(config)
    traj = trajectory(config)  # (steps, workers, dim)
    assert np.array_equal(traj[:, 0], traj[:, 1]) and np.array_equal(traj[:, 2], traj[:, 3])
    assert summary["staleness_max"] >= 1  # inter-node merges are foreign merges
    # the full-data loss of the mean model (the last minibatch loss alone is too noisy to compare)
    assert summary["mean_model_full_loss"] < 0.5 * initial_full_loss(config)
    trace, meta = read_trace(tmp_path / f"hadpsgd-{backend}" / "trace.npz")
    # the allreduce schedule, for calibrate: gloo's goes through the shared-memory plane on one host
    shm = os.environ.get("PSGDLAB_SHM", "auto") != "0"
    assert meta["allreduce_algorithm"] == {"gloo": "direct" if shm else "ring", "mpi": "halving-doubling"}[backend]
    pair = trace[(trace["kind"] == ExchangeKind.PAIRWISE) & (trace["phase"] == PHASES["overlap"])]
    assert pair.size and set(np.unique(pair["nbytes"])) == {8 * 8 // 2}  # half the model per worker
    # each step the node agrees on the sharded passive merges: a barrier record (the simulator prices it)
    agree = trace[(trace["kind"] == ExchangeKind.BARRIER) & (trace["phase"] == PHASES["comm"])]
    # (on the fixed ring of 2 nodes one node answers every request: only its members agree)
    assert agree.size == 2 * 16 and set(agree["rank"].tolist()) in ({0, 1}, {2, 3}) and np.all(agree["nbytes"] == 0)


ASYNC_CASES = [
    pytest.param("asgd", 3, {}, id="asgd"),
    pytest.param("easgd", 3, {"period": 2}, id="easgd-async"),
    pytest.param("adpsgd", 4, {"variant": "fixed"}, id="adpsgd-fixed", marks=needs_topology),
    pytest.param("adpsgd", 4, {"variant": "random"}, id="adpsgd-random", marks=needs_topology),
    pytest.param("adpsgd", 4, {"variant": "delay"}, id="adpsgd-delay", marks=needs_topology),
]


@pytest.mark.parametrize(("algorithm", "workers", "params"), ASYNC_CASES)
def test_asynchronous_algorithms_train_with_staleness(tmp_path, algorithm, workers, params):
    config = lsq_config(tmp_path, algorithm, workers, steps=30, compute_time="0.002", **params)
    summary = _launch(config)
    assert summary["mean_model_full_loss"] < 0.5 * initial_full_loss(config)
    assert summary["staleness_max"] > 0 and summary["staleness_mean"] > 0
    assert summary["staleness_unit"] == "updates"
    if algorithm in ("asgd", "easgd"):
        assert summary["server"]["rank"] == workers
        assert summary["server"]["requests"] == workers * (config.steps // (params.get("period") or 1))


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("algorithm", "workers", "params"),
    [
        pytest.param("asgd", 3, {}, id="asgd"),
        pytest.param("adpsgd", 4, {"variant": "random"}, id="adpsgd-random", marks=needs_topology),
    ],
)
def test_asynchronous_algorithms_on_mpi(tmp_path, algorithm, workers, params):
    config = lsq_config(tmp_path, algorithm, workers, backend="mpi", steps=30, compute_time="0.002", **params)
    summary = _launch(config)
    assert summary["mean_model_full_loss"] < 0.5 * initial_full_loss(config)
    assert summary["staleness_max"] > 0


@needs_topology
@pytest.mark.parametrize("repeat", range(2))
def test_gossip_never_deadlocks_under_random_delays(tmp_path, repeat):
    """Random exchange delays (0-10 ms) and an uneven straggler: the active/passive split must
    still let every rank finish (a hang fails on the launcher's time limit)."""
    config = lsq_config(
        tmp_path,
        "adpsgd",
        4,
        steps=25,
        variant="random",
        seed=repeat,
        compute_time="0.001",
        straggler=f"{repeat % 4}:4",
        name=f"jitter{repeat}",
    )
    start = time.monotonic()
    summary = _launch(config, extra_env={"PSGDLAB_TEST_JITTER": "0.01"})
    assert time.monotonic() - start < 60
    assert summary["steps"] == 4 * 25


def test_checkpoint_and_resume_matches_an_uninterrupted_run(tmp_path):
    full = lsq_config(tmp_path, "bmuf", 2, steps=16, period=3, name="full")
    _launch(full)
    half = lsq_config(tmp_path, "bmuf", 2, steps=8, period=3, name="resumed", checkpoint_every=4)
    _launch(half)
    assert (tmp_path / "resumed" / "checkpoints" / "step00000008" / "rank1.pt").is_file()
    resumed = half.replace(steps=16, resume=True)
    summary = _launch(resumed)
    a = np.load(tmp_path / "full" / "final_params.npz")["params"]
    b = np.load(tmp_path / "resumed" / "final_params.npz")["params"]
    assert np.array_equal(a, b)
    np.testing.assert_array_equal(trajectory(resumed)[-1], trajectory(full)[-1])
    assert summary["steps"] == 2 * 16  # the first part's trace is kept
    assert json.loads((tmp_path / "resumed" / "config.resolved.json").read_text())["steps"] == 16


@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_a_killed_worker_stops_the_run_naming_the_rank(tmp_path, backend):
    from pathlib import Path

    config = lsq_config(tmp_path, "ssgd", 2, steps=100000, backend=backend, compute_time="0.001")
    mpich_before = set(Path("/dev/shm").glob("mpich_shm_*"))
    start = time.monotonic()
    with pytest.raises(TransportError, match=r"rank 1 (was killed by signal SIGKILL|died)"):
        _launch(config, extra_env={"PSGDLAB_TEST_CRASH": "1:5"})
    assert time.monotonic() - start < 60
    failure = json.loads((Path(config.out) / "failure.json").read_text())
    assert failure["membership_changes"][0]["removed"] == [1] and failure["survivors"] == [0]
    assert not leftover_segments(config.out)
    assert set(Path("/dev/shm").glob("mpich_shm_*")) <= mpich_before  # MPICH's own, of the killed rank


def test_emulated_compute_shorter_than_the_real_compute_warns_once_on_rank_0():
    """A model slower than --compute-time cannot be slowed to it: rank 0 says so, once; every
    rank counts the steps (the summary's compute_time_overrun_steps)."""
    import types

    import torch

    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.core.errors import TestbedWarning
    from psgdlab.core.platform.timing import ComputeTime
    from psgdlab.core.reference import LeastSquaresProblem
    from psgdlab.runtime.loop.driver import DriverOptions, _Worker
    from psgdlab.runtime.loop.workloads import LeastSquaresWorkload

    class Slow(LeastSquaresWorkload):
        def gradient(self, weights, rank, step):
            time.sleep(0.01)
            return super().gradient(weights, rank, step)

    workload = Slow(LeastSquaresProblem(n_samples=16, dim=3, n_shards=2, batch=4))
    channel = types.SimpleNamespace(device=torch.device("cpu"))
    options = DriverOptions(steps=4, lr_of=lambda s: 0.1, compute_time=ComputeTime.parse("0.001"))
    w0, w1 = (
        _Worker(
            make_algorithm("ssgd", n_workers=2),
            workload,
            dict.fromkeys(("main", "comm", "responder"), channel),
            rank=r,
            options=options,
            origin=0.0,
            state=None,
            merges=0,
        )
        for r in (0, 1)
    )
    x = workload.initial_params()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w0._compute(x, 0)  # the first step is warm-up: no warning
    with pytest.warns(TestbedWarning, match=r"--compute-time is not honoured: step 1 .* longer than the emulated"):
        w0._compute(x, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w0._compute(x, 2)
        w1._compute(x, 1)
    assert (w0.overruns, w1.overruns) == (2, 1)


def test_sigterm_checkpoints_and_resume_finishes_on_the_reference_trajectory(tmp_path):
    """SIGTERM to ``psgdlab train`` (a scheduler's preemption) reaches every rank; the synchronous
    ranks agree to stop at their next check (every STOP_CHECK_EVERY steps) and checkpoint there;
    the error names the signal; ``--resume`` finishes the run exactly on the oracle's trajectory.
    Periodic checkpoints every 7 steps tell the two apart. (SIGINT, and asynchronous runs:
    test_interrupt.py.)"""
    import os
    import signal
    import threading

    from psgdlab.runtime.loop.checkpoint import latest_complete_step
    from psgdlab.runtime.loop.driver import STOP_CHECK_EVERY

    config = lsq_config(tmp_path, "ssgd", 2, steps=70, compute_time="0.02", checkpoint_every=7, name="term")
    first = tmp_path / "term" / "checkpoints" / "step00000007" / "rank1.pt"

    def terminate_once_training() -> None:
        deadline = time.monotonic() + 60
        while not first.is_file() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher forwards it to every rank

    threading.Thread(target=terminate_once_training, daemon=True).start()
    with pytest.raises(RunInterrupted, match=r"^run interrupted by SIGTERM at step \d+, .*--resume") as caught:
        _launch(config)
    assert caught.value.exit_status == 128 + signal.SIGTERM  # what psgdlab train exits with
    stopped = latest_complete_step(tmp_path / "term", 2)
    assert stopped is not None and stopped % STOP_CHECK_EVERY == 0 and stopped % 7 != 0, stopped
    summary = _launch(config.replace(resume=True))
    assert summary["steps"] == 2 * 70
    np.testing.assert_allclose(trajectory(config)[-1], reference_for(config)[-1], rtol=0, atol=TRAJECTORY_ATOL)


def test_every_exchange_kind_of_core_has_one_runtime_handler_in_both_protocols():
    """The driver dispatches through one table keyed by the exchange record's class, to a method
    both exchange protocols have."""
    from psgdlab.core.exchange import EXCHANGE_KINDS
    from psgdlab.runtime.loop.driver import EXCHANGE_HANDLERS
    from psgdlab.runtime.loop.exchange.normal import NormalProtocol
    from psgdlab.runtime.loop.exchange.surviving import SurvivingProtocol

    assert set(EXCHANGE_HANDLERS) == set(EXCHANGE_KINDS)
    for protocol in (NormalProtocol, SurvivingProtocol):
        assert all(callable(getattr(protocol, name)) for name in EXCHANGE_HANDLERS.values())
        assert not protocol.__abstractmethods__


def test_an_exchange_without_a_handler_is_refused_by_name():
    import types

    import torch

    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.core.errors import ConfigError
    from psgdlab.core.reference import LeastSquaresProblem
    from psgdlab.runtime.loop.driver import DriverOptions, _Worker
    from psgdlab.runtime.loop.exchange.protocol import Step
    from psgdlab.runtime.loop.workloads import LeastSquaresWorkload

    class Teleport:
        phase = "post"

    workload = LeastSquaresWorkload(LeastSquaresProblem(n_samples=8, dim=2, n_shards=1, batch=2))
    channel = types.SimpleNamespace(device=torch.device("cpu"))
    channels = dict.fromkeys(("main", "comm", "responder"), channel)
    worker = _Worker(
        make_algorithm("sgd", n_workers=1),
        workload,
        channels,
        rank=0,
        options=DriverOptions(steps=1, lr_of=lambda s: 0.1),
        origin=0.0,
        state=None,
        merges=0,
    )
    step = Step(step=0, snapshot=workload.initial_params())
    worker._phase("mix", (Teleport(),), step)  # another phase: not looked up
    with pytest.raises(ConfigError, match=r"exchange Teleport has no handler in the runtime"):
        worker._phase("post", (Teleport(),), step)
