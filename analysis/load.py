"""Run directories as the simulator and the runtime write them.

A run directory holds one case (``summary.json``, ``config.resolved.json``, ``trace.npz``) or
several, one per sub-directory of ``runs/`` (a sweep over algorithms and worker counts, as
``psgdlab predict`` and ``psgdlab validate`` write them). A case
is identified by its ``(algorithm, workers)`` key, read from the summary or the resolved config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError
from psgdlab.core.trace import read_trace

__all__ = ["Run", "load_run", "load_cases", "case_key"]


@dataclass(slots=True)
class Run:
    """One case of a run directory."""

    path: Path
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    trace: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return case_key(self.summary, self.config, where=self.path)


def _find(d: Any, name: str) -> Any:
    if isinstance(d, dict):
        if name in d and not isinstance(d[name], dict):
            return d[name]
        for v in d.values():
            found = _find(v, name)
            if found is not None:
                return found
    return None


def case_key(summary: dict[str, Any], config: dict[str, Any], *, where: Any = "run") -> tuple[str, int]:
    """``(algorithm, workers)`` of a case, from its summary or else its resolved config."""
    algorithm = summary.get("algorithm") or _find(config, "algorithm")
    if isinstance(algorithm, dict):  # the runtime stores the algorithm's parameters, name included
        algorithm = algorithm.get("algorithm")
    workers = summary.get("workers") or _find(config, "workers") or _find(config, "n_workers")
    if algorithm is None or workers is None:
        raise ConfigError(f"{where}: cannot tell the case's algorithm and workers from summary.json or "
                          f"config.resolved.json")
    return str(algorithm), int(workers)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc})") from None


def load_run(path: str | Path, *, with_trace: bool = True) -> Run:
    """Load the single case stored directly in ``path``."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"run directory {path} does not exist")
    if not (path / "summary.json").is_file():
        raise ConfigError(f"run directory {path} has no summary.json (is it a psgdlab run directory?)")
    summary = _read_json(path / "summary.json")
    config = _read_json(path / "config.resolved.json") if (path / "config.resolved.json").is_file() else {}
    trace, meta = (None, {})
    if with_trace and (path / "trace.npz").is_file():
        trace, meta = read_trace(path / "trace.npz")
    env = _read_json(path / "env.json") if (path / "env.json").is_file() else {}
    return Run(path=path, summary=summary, config=config, trace=trace, meta=meta, env=env)


def load_cases(path: str | Path, *, with_trace: bool = True) -> dict[tuple[str, int], Run]:
    """Every case of a run directory, keyed by ``(algorithm, workers)``."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"run directory {path} does not exist")
    subdirs = sorted(p for p in (path / "runs").glob("*") if (p / "summary.json").is_file())
    runs = [load_run(p, with_trace=with_trace) for p in subdirs] or [load_run(path, with_trace=with_trace)]
    out: dict[tuple[str, int], Run] = {}
    for run in runs:
        if run.key in out:
            raise ConfigError(f"{path}: two cases share the key {run.key}")
        out[run.key] = run
    return out
