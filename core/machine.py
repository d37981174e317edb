"""What this machine can give a run: the memory the kernel says new processes may have.

Commands check a request against it before anything starts (``psgdlab train``'s ranks,
``psgdlab predict``'s traces), so a run too large for the machine is one line, not an
out-of-memory kill.
"""

from __future__ import annotations

__all__ = ["available_memory_bytes"]


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
