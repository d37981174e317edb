r"""Scoring a frame classifier: frame accuracy, words from frame states, word error rate.

For isolated-word corpora labelled as in :func:`psgdlab.runtime.speech.vad_labels` (class 0 =
silence, classes ``word * S + k + 1`` = state ``k`` of word ``word``), :func:`utterance_words`
turns an utterance's predicted frame states into one word: the **majority vote** of
:math:`\lfloor (s - 1) / S \rfloor` over the frames predicted as non-silence (ties go to the
smaller word index). An utterance with no non-silence frame yields the empty hypothesis
(a deletion). This replaces a decoder (HMM + lexicon + language model), so its WER is a
sanity measure of the acoustic model, not a recogniser's WER.

:func:`word_error_rate` is computed with jiwer over whole transcripts, so continuous-speech
corpora score the same way once a decoder produces hypotheses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from psgdlab.core.errors import require
from psgdlab.runtime.data import Corpus, eval_windows
from psgdlab.runtime.speech import DIGIT_WORDS, STATES_PER_WORD

__all__ = ["frame_accuracy", "utterance_words", "word_error_rate", "predict_frames", "score_corpus"]


def frame_accuracy(pred: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor) -> float:
    """Fraction of frames whose predicted class equals the label."""
    pred, labels = np.asarray(pred).reshape(-1), np.asarray(labels).reshape(-1)
    require(pred.shape == labels.shape, "pred", pred.shape, f"must match labels {labels.shape}")
    require(pred.size > 0, "pred", "empty", "must hold at least one frame")
    return float(np.mean(pred == labels))


def utterance_words(pred_states_per_utt: Sequence[np.ndarray], *,
                    words: Sequence[str] = DIGIT_WORDS,
                    states_per_word: int = STATES_PER_WORD) -> list[str]:
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
        require(len(votes) == len(words), "predicted state", int(voiced.max()),
                f"is beyond the {len(words)} words x {states_per_word} states")
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

    require(len(references) == len(hypotheses), "hypotheses", len(hypotheses),
            f"must number the same as references ({len(references)})")
    pairs = [(r, h) for r, h in zip(references, hypotheses, strict=True)]
    require(any(r.strip() for r, _ in pairs), "references", "no words",
            "must contain at least one word")
    out = jiwer.process_words([r for r, _ in pairs], [h for _, h in pairs])
    return float(out.wer)


def predict_frames(model: nn.Module, corpus: Corpus, *, window: int, batch: int = 2048) -> np.ndarray:
    """Predicted class of every frame of ``corpus`` (``(T,)`` int64), the model in eval mode."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    preds = []
    try:
        with torch.no_grad():
            for x, _ in eval_windows(corpus, window, batch=batch):
                preds.append(model(x.to(device)).argmax(dim=1).cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(preds)


def score_corpus(model: nn.Module, corpus: Corpus, *, window: int, batch: int = 2048,
                 words: Sequence[str] = DIGIT_WORDS,
                 states_per_word: int = STATES_PER_WORD) -> dict[str, Any]:
    """Frame accuracy and WER of ``model`` on every frame of ``corpus``.

    Returns
    -------
    dict
        ``frame_accuracy``, ``wer`` (``nan`` when the corpus has no transcripts) and
        ``n_utterances``.
    """
    pred = predict_frames(model, corpus, window=window, batch=batch)
    result: dict[str, Any] = {"frame_accuracy": frame_accuracy(pred, corpus.labels),
                              "wer": float("nan"), "n_utterances": corpus.n_utterances}
    if any(t.strip() for t in corpus.transcripts):
        per_utt = np.split(pred, corpus.offsets[1:-1])
        hyps = utterance_words(per_utt, words=words, states_per_word=states_per_word)
        result["wer"] = word_error_rate(list(corpus.transcripts), hyps)
    return result
