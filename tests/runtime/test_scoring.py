"""HMM word decoding of frame posteriors (models.scoring): Viterbi against brute force, words
generated from their states, prior division, error paths; held-out scoring in `psgdlab train`."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("h5py")

from psgdlab.cli import main  # noqa: E402
from psgdlab.core.errors import ConfigError  # noqa: E402
from psgdlab.models.scoring import (  # noqa: E402
    decode_words,
    state_priors,
    viterbi_word_scores,
    word_state_classes,
)
from psgdlab.models.speech import DIGIT_WORDS, import_fsdd  # noqa: E402
from psgdlab.runtime.train import HELD_OUT_KEYS  # noqa: E402
from psgdlab.tests.conftest import FSDD_DIR  # noqa: E402


def _brute_force_scores(loglik: np.ndarray, n_words: int, states: int) -> np.ndarray:
    """Max over every state sequence the topology allows (the oracle for Viterbi)."""
    classes = word_state_classes(n_words, states)
    best = np.full(n_words, -np.inf)
    for path in itertools.product(range(states + 2), repeat=len(loglik)):
        if path[0] > 1 or path[-1] < states or any(b - a not in (0, 1) for a, b in itertools.pairwise(path)):
            continue
        for w in range(n_words):
            best[w] = max(best[w], sum(loglik[t, classes[w, q]] for t, q in enumerate(path)))
    return best


@st.composite
def _utterances(draw):
    n_words, states = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    return n_words, states, [rng.normal(size=(n, n_words * states + 1)) for n in lengths]


@given(_utterances())
def test_viterbi_equals_brute_force_over_all_paths(case):
    n_words, states, utts = case  # utterances of different lengths share one padded batch
    got = viterbi_word_scores(utts, n_words=n_words, states_per_word=states)
    want = np.stack([_brute_force_scores(u, n_words, states) for u in utts])
    assert got.shape == (len(utts), n_words)
    assert np.array_equal(np.isinf(got), np.isinf(want))  # -inf exactly when T < states
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-12, atol=1e-12)


@given(
    word=st.integers(0, 9),
    lead=st.integers(0, 5),
    tail=st.integers(0, 5),
    durations=st.lists(st.integers(1, 6), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_a_sequence_generated_from_a_word_decodes_to_that_word(word, lead, tail, durations, seed):
    # posteriors put 1 - eps on the generating state; priors anywhere in [1/(2C), 2/C]
    labels = [0] * lead + [3 * word + k + 1 for k, d in enumerate(durations) for _ in range(d)] + [0] * tail
    n_classes, eps = 31, 1e-3
    post = np.full((len(labels), n_classes), eps / (n_classes - 1))
    post[np.arange(len(labels)), labels] = 1 - eps
    rng = np.random.default_rng(seed)
    priors = rng.uniform(0.5, 2.0, n_classes)
    priors /= priors.sum()
    assert decode_words([np.log(post)], priors) == [DIGIT_WORDS[word]]


@given(_utterances(), st.integers(0, 2**16))
def test_prior_division_and_log_domain_sums_are_consistent(case, seed):
    n_words, states, utts = case
    rng = np.random.default_rng(seed)
    n_classes = n_words * states + 1
    priors = rng.dirichlet(np.ones(n_classes))
    words = [f"w{i}" for i in range(n_words)]
    log_post = [u - np.log(np.exp(u).sum(axis=1, keepdims=True)) for u in utts]  # rows sum to 1
    scaled = viterbi_word_scores([lp - np.log(priors) for lp in log_post], n_words=n_words, states_per_word=states)
    # dividing by p(x_t) (a per-frame constant) shifts every word's score by the same sum
    shifts = [rng.normal(size=(len(u), 1)) for u in utts]
    shifted = viterbi_word_scores(
        [lp - np.log(priors) + c for lp, c in zip(log_post, shifts)], n_words=n_words, states_per_word=states
    )
    finite = np.isfinite(scaled)
    total = np.array([c.sum() for c in shifts])[:, None] * np.ones(n_words)
    np.testing.assert_allclose(shifted[finite] - scaled[finite], total[finite], rtol=1e-9, atol=1e-9)
    want = [words[int(np.argmax(row))] if np.isfinite(row).any() else "" for row in scaled]
    assert decode_words(log_post, priors, words=words, states_per_word=states) == want
    # uniform priors: scores are the posterior path sums plus T log C
    uniform = viterbi_word_scores(log_post, n_words=n_words, states_per_word=states)
    plain = viterbi_word_scores([lp + np.log(n_classes) for lp in log_post], n_words=n_words, states_per_word=states)
    lengths = np.array([len(u) for u in utts])[:, None] * np.ones(n_words)
    np.testing.assert_allclose(plain[finite] - uniform[finite], (lengths * np.log(n_classes))[finite], rtol=1e-9)


def test_prior_division_changes_the_decision_where_a_state_is_common():
    # frames favour word 0's states by a small margin, but word 0's states are 4x as common in
    # training: the scaled likelihoods pick word 1 (the majority vote of argmaxes stays with word 0)
    post = np.full((4, 7), 0.01)
    post[:, 1:4] = 0.30
    post[:, 4:7] = 0.25
    post /= post.sum(axis=1, keepdims=True)
    priors = np.array([0.2, 0.16, 0.16, 0.16, 0.04, 0.04, 0.04])
    priors /= priors.sum()
    log_post = np.log(post)
    assert decode_words([log_post], priors, words=["a", "b"]) == ["b"]
    assert decode_words([log_post], np.full(7, 1 / 7), words=["a", "b"]) == ["a"]


def test_state_priors_counts_floor_and_normalisation():
    np.testing.assert_allclose(state_priors(np.array([0, 0, 0, 1, 1, 2, 3, 3]), 4), [3 / 8, 2 / 8, 1 / 8, 2 / 8])
    floored = state_priors(np.array([0, 0, 1]), 3, floor=0.1)  # class 2 unseen: floored, then renormalised
    assert floored[2] > 0 and floored.sum() == pytest.approx(1.0)
    with pytest.raises(ConfigError, match=r"labels \(\(0, 5\)\) must lie in \[0, 3\)"):
        state_priors(np.array([0, 5]), 3)
    with pytest.raises(ConfigError, match="floor"):
        state_priors(np.array([0, 1]), 3, floor=0.5)


def test_short_utterances_and_bad_input():
    # fewer frames than states: no path, the empty hypothesis (a deletion)
    assert decode_words([np.log(np.full((2, 31), 1 / 31))], np.full(31, 1 / 31)) == [""]
    with pytest.raises(ConfigError, match="need at least 31 classes"):
        viterbi_word_scores([np.zeros((5, 30))], n_words=10, states_per_word=3)
    with pytest.raises(ConfigError, match="must be finite"):
        viterbi_word_scores([np.full((5, 31), np.nan)], n_words=10, states_per_word=3)
    with pytest.raises(ConfigError, match="must be a non-empty"):
        viterbi_word_scores([np.zeros((0, 31))], n_words=10, states_per_word=3)
    with pytest.raises(ConfigError, match="must all be > 0"):
        decode_words([np.zeros((5, 31))], np.zeros(31))
    with pytest.raises(ConfigError, match=r"must be \(frames, 31\)"):
        decode_words([np.zeros((5, 7))], np.full(31, 1 / 31))


@pytest.fixture(scope="module")
def tiny_fsdd(tmp_path_factory):
    if not (FSDD_DIR / "recordings").is_dir():
        pytest.skip(f"FSDD recordings not found at {FSDD_DIR} (set PSGDLAB_FSDD)")
    root = tmp_path_factory.mktemp("fsdd")
    (root / "recordings").mkdir()
    for digit, speaker in itertools.product(range(10), ("jackson", "lucas", "theo")):
        shutil.copy(FSDD_DIR / "recordings" / f"{digit}_{speaker}_0.wav", root / "recordings")
    return import_fsdd(root, root / "fsdd.h5", progress=False)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_train_scores_held_out_speakers_after_every_epoch(tiny_fsdd, tmp_path, capsys):
    out = tmp_path / "run"
    status = main(
        [
            "train",
            "--algorithm",
            "adpsgd",
            "--workers",
            "2",
            "--model",
            "tiny-blstm",
            "--data",
            str(tiny_fsdd),
            "--held-out-speakers",
            "theo",
            "--epochs",
            "2",
            "--batch",
            "8",
            "--lr",
            "0.1",
            "--out",
            str(out),
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    held, per_epoch = summary["held_out"], summary["steps_per_worker"] // 2
    assert [e["step"] for e in held] == [per_epoch, 2 * per_epoch]  # the model after each epoch
    for e in held:
        assert set(HELD_OUT_KEYS) <= set(e)
        assert 0 <= e["frame_accuracy"] <= 1 and 0 <= e["wer_vote"] <= 1 and 0 <= e["wer_viterbi"] <= 1
        assert e["wer"] == e["wer_viterbi"] and e["loss"] > 0 and set(e["wer_by_speaker"]) == {"theo"}
    assert json.loads((out / "summary.json").read_text())["held_out"] == held
    assert all(e["score_s"] > 0 for e in held)
    assert (out / "loss.png").is_file()
    # what was scored is the mean of the two workers' models (their final checkpoints), not rank 0's
    import torch

    from psgdlab.runtime.config import TrainConfig
    from psgdlab.runtime.loop import checkpoint as ckpt
    from psgdlab.runtime.train import build_workload

    config = TrainConfig.from_json(json.loads((out / "launch.json").read_text())["train"])
    workload, _ = build_workload(config, 0)
    final = [ckpt.load_checkpoint(out, step=2 * per_epoch, rank=r, run_id=None)["params"] for r in (0, 1)]
    assert not torch.equal(final[0], final[1])  # AD-PSGD replicas differ
    assert summary["held_out_model"] == "mean of 2 workers"
    assert workload.evaluate((final[0] + final[1]) / 2)["loss"] == pytest.approx(held[-1]["loss"], rel=1e-5)
