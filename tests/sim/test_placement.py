"""Placement on sockets (socket_fill) and the inter-socket link the simulator prices."""

from __future__ import annotations

import math
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.profile import Link, Platform
from psgdlab.sim.network import Network
from psgdlab.sim.platform import Placement


def _platform(**kw):
    base = dict(
        devices_per_host=8,
        sockets_per_host=2,
        pcie=Link(latency_s=0.0, bandwidth_bytes_per_s=16e9),
    )
    return Platform(**{**base, **kw})


@pytest.mark.parametrize("fill,shape", [("spread", "2+2"), ("pack", "4+0")])
def test_socket_fill_places_a_partial_host(fill, shape):
    p = Placement.pack(_platform(socket_fill=fill), 4)
    assert p.sockets_text() == shape
    full = Placement.pack(_platform(socket_fill=fill), 8)
    assert full.sockets_text() == "4+4"  # a full host is the same either way


def test_input_copies_share_the_socket_they_are_packed_on():
    for fill, sharers in (("spread", 2), ("pack", 4)):
        net = Network(_platform(socket_fill=fill), Placement.pack(_platform(socket_fill=fill), 4))
        assert net.input_copy_s(0, 16e9) == pytest.approx(sharers * 1.0)


def test_socket_link_bounds_transfers_and_allreduces_across_sockets():
    slow = Link(latency_s=0.0, bandwidth_bytes_per_s=1e9)
    with_link = _platform(socket_link=slow)
    net = Network(with_link, Placement.pack(with_link, 8))
    assert net.transfer_s(0, 7, 1e9, 0.0) == pytest.approx(1.0)  # across sockets: the 1 GB/s link
    assert net.transfer_s(0, 1, 1e9, 10.0) == pytest.approx(1e9 / 16e9)  # same socket: PCIe
    net = Network(with_link, Placement.pack(with_link, 8))
    t = net.allreduce_s(tuple(range(8)), 8e9, 0.0)
    assert t == pytest.approx(2 * 7 / 8 * 8e9 / 1e9)  # the ring's crossing edges run at the link's rate
    free = Network(_platform(), Placement.pack(_platform(), 8))
    assert free.transfer_s(0, 7, 1e9, 0.0) == pytest.approx(1e9 / 16e9)
    assert free.allreduce_s(tuple(range(8)), 8e9, 0.0) == pytest.approx(2 * 7 / 8 * 8e9 / 4e9)


LAT, NIC = 1e-3, 2e-3  # the link inside a host's latency, the NIC's


def _two_hosts(
    between: Literal["ring"] | None, endpoints: Literal["device", "process"] = "device", devices_per_host: int = 2
) -> Platform:
    return Platform(
        hosts=2,
        devices_per_host=devices_per_host,
        sockets_per_host=2,
        pcie=Link(latency_s=LAT, bandwidth_bytes_per_s=1e9),
        nic=Link(latency_s=NIC, bandwidth_bytes_per_s=1e8),
        endpoints=endpoints,
        allreduce="direct",
        allreduce_between_hosts=between,
    )


def test_an_allreduce_across_hosts_takes_the_schedule_between_hosts():
    """A group inside one host keeps the platform's schedule (2 latency rounds for ``direct``); a
    group across hosts takes ``allreduce_between_hosts`` (a ring of 4: 6 rounds) at the NIC's
    latency plus the two host-side legs, and without it the platform's own."""
    lat, nic = LAT, NIC
    split = _two_hosts("ring")
    net = Network(split, Placement.pack(split, 4))
    assert net.allreduce_s((0, 1), 0.0, 0.0) == pytest.approx(2 * lat)
    assert net.allreduce_s((0, 1, 2, 3), 0.0, 0.0) == pytest.approx(6 * (nic + 2 * lat))
    assert net.allreduce_s((0, 1, 2, 3), 1e8, 10.0) == pytest.approx(6 * (nic + 2 * lat) + 1.5)  # 2(n-1)/n S / NIC
    same = _two_hosts(None)
    assert Network(same, Placement.pack(same, 4)).allreduce_s((0, 1, 2, 3), 0.0, 0.0) == pytest.approx(
        2 * (nic + 2 * lat)
    )


def test_processes_as_endpoints_take_the_network_path_alone():
    """With ``endpoints = "process"`` (CPU processes talking TCP, as on emulated hosts) a message
    between hosts and every round of an allreduce across hosts cost the NIC's latency and share,
    without the two host-side legs; inside a host nothing changes."""
    lat, nic = LAT, NIC
    p = _two_hosts("ring", "process")
    net = Network(p, Placement.pack(p, 4))
    links, cap, after = net.wire(0, 2, 1e8, 0.0)
    assert sorted(links) == [0, 1, 2, 3] and after + 1e8 / cap == pytest.approx(nic + 1.0)  # both ways, both NICs
    assert net.transfer_s(0, 1, 1e9, 10.0) == pytest.approx(lat + 1.0)  # inside a host: its link
    assert net.allreduce_s((0, 1, 2, 3), 1e8, 20.0) == pytest.approx(6 * nic + 1.5)
    assert net.allreduce_s((0, 1), 0.0, 30.0) == pytest.approx(2 * lat)
    with pytest.raises(ConfigError, match="endpoints"):
        Platform(endpoints="gpu")  # type: ignore[arg-type]


@pytest.mark.parametrize("endpoints", ["process", "device"])
def test_a_ring_across_hosts_moves_what_it_can_before_its_last_member_arrives(endpoints):
    """Two hosts of four on a ring between hosts (8 members: 14 chunk steps): with member 1 long
    late, the edges between the hosts carried 2 and 6 of their chunks before it came, so the
    ring ends 12 steps after it; with every member on time it takes its 14, as without arrival
    times; a group inside one host and a ring of one member per host gain nothing."""
    p = _two_hosts("ring", endpoints, devices_per_host=4)
    group, late = tuple(range(8)), [0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    ring = Network(p, Placement.pack(p, 8)).allreduce_s(group, 1e8, 5.0)
    assert Network(p, Placement.pack(p, 8)).allreduce_s(group, 1e8, 5.0, (5.0,) * 8) == pytest.approx(ring)
    assert Network(p, Placement.pack(p, 8)).allreduce_s(group, 1e8, 5.0, tuple(late)) == pytest.approx(ring * 12 / 14)
    inside = Network(p, Placement.pack(p, 8))
    assert inside.allreduce_s((0, 1, 2, 3), 1e8, 5.0, (0.0, 5.0, 0.0, 0.0)) == pytest.approx(
        Network(p, Placement.pack(p, 8)).allreduce_s((0, 1, 2, 3), 1e8, 5.0)
    )
    spread = Placement.pack(p, 2, per_host=1)
    alone = Network(p, spread).allreduce_s((0, 1), 1e8, 5.0)
    assert Network(p, spread).allreduce_s((0, 1), 1e8, 5.0, (0.0, 5.0)) == pytest.approx(alone)


def test_a_ring_bound_inside_its_hosts_gains_nothing_from_a_late_member():
    """With GPUs as endpoints and a NIC faster than each device's share of its socket's PCIe,
    every edge of the ring runs at the PCIe share (an edge between hosts crosses PCIe at both
    ends too): a late member's chunk waits on slow edges all the way, so the ring takes its 14
    steps after it, as the allreduce without arrival times."""
    p = Platform(
        hosts=2,
        devices_per_host=4,
        sockets_per_host=2,
        pcie=Link(latency_s=LAT, bandwidth_bytes_per_s=1e9),
        nic=Link(latency_s=NIC, bandwidth_bytes_per_s=1e10),
        allreduce_between_hosts="ring",
    )
    group = tuple(range(8))
    ring = Network(p, Placement.pack(p, 8)).allreduce_s(group, 1e8, 5.0)
    late = (0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert Network(p, Placement.pack(p, 8)).allreduce_s(group, 1e8, 5.0, late) == pytest.approx(ring)


@settings(max_examples=60, deadline=None)
@given(
    starts=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=8),
    endpoints=st.sampled_from(["process", "device"]),
)
def test_transfers_between_hosts_share_the_nics_fairly_and_never_carry_more_than_they_can(starts, endpoints):
    """Transfers of 1e8 B each way between two hosts (1 s of the NICs' 1e8 B/s each) put on the
    NICs at ``starts``: processor sharing. They end in the order they began, none sooner than
    1 s after it began, k begun together end together k s later, and the NICs are never idle
    while bytes wait: the last ends when a queue of the same transfers would have emptied
    (the NICs' capacity, conserved). The one-latency rest of each is the path's (``after``)."""
    p = _two_hosts("ring", endpoints)
    net = Network(p, Placement.pack(p, 4))
    path_lat = NIC if endpoints == "process" else NIC + 2 * LAT
    ends: dict[int, float] = {}
    depart = 0.0
    for key, t in enumerate(sorted(starts)):
        links, cap, _ = net.wire(0, 2, 1e8, t)
        ends.update(net.nics.add(key, links, 1e8, cap, t))
        depart = max(t, depart) + 1.0
        assert net.wire(1, 3, 0.0, t)[2] == pytest.approx(path_lat)
    ends.update(net.nics.advance(math.inf))
    order = sorted(starts)
    assert [ends[k] for k in range(len(order))] == sorted(ends.values())
    assert all(ends[k] >= t + 1.0 - 1e-9 for k, t in enumerate(order))
    assert max(ends.values()) == pytest.approx(depart)
    if len(set(order)) == 1:
        assert all(end == pytest.approx(order[0] + len(order)) for end in ends.values())
