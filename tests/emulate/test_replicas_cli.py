"""Batched replica gradients against per-replica gradients, and the ``psgdlab emulate`` CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("psgdlab.sim.engine")

from psgdlab.cli import main  # noqa: E402
from psgdlab.core.replicas import consensus_distance  # noqa: E402
from psgdlab.models.data import load_corpus, synthetic_corpus  # noqa: E402
from psgdlab.models.networks import build_model  # noqa: E402
from psgdlab.models.replicas import TorchReplicas  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = synthetic_corpus(
        tmp_path_factory.mktemp("emu") / "c.h5", n_utterances=40, frames_per_utt=60, input_dim=12, n_classes=5, seed=2
    )
    return load_corpus(path)


@pytest.mark.parametrize(("model_name", "window"), [("tiny-blstm", 9), ("blstm-small", 5), ("dnn-small", 11)])
def test_batched_gradients_equal_per_replica_gradients(corpus, model_name, window):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model(model_name, input_dim=corpus.input_dim, n_classes=corpus.n_classes, window=window)
    reps = TorchReplicas(model, corpus, n_workers=4, window=window, batch=6, seed=1, max_replicas=3)
    x0 = reps.initial_point()
    gen = torch.Generator().manual_seed(5)
    entries = [
        (r, s, x0 + 0.05 * torch.randn(x0.shape, generator=gen)) for r, s in [(0, 0), (1, 3), (2, 1), (3, 7), (1, 4)]
    ]
    batched = reps.gradients(entries)  # two batches (max_replicas=3)
    for (r, s, x), (g, loss) in zip(entries, batched):
        g_ref, loss_ref = reps.replica_gradient(x, r, s)
        assert torch.allclose(g, g_ref, rtol=1e-4, atol=1e-6), (model_name, (g - g_ref).abs().max())
        assert loss == pytest.approx(loss_ref, rel=1e-5)


def test_blstm_uses_the_batched_path_and_others_vmap(corpus):
    blstm = TorchReplicas(
        build_model("tiny-blstm", input_dim=12, n_classes=5, window=9), corpus, n_workers=2, window=9, batch=4
    )
    dnn = TorchReplicas(
        build_model("dnn-small", input_dim=12, n_classes=5, window=11), corpus, n_workers=2, window=11, batch=4
    )
    assert blstm.blstm_layers == 1 and dnn.blstm_layers is None
    assert blstm.unflatten(blstm.initial_point())["lstm.weight_hh_l0"].shape == (128, 32)


def test_consensus_distance_numpy_and_torch_agree():
    rng = np.random.default_rng(0)
    models = [rng.standard_normal(5) for _ in range(4)]
    X = np.stack(models)
    expected = float(((X - X.mean(0)) ** 2).sum())
    assert consensus_distance(models) == pytest.approx(expected)
    assert TorchReplicas.consensus_distance([torch.from_numpy(m) for m in models]) == pytest.approx(expected)


def test_cli_json_summary_and_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    status = main(
        [
            "emulate",
            "--algorithm",
            "adpsgd",
            "--variant",
            "random",
            "--workers",
            "4",
            "--steps",
            "12",
            "--batch",
            "8",
            "--out",
            str(out),
            "--json",
            "--straggler",
            "1:2",
        ]
    )
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    for key in ("final_loss", "final_consensus_distance", "simulated_time_s", "final_accuracy", "staleness_mean"):
        assert key in summary
    assert summary["simulated_time_s"] > 0 and np.isfinite(summary["final_loss"])
    for name in (
        "config.resolved.json",
        "env.json",
        "trace.npz",
        "summary.json",
        "curves.npz",
        "loss.png",
        "consensus.png",
        "timeline.json",
    ):
        assert (out / name).is_file(), name
    from psgdlab.core.records.trace import read_trace

    trace, meta = read_trace(out / "trace.npz")
    assert meta["source"] == "emulator" and meta["replayed_source"] == "simulator"
    assert np.isfinite(trace["loss"][trace["phase"] == 0]).all()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algorithm", "adpsgd", "--workers", "3"], "workers"),
        (["--algorithm", "adpsgdd", "--workers", "4"], "did you mean 'adpsgd'"),
        (["--algorithm", "ssgd", "--workers", "4", "--variant", "random"], "variant"),
        (["--algorithm", "ssgd", "--workers", "4", "--model", "tiny-lstm"], "tiny-blstm"),
        (["--algorithm", "ssgd", "--workers", "4", "--straggler", "9:2"], "straggler rank"),
        (["--algorithm", "ssgd", "--workers", "4", "--lr", "-1"], "lr"),
        (["--algorithm", "ssgd", "--workers", "4", "--preset", "nosuch"], "preset"),
        (["--algorithm", "ssgd", "--workers", "4", "--data", "/nonexistent/c.h5"], "does not exist"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    status = main(["emulate", *argv, "--steps", "2", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert len(err.splitlines()) == 1 and message in err
