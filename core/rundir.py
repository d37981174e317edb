"""The run directory every executor writes, and the environment record it holds.

Layout::

    RUN_DIR/
      config.resolved.json   the fully resolved configuration
      env.json               versions, git SHA, host, world size, source
      trace.npz              the trace (psgdlab.core.trace schema)
      summary.json           a :class:`Summary`: which case (source, algorithm, its parameters,
                             workers, case name) and its figures (psgdlab.core.trace.summarize
                             plus executor extras), flat in one JSON object; or, for a run
                             directory of several cases, a sweep's or a plan's summary
                             (psgdlab.core.summaries); every shape starts with schema_version,
                             kind and source, and is written by write_summary
      timeline.json          Chrome/Perfetto timeline
      *.png                  plots

Every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from psgdlab.core.errors import ConfigError
from psgdlab.core.summaries import HEADER_KEYS, PlanSummary, SweepSummary, header, kind_of
from psgdlab.core.trace import atomic_write_json

__all__ = [
    "RunDir",
    "Summary",
    "RunSummary",
    "environment",
    "default_run_dir",
    "read_summary",
    "read_run_summary",
    "write_summary",
]

SUMMARY_FILE = "summary.json"


def default_run_dir(kind: str) -> Path:
    """``runs/<kind>-<timestamp>`` under the current directory (unique)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{kind}-{stamp}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def environment(
    *, source: str, world_size: int | None = None, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Versions, git SHA, host and world size, for ``env.json``."""
    versions = {}
    for dist in ("psgdlab", "numpy", "scipy", "simpy", "torch", "mpi4py", "h5py", "networkx"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return {
        "source": source,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "versions": versions,
        "git_sha": _git_sha(),
        "world_size": world_size,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **dict(extra or {}),
    }


def _git_sha() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class RunDir:
    """A run directory: ``RunDir(path).write_json("summary.json", obj)``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"output {self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def write_json(self, name: str, obj: Any) -> Path:
        return atomic_write_json(self.path / name, obj)

    def read_json(self, name: str) -> Any:
        p = self.path / name
        if not p.is_file():
            raise ConfigError(f"run directory {self.path} has no {name}")
        return json.loads(p.read_text())


#: the keys of summary.json that say which case it is; everything else is a figure
_CASE_KEYS = ("source", "algorithm", "algorithm_params", "workers", "case", "hosts", "placement")


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """What ``summary.json`` holds: which case a run is, and its figures.

    Parameters
    ----------
    source : str
        The executor that wrote it: ``"runtime"``, ``"simulator"`` or ``"emulator"``.
    algorithm : str
        The registry name of the algorithm (:data:`psgdlab.core.algorithms.ALGORITHMS`).
    algorithm_params : dict
        The algorithm's hyperparameters (:meth:`psgdlab.core.algorithms.Algorithm.params`).
    workers : int
        Number of workers.
    case : str or None
        A name that tells apart cases of one algorithm (``"adpsgd-random-w4"`` in a
        validation), ``None`` where the algorithm's name and workers suffice.
    hosts : int or None
        How many hosts the ranks ran on (emulated hosts count as hosts); ``None`` where the
        executor does not say (written only when given).
    placement : tuple of int or None
        The host of every rank (index ``r``: rank ``r``'s host, numbered ``0..hosts-1`` in order
        of first appearance; a parameter server's rank included); ``None`` where not recorded.
    figures : dict
        Everything measured or predicted (:func:`psgdlab.core.trace.summarize` and the
        executor's extras), JSON-able; written flat beside the case keys.

    Examples
    --------
    >>> s = Summary(source="simulator", algorithm="ssgd", algorithm_params={"momentum": 0.0},
    ...             workers=4, figures={"samples_per_s": 512.0})
    >>> Summary.from_json(s.to_json()) == s
    True
    >>> s.to_json()["samples_per_s"], s.to_json()["kind"]
    (512.0, 'case')
    >>> two = Summary(source="runtime", algorithm="ssgd", algorithm_params={}, workers=4, hosts=2,
    ...               placement=(0, 0, 1, 1))
    >>> Summary.from_json(two.to_json()) == two, two.to_json()["placement"]
    (True, [0, 0, 1, 1])
    """

    source: str
    algorithm: str
    algorithm_params: dict[str, Any]
    workers: int
    case: str | None = None
    hosts: int | None = None
    placement: tuple[int, ...] | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hosts is not None and (not isinstance(self.hosts, int) or self.hosts < 1):
            raise ConfigError(f"summary hosts {self.hosts!r} must be an integer >= 1")
        if self.placement is not None:
            ok = self.hosts is not None and sorted(set(self.placement)) == list(range(self.hosts))
            if not ok or len(self.placement) < self.workers:
                raise ConfigError(
                    f"summary placement {list(self.placement)!r} must give each of the >= {self.workers} ranks "
                    f"a host in 0..{(self.hosts or 1) - 1}, every host used (hosts = {self.hosts!r})"
                )
        if not isinstance(self.algorithm, str) or not self.algorithm:
            raise ConfigError(f"summary algorithm {self.algorithm!r} must be a registry name (a non-empty string)")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"summary workers {self.workers!r} must be an integer >= 1")
        reserved = (*HEADER_KEYS, *_CASE_KEYS)
        clash = sorted(set(self.figures) & set(reserved))
        if clash:
            raise ConfigError(f"summary figures {clash} clash with the header and case keys {list(reserved)}")

    @property
    def label(self) -> str:
        """The case's name: ``case`` where given, else the algorithm's."""
        return self.case or self.algorithm

    def to_json(self) -> dict[str, Any]:
        """One flat JSON object: the header (:func:`psgdlab.core.summaries.header`), the case
        keys, then the figures."""
        head = {
            **header("case", self.source),
            "algorithm": self.algorithm,
            "algorithm_params": dict(self.algorithm_params),
            "workers": self.workers,
            "case": self.case,
        }
        if self.hosts is not None:
            head["hosts"] = self.hosts
        if self.placement is not None:
            head["placement"] = list(self.placement)
        return {**head, **self.figures}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, where: Any = "summary") -> Summary:
        """The summary of a ``summary.json`` object (:class:`ConfigError` naming ``where`` if a
        case key is missing)."""
        if kind_of(obj, where=where) != "case":
            raise ConfigError(
                f"{where}: summary.json is a {kind_of(obj, where=where)}'s, not one case's (its cases are in runs/)"
            )
        missing = [k for k in ("source", "algorithm", "algorithm_params", "workers") if k not in obj]
        if missing:
            raise ConfigError(f"{where}: summary.json lacks {missing} (written by an older psgdlab?)")
        figures = {k: v for k, v in obj.items() if k not in _CASE_KEYS and k not in HEADER_KEYS}
        return cls(
            source=str(obj["source"]),
            algorithm=obj["algorithm"],
            algorithm_params=dict(obj["algorithm_params"]),
            workers=int(obj["workers"]),
            case=obj.get("case"),
            hosts=None if obj.get("hosts") is None else int(obj["hosts"]),
            placement=None if obj.get("placement") is None else tuple(int(h) for h in obj["placement"]),
            figures=figures,
        )


#: every shape of ``summary.json`` (:mod:`psgdlab.core.summaries`)
RunSummary = Summary | SweepSummary | PlanSummary


def write_summary(run: RunDir | str | os.PathLike[str], summary: RunSummary) -> Path:
    """Write ``summary`` as ``summary.json`` of ``run`` (atomically); the one writer of the file,
    whatever its shape."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    return run.write_json(SUMMARY_FILE, summary.to_json())


def _summary_json(run: RunDir | str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    path = run.path if isinstance(run, RunDir) else Path(run)
    p = path / SUMMARY_FILE
    if not p.is_file():
        raise ConfigError(f"run directory {path} has no {SUMMARY_FILE} (is it a psgdlab run directory?)")
    try:
        obj = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p} is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{p} must hold one JSON object, not {type(obj).__name__}")
    return path, obj


def read_summary(run: RunDir | str | os.PathLike[str]) -> Summary:
    """The :class:`Summary` of ``run``'s ``summary.json`` (one case's; a :class:`ConfigError`
    for another shape)."""
    path, obj = _summary_json(run)
    return Summary.from_json(obj, where=path)


def read_run_summary(run: RunDir | str | os.PathLike[str]) -> RunSummary:
    """The summary of ``run``, whatever its shape (:func:`psgdlab.core.summaries.kind_of`)."""
    path, obj = _summary_json(run)
    kind = kind_of(obj, where=path)
    if kind == "sweep":
        return SweepSummary.from_json(obj)
    if kind == "plan":
        return PlanSummary.from_json(obj)
    return Summary.from_json(obj, where=path)
