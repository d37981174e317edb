r"""Speech front end: log-mel filterbank features, frame energies, speed perturbation.

:func:`log_mel_filterbank`: 25 ms Hamming windows every 10 ms, pre-emphasis 0.97, power
spectrum by FFT, 40 triangular filters equally spaced on the HTK mel scale
:math:`m(f) = 1127 \ln(1 + f/700)` between 20 Hz and Nyquist, natural log. Only the 40 static
coefficients are stored; Δ and ΔΔ (120 dims in all) are appended when the corpus is loaded
(attribute ``add_deltas``; :func:`psgdlab.models.data.append_deltas`).
:func:`frame_energy_db` gives the energy of the same frames (the stand-in labels of
:func:`psgdlab.models.speech.vad_labels` are cut from it); :func:`speed_perturb` is Kaldi's
speed perturbation. Signals in, arrays out: numpy and scipy only; the importers that read
recordings and write corpora are in :mod:`psgdlab.models.speech`.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from psgdlab.core.errors import require

__all__ = [
    "frame_signal",
    "mel_filterbank",
    "mel_band_centres_hz",
    "log_mel_filterbank",
    "frame_energy_db",
    "speed_perturb",
]


def frame_signal(
    signal: np.ndarray, sample_rate: int, *, frame_length_s: float = 0.025, frame_shift_s: float = 0.010
) -> np.ndarray:
    """Cut ``signal`` into overlapping frames ``(T, L)``, ``T = 1 + (N - L) // S``.

    Frames lie fully inside the signal (Kaldi's ``snip-edges``); a signal shorter than one frame
    is zero-padded to one frame.
    """
    length = round(frame_length_s * sample_rate)
    shift = round(frame_shift_s * sample_rate)
    require(
        length >= 1 and shift >= 1,
        "frame length/shift",
        (length, shift),
        "must be at least one sample at this sample rate",
    )
    signal = np.asarray(signal, dtype=np.float64)
    if len(signal) < length:
        signal = np.pad(signal, (0, length - len(signal)))
    return sliding_window_view(signal, length)[::shift]


def _hz_to_mel(f: np.ndarray | float) -> np.ndarray:
    return 1127.0 * np.log1p(np.asarray(f, dtype=np.float64) / 700.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    return 700.0 * np.expm1(np.asarray(m, dtype=np.float64) / 1127.0)


def mel_band_centres_hz(
    n_mels: int, sample_rate: int, *, low_hz: float = 20.0, high_hz: float | None = None
) -> np.ndarray:
    """Centre frequencies (Hz) of the ``n_mels`` triangular filters of :func:`mel_filterbank`."""
    high_hz = sample_rate / 2 if high_hz is None else high_hz
    edges = np.linspace(_hz_to_mel(low_hz), _hz_to_mel(high_hz), n_mels + 2)
    return _mel_to_hz(edges[1:-1])


def mel_filterbank(
    n_mels: int, n_fft: int, sample_rate: int, *, low_hz: float = 20.0, high_hz: float | None = None
) -> np.ndarray:
    """Triangular filters ``(n_mels, n_fft // 2 + 1)`` equally spaced on the mel scale.

    Filter ``j`` rises linearly from the centre of filter ``j - 1`` to its own centre and falls to
    the centre of filter ``j + 1`` (in Hz, evaluated at the FFT bin frequencies); peak 1.
    """
    high_hz = sample_rate / 2 if high_hz is None else high_hz
    require(
        0 <= low_hz < high_hz <= sample_rate / 2,
        "mel range",
        (low_hz, high_hz),
        f"must satisfy 0 <= low < high <= Nyquist ({sample_rate / 2} Hz)",
    )
    edges = _mel_to_hz(np.linspace(_hz_to_mel(low_hz), _hz_to_mel(high_hz), n_mels + 2))
    bins = np.arange(n_fft // 2 + 1) * sample_rate / n_fft
    left, centre, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - left) / (centre - left)
    falling = (right - bins[None, :]) / (right - centre)
    return np.maximum(0.0, np.minimum(rising, falling))


def log_mel_filterbank(
    signal: np.ndarray,
    sample_rate: int,
    *,
    n_mels: int = 40,
    frame_length_s: float = 0.025,
    frame_shift_s: float = 0.010,
    preemphasis: float = 0.97,
    low_hz: float = 20.0,
    high_hz: float | None = None,
) -> np.ndarray:
    r"""Log-mel filterbank features ``(T, n_mels)`` of a mono signal (float32).

    Per frame: remove the DC offset, pre-emphasise :math:`y_n = x_n - 0.97\,x_{n-1}` (the first
    sample is kept), Hamming window, power spectrum :math:`|\mathrm{FFT}|^2` with ``n_fft`` the
    next power of two >= the frame length (256 at 8 kHz), mel filters, natural log floored at
    :math:`10^{-10}`.
    """
    frames = frame_signal(signal, sample_rate, frame_length_s=frame_length_s, frame_shift_s=frame_shift_s)
    frames = frames - frames.mean(axis=1, keepdims=True)
    emphasised = np.concatenate([frames[:, :1], frames[:, 1:] - preemphasis * frames[:, :-1]], axis=1)
    length = frames.shape[1]
    n_fft = 1 << (length - 1).bit_length()
    power = np.abs(np.fft.rfft(emphasised * np.hamming(length), n=n_fft)) ** 2
    fbank = mel_filterbank(n_mels, n_fft, sample_rate, low_hz=low_hz, high_hz=high_hz)
    return np.log(np.maximum(power @ fbank.T, 1e-10)).astype(np.float32)


def frame_energy_db(
    signal: np.ndarray, sample_rate: int, *, frame_length_s: float = 0.025, frame_shift_s: float = 0.010
) -> np.ndarray:
    r"""Mean-square energy per frame in dB re full scale, :math:`10\log_{10}(\overline{x^2} + 10^{-12})`.

    Frames are those of :func:`log_mel_filterbank` (same count); ``signal`` scaled to [-1, 1].
    """
    frames = frame_signal(signal, sample_rate, frame_length_s=frame_length_s, frame_shift_s=frame_shift_s)
    return 10.0 * np.log10(np.mean(frames**2, axis=1) + 1e-12)


def speed_perturb(signal: np.ndarray, factor: float) -> np.ndarray:
    r"""Play ``signal`` ``factor`` times faster (Kaldi-style speed perturbation, Ko et al. 2015).

    Resamples by the rational approximation of :math:`1/\text{factor}` (denominator <= 100) with
    :func:`scipy.signal.resample_poly` and keeps the sample rate, so duration scales by
    ``1/factor`` and every frequency (pitch and formants) by ``factor``.
    """
    from fractions import Fraction

    from scipy.signal import resample_poly

    require(0.5 <= factor <= 2.0, "speed factor", factor, "must lie in [0.5, 2]")
    if factor == 1.0:
        return signal
    ratio = Fraction(1 / factor).limit_denominator(100)
    return resample_poly(signal, ratio.numerator, ratio.denominator)
