r"""Transfer and collective costs on a :class:`~psgdlab.sim.platform.Platform`, with shared links.

:class:`Network` answers "how long does this exchange take if it starts at ``t``?" for the
simulator's processes. Each answer registers one flow per link of the exchange's path for its
duration, so later transfers see the link shared (snapshot fair share, see
:mod:`psgdlab.sim.platform`); the NICs' transfers between hosts are shared exactly instead
(:class:`FairLinks`, below). Link identifiers: host ``h``'s NIC is ``h``; global socket ``k``'s
PCIe link is ``hosts + k``. NVLink is per device and not shared.

The laws are core's (:mod:`psgdlab.core.platform.cost`); this module picks their links and bandwidth
shares (``S`` bytes, :math:`k_l` flows on link ``l`` already active at the start):

- point to point (:func:`~psgdlab.core.platform.cost.transfer_s`) at :math:`\min_l (B_l / (k_l + 1))`
  with the path's latency, inside a host: its socket's PCIe (both sockets' when they differ,
  and the link between them with a ``socket_link``), or NVLink when present.
- between hosts the NICs are shared, not snapshot: the bytes of a pairwise average or a gossip
  transfer go on the NICs as a transfer of :attr:`Network.nics` (:class:`FairLinks`), which
  moves at its max-min fair rate (:func:`~psgdlab.core.platform.cost.max_min_rates`) over both hosts'
  NICs (each NIC two links, one a direction: an average sends both ways, a gossip's send one way
  while the peer's own send comes back), recomputed whenever a transfer joins or leaves, so its
  end moves later when others join: concurrent transfers share a NIC as TCP flows through one
  rate limit do (each of ``k`` takes ``k`` times as long; ``bench/bench_netns.py --flows``), and
  a NIC never carries more than its rate. A transfer's cap is the NIC's bandwidth, or the share
  of the PCIe legs at both ends when it starts where devices send directly; besides its bytes'
  time it takes the path's latency and its CPU work's stretch (:meth:`Network.wire`). The
  simulator waits on these transfers as events (:mod:`psgdlab.sim.engine`). With ``staging =
  "host"`` the pairwise average is a device-to-host copy, the network leg, a CPU average
  (:func:`~psgdlab.core.platform.cost.host_average_s`) and a host-to-device copy, one after another.
  Collectives and server requests that cross the NICs take a snapshot share of them (counting
  the transfers in flight there) and do not slow those transfers down.
- allreduce over a group (:func:`~psgdlab.core.platform.cost.allreduce_s`) with the platform's
  ``allreduce`` schedule and the slowest link class on the ring: per-device share of each
  socket's PCIe (or NVLink), and each NIC (shared with other flows) when the group spans hosts
  (with ``platform.allreduce_between_hosts`` as its schedule, when set; with ``endpoints``
  processes a group that spans hosts runs on the network alone: the NICs' share and latency);
  a group inside one host uses ``platform.collective`` instead when it is set, and the edges
  between hosts of a group that spans them ``platform.collective_between_hosts`` (its latency
  and its rate in place of the NIC's) when that is set. A ring that spans hosts, is bound by
  the NICs (not by the links inside a host) and whose members arrived apart, has moved before
  the last arrives what needs no late member's contribution
  (:func:`~psgdlab.core.platform.cost.ring_allreduce_after_arrivals`: its edges between hosts take the
  ring's time per chunk step, those inside a host, faster, none): it takes what is left from
  there, and its members' CPU work shrinks by the share of the edges between hosts' chunks
  already moved.
- allgather of ``m`` shards inside a host (H-ADPSGD after a sharded exchange,
  :func:`~psgdlab.core.platform.cost.allgather_s`) at the per-device share.
- the fold of an averaged model into each member after a model allreduce
  (:func:`~psgdlab.core.platform.cost.host_work_s` of ``model_average_s``, ``model_average_s_per_byte``;
  CPU work of every member with ``host_cpu``);
- parameter server (:func:`~psgdlab.core.platform.cost.server_s`, with the host update when
  ``apply_on_host``), served one request at a time, on host 0: a request from a worker of
  another host crosses its NIC and host 0's (the lesser of the server's bandwidth and the NICs'
  share, plus the path's latency) and holds both NIC links meanwhile.

With ``platform.host_cpu`` set, point-to-point transfers (both ends) and allreduces (every
member) also hold CPU work on their hosts, and take :func:`~psgdlab.core.platform.cost.cpu_stretch_s` longer when
``k`` processes of a host hold CPU work at their start (see *Host cores* in
:mod:`psgdlab.sim.platform`); so do parameter-server requests (the worker, and the server on
host 0, with its update), and a process's own host work (:meth:`Network.process_work_s`: the
step overhead, the merge of an average). The allgather after a sharded exchange is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from psgdlab.core.errors import SimulationError
from psgdlab.core.platform.cost import (
    allgather_s,
    allreduce_bytes,
    allreduce_messages,
    allreduce_rounds,
    allreduce_s,
    cpu_stretch_s,
    host_average_s,
    host_work_s,
    max_min_rates,
    ring_allreduce_after_arrivals,
    server_s,
    transfer_s,
)
from psgdlab.sim.platform import Placement, Platform

__all__ = ["FairLinks", "Network"]


class FairLinks:
    """Transfers in flight on shared links at their max-min fair rates
    (:func:`~psgdlab.core.platform.cost.max_min_rates`), advanced lazily: the rates are recomputed
    whenever a transfer joins or leaves, so a transfer's end moves when others join it, and a
    link never carries more than its capacity. Times only go forward (:meth:`advance`).

    Max-min rates are decided within a *group*: the transfers linked to one another through
    links they share (transfers of two groups never meet on a link). A join or a departure
    recomputes the rates of the group it touches, by the filling over that group alone, and
    the others keep theirs: the cost of an event follows its group, not every transfer in
    flight (H-ADPSGD's node pairs are groups of a few). A rate is the same law as the filling
    over every transfer, which can differ from it in the last bit (the other groups' levels
    no longer enter its arithmetic). Two forms skip the filling where it would reach them bit
    for bit: while no link carries more than two transfers and none is capped below the links'
    capacity :math:`c` (the processes' shares always; the NICs of a fixed ring), :math:`c/2` for
    a transfer that shares one of its links and :math:`c` for the others (the filling's levels
    :math:`c/2` and :math:`c/2 + c/2` are exact); and :math:`c/k` for a group of :math:`k`
    transfers on one path, none capped below it (the filling's one level; the transfers on a
    path are counted, so such a group is known from its path's links alone).

    Each transfer's time to go at its rate (bytes left / rate) is kept as of the last event, so
    that an event passes once over the transfers in flight (moving their bytes on), and the
    next end is the least of the times to go."""

    __slots__ = (
        "_capacity",
        "_count",
        "_crowded",
        "_exact",
        "_first",
        "_flows",
        "_go",
        "_half",
        "_now",
        "_odd",
        "_on",
        "_paths",
    )

    def __init__(self, capacity: float) -> None:
        self._capacity = capacity
        self._half = capacity / 2
        self._flows: dict[int, list[Any]] = {}  # id: [links, bytes left, cap, rate]
        self._go: dict[int, float] = {}  # id: its time to go at its rate as of _now, bytes left / rate
        self._on: dict[int, dict[int, None]] = {}  # link: the transfers on it
        self._paths: dict[tuple[int, ...], int] = {}  # the transfers that take each path (their links)
        self._now = 0.0
        self._count: dict[int, int] = {}  # transfers per link
        self._crowded = 0  # links that carry more than two transfers
        self._odd = 0  # transfers the closed form does not cover: capped below the capacity, on no link
        self._exact = True  # whether every rate in force is the closed form's
        self._first: float | None = math.inf  # the least time to go of those in flight, if known

    def active(self, link: int) -> int:
        """Transfers in flight on ``link``."""
        return self._count.get(link, 0)

    def add(self, key: int, links: tuple[int, ...], nbytes: float, cap: float, t: float) -> list[tuple[int, float]]:
        """Start transfer ``key`` of ``nbytes`` over ``links`` at most ``cap`` bytes/s at ``t``;
        returns the transfers that ended up to ``t`` (:meth:`advance`)."""
        ended = self.advance(t)
        count, on = self._count, self._on
        alone = not any(map(count.get, links))
        for link in links:
            k = count[link] = count.get(link, 0) + 1
            if k > 1:
                if k == 3:
                    self._crowded += 1
                on[link][key] = None
            else:
                on[link] = {key: None}
        self._paths[links] = self._paths.get(links, 0) + 1
        rate = min(cap, self._capacity)
        f = self._flows[key] = [links, float(nbytes), cap, rate]
        go = self._go[key] = f[1] / rate
        if not (self._capacity <= cap < math.inf and links):
            self._odd += 1
        if not alone:  # on idle links it takes the lesser of its cap and theirs, and slows no one
            self._rates(links)
        elif self._first is not None and go < self._first:
            self._first = go
        return ended

    def advance(self, t: float) -> list[tuple[int, float]]:
        """Move every transfer on to ``t``; returns ``(key, end)`` of those that ended, in order."""
        ended: list[tuple[int, float]] = []
        flows, go = self._flows, self._go
        first = self._first
        while flows:
            if first is None:
                first = min(go.values())
            if self._now + first > t:
                dt = t - self._now
                if dt > 0.0:
                    first = math.inf
                    for key, f in flows.items():
                        x = f[1] = f[1] - f[3] * dt
                        x = go[key] = x / f[3]
                        if x < first:
                            first = x
                break
            self._now += first
            near = first * (1.0 + 1e-9) + 1e-15
            done = []
            for key, f in flows.items():
                if go[key] <= near:
                    done.append(key)
                x = f[1] = f[1] - f[3] * first
                go[key] = x / f[3]
            freed: list[int] = []  # links that still carry a transfer
            for key in done:
                self._leave(key, freed)
                ended.append((key, self._now))
            if freed:  # a transfer that had its links to itself frees nothing another can use
                self._rates(freed)
            first = None
        self._first = first if flows else math.inf
        self._now = max(self._now, t)
        return ended

    def _leave(self, key: int, freed: list[int]) -> None:
        """Take transfer ``key`` off its links; ``freed`` gains those that still carry one."""
        count, on = self._count, self._on
        links, _left, cap, _rate = self._flows.pop(key)
        del self._go[key]
        k = self._paths[links] - 1
        if k:
            self._paths[links] = k
        else:
            del self._paths[links]
        if not (self._capacity <= cap < math.inf and links):
            self._odd -= 1
        for link in links:
            k = count[link] - 1
            count[link] = k
            del on[link][key]
            if k == 2:
                self._crowded -= 1
            if k > 0:
                freed.append(link)

    def next_end(self) -> float:
        """When the first transfer in flight ends if none joins (``inf`` when none is)."""
        if not self._flows:
            return math.inf
        if self._first is None:
            self._first = min(self._go.values())
        return self._now + self._first

    def _rates(self, links: Iterable[int]) -> None:
        """Recompute the rates that a join or a departure on ``links`` changes (class
        docstring): in the closed form those of the transfers on them (a rate follows its own
        links), otherwise those of their group."""
        self._first = None
        flows, on, go = self._flows, self._on, self._go
        if not self._crowded and not self._odd:
            count, half, whole = self._count, self._half, self._capacity
            held = [key for link in links for key in on[link]] if self._exact else flows
            for key in held:
                f = flows[key]
                rate = whole
                for link in f[0]:
                    if count[link] == 2:
                        rate = half
                        break
                f[3] = rate
                go[key] = f[1] / rate
            self._exact = True
            return
        self._exact = False
        count, paths = self._count, self._paths
        seen: set[int] = set()
        for seed in links:
            if seed in seen or not on[seed]:
                continue
            keys = on[seed]
            k = len(keys)
            path = flows[next(iter(keys))][0]
            if paths[path] == k:
                for link in path:
                    if count[link] != k:
                        break
                else:  # every transfer on the seed takes one path, and no other does: the group
                    seen.update(path)
                    self._fill(list(keys), path)
                    continue
            seen.add(seed)
            todo = [seed]
            group: dict[int, None] = {}  # one group: the transfers linked to the seed's
            while todo:
                for key in on[todo.pop()]:
                    if key not in group:
                        group[key] = None
                        for other in flows[key][0]:
                            if other not in seen:
                                seen.add(other)
                                todo.append(other)
            self._fill(list(group), None)

    def _fill(self, keys: list[int], path: tuple[int, ...] | None) -> None:
        """The max-min rates of the group ``keys`` (``path``: the one they all take, if known)."""
        flows, go, capacity = self._flows, self._go, self._capacity
        held = [flows[key] for key in keys]
        if path is None:
            path = held[0][0]
            links = set(path)
            for f in held:
                if f[0] != path and (len(f[0]) != len(links) or set(f[0]) != links):
                    path = None
                    break
        if path is not None and len(set(path)) == len(path) and self._uncapped(held):
            # one path shared by k transfers none of which is capped below it: c/k, the filling's one level
            share = capacity / len(held)
            for key, f in zip(keys, held):
                f[3] = share
                go[key] = f[1] / share
            return
        rates = max_min_rates([f[0] for f in held], capacity, [f[2] for f in held])
        for key, f, rate in zip(keys, held, rates):
            f[3] = rate
            go[key] = f[1] / rate

    def _uncapped(self, held: list[list[Any]]) -> bool:
        """Whether no transfer of ``held`` is capped below the links' capacity (nor unbounded)."""
        capacity = self._capacity
        for f in held:
            if not capacity <= f[2] < math.inf:
                return False
        return True


class Network:
    """Costs and link occupancy for one simulation (see the module docstring)."""

    __slots__ = (
        "_cache",
        "_coll_scatter",
        "_cpu",
        "_cpu_flows",
        "_flows",
        "_gathers",
        "_host",
        "_inter_lat",
        "_intra_bw",
        "_intra_lat",
        "_intra_scatter",
        "_mem_bw",
        "_n_hosts",
        "_nic_bw",
        "_nic_scatter",
        "_paths",
        "_pcie_bw",
        "_pcie_lat",
        "_per_socket",
        "_process_ends",
        "_socket",
        "_socket_bw",
        "_span_bw",
        "_span_lat",
        "_staging",
        "nics",
        "placement",
        "platform",
    )

    def __init__(self, platform: Platform, placement: Placement) -> None:
        self.platform = platform
        self.placement = placement
        self._n_hosts = platform.hosts
        self._flows: dict[int, list[tuple[float, float]]] = {}  # per link: (start, end)
        self._pcie_bw = platform.pcie.effective_bandwidth_bytes_per_s
        self._nic_bw = platform.nic.effective_bandwidth_bytes_per_s
        self._host = placement.host
        self._socket = placement.socket
        self._per_socket = placement.per_socket
        nv = platform.nvlink
        self._intra_bw = nv.effective_bandwidth_bytes_per_s if nv is not None else None
        self._intra_lat = nv.latency_s if nv is not None else platform.pcie.latency_s
        self._intra_scatter = (nv or platform.pcie).scatter
        self._coll_scatter = platform.collective.scatter if platform.collective is not None else ()
        self._nic_scatter = platform.nic.scatter
        self._process_ends = platform.endpoints == "process"
        ends_lat = platform.ends_latency_s
        self._inter_lat = platform.nic.latency_s + ends_lat
        span = platform.collective_between_hosts or platform.nic  # an allreduce's edges between hosts
        self._span_bw = span.effective_bandwidth_bytes_per_s
        self._span_lat = span.latency_s + ends_lat
        self._mem_bw = platform.host_memory_bandwidth_bytes_per_s
        self._pcie_lat = platform.pcie.latency_s
        sl = platform.socket_link
        self._socket_bw = sl.effective_bandwidth_bytes_per_s if sl is not None else None
        self._staging = platform.staging
        self._cache: dict[tuple[int, ...], tuple[Any, ...]] = {}
        self._paths: dict[tuple[int, int], tuple[tuple[int, ...], tuple[float, ...], float]] = {}
        self._gathers: dict[tuple[int, int, float], float] = {}  # an allgather's law by (host, shards, bytes)
        self._cpu = platform.host_cpu
        self._cpu_flows: dict[int, list[list[float]]] = {}  # per machine: [start, end, processes]
        self.nics = FairLinks(self._nic_bw)  # transfers between hosts in flight on the NICs (_nic_links)

    # ----- link occupancy ---------------------------------------------------------------------
    def _active(self, link: int, t: float) -> int:
        """Transfers on ``link`` at ``t``: those registered, and on a NIC those in flight there.
        Once a link has registered more than 8, the finished ones are dropped first."""
        n = 0
        flows = self._flows.get(link)
        if flows:
            if len(flows) > 8:
                flows[:] = [f for f in flows if f[1] > t]
            for start, end in flows:
                if start <= t < end:
                    n += 1
        if 0 <= link < self._n_hosts:  # a NIC: the busier of its two directions
            out, into = _nic_links(link)
            n += max(self.nics.active(out), self.nics.active(into))
        return n

    def _register(self, links: tuple[int, ...], start: float, end: float) -> None:
        flows = self._flows
        for link in links:
            held = flows.get(link)
            if held is None:
                flows[link] = [(start, end)]
            else:
                held.append((start, end))

    def _copies_s(self, a: int, b: int, nbytes: float, t: float) -> float:
        """Copies of ``nbytes`` between device and host memory by ``a`` and ``b`` at ``t``, in
        parallel, over their sockets' PCIe at its share then (registered)."""
        H = self._n_hosts
        la, lb = H + self._socket[a], H + self._socket[b]
        bw = self._pcie_bw / (self._active(la, t) + 1)
        if lb != la:
            other = self._pcie_bw / (self._active(lb, t) + 1)
            if other < bw:
                bw = other
        dur = transfer_s(nbytes, bw, self._pcie_lat)
        self._register((la,) if lb == la else (la, lb), t, t + dur)
        return dur

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
        oversubscribed, :func:`~psgdlab.core.platform.cost.cpu_stretch_s` on the most loaded machine
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
    def _path(self, a: int, b: int) -> tuple[tuple[int, ...], tuple[float, ...], float]:
        """Links, their bandwidths and the latency between ``a`` and ``b`` of one host."""
        path = self._paths.get((a, b))
        if path is None:
            path = self._paths[(a, b)] = self._find_path(a, b)
        return path

    def _find_path(self, a: int, b: int) -> tuple[tuple[int, ...], tuple[float, ...], float]:
        sa, sb = self._socket[a], self._socket[b]
        H = self._n_hosts
        if self._intra_bw is not None:
            return (), (), self._intra_lat
        if sa == sb:
            return (H + sa,), (self._pcie_bw,), self._intra_lat
        if self._socket_bw is not None:
            return (
                (H + sa, H + sb, _socket_link(self._host[a])),
                (self._pcie_bw, self._pcie_bw, self._socket_bw),
                self._intra_lat,
            )
        return (H + sa, H + sb), (self._pcie_bw,) * 2, self._intra_lat

    @property
    def scatters(self) -> bool:
        """Whether some pairwise average or allreduce draws a factor from a link's ``scatter``
        (:meth:`pair_scatter`, :meth:`allreduce_scatter`)."""
        return bool(self._nic_scatter or self._intra_scatter or self._coll_scatter)

    def pair_scatter(self, a: int, b: int) -> tuple[float, ...]:
        """The ``scatter`` quantiles of a pairwise average between ``a`` and ``b``: the NIC's
        between hosts, inside a host its link class's (NVLink, else PCIe: what the
        calibration's averages inside a host fit)."""
        return self._nic_scatter if self.crosses(a, b) else self._intra_scatter

    def allreduce_scatter(self, group: tuple[int, ...]) -> tuple[float, ...]:
        """The ``scatter`` quantiles of an allreduce over ``group``: ``platform.collective``'s
        inside a host, where that law prices it (:meth:`allreduce_s`); none across hosts."""
        if not self._coll_scatter:
            return ()
        host = self._host[group[0]]
        return self._coll_scatter if all(self._host[r] == host for r in group) else ()

    def crosses(self, a: int, b: int) -> bool:
        """Whether ``a`` and ``b`` are on different hosts (their transfers cross the NICs)."""
        return self._host[a] != self._host[b]

    def transfer_s(self, a: int, b: int, nbytes: float, start: float) -> float:
        """Time to move ``nbytes`` from worker ``a`` to ``b`` of the same host (each way, full
        duplex); between hosts the bytes share the NICs (:meth:`wire`)."""
        if self.crosses(a, b):
            raise SimulationError(f"a transfer between hosts ({a} -> {b}) shares the NICs: see Network.wire")
        links, caps, lat = self._path(a, b)
        bw = self._share(links, caps, start) if links else self._intra_bw
        dur = transfer_s(nbytes, bw, lat)
        if self._cpu is not None:
            dur = self._cpu_wait(self._per_host((a, b)), self._cpu.work_s(1, nbytes), start, dur)
        if links:
            self._register(links, start, start + dur)
        return dur

    def wire(
        self, a: int, b: int, nbytes: float, start: float, both_ways: bool = True
    ) -> tuple[tuple[int, ...], float, float]:
        """A transfer of ``nbytes`` each way between the hosts of ``a`` and ``b`` (from ``a`` to
        ``b`` alone when not ``both_ways``: a gossip's send, whose reply is the peer's own send)
        whose bytes go on the NICs at ``start``: the NIC links it shares (:attr:`nics`: each NIC
        is two links, one a direction, as a full-duplex NIC is), its rate cap (the NIC's
        bandwidth, or the share of the PCIe legs at both ends when devices send directly),
        and the time it takes besides its bytes' time on the NICs: the path's latency and the
        stretch of its CPU work on oversubscribed cores (counted at ``start``, as the bytes'
        time at the NICs' fair share then; registered, as are the PCIe legs)."""
        ha, hb = self._host[a], self._host[b]
        cap, lat = self._nic_bw, self._inter_lat
        legs: tuple[int, ...] = ()
        if self._staging == "host":  # from host memory: the copies are the average's own legs
            lat = self.platform.nic.latency_s
        elif not self._process_ends:
            legs = (self._n_hosts + self._socket[a], self._n_hosts + self._socket[b])
            cap = min(cap, self._share(legs, (self._pcie_bw,) * 2, start))
        out_a, into_a = _nic_links(ha)
        out_b, into_b = _nic_links(hb)
        links = (out_a, into_b, out_b, into_a) if both_ways else (out_a, into_b)
        if self._cpu is None and not legs:
            return links, cap, lat
        wire = nbytes / min(cap, self._nic_bw / (max(self.nics.active(x) for x in links) + 1))
        after = lat
        if self._cpu is not None:
            work = self._cpu.work_s(1, nbytes, between_hosts=True)
            after = self._cpu_wait(self._per_host((a, b)), work, start, wire + lat, wire) - wire
        if legs:
            self._register(legs, start, start + wire + after)
        return links, cap, after

    def pair_average_s(
        self, a: int, b: int, nbytes: float, start: float, gather: int = 1, model_bytes: float = 0.0
    ) -> float:
        """Pairwise average of ``nbytes`` between ``a`` and ``b`` of the same host (+ an allgather
        of ``gather`` shards of ``model_bytes`` inside the host afterwards); between hosts its
        legs are :meth:`pair_before_wire`, :meth:`wire` and :meth:`pair_after_wire`."""
        if self.crosses(a, b):
            raise SimulationError(f"a pairwise average between hosts ({a}, {b}) shares the NICs: see Network.wire")
        if self._staging == "direct":
            dur = self.transfer_s(a, b, nbytes, start)
        else:
            d2h = self._copies_s(a, b, nbytes, start)
            t = start + d2h
            net = 0.0
            sa, sb = self._socket[a], self._socket[b]
            if sa != sb and self._socket_bw is not None:  # the host average reads the peer's socket memory
                link = (_socket_link(self._host[a]),)
                net = transfer_s(nbytes, self._share(link, (self._socket_bw,), t), 0.0)
                self._register(link, t, t + net)
            dur = d2h + net + self.pair_after_wire(a, b, nbytes, t + net)
            if self._cpu is not None:
                dur = self._cpu_wait(self._per_host((a, b)), self._cpu.work_s(1, nbytes), start, dur)
        if gather > 1:
            dur += self.allgather_s(a, gather, model_bytes, start + dur)
        return dur

    def pair_before_wire(self, a: int, b: int, nbytes: float, start: float) -> float:
        """With ``staging = "host"``: the device-to-host copies that begin a pairwise average at
        ``start`` over the sockets' PCIe (both sides copy in parallel; registered); 0 otherwise."""
        if self._staging == "direct":
            return 0.0
        return self._copies_s(a, b, nbytes, start)

    def pair_after_wire(self, a: int, b: int, nbytes: float, t: float) -> float:
        """With ``staging = "host"``: the CPU average and the host-to-device copies that end a
        pairwise average once the peer's model is in host memory at ``t`` (registered); 0
        otherwise."""
        if self._staging == "direct":
            return 0.0
        cpu = host_average_s(nbytes, self._mem_bw)
        return cpu + self._copies_s(a, b, nbytes, t + cpu)

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
        algorithm = self.platform.allreduce
        key = (host, m, model_bytes)
        dur = self._gathers.get(key)
        if dur is None:  # the same for every gather of m shards on one host: no shared link
            members = [r for r in range(len(self._host)) if self._host[r] == host][:m]
            dur = self._gathers[key] = allgather_s(
                m, model_bytes, self._intra_share_bw(members), self._intra_lat, algorithm
            )
        if self._cpu is None:
            return dur
        work = self._cpu.work_s(allreduce_messages(m, algorithm) // 2, allreduce_bytes(m, model_bytes) / 2)
        return self._cpu_wait({host: 1}, work, start, dur)

    # ----- collectives ------------------------------------------------------------------------
    def allreduce_s(
        self, group: tuple[int, ...], nbytes: float, start: float, arrivals: tuple[float, ...] | None = None
    ) -> float:
        """Allreduce of ``nbytes`` over ``group`` starting at ``start``, when its last member
        arrives (one event; the platform's ``allreduce`` schedule). ``arrivals``: when each
        member of ``group`` arrived; a ring that spans hosts and is bound by the NICs is then
        ahead by what it could move before the last
        (:func:`~psgdlab.core.platform.cost.ring_allreduce_after_arrivals`)."""
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
                intra, lat = float("inf"), self._span_lat
            else:
                intra = min(self._intra_share_bw(m) if len(m) > 1 else float("inf") for m in by_host.values())
                lat = max(self._span_lat, self._intra_lat) if spans else self._intra_lat
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
            slow = tuple(self._host[a] != self._host[b] for a, b in zip(group, group[1:] + group[:1]))
            info = (links, intra, lat, members, spans, crossing, slow if spans and not all(slow) else None)
            self._cache[key] = info
        links, intra, lat, members, spans, crossing, slow = info
        bw = intra
        if crossing:  # the ring's edges between sockets share each host's socket link
            assert self._socket_bw is not None
            bw = min(bw, self._share(crossing, (self._socket_bw,) * len(crossing), start))
        by_nics = False  # whether the edges between hosts are the ring's slowest
        if spans:
            nic_links = tuple(link for link in links if link < self._n_hosts)
            nics = self._share(nic_links, (self._span_bw,) * len(nic_links), start)
            by_nics, bw = nics < bw, min(bw, nics)
        if bw == float("inf"):
            bw = self._pcie_bw
        algorithm = self.platform.allreduce
        if spans and self.platform.allreduce_between_hosts is not None:
            algorithm = self.platform.allreduce_between_hosts
        dur = allreduce_s(n, nbytes, bw, lat, algorithm)
        left = 1.0  # of the chunks to move once the last member is here
        if by_nics and slow is not None and algorithm == "ring" and arrivals is not None and min(arrivals) < start:
            ahead = tuple(start - a for a in arrivals)
            dur, done = ring_allreduce_after_arrivals(ahead, slow, dur / allreduce_rounds(n, algorithm))
            left = 1.0 - done
        if self._cpu is not None:
            sent = allreduce_bytes(n, nbytes)
            work = self._cpu.work_s(allreduce_messages(n, algorithm), sent, between_hosts=spans)
            dur = self._cpu_wait(members, left * work, start, dur, left * sent / bw if spans else 0.0)
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


def _nic_links(host: int) -> tuple[int, int]:
    """The keys in :attr:`Network.nics` of a host's NIC sending and receiving."""
    return 2 * host, 2 * host + 1


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
