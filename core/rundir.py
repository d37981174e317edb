"""The run directory every executor writes, and the environment record it holds.

Layout::

    RUN_DIR/
      config.resolved.json   the fully resolved configuration
      env.json               versions, git SHA, host, world size, source
      trace.npz              the trace (psgdlab.core.trace schema)
      summary.json           figures from psgdlab.core.trace.summarize plus executor extras
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
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from psgdlab.core.errors import ConfigError
from psgdlab.core.trace import atomic_write_json

__all__ = ["RunDir", "environment", "default_run_dir"]


def default_run_dir(kind: str) -> Path:
    """``runs/<kind>-<timestamp>`` under the current directory (unique)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{kind}-{stamp}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def environment(*, source: str, world_size: int | None = None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
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
