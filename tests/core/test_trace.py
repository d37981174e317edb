"""The step times that :func:`psgdlab.core.records.trace.summarize` reports, and where
:func:`~psgdlab.core.records.trace.step_path` finds that they go, on traces built by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.records.trace import STEP_PATH_KEYS, TraceBuilder, step_path, summarize


def trace_of(periods: list[list[float]]) -> np.ndarray:
    """A trace whose worker ``r`` spends ``periods[r][s]`` on step ``s`` (compute only)."""
    tb = TraceBuilder()
    for r, steps in enumerate(periods):
        t = 0.0
        for s, p in enumerate(steps):
            tb.add(rank=r, step=s, phase="compute", start_s=t, end_s=t + p, loss=1.0)
            t += p
    return tb.array()


@given(period=st.floats(0.01, 1.0), workers=st.integers(1, 6), steps=st.integers(3, 30))
def test_workers_alike_step_at_their_period(period, workers, steps):
    s = summarize(trace_of([[period] * steps] * workers), samples_per_step=8)
    assert s["step_time_s"] == pytest.approx(period, rel=1e-9)
    assert s["step_time_median_s"] == pytest.approx(period, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    periods=st.lists(st.lists(st.floats(0.01, 1.0), min_size=3, max_size=20), min_size=1, max_size=6),
    batch=st.integers(1, 64),
    warmup=st.integers(0, 2),
)
def test_the_step_time_is_the_one_the_throughput_implies(periods, batch, warmup):
    s = summarize(trace_of(periods), samples_per_step=batch, warmup_steps=warmup)
    assert s["step_time_s"] * s["samples_per_s"] == pytest.approx(len(periods) * batch, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 4), fast=st.floats(0.02, 0.2), ratio=st.floats(1.3, 3.0), steps=st.integers(4, 40))
def test_two_groups_step_at_the_harmonic_mean_of_their_speeds(k, fast, ratio, steps):
    """k workers at ``fast``, k at ``fast * ratio`` (H-ADPSGD's two nodes, one with a straggler):
    2k steps take as long as k of each, 2 / (1/a + 1/b) apiece."""
    slow = fast * ratio
    s = summarize(trace_of([[fast] * steps] * k + [[slow] * steps] * k), samples_per_step=8)
    assert s["step_time_s"] == pytest.approx(2 / (1 / fast + 1 / slow), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(period=st.floats(0.01, 0.2), every=st.integers(3, 8), factor=st.floats(1.5, 5.0), rounds=st.integers(2, 6))
def test_a_minority_of_long_steps_counts_in_the_step_time_not_in_the_median(period, every, factor, rounds):
    """Every ``every``-th step ``factor`` times longer (a periodic average, a cross-host peer):
    a time to train pays for them, so the step time is their mean; the median is the short step."""
    one = [period] * (every - 1) + [period * factor]
    steps = one * rounds + [period]  # the last start closes the last long step
    s = summarize(trace_of([steps, steps]), samples_per_step=8)
    assert s["step_time_s"] == pytest.approx(period * (every - 1 + factor) / every, rel=1e-9)
    assert s["step_time_median_s"] == pytest.approx(period, rel=1e-9)


def test_the_pooled_median_of_two_groups_is_the_boundary_between_them():
    """What the throughput step replaced: 2 fast workers whose every fourth step is long, 2 slow
    ones; the median of every step pooled lands among the slow group's steps, though half the
    workers run at twice their speed most of the time."""
    fast = [0.05, 0.05, 0.05, 0.2] * 10
    slow = [0.1] * 40
    s = summarize(trace_of([fast, fast, slow, slow]), samples_per_step=8)
    assert s["step_time_median_s"] == pytest.approx(0.1)
    fast_mean = np.mean(fast[:-1])  # 40 starts bound 39 steps
    assert s["step_time_s"] == pytest.approx(2 / (1 / fast_mean + 1 / 0.1), rel=1e-9)


def lockstep_trace(computes: list[list[float]], after: float) -> np.ndarray:
    """Workers that compute ``computes[r][s]`` and then wait for each other: every worker starts
    step ``s + 1`` ``after`` seconds past the last compute end of step ``s``."""
    tb = TraceBuilder()
    t = 0.0
    for s in range(len(computes[0])):
        ends = [t + c[s] for c in computes]
        for r, end in enumerate(ends):
            tb.add(rank=r, step=s, phase="compute", start_s=t, end_s=end)
        t = max(ends) + after
    return tb.array()


@settings(max_examples=60, deadline=None)
@given(
    computes=st.integers(2, 6).flatmap(
        lambda n: st.lists(st.lists(st.floats(0.01, 0.1), min_size=n, max_size=n), min_size=2, max_size=5)
    ),
    after=st.floats(0.0, 0.05),
)
def test_a_lockstepped_step_restarts_together_after_its_critical_path(computes, after):
    """Every worker restarts ``after`` past the last compute end: that is the path after the
    compute, the restarts coincide, and the compute ends spread as the compute times do."""
    by_worker = [list(c) for c in zip(*computes, strict=True)]
    path = step_path(lockstep_trace(by_worker, after))
    assert path["after_compute_s"] == pytest.approx(after, abs=1e-9)
    assert path["restart_spread_s"] == pytest.approx(0.0, abs=1e-9)
    spreads = [max(step) - min(step) for step in computes[:-1]]  # the last step has no next start
    assert path["compute_end_spread_s"] == pytest.approx(np.mean(spreads), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    periods=st.lists(st.lists(st.floats(0.01, 1.0), min_size=4, max_size=20), min_size=1, max_size=6),
    warmup=st.integers(0, 2),
)
def test_the_step_time_lies_between_the_fastest_and_slowest_workers_steps(periods, warmup):
    """The throughput step is a harmonic mean of the workers' own steps (each worker has two
    starts past the warm-up, so each has a rate)."""
    trace = trace_of(periods)
    path = step_path(trace, warmup_steps=warmup)
    step = summarize(trace, samples_per_step=1, warmup_steps=warmup)["step_time_s"]
    assert path["worker_step_min_s"] <= step * (1 + 1e-9)
    assert step <= path["worker_step_max_s"] * (1 + 1e-9)


def test_a_worker_that_restarts_late_is_the_restart_spread():
    """Two workers end their compute together; one leaves the exchange 5 ms after the other."""
    tb = TraceBuilder()
    for s in range(4):
        for r in range(2):
            start = s * 0.1 + (0.005 if r == 1 and s > 0 else 0.0)
            tb.add(rank=r, step=s, phase="compute", start_s=start, end_s=s * 0.1 + 0.05)
    path = step_path(tb.array())
    assert path["compute_end_spread_s"] == pytest.approx(0.0)
    assert path["restart_spread_s"] == pytest.approx(0.005)
    assert path["after_compute_s"] == pytest.approx(0.055)


def test_no_step_that_every_worker_finished_gives_no_path():
    tb = TraceBuilder()
    tb.add(rank=0, step=0, phase="compute", start_s=0.0, end_s=1.0)
    tb.add(rank=1, step=1, phase="compute", start_s=0.0, end_s=1.0)
    path = step_path(tb.array())
    assert set(path) == set(STEP_PATH_KEYS)
    assert path["after_compute_s"] is None and path["worker_step_max_s"] is None
