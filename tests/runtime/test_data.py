"""HDF5 corpus layout, validation messages, deltas, normalisation, sharding and the sampler."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
h5py = pytest.importorskip("h5py")

from psgdlab.core.errors import ConfigError  # noqa: E402
from psgdlab.models.batches import WindowSampler, eval_windows  # noqa: E402
from psgdlab.models.data import (  # noqa: E402
    DATASETS,
    append_deltas,
    inspect_corpus,
    load_corpus,
    shard_utterances,
    synthetic_corpus,
    write_corpus,
)
from psgdlab.models.networks import build_model  # noqa: E402


def _small(tmp_path, name="c.h5", **kw):
    rng = np.random.default_rng(0)
    lengths = [5, 3, 8, 1]
    args = dict(
        features_per_utt=[rng.standard_normal((n, 4)).astype(np.float32) for n in lengths],
        labels_per_utt=[rng.integers(0, 6, n) for n in lengths],
        utt_ids=["a", "b", "c", "d"],
        speakers=["s1", "s1", "s2", "s3"],
        transcripts=["one", "two", "", "three four"],
        n_classes=6,
        feature_kind="test",
    )
    args.update(kw)
    return tmp_path / name, args


def test_round_trip_keeps_everything(tmp_path):
    path, args = _small(tmp_path)
    write_corpus(path, **args, credit="me", source="here")
    c = load_corpus(path, normalize="none")
    np.testing.assert_array_equal(c.features, np.concatenate(args["features_per_utt"]))
    np.testing.assert_array_equal(c.labels, np.concatenate(args["labels_per_utt"]))
    np.testing.assert_array_equal(c.offsets, [0, 5, 8, 16, 17])
    assert c.utt_ids == ("a", "b", "c", "d") and c.speakers == ("s1", "s1", "s2", "s3")
    assert c.transcripts == ("one", "two", "", "three four")
    assert (c.n_classes, c.input_dim, c.feature_kind) == (6, 4, "test")
    assert c.features.dtype == np.float32 and c.labels.dtype == np.int64
    with h5py.File(path) as f:
        assert set(DATASETS) <= set(f)
        assert f.attrs["format_version"] == 1 and f.attrs["credit"] == "me"
        assert f["labels"].dtype == np.int32 and f["offsets"].dtype == np.int64
    info = inspect_corpus(path)
    assert info["n_utterances"] == 4 and info["n_frames"] == 17 and info["n_speakers"] == 3
    assert info["speakers"] == {"s1": 2, "s2": 1, "s3": 1}
    assert not list(tmp_path.glob(".*tmp"))


def test_float16_storage_loads_as_float32(tmp_path):
    path, args = _small(tmp_path)
    write_corpus(path, **args, dtype="float16")
    with h5py.File(path) as f:
        assert f["features"].dtype == np.float16
    c = load_corpus(path, normalize="none")
    assert c.features.dtype == np.float32
    np.testing.assert_allclose(c.features, np.concatenate(args["features_per_utt"]), atol=2e-3)


def test_speaker_selection(tmp_path):
    path, args = _small(tmp_path)
    write_corpus(path, **args)
    c = load_corpus(path, speakers=["s1", "s3"], normalize="none")
    assert c.utt_ids == ("a", "b", "d")
    np.testing.assert_array_equal(c.offsets, [0, 5, 8, 9])
    full = np.concatenate(args["features_per_utt"])
    np.testing.assert_array_equal(c.features, full[np.r_[0:8, 16:17]])
    assert load_corpus(path, exclude_speakers=["s1"]).utt_ids == ("c", "d")
    with pytest.raises(ConfigError, match=r"speakers \(\['nobody'\]\) are not speakers .*known: s1"):
        load_corpus(path, speakers=["nobody"])
    with pytest.raises(ConfigError, match="leaves no utterances"):
        load_corpus(path, exclude_speakers=["s1", "s2", "s3"])


def test_write_mismatched_lengths_names_the_utterance(tmp_path):
    path, args = _small(tmp_path)
    args["labels_per_utt"][2] = np.zeros(7, dtype=np.int64)
    with pytest.raises(ConfigError, match=r"utterance 'c' \('8 feature frames, 7 labels'\)"):
        write_corpus(path, **args)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(utt_ids=["a", "a", "c", "d"]), "must be unique"),
        (dict(speakers=["s1"]), r"speakers \('1 entries'\) must have one per utterance \(4\)"),
        (dict(n_classes=3), r"labels of utterance '.*' .* must lie in \[0, n_classes=3\)"),
        (dict(dtype="float64"), "must be 'float32' or 'float16'"),
    ],
)
def test_write_rejects_bad_input(tmp_path, change, message):
    path, args = _small(tmp_path)
    args.update({k: v for k, v in change.items() if k != "dtype"})
    with pytest.raises(ConfigError, match=message):
        write_corpus(path, **args, **({"dtype": change["dtype"]} if "dtype" in change else {}))
    assert list(tmp_path.iterdir()) == []


def test_write_rejects_empty_utterance(tmp_path):
    path, args = _small(tmp_path)
    args["features_per_utt"][1] = np.zeros((0, 4))
    args["labels_per_utt"][1] = np.zeros(0, dtype=np.int64)
    with pytest.raises(ConfigError, match=r"utterance 'b' \('0 frames'\) must have at least one frame"):
        write_corpus(path, **args)


def test_failed_write_leaves_previous_file_untouched(tmp_path):
    path, args = _small(tmp_path)
    write_corpus(path, **args)
    before = path.read_bytes()
    bad = dict(args, speakers=["x"])
    with pytest.raises(ConfigError):
        write_corpus(path, **bad)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5"]


def test_load_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"corpus file not found: .*nothere\.h5"):
        load_corpus(tmp_path / "nothere.h5")


def test_load_not_hdf5(tmp_path):
    path = tmp_path / "fake.h5"
    path.write_text("not hdf5")
    with pytest.raises(ConfigError, match=r"fake\.h5 is not an HDF5 file"):
        load_corpus(path)


@pytest.mark.parametrize("missing", DATASETS)
def test_load_names_the_missing_dataset(tmp_path, missing):
    path, args = _small(tmp_path)
    write_corpus(path, **args)
    with h5py.File(path, "a") as f:
        del f[missing]
    with pytest.raises(ConfigError, match=f"dataset '{missing}' is missing"):
        load_corpus(path)
    with pytest.raises(ConfigError, match=f"dataset '{missing}' is missing"):
        inspect_corpus(path)


def test_load_wrong_format_version(tmp_path):
    path, args = _small(tmp_path)
    write_corpus(path, **args)
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = 7
    with pytest.raises(ConfigError, match="format_version 7 is not supported"):
        load_corpus(path)


def test_load_missing_attribute(tmp_path):
    path, args = _small(tmp_path)
    write_corpus(path, **args)
    with h5py.File(path, "a") as f:
        del f.attrs["n_classes"]
    with pytest.raises(ConfigError, match="attribute 'n_classes' is missing"):
        load_corpus(path)


@pytest.mark.parametrize(
    "offsets, message",
    [
        ([0, 5, 8, 16, 18], "offsets are inconsistent"),
        ([1, 5, 8, 16, 17], "offsets are inconsistent"),
        ([0, 8, 5, 16, 17], "offsets are inconsistent"),
        ([0, 5, 8, 17], r"offsets has shape \(4,\), expected \(5,\)"),
    ],
)
def test_load_inconsistent_offsets(tmp_path, offsets, message):
    path, args = _small(tmp_path)
    write_corpus(path, **args)
    with h5py.File(path, "a") as f:
        del f["offsets"]
        f["offsets"] = np.array(offsets, dtype=np.int64)
    with pytest.raises(ConfigError, match=message):
        load_corpus(path)


def test_load_labels_out_of_range(tmp_path):
    path, args = _small(tmp_path)
    write_corpus(path, **args)
    with h5py.File(path, "a") as f:
        f["labels"][0] = 99
    with pytest.raises(ConfigError, match=r"labels range \[0, 99\] lies outside \[0, n_classes=6\)"):
        load_corpus(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_load_refuses_non_finite_features_naming_the_utterance(tmp_path, bad):
    """A corpus written by another tool with a NaN trained to a NaN loss and exit 0 (issue 45)."""
    path, args = _small(tmp_path)
    write_corpus(path, **args)
    with h5py.File(path, "a") as f:
        f["features"][9, 2] = bad  # utterance c holds frames 8..15
    with pytest.raises(ConfigError, match=r"features of utterance 'c' hold non-finite values \(NaN or inf; 1 in"):
        load_corpus(path)
    with pytest.raises(ConfigError, match="utterance 'c'"):
        load_corpus(path, speakers=["s2"])
    assert load_corpus(path, speakers=["s1"]).utt_ids == ("a", "b")  # the utterances loaded are finite


def test_write_refuses_features_beyond_float16(tmp_path):
    path, args = _small(tmp_path)
    args["features_per_utt"][1][0, 0] = 1e6
    with pytest.raises(ConfigError, match=r"features stored as float16 \(1 values beyond its range, up to 1e\+06\)"):
        write_corpus(path, **args, dtype="float16")
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_deltas_match_hand_computed_values():
    # one utterance, one dimension, c = [0, 1, 4, 9, 16]; N = 2, denominator 2 * (1 + 4) = 10
    c = np.array([[0.0], [1.0], [4.0], [9.0], [16.0]], dtype=np.float32)
    out = append_deltas(c, np.array([0, 5]))
    # t=0: 1*(c1 - c0) + 2*(c2 - c0) = 1 + 8 = 9 -> 0.9 (edges repeat c0)
    # t=1: 1*(c2 - c0) + 2*(c3 - c0) = 4 + 18 = 22 -> 2.2
    # t=2: 1*(c3 - c1) + 2*(c4 - c0) = 8 + 32 = 40 -> 4.0
    # t=3: 1*(c4 - c2) + 2*(c4 - c1) = 12 + 30 = 42 -> 4.2
    # t=4: 1*(c4 - c3) + 2*(c4 - c2) = 7 + 24 = 31 -> 3.1
    d = np.array([0.9, 2.2, 4.0, 4.2, 3.1])
    np.testing.assert_allclose(out[:, 1], d, rtol=1e-6)
    dd = np.array(
        [
            (1 * (d[1] - d[0]) + 2 * (d[2] - d[0])) / 10,
            (1 * (d[2] - d[0]) + 2 * (d[3] - d[0])) / 10,
            (1 * (d[3] - d[1]) + 2 * (d[4] - d[0])) / 10,
            (1 * (d[4] - d[2]) + 2 * (d[4] - d[1])) / 10,
            (1 * (d[4] - d[3]) + 2 * (d[4] - d[2])) / 10,
        ]
    )
    np.testing.assert_allclose(out[:, 2], dd, rtol=1e-5)
    np.testing.assert_array_equal(out[:, 0], c[:, 0])


def test_deltas_do_not_cross_utterance_boundaries():
    a = np.arange(4, dtype=np.float32)[:, None]
    b = 100 + np.arange(3, dtype=np.float32)[:, None] * 5
    joint = append_deltas(np.concatenate([a, b]), np.array([0, 4, 7]))
    np.testing.assert_allclose(joint[:4], append_deltas(a, np.array([0, 4])), rtol=1e-6)
    np.testing.assert_allclose(joint[4:], append_deltas(b, np.array([0, 3])), rtol=1e-6)


def test_load_appends_deltas_and_normalises_per_utterance(tmp_path):
    path, args = _small(tmp_path)
    write_corpus(path, **args, add_deltas=True)
    c = load_corpus(path)
    assert c.input_dim == 12
    for u in (0, 2):  # utterances long enough to have variance in every dimension
        block = c.features[c.offsets[u] : c.offsets[u + 1]]
        np.testing.assert_allclose(block.mean(axis=0), 0, atol=1e-5)
        np.testing.assert_allclose(block.std(axis=0), 1, atol=1e-4)
    assert load_corpus(path, add_deltas=False).input_dim == 4
    g = load_corpus(path, normalize="global", add_deltas=False)
    np.testing.assert_allclose(g.features.mean(axis=0), 0, atol=1e-5)
    with pytest.raises(ConfigError, match="normalize"):
        load_corpus(path, normalize="cepstral")


def test_synthetic_corpus_is_deterministic(tmp_path):
    a = synthetic_corpus(
        tmp_path / "a.h5", n_utterances=6, frames_per_utt=20, input_dim=3, n_classes=4, seed=5, n_speakers=2
    )
    b = synthetic_corpus(
        tmp_path / "b.h5", n_utterances=6, frames_per_utt=20, input_dim=3, n_classes=4, seed=5, n_speakers=2
    )
    ca, cb = load_corpus(a, normalize="none"), load_corpus(b, normalize="none")
    np.testing.assert_array_equal(ca.features, cb.features)
    np.testing.assert_array_equal(ca.labels, cb.labels)
    assert set(ca.speakers) == {"spk00", "spk01"} and inspect_corpus(a)["feature_kind"] == "synthetic"
    cc = load_corpus(
        synthetic_corpus(tmp_path / "c.h5", n_utterances=6, frames_per_utt=20, input_dim=3, n_classes=4, seed=6),
        normalize="none",
    )
    assert not np.array_equal(ca.labels[:50], cc.labels[:50])


@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=40), world_size=st.integers(1, 8))
def test_shards_partition_the_utterances(lengths, world_size):
    lengths = np.array(lengths)
    if world_size > len(lengths):
        with pytest.raises(ConfigError, match="must not exceed the number of utterances"):
            shard_utterances(lengths, rank=0, world_size=world_size)
        return
    shards = [shard_utterances(lengths, rank=r, world_size=world_size) for r in range(world_size)]
    together = np.concatenate(shards)
    assert len(together) == len(lengths)  # no overlap ...
    np.testing.assert_array_equal(np.sort(together), np.arange(len(lengths)))  # ... covers all
    frames = [int(lengths[s].sum()) for s in shards]
    assert max(frames) - min(frames) <= lengths.max()  # LPT balance
    again = shard_utterances(lengths, rank=world_size - 1, world_size=world_size)
    np.testing.assert_array_equal(again, shards[-1])


def test_shard_arguments_validated():
    with pytest.raises(ConfigError, match=r"rank \(3\) must lie in \[0, world_size=2\)"):
        shard_utterances(np.ones(4), rank=3, world_size=2)


@pytest.fixture
def synthetic(tmp_path):
    path = synthetic_corpus(
        tmp_path / "s.h5", n_utterances=40, frames_per_utt=30, input_dim=5, n_classes=6, seed=1, n_speakers=4
    )
    return load_corpus(path, normalize="none")


def test_sampler_is_deterministic_and_resumable(synthetic):
    a = WindowSampler(synthetic, window=7, batch=16, seed=3)
    b = WindowSampler(synthetic, window=7, batch=16, seed=3)
    x5, y5 = a.sample(5)
    for step in range(5):  # a fresh sampler resumes at step 5 without replaying steps 0..4
        a.sample(step)
    xb, yb = b.sample(5)
    torch.testing.assert_close(x5, xb)
    torch.testing.assert_close(y5, yb)
    assert x5.shape == (16, 7, 5) and x5.dtype == torch.float32 and y5.dtype == torch.int64
    assert not torch.equal(a.sample(6)[0], x5)
    assert not torch.equal(WindowSampler(synthetic, window=7, batch=16, seed=4).sample(5)[0], x5)


def test_sampler_windows_are_correct_with_edge_padding(synthetic):
    sampler = WindowSampler(synthetic, window=9, batch=256, seed=0)
    x, y = sampler.sample(0)
    feats, offsets = synthetic.features, synthetic.offsets
    for i in range(x.shape[0]):  # locate each window's centre frame and rebuild it by hand
        centre_row = x[i, 4].numpy()
        matches = np.flatnonzero((feats == centre_row).all(axis=1))
        assert len(matches) == 1
        t = matches[0]
        u = np.searchsorted(offsets, t, side="right") - 1
        idx = np.clip(np.arange(t - 4, t + 5), offsets[u], offsets[u + 1] - 1)
        np.testing.assert_array_equal(x[i].numpy(), feats[idx])
        assert y[i].item() == synthetic.labels[t]


def test_sampler_draws_only_from_its_shard(synthetic):
    world = 3
    seen = []
    for rank in range(world):
        s = WindowSampler(synthetic, window=1, batch=512, rank=rank, world_size=world, seed=0)
        own = np.concatenate([np.arange(synthetic.offsets[u], synthetic.offsets[u + 1]) for u in s.utterances])
        rows = s.sample(0)[0][:, 0].numpy()
        frame_of_row = {synthetic.features[t].tobytes(): t for t in range(synthetic.n_frames)}
        frames = {frame_of_row[r.tobytes()] for r in rows}
        assert frames <= set(own)
        seen.append(set(s.utterances))
        assert s.n_frames == len(own)
    assert set().union(*seen) == set(range(synthetic.n_utterances))
    assert sum(len(s) for s in seen) == synthetic.n_utterances


def test_epoch_definition(synthetic):
    s = WindowSampler(synthetic, window=21, batch=10)
    assert s.samples_per_epoch == synthetic.n_frames // 21
    assert s.steps_per_epoch() == -(-s.samples_per_epoch // 10)
    assert s.steps_per_epoch(1000) == 1


def test_sampler_validates_arguments(synthetic):
    with pytest.raises(ConfigError, match="window"):
        WindowSampler(synthetic, window=4, batch=2)
    with pytest.raises(ConfigError, match="batch"):
        WindowSampler(synthetic, window=3, batch=0)
    with pytest.raises(ConfigError, match="step"):
        WindowSampler(synthetic, window=3, batch=2).sample(-1)


def test_eval_windows_cover_every_frame_in_order(synthetic):
    xs, ys = zip(*eval_windows(synthetic, 5, batch=37), strict=True)
    x, y = torch.cat(xs), torch.cat(ys)
    assert x.shape == (synthetic.n_frames, 5, 5)
    np.testing.assert_array_equal(y.numpy(), synthetic.labels)
    np.testing.assert_array_equal(x[:, 2].numpy(), synthetic.features)
    first = synthetic.offsets[1]  # first frame of utterance 1: left context repeats it
    np.testing.assert_array_equal(x[first, 0].numpy(), synthetic.features[first])
    np.testing.assert_array_equal(x[first - 1, 4].numpy(), synthetic.features[first - 1])


def test_tiny_model_loss_falls_on_synthetic_data(tmp_path):
    torch.manual_seed(0)
    path = synthetic_corpus(tmp_path / "t.h5", n_utterances=60, frames_per_utt=40, input_dim=8, n_classes=5, seed=2)
    corpus = load_corpus(path)
    sampler = WindowSampler(corpus, window=7, batch=32, seed=0)
    model = build_model("tiny-blstm", input_dim=corpus.input_dim, n_classes=corpus.n_classes, window=7)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(60):
        x, y = sampler.sample(step)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[:5]) > np.log(5) * 0.9  # starts near chance
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def test_corpus_format_and_io_need_no_torch():
    """models.data reads and writes corpora with h5py and numpy; torch batches are runtime.batches'."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    code = "import sys, psgdlab.models.data; assert 'torch' not in sys.modules, 'models.data imported torch'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
