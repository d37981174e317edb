r"""Ranks die with their launcher: a launcher killed by SIGKILL leaves no rank running.

A launcher (``psgdlab train``'s, the probe's, torchrun's agent under it) names itself to the
processes it starts in :data:`LAUNCHER_ENV` (its process id and start time,
:func:`launcher_environment`). Each rank, first thing at its start, calls
:func:`die_with_launcher`, which ties its life to that launcher three ways:

1. where the rank's parent is the launcher itself (the ranks of one host, and those of emulated
   hosts: ``ip netns exec`` replaces itself with the rank, so the chain is launcher -> rank), the
   kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``): the rank is killed the
   moment the launcher's thread that started it ends, however it ends;
2. the launcher may have died before the rank set that signal (it would never come), so right
   after, the rank checks that its parent is still the launcher (a rank whose launcher died is
   given another parent) and leaves at once if not;
3. where the chain is longer (mpiexec and its hydra proxy, torchrun's agent between launcher and
   rank), a daemon thread waits on the launcher's pidfd (``pidfd_open``; the launcher's start
   time is checked, so a reused process id does not count) and kills the rank when the launcher
   ends. The process between them (mpiexec, the agent) has its own parent-death signal from the
   launcher (:func:`set_parent_death_signal` as its ``preexec_fn``). The rank sets none towards
   such a parent: it would fire when the parent's thread that started it ended.

A rank under a psgdlab launcher also ignores SIGINT: a Ctrl-C in a terminal reaches every process
of the foreground group, and the launcher stops its ranks itself (SIGTERM, a checkpoint at the
next step boundary) where each rank's own KeyboardInterrupt printed a traceback. A rank started
by hand, or by a launcher psgdlab did not write (torchrun, srun), has no :data:`LAUNCHER_ENV` and
is left alone.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from collections.abc import Mapping

from psgdlab.core.files import process_start_time
from psgdlab.core.platform.machine import set_parent_death_signal  # here for the launchers that import it

__all__ = ["LAUNCHER_ENV", "launcher_environment", "die_with_launcher", "set_parent_death_signal"]

#: ``PID:START`` of the launcher whose death ends the rank (START: clock ticks since boot)
LAUNCHER_ENV = "PSGDLAB_LAUNCHER"


def launcher_environment() -> dict[str, str]:
    """The environment entry that names this process as the launcher of the ranks it starts."""
    pid = os.getpid()
    return {LAUNCHER_ENV: f"{pid}:{process_start_time(pid) or 0}"}


def _launcher(environ: Mapping[str, str]) -> tuple[int, int] | None:
    text = environ.get(LAUNCHER_ENV, "")
    pid, _, start = text.partition(":")
    if not (pid.isdigit() and start.isdigit()):
        return None
    return int(pid), int(start)


def die_with_launcher(environ: Mapping[str, str] | None = None) -> None:
    """Tie this process's life to the launcher :data:`LAUNCHER_ENV` names (module docstring):
    the parent-death signal, a check that the launcher still runs (else this process exits at
    once with status 1 and one line on stderr), and a thread that kills this process when the
    launcher ends. SIGINT is ignored: the launcher stops its ranks itself (it forwards SIGTERM).
    Without :data:`LAUNCHER_ENV` nothing happens."""
    launcher = _launcher(os.environ if environ is None else environ)
    if launcher is None:
        return
    pid, start = launcher
    # a Ctrl-C reaches the whole foreground process group; the launcher turns it into a stop of
    # every rank (SIGTERM), where the rank's own KeyboardInterrupt printed a traceback per rank
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getppid() == pid:
        set_parent_death_signal()
        alive = os.getppid() == pid  # not reparented: the launcher did not die before the signal was set
    else:  # a longer chain: watch the launcher itself
        alive = process_start_time(pid) == start and _watch(pid, start)
    if not alive:
        print(f"psgdlab: the launcher (pid {pid}) is gone; this rank (pid {os.getpid()}) ends", file=sys.stderr)
        os._exit(1)


def _watch(pid: int, start: int) -> bool:
    """Start a daemon thread that SIGKILLs this process when process ``pid`` (started at
    ``start``) ends; False when it has ended already."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):  # no pidfd (Linux < 5.3)
        fd = -1
    if process_start_time(pid) != start:  # ended, or the pid was reused, before the pidfd was opened
        if fd >= 0:
            os.close(fd)
        return False

    def wait() -> None:
        if fd >= 0:
            select.select([fd], [], [])
        else:  # no pidfd (Linux < 5.3): poll the start time
            while process_start_time(pid) == start:
                threading.Event().wait(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="psgdlab-lifeline", daemon=True).start()
    return True
