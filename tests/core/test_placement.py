"""The one placement rule (:mod:`psgdlab.core.platform.placement`): hosts in contiguous blocks, a rank's
device its place on its host, sockets by the fill rule; the simulator and the launcher place by it."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.placement import SOCKET_FILLS, Placement, equal_blocks, local_ranks, place
from psgdlab.core.platform.profile import Link, Platform


@st.composite
def layouts(draw):
    """``(n_workers, per_host, hosts, devices_per_host, sockets_per_host, socket_fill)`` that fit."""
    k = draw(st.integers(1, 4))
    devices = k * draw(st.integers(1, 4))
    m = draw(st.integers(1, devices))
    n = draw(st.integers(1, 40))
    hosts = -(-n // m) + draw(st.integers(0, 3))
    return n, m, hosts, devices, k, draw(st.sampled_from(SOCKET_FILLS))


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_workers_fill_hosts_in_blocks_and_a_device_of_their_host_each(layout):
    n, m, hosts, devices, k, fill = layout
    p = place(n, per_host=m, hosts=hosts, devices_per_host=devices, sockets_per_host=k, socket_fill=fill)
    assert p.host == tuple(sorted(p.host)) and p.host[0] == 0  # contiguous blocks in rank order
    counts = Counter(p.host)
    assert p.hosts_used == len(counts) == -(-n // m) <= hosts
    assert all(counts[h] == m for h in range(p.hosts_used - 1)) and 1 <= counts[p.hosts_used - 1] <= m
    on_host: dict[int, set[int]] = {}
    for h, d in zip(p.host, p.device):
        assert 0 <= d < devices and d not in on_host.setdefault(h, set())  # one worker a device
        on_host[h].add(d)
    assert p.device == local_ranks(p.host)  # a worker's device is its place on its host


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_sockets_hold_their_devices_by_the_fill_rule(layout):
    n, m, hosts, devices, k, fill = layout
    p = place(n, per_host=m, hosts=hosts, devices_per_host=devices, sockets_per_host=k, socket_fill=fill)
    assert len(p.per_socket) == hosts * k and sum(p.per_socket) == n
    assert all(h * k <= s < (h + 1) * k for h, s in zip(p.host, p.socket))  # a socket of its own host
    assert all(c <= devices // k for c in p.per_socket)  # no socket holds more than its devices
    for h in range(p.hosts_used - (n % m != 0)):  # every full block
        load = p.per_socket[h * k : (h + 1) * k]
        if fill == "spread":
            assert max(load) - min(load) <= 1
        else:  # the first socket's devices first, then the next socket's
            cap = devices // k
            assert list(load) == [min(cap, max(0, m - i * cap)) for i in range(k)]
    if m == devices:  # a full host is laid the same by both rules
        other = "pack" if fill == "spread" else "spread"
        assert place(n, per_host=m, hosts=hosts, devices_per_host=devices, sockets_per_host=k, socket_fill=other) == p


@settings(max_examples=200, deadline=None)
@given(hosts=st.integers(1, 8), per_host=st.integers(1, 8), servers=st.integers(0, 2))
def test_a_launch_on_hosts_places_as_the_simulator_and_a_server_on_host_0(hosts, per_host, servers):
    """A launch of ``n`` workers on ``H`` hosts (equal blocks) puts every worker where the
    simulator puts it on a platform of ``H`` hosts of ``n/H`` devices; a server rank runs on
    host 0 after its workers, with the next device."""
    n = hosts * per_host
    blocks = equal_blocks(n, hosts=hosts)
    platform = Platform(hosts=hosts, devices_per_host=per_host, pcie=Link(latency_s=0.0, bandwidth_bytes_per_s=1e9))
    sim = Placement.pack(platform, n)
    assert blocks.host == sim.host and blocks.device == sim.device and blocks.per_host == sim.per_host == per_host
    ranks = blocks.rank_hosts(n + servers)
    assert ranks[:n] == blocks.host and ranks[n:] == (0,) * servers
    assert local_ranks(ranks)[n:] == tuple(per_host + i for i in range(servers))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 30), hosts=st.integers(1, 30))
def test_equal_blocks_need_hosts_that_divide_the_workers(n, hosts):
    if n % hosts:
        with pytest.raises(ConfigError, match=rf"^hosts \({hosts}\) must divide the {n} workers: "):
            equal_blocks(n, hosts=hosts)
    else:
        assert Counter(equal_blocks(n, hosts=hosts).host) == dict.fromkeys(range(hosts), n // hosts)


def test_a_launcher_places_its_ranks_by_the_rule():
    """``psgdlab train --hosts``: the launcher's ranks (a parameter server's included) by
    :meth:`~psgdlab.core.platform.placement.Placement.rank_hosts`."""
    from psgdlab.runtime.config import TrainConfig
    from psgdlab.runtime.launcher.launch import rank_hosts

    assert rank_hosts(TrainConfig(algorithm="asgd", workers=4, hosts=2, steps=1)) == (0, 0, 1, 1, 0)
    assert rank_hosts(TrainConfig(algorithm="adpsgd", workers=6, hosts=3, steps=1)) == (0, 0, 1, 1, 2, 2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_workers=4, per_host=0), r"gpus_per_node \(0\) must be an integer >= 1"),
        (dict(n_workers=0, per_host=2), r"workers \(0\) must be an integer >= 1"),
        (dict(n_workers=4, per_host=4, devices_per_host=2), r"gpus_per_node \(4\) must be <= .* \(2\)"),
        (dict(n_workers=9, per_host=4, hosts=2), r"workers \(9\) need 3 hosts of 4 devices but .* has 2 hosts"),
        (dict(n_workers=4, per_host=2, socket_fill="fill"), r"socket_fill \('fill'\) must be one of spread, pack"),
    ],
)
def test_a_placement_that_cannot_be_is_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        place(**kwargs)
    with pytest.raises(ConfigError, match=r"world size \(3\) must be at least the 4 workers"):
        place(4, per_host=2).rank_hosts(3)
