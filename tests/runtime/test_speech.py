"""Speech front end, stand-in VAD labels, FSDD and Kaldi importers, scoring, `psgdlab data`."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
h5py = pytest.importorskip("h5py")
from scipy.io import wavfile  # noqa: E402

from psgdlab.cli import main  # noqa: E402
from psgdlab.core.errors import ConfigError  # noqa: E402
from psgdlab.models.data import inspect_corpus, load_corpus, write_corpus  # noqa: E402
from psgdlab.models.frontend import (  # noqa: E402
    frame_energy_db,
    log_mel_filterbank,
    mel_band_centres_hz,
    mel_filterbank,
    speed_perturb,
)
from psgdlab.models.networks import build_model  # noqa: E402
from psgdlab.models.scoring import (  # noqa: E402
    frame_accuracy,
    score_corpus,
    utterance_words,
    word_error_rate,
)
from psgdlab.models.speech import base_speaker, import_fsdd, import_kaldi, vad_labels  # noqa: E402
from psgdlab.tests.conftest import FSDD_DIR  # noqa: E402

SR = 8000


def _tone(freq_hz, seconds, sr=SR, amplitude=0.5):
    t = np.arange(int(seconds * sr)) / sr
    return amplitude * np.sin(2 * np.pi * freq_hz * t)


def _write_wav(path, signal, sr=SR):
    wavfile.write(path, sr, (np.clip(signal, -1, 1) * 32767).astype(np.int16))


# --------------------------------------------------------------------------- front end


def test_filterbank_shape_and_frame_count():
    feats = log_mel_filterbank(np.zeros(8000) + 1e-3 * _tone(300, 1.0), SR)
    # 1 s at 8 kHz, 200-sample windows every 80 samples: 1 + (8000 - 200) // 80 = 98 frames
    assert feats.shape == (98, 40) and feats.dtype == np.float32
    assert len(frame_energy_db(np.zeros(8000), SR)) == 98
    assert log_mel_filterbank(np.ones(50), SR).shape == (1, 40)  # shorter than one window


@pytest.mark.parametrize("freq_hz", [250.0, 1000.0, 2500.0])
def test_pure_tone_peaks_in_the_nearest_mel_band(freq_hz):
    feats = log_mel_filterbank(_tone(freq_hz, 0.5), SR)
    band = int(np.argmax(feats.mean(axis=0)))
    centres = mel_band_centres_hz(40, SR)
    nearest = int(np.argmin(np.abs(centres - freq_hz)))
    assert abs(band - nearest) <= 1
    assert feats.mean(axis=0)[band] - np.median(feats.mean(axis=0)) > 5.0  # a clear peak


def test_mel_filters_are_triangles_covering_the_band():
    fb = mel_filterbank(40, 256, SR)
    assert fb.shape == (40, 129)
    assert np.all(fb >= 0) and np.all(fb.max(axis=1) <= 1.0 + 1e-12)
    assert np.all(np.diff(np.argmax(fb, axis=1)) >= 0)  # centres increase
    assert np.all(np.diff(mel_band_centres_hz(40, SR)) > 0)


# --------------------------------------------------------------------------- VAD labels


def test_vad_labels_silence_tone_silence():
    rng = np.random.default_rng(0)
    signal = np.concatenate([1e-4 * rng.standard_normal(4000), _tone(440, 0.6), 1e-4 * rng.standard_normal(4000)])
    energy = frame_energy_db(signal, SR)
    labels = vad_labels(energy, 7)
    voiced = np.flatnonzero(labels > 0)
    first, last = voiced[0], voiced[-1]
    # the tone spans samples 4000..8800: frames starting from 4000 - 199 to 8800 - 1
    assert abs(first - (4000 - 199) / 80) <= 1.5 and abs(last - 8799 / 80) <= 1.5
    assert np.all(labels[:first] == 0) and np.all(labels[last + 1 :] == 0)
    region = labels[first : last + 1]
    assert set(region) == {22, 23, 24}  # 7 * 3 + k + 1
    assert np.all(np.diff(region) >= 0)  # states in order
    sizes = np.bincount(region)[22:]
    assert sizes.max() - sizes.min() <= 1  # three equal segments


def test_vad_labels_exact_split():
    # peak -10 dB, threshold 25 dB: frames 2..8 are the region (n = 7), k = floor(3 (t - 2) / 7)
    energy = np.array([-80, -80, -10, -12, -11, -10, -10, -11, -13, -80], dtype=float)
    np.testing.assert_array_equal(vad_labels(energy, 0), [0, 0, 1, 1, 1, 2, 2, 3, 3, 0])
    np.testing.assert_array_equal(vad_labels(energy, 9), [0, 0, 28, 28, 28, 29, 29, 30, 30, 0])
    # a dip inside the region keeps the word's state; a lower threshold shrinks the region
    dip = energy.copy()
    dip[5] = -60
    assert vad_labels(dip, 0)[5] == 2
    np.testing.assert_array_equal(
        vad_labels(energy, 0, threshold_db=1.5), [0, 0, 1, 1, 1, 2, 2, 3, 0, 0][:2] + [1, 1, 2, 2, 3, 3] + [0, 0]
    )


def test_vad_rejects_a_silent_recording():
    with pytest.raises(ConfigError, match="has no speech"):
        vad_labels(frame_energy_db(np.zeros(4000), SR), 3)


# --------------------------------------------------------------------------- FSDD import


def _fake_fsdd(tmp_path, names=("3_ann_0.wav", "3_ann_1.wav", "8_bob_0.wav")):
    folder = tmp_path / "fsdd" / "recordings"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i, name in enumerate(names):
        signal = np.concatenate(
            [1e-3 * rng.standard_normal(800), _tone(300 + 100 * i, 0.3), 1e-3 * rng.standard_normal(800)]
        )
        _write_wav(folder / name, signal)
    return folder


def test_import_fsdd_synthetic_recordings(tmp_path):
    folder = _fake_fsdd(tmp_path)
    out = import_fsdd(folder.parent, tmp_path / "f.h5", progress=False)
    info = inspect_corpus(out)
    assert info["n_utterances"] == 3 and info["n_classes"] == 31 and info["input_dim"] == 120
    assert info["speakers"] == {"ann": 2, "bob": 1} and "CC BY-SA 4.0" in info["credit"]
    c = load_corpus(out)
    assert c.transcripts == ("three", "three", "eight") and c.input_dim == 120
    assert set(np.unique(c.labels)) == {0, 10, 11, 12, 25, 26, 27}
    # the recordings folder itself is accepted too
    again = load_corpus(import_fsdd(folder, tmp_path / "g.h5", progress=False))
    np.testing.assert_array_equal(again.labels, c.labels)


def test_import_fsdd_with_speed_perturbation(tmp_path):
    folder = _fake_fsdd(tmp_path)
    out = import_fsdd(folder, tmp_path / "sp.h5", progress=False, speed_factors=(0.9, 1.0, 1.1))
    c = load_corpus(out)
    assert c.n_utterances == 9
    assert set(c.speakers) == {"ann", "bob", "sp0.9-ann", "sp0.9-bob", "sp1.1-ann", "sp1.1-bob"}
    assert {base_speaker(s) for s in c.speakers} == {"ann", "bob"}
    lengths = dict(zip(c.utt_ids, np.diff(c.offsets), strict=True))
    # 0.9x speed lasts 1/0.9 as long; 1.1x lasts 1/1.1 (frames: within a frame of the ratio)
    assert abs(lengths["sp0.9-3_ann_0"] - lengths["3_ann_0"] / 0.9) <= 2
    assert abs(lengths["sp1.1-3_ann_0"] - lengths["3_ann_0"] / 1.1) <= 2
    assert c.transcripts.count("three") == 6
    with pytest.raises(ConfigError, match=r"speed factor \(3.0\) must lie in \[0.5, 2\]"):
        import_fsdd(folder, tmp_path / "x.h5", progress=False, speed_factors=(1.0, 3.0))
    assert not (tmp_path / "x.h5").exists()


def test_speed_perturb_scales_frequency():
    tone = _tone(1000, 0.5)
    faster = speed_perturb(tone, 1.25)  # 1000 Hz played 1.25x as fast is 1250 Hz
    spectrum = np.abs(np.fft.rfft(faster))
    assert abs(np.argmax(spectrum) * SR / len(faster) - 1250) < 10
    assert speed_perturb(tone, 1.0) is tone


@pytest.mark.parametrize(
    "case, message",
    [
        ("rate", r"9_cat_0\.wav: sample rate 16000 Hz, expected 8000 Hz"),
        ("empty", r"9_cat_0\.wav: empty file \(0 bytes\)"),
        ("nosamples", r"9_cat_0\.wav: WAV file has no samples"),
        ("name", r"nine_cat\.wav: file name does not match \{digit\}_\{speaker\}_\{index\}\.wav"),
        ("silent", r"9_cat_0\.wav: recording .* has no speech"),
    ],
)
def test_import_fsdd_bad_input_names_the_file_and_leaves_nothing(tmp_path, case, message):
    folder = _fake_fsdd(tmp_path)
    bad = folder / ("nine_cat.wav" if case == "name" else "9_cat_0.wav")
    if case == "rate":
        _write_wav(bad, _tone(440, 0.3, sr=16000), sr=16000)
    elif case == "empty":
        bad.write_bytes(b"")
    elif case == "nosamples":
        wavfile.write(bad, SR, np.zeros(0, dtype=np.int16))
    elif case == "silent":
        _write_wav(bad, np.zeros(2000))
    else:
        _write_wav(bad, _tone(440, 0.3))
    out = tmp_path / "out" / "f.h5"
    out.parent.mkdir()
    with pytest.raises(ConfigError, match=message):
        import_fsdd(folder.parent, out, progress=False)
    assert list(out.parent.iterdir()) == []


def test_import_fsdd_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="FSDD folder not found"):
        import_fsdd(tmp_path / "nope", tmp_path / "f.h5", progress=False)


@pytest.mark.skipif(
    not (FSDD_DIR / "recordings").is_dir(), reason=f"FSDD recordings not found at {FSDD_DIR} (set PSGDLAB_FSDD)"
)
def test_import_a_handful_of_real_fsdd_recordings(tmp_path):
    folder = tmp_path / "recordings"
    folder.mkdir()
    for name in ("0_george_0.wav", "5_theo_3.wav", "7_jackson_10.wav", "9_lucas_20.wav"):
        shutil.copy(FSDD_DIR / "recordings" / name, folder / name)
    c = load_corpus(import_fsdd(tmp_path, tmp_path / "fsdd.h5", progress=False))
    assert c.n_utterances == 4 and c.input_dim == 120 and np.all(np.isfinite(c.features))
    assert sorted(set(c.speakers)) == ["george", "jackson", "lucas", "theo"]
    for u, utt in enumerate(c.utt_ids):
        digit = int(utt[0])
        labels = c.labels[c.offsets[u] : c.offsets[u + 1]]
        voiced = labels[labels > 0]
        assert set(voiced) == {3 * digit + 1, 3 * digit + 2, 3 * digit + 3}
        assert len(voiced) >= 0.3 * len(labels)  # the recordings are trimmed around the word


# --------------------------------------------------------------------------- Kaldi import


@pytest.fixture
def kaldi_dir(tmp_path):
    kaldiio = pytest.importorskip("kaldiio")
    rng = np.random.default_rng(3)
    lengths = {"utt1": 6, "utt2": 4, "utt3": 9}
    feats = {u: rng.standard_normal((n, 13)).astype(np.float32) for u, n in lengths.items()}
    ali = {u: rng.integers(0, 5, n).astype(np.int32) for u, n in lengths.items()}
    ali["utt2"][:] = 7  # largest label: n_classes defaults to 8
    d = tmp_path / "data"
    d.mkdir()
    with kaldiio.WriteHelper(f"ark,scp:{d / 'feats.ark'},{d / 'feats.scp'}") as w:
        for u, m in feats.items():
            w(u, m)
    with kaldiio.WriteHelper(f"ark,scp:{d / 'ali.ark'},{d / 'ali.scp'}") as w:
        for u, a in ali.items():
            w(u, a)
    (d / "ali.txt").write_text("".join(f"{u} {' '.join(map(str, a))}\n" for u, a in ali.items()))
    (d / "utt2spk").write_text("utt1 spkA\nutt2 spkA\nutt3 spkB\n")
    (d / "text").write_text("utt1 hello world\nutt2 hi\nutt3 good bye\n")
    return d, feats, ali


@pytest.mark.parametrize("ali_name", ["ali.txt", "ali.ark", "ali.scp"])
def test_import_kaldi_round_trip(tmp_path, kaldi_dir, ali_name):
    d, feats, ali = kaldi_dir
    out = import_kaldi(d / "feats.scp", tmp_path / "k.h5", alignments=d / ali_name)
    c = load_corpus(out, normalize="none")
    assert c.utt_ids == ("utt1", "utt2", "utt3") and c.n_classes == 8
    np.testing.assert_allclose(c.features, np.concatenate([feats[u] for u in c.utt_ids]))
    np.testing.assert_array_equal(c.labels, np.concatenate([ali[u] for u in c.utt_ids]))
    assert c.speakers == ("spkA", "spkA", "spkB")
    assert c.transcripts == ("hello world", "hi", "good bye")
    assert inspect_corpus(out)["feature_kind"] == "kaldi"


def test_import_kaldi_from_ark_with_explicit_classes(tmp_path, kaldi_dir):
    d, _, _ = kaldi_dir
    out = import_kaldi(d / "feats.ark", tmp_path / "k.h5", alignments=d / "ali.txt", n_classes=20)
    assert inspect_corpus(out)["n_classes"] == 20


def test_import_kaldi_utterance_without_alignment(tmp_path, kaldi_dir):
    d, _, _ = kaldi_dir
    (d / "ali.txt").write_text("utt1 0 0 0 0 0 0\nutt3 1 1 1 1 1 1 1 1 1\n")
    with pytest.raises(ConfigError, match=r"utterance 'utt2' of .*feats\.scp has no alignment in .*ali\.txt"):
        import_kaldi(d / "feats.scp", tmp_path / "k.h5", alignments=d / "ali.txt")
    assert not (tmp_path / "k.h5").exists()


def test_import_kaldi_mismatched_lengths(tmp_path, kaldi_dir):
    d, _, _ = kaldi_dir
    (d / "ali.txt").write_text("utt1 0 0 0 0 0 0\nutt2 1 1 1\nutt3 1 1 1 1 1 1 1 1 1\n")
    with pytest.raises(ConfigError, match=r"utterance 'utt2': 4 feature frames in .* but 3 alignment labels"):
        import_kaldi(d / "feats.scp", tmp_path / "k.h5", alignments=d / "ali.txt")
    assert list(tmp_path.glob("*.h5")) == []


def test_import_kaldi_missing_files(tmp_path, kaldi_dir):
    d, _, _ = kaldi_dir
    with pytest.raises(FileNotFoundError, match=r"feature file not found: .*nope\.scp"):
        import_kaldi(d / "nope.scp", tmp_path / "k.h5", alignments=d / "ali.txt")
    with pytest.raises(FileNotFoundError, match=r"alignment file not found: .*nope\.txt"):
        import_kaldi(d / "feats.scp", tmp_path / "k.h5", alignments=d / "nope.txt")
    with pytest.raises(FileNotFoundError, match=r"alignment file not found: .*nope\.ark"):
        import_kaldi(d / "feats.scp", tmp_path / "k.h5", alignments=d / "nope.ark")


def test_import_kaldi_non_integer_alignment(tmp_path, kaldi_dir):
    d, _, _ = kaldi_dir
    (d / "ali.txt").write_text("utt1 0 0 x 0 0 0\n")
    with pytest.raises(ConfigError, match=r"ali\.txt:1: alignment of 'utt1' holds a non-integer"):
        import_kaldi(d / "feats.scp", tmp_path / "k.h5", alignments=d / "ali.txt")


# --------------------------------------------------------------------------- scoring


def test_word_error_rate_on_known_strings():
    assert word_error_rate(["one two three"], ["one two three"]) == 0.0
    # 1 substitution + 1 deletion over 4 reference words
    assert word_error_rate(["one two three four"], ["one five three"]) == pytest.approx(0.5)
    # corpus-level: (1 insertion + 1 deletion) / 3 words
    assert word_error_rate(["seven", "eight nine"], ["seven seven", "eight"]) == pytest.approx(2 / 3)
    assert word_error_rate(["zero", "one"], ["", "one"]) == pytest.approx(0.5)  # empty hyp = deletion
    with pytest.raises(ConfigError, match="must number the same as references"):
        word_error_rate(["a"], ["a", "b"])
    with pytest.raises(ConfigError, match="must contain at least one word"):
        word_error_rate([""], ["a"])


def test_utterance_words_majority_vote_over_voiced_frames():
    preds = [
        np.array([0, 0, 10, 11, 11, 12, 25, 0]),  # 3 votes "three", 1 vote "eight"
        np.array([0, 0, 0]),  # all silence -> deletion
        np.array([28, 29, 1, 2, 0]),  # tie nine/zero -> smaller index, "zero"
    ]
    assert utterance_words(preds) == ["three", "", "zero"]
    assert frame_accuracy(np.array([1, 2, 3, 4]), np.array([1, 2, 0, 4])) == 0.75
    with pytest.raises(ConfigError, match="beyond the 10 words"):
        utterance_words([np.array([31])])


def test_score_corpus_with_a_model_that_reads_the_labels(tmp_path):
    # features one-hot encode the label, a fixed linear "model" reads them: frame acc must be 1
    labels = [np.array([0, 10, 11, 12, 0]), np.array([0, 4, 5, 5, 6, 0])]
    feats = [np.eye(31, dtype=np.float32)[lab] for lab in labels]
    path = write_corpus(
        tmp_path / "o.h5",
        features_per_utt=feats,
        labels_per_utt=labels,
        utt_ids=["u0", "u1"],
        speakers=["s", "s"],
        transcripts=["three", "one"],
        n_classes=31,
        feature_kind="test",
    )
    corpus = load_corpus(path, normalize="none")

    class Reader(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return x[:, x.shape[1] // 2] + 0 * self.w

    model = Reader()
    scores = score_corpus(model, corpus, window=3, batch=4)
    assert scores["frame_accuracy"] == 1.0 and scores["wer"] == scores["wer_vote"] == 0.0
    assert np.isnan(scores["wer_viterbi"]) and scores["n_utterances"] == 2  # no priors: no decoding
    # logits are one-hot (1 on the label): cross-entropy log(e + 30) - 1 per frame
    assert scores["loss"] == pytest.approx(np.log(np.e + 30) - 1, rel=1e-5)
    decoded = score_corpus(model, corpus, window=3, batch=4, priors=np.full(31, 1 / 31))
    assert decoded["wer"] == decoded["wer_viterbi"] == 0.0 and decoded["wer_by_speaker"] == {"s": 0.0}
    assert model.training  # restored after scoring
    tiny = build_model("tiny-blstm", input_dim=31, n_classes=31, window=3)
    assert 0.0 <= score_corpus(tiny, corpus, window=3)["frame_accuracy"] <= 1.0


# --------------------------------------------------------------------------- CLI


def test_cli_synthetic_and_info(tmp_path, capsys):
    out = tmp_path / "s.h5"
    assert (
        main(
            [
                "data",
                "synthetic",
                "--out",
                str(out),
                "--utterances",
                "5",
                "--frames",
                "10",
                "--dim",
                "3",
                "--classes",
                "4",
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_utterances"] == 5 and summary["feature_dim"] == 3
    assert main(["data", "info", str(out)]) == 0
    assert "utterances    5" in capsys.readouterr().out


def test_cli_fsdd_and_kaldi(tmp_path, capsys, kaldi_dir):
    folder = _fake_fsdd(tmp_path)
    assert (
        main(
            [
                "data",
                "fsdd",
                str(folder.parent),
                "--out",
                str(tmp_path / "f.h5"),
                "--json",
                "--no-progress",
                "--speed",
                "0.9,1.0",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_classes"] == 31 and summary["n_utterances"] == 6
    assert main(["data", "fsdd", str(folder), "--out", str(tmp_path / "g.h5"), "--speed", "fast"]) == 2
    assert "--speed ('fast') must be comma-separated numbers" in capsys.readouterr().err
    d, _, _ = kaldi_dir
    assert (
        main(
            [
                "data",
                "kaldi",
                str(d / "feats.scp"),
                "--alignments",
                str(d / "ali.ark"),
                "--out",
                str(tmp_path / "k.h5"),
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["n_utterances"] == 3


def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys):
    folder = _fake_fsdd(tmp_path)
    _write_wav(folder / "1_x_0.wav", _tone(440, 0.2, sr=11025), sr=11025)
    assert main(["data", "fsdd", str(folder), "--out", str(tmp_path / "f.h5"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1_x_0.wav: sample rate 11025 Hz" in err[0]
    assert not (tmp_path / "f.h5").exists()
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f["features"] = np.zeros((2, 2))
    assert main(["data", "info", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dataset 'offsets' is missing" in err[0]
