r"""Compute-time distributions per step, shared by the simulator (``workload.compute``) and the
runtime (``--compute-time``, emulated compute).

Spec strings:

- ``0.05`` -- constant 0.05 s;
- ``normal:MEAN:STD`` -- truncated at 0;
- ``lognormal:MEAN:CV`` -- log-normal with the given mean and coefficient of variation (a
  realistic right tail);
- ``gamma:MEAN:CV``.

Examples
--------
>>> d = ComputeTime.parse("lognormal:0.171:0.05")
>>> round(d.mean_s, 3)
0.171
>>> import numpy as np
>>> round(float(np.mean(d.sample(np.random.default_rng(0), 20000))), 3)
0.171
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from psgdlab.core.errors import ConfigError

__all__ = ["ComputeTime"]

_KINDS = ("const", "normal", "lognormal", "gamma")


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeTime:
    """A per-step compute-time distribution (seconds).

    Parameters
    ----------
    kind : {"const", "normal", "lognormal", "gamma"}
    mean_s : float
        Mean, ``> 0`` (``>= 0`` for const).
    spread : float
        STD in seconds for ``normal``, coefficient of variation for ``lognormal`` and
        ``gamma``; ignored for ``const``.
    """

    kind: str = "const"
    mean_s: float = 0.1
    spread: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ConfigError(f"compute-time kind ({self.kind!r}) must be one of {', '.join(_KINDS)}")
        if not (self.mean_s > 0 or (self.kind == "const" and self.mean_s == 0)) or not math.isfinite(self.mean_s):
            raise ConfigError(f"compute-time mean ({self.mean_s}) must be a finite number > 0")
        if self.spread < 0:
            raise ConfigError(f"compute-time spread ({self.spread}) must be >= 0")

    @classmethod
    def parse(cls, spec: str | float) -> ComputeTime:
        if isinstance(spec, (int, float)):
            return cls(kind="const", mean_s=float(spec))
        parts = str(spec).strip().split(":")
        try:
            numbers = [float(p) for p in (parts if len(parts) == 1 else parts[1:])]
        except ValueError:
            numbers = []
        if len(parts) == 1 and numbers:
            return cls(kind="const", mean_s=numbers[0])
        if len(parts) == 3 and numbers:
            return cls(kind=parts[0], mean_s=numbers[0], spread=numbers[1])
        raise ConfigError(f"compute time {spec!r} is not SECONDS, normal:MEAN:STD, lognormal:MEAN:CV or gamma:MEAN:CV")

    def spec(self) -> str:
        return f"{self.mean_s:g}" if self.kind == "const" else f"{self.kind}:{self.mean_s:g}:{self.spread:g}"

    @property
    def std_s(self) -> float:
        if self.kind == "const":
            return 0.0
        return self.spread if self.kind == "normal" else self.spread * self.mean_s

    def sample(self, rng: np.random.Generator, size: int | None = None) -> np.ndarray | float:
        """Draw ``size`` compute times (a float when ``size`` is None)."""
        m, s = self.mean_s, self.spread
        if self.kind == "const" or s == 0.0:
            out = np.full(1 if size is None else size, m)
        elif self.kind == "normal":
            out = np.maximum(rng.normal(m, s, 1 if size is None else size), 0.0)
        elif self.kind == "lognormal":
            sigma2 = math.log1p(s * s)
            out = rng.lognormal(math.log(m) - sigma2 / 2, math.sqrt(sigma2), 1 if size is None else size)
        else:  # gamma with mean m and CV s: shape 1/s^2, scale m s^2
            out = rng.gamma(1.0 / (s * s), m * s * s, 1 if size is None else size)
        return float(out[0]) if size is None else out
