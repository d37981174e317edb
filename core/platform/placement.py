r"""Which rank sits on which host and device: the one placement rule of the simulator and the launcher.

**Hosts.** Workers fill hosts in contiguous blocks of ``per_host``: ranks :math:`0 \dots m-1` on
host 0, :math:`m \dots 2m-1` on host 1, and so on (srun's block distribution, mpiexec's ``-ppn``);
the last host used may hold fewer. Ranks after the workers (a parameter server) run on host 0.

**Devices.** A rank's device is its place among the ranks of its host, in rank order (what a
launcher exports as ``LOCAL_RANK``): worker ``r`` has device :math:`r \bmod m`, and a server on
host 0 the next one after host 0's workers.

**Sockets.** The ``k`` sockets of a host of ``D`` devices hold ``D / k`` each; the fill rule
(:data:`SOCKET_FILLS`) says which socket a host's ``l``-th worker of ``m`` uses: ``spread``
(evenly, socket :math:`\lfloor l k / m \rfloor`) or ``pack`` (the first socket's devices first,
socket :math:`\lfloor l / (D/k) \rfloor`). The two agree on a full host.

:func:`place` applies the rule; :meth:`Placement.pack` places a number of workers on a
:class:`~psgdlab.core.platform.profile.Platform` (the simulator; by default a host holds
:func:`workers_per_host`, all its devices, which is also H-ADPSGD's node), :func:`equal_blocks` spreads them over
a number of hosts in equal blocks (the launcher's ``--hosts``), and :meth:`Placement.rank_hosts`
and :func:`local_ranks` give every rank's host and device, a server's included.

Examples
--------
>>> p = place(6, per_host=4, hosts=2, devices_per_host=4, sockets_per_host=2)
>>> p.host, p.device, p.socket, p.hosts_used
((0, 0, 0, 0, 1, 1), (0, 1, 2, 3, 0, 1), (0, 0, 1, 1, 2, 2), 2)
>>> place(2, per_host=4, devices_per_host=4, sockets_per_host=2, socket_fill="pack").socket
(0, 0)
>>> q = equal_blocks(4, hosts=2)
>>> q.rank_hosts(5), local_ranks(q.rank_hosts(5))  # a parameter server on host 0, after its workers
((0, 0, 1, 1, 0), (0, 1, 0, 1, 2))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psgdlab.core.errors import ConfigError, require

if TYPE_CHECKING:
    from psgdlab.core.platform.profile import HostCPU, Platform

__all__ = ["SOCKET_FILLS", "Placement", "place", "workers_per_host", "equal_blocks", "local_ranks"]

#: how the workers of a host are laid on its sockets (module docstring)
SOCKET_FILLS = ("spread", "pack")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where each worker runs: ``host[r]`` and ``socket[r]`` (global socket id
    ``host * sockets_per_host + local socket``), with ``per_host`` workers per host on
    ``hosts_used`` hosts; ``per_socket[s]`` counts the workers behind global socket ``s`` (of
    every host the platform has)."""

    host: tuple[int, ...]
    socket: tuple[int, ...]
    per_host: int
    hosts_used: int
    per_socket: tuple[int, ...]
    sockets_per_host: int = 1

    @property
    def device(self) -> tuple[int, ...]:
        """Each worker's device on its host (its ``LOCAL_RANK``)."""
        return tuple(r % self.per_host for r in range(len(self.host)))

    def rank_hosts(self, world_size: int) -> tuple[int, ...]:
        """The host of each of ``world_size`` ranks: the workers', then host 0 for every rank after
        them (a parameter server)."""
        n = len(self.host)
        require(
            isinstance(world_size, int) and world_size >= n,
            "world size",
            world_size,
            f"must be at least the {n} workers (ranks after them, a server, run on host 0)",
        )
        return self.host + (0,) * (world_size - n)

    def processes_per_core(self, cpu: HostCPU | None) -> float | None:
        """Workers per CPU core on the most loaded machine (emulated hosts of one machine,
        ``cpu.hosts_per_machine``, count together); ``None`` without ``host_cpu``."""
        if cpu is None:
            return None
        per_machine = Counter(h // cpu.hosts_per_machine for h in self.host)
        return max(per_machine.values()) / cpu.cores_per_host

    def sockets_text(self) -> str:
        """Workers behind each socket of the first host, ``"4+0"``."""
        return "+".join(str(c) for c in self.per_socket[: self.sockets_per_host])

    @classmethod
    def pack(cls, platform: Platform, n_workers: int, per_host: int | None = None) -> Placement:
        """``n_workers`` on ``platform``: ``per_host`` a host (default: every device of a host,
        at most ``n_workers``), on its sockets by the platform's ``socket_fill``. Raises
        :class:`ConfigError` when the platform is too small."""
        m = workers_per_host(platform.devices_per_host, n_workers) if per_host is None else per_host
        return place(
            n_workers,
            per_host=m,
            hosts=platform.hosts,
            devices_per_host=platform.devices_per_host,
            sockets_per_host=platform.sockets_per_host,
            socket_fill=platform.socket_fill,
            where=platform.name,
        )


def workers_per_host(devices_per_host: int, n_workers: int) -> int:
    """The workers a host holds when nothing says otherwise: all its devices, at most the
    workers there are (H-ADPSGD's node size, :class:`psgdlab.core.algorithms.PlatformFacts`).

    >>> workers_per_host(8, 32), workers_per_host(8, 4)
    (8, 4)
    """
    return min(devices_per_host, n_workers)


def place(
    n_workers: int,
    *,
    per_host: int,
    hosts: int | None = None,
    devices_per_host: int | None = None,
    sockets_per_host: int = 1,
    socket_fill: str = "spread",
    where: str = "the platform",
) -> Placement:
    """``n_workers`` in blocks of ``per_host`` (module docstring).

    Parameters
    ----------
    n_workers : int
        Workers, ``>= 1``.
    per_host : int
        Workers on each host (the last used may hold fewer), ``>= 1``.
    hosts : int, optional
        Hosts there are (default: as many as the blocks need); ``per_socket`` counts the sockets
        of all of them.
    devices_per_host : int, optional
        Devices of a host (default ``per_host``); at least ``per_host`` and a multiple of
        ``sockets_per_host``.
    sockets_per_host : int
        Sockets of a host.
    socket_fill : {"spread", "pack"}
        How a host's workers are laid on its sockets.
    where : str
        What the errors call the hosts (a platform's name).

    Raises
    ------
    ConfigError
        A count that is not a positive integer, more workers a host than it has devices, more
        hosts needed than there are, an unknown fill rule.
    """
    for name, value in (("workers", n_workers), ("gpus_per_node", per_host), ("sockets_per_host", sockets_per_host)):
        _require_count(name, value)
    devices = per_host if devices_per_host is None else devices_per_host
    require(socket_fill in SOCKET_FILLS, "socket_fill", socket_fill, f"must be one of {', '.join(SOCKET_FILLS)}")
    require(devices % sockets_per_host == 0, "devices_per_host", devices, f"must fill {sockets_per_host} sockets")
    if per_host > devices:
        raise ConfigError(
            f"gpus_per_node ({per_host}) must be <= the platform's devices per host ({devices}) on {where}"
        )
    hosts_used = -(-n_workers // per_host)
    if hosts is not None and hosts_used > hosts:
        raise ConfigError(
            f"workers ({n_workers}) need {hosts_used} hosts of {per_host} devices but {where} has {hosts} "
            "hosts; use fewer workers or a larger platform"
        )
    k, m = sockets_per_host, per_host
    local = [r % m for r in range(n_workers)]
    if socket_fill == "pack":
        on_socket = [lr // (devices // k) for lr in local]
    else:
        on_socket = [(lr * k) // m for lr in local]
    host = tuple(r // m for r in range(n_workers))
    socket = tuple(h * k + s for h, s in zip(host, on_socket))
    per_socket = [0] * ((hosts if hosts is not None else hosts_used) * k)
    for s in socket:
        per_socket[s] += 1
    return Placement(
        host=host, socket=socket, per_host=m, hosts_used=hosts_used, per_socket=tuple(per_socket), sockets_per_host=k
    )


def equal_blocks(n_workers: int, *, hosts: int, what: str = "workers") -> Placement:
    """``n_workers`` on ``hosts`` hosts in equal blocks (``n_workers / hosts`` each): the
    placement of a launch on several hosts (``--hosts``), which ``hosts`` must divide (``what``:
    what the error calls the workers).

    >>> equal_blocks(6, hosts=3).host
    (0, 0, 1, 1, 2, 2)
    >>> equal_blocks(4, hosts=3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: hosts (3) must divide the 4 workers: workers go on hosts in equal ...
    """
    _require_count("hosts", hosts)
    require(
        isinstance(n_workers, int) and n_workers % hosts == 0,
        "hosts",
        hosts,
        f"must divide the {n_workers} {what}: workers go on hosts in equal contiguous blocks (a parameter "
        "server on host 0)",
    )
    return place(n_workers, per_host=n_workers // hosts, hosts=hosts)


def _require_count(name: str, value: object) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    require(ok, name, value, "must be an integer >= 1")


def local_ranks(rank_hosts: Sequence[int]) -> tuple[int, ...]:
    """Each rank's place among the ranks of its host, in rank order (its device, the
    ``LOCAL_RANK`` a launcher exports), from the host of every rank.

    >>> local_ranks((0, 0, 1, 1, 0))
    (0, 1, 0, 1, 2)
    """
    seen: Counter[int] = Counter()
    out = []
    for h in rank_hosts:
        out.append(seen[h])
        seen[h] += 1
    return tuple(out)
