r"""Speech corpora: stand-in frame labels and the importers (FSDD, Kaldi).

The features come from the front end of :mod:`psgdlab.models.frontend` (FSDD: 40 log-mel
filterbank coefficients per 10 ms frame; Δ and ΔΔ are appended when the corpus is loaded,
attribute ``add_deltas``).

Frame labels without alignments
-------------------------------
Hybrid acoustic models are trained on HMM-state alignments produced by a previous recogniser.
The Free Spoken Digit Dataset has none, so :func:`vad_labels` builds a **stand-in**: an energy
voice-activity detector finds the first and last voiced frame; frames outside that region are
silence (class 0); the region is cut into 3 equal segments, giving the states
``digit * 3 + k + 1`` (k = 0, 1, 2) of a 3-state left-to-right word model, 31 classes in all.
This imitates the shape of a forced alignment (silence, then the word's states in order, then
silence) with uniform state durations; it is not an alignment, and frame accuracies on it are not
comparable with published ones.

Importers
---------
:func:`import_fsdd` (WAV files named ``{digit}_{speaker}_{index}.wav``, 8 kHz) and
:func:`import_kaldi` (Kaldi ``feats.scp``/ark plus frame alignments, read with kaldiio) write the
HDF5 layout of :mod:`psgdlab.models.data`; bad input raises one clear error naming the file or
utterance, and no partial output is left behind.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from scipy.io import wavfile

from psgdlab.core.errors import ConfigError, require
from psgdlab.models.data import write_corpus
from psgdlab.models.frontend import frame_energy_db, log_mel_filterbank, speed_perturb

__all__ = [
    "DIGIT_WORDS",
    "FSDD_SAMPLE_RATE",
    "FSDD_CREDIT",
    "STATES_PER_WORD",
    "VAD_THRESHOLD_DB",
    "vad_labels",
    "read_wav",
    "base_speaker",
    "import_fsdd",
    "import_kaldi",
]

DIGIT_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
FSDD_SAMPLE_RATE = 8000
STATES_PER_WORD = 3
VAD_THRESHOLD_DB = 25.0
"""A frame is voiced when its energy is within this many dB of the utterance's loudest frame."""
SILENCE_FLOOR_DB = -75.0
"""A recording whose loudest frame is below this (dB re full scale) has no speech at all."""
FSDD_CREDIT = (
    "Free Spoken Digit Dataset (Jakobovski et al., "
    "https://github.com/Jakobovski/free-spoken-digit-dataset), CC BY-SA 4.0; "
    "features derived from it are shared under the same licence"
)
_FSDD_NAME = re.compile(r"^(?P<digit>[0-9])_(?P<speaker>[A-Za-z0-9]+)_(?P<index>[0-9]+)\.wav$")


# --------------------------------------------------------------------------- stand-in labels


def vad_labels(
    energy_db: np.ndarray, digit: int, *, threshold_db: float = VAD_THRESHOLD_DB, states_per_word: int = STATES_PER_WORD
) -> np.ndarray:
    r"""Stand-in frame labels of one isolated-word utterance (see the module docstring).

    Voiced frames: :math:`e_t \ge \max_s e_s - \text{threshold\_db}`. With :math:`a` and
    :math:`b` the first and last voiced frame and :math:`n = b - a + 1`, frame :math:`t` gets

    .. math::

        y_t = \begin{cases}
        \text{digit}\cdot S + \lfloor S (t - a) / n \rfloor + 1 & a \le t \le b \\
        0 & \text{otherwise,}
        \end{cases}

    so the region splits into :math:`S` = ``states_per_word`` segments whose lengths differ by at
    most one frame. Frames inside the region below the threshold (a stop closure, say) keep the
    word's state.

    Raises
    ------
    ConfigError
        The loudest frame is below ``SILENCE_FLOOR_DB`` (a silent recording) or ``digit`` < 0.
    """
    energy_db = np.asarray(energy_db, dtype=np.float64)
    require(energy_db.ndim == 1 and len(energy_db) >= 1, "energy_db", energy_db.shape, "must be a non-empty 1-D array")
    require(isinstance(digit, int | np.integer) and digit >= 0, "digit", digit, "must be >= 0")
    peak = float(energy_db.max())
    require(
        peak >= SILENCE_FLOOR_DB,
        "recording",
        f"peak {peak:.1f} dBFS",
        f"has no speech (loudest frame below {SILENCE_FLOOR_DB} dBFS)",
    )
    voiced = np.flatnonzero(energy_db >= peak - threshold_db)
    first, last = int(voiced[0]), int(voiced[-1])
    labels = np.zeros(len(energy_db), dtype=np.int32)
    t = np.arange(first, last + 1)
    labels[first : last + 1] = digit * states_per_word + (states_per_word * (t - first)) // len(t) + 1
    return labels


# --------------------------------------------------------------------------- FSDD


def read_wav(path: str | os.PathLike[str]) -> tuple[int, np.ndarray]:
    """Read a WAV file as ``(sample_rate, mono float64 signal in [-1, 1])``.

    Raises
    ------
    ConfigError
        Empty (0 bytes) or unreadable file, or a file without samples; the message names it.
    """
    path = Path(path)
    if path.stat().st_size == 0:
        raise ConfigError(f"{path}: empty file (0 bytes), expected a WAV recording")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", wavfile.WavFileWarning)
            rate, data = wavfile.read(path)
    except (ValueError, EOFError, OSError) as exc:
        raise ConfigError(f"{path}: not a readable WAV file ({exc})") from exc
    if data.size == 0:
        raise ConfigError(f"{path}: WAV file has no samples (zero-length recording)")
    if data.dtype.kind in "iu":
        half_range = float(2 ** (8 * data.dtype.itemsize - 1))  # 32768 for int16
        centre = half_range if data.dtype.kind == "u" else 0.0  # 8-bit WAV is unsigned
        signal = (data.astype(np.float64) - centre) / half_range
    else:
        signal = data.astype(np.float64)
    if signal.ndim == 2:
        signal = signal.mean(axis=1)
    return int(rate), signal


def _fsdd_files(directory: Path) -> list[Path]:
    if not directory.exists():
        raise FileNotFoundError(f"FSDD folder not found: {directory}")
    folder = directory / "recordings" if (directory / "recordings").is_dir() else directory
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".wav")
    require(
        len(files) > 0,
        "FSDD folder",
        str(directory),
        "holds no .wav files (expected recordings/{digit}_{speaker}_{index}.wav)",
    )
    return files


def _parse_fsdd_name(path: Path) -> tuple[int, str, int]:
    match = _FSDD_NAME.match(path.name)
    if match is None:
        raise ConfigError(
            f"{path}: file name does not match {{digit}}_{{speaker}}_{{index}}.wav (for example 7_theo_12.wav)"
        )
    return int(match["digit"]), match["speaker"], int(match["index"])


def import_fsdd(
    directory: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    progress: bool = True,
    threshold_db: float = VAD_THRESHOLD_DB,
    speed_factors: Sequence[float] = (1.0,),
) -> Path:
    """Import the Free Spoken Digit Dataset into an HDF5 corpus.

    Parameters
    ----------
    directory : path-like
        The FSDD folder holding ``recordings/`` or the ``recordings`` folder itself; every
        ``*.wav`` in it must be named ``{digit}_{speaker}_{index}.wav``.
    out_path : path-like
        Output HDF5 (``feature_kind="fbank40"``, ``add_deltas=True``, 31 classes, transcripts
        ``"zero"`` ... ``"nine"``, attribute ``credit`` crediting the FSDD, CC BY-SA 4.0).
    progress : bool
        tqdm progress bar on stderr.
    threshold_db : float
        VAD threshold of :func:`vad_labels`.
    speed_factors : sequence of float
        Speed perturbation (:func:`~psgdlab.models.frontend.speed_perturb`): each recording is
        imported once per factor. Copies with factor ``f != 1`` get the Kaldi-style id ``sp{f}-{utt}`` and speaker
        ``sp{f}-{speaker}`` (a perturbed voice counts as another speaker), so held-out splits must
        exclude them too (:func:`base_speaker` maps them back).

    Raises
    ------
    FileNotFoundError
        ``directory`` does not exist.
    ConfigError
        A recording is not 8 kHz, empty, unreadable, silent or badly named (one line naming it).
        Everything is read and checked before the output is written, so no partial file is left.
    """
    from tqdm import tqdm

    files = _fsdd_files(Path(directory))
    parsed = [(_parse_fsdd_name(p), p) for p in files]
    parsed.sort(key=lambda item: (item[0][1], item[0][0], item[0][2]))
    factors = [float(f) for f in speed_factors]
    require(
        len(factors) >= 1 and len(set(factors)) == len(factors),
        "speed_factors",
        factors,
        "must be a non-empty list of distinct factors",
    )
    for factor in factors:
        require(0.5 <= factor <= 2.0, "speed factor", factor, "must lie in [0.5, 2]")
    feats, labels, utt_ids, speakers, transcripts = [], [], [], [], []
    for (digit, speaker, index), path in tqdm(parsed, desc="fsdd", unit="file", file=sys.stderr, disable=not progress):
        rate, signal = read_wav(path)
        if rate != FSDD_SAMPLE_RATE:
            raise ConfigError(
                f"{path}: sample rate {rate} Hz, expected {FSDD_SAMPLE_RATE} Hz (FSDD recordings are 8 kHz)"
            )
        for factor in factors:
            prefix = "" if factor == 1.0 else f"sp{factor:g}-"
            perturbed = speed_perturb(signal, factor)
            try:
                labels.append(vad_labels(frame_energy_db(perturbed, rate), digit, threshold_db=threshold_db))
            except ConfigError as exc:
                raise ConfigError(f"{path}: {exc}") from exc
            feats.append(log_mel_filterbank(perturbed, rate))
            utt_ids.append(f"{prefix}{digit}_{speaker}_{index}")
            speakers.append(prefix + speaker)
            transcripts.append(DIGIT_WORDS[digit])
    return write_corpus(
        out_path,
        features_per_utt=feats,
        labels_per_utt=labels,
        utt_ids=utt_ids,
        speakers=speakers,
        transcripts=transcripts,
        n_classes=len(DIGIT_WORDS) * STATES_PER_WORD + 1,
        feature_kind="fbank40",
        frame_shift_s=0.01,
        add_deltas=True,
        source=f"Free Spoken Digit Dataset WAV files from {Path(directory)}",
        credit=FSDD_CREDIT,
    )


def base_speaker(speaker: str) -> str:
    """The original speaker of a speed-perturbed copy: ``"sp0.9-theo" -> "theo"``."""
    match = re.match(r"^sp[0-9.]+-(.+)$", speaker)
    return match.group(1) if match else speaker


# --------------------------------------------------------------------------- Kaldi


def _read_table(path: Path, what: str) -> Iterator[tuple[str, np.ndarray]]:
    import kaldiio

    if not path.exists():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        if path.suffix == ".scp":
            yield from kaldiio.load_scp(str(path)).items()
        else:
            yield from kaldiio.load_ark(str(path))
    except (ValueError, OSError, EOFError, KeyError) as exc:
        raise ConfigError(f"{what} {path} cannot be read with kaldiio: {exc}") from exc


def _read_alignments(path: Path) -> dict[str, np.ndarray]:
    if path.suffix in (".scp", ".ark"):
        return {
            key: np.asarray(value).astype(np.int64).reshape(-1) for key, value in _read_table(path, "alignment file")
        }
    if not path.exists():
        raise FileNotFoundError(f"alignment file not found: {path}")
    alignments: dict[str, np.ndarray] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        try:
            alignments[fields[0]] = np.array([int(s) for s in fields[1:]], dtype=np.int64)
        except ValueError as exc:
            raise ConfigError(f"{path}:{number}: alignment of {fields[0]!r} holds a non-integer state ({exc})") from exc
    return alignments


def _read_text_map(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    pairs = (line.split(maxsplit=1) for line in path.read_text().splitlines() if line.strip())
    return {p[0]: (p[1].strip() if len(p) > 1 else "") for p in pairs}


def import_kaldi(
    feats_scp: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    alignments: str | os.PathLike[str],
    n_classes: int | None = None,
    add_deltas: bool = False,
    progress: bool = False,
) -> Path:
    """Import Kaldi features and frame alignments into an HDF5 corpus (``feature_kind="kaldi"``).

    Parameters
    ----------
    feats_scp : path-like
        ``feats.scp`` (or an ark) of float matrices, read with kaldiio. When the folder holds
        Kaldi's ``utt2spk`` and ``text`` files, speakers and transcripts come from them;
        otherwise each utterance is its own speaker and transcripts are empty.
    out_path : path-like
        Output HDF5 file.
    alignments : path-like
        Frame labels: a text file of lines ``utt-id s1 s2 ...`` (one integer state per frame), or
        a kaldiio-readable ``.ark``/``.scp`` of integer vectors (e.g. ``ali-to-pdf`` output).
        Alignments of utterances absent from the features are ignored.
    n_classes : int, optional
        Number of states; defaults to the largest label + 1.
    add_deltas : bool
        Stored attribute: whether loaders append Δ/ΔΔ (False for features that already have them).
    progress : bool
        tqdm progress bar on stderr.

    Raises
    ------
    FileNotFoundError
        A named file does not exist.
    ConfigError
        An utterance has no alignment or a different number of labels than frames (the message
        names the utterance and both lengths), a label is out of range, a file is unreadable.
    """
    from tqdm import tqdm

    feats_path, ali_path = Path(feats_scp), Path(alignments)
    table = list(_read_table(feats_path, "feature file"))
    ali = _read_alignments(ali_path)
    require(len(table) > 0, "feature file", str(feats_path), "holds no utterances")
    feats, labels, utt_ids = [], [], []
    for utt, matrix in tqdm(table, desc="kaldi", unit="utt", file=sys.stderr, disable=not progress):
        if utt not in ali:
            raise ConfigError(f"utterance {utt!r} of {feats_path} has no alignment in {ali_path}")
        matrix = np.asarray(matrix, dtype=np.float32)
        if matrix.ndim != 2 or len(matrix) != len(ali[utt]):
            raise ConfigError(
                f"utterance {utt!r}: {len(matrix)} feature frames in {feats_path} but "
                f"{len(ali[utt])} alignment labels in {ali_path}"
            )
        feats.append(matrix)
        labels.append(ali[utt])
        utt_ids.append(utt)
    if n_classes is None:
        n_classes = int(max(int(lab.max()) for lab in labels if len(lab)) + 1)
    utt2spk = _read_text_map(feats_path.parent / "utt2spk")
    text = _read_text_map(feats_path.parent / "text")
    return write_corpus(
        out_path,
        features_per_utt=feats,
        labels_per_utt=labels,
        utt_ids=utt_ids,
        speakers=[utt2spk.get(u, u) for u in utt_ids],
        transcripts=[text.get(u, "") for u in utt_ids],
        n_classes=n_classes,
        feature_kind="kaldi",
        add_deltas=add_deltas,
        source=f"Kaldi features {feats_path} with alignments {ali_path}",
    )
