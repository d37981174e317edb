r"""Transfer and collective costs on a :class:`~psgdlab.sim.platform.Platform`, with shared links.

:class:`Network` answers "how long does this exchange take if it starts at ``t``?" for the
simulator's processes. Each answer registers one flow per link of the exchange's path for its
duration, so later transfers see the link shared (snapshot fair share, see
:mod:`psgdlab.sim.platform`). Link identifiers: host ``h``'s NIC is ``h``; global socket ``k``'s
PCIe link is ``hosts + k``. NVLink is per device and not shared.

The laws are core's (:mod:`psgdlab.core.cost`); this module picks their links and bandwidth
shares (``S`` bytes, :math:`k_l` flows on link ``l`` already active at the start):

- point to point (:func:`~psgdlab.core.cost.transfer_s`) at :math:`\min_l (B_l / (k_l + 1))`
  with the path's latency; the path is the sender's socket PCIe (and, between hosts, both NICs
  and the receiver's socket PCIe; both NICs alone when the platform's ``endpoints`` are
  processes); inside a host NVLink when present. Between hosts the NICs are not shared that
  way but queued (:meth:`Network.nic_wait`): a transfer waits until both hosts' NICs have sent
  the bytes queued before it, then moves at the NIC's bandwidth (or its PCIe share, when less).
  A NIC's queue conserves its capacity, which a share fixed at the start does not: a transfer
  that starts on an idle link keeps the whole of it while others join, so overlapping transfers
  between hosts carried more than the NICs' rate (docs/validation.md has the case). With
  ``staging = "host"`` the pairwise average is a device-to-host copy, the network leg, a CPU
  average (:func:`~psgdlab.core.cost.host_average_s`) and a host-to-device copy, one after
  another.
- allreduce over a group (:func:`~psgdlab.core.cost.allreduce_s`) with the platform's
  ``allreduce`` schedule and the slowest link class on the ring: per-device share of each
  socket's PCIe (or NVLink), and each NIC (shared with other flows) when the group spans hosts
  (with ``platform.allreduce_between_hosts`` as its schedule, when set; with ``endpoints``
  processes a group that spans hosts runs on the network alone: the NICs' share and latency);
  a group inside one host uses ``platform.collective`` instead when it is set.
- allgather of ``m`` shards inside a host (H-ADPSGD after a sharded exchange,
  :func:`~psgdlab.core.cost.allgather_s`) at the per-device share.
- the fold of an averaged model into each member after a model allreduce
  (:func:`~psgdlab.core.cost.host_work_s` of ``model_average_s``, ``model_average_s_per_byte``;
  CPU work of every member with ``host_cpu``);
- parameter server (:func:`~psgdlab.core.cost.server_s`, with the host update when
  ``apply_on_host``), served one request at a time, on host 0: a request from a worker of
  another host crosses its NIC and host 0's (the lesser of the server's bandwidth and the NICs'
  share, plus the path's latency) and holds both NIC links meanwhile.

With ``platform.host_cpu`` set, point-to-point transfers (both ends) and allreduces (every
member) also hold CPU work on their hosts, and take :func:`~psgdlab.core.cost.cpu_stretch_s` longer when
``k`` processes of a host hold CPU work at their start (see *Host cores* in
:mod:`psgdlab.sim.platform`); so do parameter-server requests (the worker, and the server on
host 0, with its update), and a process's own host work (:meth:`Network.process_work_s`: the
step overhead, the merge of an average). The allgather after a sharded exchange is not counted.
"""

from __future__ import annotations

from typing import Any

from psgdlab.core.cost import (
    allgather_s,
    allreduce_bytes,
    allreduce_messages,
    allreduce_s,
    cpu_stretch_s,
    host_average_s,
    host_work_s,
    server_s,
    transfer_s,
)
from psgdlab.sim.platform import Placement, Platform

__all__ = ["Network"]


class Network:
    """Costs and link occupancy for one simulation (see the module docstring)."""

    __slots__ = (
        "_cache",
        "_cpu",
        "_cpu_flows",
        "_flows",
        "_host",
        "_inter_lat",
        "_intra_bw",
        "_intra_lat",
        "_mem_bw",
        "_n_hosts",
        "_nic_bw",
        "_nic_free",
        "_pcie_bw",
        "_per_socket",
        "_process_ends",
        "_socket",
        "_socket_bw",
        "_staging",
        "placement",
        "platform",
    )

    def __init__(self, platform: Platform, placement: Placement) -> None:
        self.platform = platform
        self.placement = placement
        self._n_hosts = platform.hosts
        self._flows: dict[int, list[list[float]]] = {}  # per link: [start, end, 1.0]
        self._pcie_bw = platform.pcie.effective_bandwidth_bytes_per_s
        self._nic_bw = platform.nic.effective_bandwidth_bytes_per_s
        self._host = placement.host
        self._socket = placement.socket
        self._per_socket = placement.per_socket
        nv = platform.nvlink
        self._intra_bw = nv.effective_bandwidth_bytes_per_s if nv is not None else None
        self._intra_lat = nv.latency_s if nv is not None else platform.pcie.latency_s
        self._process_ends = platform.endpoints == "process"
        self._inter_lat = platform.nic.latency_s + (0.0 if self._process_ends else 2 * platform.pcie.latency_s)
        self._mem_bw = platform.host_memory_bandwidth_bytes_per_s
        sl = platform.socket_link
        self._socket_bw = sl.effective_bandwidth_bytes_per_s if sl is not None else None
        self._staging = platform.staging
        self._cache: dict[tuple[int, ...], tuple[Any, ...]] = {}
        self._cpu = platform.host_cpu
        self._cpu_flows: dict[int, list[list[float]]] = {}  # per machine: [start, end, processes]
        self._nic_free: dict[int, float] = {}  # per host: when its NIC has sent the bytes queued on it

    # ----- link occupancy ---------------------------------------------------------------------
    def _active(self, link: int, t: float) -> int:
        return int(_running(self._flows.get(link), t, keep=8))

    def _register(self, links: tuple[int, ...], start: float, end: float) -> None:
        for link in links:
            self._flows.setdefault(link, []).append([start, end, 1.0])

    def _share(self, links: tuple[int, ...], caps: tuple[float, ...], t: float) -> float:
        bw = float("inf")
        for link, cap in zip(links, caps):
            b = cap / (self._active(link, t) + 1)
            if b < bw:
                bw = b
        return bw

    # ----- host cores ------------------------------------------------------------------------
    def _cpu_holders(self, machine: int, t: float) -> float:
        return _running(self._cpu_flows.get(machine), t, keep=16)

    def _per_host(self, ranks: Any) -> dict[int, int]:
        """Processes of ``ranks`` on each host."""
        out: dict[int, int] = {}
        for r in ranks:
            out[self._host[r]] = out.get(self._host[r], 0) + 1
        return out

    def _cpu_wait(self, members: dict[int, int], work_s: float, start: float, dur: float, wire_s: float = 0.0) -> float:
        r"""``dur`` plus the stretch of ``work_s`` of CPU work per member when its machines are
        oversubscribed, :func:`~psgdlab.core.cost.cpu_stretch_s` on the most loaded machine
        (hosts that share cores, ``HostCPU.hosts_per_machine``, count together; ``wire_s``: the
        exchange's time on the NICs, which its CPU work overlaps); registers the work
        (``members``: processes of the exchange per host)."""
        cpu = self._cpu
        if cpu is None:
            return dur
        machines: dict[int, int] = {}  # hosts that share a machine's cores count their holders together
        for host, count in members.items():
            machine = host // cpu.hosts_per_machine
            machines[machine] = machines.get(machine, 0) + count
        extra = 0.0
        for machine, count in machines.items():
            holders = count + self._cpu_holders(machine, start)
            extra = max(extra, cpu_stretch_s(holders, cpu.cores_per_host, work_s, wire_s))
        dur += extra
        for machine, count in machines.items():
            self._cpu_flows.setdefault(machine, []).append([start, start + dur, float(count)])
        return dur

    def process_work_s(self, rank: int, work_s: float, start: float) -> float:
        """``work_s`` of CPU work of ``rank``'s process alone, starting at ``start`` (the update
        between steps, the merge of an average back): with ``host_cpu`` it is counted and
        stretched as an exchange's CPU work is (:meth:`_cpu_wait`), so processes that leave a
        collective together share their host's cores for it; without, ``work_s``."""
        if self._cpu is None or work_s <= 0.0:
            return work_s
        return self._cpu_wait({self._host[rank]: 1}, work_s, start, work_s)

    # ----- point to point ---------------------------------------------------------------------
    def _path(self, a: int, b: int) -> tuple[tuple[int, ...], tuple[float, ...], float, bool]:
        """Links, their bandwidths, latency, and whether the path crosses hosts."""
        ha, hb = self._host[a], self._host[b]
        sa, sb = self._socket[a], self._socket[b]
        H = self._n_hosts
        if ha == hb:
            if self._intra_bw is not None:
                return (), (), self._intra_lat, False
            if sa == sb:
                return (H + sa,), (self._pcie_bw,), self._intra_lat, False
            if self._socket_bw is not None:
                return (
                    (H + sa, H + sb, _socket_link(ha)),
                    (self._pcie_bw, self._pcie_bw, self._socket_bw),
                    self._intra_lat,
                    False,
                )
            return (H + sa, H + sb), (self._pcie_bw,) * 2, self._intra_lat, False
        if self._process_ends:
            return (ha, hb), (self._nic_bw, self._nic_bw), self._inter_lat, True
        return (
            (H + sa, ha, hb, H + sb),
            (self._pcie_bw, self._nic_bw, self._nic_bw, self._pcie_bw),
            self._inter_lat,
            True,
        )

    def nic_wait(self, a: int, b: int, nbytes: float, start: float, bw: float) -> float:
        """How long a transfer of ``nbytes`` each way between the hosts ``a`` and ``b`` that is
        ready at ``start`` waits for their NICs to send what is queued before it; queues its own
        bytes' time at ``bw`` (at most the NIC's bandwidth) on both."""
        free = self._nic_free
        begin = max(start, free.get(a, 0.0), free.get(b, 0.0))
        free[a] = free[b] = begin + nbytes / bw
        return begin - start

    def transfer_s(self, a: int, b: int, nbytes: float, start: float) -> float:
        """Time to move ``nbytes`` from worker ``a`` to ``b`` (each way, full duplex)."""
        links, caps, lat, crosses = self._path(a, b)
        wait = 0.0
        bw: float | None
        if crosses:  # the NICs queue (module docstring); the PCIe legs are shared
            ha, hb = self._host[a], self._host[b]
            others = [(link, cap) for link, cap in zip(links, caps) if link not in (ha, hb)]
            nic = self._nic_bw
            if others:
                nic = min(nic, self._share(tuple(x for x, _ in others), tuple(c for _, c in others), start))
            wait = self.nic_wait(ha, hb, nbytes, start, nic)
            bw = nic
        else:
            bw = self._share(links, caps, start) if links else self._intra_bw
        begin = start + wait
        dur = transfer_s(nbytes, bw, lat)
        if self._cpu is not None:
            wire = nbytes / bw if crosses and bw is not None else 0.0
            work = self._cpu.work_s(1, nbytes, between_hosts=crosses)
            dur = self._cpu_wait(self._per_host((a, b)), work, begin, dur, wire)
        if links:
            self._register(links, begin, begin + dur)
        return wait + dur

    def pair_average_s(
        self, a: int, b: int, nbytes: float, start: float, gather: int = 1, model_bytes: float = 0.0
    ) -> float:
        """Pairwise average of ``nbytes`` between ``a`` and ``b`` (+ an allgather of ``gather``
        shards of ``model_bytes`` inside each host afterwards)."""
        if self._staging == "direct":
            dur = self.transfer_s(a, b, nbytes, start)
        else:
            H = self._n_hosts
            sa, sb = self._socket[a], self._socket[b]
            # device -> host over the sender's socket PCIe (both sides copy in parallel)
            copy_links = (H + sa, H + sb) if sa != sb else (H + sa,)
            caps = (self._pcie_bw,) * len(copy_links)
            d2h = transfer_s(nbytes, self._share(copy_links, caps, start), self._pcie_lat())
            self._register(copy_links, start, start + d2h)
            t = start + d2h
            net = 0.0
            crosses = self._host[a] != self._host[b]
            if crosses:
                nics = (self._host[a], self._host[b])
                wait = self.nic_wait(*nics, nbytes, t, self._nic_bw)
                net = wait + transfer_s(nbytes, self._nic_bw, self.platform.nic.latency_s)
                self._register(nics, t + wait, t + net)
            elif sa != sb and self._socket_bw is not None:  # the host average reads the peer's socket memory
                link = (_socket_link(self._host[a]),)
                net = transfer_s(nbytes, self._share(link, (self._socket_bw,), t), 0.0)
                self._register(link, t, t + net)
            t += net
            cpu = host_average_s(nbytes, self._mem_bw)
            t += cpu
            h2d = transfer_s(nbytes, self._share(copy_links, caps, t), self._pcie_lat())
            self._register(copy_links, t, t + h2d)
            dur = d2h + net + cpu + h2d
            if self._cpu is not None:
                work = self._cpu.work_s(1, nbytes, between_hosts=crosses)
                dur = self._cpu_wait(self._per_host((a, b)), work, start, dur, net if crosses else 0.0)
        if gather > 1:
            dur += self.allgather_s(a, gather, model_bytes, start + dur)
        return dur

    def _pcie_lat(self) -> float:
        return self.platform.pcie.latency_s

    def _intra_share_bw(self, members: list[int] | tuple[int, ...]) -> float:
        """Per-device bandwidth inside a host: NVLink, or the socket's PCIe split among the
        group members behind it."""
        if self._intra_bw is not None:
            return self._intra_bw
        counts: dict[int, int] = {}
        for r in members:
            s = self._socket[r]
            counts[s] = counts.get(s, 0) + 1
        return self._pcie_bw / max(counts.values())

    def allgather_s(self, rank: int, m: int, model_bytes: float, start: float) -> float:
        """``rank``'s part of an allgather of ``m`` shards of a ``model_bytes`` model among its
        host mates, starting at ``start``: on oversubscribed cores its CPU work, half an
        allreduce's (the messages and bytes of the gather half), is stretched as an allreduce's is
        (:meth:`_cpu_wait`, ``rank``'s process)."""
        host = self._host[rank]
        members = [r for r in range(len(self._host)) if self._host[r] == host][:m]
        algorithm = self.platform.allreduce
        dur = allgather_s(m, model_bytes, self._intra_share_bw(members), self._intra_lat, algorithm)
        if self._cpu is None:
            return dur
        work = self._cpu.work_s(allreduce_messages(m, algorithm) // 2, allreduce_bytes(m, model_bytes) / 2)
        return self._cpu_wait({host: 1}, work, start, dur)

    # ----- collectives ------------------------------------------------------------------------
    def allreduce_s(self, group: tuple[int, ...], nbytes: float, start: float) -> float:
        """Allreduce of ``nbytes`` over ``group`` starting at ``start`` (one event; the platform's
        ``allreduce`` schedule)."""
        n = len(group)
        if n <= 1:
            return 0.0
        key = (group[0], group[-1], n)
        info = self._cache.get(key)
        if info is None:
            hosts = sorted({self._host[r] for r in group})
            sockets = tuple(sorted({self._socket[r] for r in group}))
            by_host: dict[int, list[int]] = {}
            for r in group:
                by_host.setdefault(self._host[r], []).append(r)
            spans = len(hosts) > 1
            links: tuple[int, ...] = tuple(hosts) if spans else ()
            crossing: tuple[int, ...] = ()
            if spans and self._process_ends:  # every edge is a network connection between processes
                intra, lat = float("inf"), self._inter_lat
            else:
                intra = min(self._intra_share_bw(m) if len(m) > 1 else float("inf") for m in by_host.values())
                lat = max(self._inter_lat, self._intra_lat) if spans else self._intra_lat
                links += tuple(self._n_hosts + s for s in sockets) if self._intra_bw is None else ()
                crossing = (
                    tuple(_socket_link(h) for h, m in by_host.items() if len({self._socket[r] for r in m}) > 1)
                    if self._socket_bw is not None and self._intra_bw is None
                    else ()
                )
            links += crossing
            coll = self.platform.collective
            if coll is not None and not spans:  # the implementation's own collective, measured as such
                intra, lat = coll.effective_bandwidth_bytes_per_s, coll.latency_s
            members = self._per_host(group)
            info = (links, intra, lat, members, spans, crossing)
            self._cache[key] = info
        links, intra, lat, members, spans, crossing = info
        bw = intra
        if crossing:  # the ring's edges between sockets share each host's socket link
            assert self._socket_bw is not None
            bw = min(bw, self._share(crossing, (self._socket_bw,) * len(crossing), start))
        if spans:
            nic_links = tuple(link for link in links if link < self._n_hosts)
            bw = min(bw, self._share(nic_links, (self._nic_bw,) * len(nic_links), start))
        if bw == float("inf"):
            bw = self._pcie_bw
        algorithm = self.platform.allreduce
        if spans and self.platform.allreduce_between_hosts is not None:
            algorithm = self.platform.allreduce_between_hosts
        dur = allreduce_s(n, nbytes, bw, lat, algorithm)
        if self._cpu is not None:
            sent = allreduce_bytes(n, nbytes)
            work = self._cpu.work_s(allreduce_messages(n, algorithm), sent, between_hosts=spans)
            dur = self._cpu_wait(members, work, start, dur, sent / bw if spans else 0.0)
        self._register(links, start, start + dur)
        return dur

    def model_average_s(self, group: tuple[int, ...], nbytes: float, start: float) -> float:
        """Host work of folding the averaged model into every member of ``group`` (after a model
        allreduce ending at ``start``): :math:`a + bS`, stretched on oversubscribed hosts."""
        p = self.platform
        work = host_work_s(p.model_average_s, p.model_average_s_per_byte, nbytes)
        if work <= 0.0 or self._cpu is None:
            return work
        return self._cpu_wait(self._per_host(group), work, start, work)

    # ----- parameter server -------------------------------------------------------------------
    @property
    def server_per_request(self) -> bool:
        """Whether a server request's time depends on who asks and when (:meth:`server_s` with
        ``rank`` and ``start``): with ``host_cpu``, or with a worker off the server's host 0."""
        return self._cpu is not None or any(h != 0 for h in self._host)

    def server_s(self, nbytes: float, *, rank: int | None = None, start: float | None = None) -> float:
        """Service time of one parameter-server request (message and reply of ``nbytes``).

        With ``rank`` and ``start``: a worker on another host than the server's (host 0) sends
        and receives across the NICs, its own host's and host 0's: the request's bandwidth is the
        lesser of the server's and the NICs' share when it starts, its latency the server's plus
        the path between hosts, and it holds both NIC links meanwhile. With ``platform.host_cpu``
        the request also holds CPU work on the worker's host and on the server's -- one message
        each way and the update (:math:`3S` at memory bandwidth when ``apply_on_host``) --
        stretched as in :meth:`_cpu_wait`."""
        srv = self.platform.server
        update = host_average_s(nbytes, self._mem_bw) if srv.apply_on_host else 0.0
        bw, lat = srv.effective_bandwidth_bytes_per_s, srv.latency_s
        links: tuple[int, ...] = ()
        if rank is not None and start is not None and self._host[rank] != 0:
            links = (self._host[rank], 0)
            bw = min(bw, self._share(links, (self._nic_bw, self._nic_bw), start))
            lat += self._inter_lat
        t = server_s(nbytes, bw, lat, srv.service_overhead_s, update)
        if self._cpu is not None and rank is not None and start is not None:
            members = {0: 1}
            members[self._host[rank]] = members.get(self._host[rank], 0) + 1
            wire = nbytes / bw if links else 0.0
            work = self._cpu.work_s(1, nbytes, between_hosts=bool(links)) + update
            t = self._cpu_wait(members, work, start, t, wire)
        if links:
            assert start is not None
            self._register(links, start, start + t)
        return t

    def input_copy_s(self, rank: int, nbytes: float) -> float:
        """Per-step input copy of ``nbytes`` over the socket's PCIe (at the platform's
        ``input_efficiency`` of it), shared by the workers on it."""
        if nbytes <= 0:
            return 0.0
        share = self._pcie_bw * self.platform.input_efficiency / self._per_socket[self._socket[rank]]
        return transfer_s(nbytes, share, self.platform.pcie.latency_s)


def _socket_link(host: int) -> int:
    """The flow key of a host's socket link (NIC links are ``0..H-1``, PCIe links ``H..``)."""
    return -1 - host


def _running(flows: list[list[float]] | None, t: float, *, keep: int) -> float:
    """Total weight of the ``[start, end, weight]`` entries of ``flows`` running at ``t``; once
    there are more than ``keep``, the finished ones are dropped first."""
    if not flows:
        return 0.0
    if len(flows) > keep:
        flows[:] = [f for f in flows if f[1] > t]
    return sum(f[2] for f in flows if f[0] <= t < f[1])
