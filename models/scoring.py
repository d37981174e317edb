r"""Scoring a frame classifier: frame accuracy, words from frame posteriors, word error rate.

Isolated-word corpora are labelled as in :func:`psgdlab.models.speech.vad_labels`: class 0 is
silence and class ``w * S + k + 1`` is state ``k`` of word ``w`` (``S`` states per word). Two
ways turn an utterance's frames into one word:

**HMM decoding** (:func:`decode_words`, the hybrid recogniser's rule). The network's frame
posteriors :math:`p(s \mid x_t)` are divided by the state priors :math:`p(s)` counted from the
training labels (:func:`state_priors`), giving scaled likelihoods
:math:`p(x_t \mid s) / p(x_t) = p(s \mid x_t) / p(s)`. Each word is a left-to-right HMM with the
topology the labels imply,

.. math:: \text{sil}^{*} \to s_1^{+} \to s_2^{+} \to \dots \to s_S^{+} \to \text{sil}^{*}

(optional leading and trailing silence, every word state at least one frame), and Viterbi
finds each word's best path score

.. math:: V_w = \max_{q_1 \dots q_T \in \mathcal{Q}_w} \sum_{t=1}^T
          \bigl[\log p(q_t \mid x_t) - \log p(q_t)\bigr],

the decoded word being :math:`\arg\max_w V_w` (ties to the smaller word index). Transition
probabilities are 1/2 for the self-loop and 1/2 for the advance in every state, so each path of
:math:`T` frames has the same transition score and it drops out of the comparison; there is no
language model (the ten digits are equally likely). An utterance shorter than ``S`` frames has
no path and yields the empty hypothesis (a deletion).

**Majority vote** (:func:`utterance_words`, kept for comparison): the most frequent
:math:`\lfloor (s - 1) / S \rfloor` over the frames whose *argmax* state is not silence.

Both are word decisions from an acoustic model alone (no lexicon beyond the digit models), so
their WER measures the acoustic model, not a full recogniser. :func:`word_error_rate` is computed
with jiwer over whole transcripts, so continuous-speech corpora score the same way once a
decoder produces hypotheses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from psgdlab.core.errors import require
from psgdlab.models.batches import eval_windows
from psgdlab.models.data import Corpus
from psgdlab.models.speech import DIGIT_WORDS, STATES_PER_WORD

__all__ = [
    "frame_accuracy",
    "utterance_words",
    "word_error_rate",
    "state_priors",
    "word_state_classes",
    "viterbi_word_scores",
    "decode_words",
    "frame_log_posteriors",
    "predict_frames",
    "score_corpus",
]

#: utterances per Viterbi batch (bounds the padded ``(U, T, C)`` array)
_VITERBI_CHUNK = 256


def frame_accuracy(pred: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor) -> float:
    """Fraction of frames whose predicted class equals the label."""
    pred, labels = np.asarray(pred).reshape(-1), np.asarray(labels).reshape(-1)
    require(pred.shape == labels.shape, "pred", pred.shape, f"must match labels {labels.shape}")
    require(pred.size > 0, "pred", "empty", "must hold at least one frame")
    return float(np.mean(pred == labels))


def utterance_words(
    pred_states_per_utt: Sequence[np.ndarray],
    *,
    words: Sequence[str] = DIGIT_WORDS,
    states_per_word: int = STATES_PER_WORD,
) -> list[str]:
    """One word per utterance by majority vote of its non-silence frames (module docstring).

    Parameters
    ----------
    pred_states_per_utt : sequence of int array
        Predicted class per frame, one array per utterance.
    words : sequence of str
        Word of each word index (the FSDD digits by default).
    states_per_word : int
        States per word ``S`` (3).

    Returns
    -------
    list of str
        The decided word, or ``""`` when every frame was predicted as silence.
    """
    require(states_per_word >= 1, "states_per_word", states_per_word, "must be >= 1")
    hypotheses = []
    for states in pred_states_per_utt:
        states = np.asarray(states).reshape(-1)
        voiced = states[states > 0]
        if voiced.size == 0:
            hypotheses.append("")
            continue
        votes = np.bincount((voiced - 1) // states_per_word, minlength=len(words))
        require(
            len(votes) == len(words),
            "predicted state",
            int(voiced.max()),
            f"is beyond the {len(words)} words x {states_per_word} states",
        )
        hypotheses.append(words[int(np.argmax(votes))])
    return hypotheses


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    r"""Corpus WER :math:`(S + D + I) / N` over all utterances, computed with jiwer.

    ``N`` counts reference words; empty hypotheses count as deletions.

    Raises
    ------
    ConfigError
        Different numbers of references and hypotheses, or no reference words.
    """
    import jiwer

    require(
        len(references) == len(hypotheses),
        "hypotheses",
        len(hypotheses),
        f"must number the same as references ({len(references)})",
    )
    pairs = [(r, h) for r, h in zip(references, hypotheses, strict=True)]
    require(any(r.strip() for r, _ in pairs), "references", "no words", "must contain at least one word")
    out = jiwer.process_words([r for r, _ in pairs], [h for _, h in pairs])
    return float(out.wer)


def state_priors(labels: np.ndarray, n_classes: int, *, floor: float = 1e-5) -> np.ndarray:
    r"""Prior :math:`p(s)` of each class: its relative frequency in ``labels``.

    Every prior is at least ``floor`` (a class absent from training would otherwise get an
    infinite scaled likelihood), then the vector is renormalised to sum to 1.

    Parameters
    ----------
    labels : int array
        Training frame labels in ``[0, n_classes)``.
    n_classes : int
    floor : float
        Smallest prior, in ``(0, 1 / n_classes]``.

    Returns
    -------
    ndarray, shape (n_classes,)
        float64, positive, sums to 1.

    Examples
    --------
    >>> state_priors(np.array([0, 0, 1, 2]), 3).round(3).tolist()
    [0.5, 0.25, 0.25]
    """
    labels = np.asarray(labels).reshape(-1)
    require(isinstance(n_classes, int | np.integer) and n_classes >= 1, "n_classes", n_classes, "must be >= 1")
    require(labels.size > 0, "labels", "empty", "must hold at least one frame")
    require(0 < floor <= 1.0 / n_classes, "floor", floor, f"must be in (0, 1/n_classes = {1.0 / n_classes:.3g}]")
    require(
        int(labels.min()) >= 0 and int(labels.max()) < n_classes,
        "labels",
        (int(labels.min()), int(labels.max())),
        f"must lie in [0, {n_classes})",
    )
    counts = np.bincount(labels, minlength=n_classes).astype(np.float64)
    priors = np.maximum(counts / counts.sum(), floor)
    return priors / priors.sum()


def word_state_classes(n_words: int, states_per_word: int) -> np.ndarray:
    """Class of each position of each word's HMM chain, ``(n_words, S + 2)`` int64.

    Position 0 is the leading silence, ``1 .. S`` the word's states ``w * S + k + 1``,
    ``S + 1`` the trailing silence (class 0 at both ends).

    >>> word_state_classes(2, 3).tolist()
    [[0, 1, 2, 3, 0], [0, 4, 5, 6, 0]]
    """
    require(n_words >= 1, "n_words", n_words, "must be >= 1")
    require(states_per_word >= 1, "states_per_word", states_per_word, "must be >= 1")
    classes = np.zeros((n_words, states_per_word + 2), dtype=np.int64)
    classes[:, 1:-1] = np.arange(n_words)[:, None] * states_per_word + np.arange(states_per_word) + 1
    return classes


def viterbi_word_scores(
    log_likelihoods_per_utt: Sequence[np.ndarray], *, n_words: int, states_per_word: int = STATES_PER_WORD
) -> np.ndarray:
    r"""Best path score :math:`V_w` of every word model for every utterance (module docstring).

    Parameters
    ----------
    log_likelihoods_per_utt : sequence of float array ``(T_u, C)``
        Per-frame log scaled likelihoods (or any per-frame class scores), one array per
        utterance; ``C >= n_words * states_per_word + 1``.
    n_words, states_per_word : int
        Word models and states per word ``S``.

    Returns
    -------
    ndarray, shape (U, n_words)
        float64; ``-inf`` where the utterance has fewer than ``S`` frames.

    Notes
    -----
    The recursion runs over time with all utterances and words at once: with
    :math:`\delta_t[j]` the best score of a path ending in chain position ``j`` at frame ``t``,
    :math:`\delta_t[j] = \max(\delta_{t-1}[j], \delta_{t-1}[j-1]) + e_t[j]`, started in the
    leading silence or the first state and ended in the last state or the trailing silence.
    """
    classes = word_state_classes(n_words, states_per_word)
    arrays = [np.asarray(a, dtype=np.float64) for a in log_likelihoods_per_utt]
    for u, a in enumerate(arrays):
        require(
            a.ndim == 2 and a.shape[0] >= 1,
            f"log-likelihoods of utterance {u}",
            a.shape,
            "must be a non-empty (frames, classes) array",
        )
        require(
            a.shape[1] > int(classes.max()),
            f"log-likelihoods of utterance {u}",
            a.shape,
            f"need at least {int(classes.max()) + 1} classes for {n_words} words x {states_per_word} states",
        )
        require(bool(np.all(np.isfinite(a))), f"log-likelihoods of utterance {u}", "non-finite", "must be finite")
    out = np.empty((len(arrays), n_words))
    for lo in range(0, len(arrays), _VITERBI_CHUNK):
        out[lo : lo + _VITERBI_CHUNK] = _viterbi_chunk(arrays[lo : lo + _VITERBI_CHUNK], classes)
    return out


def _viterbi_chunk(arrays: list[np.ndarray], classes: np.ndarray) -> np.ndarray:
    lengths = np.array([len(a) for a in arrays])
    padded = np.zeros((len(arrays), int(lengths.max()), arrays[0].shape[1]))
    for u, a in enumerate(arrays):
        padded[u, : len(a)] = a
    last = classes.shape[1] - 1  # trailing silence; last - 1 is the word's last state
    delta = np.full((len(arrays),) + classes.shape, -np.inf)
    delta[:, :, :2] = padded[:, 0][:, classes[:, :2]]
    final = np.full((len(arrays), classes.shape[0]), -np.inf)
    for t in range(padded.shape[1]):
        if t > 0:
            delta[:, :, 1:] = np.maximum(delta[:, :, 1:], delta[:, :, :-1])
            delta += padded[:, t][:, classes]
        ends = lengths == t + 1
        final[ends] = np.maximum(delta[ends, :, last - 1], delta[ends, :, last])
    return final


def decode_words(
    log_posteriors_per_utt: Sequence[np.ndarray],
    priors: np.ndarray,
    *,
    words: Sequence[str] = DIGIT_WORDS,
    states_per_word: int = STATES_PER_WORD,
) -> list[str]:
    r"""One word per utterance by Viterbi over the word HMMs on scaled likelihoods.

    Parameters
    ----------
    log_posteriors_per_utt : sequence of float array ``(T_u, C)``
        :math:`\log p(s \mid x_t)` (log-softmax outputs), one array per utterance.
    priors : float array ``(C,)``
        State priors :math:`p(s)` (:func:`state_priors`), all positive.
    words, states_per_word
        As in :func:`utterance_words`.

    Returns
    -------
    list of str
        :math:`\arg\max_w V_w` per utterance, ``""`` when no path exists.
    """
    priors = np.asarray(priors, dtype=np.float64).reshape(-1)
    require(bool(np.all(priors > 0)), "priors", "a value <= 0", "must all be > 0 (use state_priors' floor)")
    log_priors = np.log(priors)
    scaled = []
    for u, post in enumerate(log_posteriors_per_utt):
        post = np.asarray(post, dtype=np.float64)
        require(
            post.ndim == 2 and post.shape[1] == len(priors),
            f"log-posteriors of utterance {u}",
            post.shape,
            f"must be (frames, {len(priors)}) to match the priors",
        )
        scaled.append(post - log_priors)
    scores = viterbi_word_scores(scaled, n_words=len(words), states_per_word=states_per_word)
    best = np.argmax(scores, axis=1)
    return [words[int(b)] if np.isfinite(scores[u, b]) else "" for u, b in enumerate(best)]


def frame_log_posteriors(model: nn.Module, corpus: Corpus, *, window: int, batch: int = 2048) -> np.ndarray:
    """Log-softmax outputs for every frame of ``corpus`` (``(T, C)`` float32), the model in eval mode."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    try:
        with torch.no_grad():
            for x, _ in eval_windows(corpus, window, batch=batch):
                out.append(torch.log_softmax(model(x.to(device)).float(), dim=1).cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(out)


def predict_frames(model: nn.Module, corpus: Corpus, *, window: int, batch: int = 2048) -> np.ndarray:
    """Predicted class of every frame of ``corpus`` (``(T,)`` int64), the model in eval mode."""
    return frame_log_posteriors(model, corpus, window=window, batch=batch).argmax(axis=1)


def score_corpus(
    model: nn.Module,
    corpus: Corpus,
    *,
    window: int,
    batch: int = 2048,
    priors: np.ndarray | None = None,
    words: Sequence[str] = DIGIT_WORDS,
    states_per_word: int = STATES_PER_WORD,
) -> dict[str, Any]:
    """Frame accuracy, cross-entropy and WER of ``model`` on every frame of ``corpus``.

    Parameters
    ----------
    priors : float array ``(C,)``, optional
        State priors from the training labels (:func:`state_priors`); with them the words are
        HMM-decoded (:func:`decode_words`), without them only the majority vote is available.
    Other parameters are as in :func:`frame_log_posteriors` and :func:`decode_words`.

    Returns
    -------
    dict
        ``frame_accuracy``; ``loss`` (mean frame cross-entropy, nats); ``wer_vote`` (majority
        vote); ``wer_viterbi`` (HMM decoding, ``nan`` without ``priors``); ``wer`` (the decoder's
        when ``priors`` are given, else the vote's); WERs are ``nan`` when the corpus has no
        transcripts; ``wer_by_speaker``
        (``{speaker: wer}`` by the ``wer`` rule, only with transcripts); ``n_utterances``.
    """
    log_post = frame_log_posteriors(model, corpus, window=window, batch=batch)
    pred = log_post.argmax(axis=1)
    loss = -float(np.mean(log_post[np.arange(len(pred)), corpus.labels]))
    result: dict[str, Any] = {
        "frame_accuracy": frame_accuracy(pred, corpus.labels),
        "loss": loss,
        "wer": float("nan"),
        "wer_vote": float("nan"),
        "wer_viterbi": float("nan"),
        "n_utterances": corpus.n_utterances,
    }
    if any(t.strip() for t in corpus.transcripts):
        refs = list(corpus.transcripts)
        cuts = corpus.offsets[1:-1]
        votes = utterance_words(np.split(pred, cuts), words=words, states_per_word=states_per_word)
        result["wer_vote"] = result["wer"] = word_error_rate(refs, votes)
        hyps = votes
        if priors is not None:
            hyps = decode_words(np.split(log_post, cuts), priors, words=words, states_per_word=states_per_word)
            result["wer_viterbi"] = result["wer"] = word_error_rate(refs, hyps)
        result["wer_by_speaker"] = _wer_by_speaker(refs, hyps, corpus.speakers)
    return result


def _wer_by_speaker(refs: list[str], hyps: list[str], speakers: Sequence[str]) -> dict[str, float]:
    out = {}
    for spk in sorted(set(speakers)):
        idx = [u for u, s in enumerate(speakers) if s == spk and refs[u].strip()]
        if idx:
            out[spk] = word_error_rate([refs[u] for u in idx], [hyps[u] for u in idx])
    return out
