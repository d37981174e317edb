"""The step time that :func:`psgdlab.core.trace.summarize` reports, on traces built by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.trace import TraceBuilder, summarize


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


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 4),
    fast=st.floats(0.02, 0.2),
    ratio=st.floats(1.3, 3.0),
    jitter=st.floats(0.0, 0.1),
    steps=st.integers(12, 40),
    stretch=st.floats(1.0, 5.0),
    seed=st.integers(0, 2**16),
)
def test_two_equal_groups_step_at_the_middle_of_their_speeds(k, fast, ratio, jitter, steps, stretch, seed):
    """k workers at ``fast``, k at ``fast * ratio`` (H-ADPSGD's two nodes, one with a straggler),
    every step jittered by up to ``jitter`` and fewer than a quarter of each worker's steps
    stretched by ``stretch`` (another process on the machine): the step time is the middle of
    the two speeds within the jitter, whatever the stretched steps, where the median of every
    step pooled is set by the fast group's stretched steps against the slow group's."""
    rng = np.random.default_rng(seed)
    periods = []
    for p in [fast] * k + [fast * ratio] * k:
        row = p * (1.0 + jitter * rng.uniform(-1.0, 1.0, steps))
        row[rng.choice(steps, size=(steps - 1) // 4, replace=False)] *= stretch
        periods.append(row.tolist())
    middle = (fast + fast * ratio) / 2
    s = summarize(trace_of(periods), samples_per_step=8)
    assert middle * (1 - jitter) - 1e-12 <= s["step_time_s"] <= middle * (1 + jitter) + 1e-12


def test_the_pooled_median_would_sit_at_the_boundary_of_the_groups():
    """The case the two-step median is for: 2 fast workers whose every fourth step is long, 2
    slow ones; the steps pooled have their median among the slow group's steps."""
    fast = [0.05, 0.05, 0.05, 0.2] * 10
    slow = [0.1] * 40
    trace = trace_of([fast, fast, slow, slow])
    assert summarize(trace, samples_per_step=8)["step_time_s"] == pytest.approx(0.075)
    assert np.median(np.concatenate([fast[1:], fast[1:], slow[1:], slow[1:]])) == pytest.approx(0.1)
