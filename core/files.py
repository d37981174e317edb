r"""The one writer of psgdlab's output files: an exclusive temporary file, fsync, rename, fsync
of the directory.

Every file psgdlab writes (JSON, text, NPZ, HDF5, figures, checkpoints, TOML profiles, Chrome
traces) is first written under a temporary name beside its target and renamed over it once
complete, so a reader sees the old file or the new one, never half of one. The temporary file is

- **created exclusively** (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600): a file or a symbolic
  link already at that name makes the creation fail instead of being written through, so a link
  planted beside an output cannot redirect the write to a file it points at;
- **named so that nobody can predict it**: ``.NAME[.TAG].RANDOM.tmpPID``, where ``RANDOM`` is 64
  random bits (:func:`temporary_path`); the writer's process id at the end lets a launcher find
  what a killed writer left (:func:`temporary_writer`, :data:`TEMPORARY_GLOB`);
- **synced**: the data is fsync'ed before the rename and the directory after it, so a crash of
  the machine leaves the old file or the complete new one;
- **given the mode a plain ``open`` would have given** (``0666`` less the umask) just before the
  rename: a reader never sees the file with a mode other than its final one.

A write that fails (a full disk: ``ENOSPC``) removes its temporary file and raises the
:class:`OSError`, naming the target; the target keeps its old contents. Libraries that write through a file
object (numpy's ``savez``, matplotlib's ``savefig``, ``torch.save``) write into memory and hand
the bytes to :func:`atomic_write_bytes`; HDF5 builds its image in memory as well
(:func:`psgdlab.models.data.write_corpus`): a write error inside the HDF5 library crashed the
process at exit (SIGSEGV) and left its temporary file.

Examples
--------
>>> import tempfile, pathlib
>>> with tempfile.TemporaryDirectory() as tmp:
...     target = pathlib.Path(tmp) / "summary.json"
...     _ = atomic_write_json(target, {"steps": 3})
...     sorted(p.name for p in pathlib.Path(tmp).iterdir()), target.read_text().split()
(['summary.json'], ['{', '"steps":', '3', '}'])
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = [
    "TEMPORARY_GLOB",
    "atomic_file",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "append_text",
    "fsync_directory",
    "json_default",
    "process_start_time",
    "temporary_path",
    "temporary_writer",
]

#: the glob every temporary file of :func:`temporary_path` matches (the one pattern a launcher's
#: clean-up searches run directories with)
TEMPORARY_GLOB = ".*.tmp*"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_umask: int | None = None


def temporary_path(path: str | os.PathLike[str], tag: str = "") -> Path:
    """A fresh name to write ``path`` under before it is complete: ``.NAME[.TAG].RANDOM.tmpPID``
    beside it, ``RANDOM`` 16 hex digits from :mod:`secrets` (nobody can plant a link at a name
    they cannot guess), ``PID`` this process's id (:func:`temporary_writer` reads it back;
    ``tag`` tells apart writers on hosts whose process ids may repeat). A caller that creates the
    file itself must create it exclusively; :func:`atomic_file` does.

    >>> name = temporary_path("/run/epoch00000002.json", tag="3").name
    >>> name.startswith(".epoch00000002.json.3."), temporary_writer(name) == os.getpid()
    (True, True)
    >>> temporary_path("/run/a.json") != temporary_path("/run/a.json")
    True
    """
    path = Path(path)
    return path.with_name(f".{path.name}{'.' + tag if tag else ''}.{secrets.token_hex(8)}.tmp{os.getpid()}")


def temporary_writer(path: str | os.PathLike[str]) -> int | None:
    """The process id :func:`temporary_path` put in ``path``'s name, or ``None`` for another name.

    >>> temporary_writer(".epoch00000002.json.3.9f86d081884c7d65.tmp4532"), temporary_writer("epoch00000002.json")
    (4532, None)
    """
    name = Path(path).name
    last = name.rsplit(".", 1)[-1]
    return int(last[3:]) if name.startswith(".") and last.startswith("tmp") and last[3:].isdigit() else None


def process_start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat``), or
    ``None`` when no such process runs (a zombie has exited): a process id with its start time
    names one process, where a process id alone may have been reused.

    >>> process_start_time(os.getpid()) is not None, process_start_time(0)
    (True, None)
    """
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == b"Z" else int(fields[19])


def _file_mode() -> int:
    """``0666`` less this process's umask (read once: ``Umask`` of ``/proc/self/status``)."""
    global _umask
    if _umask is None:
        try:
            with open("/proc/self/status") as fh:
                _umask = next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
        except (OSError, StopIteration, ValueError, IndexError):
            _umask = os.umask(0o022)  # no /proc: read it by setting it, and put it back at once
            os.umask(_umask)
    return 0o666 & ~_umask


def fsync_directory(path: str | os.PathLike[str]) -> None:
    """fsync the directory ``path`` (a rename in it lasts past a crash of the machine); file
    systems that cannot sync a directory are passed over."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EROFS, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _create_temporary(path: Path, tag: str) -> tuple[int, Path]:
    """Create a temporary file for ``path`` exclusively; its descriptor and name."""
    for _ in range(16):
        tmp = temporary_path(path, tag)
        try:
            return os.open(tmp, _CREATE, 0o600), tmp
        except FileExistsError:  # 64 random bits taken: another try
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path}")


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``fd`` (the one place every output's bytes go through)."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, tag: str = "") -> Iterator[IO[bytes]]:
    """A binary file object to write ``path``'s new contents to; when the block ends without an
    error the file is synced, given its final mode and renamed over ``path`` (module docstring),
    else removed. The parent directories are made as needed.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     with atomic_file(Path(tmp) / "a.bin") as fh:
    ...         _ = fh.write(b"abc")
    ...     (Path(tmp) / "a.bin").read_bytes()
    b'abc'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path, tag)
    try:
        with os.fdopen(fd, "wb", closefd=True) as fh:
            yield fh
            fh.flush()
            os.fchmod(fh.fileno(), _file_mode())
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | memoryview, *, tag: str = "") -> Path:
    """Write ``data`` as ``path`` through an exclusive temporary file (module docstring); returns
    ``path``. On an error (a full disk) nothing is renamed and the temporary file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path, tag)
    try:
        try:
            _write_all(fd, data)
            os.fchmod(fd, _file_mode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if exc.filename is None:  # a write's error names no file: name the one being written
            raise type(exc)(exc.errno, exc.strerror, str(path)) from None
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str, *, tag: str = "") -> Path:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), tag=tag)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """:func:`atomic_write_text` of ``obj`` as indented JSON with sorted keys (numpy scalars and
    arrays, tuples, sets and paths as their JSON forms)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=json_default) + "\n")


def json_default(obj: Any) -> Any:
    """``json.dumps``'s ``default`` for the values psgdlab's records hold."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def append_text(path: str | os.PathLike[str], text: str) -> None:
    """Append ``text`` to the log ``path``, created with the mode a plain ``open`` gives; a
    symbolic link at ``path`` is refused (``ELOOP``), never followed."""
    fd = os.open(path, _APPEND, _file_mode())
    try:
        _write_all(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
