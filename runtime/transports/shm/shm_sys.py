"""Linux primitives of the shared-memory data plane (:mod:`psgdlab.runtime.transports.shm.shm`), through ctypes.

- :func:`futex_wait` / :func:`futex_wake` on a 32-bit word of a shared mapping (a waiting thread
  sleeps in the kernel, holds no CPU and no GIL, and wakes as soon as the word changes);
- :func:`cma_read`: ``process_vm_readv``, one copy from another process's memory into ours
  (cross-memory attach, what MPICH and Open MPI use for large intra-node messages); the kernel
  allows it to a process that may ptrace the other (same user, and Yama ``ptrace_scope`` 0);
- :func:`start_time` / :func:`is_alive`: a process identity that survives pid reuse;
- :func:`segment_prefix` / :func:`remove_segments`: the names of a process's segments, and their
  removal after it died (a rank killed inside the plane's setup, before the names are unlinked);
- :func:`remove_orphaned`: segments of another library (MPICH's ``mpich_shm_*``, which a rank
  killed before ``MPI_Finalize`` leaves behind) created since a moment and mapped or held open
  by no process.

Everything here is x86-64 Linux: the data plane relies on its ordered stores (a word written
after a payload is never seen before the payload) and is off elsewhere.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Iterable
from pathlib import Path

from psgdlab.core.files import process_start_time

__all__ = [
    "SUPPORTED",
    "SHM_DIR",
    "futex_wait",
    "futex_wake",
    "cma_read",
    "start_time",
    "is_alive",
    "segment_prefix",
    "remove_segments",
    "remove_orphaned",
]

#: where the data plane's segments live (POSIX shared memory)
SHM_DIR = Path("/dev/shm")

#: the data plane needs Linux futexes and x86's store order
SUPPORTED = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not PRIVATE): the word lives in a mapping of several processes


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True) if SUPPORTED else None
if _libc is not None:
    _libc.syscall.restype = ctypes.c_long
    _libc.process_vm_readv.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    _libc.process_vm_readv.restype = ctypes.c_ssize_t


def futex_wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the 32-bit word at ``address`` holds ``expected`` (at most ``timeout_s``;
    returns at once when it differs; spurious returns are possible: callers re-check)."""
    ts = _Timespec(int(timeout_s), int((timeout_s % 1) * 1e9))
    _libc.syscall(  # type: ignore[union-attr]  # loaded above on Linux, the only platform calling these
        ctypes.c_long(_SYS_FUTEX),
        ctypes.c_void_p(address),
        ctypes.c_int(_FUTEX_WAIT),
        ctypes.c_uint32(expected & 0xFFFFFFFF),
        ctypes.byref(ts),
        None,
        ctypes.c_int(0),
    )


def futex_wake(address: int) -> None:
    """Wake every thread sleeping in :func:`futex_wait` on the word at ``address``."""
    _libc.syscall(  # type: ignore[union-attr]  # loaded above on Linux, the only platform calling these
        ctypes.c_long(_SYS_FUTEX),
        ctypes.c_void_p(address),
        ctypes.c_int(_FUTEX_WAKE),
        ctypes.c_int(2**31 - 1),
        None,
        None,
        ctypes.c_int(0),
    )


def cma_read(pid: int, local_address: int, remote_address: int, nbytes: int) -> None:
    """Copy ``nbytes`` at ``remote_address`` of process ``pid`` to ``local_address`` of ours."""
    done = 0
    while done < nbytes:
        local = _Iovec(local_address + done, nbytes - done)
        remote = _Iovec(remote_address + done, nbytes - done)
        got = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)  # type: ignore[union-attr]
        if got <= 0:
            err = ctypes.get_errno()
            raise OSError(err, f"process_vm_readv from pid {pid}: {os.strerror(err)}")
        done += got


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (None: no such process;
    :func:`psgdlab.core.files.process_start_time`)."""
    return process_start_time(pid)


def is_alive(pid: int, started: int) -> bool:
    """Whether process ``pid`` that started at ``started`` (:func:`start_time`) still runs."""
    return start_time(pid) == started


def segment_prefix(pid: int) -> str:
    """The name prefix of the segment process ``pid`` creates in ``/dev/shm``."""
    return f"psgdlab-{pid}-"


def remove_segments(pids: Iterable[int]) -> list[str]:
    """Unlink the segments of the processes ``pids`` that no longer run (the launcher's clean-up
    after its ranks ended); returns the names removed."""
    gone = [pid for pid in pids if start_time(pid) is None]  # a running pid's segments are its own
    return _unlink(path for pid in gone for path in SHM_DIR.glob(f"{segment_prefix(pid)}*"))


def _unlink(paths: Iterable[Path]) -> list[str]:
    """Unlink ``paths`` (those already gone are skipped); the names removed."""
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass
    return removed


def _in_use() -> set[str]:
    """Names under ``/dev/shm`` that some process maps or holds open (``/proc/*/maps``, ``fd``)."""
    used: set[str] = set()
    prefix = str(SHM_DIR) + "/"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                at = line.find(prefix)
                if at >= 0:
                    used.add(line[at + len(prefix) :].split(" ")[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(prefix):
                    used.add(target[len(prefix) :])
        except OSError:  # the process ended, or is not ours to read
            continue
    return used


def remove_orphaned(pattern: str, since: float) -> list[str]:
    """Unlink the segments of ``/dev/shm`` matching ``pattern`` (a glob) that were changed at or
    after ``since`` (a :func:`time.time`) and that no process maps or holds open; returns the
    names removed. A segment another run still uses is mapped by its ranks, so it stays."""
    candidates = []
    for path in SHM_DIR.glob(pattern):
        try:
            if path.stat().st_mtime >= since:
                candidates.append(path)
        except FileNotFoundError:
            pass
    if not candidates:
        return []
    used = _in_use()
    return _unlink(path for path in candidates if path.name not in used)
