r"""Reading the time to a target off a run's held-out curve.

A run's ``summary.json`` holds its held-out curve (``heldout_curve``:
:data:`psgdlab.core.convergence.fit.REFERENCE_KEYS`): the metric of the workers' mean model at
points of wall time, with the epochs and steps done by then. :func:`time_to_target` reads off
when the metric first reached a target.

The points are noisy -- a model's held-out loss moves up and down from one snapshot to the next
while its trend falls -- and the first point below a target is biased early by that noise: the
earliest lucky dip wins. The read-off is therefore made on the curve's **decreasing isotonic
regression** (the least-squares fit among non-increasing sequences, pool-adjacent-violators:
:func:`scipy.optimize.isotonic_regression`), which keeps the trend and averages a dip with the
points around it, and interpolated linearly between the last fitted point above the target and
the first at or below it (in wall time, epochs and steps alike). A curve whose fit never gets to
the target has not reached it.

Examples
--------
>>> curve = {"time_s": [0, 10, 20, 30, 40], "epoch": [0, 1, 2, 3, 4], "step": [0, 5, 10, 15, 20],
...          "loss": [3.0, 2.0, 1.4, 1.6, 1.0]}
>>> c = time_to_target(curve, 1.5)
>>> c.reached, round(c.time_s, 3), round(c.epoch, 3)    # the fit pools 1.4 and 1.6 into 1.5 at 20 s
(True, 20.0, 2.0)
>>> time_to_target(curve, 0.5).reached
False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import isotonic_regression

from psgdlab.core.errors import ConfigError, require

__all__ = ["Crossing", "time_to_target", "monotone_fit"]


@dataclass(frozen=True, slots=True)
class Crossing:
    """When a curve reached a target: wall seconds, epochs and steps (``None`` where the curve
    lacks that key), or ``reached=False`` and ``last_*`` the end of the curve."""

    reached: bool
    time_s: float | None = None
    epoch: float | None = None
    step: float | None = None
    last_time_s: float | None = None
    last_value: float | None = None


def monotone_fit(values: Sequence[float]) -> np.ndarray:
    """The decreasing isotonic regression of ``values`` (in their order).

    >>> monotone_fit([3.0, 2.0, 2.4, 1.6, 1.0]).tolist()
    [3.0, 2.2, 2.2, 1.6, 1.0]
    """
    y = np.asarray(values, dtype=float)
    require(y.ndim == 1 and y.size >= 1 and bool(np.all(np.isfinite(y))), "values", "...", "must be finite, 1-d")
    return np.asarray(isotonic_regression(y, increasing=False).x, dtype=float)


def time_to_target(curve: Mapping[str, Sequence[float]], target: float, *, metric: str = "loss") -> Crossing:
    """When ``curve`` (a ``heldout_curve``: lists of one length, ``time_s`` required, ``epoch`` and
    ``step`` optional) first reached ``target`` on its decreasing fit (module docstring).

    Raises
    ------
    ConfigError
        The curve lacks ``time_s`` or ``metric``, or its lists differ in length.
    """
    for key in ("time_s", metric):
        if key not in curve:
            raise ConfigError(f"held-out curve has no {key!r} (keys: {', '.join(sorted(curve))})")
    t = np.asarray(curve["time_s"], dtype=float)
    y = np.asarray(curve[metric], dtype=float)
    if t.shape != y.shape or t.size == 0:
        raise ConfigError(f"held-out curve: time_s ({t.size}) and {metric} ({y.size}) must be non-empty, one length")
    ok = np.isfinite(t) & np.isfinite(y)
    order = np.argsort(t[ok], kind="stable")
    t, y = t[ok][order], y[ok][order]
    extra = {k: np.asarray(curve[k], dtype=float)[ok][order] for k in ("epoch", "step") if k in curve}
    if t.size == 0:
        return Crossing(reached=False)
    fit = monotone_fit(y)
    below = np.flatnonzero(fit <= target)
    if below.size == 0:
        return Crossing(reached=False, last_time_s=float(t[-1]), last_value=float(fit[-1]))
    j = int(below[0])
    if j == 0:
        w = 1.0
    else:
        drop = fit[j - 1] - fit[j]
        w = (fit[j - 1] - target) / drop if drop > 0 else 1.0
    i = max(j - 1, 0)

    def at(v: np.ndarray) -> float:
        return float(v[i] + w * (v[j] - v[i])) if j > 0 else float(v[0])

    return Crossing(
        reached=True,
        time_s=at(t),
        epoch=at(extra["epoch"]) if "epoch" in extra else None,
        step=at(extra["step"]) if "step" in extra else None,
        last_time_s=float(t[-1]),
        last_value=float(fit[-1]),
    )
