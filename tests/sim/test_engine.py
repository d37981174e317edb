"""Simulator: determinism, closed forms, stragglers, staleness against the reference definition."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.algorithms import ALGORITHMS, make_algorithm
from psgdlab.core.errors import ConfigError
from psgdlab.core.exchange import AllReduce, ExchangeKind, wire_bytes
from psgdlab.core.platform.cost import allreduce_s
from psgdlab.core.platform.failure import STEP_CHECK_ELEMENTS, node_sum_elements
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.core.records.trace import PHASES, TRACE_DTYPE, summarize
from psgdlab.core.reference import LeastSquaresProblem, run_reference
from psgdlab.sim.engine import simulate
from psgdlab.sim.platform import Link, Platform, ServerSpec
from psgdlab.sim.workload import Workload, load_config

MB = 1e6


def flat_platform(**kw):
    """One host of 8 devices with NVLink (unshared), so closed forms are exact."""
    base = dict(
        name="flat",
        hosts=1,
        devices_per_host=8,
        sockets_per_host=1,
        nvlink=Link(latency_s=1e-5, bandwidth_bytes_per_s=1e9),
        server=ServerSpec(latency_s=0.0, bandwidth_bytes_per_s=1e9, service_overhead_s=0.0, apply_on_host=False),
    )
    base.update(kw)
    return Platform(**base)


def workload(compute="0.1", n_params=2_500_000, **kw):
    return Workload(n_params=n_params, compute=compute, batch_per_worker=32, reference_batch=32, **kw)


def compute_rows(trace):
    return trace[trace["phase"] == PHASES["compute"]]


def average_rows(trace):
    """The records of pairwise averages that moved bytes, each from its start (phase overlap)."""
    t = trace
    return t[(t["kind"] == int(ExchangeKind.PAIRWISE)) & (t["nbytes"] > 0) & (t["phase"] == PHASES["overlap"])]


def test_same_seed_gives_identical_trace_arrays():
    cfg = load_config(preset="interspeech2019-v100")
    a = make_algorithm("adpsgd", n_workers=16, variant="random", seed=3)
    t1 = simulate(
        a, cfg.platform, cfg.workload, steps=60, seed=5, stragglers=StragglerModel.parse("random:0.1:3", seed=5)
    ).trace
    t2 = simulate(
        a, cfg.platform, cfg.workload, steps=60, seed=5, stragglers=StragglerModel.parse("random:0.1:3", seed=5)
    ).trace
    assert t1.dtype == TRACE_DTYPE
    assert t1.tobytes() == t2.tobytes()
    t3 = simulate(a, cfg.platform, cfg.workload, steps=60, seed=6).trace
    assert t3.tobytes() != t1.tobytes()


def test_one_worker_step_time_equals_compute_time():
    res = simulate(make_algorithm("sgd"), flat_platform(), workload("0.25"), steps=40)
    s = summarize(res.trace, samples_per_step=32, warmup_steps=2)
    assert s["step_time_s"] == pytest.approx(0.25)
    assert s["samples_per_s"] == pytest.approx(32 / 0.25, rel=1e-9)
    assert s["comm_fraction"] == 0.0


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_allreduce_matches_formula(n):
    p, w = flat_platform(), workload("0.1")
    res = simulate(make_algorithm("ssgd", n_workers=n), p, w, steps=10)
    comm = res.trace[res.trace["phase"] == PHASES["comm"]]
    expected = 2 * (n - 1) / n * w.payload_bytes / 1e9 + 2 * (n - 1) * 1e-5
    assert expected == pytest.approx(allreduce_s(n, w.payload_bytes, 1e9, 1e-5))
    np.testing.assert_allclose(comm["end_s"] - comm["start_s"], expected, rtol=1e-9)
    s = summarize(res.trace, samples_per_step=32, warmup_steps=1)
    assert s["step_time_s"] == pytest.approx(0.1 + expected)
    assert set(comm["nbytes"]) == {(2 * (n - 1) * w.payload_bytes) // n}


def test_allreduce_shares_socket_pcie_like_algorithms_md():
    """ALGORITHMS.md D.4: 8-GPU ring allreduce with 4 GPUs per socket's 16 GB/s = 75.5 ms."""
    cfg = load_config(preset="interspeech2019-v100")
    p = Platform(
        **{
            **{f: getattr(cfg.platform, f) for f in cfg.platform.__dataclass_fields__},
            "pcie": Link(latency_s=0.0, bandwidth_bytes_per_s=16e9),
        }
    )
    w = Workload(n_params=43_125_000, compute="0.171", reference_batch=128, batch_per_worker=128)
    res = simulate(make_algorithm("ssgd", n_workers=8), p, w, steps=3)
    comm = res.trace[res.trace["phase"] == PHASES["comm"]]
    assert float(np.max(comm["end_s"] - comm["start_s"])) == pytest.approx(0.0755, rel=2e-3)


@pytest.mark.parametrize("n", [4, 16, 32])
def test_parameter_server_saturates_at_n_S_over_bandwidth(n):
    w = workload("0.001")  # compute << service: the server is the bottleneck
    res = simulate(make_algorithm("asgd", n_workers=n, period=1), flat_platform(devices_per_host=32), w, steps=100)
    s = summarize(res.trace, samples_per_step=32, warmup_steps=5)
    service = w.payload_bytes / 1e9
    # one round of n requests takes n * S / B; each worker completes one step per round
    assert s["step_time_mean_s"] == pytest.approx(n * service, rel=0.02)
    assert s["samples_per_s"] == pytest.approx(32 / service, rel=0.02)


def test_a_worker_on_another_host_reaches_the_server_through_the_nics():
    """The server lives on host 0: a request from another host crosses the NICs, at the lesser
    of the server's and the NIC's bandwidth plus the path's latency; one from host 0 does not.
    Four ASGD workers on two hosts, the server the bottleneck: a round serves two of each."""
    from psgdlab.sim.network import Network
    from psgdlab.sim.platform import Placement

    nic = Link(latency_s=2e-4, bandwidth_bytes_per_s=1e8)
    p = flat_platform(hosts=2, devices_per_host=2, nic=nic)
    w = workload("0.001")
    S = w.payload_bytes
    net = Network(p, Placement.pack(p, 4))
    local, remote = S / 1e9, 2e-4 + 2 * p.pcie.latency_s + S / 1e8  # NIC and PCIe at both ends
    assert net.server_per_request
    assert net.server_s(S, rank=1, start=0.0) == pytest.approx(local)
    assert net.server_s(S, rank=2, start=0.0) == pytest.approx(remote)
    assert net.server_s(S) == pytest.approx(local)  # no one asking: the server's own link
    res = simulate(make_algorithm("asgd", n_workers=4, period=1), p, w, steps=60)
    s = summarize(res.trace, samples_per_step=32, warmup_steps=5)
    assert s["step_time_mean_s"] == pytest.approx(2 * local + 2 * remote, rel=0.02)
    one_host = Network(
        flat_platform(hosts=2, devices_per_host=4, nic=nic),
        Placement.pack(flat_platform(hosts=2, devices_per_host=4, nic=nic), 4),
    )
    assert not one_host.server_per_request  # every worker beside the server: the plain service time


def test_ssgd_step_time_follows_the_slowest_worker():
    p, w = flat_platform(), workload("0.1")
    fast = summarize(simulate(make_algorithm("ssgd", n_workers=8), p, w, steps=30).trace, samples_per_step=32)
    slow = summarize(
        simulate(make_algorithm("ssgd", n_workers=8), p, w, steps=30, stragglers=StragglerModel.parse("3:2")).trace,
        samples_per_step=32,
    )
    ar = allreduce_s(8, w.payload_bytes, 1e9, 1e-5)
    assert fast["step_time_s"] == pytest.approx(0.1 + ar)
    assert slow["step_time_s"] == pytest.approx(0.2 + ar)


@pytest.mark.parametrize("slow_rank,steps_left", [(1, 12), (3, 14)])
def test_ssgd_across_hosts_waits_on_a_straggler_less_than_a_whole_ring(slow_rank, steps_left):
    """SSGD over two hosts of four (the ring between hosts at the NIC's 1e8 B/s, the edges inside a
    host at 1e10): a straggler's step is its compute and what the ring has left when its
    gradient arrives (core.cost.ring_allreduce_after_arrivals): 12 of 14 chunk steps for worker
    1, whose chunks need 2 hops to leave its host; all 14 for worker 3, which sends across."""
    p = flat_platform(
        hosts=2,
        devices_per_host=4,
        nvlink=Link(latency_s=0.0, bandwidth_bytes_per_s=1e10),
        pcie=Link(latency_s=0.0, bandwidth_bytes_per_s=1e10),
        nic=Link(latency_s=0.0, bandwidth_bytes_per_s=1e8),
        allreduce_between_hosts="ring",
    )
    w = workload("0.5")
    late = StragglerModel.parse(f"{slow_rank}:2")
    trace = simulate(make_algorithm("ssgd", n_workers=8), p, w, steps=20, stragglers=late).trace
    slow = summarize(trace, samples_per_step=32, warmup_steps=2)
    ring = allreduce_s(8, w.payload_bytes, 1e8, 0.0)
    assert slow["step_time_s"] == pytest.approx(1.0 + ring * steps_left / 14)


def test_adpsgd_loses_only_about_the_slow_workers_share():
    cfg = load_config(preset="interspeech2019-v100")
    n = 16
    a = make_algorithm("adpsgd", n_workers=n)
    base = summarize(simulate(a, cfg.platform, cfg.workload, steps=150).trace, samples_per_step=128, warmup_steps=10)
    slow = summarize(
        simulate(a, cfg.platform, cfg.workload, steps=150, stragglers=StragglerModel.parse("5:4")).trace,
        samples_per_step=128,
        warmup_steps=10,
    )
    loss = 1 - slow["samples_per_s"] / base["samples_per_s"]
    # the slow worker contributes a quarter of its share; the others keep going
    assert loss == pytest.approx((1 - 1 / 4) / n, abs=0.02)
    ssgd = make_algorithm("ssgd", n_workers=n)
    s_base = summarize(simulate(ssgd, cfg.platform, cfg.workload, steps=40).trace, samples_per_step=128)
    s_slow = summarize(
        simulate(ssgd, cfg.platform, cfg.workload, steps=40, stragglers=StragglerModel.parse("5:4")).trace,
        samples_per_step=128,
    )
    assert 1 - s_slow["samples_per_s"] / s_base["samples_per_s"] > 0.5


def test_periodic_pause_costs_its_duration_in_ssgd():
    p, w = flat_platform(), workload("0.1")
    res = simulate(
        make_algorithm("ssgd", n_workers=4), p, w, steps=20, stragglers=StragglerModel.parse("periodic:2:5:1.0")
    )
    base = simulate(make_algorithm("ssgd", n_workers=4), p, w, steps=20)
    span = lambda t: float(t["end_s"].max())
    assert span(res.trace) - span(base.trace) == pytest.approx(4 * 1.0)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_registry_algorithm_runs(name):
    cfg = load_config(preset="interspeech2019-v100")
    n = 1 if name == "sgd" else 8
    params = {"gpus_per_node": 4} if name == "hadpsgd" else {}
    res = simulate(make_algorithm(name, n_workers=n, **params), cfg.platform, cfg.workload, steps=30)
    comp = compute_rows(res.trace)
    assert np.all(comp["staleness"] >= 0)
    assert np.all(res.trace["end_s"] >= res.trace["start_s"])
    counts = [int(np.count_nonzero(comp["rank"] == r)) for r in range(n)]
    assert max(counts) == 30 and min(counts) >= 25  # the window ends when the first worker is done
    if not make_algorithm(name, n_workers=n, **params).asynchronous:
        assert min(counts) >= 29  # neighbours of the first finisher may lack their last record
    for r in range(n):
        steps = np.sort(comp["step"][comp["rank"] == r])
        np.testing.assert_array_equal(steps, np.arange(counts[r]))


@pytest.mark.parametrize("n", [2, 4, 6])
def test_asgd_round_robin_staleness_matches_reference(n):
    w = workload("1.0", n_params=1000)  # compute >> service: round-robin service
    res = simulate(make_algorithm("asgd", n_workers=n, period=1), flat_platform(), w, steps=12)
    comp = compute_rows(res.trace)
    steady = comp[comp["step"] >= 1]["staleness"]
    assert set(steady.tolist()) == {n - 1}
    ref = run_reference(
        make_algorithm("asgd", n_workers=n, period=1),
        LeastSquaresProblem(n_samples=64 * n, dim=4, n_shards=n, batch=4),
        steps=12,
    )
    assert set(ref.staleness[1:].ravel().tolist()) == {n - 1}
    # first round: the server applies pushes in arrival (= rank) order, as the reference does
    first = comp[comp["step"] == 0]
    np.testing.assert_array_equal(first["staleness"][np.argsort(first["rank"])], ref.staleness[0])


def test_adpsgd_fixed_ring_staleness_is_one_like_reference():
    w = workload("1.0", n_params=1000)  # compute >> exchange
    for variant, expected in (("fixed", 1), ("delay", 2)):
        alg = make_algorithm("adpsgd", n_workers=8, variant=variant)
        comp = compute_rows(simulate(alg, flat_platform(), w, steps=10).trace)
        ref = run_reference(alg, LeastSquaresProblem(n_samples=256, dim=4, n_shards=8, batch=4), steps=10)
        delay = alg.gradient_delay
        assert set(comp[comp["step"] >= delay]["staleness"].tolist()) == {expected}
        assert set(ref.staleness[delay:].ravel().tolist()) == {expected}


def test_adpsgd_exchange_overlaps_compute_and_hadpsgd_phases():
    cfg = load_config(preset="interspeech2019-v100")
    res = simulate(make_algorithm("adpsgd", n_workers=8), cfg.platform, cfg.workload, steps=20)
    ov = res.trace[res.trace["phase"] == PHASES["overlap"]]
    assert ov.size == 20 * 4  # one per active worker and step
    assert set(ov["kind"].tolist()) == {2}
    assert set((ov["rank"] % 2).tolist()) == {1}  # odd ranks are active on the fixed ring
    res = simulate(make_algorithm("hadpsgd", n_workers=16, gpus_per_node=8), cfg.platform, cfg.workload, steps=20)
    kinds = {(int(p), int(k)) for p, k in zip(res.trace["phase"], res.trace["kind"])}
    assert (PHASES["comm"], 1) in kinds and (PHASES["overlap"], 2) in kinds
    ov = res.trace[res.trace["phase"] == PHASES["overlap"]]
    assert set(ov["nbytes"].tolist()) == {math.ceil(cfg.workload.payload_bytes / 8)}  # sharded


@pytest.mark.parametrize("schedule", ["ring", "direct"])
def test_sharded_hadpsgd_agrees_inside_the_node_each_step(schedule):
    """After the gradient allreduce each node that answers sharded requests agrees on its passive
    merges (the runtime's tiny allgather): one barrier record per rank and step, an allreduce of
    no bytes over the node (its latency rounds). On the fixed ring of two nodes node 0 is always
    the passive one; its steps are longer by exactly that."""
    m, alpha = 4, 2e-4
    p = flat_platform(nvlink=Link(latency_s=alpha, bandwidth_bytes_per_s=1e9), allreduce=schedule)
    w = workload(compute="0.1", n_params=250_000)
    res = simulate(
        make_algorithm("hadpsgd", n_workers=8, gpus_per_node=m), p, w, steps=10, gpus_per_node=8, until="all"
    )
    bar = res.trace[(res.trace["phase"] == PHASES["comm"]) & (res.trace["kind"] == ExchangeKind.BARRIER)]
    assert bar.size == 4 * 10 and set(bar["rank"].tolist()) == {0, 1, 2, 3} and np.all(bar["nbytes"] == 0)
    rounds = 2 * (m - 1) if schedule == "ring" else 2
    np.testing.assert_allclose(bar["end_s"] - bar["start_s"], rounds * alpha, rtol=1e-9)
    grad = (
        allreduce_s(m, w.payload_bytes, 1e9, alpha)
        if schedule == "ring"
        else (2 * (m - 1) / m * w.payload_bytes / 1e9 + 2 * alpha)
    )
    s = summarize(res.trace[res.trace["rank"] < 4], samples_per_step=32, warmup_steps=2)
    assert s["step_time_s"] == pytest.approx(0.1 + grad + rounds * alpha, rel=1e-9)
    unsharded = simulate(make_algorithm("adpsgd", n_workers=8), p, w, steps=10).trace
    assert not np.any(unsharded["kind"] == ExchangeKind.BARRIER)


@pytest.mark.parametrize("schedule", ["ring", "direct"])
def test_sharded_hadpsgd_under_continue_sums_its_slices_with_the_gradient(schedule):
    """Under continue (the runtime's survivors' protocol, ``core.failure.sums_node_slices``) the
    same nodes have no merge barrier and no allgather after an exchange: the gradient allreduce
    carries ``node_sum_elements`` -- twice the model and the step check -- and the passive node's
    step is the compute and that allreduce, in closed form."""
    m, alpha = 4, 2e-4
    p = flat_platform(nvlink=Link(latency_s=alpha, bandwidth_bytes_per_s=1e9), allreduce=schedule)
    w = workload(compute="0.1", n_params=250_000)
    h = make_algorithm("hadpsgd", n_workers=8, gpus_per_node=m)
    res = simulate(h, p, w, steps=10, gpus_per_node=8, until="all", on_failure="continue")
    assert not np.any(res.trace["kind"] == ExchangeKind.BARRIER)
    grad = res.trace[(res.trace["phase"] == PHASES["comm"]) & (res.trace["kind"] == ExchangeKind.ALLREDUCE)]
    elements = node_sum_elements(w.n_params)
    assert set(grad["nbytes"].tolist()) == {
        wire_bytes(AllReduce(group=(0, 1, 2, 3), payload="grad"), elements, w.itemsize)[0]
    }
    size = w.payload_bytes * 2 + STEP_CHECK_ELEMENTS * w.itemsize
    reduce = allreduce_s(m, size, 1e9, alpha) if schedule == "ring" else (2 * (m - 1) / m * size / 1e9 + 2 * alpha)
    s = summarize(res.trace[res.trace["rank"] < 4], samples_per_step=32, warmup_steps=2)
    assert s["step_time_s"] == pytest.approx(0.1 + reduce, rel=1e-9)
    # stop (the default without a failure) keeps the protocol of the test above
    stop = simulate(h, p, w, steps=10, gpus_per_node=8, until="all").trace
    assert np.any(stop["kind"] == ExchangeKind.BARRIER)


def _rank_steps(trace):
    """Median interval between a rank's consecutive compute starts, per rank."""
    comp = trace[trace["phase"] == PHASES["compute"]]
    return np.array([np.median(np.diff(np.sort(comp["start_s"][comp["rank"] == r]))) for r in np.unique(comp["rank"])])


@pytest.mark.parametrize(
    "name, kw, merging",
    [
        ("adpsgd", {}, [False, True, False, True]),  # fixed ring: odd ranks active, passive ones merge off the step
        ("dpsgd", {}, [True] * 4),  # gossip: every training thread folds the mix back
        ("hadpsgd", {"gpus_per_node": 2}, [True] * 8),  # sharded: a passive node's members apply the merges too
        ("ssgd", {}, [False] * 4),
    ],
)
def test_mix_merge_is_host_work_of_the_training_thread_that_folds_an_average_back(name, kw, merging):
    """``mix_merge_s + mix_merge_s_per_byte * S`` lengthens exactly the steps of the ranks whose
    training thread folds an average back (core.exchange.trainer_merges; no record: step
    overhead, as the runtime's) and leaves the staleness alone."""
    w = workload(compute="0.1", n_params=1000)  # exchanges of microseconds: no lock is ever contended
    merge = dict(mix_merge_s=1e-3, mix_merge_s_per_byte=1e-9)
    extra = 1e-3 + 1e-9 * w.payload_bytes
    n = len(merging)

    def run(**plat):
        res = simulate(
            make_algorithm(name, n_workers=n, **kw), flat_platform(**plat), w, steps=12, gpus_per_node=8
        )  # every worker on the one host
        return res.trace, summarize(res.trace, samples_per_step=32, warmup_steps=2)

    (t0, a0), (t1, a1) = run(), run(**merge)
    np.testing.assert_allclose(_rank_steps(t1) - _rank_steps(t0), np.where(merging, extra, 0.0), atol=1e-12)
    if name != "hadpsgd":  # there the active node's merges now land in the passive members' merge
        assert a1["staleness_mean"] == a0["staleness_mean"]  # (after their update: stale for no gradient)
    with pytest.raises(ConfigError, match=r"mix_merge_s \(-1\) must be >= 0"):
        flat_platform(mix_merge_s=-1)


def test_step_overhead_is_host_work_a_straggler_does_not_scale():
    """``step_overhead_s + step_overhead_s_per_byte * S`` follows every step's exchanges on every
    worker; a straggler's factor slows its compute only (as the runtime's emulated straggler):
    SSGD with rank 1 twice as slow steps at 2 x compute + allreduce + overhead."""
    w = workload(compute="0.1", n_params=250_000)
    over = dict(step_overhead_s=2e-3, step_overhead_s_per_byte=1e-9)
    extra = 2e-3 + 1e-9 * w.payload_bytes
    slow = StragglerModel.parse("1:2", n_workers=4)

    def step(name, **plat):
        n = 1 if name == "sgd" else 4
        res = simulate(
            make_algorithm(name, n_workers=n), flat_platform(**plat), w, steps=12, stragglers=slow if n > 1 else None
        )
        return res.trace, summarize(res.trace, samples_per_step=32, warmup_steps=2)["step_time_s"]

    t0, s0 = step("ssgd")
    t1, s1 = step("ssgd", **over)
    assert s0 == pytest.approx(0.2 + allreduce_s(4, w.payload_bytes, 1e9, 1e-5), rel=1e-9)
    assert s1 == pytest.approx(s0 + extra, rel=1e-9)
    comp = lambda t: np.sort(t["end_s"] - t["start_s"])[t["phase"] == PHASES["compute"]]
    np.testing.assert_allclose(comp(t1), comp(t0))  # the compute records leave the overhead out
    np.testing.assert_allclose(_rank_steps(step("sgd", **over)[0]) - _rank_steps(step("sgd")[0]), extra, rtol=1e-9)
    with pytest.raises(ConfigError, match=r"step_overhead_s_per_byte \(-1e-09\) must be >= 0"):
        flat_platform(step_overhead_s_per_byte=-1e-9)


def test_slow_network_makes_adpsgd_comm_bound_on_the_active_side_only():
    """Active workers (odd ranks of the fixed ring) wait for their 0.1 s average every step; the
    passive ones answer from their responders beside the compute and are not held back (the
    runtime's responder locks the model only to copy it and to add the average back)."""
    w = workload("0.01", n_params=25_000_000)  # 100 MB at 1 GB/s = 0.1 s >> 0.01 s compute
    res = simulate(make_algorithm("adpsgd", n_workers=4), flat_platform(), w, steps=20, until="all")
    np.testing.assert_allclose(_rank_steps(res.trace), [0.01, 0.1 + 1e-5, 0.01, 0.1 + 1e-5], rtol=1e-6)
    active = summarize(res.trace[res.trace["rank"] % 2 == 1], samples_per_step=32, warmup_steps=2)
    passive = summarize(res.trace[res.trace["rank"] % 2 == 0], samples_per_step=32, warmup_steps=2)
    assert active["comm_fraction"] > 0.85 and active["compute_fraction"] < 0.15
    assert passive["compute_fraction"] == pytest.approx(1.0) and passive["comm_fraction"] == 0.0


def test_streams_relabel_the_workers_compute_times():
    """``streams`` gives worker ``r`` the random streams of rank ``streams[r]`` (the rows of the
    draws permuted, exactly); a straggler term stays with the rank it names; anything but a
    permutation of the ranks is refused."""
    from psgdlab.sim.engine import compute_times

    w = workload(compute="lognormal:0.1:0.2")
    base = compute_times(w, 4, 20, seed=3)
    np.testing.assert_array_equal(compute_times(w, 4, 20, seed=3, streams=[3, 2, 1, 0]), base[::-1])
    slow = StragglerModel.parse("1:2", n_workers=4)
    relabelled = compute_times(w, 4, 20, seed=3, streams=[1, 0, 2, 3], stragglers=slow)
    np.testing.assert_array_equal(relabelled[1], 2 * base[0])
    np.testing.assert_array_equal(relabelled[0], base[1])
    with pytest.raises(ConfigError, match=r"streams \(\[0, 0, 1, 2\]\) must be a permutation of the 4 ranks"):
        simulate(make_algorithm("ssgd", n_workers=4), flat_platform(), w, steps=5, streams=[0, 0, 1, 2])


def test_pairwise_averages_between_hosts_share_the_nics_and_end_together():
    """Two hosts of two workers in lockstep (constant compute), AD-PSGD's fixed ring: on the steps
    where both active workers average with a peer on the other host, their two transfers start
    together on the same NICs and share them (processor sharing, as TCP flows through one rate
    limit do): both end two transfer times later. Queued on the NICs one after another, the
    first would end after one transfer time and the other after two."""
    nic = Link(latency_s=2e-4, bandwidth_bytes_per_s=1e8)
    p = flat_platform(hosts=2, devices_per_host=2, nic=nic, endpoints="process")
    w = workload("0.001", n_params=2_500_000)
    one = w.payload_bytes / 1e8  # one transfer alone: 0.1 s on the NICs
    res = simulate(make_algorithm("adpsgd", n_workers=4), p, w, steps=12, seed=0, until="all")
    rows = res.trace[(res.trace["kind"] == int(ExchangeKind.PAIRWISE)) & (res.trace["nbytes"] > 0)]
    host = res.placement.host
    crossing = [r for r in rows if host[r["rank"]] != host[r["peer"]]]
    by_start: dict[float, list[float]] = {}
    for r in crossing:
        by_start.setdefault(round(float(r["start_s"]), 9), []).append(float(r["end_s"] - r["start_s"]))
    together = [d for d in by_start.values() if len(d) == 2]
    assert together, "no two averages between hosts began together"
    for durations in together:
        assert durations == pytest.approx([2 * one + nic.latency_s] * 2, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    case=st.sampled_from([("adpsgd", {}), ("adpsgd", {"variant": "random"}), ("hadpsgd", {"gpus_per_node": 2})]),
    hosts=st.sampled_from([2, 4]),  # matchings pair an even count of nodes
    seed=st.integers(0, 2**16),
    staging=st.sampled_from(["direct", "host"]),
)
def test_transfers_between_hosts_never_beat_the_nics(case, hosts, seed, staging):
    """Whatever meets on the NICs: no pairwise average between hosts is faster than its bytes
    alone at the NIC's rate plus its latency, and in any window no host's NIC carries more bytes
    of the averages that began and ended inside it than its rate allows (fair shares conserve
    the capacity)."""
    name, params = case
    nic = Link(latency_s=1e-4, bandwidth_bytes_per_s=1e8)
    p = flat_platform(hosts=hosts, devices_per_host=2, nic=nic, endpoints="process", staging=staging)
    n = 2 * hosts
    res = simulate(
        make_algorithm(name, n_workers=n, **params),
        p,
        workload("lognormal:0.01:0.005", n_params=250_000),  # 10 ms of compute, 10 ms alone on the NICs
        steps=10,
        seed=seed,
    )
    host = res.placement.host
    t = average_rows(res.trace)
    t = t[[host[r] != host[q] for r, q in zip(t["rank"], t["peer"])]]
    assert len(t) > 0
    assert np.all(t["end_s"] - t["start_s"] >= t["nbytes"] / 1e8 + 1e-4 - 1e-12)
    for h in range(hosts):
        mine = t[[host[r] == h or host[q] == h for r, q in zip(t["rank"], t["peer"])]]
        for a in np.unique(mine["start_s"]):
            for b in np.unique(mine["end_s"][mine["end_s"] > a]):
                inside = mine[(mine["start_s"] >= a) & (mine["end_s"] <= b)]
                assert inside["nbytes"].sum() <= 1e8 * (b - a) * (1 + 1e-9)


def test_a_gossip_between_hosts_sends_each_model_once_each_way():
    """D-PSGD on two hosts of one worker: each sends its model to the other while receiving the
    other's, one transfer each way on full-duplex NICs, so a step's exchange takes one
    transfer time plus the latency (counting each side's send as both ways took two)."""
    nic = Link(latency_s=2e-4, bandwidth_bytes_per_s=1e8)
    p = flat_platform(hosts=2, devices_per_host=1, nic=nic, endpoints="process")
    w = workload("0.001", n_params=2_500_000)
    res = simulate(make_algorithm("dpsgd", n_workers=2, topology="complete"), p, w, steps=6, seed=0)
    comm = res.trace[res.trace["kind"] == int(ExchangeKind.GOSSIP)]
    assert len(comm) >= 10
    np.testing.assert_allclose(comm["end_s"] - comm["start_s"], w.payload_bytes / 1e8 + 2e-4, rtol=1e-9)


def _overlaps(x, y):
    return (x["start_s"] < y["end_s"] - 1e-12) & (y["start_s"] < x["end_s"] - 1e-12)


@settings(max_examples=20, deadline=None)
@given(
    hosts=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
    straggler=st.sampled_from(["", "1:2", "0:3"]),
)
def test_a_process_carries_one_active_and_one_passive_average_at_a_time(hosts, seed, straggler):
    """On the random ring a process is asked for an average while its own is in flight: its
    communication thread carries its active averages one at a time, its responder the passive
    ones, so no two averages of one side of a process overlap in time (the two sides do:
    :func:`test_averages_that_share_a_process_share_it_fairly`)."""
    n = 8
    nic = Link(latency_s=1e-4, bandwidth_bytes_per_s=2e8)
    p = flat_platform(hosts=hosts, devices_per_host=n // hosts, nic=nic, endpoints="process")
    res = simulate(
        make_algorithm("adpsgd", n_workers=n, variant="random", seed=seed),
        p,
        workload("lognormal:0.01:0.005", n_params=1_000_000),  # 4 MB: 4-20 ms an average, as long as the compute
        steps=15,
        seed=seed,
        stragglers=StragglerModel.parse(straggler, n_workers=n) if straggler else None,
    )
    t = average_rows(res.trace)
    assert len(t) > 0
    for r in range(n):
        for side in (t[t["rank"] == r], t[t["peer"] == r]):
            side = side[np.argsort(side["start_s"], kind="stable")]
            assert np.all(side["start_s"][1:] >= side["end_s"][:-1] - 1e-12), f"rank {r} carries two at once"


def test_averages_that_share_a_process_share_it_fairly():
    """Inside one host without a CPU model an average alone on its processes takes its law
    exactly; one that shares a process with another for any time takes longer (each goes at
    its busier process's fair share)."""
    n = 8
    p = flat_platform(hosts=1, devices_per_host=n, endpoints="process")
    shared = 0
    for seed, straggler in ((0, ""), (1, ""), (2, "1:2"), (3, "1:2")):
        res = simulate(
            make_algorithm("adpsgd", n_workers=n, variant="random", seed=seed),
            p,
            workload("lognormal:0.01:0.005", n_params=3_000_000),  # 12 ms an average alone
            steps=15,
            seed=seed,
            stragglers=StragglerModel.parse(straggler, n_workers=n) if straggler else None,
            until="all",  # every average recorded: none that one overlaps is left out
        )
        t = average_rows(res.trace)
        law = float(np.min(t["end_s"] - t["start_s"]))
        for i, a in enumerate(t):
            procs = (a["rank"], a["peer"])
            mine = np.isin(t["rank"], procs) | np.isin(t["peer"], procs)
            mine[i] = False
            dur = a["end_s"] - a["start_s"]
            if _overlaps(a, t[mine]).any():
                shared += 1
                assert dur > law * (1 + 1e-9)
            else:
                assert dur == pytest.approx(law, rel=1e-9)
    assert shared > 0  # not vacuous: some process is active and passive at once


def test_fixed_ring_processes_keep_one_side_and_do_not_share():
    """On the fixed ring no process is active and passive: each average is alone on its
    processes and takes its law, as under a FIFO queue per process."""
    n = 8
    p = flat_platform(hosts=1, devices_per_host=n, endpoints="process")
    res = simulate(make_algorithm("adpsgd", n_workers=n), p, workload("0.01", n_params=1_000_000), steps=10, seed=1)
    d = average_rows(res.trace)
    d = d["end_s"] - d["start_s"]
    assert len(d) > 0
    np.testing.assert_allclose(d, d.min(), rtol=1e-9)


def test_scatter_draws_each_allreduce_inside_a_host_from_the_collectives_quantiles():
    """With ``platform.collective``'s ``scatter`` each allreduce inside a host takes its law
    times a draw between the first and last quantile, seeded; an allreduce across hosts (whose
    law is not the collective's) and one without a scatter take their law. The spans are the
    allreduces': last member in to the end."""
    q = (0.5, 1.0, 1.2, 3.0)

    def spans(hosts, scatter, seed):
        coll = Link(latency_s=1e-4, bandwidth_bytes_per_s=1e9, scatter=scatter)
        p = flat_platform(hosts=hosts, devices_per_host=4 // hosts, endpoints="process", collective=coll)
        res = simulate(make_algorithm("ssgd", n_workers=4), p, workload("0.01", n_params=250_000), steps=60, seed=seed)
        t = res.trace[(res.trace["kind"] == ExchangeKind.ALLREDUCE) & (res.trace["phase"] == PHASES["comm"])]
        ends = {}
        for row in t:
            start = ends.get(int(row["step"]), (0.0, 0.0))[0]
            ends[int(row["step"])] = (max(start, float(row["start_s"])), float(row["end_s"]))
        return np.array([e - a for a, e in ends.values()])

    law = spans(1, (), 0)
    np.testing.assert_allclose(law, law[0], rtol=1e-9)
    a = spans(1, q, 0)
    np.testing.assert_array_equal(a, spans(1, q, 0))
    assert not np.array_equal(a, spans(1, q, 1))
    assert law[0] * q[0] * (1 - 1e-9) <= a.min() and a.max() <= law[0] * q[-1] * (1 + 1e-9)
    assert law[0] * q[1] <= np.median(a) <= law[0] * q[2]
    np.testing.assert_array_equal(spans(2, q, 0), spans(2, (), 0))


@pytest.mark.parametrize("hosts", [1, 2])
def test_scatter_draws_each_average_from_its_links_quantiles(hosts):
    """With a link's ``scatter`` each average's duration is its law times a draw between the
    first and last quantile (between hosts only the part past its bytes' time), seeded: the
    same seed gives the same durations, another seed others; without it every average takes
    its law."""
    n = 4
    q = (0.8, 1.0, 1.1, 2.0)
    nic = Link(latency_s=1e-4, bandwidth_bytes_per_s=2e8)

    def durations(scatter, seed):
        inside = Link(latency_s=1e-5, bandwidth_bytes_per_s=1e9, scatter=scatter if hosts == 1 else ())
        p = flat_platform(
            hosts=hosts,
            devices_per_host=n // hosts,
            endpoints="process",
            nvlink=inside,
            nic=dataclasses.replace(nic, scatter=scatter if hosts == 2 else ()),
        )
        w = workload("1.0", n_params=250_000)
        res = simulate(make_algorithm("adpsgd", n_workers=n), p, w, steps=40, seed=seed)
        t = average_rows(res.trace)
        host = res.placement.host
        t = t[[(host[a] != host[b]) == (hosts == 2) for a, b in zip(t["rank"], t["peer"])]]
        return np.sort(t["end_s"] - t["start_s"])

    law = durations((), 0)
    np.testing.assert_allclose(law, law[0], rtol=1e-9)
    a = durations(q, 0)
    np.testing.assert_array_equal(a, durations(q, 0))
    assert not np.array_equal(a, durations(q, 1))
    lo = law[0] * q[0] if hosts == 1 else 2e6 / 2e8  # between hosts the bytes' time stays
    assert a.min() >= lo * (1 - 1e-9)
    assert a.max() <= law[0] * q[-1] * (1 + 1e-9)
    assert law[0] * q[1] <= np.median(a) <= law[0] * q[2]  # the draws' median is between 1.0 and 1.1
