"""Shared helpers of the emulator experiments (run from the repository root with PYTHONPATH=$PWD)."""

from __future__ import annotations

import numpy as np


def at_times(times: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The last value recorded at or before each grid time (NaN before the first)."""
    idx = np.searchsorted(times, grid, side="right") - 1
    out = np.where(idx >= 0, values[np.clip(idx, 0, None)], np.nan)
    return out


def fmt(x: float) -> str:
    return "   nan   " if not np.isfinite(x) else f"{x:9.3g}"
