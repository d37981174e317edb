"""The shared machine: idle cores, load averages and available memory recorded before every run,
and the wait for a quieter machine (``--min-idle-cores``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from psgdlab.validate.plan import ValidateConfig

__all__ = ["idle_cores", "wait_for_quiet", "load_average"]

#: the window over which a run's start is gated on idle cores (one stall of another process
#: should not pass for a quiet machine)
GATE_WINDOW_S = 2.0
#: the window of the record alone (``--min-idle-cores 0``): 0.5 s is 50 scheduler ticks a core
RECORD_WINDOW_S = 0.5


def idle_cores(window_s: float = GATE_WINDOW_S) -> float | None:
    """Cores left idle by every process of the machine over ``window_s`` (``/proc/stat``);
    ``None`` where that file is not readable."""

    def sample() -> tuple[float, float]:
        with open("/proc/stat") as f:
            ticks = [float(x) for x in f.readline().split()[1:]]
        return sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)  # all, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / max(total1 - total0, 1e-9) * (os.cpu_count() or 1)


def wait_for_quiet(vc: ValidateConfig, say: Callable[[str], None]) -> dict[str, Any]:
    """Wait (up to ``vc.max_idle_wait_s``) until ``vc.min_idle_cores`` cores are idle, then say how
    loaded the machine was: the load averages and the idle cores just before the run (over
    :data:`RECORD_WINDOW_S` when nothing waits on them, :data:`GATE_WINDOW_S` when a run does;
    time the hypervisor stole is not idle), and the memory available."""
    t0 = time.monotonic()
    window = GATE_WINDOW_S if vc.min_idle_cores > 0 else RECORD_WINDOW_S
    idle = idle_cores(window)
    while idle is not None and idle < vc.min_idle_cores and time.monotonic() - t0 < vc.max_idle_wait_s:
        say(f"  waiting for {vc.min_idle_cores:g} idle cores (now {idle:.2f})")
        time.sleep(5.0)
        idle = idle_cores(window)
    from psgdlab.runtime.launcher.launch import available_memory_bytes

    memory = available_memory_bytes()
    return {
        "load_average": load_average(),
        "idle_cores": None if idle is None else round(idle, 2),
        "waited_s": round(time.monotonic() - t0, 1),
        # a machine short of memory (page cache dropped, reclaim) runs slower with idle cores
        "memory_available_gb": None if memory is None else round(memory / 1e9, 2),
    }


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine is shared: other work disturbs timings)."""
    return [round(x, 2) for x in os.getloadavg()]
