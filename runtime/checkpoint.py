"""Per-rank checkpoints, written atomically (temporary file, fsync, rename) and checksummed.

Layout under the run directory::

    checkpoints/step00000040/rank0.pt ... rankN.pt     one file per worker rank
    checkpoints/server.pt                              the parameter server's state (latest)

A checkpoint of step ``S`` holds the state *after* ``S`` steps (so training resumes at local
step ``S``). A step is *complete* when every worker wrote its file (:func:`complete_steps`,
newest first; :func:`latest_complete_step`), so a job killed while writing falls back to the
previous complete set. Each file is :data:`MAGIC`, the SHA-256 of the payload, then the payload
(``torch.save``); :func:`load_checkpoint` checks the digest and raises :class:`CheckpointError`
for a file that is truncated, corrupted or unreadable, and the caller falls back to an older
complete step (:func:`psgdlab.runtime.train.train` agrees on it over every rank). Files without
the header (written before it existed) load unchecked.

Each rank removes its own files of steps older than the ``keep``-th newest complete step, so
``keep`` complete checkpoints survive (the newest, and ``keep - 1`` to fall back to) even when a
rank runs ahead of a dead peer and writes steps the others never reach. A write that fails
(a full disk: ``ENOSPC``) leaves no partial file -- the temporary file is removed and nothing
is renamed -- and raises :class:`CheckpointError` naming the step and the newest complete one,
which is intact.
"""

from __future__ import annotations

import hashlib
import io
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from psgdlab.core.errors import TestbedError
from psgdlab.core.trace import atomic_write_bytes

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "latest_complete_step",
    "complete_steps",
    "save_server",
    "load_server",
    "checkpoint_root",
    "CheckpointError",
    "MAGIC",
]

_STEP_DIR = re.compile(r"^step(\d{8})$")
#: the first bytes of a checksummed checkpoint file; the SHA-256 of the payload follows
MAGIC = b"psgdlab-checkpoint-1\n"
_DIGEST = hashlib.sha256().digest_size


class CheckpointError(TestbedError, RuntimeError):
    """A checkpoint file could not be written, or is truncated, corrupted or unreadable."""


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    return MAGIC + hashlib.sha256(payload).digest() + payload


def _from_bytes(data: bytes, where: Path) -> Any:
    if data.startswith(MAGIC):
        digest, payload = data[len(MAGIC) : len(MAGIC) + _DIGEST], data[len(MAGIC) + _DIGEST :]
        if hashlib.sha256(payload).digest() != digest:
            raise CheckpointError(f"checkpoint {where} is corrupt: its SHA-256 does not match its contents")
    else:
        payload = data
    try:
        return torch.load(io.BytesIO(payload), weights_only=False)
    except Exception as exc:  # torch.load raises RuntimeError, pickle's, EOFError ... on a bad file
        raise CheckpointError(f"checkpoint {where} is unreadable ({type(exc).__name__}: {exc})") from None


def _steps(root: Path) -> list[int]:
    """Every step directory's step, newest first."""
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True)


def save_checkpoint(
    run_dir: str | Path,
    *,
    step: int,
    rank: int,
    payload: dict[str, Any],
    keep: int = 2,
    n_ranks: int | None = None,
) -> Path:
    """Write ``payload`` (tensors moved to CPU) as the checkpoint of ``rank`` after ``step`` steps,
    then remove this rank's files older than the ``keep``-th newest complete step (``n_ranks``
    workers; None: older than the ``keep``-th newest step, complete or not)."""
    root = checkpoint_root(run_dir)
    path = root / f"step{step:08d}" / f"rank{rank}.pt"
    try:
        atomic_write_bytes(path, _to_bytes(_cpu(payload)))
    except OSError as exc:
        found = latest_complete_step(run_dir, n_ranks) if n_ranks else None
        kept = f"the newest complete checkpoint (step {found}) is intact" if found is not None else "no file was left"
        raise CheckpointError(
            f"rank {rank}: the checkpoint of step {step} could not be written ({exc.strerror or exc}); {kept}"
        ) from None
    kept_steps = complete_steps(run_dir, n_ranks) if n_ranks else _steps(root)
    if keep > 0 and len(kept_steps) >= keep:
        oldest_kept = kept_steps[keep - 1]
        for old in (s for s in _steps(root) if s < oldest_kept):
            (root / f"step{old:08d}" / f"rank{rank}.pt").unlink(missing_ok=True)
            try:
                (root / f"step{old:08d}").rmdir()
            except OSError:
                pass  # other ranks' files are still there
    return path


def complete_steps(run_dir: str | Path, n_ranks: int) -> list[int]:
    """The steps for which ``rank0.pt .. rank{n_ranks-1}.pt`` all exist, newest first."""
    root = checkpoint_root(run_dir)
    return [
        step
        for step in _steps(root)
        if all((root / f"step{step:08d}" / f"rank{r}.pt").is_file() for r in range(n_ranks))
    ]


def latest_complete_step(run_dir: str | Path, n_ranks: int) -> int | None:
    """The newest step for which ``rank0.pt .. rank{n_ranks-1}.pt`` all exist (None if none)."""
    steps = complete_steps(run_dir, n_ranks)
    return steps[0] if steps else None


def load_checkpoint(run_dir: str | Path, *, step: int, rank: int) -> dict[str, Any]:
    """The payload of ``rank``'s checkpoint of ``step`` (:class:`CheckpointError` if it is
    corrupt or unreadable)."""
    path = checkpoint_root(run_dir) / f"step{step:08d}" / f"rank{rank}.pt"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read ({exc.strerror or exc})") from None
    return _from_bytes(data, path)


def save_server(run_dir: str | Path, payload: dict[str, Any]) -> Path:
    return atomic_write_bytes(checkpoint_root(run_dir) / "server.pt", _to_bytes(_cpu(payload)))


def load_server(run_dir: str | Path) -> dict[str, Any] | None:
    path = checkpoint_root(run_dir) / "server.pt"
    return _from_bytes(path.read_bytes(), path) if path.is_file() else None


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
