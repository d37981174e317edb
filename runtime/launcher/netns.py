r"""Emulated hosts on one machine: a Linux network namespace per host, a bridge, shaped links.

``psgdlab train --hosts H --nic-bandwidth RATE`` places the ranks on ``H`` emulated hosts, so
that a message between hosts crosses a real TCP path through a real rate limit, with real
contention when several ranks of a host send at once. A run with prefix
``P = psgd-<launcher pid>-<its start time>-<n>`` creates only namespaces::

    P-br    the bridge br0 (10.213.0.254/24, where mpiexec listens for its proxies), and one veth
            end h<i> per host enslaved to it
    P-h<i>  host i: the other veth end, named nic0, with 10.213.0.<i+1>/24; lo up

Both ends of every veth live in namespaces of the run (they are created there, never in the
machine's namespace), so nothing is routed anywhere else and deleting the namespaces deletes
every link and qdisc with them.

Shaping
    Each host's link is shaped in both directions by a token bucket (``tc`` tbf; netem is not
    available here) at the NIC rate: on nic0 (what host i sends) and on h<i> in the bridge's
    namespace (what it receives). The bucket holds 2 ms of the rate (at least 64 KiB, so that
    a GSO burst of the veth passes whole) and queues 50 ms. The MTU is 9000 (jumbo frames, as on
    cluster Ethernet): a TCP stream then carries 0.99 of the rate in payload, where 1500 gives
    0.956 (54 bytes of headers per 1448; ``bench/bench_netns.py`` measures it).

Placement
    Workers go on hosts in contiguous blocks, ``workers / H`` each, a parameter server on host 0
    (:func:`psgdlab.core.platform.placement.equal_blocks`, the rule the simulator places workers by too):
    ranks 0..k-1 on host 0 and so on, as srun's block distribution and mpiexec's ``-ppn`` do.
    Ranks of one emulated host share the shared-memory data plane; those of different hosts do
    not, because the launcher gives each rank its host's identity
    (:data:`~psgdlab.runtime.transports.env.HOST_ENV`, read by
    :func:`~psgdlab.runtime.transports.env.host_identity`), where by default it is the machine's
    name.

MPI
    ``mpiexec`` (MPICH's hydra) runs in the bridge's namespace, listening on br0
    (``-iface br0``), with a host file of the hosts' addresses (``ADDRESS:ranks per host``) and
    a launcher hook in place of ssh (``-launcher ssh -launcher-exec``,
    :meth:`EmulatedHosts.write_hydra_launcher`) that starts each host's proxy inside the host's
    namespace with :data:`HOST_ENV` set; hydra places ranks in the same contiguous blocks, and
    MPICH treats ranks under different proxies as different nodes (network, not shared memory).
    MPICH is told to use libfabric's tcp provider on nic0 (:data:`MPI_NETWORK_ENV`): its default,
    UCX, judges shared memory by the machine, not the host, and carried every payload between
    emulated hosts (a 2x2 run moved 15 kB over the links instead of megabytes); held to TCP, it
    hung H-ADPSGD's threaded gossip now and then.

Clean-up
    :meth:`EmulatedHosts.down` kills what runs in the run's namespaces and deletes them; the
    launcher calls it in a ``finally`` (after a failed rank, SIGINT or SIGTERM). A launcher killed
    by SIGKILL cannot: its ranks die with it (parent-death signal), and the next start calls
    :func:`remove_stale`, which finds namespaces whose owner (pid and start time in the name) no
    longer runs and removes them, with the shared-memory segments of their ranks (pids recorded
    in ``/run/psgdlab-<prefix>.pids``: a rank killed inside the data plane's set-up leaves its
    segment). Every command has a time limit.

It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN, to create and mount namespaces), ``ip`` and
``tc`` (iproute2): :func:`unavailable_reason` says what is missing, in one line.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from psgdlab.core.errors import ConfigError, TransportError
from psgdlab.core.files import atomic_write_text
from psgdlab.runtime.config import MAX_HOSTS
from psgdlab.runtime.launcher.lifeline import set_parent_death_signal  # here for the launchers that import it
from psgdlab.runtime.transports.env import HOST_ENV
from psgdlab.runtime.transports.shm.shm_sys import remove_segments, start_time

__all__ = [
    "BRIDGE",
    "EmulatedHosts",
    "LAUNCHER_ADDRESS",
    "MPI_NETWORK_ENV",
    "IFACE",
    "fresh_hosts",
    "remove_stale",
    "unavailable_reason",
    "require_netns",
    "tbf_arguments",
    "run_prefix",
    "set_parent_death_signal",
]

#: the host's interface inside its namespace (gloo binds it: ``GLOO_SOCKET_IFNAME``)
IFACE = "nic0"
BRIDGE = "br0"
SUBNET = "10.213.0"
#: the bridge's own address (mpiexec's, in the bridge's namespace)
LAUNCHER_ADDRESS = f"{SUBNET}.254"
MTU = 9000
#: MPICH between emulated hosts: the libfabric netmod with its tcp provider on nic0 (UCX's
#: shared-memory transports see one machine and bypass the links; held to TCP, UCX hung
#: H-ADPSGD's threaded gossip in 3 of 8 runs under load, libfabric's tcp in none of 8). UCX is
#: still held to TCP on nic0 should an MPICH without libfabric pick it. MPICH's own shared memory
#: serves the ranks of one host (they share a hydra proxy).
MPI_NETWORK_ENV = {
    "MPIR_CVAR_CH4_NETMOD": "ofi",
    "FI_PROVIDER": "tcp",
    "FI_TCP_IFACE": IFACE,
    "FI_SOCKETS_IFACE": IFACE,
    "UCX_NET_DEVICES": IFACE,
    "UCX_TLS": "tcp,self",
}
CMD_TIMEOUT_S = 20.0
_NAME_RE = re.compile(r"^(psgd-(\d+)-(\d+)-\d+)-(br|h\d+)$")
#: where a run records its ranks' pids (``psgdlab-<prefix>.pids``), so that the next start can
#: remove the shared-memory segments of ranks that died with a killed launcher
RECORD_DIR = Path("/run")
_RUNS = itertools.count()  # the runs of this process (two launches at once stay apart)
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21


def tbf_arguments(rate_bytes_per_s: float) -> list[str]:
    """The tbf qdisc for a link at ``rate_bytes_per_s``: a bucket of 2 ms of the rate (at least
    64 KiB, a whole GSO burst) and 50 ms of queue.

    >>> tbf_arguments(125e6)
    ['tbf', 'rate', '1000000000bit', 'burst', '250000', 'latency', '50ms']
    """
    burst = max(65536, int(rate_bytes_per_s * 0.002))
    return ["tbf", "rate", f"{round(rate_bytes_per_s * 8)}bit", "burst", str(burst), "latency", "50ms"]


def _capabilities() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def unavailable_reason() -> str | None:
    """Why emulated hosts cannot be made here (one line), or None when they can."""
    caps = _capabilities()
    if not (caps >> _CAP_NET_ADMIN & 1 and caps >> _CAP_SYS_ADMIN & 1):
        return "emulated hosts need root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"emulated hosts need {' and '.join(missing)} (iproute2), not found on PATH"
    return None


def require_netns(hosts: int) -> None:
    """:class:`ConfigError` (one line) unless emulated hosts can be made here."""
    reason = unavailable_reason()
    if reason is not None:
        raise ConfigError(f"hosts ({hosts}): {reason}; run as root, or without --hosts")


def run_prefix() -> str:
    """``psgd-<pid>-<start time>-<n>`` (this process's n-th run): the names of a run's
    namespaces, unique while it runs and recognisably stale after its process is gone."""
    pid = os.getpid()
    return f"psgd-{pid}-{start_time(pid) or 0}-{next(_RUNS)}"


def _run(cmd: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TransportError(f"'{' '.join(cmd)}' did not finish within {CMD_TIMEOUT_S:.0f} s") from None
    if check and done.returncode != 0:
        message = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise TransportError(f"'{' '.join(cmd)}' failed: {message}")
    return done


def _namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _delete_namespace(name: str) -> None:
    """Kill every process in namespace ``name``, then delete it (gone already: nothing to do)."""
    pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    done = _run(["ip", "netns", "del", name], check=False)
    if done.returncode != 0 and name in _namespaces():
        raise TransportError(f"could not delete network namespace {name}: {' '.join(done.stderr.split())}")


def _record(prefix: str) -> Path:
    return RECORD_DIR / f"psgdlab-{prefix}.pids"


def _forget(prefix: str) -> list[str]:
    """Unlink the shared-memory segments of the run's ranks (pids in its record), which a rank
    killed inside the data plane's set-up leaves, and the record; returns the segments' names."""
    record = _record(prefix)
    try:
        pids = [int(x) for x in record.read_text().split()]
    except (OSError, ValueError):
        pids = []
    removed = remove_segments(pids)
    record.unlink(missing_ok=True)
    return removed


def remove_stale() -> tuple[list[str], list[str]]:
    """Delete what runs whose launcher no longer runs (killed by SIGKILL) left: their namespaces
    (and what runs in them) and the shared-memory segments of their ranks; returns the names of
    both."""
    namespaces, stale = [], set()
    for name in _namespaces():
        match = _NAME_RE.match(name)
        if match is None or start_time(int(match.group(2))) == int(match.group(3)):
            continue  # not a run's, or its launcher still runs
        _delete_namespace(name)
        namespaces.append(name)
        stale.add(match.group(1))
    for record in RECORD_DIR.glob("psgdlab-psgd-*.pids"):
        match = _NAME_RE.match(f"{record.stem.removeprefix('psgdlab-')}-br")
        if match is not None and start_time(int(match.group(2))) != int(match.group(3)):
            stale.add(match.group(1))
    segments = [name for prefix in sorted(stale) for name in _forget(prefix)]
    return namespaces, segments


def fresh_hosts(hosts: int, rate_bytes_per_s: float | None) -> EmulatedHosts:
    """Remove what killed launchers left (:func:`remove_stale`, saying so on stderr in one line);
    then ``hosts`` emulated hosts of a new run, not made yet."""
    namespaces, segments = remove_stale()
    if namespaces or segments:
        owners = sorted({name.split("-")[1] for name in namespaces})
        print(
            f"psgdlab: removed {len(namespaces)} network namespaces left by killed launchers (pid "
            f"{', '.join(owners) or '?'}): {', '.join(namespaces) or 'none'}; and {len(segments)} "
            f"shared-memory segments of their ranks{': ' if segments else ''}{', '.join(segments)}",
            file=sys.stderr,
        )
    return EmulatedHosts(hosts, rate_bytes_per_s)


@dataclass
class EmulatedHosts:
    """``hosts`` network namespaces joined by a bridge, each link shaped to ``rate_bytes_per_s``
    in both directions (None: not shaped). A context manager: ``up`` on entry, ``down`` on exit.

    Attributes
    ----------
    prefix : str
        The names of the run's namespaces begin with it (:func:`run_prefix`).
    """

    hosts: int
    rate_bytes_per_s: float | None = None
    prefix: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise ConfigError(f"hosts ({self.hosts}) must be between 1 and {MAX_HOSTS}")
        self.prefix = self.prefix or run_prefix()

    @property
    def bridge_namespace(self) -> str:
        return f"{self.prefix}-br"

    def namespace(self, host: int) -> str:
        """The namespace of host ``host``."""
        return f"{self.prefix}-h{host}"

    def address(self, host: int) -> str:
        """The address of host ``host`` (on :data:`IFACE` in its namespace)."""
        return f"{SUBNET}.{host + 1}"

    def environment(self, host: int, environ: Mapping[str, str]) -> dict[str, str]:
        """What a process started on host ``host`` adds to ``environ``: ``MASTER_ADDR`` (host 0,
        where the rendezvous is), gloo bound to the host's link, the host named in
        :data:`HOST_ENV` (only ranks of one host share memory), and c10d's warning on every
        connection that it cannot name the peer (no reverse DNS for the namespaces' addresses)
        silenced unless ``environ`` sets its log level; its errors still show."""
        return {
            "MASTER_ADDR": self.address(0),
            "GLOO_SOCKET_IFNAME": IFACE,
            "TORCH_CPP_LOG_LEVEL": environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
            HOST_ENV: self.namespace(host),
        }

    def exec_prefix(self, host: int | None) -> list[str]:
        """The command prefix that runs a program inside host ``host``'s namespace (None: the
        bridge's)."""
        return ["ip", "netns", "exec", self.bridge_namespace if host is None else self.namespace(host)]

    def up(self) -> EmulatedHosts:
        """Create the namespaces, the bridge, the links and their qdiscs (a failure removes what
        was made and raises :class:`TransportError`)."""
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def _up(self) -> None:
        br = self.bridge_namespace
        _run(["ip", "netns", "add", br])
        _run(["ip", "-n", br, "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "-n", br, "addr", "add", f"{LAUNCHER_ADDRESS}/24", "dev", BRIDGE])
        _run(["ip", "-n", br, "link", "set", BRIDGE, "up"])
        for host in range(self.hosts):
            ns, end = self.namespace(host), f"h{host}"
            _run(["ip", "netns", "add", ns])
            _run(
                [
                    "ip",
                    "-n",
                    br,
                    "link",
                    "add",
                    end,
                    "mtu",
                    str(MTU),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    IFACE,
                    "netns",
                    ns,
                ]
            )
            _run(["ip", "-n", br, "link", "set", end, "master", BRIDGE, "up"])
            _run(["ip", "-n", ns, "link", "set", IFACE, "mtu", str(MTU)])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", IFACE])
            _run(["ip", "-n", ns, "link", "set", IFACE, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            if self.rate_bytes_per_s is not None:
                tbf = tbf_arguments(self.rate_bytes_per_s)
                _run(["tc", "-n", ns, "qdisc", "add", "dev", IFACE, "root", *tbf])  # what the host sends
                _run(["tc", "-n", br, "qdisc", "add", "dev", end, "root", *tbf])  # what it receives

    def record_ranks(self, pids: Sequence[int]) -> None:
        """Record the ranks' pids (for :func:`remove_stale`, should this process be killed)."""
        atomic_write_text(_record(self.prefix), " ".join(str(p) for p in pids))

    def down(self) -> list[str]:
        """Kill what runs in the run's namespaces and delete them (also those a failed ``up``
        left half made), then the segments of the recorded ranks; returns the namespaces' names.
        Never raises for a namespace already gone."""
        mine = [n for n in _namespaces() if n == self.bridge_namespace or n.startswith(f"{self.prefix}-h")]
        errors = []
        for name in sorted(mine, key=lambda n: n.endswith("-br")):  # hosts first, then the bridge
            try:
                _delete_namespace(name)
            except TransportError as exc:
                errors.append(str(exc))
        _forget(self.prefix)
        if errors:
            raise TransportError(errors[0])
        return mine

    def wait_until_reachable(self, timeout_s: float = 5.0) -> None:
        """Wait until the links are up (a veth carries traffic once both ends are up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = [
                _run(["ip", "-n", self.namespace(h), "-o", "link", "show", IFACE], check=False).stdout
                for h in range(self.hosts)
            ]
            if all("state UP" in s or "LOWER_UP" in s for s in states):
                return
            time.sleep(0.05)
        raise TransportError(f"the links of {self.prefix} did not come up within {timeout_s:.0f} s")

    def link_bytes(self) -> list[dict[str, int]]:
        """Bytes each host's interface has sent and received so far (``ip -s link``)."""
        import json

        out = []
        for host in range(self.hosts):
            done = _run(["ip", "-n", self.namespace(host), "-s", "-j", "link", "show", IFACE])
            stats = json.loads(done.stdout)[0].get("stats64", {})
            out.append({"sent": int(stats["tx"]["bytes"]), "received": int(stats["rx"]["bytes"])})
        return out

    def write_hydra_launcher(self, path: Path) -> Path:
        """Write the executable that hydra's ssh launcher calls (``-launcher-exec``): given
        ``[-x] ADDRESS COMMAND...``, it runs ``COMMAND`` inside the namespace of the host with
        that address, with :data:`HOST_ENV` naming the host."""
        cases = "\n".join(f"  {self.address(h)}) ns={self.namespace(h)} ;;" for h in range(self.hosts))
        script = f"""#!/bin/sh
# written by psgdlab's launcher: hydra's ssh launcher hook for the emulated hosts of {self.prefix}
[ "$1" = "-x" ] && shift
case "$1" in
{cases}
  *) echo "psgdlab: $1 is not an emulated host of {self.prefix}" >&2; exit 1 ;;
esac
shift
export {HOST_ENV}="$ns"
exec ip netns exec "$ns" sh -c "$*"
"""
        atomic_write_text(path, script)
        path.chmod(0o755)
        return path

    def __enter__(self) -> EmulatedHosts:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
