"""What this machine gives a run: the memory the kernel says new processes may have, and a
process's tie to the one that started it.

Commands check a request against the memory before anything starts (``psgdlab train``'s ranks,
``psgdlab predict``'s traces), so a run too large for the machine is one line, not an
out-of-memory kill. :func:`set_parent_death_signal` ties a child (a rank, a pool worker) to
its parent: a command killed with SIGKILL leaves no process of its own behind.
"""

from __future__ import annotations

import ctypes
import signal

__all__ = ["available_memory_bytes", "set_parent_death_signal"]

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when the thread that started it ends
    (``prctl(PR_SET_PDEATHSIG)``): a ``preexec_fn`` of a launcher's children, a process pool's
    ``initializer`` (a forked pool worker waits for work forever once its parent is gone: its
    siblings hold the work queue open), a rank's own first call. Does nothing where ``prctl``
    is missing (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def available_memory_bytes() -> int | None:
    """The memory this machine can give new processes (``MemAvailable`` of ``/proc/meminfo``),
    ``None`` where the kernel does not say.

    >>> available = available_memory_bytes()
    >>> available is None or available > 0
    True
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
