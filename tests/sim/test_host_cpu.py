"""Host cores (``[platform.host_cpu]``): closed forms, the snapshot rule, config loading, errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.algorithms import make_algorithm
from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.cost import ALLREDUCE_ALGORITHMS, allreduce_s
from psgdlab.core.records.trace import PHASES, summarize
from psgdlab.sim.engine import simulate
from psgdlab.sim.network import Network
from psgdlab.sim.platform import HostCPU, Link, Placement, Platform
from psgdlab.sim.workload import Workload, load_config, preset_names

LINK = Link(latency_s=1e-3, bandwidth_bytes_per_s=5e8)


def one_host(n: int, cpu: HostCPU | None) -> Platform:
    """This-machine shape: one host, every device behind its own (unshared) link."""
    return Platform(hosts=1, devices_per_host=n, sockets_per_host=n, pcie=LINK, nic=LINK, host_cpu=cpu)


@given(
    n=st.integers(2, 16), cores=st.integers(1, 8), w_m=st.floats(0, 1e-3), w_b=st.floats(0, 1e-8), S=st.floats(1e3, 1e7)
)
def test_allreduce_stretches_by_the_oversubscribed_cpu_work(n, cores, w_m, w_b, S):
    cpu = HostCPU(cores_per_host=cores, work_per_message_s=w_m, work_per_byte_s=w_b)
    p = one_host(n, cpu)
    net = Network(p, Placement.pack(p, n))
    ring = allreduce_s(n, S, LINK.bandwidth_bytes_per_s, LINK.latency_s)
    work = 2 * (n - 1) * w_m + 2 * (n - 1) / n * S * w_b
    expected = ring + max(0.0, n / cores - 1.0) * work
    assert net.allreduce_s(tuple(range(n)), S, 0.0) == pytest.approx(expected, rel=1e-12)


@given(
    n=st.integers(2, 16),
    cores=st.integers(1, 8),
    w_m=st.floats(0, 1e-3),
    w_b=st.floats(0, 1e-8),
    S=st.floats(1e3, 1e7),
    schedule=st.sampled_from(ALLREDUCE_ALGORITHMS),
)
def test_allreduce_follows_the_platform_schedule(n, cores, w_m, w_b, S, schedule):
    """Every schedule moves the ring's bytes; the latency rounds and messages are the schedule's
    (2(n-1), 2 ceil(log2 n), 2 rounds with 2(n-1) reads); a group of 2 costs alike in all three."""
    cpu = HostCPU(cores_per_host=cores, work_per_message_s=w_m, work_per_byte_s=w_b)
    p = dataclasses.replace(one_host(n, cpu), allreduce=schedule)
    net = Network(p, Placement.pack(p, n))
    rounds = {"ring": 2 * (n - 1), "halving-doubling": 2 * math.ceil(math.log2(n)), "direct": 2}[schedule]
    messages = 2 * (n - 1) if schedule != "halving-doubling" else rounds
    expected = (
        2 * (n - 1) / n * S / LINK.bandwidth_bytes_per_s
        + rounds * LINK.latency_s
        + max(0.0, n / cores - 1.0) * (messages * w_m + 2 * (n - 1) / n * S * w_b)
    )
    assert net.allreduce_s(tuple(range(n)), S, 0.0) == pytest.approx(expected, rel=1e-12)
    if n == 2:
        assert expected == pytest.approx(
            allreduce_s(2, S, LINK.bandwidth_bytes_per_s, LINK.latency_s)
            + max(0.0, 2 / cores - 1.0) * (2 * w_m + S * w_b)
        )


def test_allreduce_schedule_loads_from_toml_and_bad_names_are_refused(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[platform]\nhosts = 1\ndevices_per_host = 4\nallreduce = "direct"\n[workload]\nn_params = 10\n')
    assert load_config(path=path).platform.allreduce == "direct"
    assert all(load_config(preset=name).platform.allreduce == "ring" for name in preset_names())
    path.write_text(path.read_text().replace('"direct"', '"tree"'))
    with pytest.raises(ConfigError, match=r"allreduce \('tree'\) must be one of ring, halving-doubling, direct"):
        load_config(path=path)


def test_no_host_cpu_and_enough_cores_cost_nothing_extra():
    S, n = 4e6, 4
    ring = allreduce_s(n, S, LINK.bandwidth_bytes_per_s, LINK.latency_s)
    for cpu in (None, HostCPU(cores_per_host=4, work_per_message_s=1.0, work_per_byte_s=1.0)):
        p = one_host(n, cpu)
        assert Network(p, Placement.pack(p, n)).allreduce_s(tuple(range(n)), S, 0.0) == pytest.approx(ring)


def test_concurrent_exchanges_count_as_holders_when_they_start():
    """Two pairwise averages on a 2-core host: the first runs alone, the second starts while
    the first holds 2 processes (4 holders: its CPU work doubles); one that starts after the
    first has ended is alone again (the snapshot rule of the links)."""
    cpu = HostCPU(cores_per_host=2, work_per_message_s=0.0, work_per_byte_s=1e-9)
    p = one_host(6, cpu)
    net = Network(p, Placement.pack(p, 6))
    S = 1e6
    alone = LINK.latency_s + S / LINK.bandwidth_bytes_per_s
    first = net.pair_average_s(0, 1, S, 0.0)
    assert first == pytest.approx(alone)
    assert net.pair_average_s(2, 3, S, first / 2) == pytest.approx(alone + (4 / 2 - 1) * S * 1e-9)
    assert net.pair_average_s(4, 5, S, 10.0) == pytest.approx(alone)


@given(
    m=st.integers(2, 8),
    cores=st.integers(1, 4),
    w_m=st.floats(0, 1e-3),
    w_b=st.floats(0, 1e-8),
    S=st.floats(1e3, 1e7),
    schedule=st.sampled_from(ALLREDUCE_ALGORITHMS),
)
def test_the_allgather_after_a_sharded_average_stretches_as_half_an_allreduce(m, cores, w_m, w_b, S, schedule):
    """H-ADPSGD's node gathers its averaged slices (stop's protocol): the gather half of an
    allreduce, on the links and on the cores; the members who gather at once hold the cores
    together (each one's part starts while the others' run)."""
    from psgdlab.core.platform.cost import allgather_s, allreduce_messages

    cpu = HostCPU(cores_per_host=cores, work_per_message_s=w_m, work_per_byte_s=w_b)
    p = dataclasses.replace(one_host(m, cpu), allreduce=schedule)
    net = Network(p, Placement.pack(p, m))
    links = allgather_s(m, S, LINK.bandwidth_bytes_per_s, LINK.latency_s, schedule)
    work = allreduce_messages(m, schedule) // 2 * w_m + (m - 1) / m * S * w_b
    parts = [net.allgather_s(r, m, S, 0.0) for r in range(m)]
    for k, part in enumerate(parts, start=1):  # the k-th member finds k - 1 gathering beside it
        assert part == pytest.approx(links + max(0.0, k / cores - 1.0) * work, rel=1e-9, abs=1e-15)
    without = Network(one_host(m, None), Placement.pack(one_host(m, None), m))
    assert without.allgather_s(0, m, S, 0.0) == pytest.approx(
        allgather_s(m, S, LINK.bandwidth_bytes_per_s, LINK.latency_s), rel=1e-12
    )


def test_emulated_hosts_of_one_machine_share_its_cores():
    """Two hosts of 2 workers on 2 cores each: a pairwise average on host 1 that starts while
    one on host 0 runs is alone on its host's cores, unless both hosts are one machine's
    (``hosts_per_machine = 2``), where it meets the other's 2 holders: 4 on 2 cores."""
    S, w_b = 1e6, 1e-9
    alone = LINK.latency_s + S / LINK.bandwidth_bytes_per_s
    for per_machine, stretch in ((1, 0.0), (2, (4 / 2 - 1) * S * w_b)):
        cpu = HostCPU(cores_per_host=2, work_per_byte_s=w_b, hosts_per_machine=per_machine)
        p = Platform(hosts=2, devices_per_host=2, sockets_per_host=2, pcie=LINK, nic=LINK, host_cpu=cpu)
        net = Network(p, Placement.pack(p, 4))
        first = net.pair_average_s(0, 1, S, 0.0)
        assert first == pytest.approx(alone)
        assert net.pair_average_s(2, 3, S, first / 2) == pytest.approx(alone + stretch)


@settings(max_examples=40, deadline=None)
@given(w_b=st.floats(1e-10, 1e-8), ratio=st.floats(1.5, 10.0), w_m=st.floats(0, 1e-4), S=st.floats(1e5, 1e7))
def test_a_message_between_hosts_costs_the_cpu_work_between_hosts(w_b, ratio, w_m, S):
    """Two hosts of 2 workers, one machine of 2 cores, processes as the network's endpoints (no
    link shared with the first average): the second of two concurrent pairwise averages meets 4
    holders. Across hosts its CPU work is the between-hosts figure (the
    stretch grows by ``ratio``); inside a host it is the host's, whatever the between-hosts one."""
    fast = Link(latency_s=0.0, bandwidth_bytes_per_s=1e12)  # a wire too fast to hide any CPU work
    plain = HostCPU(cores_per_host=2, work_per_message_s=w_m, work_per_byte_s=w_b, hosts_per_machine=2)
    between = dataclasses.replace(
        plain, work_per_message_between_hosts_s=w_m * ratio, work_per_byte_between_hosts_s=w_b * ratio
    )
    stretch = {}
    for name, cpu in (("plain", plain), ("between", between)):
        p = Platform(
            hosts=2, devices_per_host=2, sockets_per_host=2, pcie=fast, nic=fast, endpoints="process", host_cpu=cpu
        )
        for pair in ((0, 1), (1, 2)):  # inside host 0; from host 0 to host 1
            net = Network(p, Placement.pack(p, 4))
            net.pair_average_s(2, 3, S, 0.0)  # two holders on host 1 (the same machine's cores)
            alone = _beside_the_wire(Network(p, Placement.pack(p, 4)), pair, S)
            stretch[name, pair] = _beside_the_wire(net, pair, S) - alone
    assert stretch["between", (0, 1)] == pytest.approx(stretch["plain", (0, 1)], rel=1e-9)
    assert stretch["plain", (1, 2)] == pytest.approx((4 / 2 - 1) * (w_m + S * w_b), rel=1e-9)
    assert stretch["between", (1, 2)] == pytest.approx(ratio * stretch["plain", (1, 2)], rel=1e-9)


def _beside_the_wire(net: Network, pair: tuple[int, int], S: float) -> float:
    """A pairwise average's time at 0 besides its bytes' time on the NICs: all of it inside a host."""
    if net.crosses(*pair):
        return net.wire(*pair, S, 0.0)[2]
    return net.pair_average_s(*pair, S, 0.0)


def test_the_cpu_work_between_hosts_loads_from_toml_and_defaults_to_the_hosts(tmp_path):
    cpu = HostCPU(cores_per_host=2, work_per_message_s=1e-4, work_per_byte_s=2e-10)
    assert cpu.work_s(3, 1e6, between_hosts=True) == cpu.work_s(3, 1e6) == pytest.approx(3e-4 + 2e-4)
    path = tmp_path / "p.toml"
    path.write_text(
        "[platform]\nhosts = 2\ndevices_per_host = 2\nsockets_per_host = 2\n"
        "[platform.host_cpu]\ncores_per_host = 2\nwork_per_message_s = 1e-4\nwork_per_byte_s = 2e-10\n"
        "work_per_byte_between_hosts_s = 1e-9\n[workload]\nn_params = 10\n"
    )
    loaded = load_config(path=path).platform.host_cpu
    assert loaded.work_per_byte_between_hosts_s == 1e-9 and loaded.work_per_message_between_hosts_s is None
    assert loaded.work_s(3, 1e6, between_hosts=True) == pytest.approx(3e-4 + 1e-3)  # its message work: the host's


@given(k=st.integers(1, 32), cores=st.integers(1, 8), work=st.floats(0, 1.0), wire=st.floats(0, 4.0))
def test_a_wire_hides_the_cpu_work_it_overlaps(k, cores, work, wire):
    """The stretch between hosts is what the shared cores need beyond the wire's time and the
    work itself: never more than the stretch inside a host, none once the wire takes longer
    than the shared work, and inside a host (``wire <= work``) the law of the fit."""
    from psgdlab.core.platform.cost import cpu_stretch_s

    inside = cpu_stretch_s(k, cores, work)
    assert inside == pytest.approx(max(0.0, (k / cores - 1) * work), abs=1e-12)
    across = cpu_stretch_s(k, cores, work, wire)
    assert 0.0 <= across <= inside + 1e-12
    if wire >= k * work / cores:
        assert across == 0.0
    if wire <= work:
        assert across == inside


def test_server_request_holds_the_worker_and_the_server():
    from psgdlab.sim.platform import ServerSpec

    S, w_b = 1e6, 1e-9
    for cores, stretch in ((2, 0.0), (1, 1.0)):  # worker + server: 2 holders
        cpu = HostCPU(cores_per_host=cores, work_per_byte_s=w_b)
        p = Platform(
            hosts=1,
            devices_per_host=2,
            sockets_per_host=2,
            pcie=LINK,
            nic=LINK,
            host_cpu=cpu,
            server=ServerSpec(latency_s=1e-3, bandwidth_bytes_per_s=5e8, service_overhead_s=2e-3, apply_on_host=True),
            host_memory_bandwidth_bytes_per_s=3e9,
        )
        net = Network(p, Placement.pack(p, 2))
        base = 1e-3 + S / 5e8 + 2e-3 + 3 * S / 3e9
        assert net.server_s(S) == pytest.approx(base)
        assert net.server_s(S, rank=1, start=0.0) == pytest.approx(base + stretch * (S * w_b + 3 * S / 3e9))


def test_ssgd_step_time_includes_the_cpu_stretch():
    n, cores = 8, 2
    cpu = HostCPU(cores_per_host=cores, work_per_message_s=1e-4, work_per_byte_s=2e-9)
    w = Workload(n_params=250_000, itemsize=8, compute="0.05", reference_batch=8, batch_per_worker=8)
    res = simulate(make_algorithm("ssgd", n_workers=n), one_host(n, cpu), w, steps=20)
    S = w.payload_bytes
    comm = allreduce_s(n, S, LINK.bandwidth_bytes_per_s, LINK.latency_s) + (n / cores - 1) * (
        2 * (n - 1) * 1e-4 + 2 * (n - 1) / n * S * 2e-9
    )
    s = summarize(res.trace, samples_per_step=8, warmup_steps=2)
    assert s["step_time_s"] == pytest.approx(0.05 + comm, rel=1e-9)
    c = res.trace[res.trace["phase"] == PHASES["comm"]]
    np.testing.assert_allclose(c["end_s"] - c["start_s"], comm, rtol=1e-9)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 12), cores=st.integers(1, 8), overhead=st.floats(1e-4, 5e-3))
def test_the_update_after_a_collective_shares_the_cores(n, cores, overhead):
    """SSGD's members leave the allreduce together and update on the host's cores together
    (processor sharing): the last starts its next compute max(1, n/c) updates later, so the
    step is compute + allreduce + max(1, n/c) x the step overhead. The allreduce holds no CPU
    work here (w_m = w_b = 0), so the stretch is the update's alone; without ``host_cpu`` the
    update is never stretched."""
    cpu = HostCPU(cores_per_host=cores, work_per_message_s=0.0, work_per_byte_s=0.0)
    w = Workload(n_params=25_000, itemsize=8, compute="0.05", reference_batch=8, batch_per_worker=8)
    T = allreduce_s(n, w.payload_bytes, LINK.bandwidth_bytes_per_s, LINK.latency_s)
    for host_cpu, stretch in ((cpu, max(1.0, n / cores)), (None, 1.0)):
        p = dataclasses.replace(one_host(n, host_cpu), step_overhead_s=overhead)
        res = simulate(make_algorithm("ssgd", n_workers=n), p, w, steps=8)
        s = summarize(res.trace, samples_per_step=8, warmup_steps=2)
        assert s["step_time_s"] == pytest.approx(0.05 + T + stretch * overhead, rel=1e-9)


def test_host_cpu_loads_from_toml_and_presets_leave_it_out(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        "[platform]\nhosts = 1\ndevices_per_host = 4\nsockets_per_host = 4\n"
        "[platform.host_cpu]\ncores_per_host = 2\nwork_per_message_s = 1e-4\nwork_per_byte_s = 0\n"
        "[workload]\nn_params = 10\n"
    )
    cfg = load_config(path=path)
    assert cfg.platform.host_cpu == HostCPU(cores_per_host=2, work_per_message_s=1e-4, work_per_byte_s=0.0)
    for name in preset_names():
        assert load_config(preset=name).platform.host_cpu is None  # no source gives these numbers
    path.write_text(path.read_text().replace("cores_per_host", "cores"))
    with pytest.raises(ConfigError, match="cores"):
        load_config(path=path)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"cores_per_host": 0}, r"cores_per_host \(0\) must be an integer >= 1"),
        ({"cores_per_host": True}, "cores_per_host"),
        ({"work_per_message_s": -1e-6}, r"work_per_message_s \(-1e-06\) must be >= 0"),
        ({"work_per_byte_s": float("nan")}, "work_per_byte_s"),
        ({"hosts_per_machine": 0}, r"hosts_per_machine \(0\) must be an integer >= 1"),
        ({"work_per_byte_between_hosts_s": -1e-9}, r"work_per_byte_between_hosts_s \(-1e-09\) must be >= 0"),
        ({"work_per_message_between_hosts_s": float("inf")}, "work_per_message_between_hosts_s"),
    ],
)
def test_host_cpu_rejects_bad_values(kw, match):
    with pytest.raises(ConfigError, match=match):
        HostCPU(**kw)


def test_collective_link_prices_allreduces_inside_a_host_only():
    """``[platform.collective]`` replaces the point-to-point link for a ring allreduce inside one
    host; pairwise transfers and allreduces that span hosts keep their links."""
    coll = Link(latency_s=2e-5, bandwidth_bytes_per_s=4e9)
    p = Platform(hosts=2, devices_per_host=4, sockets_per_host=4, pcie=LINK, nic=LINK, collective=coll)
    net = Network(p, Placement.pack(p, 8))
    S = 4e6
    assert net.allreduce_s((0, 1, 2, 3), S, 0.0) == pytest.approx(allreduce_s(4, S, 4e9, 2e-5))
    plain = Network(
        Platform(hosts=2, devices_per_host=4, sockets_per_host=4, pcie=LINK, nic=LINK), Placement.pack(p, 8)
    )
    assert net.allreduce_s(tuple(range(8)), S, 10.0) == pytest.approx(plain.allreduce_s(tuple(range(8)), S, 10.0))
    assert net.transfer_s(0, 1, S, 20.0) == pytest.approx(plain.transfer_s(0, 1, S, 20.0))


@pytest.mark.parametrize("cpu", [None, HostCPU(cores_per_host=2)], ids=["cores-free", "2-cores"])
def test_bmuf_model_allreduce_adds_the_fold_of_the_average(cpu):
    """A model allreduce costs the ring plus ``model_average_s + model_average_s_per_byte * S``,
    stretched by ``n / cores`` when every member folds at once on an oversubscribed host; gradient
    allreduces (ssgd) do not pay it."""
    import dataclasses

    n, a, b = 4, 1e-3, 1e-9
    p = dataclasses.replace(one_host(n, cpu), model_average_s=a, model_average_s_per_byte=b)
    w = Workload(n_params=250_000, itemsize=8, compute="0.05", reference_batch=8, batch_per_worker=8)
    S = w.payload_bytes
    ring = allreduce_s(n, S, LINK.bandwidth_bytes_per_s, LINK.latency_s)
    fold = (a + b * S) * (1.0 if cpu is None else n / 2)
    res = simulate(make_algorithm("bmuf", n_workers=n, period=4), p, w, steps=12)
    c = res.trace[res.trace["phase"] == PHASES["comm"]]
    np.testing.assert_allclose(c["end_s"] - c["start_s"], ring + fold, rtol=1e-9)
    res = simulate(make_algorithm("ssgd", n_workers=n), p, w, steps=6)
    c = res.trace[res.trace["phase"] == PHASES["comm"]]
    np.testing.assert_allclose(c["end_s"] - c["start_s"], ring, rtol=1e-9)
    with pytest.raises(ConfigError, match=r"model_average_s \(-1\.0\) must be >= 0"):
        Platform(model_average_s=-1.0)
