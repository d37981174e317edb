r"""Straggler models, shared by the simulator and the runtime so both slow the same workers.

A spec string (the ``--straggler`` flag of ``psgdlab predict`` and ``psgdlab train``) is a
comma-separated list of terms:

- ``RANK:FACTOR`` -- worker ``RANK`` computes ``FACTOR`` times slower on every step
  (``3:2.5``);
- ``random:PROB:FACTOR`` -- on each step each worker is ``FACTOR`` times slower with
  probability ``PROB`` (``random:0.05:3``);
- ``periodic:RANK:EVERY:PAUSE_S`` -- worker ``RANK`` pauses ``PAUSE_S`` seconds on every
  ``EVERY``-th step (``periodic:0:100:2.0``; ``RANK`` may be ``*`` for every worker).

Draws are a pure function of ``(seed, rank, step)`` (a SplitMix64 hash), so the simulator and
every rank of the runtime agree without sharing a random stream, and a step's slowdown does not
depend on scheduling order.

Examples
--------
>>> model = StragglerModel.parse("1:3")
>>> model.compute_time(0.1, rank=1, step=7), model.compute_time(0.1, rank=0, step=7)
(0.30000000000000004, 0.1)
>>> StragglerModel.parse("").is_empty
True
"""

from __future__ import annotations

from dataclasses import dataclass

from psgdlab.core.errors import ConfigError

__all__ = ["FixedStraggler", "RandomSlowdown", "PeriodicPause", "StragglerModel", "unit_hash"]

_MASK = (1 << 64) - 1


def unit_hash(seed: int, rank: int, step: int, salt: int = 0) -> float:
    """A uniform number in [0, 1) from ``(seed, rank, step, salt)`` (SplitMix64 finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + rank * 0xBF58476D1CE4E5B9 + step * 0x94D049BB133111EB + salt + 1) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return (z >> 11) * (1.0 / (1 << 53))


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedStraggler:
    rank: int
    factor: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RandomSlowdown:
    probability: float
    factor: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PeriodicPause:
    rank: int  # -1: every worker
    every: int
    pause_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerModel:
    """A combination of straggler terms (see the module docstring)."""

    fixed: tuple[FixedStraggler, ...] = ()
    random: tuple[RandomSlowdown, ...] = ()
    periodic: tuple[PeriodicPause, ...] = ()
    seed: int = 0

    @property
    def is_empty(self) -> bool:
        return not (self.fixed or self.random or self.periodic)

    @classmethod
    def parse(cls, spec: str | None, *, seed: int = 0, n_workers: int | None = None) -> StragglerModel:
        """Parse a spec string; ``n_workers`` (if given) bounds the ranks."""
        fixed: list[FixedStraggler] = []
        rand: list[RandomSlowdown] = []
        periodic: list[PeriodicPause] = []
        for term in (t.strip() for t in (spec or "").split(",")):
            if not term:
                continue
            parts = term.split(":")
            try:
                if parts[0] == "random" and len(parts) == 3:
                    rand.append(RandomSlowdown(probability=float(parts[1]), factor=float(parts[2])))
                elif parts[0] == "periodic" and len(parts) == 4:
                    rank = -1 if parts[1] == "*" else int(parts[1])
                    periodic.append(PeriodicPause(rank=rank, every=int(parts[2]), pause_s=float(parts[3])))
                elif len(parts) == 2:
                    fixed.append(FixedStraggler(rank=int(parts[0]), factor=float(parts[1])))
                else:
                    raise ValueError
            except ValueError:
                raise ConfigError(
                    f"straggler term {term!r} is not RANK:FACTOR, random:PROB:FACTOR or periodic:RANK:EVERY:PAUSE_S"
                ) from None
        model = cls(fixed=tuple(fixed), random=tuple(rand), periodic=tuple(periodic), seed=seed)
        model.validate(n_workers)
        return model

    def validate(self, n_workers: int | None = None) -> None:
        for f in self.fixed:
            _check_rank(f.rank, n_workers)
            if not f.factor > 0:
                raise ConfigError(f"straggler factor ({f.factor}) of rank {f.rank} must be > 0")
        for r in self.random:
            if not 0.0 <= r.probability <= 1.0:
                raise ConfigError(f"random straggler probability ({r.probability}) must be in [0, 1]")
            if not r.factor > 0:
                raise ConfigError(f"random straggler factor ({r.factor}) must be > 0")
        for p in self.periodic:
            if p.rank != -1:
                _check_rank(p.rank, n_workers)
            if p.every < 1:
                raise ConfigError(f"periodic pause every ({p.every}) must be >= 1 steps")
            if p.pause_s < 0:
                raise ConfigError(f"periodic pause ({p.pause_s} s) must be >= 0")

    def factor(self, rank: int, step: int) -> float:
        """Multiplicative slowdown of ``rank``'s compute at ``step``."""
        out = 1.0
        for f in self.fixed:
            if f.rank == rank:
                out *= f.factor
        for i, r in enumerate(self.random):
            if unit_hash(self.seed, rank, step, salt=i + 1) < r.probability:
                out *= r.factor
        return out

    def pause_s(self, rank: int, step: int) -> float:
        """Extra pause of ``rank`` at ``step`` (seconds)."""
        return sum(p.pause_s for p in self.periodic if (p.rank in (-1, rank)) and (step + 1) % p.every == 0)

    def compute_time(self, base_s: float, *, rank: int, step: int) -> float:
        """``base_s`` slowed and paused as this model says."""
        if self.is_empty:
            return base_s
        return base_s * self.factor(rank, step) + self.pause_s(rank, step)

    def spec(self) -> str:
        """The spec string this model parses from (round trip)."""
        terms = [f"{f.rank}:{f.factor:g}" for f in self.fixed]
        terms += [f"random:{r.probability:g}:{r.factor:g}" for r in self.random]
        terms += [f"periodic:{'*' if p.rank == -1 else p.rank}:{p.every}:{p.pause_s:g}" for p in self.periodic]
        return ",".join(terms)


def _check_rank(rank: int, n_workers: int | None) -> None:
    if rank < 0 or (n_workers is not None and rank >= n_workers):
        bound = f"[0, {n_workers})" if n_workers is not None else ">= 0"
        raise ConfigError(f"straggler rank ({rank}) must be in {bound}")
