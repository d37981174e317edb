"""Torch batches drawn from an in-memory corpus: random training windows and every frame in order.

A *window* is ``window`` consecutive frames (odd) labelled by its centre frame; frames beyond an
utterance's edge repeat its first or last frame. :class:`WindowSampler` shards the utterances
across workers (:func:`~psgdlab.models.data.shard_utterances`) and draws random windows of one
shard; :func:`eval_windows` walks every frame of a corpus in order. The corpus format and its
I/O are in :mod:`psgdlab.models.data` (no torch there).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from psgdlab.core.errors import require
from psgdlab.models.data import Corpus, frame_bounds, shard_utterances

__all__ = ["WindowSampler", "eval_windows"]


def _windows(features: np.ndarray, centres: np.ndarray, first: np.ndarray, last: np.ndarray, window: int) -> np.ndarray:
    half = window // 2
    idx = centres[:, None] + np.arange(-half, half + 1)[None, :]
    np.clip(idx, first[:, None], last[:, None], out=idx)
    return features[idx]


class WindowSampler:
    """Random ``window``-frame windows from one worker's shard, labelled by their centre frame.

    Parameters
    ----------
    corpus : Corpus
        The loaded corpus (all workers load the same file).
    window : int
        Frames per window, odd (21 as in the IBM setup).
    batch : int
        Windows per :meth:`sample`.
    rank, world_size : int
        This worker's shard (:func:`shard_utterances`: no overlap, all utterances covered).
    seed : int
        Stream seed shared by all ranks; step ``k`` of rank ``r`` uses
        ``default_rng(SeedSequence([seed, r, k]))``, so a run is reproducible and resumes exactly
        from any step without replaying earlier ones.

    Notes
    -----
    A batch's centres are drawn uniformly (with replacement) over the shard's frames, so every
    frame is equally likely to be the labelled centre; frames beyond an utterance's edge are
    filled by repeating its first or last frame. An *epoch* is
    ``samples_per_epoch = shard_frames // window`` windows: as many as the shard's
    non-overlapping ``window``-frame subsequences (the IBM definition; ALGORITHMS §D.4).
    """

    def __init__(
        self, corpus: Corpus, *, window: int = 21, batch: int, rank: int = 0, world_size: int = 1, seed: int = 0
    ) -> None:
        require(
            isinstance(window, int) and window >= 1 and window % 2 == 1,
            "window",
            window,
            "must be an odd positive integer",
        )
        require(isinstance(batch, int) and batch >= 1, "batch", batch, "must be a positive integer")
        require(isinstance(seed, int) and seed >= 0, "seed", seed, "must be a non-negative integer")
        self.corpus, self.window, self.batch, self.seed = corpus, window, batch, seed
        self.rank, self.world_size = rank, world_size
        self.utterances = shard_utterances(corpus.lengths, rank=rank, world_size=world_size)
        self._starts = corpus.offsets[self.utterances]
        self._ends = corpus.offsets[self.utterances + 1]
        self._cum = np.concatenate([[0], np.cumsum(self._ends - self._starts)])
        self.n_frames = int(self._cum[-1])

    @property
    def samples_per_epoch(self) -> int:
        """Windows per epoch on this shard: its non-overlapping ``window``-frame subsequences."""
        return max(1, self.n_frames // self.window)

    def steps_per_epoch(self, batch: int | None = None) -> int:
        """``ceil(samples_per_epoch / batch)`` (``batch`` defaults to the sampler's)."""
        return math.ceil(self.samples_per_epoch / (self.batch if batch is None else batch))

    def sample(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch of step ``step``: ``x`` float32 ``(batch, window, D)``, ``y`` int64 ``(batch,)``."""
        require(isinstance(step, int | np.integer) and step >= 0, "step", step, "must be a non-negative integer")
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.rank, int(step)]))
        r = rng.integers(0, self.n_frames, size=self.batch)
        u = np.searchsorted(self._cum, r, side="right") - 1
        centres = self._starts[u] + (r - self._cum[u])
        x = _windows(self.corpus.features, centres, self._starts[u], self._ends[u] - 1, self.window)
        return torch.from_numpy(x), torch.from_numpy(self.corpus.labels[centres])


def eval_windows(corpus: Corpus, window: int, *, batch: int = 4096) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Every frame of every utterance, in order, as windows: yields ``(x, y)`` batches.

    Concatenating the batches gives ``corpus.n_frames`` windows whose centres are frames
    ``0, 1, ..., T-1``, so predictions line up with ``corpus.labels`` and ``corpus.offsets``.
    """
    require(
        isinstance(window, int) and window >= 1 and window % 2 == 1, "window", window, "must be an odd positive integer"
    )
    require(isinstance(batch, int) and batch >= 1, "batch", batch, "must be a positive integer")
    first, last = frame_bounds(corpus.offsets)
    for start in range(0, corpus.n_frames, batch):
        centres = np.arange(start, min(start + batch, corpus.n_frames))
        x = _windows(corpus.features, centres, first[centres], last[centres], window)
        yield torch.from_numpy(x), torch.from_numpy(corpus.labels[centres])
