"""Run one command on each of several emulated hosts: the way to start the per-rank entry (or
torchrun, or anything) on an emulated cluster by hand, as one would with ssh or srun on a real one.

:func:`run_on_hosts` makes ``H`` emulated hosts (:class:`psgdlab.runtime.launcher.netns.EmulatedHosts`),
starts the command once inside each host's namespace, with these fields of the command's words
filled in (``str.format``):

=========== ====================================================================================
``{host}``  the host's index, 0 .. H-1 (torchrun's ``--node-rank``)
``{hosts}`` H (torchrun's ``--nnodes``)
``{address}`` the host's address on its link
``{master}`` host 0's address (a rendezvous endpoint: ``--master-addr``, ``--rdzv-endpoint``)
=========== ====================================================================================

and in its environment ``MASTER_ADDR`` (host 0's address), ``GLOO_SOCKET_IFNAME`` (the host's
link, so gloo crosses it) and ``PSGDLAB_HOST_ID`` (the host, so that only ranks of one host
share memory). It waits for every host's command; the first that fails stops the others
(SIGTERM to its process group, SIGKILL after a grace period) and its host is named. SIGINT and
SIGTERM stop them all the same way. The namespaces, links and qdiscs are removed however it ends;
those of a run whose own process was killed are removed at the next start, which says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from psgdlab.core.errors import ConfigError, TransportError
from psgdlab.runtime.launcher.netns import fresh_hosts, require_netns, set_parent_death_signal
from psgdlab.runtime.launcher.ranks import describe_exit

__all__ = ["FIELDS", "fill", "run_on_hosts"]

#: the fields a command may name
FIELDS = ("host", "hosts", "address", "master")
#: seconds between SIGTERM and SIGKILL when the hosts' commands are stopped
GRACE_S = 5.0


def fill(command: Sequence[str], **values: Any) -> list[str]:
    """The words of ``command`` with the fields of :data:`FIELDS` filled in (a one-line
    :class:`ConfigError` for any other field).

    >>> fill(["--node-rank", "{host}", "--master-addr={master}"], host=1, hosts=2, address="a", master="m")
    ['--node-rank', '1', '--master-addr=m']
    """
    out = []
    for word in command:
        try:
            out.append(word.format(**values))
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"command word {word!r} names {exc}, not one of the fields {{{'}, {'.join(FIELDS)}}}"
            ) from None
    return out


def run_on_hosts(
    command: Sequence[str],
    *,
    hosts: int,
    rate_bytes_per_s: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Run ``command`` on each of ``hosts`` emulated hosts (module docstring) and wait for them.

    Raises :class:`TransportError` naming the first host whose command failed (or the signal
    that stopped the run).
    """
    if not command:
        raise ConfigError("hosts: give the command to run on each host after --")
    require_netns(hosts)
    emulated = fresh_hosts(hosts, rate_bytes_per_s)
    master = emulated.address(0)
    commands = [fill(command, host=h, hosts=hosts, address=emulated.address(h), master=master) for h in range(hosts)]
    stopped: dict[str, int | None] = {"sig": None}

    def _stop(signum: int, frame: Any) -> None:
        stopped["sig"] = signum

    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    procs: list[subprocess.Popen] = []
    try:
        emulated.up()
        emulated.wait_until_reachable()
        base = dict(os.environ if environ is None else environ)
        for h, words in enumerate(commands):
            env = {**base, **emulated.environment(h, base)}
            procs.append(
                subprocess.Popen(
                    [*emulated.exec_prefix(h), *words],
                    env=env,
                    start_new_session=True,
                    preexec_fn=set_parent_death_signal,
                )
            )
        emulated.record_ranks([p.pid for p in procs])
        _wait(procs, stopped)
    finally:
        try:
            _stop_all(procs)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            emulated.down()


def _wait(procs: list[subprocess.Popen], stopped: dict[str, int | None]) -> None:
    while True:
        if stopped["sig"] is not None:
            raise TransportError(
                f"stopped by signal {signal.Signals(stopped['sig']).name}; every host's command was stopped"
            )
        for h, p in enumerate(procs):
            code = p.poll()
            if code not in (None, 0):
                raise TransportError(
                    f"the command on host {h} {describe_exit(code)}; the other hosts' commands were stopped"
                )
        if all(p.poll() == 0 for p in procs):
            return
        time.sleep(0.1)


def _stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each command's process group, SIGKILL to what is left after :data:`GRACE_S`."""
    for p in procs:
        if p.poll() is None:
            _killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _killpg(p.pid, signal.SIGKILL)
            p.wait()
        _killpg(p.pid, signal.SIGKILL)  # children that outlived their leader


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
