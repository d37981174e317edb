"""What every launcher gives the ranks it starts (:mod:`psgdlab.runtime.launcher.launch`, and
:mod:`psgdlab.runtime.launcher.elastic`'s agent): their run-time directory, their environment, the grace
periods of stopping them, and how their exits are said."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from psgdlab.core.platform.placement import local_ranks
from psgdlab.core.records.rundir import SUMMARY_FILE
from psgdlab.runtime.launcher.lifeline import launcher_environment, set_parent_death_signal
from psgdlab.runtime.transports.env import STORE_FD_ENV, in_main_thread

__all__ = [
    "GRACE_S",
    "RANK_ENV",
    "RANKS_DIR",
    "STOP_GRACE_S",
    "describe_exit",
    "describe_interruption",
    "oom_kills",
    "free_port",
    "rank_environment",
    "rendezvous_socket",
    "start_ranks",
    "store_environment",
]

#: under the run directory: the ranks' pid, done, crash and abort files
RANKS_DIR = ".ranks"
#: set for every rank unless the caller's environment says otherwise. ``THP_MEM_ALLOC_ENABLE``
#: stays torch's default (off): with it, every tensor of 2 MiB or more is a fresh huge-page
#: mapping, zeroed on first touch and unmapped when freed, which the per-step temporaries of a
#: training step pay for (docs/measurements.md, "Huge pages"). Setting it in the environment
#: still reaches the ranks.
RANK_ENV = {"THP_MEM_ALLOC_ENABLE": "0"}
#: between SIGTERM and SIGKILL when ranks are stopped
GRACE_S = 5.0
#: after a forwarded SIGINT/SIGTERM, how long ranks have to checkpoint and leave
STOP_GRACE_S = 30.0


@contextlib.contextmanager
def signals_to(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """SIGTERM and SIGINT go to ``handler`` inside the block (a launcher forwards them to its ranks),
    and to the handlers before it after; outside the main thread (where Python sets no handler)
    nothing changes."""
    old_handlers = {}
    if in_main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            old_handlers[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in old_handlers.items():
            signal.signal(sig, old)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rendezvous_socket() -> socket.socket:
    """A TCP socket bound to a free port of 127.0.0.1, listening: the server socket of the ranks'
    rendezvous store, which rank 0 inherits (``pass_fds``) and serves
    (:func:`psgdlab.runtime.transports.channels.open_channels`). The port stays bound from its choice to the
    store: with :func:`free_port`, another process (a second run starting on the machine, any
    outgoing connection given that port) could take it while rank 0 was still importing torch,
    and rank 0 failed to listen. The launcher closes its copy once the ranks have started."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        s.listen(socket.SOMAXCONN)
    except OSError:
        s.close()
        raise
    return s


def store_environment(sock: socket.socket) -> dict[str, str]:
    """The environment by which the ranks of one launch find the store of :func:`rendezvous_socket`
    (rank 0 must also be given ``pass_fds=(sock.fileno(),)``)."""
    port = sock.getsockname()[1]
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), STORE_FD_ENV: str(sock.fileno())}


def start_ranks(
    cmd: Sequence[str],
    env: Mapping[str, str],
    world: int,
    *,
    hosts: Any = None,
    placement: Sequence[int] = (),
    master_port: int = 0,
    stderr: Any = None,
    on_start: Callable[[int, subprocess.Popen], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[subprocess.Popen]:
    """Start ``cmd`` once per rank of ``world`` on this machine, each with ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK`` and the rendezvous in its environment (``env`` and those); ``on_start(rank,
    process)`` is called as each starts (a launcher's signal handler sees the ranks started so far).
    ``stop()`` is asked before each start: once it says True (SIGINT reached the launcher) no
    further rank starts and the ranks started so far are returned, for the caller to stop.

    On one host (``hosts`` None) rank 0 serves the store on a :func:`rendezvous_socket` bound
    here, which this function closes once rank 0 holds it. On emulated hosts
    (:class:`psgdlab.runtime.launcher.netns.EmulatedHosts`; ``placement[r]`` rank ``r``'s host, its
    ``LOCAL_RANK`` its place among its host's ranks, :func:`psgdlab.core.platform.placement.local_ranks`) each rank
    starts in its host's namespace with its host's environment, finds the store at
    ``master_port`` (fresh namespaces, where nothing else listens), and is recorded for the
    clean-up after a killed launcher. Every rank dies with its launcher: its own parent-death
    signal and check at its start (:mod:`psgdlab.runtime.launcher.lifeline`), and on emulated
    hosts one set before ``ip netns exec`` runs."""
    store = rendezvous_socket() if hosts is None else None
    rendezvous = store_environment(store) if store else {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)}
    local = local_ranks(placement if hosts is not None else (0,) * world)  # a rank's device on its host
    procs: list[subprocess.Popen] = []
    try:
        for r in range(world):
            if stop is not None and stop():
                break
            env_r = dict(env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(local[r]), **rendezvous)
            prefix: list[str] = []
            if hosts is not None:
                env_r.update(hosts.environment(placement[r], env))
                prefix = hosts.exec_prefix(placement[r])
            proc = subprocess.Popen(
                [*prefix, *cmd],
                env=env_r,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                # the rank sets its own at its start (launcher.lifeline); ip netns exec, before it, too
                preexec_fn=set_parent_death_signal if hosts is not None else None,
                pass_fds=(store.fileno(),) if store is not None and r == 0 else (),
            )
            procs.append(proc)
            if on_start is not None:
                on_start(r, proc)
    finally:
        if store is not None:  # rank 0 holds it now (or no rank will)
            store.close()
    if hosts is not None:
        hosts.record_ranks([p.pid for p in procs])
    return procs


def oom_kills() -> int | None:
    """The processes the kernel's out-of-memory killer has killed since boot (``oom_kill`` in
    ``/proc/vmstat``, readable without privileges), or ``None`` where the kernel does not say."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def describe_exit(code: int, oom_kills_before: int | None = None) -> str:
    """How a process ended, from its exit code: ``was killed by signal SIGKILL``, ``exited with
    status 1``; a SIGKILL while the kernel's out-of-memory killer has killed processes since
    :func:`oom_kills` read ``oom_kills_before`` says so (the likely killer, and what to change)."""
    if code < 0:
        try:
            text = f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            text = f"was killed by signal {-code}"
        if code == -signal.SIGKILL and oom_kills_before is not None:
            now = oom_kills()
            if now is not None and now > oom_kills_before:
                text += (
                    f" (the kernel's out-of-memory killer killed {now - oom_kills_before} process(es) during the "
                    "run: the ranks need more memory than the machine has; use fewer workers or a smaller model)"
                )
        return text
    return f"exited with status {code}"


def describe_interruption(sig: int, out: Path, workers: int, *, started: int, world: int) -> str:
    """What a run that signal ``sig`` stopped says: by whom, and the step ``--resume`` continues
    from in ``out`` (the newest step every one of ``workers`` checkpointed: the step the ranks
    agreed to stop at); ``started`` of the run's ``world`` ranks had started (fewer: the signal
    came while they started, and none trained)."""
    by = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else signal.Signals(sig).name
    if started == 0:
        return f"run interrupted by {by} during set-up; no rank ran"
    if started < world:
        return (
            f"run interrupted by {by} while its ranks were starting: {started} of {world} had started, "
            "and were stopped; no rank trained"
        )
    from psgdlab.runtime.loop.checkpoint import latest_complete_step  # imports torch

    step = latest_complete_step(out, workers)
    if step is None:
        return f"run interrupted by {by} before its first complete checkpoint; there is nothing to resume"
    summary = out / SUMMARY_FILE
    planned = json.loads(summary.read_text()).get("steps_per_worker") if summary.is_file() else None
    if step == planned:
        return f"run interrupted by {by} after its last step {step}: it finished ({summary})"
    return f"run interrupted by {by} at step {step}, which every rank checkpointed; continue with --resume {out}"


def rank_environment(ranks_dir: Path, extra_env: dict[str, str] | None) -> dict[str, str]:
    """The environment every rank starts with: this process's, ``extra_env``, :data:`RANK_ENV`
    where neither sets it, unbuffered output, ``PSGDLAB_RANKS_DIR``, and this process named as
    the launcher the ranks die with (:mod:`psgdlab.runtime.launcher.lifeline`)."""
    env = dict(os.environ)
    env.update(extra_env or {})
    for key, value in RANK_ENV.items():
        env.setdefault(key, value)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PSGDLAB_RANKS_DIR"] = str(ranks_dir)
    env.update(launcher_environment())  # the ranks die with this process (launcher.lifeline)
    return env
