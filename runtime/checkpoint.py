"""Per-rank checkpoints, written atomically (temporary file, fsync, rename).

Layout under the run directory::

    checkpoints/step00000040/rank0.pt ... rankN.pt     one file per worker rank
    checkpoints/server.pt                              the parameter server's state (latest)

A checkpoint of step ``S`` holds the state *after* ``S`` steps (so training resumes at local
step ``S``). :func:`latest_complete_step` picks the newest step for which every worker wrote its
file, so a job killed while writing falls back to the previous complete set. Each rank keeps
its ``keep`` newest files.
"""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from psgdlab.core.trace import atomic_write_bytes

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "latest_complete_step",
    "save_server",
    "load_server",
    "checkpoint_root",
]

_STEP_DIR = re.compile(r"^step(\d{8})$")


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save_checkpoint(run_dir: str | Path, *, step: int, rank: int, payload: dict[str, Any], keep: int = 2) -> Path:
    """Write ``payload`` (tensors moved to CPU) as the checkpoint of ``rank`` after ``step`` steps."""
    root = checkpoint_root(run_dir)
    path = atomic_write_bytes(root / f"step{step:08d}" / f"rank{rank}.pt", _to_bytes(_cpu(payload)))
    steps = sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    for old in steps[:-keep] if keep > 0 else []:
        stale = root / f"step{old:08d}" / f"rank{rank}.pt"
        stale.unlink(missing_ok=True)
        try:
            (root / f"step{old:08d}").rmdir()
        except OSError:
            pass  # other ranks' files are still there
    return path


def latest_complete_step(run_dir: str | Path, n_ranks: int) -> int | None:
    """The newest step for which ``rank0.pt .. rank{n_ranks-1}.pt`` all exist (None if none)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return None
    steps = sorted((int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True)
    for step in steps:
        if all((root / f"step{step:08d}" / f"rank{r}.pt").is_file() for r in range(n_ranks)):
            return step
    return None


def load_checkpoint(run_dir: str | Path, *, step: int, rank: int) -> dict[str, Any]:
    return torch.load(checkpoint_root(run_dir) / f"step{step:08d}" / f"rank{rank}.pt", weights_only=False)


def save_server(run_dir: str | Path, payload: dict[str, Any]) -> Path:
    return atomic_write_bytes(checkpoint_root(run_dir) / "server.pt", _to_bytes(_cpu(payload)))


def load_server(run_dir: str | Path) -> dict[str, Any] | None:
    path = checkpoint_root(run_dir) / "server.pt"
    return torch.load(path, weights_only=False) if path.is_file() else None


def remove_checkpoints(run_dir: str | Path) -> None:
    shutil.rmtree(checkpoint_root(run_dir), ignore_errors=True)


def _cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj
