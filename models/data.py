r"""HDF5 corpora of frame features and frame labels, and the window sampler that feeds training.

File layout (``format_version`` 1), the one every part of psgdlab reads and writes:

==================  ============  ==========================================================
name                kind          content
==================  ============  ==========================================================
``features``        dataset       ``(T, F)`` float16 or float32: all utterances' frames, concatenated
``offsets``         dataset       ``(U + 1,)`` int64: utterance ``u`` is ``offsets[u]:offsets[u+1]``
``labels``          dataset       ``(T,)`` int32 frame labels in ``[0, n_classes)``
``utt_ids``         dataset       ``(U,)`` strings, unique
``speakers``        dataset       ``(U,)`` strings
``transcripts``     dataset       ``(U,)`` strings (may be empty strings)
``format_version``  attribute     1
``n_classes``       attribute     number of label classes
``feature_kind``    attribute     e.g. ``"fbank40"``, ``"synthetic"``, ``"kaldi"``
``frame_shift_s``   attribute     seconds between frames (0.01)
``add_deltas``      attribute     bool: the loader appends Δ and ΔΔ (the file holds static features)
``source``          attribute     optional: where the data came from
``credit``          attribute     optional: attribution the data's licence asks for
==================  ============  ==========================================================

Every utterance has at least one frame, and every feature is finite. :func:`write_corpus`
builds the file in memory and writes it through :func:`psgdlab.core.files.atomic_write_bytes`
(an exclusive temporary file in the target's folder, renamed), so a failed import, a full disk
included, never leaves a partial file. :func:`load_corpus` validates the layout, loads
everything into memory as float32 (a non-finite feature is refused, naming its utterance),
appends Δ/ΔΔ when asked and normalises. :func:`shard_utterances` deals the utterances to the workers.

This module needs h5py and numpy only; the torch batches drawn from a corpus
(:class:`~psgdlab.models.batches.WindowSampler`, :func:`~psgdlab.models.batches.eval_windows`)
are in :mod:`psgdlab.models.batches`.
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np

from psgdlab.core.errors import ConfigError, require
from psgdlab.core.files import atomic_write_bytes

__all__ = [
    "FORMAT_VERSION",
    "DATASETS",
    "Corpus",
    "write_corpus",
    "load_corpus",
    "inspect_corpus",
    "require_finite_corpus",
    "append_deltas",
    "synthetic_corpus",
    "shard_utterances",
    "frame_bounds",
]

FORMAT_VERSION = 1
DATASETS: tuple[str, ...] = ("features", "offsets", "labels", "utt_ids", "speakers", "transcripts")
_ATTRIBUTES: tuple[str, ...] = ("format_version", "n_classes", "feature_kind", "frame_shift_s", "add_deltas")
Normalize = Literal["utterance", "global", "none"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Corpus:
    """A corpus in memory: features ``(T, D)`` float32, labels ``(T,)`` int64, ``offsets`` ``(U+1,)``.

    ``input_dim`` is ``D`` after any Δ/ΔΔ were appended; ``utt_ids``, ``speakers`` and
    ``transcripts`` are tuples of ``U`` strings. Compared by identity (it holds arrays).
    """

    features: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    utt_ids: tuple[str, ...]
    speakers: tuple[str, ...]
    transcripts: tuple[str, ...]
    n_classes: int
    feature_kind: str = ""
    frame_shift_s: float = 0.01
    path: str = ""

    @property
    def input_dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def n_frames(self) -> int:
        return int(self.features.shape[0])

    @property
    def n_utterances(self) -> int:
        return len(self.utt_ids)

    @property
    def lengths(self) -> np.ndarray:
        """Frames per utterance, ``(U,)`` int64."""
        return np.diff(self.offsets)


# --------------------------------------------------------------------------- writing


def write_corpus(
    path: str | os.PathLike[str],
    *,
    features_per_utt: Sequence[np.ndarray],
    labels_per_utt: Sequence[np.ndarray],
    utt_ids: Sequence[str],
    speakers: Sequence[str],
    transcripts: Sequence[str] | None = None,
    n_classes: int,
    feature_kind: str,
    frame_shift_s: float = 0.01,
    add_deltas: bool = False,
    source: str | None = None,
    credit: str | None = None,
    dtype: Literal["float32", "float16"] = "float32",
) -> Path:
    """Write utterances to ``path`` in the layout of this module (atomically).

    Parameters
    ----------
    path : path-like
        Output file; its folder must exist. Written to a temporary name beside it, then renamed.
    features_per_utt : sequence of array, each ``(T_u, F)``
        Frame features per utterance; every utterance needs ``T_u >= 1`` and the same ``F``.
    labels_per_utt : sequence of int array, each ``(T_u,)``
        Frame labels in ``[0, n_classes)``.
    utt_ids, speakers, transcripts : sequence of str
        One per utterance; ``utt_ids`` unique; ``transcripts`` default to empty strings.
    n_classes, feature_kind, frame_shift_s, add_deltas, source, credit
        Stored as attributes (see the module docstring).
    dtype : {"float32", "float16"}
        Storage type of ``features``.

    Returns
    -------
    pathlib.Path
        The written file.

    Raises
    ------
    ConfigError
        Counts differ, an utterance is empty, its feature and label lengths differ (the message
        names the utterance and both lengths), a label is out of range, ids repeat.
    """
    path = Path(path)
    n_utts = len(utt_ids)
    transcripts = [""] * n_utts if transcripts is None else list(transcripts)
    for name, seq in (
        ("features_per_utt", features_per_utt),
        ("labels_per_utt", labels_per_utt),
        ("speakers", speakers),
        ("transcripts", transcripts),
    ):
        require(len(seq) == n_utts, name, f"{len(seq)} entries", f"must have one per utterance ({n_utts})")
    require(n_utts >= 1, "utt_ids", "empty", "must name at least one utterance")
    require(len(set(utt_ids)) == n_utts, "utt_ids", f"{n_utts - len(set(utt_ids))} duplicates", "must be unique")
    require(
        isinstance(n_classes, int | np.integer) and n_classes >= 1, "n_classes", n_classes, "must be a positive integer"
    )
    require(dtype in ("float32", "float16"), "dtype", dtype, "must be 'float32' or 'float16'")
    feats, labels = _check_utterances(features_per_utt, labels_per_utt, utt_ids, int(n_classes))
    offsets = np.zeros(n_utts + 1, dtype=np.int64)
    np.cumsum([len(f) for f in feats], out=offsets[1:])
    attrs: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "n_classes": int(n_classes),
        "feature_kind": feature_kind,
        "frame_shift_s": float(frame_shift_s),
        "add_deltas": bool(add_deltas),
    }
    if source is not None:
        attrs["source"] = source
    if credit is not None:
        attrs["credit"] = credit
    with np.errstate(over="ignore"):  # a value beyond float16 becomes inf, refused below
        features = np.concatenate(feats).astype(dtype)
    if not np.all(np.isfinite(features)):  # the utterances' own values were checked finite above
        raise ConfigError(
            f"features stored as {dtype} ({int(np.sum(~np.isfinite(features)))} values beyond its range, up to "
            f"{max(float(np.max(np.abs(f))) for f in feats):.3g}) must be finite: store them as float32"
        )
    strings = h5py.string_dtype("utf-8")
    # the file is built in memory and written through the one safe writer: HDF5 writing to a
    # full disk itself left its temporary file and crashed the process at exit (SIGSEGV)
    with h5py.File(f"psgdlab-image-of-{path.name}", "w", driver="core", backing_store=False) as f:
        f.create_dataset("features", data=features, chunks=True)
        del features
        f.create_dataset("offsets", data=offsets)
        f.create_dataset("labels", data=np.concatenate(labels).astype(np.int32))
        f.create_dataset("utt_ids", data=list(utt_ids), dtype=strings)
        f.create_dataset("speakers", data=list(speakers), dtype=strings)
        f.create_dataset("transcripts", data=transcripts, dtype=strings)
        f.attrs.update(attrs)
        f.flush()
        image = f.id.get_file_image()
    atomic_write_bytes(path, image)
    return path


def _check_utterances(
    features_per_utt: Sequence[np.ndarray], labels_per_utt: Sequence[np.ndarray], utt_ids: Sequence[str], n_classes: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    feats, labels = [], []
    dim = None
    for utt, f, lab in zip(utt_ids, features_per_utt, labels_per_utt, strict=True):
        f, lab = np.asarray(f), np.asarray(lab)
        require(f.ndim == 2, f"features of utterance {utt!r}", f.shape, "must be 2-D (frames, dims)")
        require(lab.ndim == 1, f"labels of utterance {utt!r}", lab.shape, "must be 1-D")
        require(len(f) >= 1, f"utterance {utt!r}", "0 frames", "must have at least one frame")
        require(
            len(f) == len(lab),
            f"utterance {utt!r}",
            f"{len(f)} feature frames, {len(lab)} labels",
            "must have one label per frame",
        )
        dim = f.shape[1] if dim is None else dim
        require(
            f.shape[1] == dim,
            f"features of utterance {utt!r}",
            f.shape[1],
            f"must have the same dimension as the first utterance ({dim})",
        )
        require(np.issubdtype(lab.dtype, np.integer), f"labels of utterance {utt!r}", lab.dtype, "must be integers")
        require(
            bool(np.all((lab >= 0) & (lab < n_classes))),
            f"labels of utterance {utt!r}",
            f"range [{lab.min()}, {lab.max()}]",
            f"must lie in [0, n_classes={n_classes})",
        )
        require(bool(np.all(np.isfinite(f))), f"features of utterance {utt!r}", "non-finite values", "must be finite")
        feats.append(f)
        labels.append(lab)
    return feats, labels


# --------------------------------------------------------------------------- reading


def _open(path: str | os.PathLike[str]) -> h5py.File:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus file not found: {path}")
    if path.is_dir() or not h5py.is_hdf5(path):
        raise ConfigError(f"corpus file {path} is not an HDF5 file; build one with `psgdlab data`")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise ConfigError(f"corpus file {path} cannot be read as HDF5: {exc}") from exc


def _validate_layout(f: h5py.File, path: Path) -> dict[str, Any]:
    for name in DATASETS:
        if name not in f or not isinstance(f[name], h5py.Dataset):
            raise ConfigError(
                f"corpus file {path}: dataset {name!r} is missing (expected datasets: {', '.join(DATASETS)})"
            )
    for name in _ATTRIBUTES:
        if name not in f.attrs:
            raise ConfigError(f"corpus file {path}: attribute {name!r} is missing")
    attrs = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in f.attrs.items()}
    if attrs["format_version"] != FORMAT_VERSION:
        raise ConfigError(
            f"corpus file {path}: format_version {attrs['format_version']!r} is not "
            f"supported (this psgdlab reads version {FORMAT_VERSION})"
        )
    shape = f["features"].shape
    n_utts = f["utt_ids"].shape[0]
    checks = [
        (len(shape) == 2, f"features has shape {shape}, expected 2-D (frames, dims)"),
        (
            f["labels"].shape == (shape[0],),
            f"labels has shape {f['labels'].shape}, expected ({shape[0]},) (one per feature frame)",
        ),
        (
            f["offsets"].shape == (n_utts + 1,),
            f"offsets has shape {f['offsets'].shape}, expected ({n_utts + 1},) for {n_utts} utterances",
        ),
        (
            f["speakers"].shape == (n_utts,) and f["transcripts"].shape == (n_utts,),
            f"speakers/transcripts must have one entry per utterance ({n_utts})",
        ),
        (
            isinstance(attrs["n_classes"], int) and attrs["n_classes"] >= 1,
            f"n_classes {attrs['n_classes']!r} must be a positive integer",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"corpus file {path}: {message}")
    offsets = f["offsets"][()].astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != shape[0] or np.any(np.diff(offsets) <= 0):
        raise ConfigError(
            f"corpus file {path}: offsets are inconsistent (must start at 0, increase "
            f"strictly and end at the frame count {shape[0]}; got first {offsets[0]}, "
            f"last {offsets[-1]})"
        )
    attrs["offsets"] = offsets
    return attrs


def inspect_corpus(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Validate ``path`` and summarise it without loading the features.

    Returns
    -------
    dict
        ``path, n_utterances, n_frames, feature_dim, input_dim`` (after Δ/ΔΔ), ``n_classes``,
        ``classes_present``, ``n_speakers``, ``speakers`` (name -> utterances), ``duration_s``,
        ``feature_kind``, ``feature_dtype``, ``frame_shift_s``, ``add_deltas``, ``source``, ``credit``.
    """
    path = Path(path)
    with _open(path) as f:
        attrs = _validate_layout(f, path)
        labels = f["labels"][()]
        speakers = f["speakers"].asstr()[()]
        dim = int(f["features"].shape[1])
        dtype = str(f["features"].dtype)
    names, counts = np.unique(speakers, return_counts=True)
    add_deltas = bool(attrs["add_deltas"])
    return {
        "path": str(path),
        "n_utterances": len(speakers),
        "n_frames": len(labels),
        "feature_dim": dim,
        "input_dim": dim * 3 if add_deltas else dim,
        "n_classes": int(attrs["n_classes"]),
        "classes_present": len(np.unique(labels)),
        "n_speakers": len(names),
        "speakers": {str(n): int(c) for n, c in zip(names, counts, strict=True)},
        "duration_s": float(len(labels) * attrs["frame_shift_s"]),
        "feature_kind": str(attrs["feature_kind"]),
        "feature_dtype": dtype,
        "frame_shift_s": float(attrs["frame_shift_s"]),
        "add_deltas": add_deltas,
        "source": str(attrs.get("source", "")),
        "credit": str(attrs.get("credit", "")),
    }


def require_finite_corpus(path: str | os.PathLike[str], *, rows_per_read: int = 1 << 18) -> None:
    """Refuse (one-line :class:`ConfigError`, naming the utterance) a corpus file whose features
    hold a NaN or an infinity, reading them ``rows_per_read`` frames at a time (a launcher's check
    before its ranks start: memory stays small whatever the corpus's size)."""
    path = Path(path)
    with _open(path) as f:
        attrs = _validate_layout(f, path)
        features = f["features"]
        for start in range(0, features.shape[0], rows_per_read):
            block = features[start : start + rows_per_read]
            bad = ~np.isfinite(block)
            if bad.any():
                row = start + int(np.argmax(bad.any(axis=1)))
                utt = int(np.searchsorted(attrs["offsets"], row, side="right")) - 1
                name = f["utt_ids"].asstr()[utt]
                raise ConfigError(
                    f"corpus file {path}: features of utterance {name!r} hold non-finite values (NaN or inf): "
                    "a corpus must hold finite features"
                )


def load_corpus(
    path: str | os.PathLike[str],
    *,
    add_deltas: bool | None = None,
    normalize: Normalize = "utterance",
    speakers: Sequence[str] | None = None,
    exclude_speakers: Sequence[str] | None = None,
) -> Corpus:
    r"""Load and validate a corpus file into memory (float32).

    Parameters
    ----------
    path : path-like
        A file in the layout of this module.
    add_deltas : bool, optional
        Append Δ and ΔΔ (:func:`append_deltas`); ``None`` follows the file's ``add_deltas``
        attribute.
    normalize : {"utterance", "global", "none"}
        Mean and variance normalisation of every dimension, per utterance (CMVN; removes
        channel and speaker offsets), over the loaded frames, or none. Applied after Δ/ΔΔ.
        ``"global"`` uses the statistics of the frames loaded by *this* call.
    speakers, exclude_speakers : sequence of str, optional
        Keep only these speakers' utterances / drop these speakers' utterances. A named speaker
        absent from the file is an error (it is usually a typo).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist (the message holds the path).
    ConfigError
        Not HDF5, a dataset or attribute missing (named), unsupported ``format_version``,
        inconsistent shapes or offsets, labels out of range, unknown speaker, nothing selected.
    """
    require(
        normalize in ("utterance", "global", "none"), "normalize", normalize, "must be 'utterance', 'global' or 'none'"
    )
    path = Path(path)
    with _open(path) as f:
        attrs = _validate_layout(f, path)
        offsets = attrs["offsets"]
        spk = tuple(str(s) for s in f["speakers"].asstr()[()])
        keep = _select(spk, speakers, exclude_speakers, path)
        if len(keep) == len(spk):
            features = f["features"][()].astype(np.float32, copy=False)
            labels = f["labels"][()].astype(np.int64)
        else:
            frames = np.concatenate([np.arange(offsets[u], offsets[u + 1]) for u in keep])
            features = f["features"][()][frames].astype(np.float32, copy=False)
            labels = f["labels"][()][frames].astype(np.int64)
        utt_ids = tuple(str(s) for s in f["utt_ids"].asstr()[()])
        transcripts = tuple(str(s) for s in f["transcripts"].asstr()[()])
    n_classes = int(attrs["n_classes"])
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise ConfigError(
            f"corpus file {path}: labels range [{labels.min()}, {labels.max()}] lies outside [0, n_classes={n_classes})"
        )
    lengths = np.diff(offsets)[keep]
    new_offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    _require_finite(features, new_offsets, [utt_ids[u] for u in keep], path)
    if attrs["add_deltas"] if add_deltas is None else add_deltas:
        features = append_deltas(features, new_offsets)
    features = _normalize(features, new_offsets, normalize)
    return Corpus(
        features=features,
        labels=labels,
        offsets=new_offsets,
        utt_ids=tuple(utt_ids[u] for u in keep),
        speakers=tuple(spk[u] for u in keep),
        transcripts=tuple(transcripts[u] for u in keep),
        n_classes=n_classes,
        feature_kind=str(attrs["feature_kind"]),
        frame_shift_s=float(attrs["frame_shift_s"]),
        path=str(path),
    )


def _require_finite(features: np.ndarray, offsets: np.ndarray, utt_ids: Sequence[str], path: Path) -> None:
    """Refuse features that are NaN or infinite (a NaN feature trains to a NaN loss), naming the
    first utterance that holds one (``offsets``: the utterances of ``features``, ``utt_ids``
    their names)."""
    bad = ~np.isfinite(features)
    if not bad.any():
        return
    row = int(np.argmax(bad.any(axis=1)))
    utt = utt_ids[int(np.searchsorted(offsets, row, side="right")) - 1]
    raise ConfigError(
        f"corpus file {path}: features of utterance {utt!r} hold non-finite values (NaN or inf; "
        f"{int(bad.sum())} in the frames loaded): a corpus must hold finite features"
    )


def _select(
    spk: tuple[str, ...], speakers: Sequence[str] | None, exclude: Sequence[str] | None, path: Path
) -> np.ndarray:
    known = set(spk)
    for label, names in (("speakers", speakers), ("exclude_speakers", exclude)):
        unknown = sorted(set(names or ()) - known)
        require(not unknown, label, unknown, f"are not speakers of {path}", hint="known: " + ", ".join(sorted(known)))
    mask = np.ones(len(spk), dtype=bool)
    if speakers is not None:
        mask &= np.isin(np.array(spk, dtype=object), list(speakers))
    if exclude is not None:
        mask &= ~np.isin(np.array(spk, dtype=object), list(exclude))
    keep = np.flatnonzero(mask)
    require(
        len(keep) > 0,
        "speaker selection",
        {"speakers": speakers, "exclude": exclude},
        f"leaves no utterances of {path}",
    )
    return keep


def frame_bounds(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last frame index of each frame's utterance, ``(T,)`` each.

    >>> frame_bounds(np.array([0, 2, 5]))
    (array([0, 0, 2, 2, 2]), array([1, 1, 4, 4, 4]))
    """
    lengths = np.diff(offsets)
    return np.repeat(offsets[:-1], lengths), np.repeat(offsets[1:] - 1, lengths)


def _delta(features: np.ndarray, first: np.ndarray, last: np.ndarray, width: int) -> np.ndarray:
    t = np.arange(len(features))
    out = np.zeros_like(features)
    for n in range(1, width + 1):
        ahead = features[np.minimum(t + n, last)]
        behind = features[np.maximum(t - n, first)]
        out += n * (ahead - behind)
    return out / (2 * sum(n * n for n in range(1, width + 1)))


def append_deltas(features: np.ndarray, offsets: np.ndarray, *, width: int = 2) -> np.ndarray:
    r"""Append Δ and ΔΔ to every utterance's features: ``(T, F) -> (T, 3F)``.

    The standard regression formula (HTK, Kaldi ``add-deltas``) with :math:`N` = ``width``:

    .. math::

        \Delta c_t = \frac{\sum_{n=1}^{N} n\,(c_{t+n} - c_{t-n})}{2\sum_{n=1}^{N} n^2},
        \qquad \Delta\Delta c_t = \Delta(\Delta c)_t,

    computed within each utterance, with the first and last frame repeated beyond its edges.
    """
    require(isinstance(width, int) and width >= 1, "width", width, "must be a positive integer")
    first, last = frame_bounds(np.asarray(offsets, dtype=np.int64))
    d1 = _delta(features, first, last, width)
    d2 = _delta(d1, first, last, width)
    return np.concatenate([features, d1, d2], axis=1).astype(np.float32, copy=False)


def _normalize(features: np.ndarray, offsets: np.ndarray, normalize: Normalize) -> np.ndarray:
    if normalize == "none":
        return features
    x = features.astype(np.float64)
    if normalize == "global":
        mean, std = x.mean(axis=0), x.std(axis=0)
        return ((x - mean) / np.maximum(std, 1e-5)).astype(np.float32)
    lengths = np.diff(offsets)[:, None]
    mean = np.add.reduceat(x, offsets[:-1], axis=0) / lengths
    var = np.add.reduceat(x * x, offsets[:-1], axis=0) / lengths - mean**2
    std = np.sqrt(np.maximum(var, 0.0))
    frames = np.repeat(np.arange(len(lengths)), lengths[:, 0])
    return ((x - mean[frames]) / np.maximum(std[frames], 1e-5)).astype(np.float32)


# --------------------------------------------------------------------------- synthetic data


def synthetic_corpus(
    path: str | os.PathLike[str],
    *,
    n_utterances: int = 200,
    frames_per_utt: int = 100,
    input_dim: int = 40,
    n_classes: int = 10,
    seed: int = 0,
    n_speakers: int = 4,
    noise: float = 1.0,
) -> Path:
    r"""Write a learnable synthetic acoustic corpus to ``path`` (``feature_kind="synthetic"``).

    Each utterance is a sequence of label segments (lengths uniform in 4..12 frames, class drawn
    uniformly). A frame's features are

    .. math::

        x_t = \mu_{y_t} + b_s + \sigma\,\tilde\varepsilon_t,

    with class means :math:`\mu_k \sim N(0, I)`, a speaker offset :math:`b_s \sim N(0, 0.25 I)`
    and noise :math:`\tilde\varepsilon` (unit-variance Gaussian smoothed over 3 frames, so
    neighbouring frames are correlated like real speech features). Labels are recoverable from a
    window far better than chance, so training loss really falls; with ``noise`` = 1 a single frame
    is ambiguous and context helps. Utterance lengths are uniform in
    ``[0.75, 1.25] * frames_per_utt``. Transcripts are empty. Deterministic in ``seed``.
    """
    for name, value in (
        ("n_utterances", n_utterances),
        ("frames_per_utt", frames_per_utt),
        ("input_dim", input_dim),
        ("n_classes", n_classes),
        ("n_speakers", n_speakers),
    ):
        require(isinstance(value, int) and value >= 1, name, value, "must be a positive integer")
    require(n_classes >= 2, "n_classes", n_classes, "must be >= 2")
    require(noise >= 0, "noise", noise, "must be >= 0")
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((n_classes, input_dim))
    offsets = 0.5 * rng.standard_normal((n_speakers, input_dim))
    feats, labels, speakers = [], [], []
    lo, hi = max(1, round(0.75 * frames_per_utt)), max(1, round(1.25 * frames_per_utt))
    for u in range(n_utterances):
        length = int(rng.integers(lo, hi + 1))
        seg_lengths = rng.integers(4, 13, size=length // 4 + 1)
        seg_classes = rng.integers(0, n_classes, size=len(seg_lengths))
        y = np.repeat(seg_classes, seg_lengths)[:length]
        eps = rng.standard_normal((length + 2, input_dim))
        smooth = (eps[:-2] + eps[1:-1] + eps[2:]) / math.sqrt(3.0)
        spk = u % n_speakers
        feats.append((means[y] + offsets[spk] + noise * smooth).astype(np.float32))
        labels.append(y.astype(np.int32))
        speakers.append(f"spk{spk:02d}")
    return write_corpus(
        path,
        features_per_utt=feats,
        labels_per_utt=labels,
        utt_ids=[f"synth{u:05d}" for u in range(n_utterances)],
        speakers=speakers,
        n_classes=n_classes,
        feature_kind="synthetic",
        add_deltas=False,
        source=f"psgdlab synthetic_corpus(seed={seed})",
    )


# --------------------------------------------------------------------------- sharding


def shard_utterances(lengths: np.ndarray, *, rank: int, world_size: int) -> np.ndarray:
    """Utterance indices of ``rank``'s shard: a deterministic, frame-balanced partition.

    Longest-processing-time-first: utterances sorted by length (longest first, ties by index) are
    dealt one by one to the shard with the fewest frames so far (ties: lowest rank). Every
    utterance lands in exactly one shard, shards differ by at most one utterance's length in frames,
    and the result depends only on the lengths and ``world_size`` (not on seeds), so all ranks
    agree without communicating. Returned indices are sorted.

    Raises
    ------
    ConfigError
        ``world_size < 1``, ``rank`` outside ``[0, world_size)``, or more workers than utterances.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    require(isinstance(world_size, int) and world_size >= 1, "world_size", world_size, "must be a positive integer")
    require(isinstance(rank, int) and 0 <= rank < world_size, "rank", rank, f"must lie in [0, world_size={world_size})")
    require(
        world_size <= len(lengths),
        "world_size",
        world_size,
        f"must not exceed the number of utterances ({len(lengths)}); every worker needs data",
    )
    heap = [(0, r) for r in range(world_size)]
    owner = np.empty(len(lengths), dtype=np.int64)
    for u in np.argsort(-lengths, kind="stable"):
        frames, r = heapq.heappop(heap)
        owner[u] = r
        heapq.heappush(heap, (frames + int(lengths[u]), r))
    return np.flatnonzero(owner == rank)
