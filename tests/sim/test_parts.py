"""The simulator's parts exist, and work, only where a platform or a run uses them.

Properties of what a simulation asks of its parts (counted by wrapping them), not timings: no
scatter draw without a link's scatter, no host-core accounting without ``host_cpu``, no flow on
shared links where nothing crosses hosts and no process carries two averages, no failure
bookkeeping without failures, the schedule asked once per step of its period, and a fixed ring
inside one host at one event per learner-step.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.algorithms import ADPSGD, make_algorithm
from psgdlab.core.platform.failure import Failure
from psgdlab.sim import network
from psgdlab.sim.engine import FailureSpec, deaths, kernel, simulate
from psgdlab.sim.platform import HostCPU, Link, Platform
from psgdlab.sim.workload import Workload, load_config, preset_names

WORK = Workload(n_params=500_000, compute="lognormal:0.05:0.1", batch_per_worker=32, reference_batch=32)


@contextmanager
def counted(*targets: tuple[object, str]) -> Iterator[Counter[str]]:
    """Count the calls of each ``(owner, method name)`` while the block runs."""
    calls: Counter[str] = Counter()
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets]

    def wrap(name: str, fn):
        def counting(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return counting

    for owner, name, fn in saved:
        setattr(owner, name, wrap(name, fn))
    try:
        yield calls
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def one_host(**kw: object) -> Platform:
    return Platform(hosts=1, devices_per_host=8, nvlink=Link(latency_s=1e-5, bandwidth_bytes_per_s=1e9), **kw)


ALGORITHMS = [
    ("ssgd", {}),
    ("adpsgd", {}),
    ("adpsgd", {"variant": "random"}),
    ("hadpsgd", {"gpus_per_node": 4}),
    ("dpsgd", {}),
    ("bmuf", {"period": 3}),
    ("asgd", {"period": 1}),
]


@settings(max_examples=12, deadline=None)
@given(preset=st.sampled_from(preset_names()), which=st.sampled_from(ALGORITHMS), seed=st.integers(0, 3))
def test_a_preset_draws_no_scatter_and_counts_no_host_cores(preset, which, seed):
    """The presets have no link scatter and no ``host_cpu``: no simulation on them makes a
    Scatter or asks the network for host-core work."""
    cfg = load_config(preset=preset)
    name, kw = which
    p = cfg.platform
    n = min(16, p.hosts * p.devices_per_host)
    with counted((kernel.Scatter, "__init__"), (network.Network, "_cpu_wait")) as calls:
        alg = make_algorithm(name, n_workers=n, **kw)
        simulate(alg, p, cfg.workload, steps=6, seed=seed, gpus_per_node=min(n, p.devices_per_host))
    assert calls == Counter()


def test_scatter_and_host_cores_are_used_where_the_platform_has_them():
    """The converse, so the counts above can fail: a link's scatter is drawn, host cores are counted."""
    q = (0.9, 1.0, 1.2)
    p = one_host(host_cpu=HostCPU(cores_per_host=2, work_per_message_s=1e-4))
    p = dataclasses.replace(p, nvlink=dataclasses.replace(p.nvlink, scatter=q))
    with counted((kernel.Scatter, "draw"), (network.Network, "_cpu_wait")) as calls:
        simulate(make_algorithm("adpsgd", n_workers=8), p, WORK, steps=6)
    assert calls["draw"] == 6 * 4 and calls["_cpu_wait"] > 0


@pytest.mark.parametrize("name, kw, flows", [("adpsgd", {}, 0), ("hadpsgd", {"gpus_per_node": 4}, 0)])
def test_averages_inside_a_host_on_one_side_each_make_no_flows(name, kw, flows):
    """Inside one host, where no process is active and passive at once, every average has a
    service time known when it is asked for: no flow on shared links, no chain of its own."""
    with counted((network.FairLinks, "add"), (kernel.Flows, "join_then")) as calls:
        simulate(make_algorithm(name, n_workers=8, **kw), one_host(), WORK, steps=10, gpus_per_node=8)
    assert calls["add"] == calls["join_then"] == flows


def test_flows_are_made_where_bytes_cross_hosts_or_a_process_carries_two_averages():
    """The converse: between hosts an average's bytes join the NICs' flows; on the random ring
    inside one host an average's work joins the processes' shares."""
    two_hosts = dataclasses.replace(one_host(), hosts=2, devices_per_host=4)
    with counted((kernel.Flows, "join_then")) as calls:
        simulate(make_algorithm("adpsgd", n_workers=8), two_hosts, WORK, steps=10)
    assert calls["join_then"] > 0
    with counted((kernel.Flows, "join_then")) as calls:
        simulate(make_algorithm("adpsgd", n_workers=8, variant="random"), one_host(), WORK, steps=10)
    assert calls["join_then"] == 10 * 4  # every average of every step


def test_a_run_without_failures_books_none():
    """No Deaths without a FailureSpec; with one that kills nobody, the parts ask it nothing."""
    alg = make_algorithm("adpsgd", n_workers=8)
    with counted((deaths.Deaths, "__init__")) as calls:
        simulate(alg, one_host(), WORK, steps=10)
    assert calls["__init__"] == 0
    asked = [(deaths.Deaths, m) for m in ("schedule", "pair_outcome", "share", "cover", "alive")]
    with counted(*asked) as calls:
        res = simulate(alg, one_host(), WORK, steps=10, failures=FailureSpec())
    assert calls == Counter() and res.extras["failures"]["survivors"] == list(range(8))
    with counted(*asked) as calls:
        simulate(alg, one_host(), WORK, steps=10, failures=FailureSpec(failures=(Failure(3, 0.2),)))
    assert calls["schedule"] > 0 and calls["pair_outcome"] > 0  # not vacuous


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Counting(ADPSGD):
    """AD-PSGD that counts who asks for its exchanges."""

    asked: Counter[tuple[int, int]] = dataclasses.field(default_factory=Counter, compare=False, hash=False)

    def exchanges(self, step, rank):
        self.asked[(step, rank)] += 1
        return ADPSGD.exchanges(self, step, rank)


@pytest.mark.parametrize("variant, period", [("fixed", 2), ("random", None)])
def test_a_worker_asks_its_schedule_once_per_step_of_its_period(variant, period):
    """A schedule that repeats every P steps is asked for its first P steps only (the scans that
    decide the processes' lanes and H-ADPSGD's agreement stop there too); one that does not
    repeat, for every step."""
    n, steps = 8, 30
    alg = _Counting(n_workers=n, variant=variant)
    assert alg.schedule_period == period
    simulate(alg, one_host(), WORK, steps=steps)
    asked = {s for s, _r in alg.asked}
    if period is None:
        assert asked == set(range(steps))
    else:
        assert asked == set(range(period))


def test_a_fixed_ring_inside_one_host_takes_one_event_per_learner_step():
    """Each step's compute is the worker's one event; its averages are analytical queues. The
    rest is the start of each worker and the end of the window."""
    n, steps = 8, 40
    res = simulate(make_algorithm("adpsgd", n_workers=n), one_host(), WORK, steps=steps, record=False)
    assert n * steps <= res.events <= n * steps + n + 4
