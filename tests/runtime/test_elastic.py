"""``--on-failure restart`` (torchrun's elastic agent, :mod:`psgdlab.runtime.launcher.elastic`) and the
checkpoints it resumes from (:mod:`psgdlab.runtime.loop.checkpoint`).

A synchronous run whose rank is killed mid-run and restarted ends bit-identical to one never
interrupted; restarts run out with an error naming the rank; a corrupted newest checkpoint falls
back to the previous complete one; a checkpoint that cannot be written leaves the previous intact
and the run says so.
"""

from __future__ import annotations

import errno
import glob
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from psgdlab.core.errors import ConfigError, TestbedWarning, TransportError
from psgdlab.runtime.loop import checkpoint as ckpt
from psgdlab.tests.runtime._runtime_helpers import lsq_config, train_fails


def _launch(config, **kw):
    from psgdlab.runtime.launcher.launch import launch

    return launch(config, quiet=True, timeout_s=90, **kw)


def _segments_of(run_dir: Path) -> list[str]:
    """What any worker the agent ever started left in ``/dev/shm``."""
    from psgdlab.runtime.launcher.elastic import PIDS_FILE
    from psgdlab.runtime.transports.shm.shm import segment_prefix

    pids = [int(line.split()[0]) for line in (run_dir / ".ranks" / PIDS_FILE).read_text().splitlines()]
    assert len(pids) >= 4, pids  # two attempts of two workers
    return [name for pid in pids for name in glob.glob(f"/dev/shm/{segment_prefix(pid)}*")]


@pytest.mark.parametrize(
    ("algorithm", "params", "crash", "reached"),
    [
        # the survivor blocks in step 6's gradient allreduce: 6 steps done
        pytest.param("ssgd", {}, "1:6", 6, id="ssgd-rank1"),
        # rank 0 dies at step 7; rank 1 trains on alone to the model allreduce ending step 8 (done: 8)
        pytest.param("bmuf", {"period": 3}, "0:7", 8, id="bmuf-rank0"),
    ],
)
@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_rank_killed_and_restarted_ends_bit_identical_to_an_uninterrupted_run(
    tmp_path, algorithm, params, crash, reached
):
    steps, every = 12, 4
    plain = lsq_config(tmp_path, algorithm, 2, steps=steps, name="plain", checkpoint_every=every, **params)
    _launch(plain)
    config = plain.replace(out=str(tmp_path / "restarted"), on_failure="restart", max_restarts=2)
    summary = _launch(config, extra_env={"PSGDLAB_TEST_CRASH": crash})
    a = np.load(tmp_path / "plain" / "final_params.npz")["params"]
    b = np.load(tmp_path / "restarted" / "final_params.npz")["params"]
    np.testing.assert_array_equal(b, a)
    rank, step = map(int, crash.split(":"))
    (restart,) = summary["restarts"]
    assert restart["rank"] == rank and restart["cause"] == "was killed by signal SIGKILL"
    assert restart["attempt"] == 1
    assert restart["resumed_from_step"] == step // every * every
    assert restart["steps_lost"] == reached - restart["resumed_from_step"]  # by the furthest rank
    assert 0 < restart["time_s"] and 0 < restart["time_to_first_step_s"] < 60
    assert summary["steps"] == 2 * (steps - restart["resumed_from_step"])  # the failed attempt's trace is lost
    assert json.loads((tmp_path / "restarted" / "summary.json").read_text())["restarts"] == summary["restarts"]
    assert not _segments_of(tmp_path / "restarted")
    if algorithm == "ssgd":  # then a rank's newest file is corrupt: every rank falls back together
        newest = ckpt.checkpoint_root(config.out) / f"step{steps:08d}" / "rank1.pt"
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0x01
        newest.write_bytes(bytes(data))
        _launch(config.replace(resume=True))
        resumed = np.load(tmp_path / "restarted" / "final_params.npz")["params"]
        np.testing.assert_array_equal(resumed, a)  # steps 8 to 11 redone from step 8's checkpoint


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_restarts_run_out_with_an_error_naming_the_rank(tmp_path):
    config = lsq_config(tmp_path, "ssgd", 2, steps=12, checkpoint_every=2, on_failure="restart", max_restarts=1)
    with pytest.raises(
        TransportError,
        match=r"rank 1 was killed by signal SIGKILL.*after 1 restart \(--max-restarts 1\); the newest complete "
        r"checkpoint is step 2 \(continue with --resume .*\)",
    ):
        _launch(config, extra_env={"PSGDLAB_TEST_CRASH": "1:3:5"})  # crashes in the first five attempts
    lines = (Path(config.out) / ".ranks" / "restarts.jsonl").read_text().splitlines()
    assert [json.loads(line)["restarted"] for line in lines] == [True, False]
    assert not _segments_of(Path(config.out))


def test_restart_is_refused_on_mpi_and_on_emulated_hosts(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"on-failure \('restart'\) needs --backend gloo or nccl.*not MPI ranks"):
        lsq_config(tmp_path, "ssgd", 2, backend="mpi", on_failure="restart")
    common = ["--algorithm", "ssgd", "--workers", "2", "--model", "least-squares", "--steps", "2"]
    train_fails(capsys, [*common, "--backend", "mpi", "--on-failure", "restart"], r"needs --backend gloo or nccl")
    train_fails(capsys, [*common, "--hosts", "2", "--on-failure", "restart"], r"does not run on emulated hosts")


# ----- checkpoints ----------------------------------------------------------------------------------
RUN = "0123456789abc"


def _payload(value: float) -> dict:
    return {"params": torch.full((4,), value, dtype=torch.float64), "step": value}


def test_a_corrupted_or_truncated_checkpoint_is_detected(tmp_path):
    path = ckpt.save_checkpoint(tmp_path, step=4, rank=0, payload=_payload(1.0), run_id=RUN, n_ranks=1)
    assert ckpt.load_checkpoint(tmp_path, step=4, rank=0, run_id=RUN)["step"] == 1.0
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match=r"rank0\.pt is corrupt: its SHA-256 does not match"):
        ckpt.load_checkpoint(tmp_path, step=4, rank=0, run_id=RUN)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ckpt.CheckpointError, match=r"rank0\.pt is not a psgdlab checkpoint"):
        ckpt.load_checkpoint(tmp_path, step=4, rank=0, run_id=RUN)


class _Planted:
    """A pickle that runs code when it is loaded (what a hostile checkpoint holds)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_a_planted_pickle_in_a_checkpoint_runs_nothing(tmp_path):
    """The digest proves nothing (the planter writes it too): the load itself must run no code."""
    import hashlib
    import io

    marker = tmp_path / "ran"
    for obj in (_Planted(marker), {"params": torch.zeros(2), "run_id": RUN, "hook": _Planted(marker)}):
        buf = io.BytesIO()
        torch.save(obj, buf)
        body = buf.getvalue()
        path = ckpt.checkpoint_root(tmp_path) / "step00000004" / "rank0.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(ckpt.MAGIC + hashlib.sha256(body).digest() + body)
        with pytest.raises(ckpt.CheckpointError, match=r"rank0\.pt is unreadable \(UnpicklingError"):
            ckpt.load_checkpoint(tmp_path, step=4, rank=0, run_id=RUN)
        assert not marker.exists()


def test_a_checkpoint_of_another_run_or_world_size_is_refused(tmp_path):
    alg = {"algorithm": "adpsgd", "n_workers": 2, "variant": "fixed"}
    ckpt.write_run_record(tmp_path, run_id=RUN, workers=2, world_size=2, algorithm=alg)
    assert ckpt.check_run_record(tmp_path, workers=2, world_size=2, algorithm=dict(alg)) == RUN
    with pytest.raises(ConfigError, match=r"belong to a run of 2 workers \(2 ranks\), not 4 \(4 ranks\)"):
        ckpt.check_run_record(tmp_path, workers=4, world_size=4, algorithm=alg)
    with pytest.raises(ConfigError, match=r"resume with the same algorithm flags"):
        ckpt.check_run_record(tmp_path, workers=2, world_size=2, algorithm={**alg, "variant": "random"})
    ckpt.save_checkpoint(tmp_path, step=4, rank=0, payload=_payload(4.0), run_id="another", n_ranks=1)
    with pytest.raises(ckpt.CheckpointError, match=r"belongs to run 'another', not to run '0123456789abc'"):
        ckpt.load_checkpoint(tmp_path, step=4, rank=0, run_id=RUN)
    (ckpt.checkpoint_root(tmp_path) / ckpt.RUN_RECORD).unlink()
    with pytest.raises(ConfigError, match=r"run\.json is missing"):
        ckpt.check_run_record(tmp_path, workers=2, world_size=2, algorithm=alg)


class _OneRank:
    """The main channel of a one-rank world (what :func:`_agree_on_checkpoint` uses)."""

    rank, world_size, device = 0, 1, torch.device("cpu")

    def gather_object(self, obj, root=0):
        return [obj]

    def broadcast(self, tensor, src, group):
        pass


def test_a_corrupted_newest_checkpoint_falls_back_to_the_previous_complete_one(tmp_path, capsys):
    from psgdlab.runtime.train import _agree_on_checkpoint

    for step in (4, 8):
        ckpt.save_checkpoint(tmp_path, step=step, rank=0, payload=_payload(float(step)), run_id=RUN, n_ranks=1)
    newest = ckpt.checkpoint_root(tmp_path) / "step00000008" / "rank0.pt"
    newest.write_bytes(newest.read_bytes()[:-100])  # a truncated write
    step, payload = _agree_on_checkpoint(_OneRank(), tmp_path, workers=1, run_id=RUN)
    assert step == 4 and payload is not None and payload["step"] == 4.0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "checkpoint of step 8 is unusable" in err and "falling back to the previous complete checkpoint" in err
    (ckpt.checkpoint_root(tmp_path) / "step00000004" / "rank0.pt").write_bytes(b"")
    assert _agree_on_checkpoint(_OneRank(), tmp_path, workers=1, run_id=RUN) == (0, None)  # none left: from the start


def test_keep_counts_complete_checkpoints_so_a_rank_running_ahead_keeps_the_last_complete_one(tmp_path):
    """Rank 0 writes steps 5, 6, 7 after rank 1 died past step 4: step 4 (complete) must stay."""
    for step in (2, 4):
        for rank in (0, 1):
            ckpt.save_checkpoint(tmp_path, step=step, rank=rank, payload=_payload(step), run_id=RUN, n_ranks=2)
    for step in (5, 6, 7):
        ckpt.save_checkpoint(tmp_path, step=step, rank=0, payload=_payload(step), run_id=RUN, n_ranks=2)
    assert ckpt.complete_steps(tmp_path, 2) == [4, 2]
    ckpt.save_checkpoint(tmp_path, step=6, rank=1, payload=_payload(6), run_id=RUN, n_ranks=2)
    assert ckpt.complete_steps(tmp_path, 2) == [6, 4]  # rank 1's step 2 went once two newer were complete
    assert not (ckpt.checkpoint_root(tmp_path) / "step00000002" / "rank1.pt").exists()


def test_a_checkpoint_that_cannot_be_written_leaves_the_previous_one_intact(tmp_path, monkeypatch):
    import os

    ckpt.save_checkpoint(tmp_path, step=4, rank=0, payload=_payload(4.0), run_id=RUN, n_ranks=1)

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # the data is written, the disk fills
    with pytest.raises(
        ckpt.CheckpointError,
        match=r"rank 0: the checkpoint of step 8 could not be written \(No space left on device\); "
        r"the newest complete checkpoint \(step 4\) is intact",
    ):
        ckpt.save_checkpoint(tmp_path, step=8, rank=0, payload=_payload(8.0), run_id=RUN, n_ranks=1)
    assert sorted(p.name for p in ckpt.checkpoint_root(tmp_path).rglob("*") if p.is_file()) == ["rank0.pt"]
    assert ckpt.load_checkpoint(tmp_path, step=4, rank=0, run_id=RUN)["step"] == 4.0


def test_the_driver_warns_and_trains_on_when_a_checkpoint_cannot_be_written(tmp_path, monkeypatch):
    import types

    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.core.reference import LeastSquaresProblem
    from psgdlab.runtime.loop.driver import DriverOptions, _Worker
    from psgdlab.runtime.loop.workloads import LeastSquaresWorkload

    def disk_full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "atomic_write_bytes", disk_full)
    channel = types.SimpleNamespace(device=torch.device("cpu"))
    worker = _Worker(
        make_algorithm("ssgd", n_workers=1),
        LeastSquaresWorkload(LeastSquaresProblem(n_samples=8, dim=3, n_shards=1, batch=4)),
        dict.fromkeys(("main", "comm", "responder"), channel),  # type: ignore[arg-type]
        rank=0,
        options=DriverOptions(steps=4, lr_of=lambda s: 0.1, run_dir=tmp_path),
        origin=0.0,
        state=None,
        merges=0,
    )
    with pytest.warns(TestbedWarning, match=r"checkpoint of step 2 could not be written .* training goes on"):
        worker._save(2, *worker.replica.read())
