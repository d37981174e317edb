"""Per-rank checkpoints, written atomically (temporary file, fsync, rename) and checksummed.

Layout under the run directory::

    checkpoints/step00000040/rank0.pt ... rankN.pt     one file per worker rank
    checkpoints/server.pt                              the parameter server's state (latest)

A checkpoint of step ``S`` holds the state *after* ``S`` steps (so training resumes at local
step ``S``). A step is *complete* when every worker wrote its file (:func:`complete_steps`,
newest first; :func:`latest_complete_step`), so a job killed while writing falls back to the
previous complete set. Each file is :data:`MAGIC`, the SHA-256 of the payload, then the payload
(``torch.save`` of tensors and plain values). :func:`load_checkpoint` loads it with
``torch.load(weights_only=True)``, so a planted file can hold no code that runs, checks the digest
and raises :class:`CheckpointError` for a file that is truncated, corrupted, unreadable, or that
holds anything but tensors and plain values; the caller falls back to an older complete step
(:func:`psgdlab.runtime.train.train` agrees on it over every rank). The digest only catches
damage: whoever can write the file can write its digest too.

A checkpoint belongs to one run. :func:`write_run_record` writes ``checkpoints/run.json`` when a
run starts (its run id, workers, world size and algorithm); every checkpoint file carries that run
id, and :func:`check_run_record` refuses to resume a directory whose record names another world
size or algorithm, and :func:`load_checkpoint` a file of another run (orphaned ranks of an earlier
run in the same directory, say).

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
import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from psgdlab.core.errors import ConfigError, TestbedError
from psgdlab.core.records.trace import atomic_write_bytes, atomic_write_json

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "latest_complete_step",
    "complete_steps",
    "save_server",
    "load_server",
    "checkpoint_root",
    "write_run_record",
    "has_run_record",
    "check_run_record",
    "CheckpointError",
    "MAGIC",
]

_STEP_DIR = re.compile(r"^step(\d{8})$")
#: the first bytes of a checksummed checkpoint file; the SHA-256 of the payload follows
MAGIC = b"psgdlab-checkpoint-1\n"
_DIGEST = hashlib.sha256().digest_size
#: the run record beside the step directories
RUN_RECORD = "run.json"


class CheckpointError(TestbedError, RuntimeError):
    """A checkpoint file could not be written, or is truncated, corrupted or unreadable."""


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def write_run_record(run_dir: str | Path, *, run_id: str, workers: int, world_size: int, algorithm: dict) -> Path:
    """Write ``checkpoints/run.json``: the run the checkpoints of ``run_dir`` belong to."""
    record = {"run_id": run_id, "workers": workers, "world_size": world_size, "algorithm": _plain(algorithm)}
    return atomic_write_json(checkpoint_root(run_dir) / RUN_RECORD, record)


def has_run_record(run_dir: str | Path) -> bool:
    return (checkpoint_root(run_dir) / RUN_RECORD).is_file()


def _plain(obj: dict) -> Any:
    """``obj`` as it reads back from JSON (tuples become lists), so a record compares equal to its source."""
    return json.loads(json.dumps(obj, default=str))


def check_run_record(run_dir: str | Path, *, workers: int, world_size: int, algorithm: dict) -> str:
    """The run id of the checkpoints in ``run_dir``, after checking that they belong to a run of
    ``workers`` workers, ``world_size`` ranks and ``algorithm`` (its :meth:`params`, compared after
    a JSON round trip); :class:`~psgdlab.core.errors.ConfigError` in one line otherwise."""
    path = checkpoint_root(run_dir) / RUN_RECORD
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{path} is missing: the checkpoints in {run_dir} were not written by this version of psgdlab's train"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc}); the checkpoints cannot be resumed") from None
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        raise ConfigError(f"{path} holds no run id; the checkpoints cannot be resumed")
    theirs = (record.get("workers"), record.get("world_size"))
    if theirs != (workers, world_size):
        raise ConfigError(
            f"the checkpoints in {run_dir} belong to a run of {theirs[0]} workers ({theirs[1]} ranks), "
            f"not {workers} ({world_size} ranks): resume with the same --workers"
        )
    ours = _plain(algorithm)
    if record.get("algorithm") != ours:
        raise ConfigError(
            f"the checkpoints in {run_dir} belong to a run of {record.get('algorithm')}, not {ours}: "
            "resume with the same algorithm flags"
        )
    return record["run_id"]


def _to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    return MAGIC + hashlib.sha256(payload).digest() + payload


def _from_bytes(data: bytes, where: Path, run_id: str | None) -> Any:
    if not data.startswith(MAGIC):
        raise CheckpointError(f"checkpoint {where} is not a psgdlab checkpoint (no {MAGIC[:-1].decode()} header)")
    digest, payload = data[len(MAGIC) : len(MAGIC) + _DIGEST], data[len(MAGIC) + _DIGEST :]
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint {where} is corrupt: its SHA-256 does not match its contents")
    try:
        # tensors and plain values only: a pickle that names any other callable is refused, not run
        state = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as exc:  # torch.load raises UnpicklingError, RuntimeError, EOFError ... on a bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(f"checkpoint {where} is unreadable ({type(exc).__name__}: {first})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {where} holds a {type(state).__name__}, not a checkpoint's dict")
    if run_id is not None and state.get("run_id") != run_id:
        raise CheckpointError(f"checkpoint {where} belongs to run {state.get('run_id')!r}, not to run {run_id!r}")
    return state


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
    run_id: str,
    keep: int = 2,
    n_ranks: int | None = None,
) -> Path:
    """Write ``payload`` (tensors moved to CPU, plain values) as the checkpoint of ``rank`` of run
    ``run_id`` after ``step`` steps, then remove this rank's files older than the ``keep``-th newest
    complete step (``n_ranks`` workers; None: older than the ``keep``-th newest step, complete or
    not)."""
    root = checkpoint_root(run_dir)
    path = root / f"step{step:08d}" / f"rank{rank}.pt"
    try:
        atomic_write_bytes(path, _to_bytes({**_cpu(payload), "run_id": run_id}))
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


def load_checkpoint(run_dir: str | Path, *, step: int, rank: int, run_id: str | None) -> dict[str, Any]:
    """The payload of ``rank``'s checkpoint of ``step`` (:class:`CheckpointError` if it is
    corrupt, unreadable, holds anything but tensors and plain values, or belongs to another run
    than ``run_id``; None: any run)."""
    path = checkpoint_root(run_dir) / f"step{step:08d}" / f"rank{rank}.pt"
    return _from_bytes(_read(path), path, run_id)


def save_server(run_dir: str | Path, payload: dict[str, Any], *, run_id: str) -> Path:
    return atomic_write_bytes(checkpoint_root(run_dir) / "server.pt", _to_bytes({**_cpu(payload), "run_id": run_id}))


def load_server(run_dir: str | Path, *, run_id: str | None) -> dict[str, Any] | None:
    path = checkpoint_root(run_dir) / "server.pt"
    return _from_bytes(_read(path), path, run_id) if path.is_file() else None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read ({exc.strerror or exc})") from None


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
