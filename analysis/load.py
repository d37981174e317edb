"""Run directories as the simulator, the emulator and the runtime write them.

A run directory holds one case (``summary.json``, ``config.resolved.json``, ``trace.npz``) or
several, one per sub-directory of ``runs/`` (a sweep over algorithms and worker counts, as
``psgdlab predict`` and ``psgdlab validate`` write them). A case is identified by its
``(label, workers)`` key, read from its :class:`~psgdlab.core.records.rundir.Summary` (the label is the
case's name where it has one, else the algorithm's). A directory that its writer did not commit
is refused (:func:`psgdlab.core.records.rundir.require_complete`); a collection of runs (``runs/*`` and
no summary of its own, as ``validate`` gathers its measured runs) by each of its runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError
from psgdlab.core.records.rundir import SUMMARY_FILE, Summary, read_summary, require_complete
from psgdlab.core.records.trace import read_trace

__all__ = ["Run", "load_run", "load_cases"]


@dataclass(slots=True)
class Run:
    """One case of a run directory: its :class:`~psgdlab.core.records.rundir.Summary` (``case``; the
    flat ``summary.json`` object as ``summary``), resolved config, trace and environment."""

    path: Path
    case: Summary
    config: dict[str, Any] = field(default_factory=dict)
    trace: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> dict[str, Any]:
        """``summary.json`` as one flat object (the case keys and the figures)."""
        return self.case.to_json()

    @property
    def key(self) -> tuple[str, int]:
        """``(label, workers)``: what tells the case apart from the others of a sweep."""
        return self.case.label, self.case.workers


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
    case = read_summary(path)
    config = _read_json(path / "config.resolved.json") if (path / "config.resolved.json").is_file() else {}
    trace: np.ndarray | None = None
    meta: dict[str, Any] = {}
    if with_trace and (path / "trace.npz").is_file():
        trace, meta = read_trace(path / "trace.npz")
    env = _read_json(path / "env.json") if (path / "env.json").is_file() else {}
    return Run(path=path, case=case, config=config, trace=trace, meta=meta, env=env)


def load_cases(path: str | Path, *, with_trace: bool = True) -> dict[tuple[str, int], Run]:
    """Every case of a run directory, keyed by ``(algorithm, workers)``."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"run directory {path} does not exist")
    subdirs = sorted(p for p in (path / "runs").glob("*") if (p / SUMMARY_FILE).is_file())
    if not subdirs or (path / SUMMARY_FILE).is_file():  # a run of its own (a sweep's too), not a collection
        require_complete(path)
    runs = [load_run(p, with_trace=with_trace) for p in subdirs] or [load_run(path, with_trace=with_trace)]
    out: dict[tuple[str, int], Run] = {}
    for run in runs:
        if run.key in out:
            raise ConfigError(f"{path}: two cases share the key {run.key}")
        out[run.key] = run
    return out
