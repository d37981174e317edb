"""The run directory every executor writes, the environment record it holds, and its life:
one writer at a time, never over another run, complete only once committed.

Layout::

    RUN_DIR/
      config.resolved.json   the fully resolved configuration
      env.json               versions, git SHA, host, world size, source
      trace.npz              the trace (psgdlab.core.records.trace schema)
      summary.json           a :class:`Summary`: which case (source, algorithm, its parameters,
                             workers, case name) and its figures (psgdlab.core.records.trace.summarize
                             plus executor extras), flat in one JSON object; or, for a run
                             directory of several cases, a sweep's or a plan's summary
                             (psgdlab.core.records.summaries); every shape starts with schema_version,
                             kind and source, and is written by write_summary
      timeline.json          Chrome/Perfetto timeline
      *.png                  plots
      complete.json          the commit marker, written last (:func:`commit_run`)
      .lock                  held by the command writing the directory (:func:`open_run_dir`)

Every file is written through the one safe writer (:mod:`psgdlab.core.files`: an exclusive
temporary file, renamed). The rules of a run directory:

- **Complete only when committed.** The writer writes :data:`COMPLETE_FILE` last, listing the
  files it commits (each path and its size; a sweep's marker commits its cases ``runs/NAME``
  too); every reader of run directories
  (:func:`read_summary`, :func:`require_complete`: ``compare``, ``calibrate``,
  ``validate --measured``, ``--convergence``) refuses a directory without it in one line. A run
  that failed, was killed or met a full disk leaves no marker, so nothing reads it as a result.
- **One writer.** :func:`open_run_dir` takes an exclusive ``fcntl.flock`` on :data:`LOCK_FILE`
  for the command's life (the ``psgdlab train`` launcher holds it for its ranks); a second
  command into the same directory stops at once, naming the holder's process id. The lock dies
  with its holder (a forked child, a pool worker, closes its copy), so a killed command leaves a
  *stale* lock record, which the next command reports and replaces.
- **Never over another run.** A directory that holds a run (:func:`holds_run`) is refused unless
  the command is given ``--force`` (which removes everything in it first) or continues that run
  (``train --resume``).
- **Owned by the user.** The directory, or the nearest existing folder it would be created under,
  must belong to the user running the command (or, for a folder it is created under, root: like
  ``/tmp``); a folder everyone may write to without the sticky bit is refused too
  (:func:`require_own_directory`).
- **Cleaned of what killed writers left.** The next command in a directory removes the temporary
  files of writers no longer running, and says in one line on stderr what it found and cleaned
  (a stale lock, temporary files, the files of the run it replaces).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import platform
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from psgdlab.core.errors import ConfigError
from psgdlab.core.files import TEMPORARY_GLOB, atomic_write_json, process_start_time, temporary_writer
from psgdlab.core.records.summaries import HEADER_KEYS, PlanSummary, SweepSummary, header, kind_of

__all__ = [
    "RunDir",
    "Summary",
    "RunSummary",
    "environment",
    "default_run_dir",
    "read_summary",
    "read_run_summary",
    "write_summary",
    "RunLock",
    "COMPLETE_FILE",
    "LOCK_FILE",
    "open_run_dir",
    "commit_run",
    "is_complete",
    "require_complete",
    "holds_run",
    "require_own_directory",
    "require_private_directory",
]

SUMMARY_FILE = "summary.json"
#: the commit marker: a run directory is complete only when it is there
COMPLETE_FILE = "complete.json"
#: the lock file the writing command holds (``fcntl.flock``)
LOCK_FILE = ".lock"
#: entries any psgdlab run directory holds one of from its start (beside the marker and the lock)
RUN_SIGNATURE = (
    COMPLETE_FILE,
    SUMMARY_FILE,
    "config.resolved.json",
    "env.json",
    "launch.json",
    "checkpoints",
    ".ranks",
    "probe.json",
    "validate.json",
    "compare.json",
)


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
        Everything measured or predicted (:func:`psgdlab.core.records.trace.summarize` and the
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
        """One flat JSON object: the header (:func:`psgdlab.core.records.summaries.header`), the case
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


#: every shape of ``summary.json`` (:mod:`psgdlab.core.records.summaries`)
RunSummary = Summary | SweepSummary | PlanSummary


def write_summary(run: RunDir | str | os.PathLike[str], summary: RunSummary) -> Path:
    """Write ``summary`` as ``summary.json`` of ``run`` (atomically); the one writer of the file,
    whatever its shape."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    return run.write_json(SUMMARY_FILE, summary.to_json())


def _summary_json(run: RunDir | str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """``run``'s directory and its ``summary.json`` object; a directory that is not committed
    (:func:`require_complete`) is a one-line :class:`ConfigError`."""
    path = run.path if isinstance(run, RunDir) else Path(run)
    p = path / SUMMARY_FILE
    if not p.is_file():
        raise ConfigError(f"run directory {path} has no {SUMMARY_FILE} (is it a psgdlab run directory?)")
    require_complete(path)
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
    """The summary of ``run``, whatever its shape (:func:`psgdlab.core.records.summaries.kind_of`)."""
    path, obj = _summary_json(run)
    kind = kind_of(obj, where=path)
    if kind == "sweep":
        return SweepSummary.from_json(obj)
    if kind == "plan":
        return PlanSummary.from_json(obj)
    return Summary.from_json(obj, where=path)


# ----- commit ----------------------------------------------------------------------------------
def commit_run(path: str | os.PathLike[str], *, command: str) -> Path:
    """Write ``path``'s commit marker :data:`COMPLETE_FILE`: the files it holds (relative path
    and size; the lock, the ranks' run-time folder and temporary files left out) and the command
    that wrote them. The marker commits the run's cases too (``runs/NAME``, as ``predict``
    writes them; :func:`require_complete`): one file, so a case read alone is complete exactly
    when its sweep is. Call it after every other file is written; a second call (a figure drawn
    after the runtime's commit) writes it again over the same and the new files."""
    root = Path(path)
    files = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        # a run writes no hidden file of its own: its lock, the ranks' folder, temporary files
        if rel.parts[0] == COMPLETE_FILE or any(part.startswith(".") for part in rel.parts):
            continue
        with contextlib.suppress(OSError):
            st = p.lstat()
            if stat.S_ISREG(st.st_mode):
                files[str(rel)] = st.st_size
    record = {
        "complete": True,
        "command": command,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    return atomic_write_json(root / COMPLETE_FILE, record)


def is_complete(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a commit marker (:func:`commit_run`)."""
    return (Path(path) / COMPLETE_FILE).is_file()


def _committed_case(path: Path) -> bool:
    """Whether ``path`` is a case ``SWEEP/runs/NAME`` that its sweep's marker commits."""
    if path.parent.name != "runs" or not is_complete(path.parent.parent):
        return False
    try:
        files = json.loads((path.parent.parent / COMPLETE_FILE).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return False
    return f"runs/{path.name}/{SUMMARY_FILE}" in files


def require_complete(path: str | os.PathLike[str]) -> None:
    """Refuse, in one line, a run directory without its commit marker: the run that wrote it did
    not finish (it failed, was stopped or killed, met a full disk, or still runs)."""
    path = Path(path)
    if is_complete(path) or _committed_case(path):
        return
    if not holds_run(path):
        raise ConfigError(
            f"{path} is not a psgdlab run directory: it has no {SUMMARY_FILE} nor {COMPLETE_FILE}"
            if path.is_dir()
            else f"run directory {path} does not exist"
        )
    holder = lock_holder(path)
    still = f"; pid {holder[0]} ({holder[1]}) is still writing it" if holder else ""
    raise ConfigError(
        f"run directory {path} is incomplete: it has no {COMPLETE_FILE}, so the run that wrote it did not finish "
        f"(it failed, was stopped or killed, or met a full disk){still}; it is not read as a result"
    )


# ----- ownership -------------------------------------------------------------------------------
def require_own_directory(path: str | os.PathLike[str], *, what: str = "--out") -> None:
    """Refuse (one line) a directory ``path`` that another user owns (the path itself, through a
    symbolic link or not), that exists and is not a directory, or, when it does not exist yet,
    whose nearest existing folder belongs to another user (root's folders, like ``/tmp``, are
    fine) or may be written by everyone without the sticky bit: its owner, or anyone, could
    replace or plant files in it."""
    path = Path(path)
    euid = os.geteuid()
    try:
        own = os.lstat(path)
    except FileNotFoundError:
        own = None
    except NotADirectoryError:
        raise ConfigError(f"{what} {path} cannot be made: a folder on its path is a file, not a directory") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be examined ({exc.strerror})") from None
    if own is not None:
        if stat.S_ISLNK(own.st_mode) and own.st_uid not in (euid, 0):
            raise ConfigError(f"{what} {path} is a symbolic link owned by another user (uid {own.st_uid}): refused")
        try:
            target = os.stat(path)
        except OSError as exc:
            raise ConfigError(f"{what} {path} is a symbolic link to nowhere ({exc.strerror})") from None
        if not stat.S_ISDIR(target.st_mode):
            raise ConfigError(f"{what} {path} exists and is not a directory")
        if target.st_uid != euid:
            raise ConfigError(
                f"{what} {path} is owned by another user (uid {target.st_uid}, you are {euid}): refused; "
                "choose a directory of your own"
            )
        return
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    st = os.stat(parent)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {path} cannot be made: {parent} is not a directory")
    if st.st_uid not in (euid, 0):
        raise ConfigError(
            f"{what} {path} would be made under {parent}, which is owned by another user (uid {st.st_uid}): refused"
        )
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise ConfigError(
            f"{what} {path} would be made under {parent}, which every user may write to without the sticky bit: "
            "refused (anyone could replace what is written there)"
        )


def require_private_directory(path: str | os.PathLike[str], *, what: str) -> None:
    """Refuse (one line) a directory that is not this user's alone: owned by another user, a
    symbolic link, or writable by its group or by everyone (a cache in a shared folder, where
    another user could have made it first and planted files or links in it)."""
    path = Path(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {path} is not a directory (a symbolic link or a file): refused")
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"{what} {path} is not yours alone (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): refused; "
            "remove it or make it yours with mode 700"
        )


def holds_run(path: str | os.PathLike[str]) -> bool:
    """Whether the directory ``path`` holds a psgdlab run (complete or not): one of
    :data:`RUN_SIGNATURE`, or a commit marker."""
    path = Path(path)
    return path.is_dir() and any(os.path.lexists(path / name) for name in RUN_SIGNATURE)


def describe_run(path: str | os.PathLike[str]) -> str:
    """``a complete predict run``, ``an incomplete run (no complete.json), with checkpoints of
    run 3fa2… (2 workers)``: what ``path`` holds, for a refusal."""
    path = Path(path)
    command = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        command = json.loads((path / COMPLETE_FILE).read_text()).get("command")
    text = f"a complete {command or 'psgdlab'} run" if is_complete(path) else f"an incomplete run (no {COMPLETE_FILE})"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        record = json.loads((path / "checkpoints" / "run.json").read_text())
        text += f", with checkpoints of run {record['run_id']} ({record['workers']} workers)"
    return text


# ----- the lock --------------------------------------------------------------------------------
def lock_holder(path: str | os.PathLike[str]) -> tuple[int, str] | None:
    """The process id and command that hold ``path``'s lock now, or ``None`` (no lock, or a
    stale record of a process that no longer runs)."""
    record = _read_lock_record(Path(path) / LOCK_FILE)
    if record is None or process_start_time(record[0]) != record[1]:
        return None
    return record[0], record[2]


def _read_lock_record(lock: Path) -> tuple[int, int, str] | None:
    """``(pid, start time, command)`` of a lock file, or ``None``."""
    try:
        with open(lock, "rb") as fh:  # a link here is never written through; reading it is harmless
            text = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    parts = text.split(maxsplit=2)
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1]), parts[2].strip() if len(parts) > 2 else "?"


#: the lock files this process holds, closed in every child it forks (:func:`_forget_in_child`)
_HELD_FDS: set[int] = set()


def _forget_in_child() -> None:
    """In a forked child (a pool worker of ``predict``), close the copies of this process's lock
    files: a child must not hold its parent's run directory after the parent dies (its copy of
    the lock kept a killed command's directory locked while the pool's workers lingered);
    closing a copy does not release the parent's lock."""
    for fd in _HELD_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_FDS.clear()


os.register_at_fork(after_in_child=_forget_in_child)


@dataclass(eq=False)
class RunLock:
    """A run directory held by this process (:func:`open_run_dir`): the lock, what was found
    and cleaned when it was taken, and the commit. A context manager: the lock is released when
    the block ends (the directory removed again if the command made it and wrote nothing)."""

    path: Path
    command: str
    fd: int = -1
    made: Path | None = None
    found: list[str] = field(default_factory=list)

    def commit(self) -> Path:
        """:func:`commit_run` of the directory."""
        return commit_run(self.path, command=self.command)

    def empty(self) -> int:
        """Remove everything in the directory but the lock; how many entries were removed."""
        entries = [p for p in self.path.iterdir() if p.name != LOCK_FILE]
        for p in entries:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        return len(entries)

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent)."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path / LOCK_FILE)
        _HELD_FDS.discard(self.fd)
        os.close(self.fd)
        self.fd = -1
        if self.made is not None:  # made by this command, which wrote nothing: leave nothing behind
            with contextlib.suppress(OSError):
                self.path.rmdir()
                for parent in self.path.parents:
                    if parent == self.made.parent:
                        break
                    parent.rmdir()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def open_run_dir(
    path: str | os.PathLike[str] | None,
    *,
    command: str,
    force: bool = False,
    resume: bool = False,
    what: str = "--out",
    kind: str | None = None,
) -> RunLock:
    """Take the run directory ``path`` for ``command`` (module docstring): check its owner, make
    it, lock it, refuse it when it holds another run (``force``: remove everything in it, which
    only a directory that holds a run is; ``resume``: the run continues), remove what killed
    writers left, and say on stderr in one line what was found and cleaned. The commit marker of
    an earlier commit is removed: the directory is incomplete again until this command commits.

    ``path`` None: a fresh ``runs/KIND-TIMESTAMP[-N]`` (``kind`` default ``command``), made
    here with an exclusive ``mkdir`` so two commands that start in the same second never share
    it (:func:`default_run_dir` only names one).

    Raises
    ------
    ConfigError
        Owned by another user, not a directory, locked by a running process (named), or holding
        another run without ``force``.
    """
    made: Path | None
    if path is None:
        path, made = _reserve(kind or command, what=what)
    else:
        path = Path(path)
        require_own_directory(path, what=what)
        made = _make(path)
    lock = RunLock(path=Path(path), command=command, made=made)
    try:
        _lock(lock)
        if force:
            _clear(lock)
        elif not resume and holds_run(path):
            found = f" (found: {'; '.join(lock.found)})" if lock.found else ""
            raise ConfigError(
                f"{what} {path} holds another run ({describe_run(path)}): --force replaces it (everything in it "
                f"is removed first); another --out keeps it{found}"
            )
        _remove_orphans(lock)
        (path / COMPLETE_FILE).unlink(missing_ok=True)
    except BaseException:
        lock.release()
        raise
    if lock.found:
        print(f"psgdlab: {path}: {'; '.join(lock.found)}", file=sys.stderr, flush=True)
    return lock


def _reserve(kind: str, *, what: str) -> tuple[Path, Path]:
    """Make a fresh ``runs/KIND-TIMESTAMP[-N]`` exclusively; it, and the folder to remove up to
    (its ``runs``: an empty one goes with it, whoever made it, so that two commands that made
    and removed their directories side by side leave no empty ``runs`` behind)."""
    base = default_run_dir(kind)
    require_own_directory(base, what=what)
    for i in range(1, 1000):
        path = base if i == 1 else base.with_name(f"{base.name}-{i}")
        base.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()
        except FileExistsError:  # another command took this name a moment ago
            continue
        return path, path.parent
    raise ConfigError(f"no free run directory name beside {base} (1000 taken): give --out")


def _make(path: Path) -> Path | None:
    """Make ``path`` (and its parents); the topmost folder made, or ``None`` if it existed."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    return missing[-1] if missing else None


def _lock(lock: RunLock) -> None:
    """Take ``lock.path``'s lock file exclusively (not blocking), check it is the file at that
    name (not one unlinked by a holder that just released it), note a stale record, write ours."""
    name = lock.path / LOCK_FILE
    for _ in range(8):
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ConfigError(f"{name} is a symbolic link: refused (a lock file is never followed)") from None
            raise
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise ConfigError(f"{name} is owned by another user (uid {st.st_uid}): refused")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            record = _read_lock_record(name)
            who = f"pid {record[0]} ({record[2]})" if record else "another process"
            raise ConfigError(
                f"run directory {lock.path} is in use by {who}, which holds its lock: wait for it to end or "
                "choose another --out"
            ) from None
        try:
            same = os.stat(name, follow_symlinks=False)
        except FileNotFoundError:
            same = None
        if same is None or (same.st_dev, same.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)  # the holder released it and unlinked the file meanwhile: take the new one
            continue
        stale = _read_lock_record(name)
        if stale is not None and stale[0] != os.getpid():
            lock.found.append(f"a stale lock of pid {stale[0]} ({stale[2]}), which no longer runs: taken over")
        me = os.getpid()
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{me} {process_start_time(me) or 0} {lock.command}\n".encode(), 0)
        lock.fd = fd
        _HELD_FDS.add(fd)
        return
    raise ConfigError(f"run directory {lock.path}: its lock file kept changing; try again")


def _clear(lock: RunLock) -> None:
    """``--force``: remove everything in a directory that holds a run, but the lock, noting
    what; a directory that holds no run keeps its files (``--out ~ --force`` empties nothing)."""
    if not holds_run(lock.path):
        return
    what = describe_run(lock.path)
    removed = lock.empty()
    lock.found.append(f"--force: removed the {removed} entries of {what}")


def _remove_orphans(lock: RunLock) -> None:
    """Remove the temporary files of writers that no longer run (a killed command or rank),
    noting how many."""
    running: dict[int, bool] = {}
    left: list[tuple[Path, int]] = []
    for p in lock.path.rglob(TEMPORARY_GLOB):
        pid = temporary_writer(p)
        if pid is not None and not running.setdefault(pid, process_start_time(pid) is not None):
            left.append((p, pid))
    for p, _ in left:
        with contextlib.suppress(OSError):
            p.unlink()
    if left:
        pids = sorted({pid for _, pid in left})
        named = ", ".join(map(str, pids[:5])) + (f" and {len(pids) - 5} more" if len(pids) > 5 else "")
        lock.found.append(f"removed {len(left)} temporary files left by writers no longer running (pid {named})")
