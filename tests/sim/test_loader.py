"""The host-side data loader of the workload model (sim.workload.loader_pauses) and its effect
on synchronous and asynchronous algorithms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.algorithms import make_algorithm
from psgdlab.core.errors import ConfigError
from psgdlab.core.records.trace import summarize
from psgdlab.sim.engine import compute_times, simulate
from psgdlab.sim.platform import Link, Platform
from psgdlab.sim.workload import Workload, load_config, loader_pauses


def _loader(batch, buffer, cost, cv=0.0):
    return Workload(
        batch_per_worker=batch,
        reference_batch=batch,
        compute="0.1",
        loader_buffer_samples=buffer,
        loader_s_per_sample=cost,
        loader_buffer_cv=cv,
    )


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 600), buffer=st.integers(1, 5000), steps=st.integers(1, 300), seed=st.integers(0, 2**31))
def test_fixed_buffers_refill_every_buffer_of_samples(batch, buffer, steps, seed):
    """With equal buffers, a window of steps*b samples crosses floor or ceil(steps*b/F) buffer
    ends, and each refill blocks for cost * F."""
    cost = 1e-3
    p = loader_pauses(_loader(batch, float(buffer), cost), steps, np.random.default_rng(seed))
    assert p.shape == (steps,)
    refills = p.sum() / (cost * buffer)
    assert refills == pytest.approx(round(refills), abs=1e-6)
    assert int(np.floor(steps * batch / buffer)) <= round(refills) <= int(np.ceil(steps * batch / buffer))
    # at most ceil(b/F) + 1 refills fall into one step
    assert p.max() <= cost * buffer * (-(-batch // buffer) + 1) + 1e-12


@pytest.mark.parametrize("cv", [0.0, 0.3, 1.0])
def test_mean_block_per_step_is_cost_times_batch(cv):
    w = _loader(256, 20000.0, 6e-6, cv)
    p = loader_pauses(w, 40_000, np.random.default_rng(1))
    assert p.mean() == pytest.approx(256 * 6e-6, rel=0.03)
    assert np.count_nonzero(p) == pytest.approx(40_000 * 256 / 20000, rel=0.05)


def test_streaming_loader_changes_nothing():
    cfg = load_config(preset="interspeech2019-v100")
    assert cfg.workload.loader_buffer_samples == 0
    assert not loader_pauses(cfg.workload, 50, np.random.default_rng(0)).any()
    from dataclasses import replace

    with_cost = replace(cfg.workload, loader_s_per_sample=1e-3)  # a cost but no buffer: still streaming
    np.testing.assert_array_equal(compute_times(cfg.workload, 4, 30, seed=2), compute_times(with_cost, 4, 30, seed=2))


@pytest.mark.parametrize(
    "key,value",
    [
        ("loader_buffer_samples", -1.0),
        ("loader_buffer_samples", 0.5),
        ("loader_s_per_sample", -1e-6),
        ("loader_buffer_cv", -0.1),
        ("loader_s_per_sample", float("nan")),
    ],
)
def test_bad_loader_values_are_one_line_errors(key, value):
    with pytest.raises(ConfigError, match=key):
        Workload(**{key: value})


def test_synchronous_blocks_wait_for_the_refilling_worker_asynchronous_ones_do_not():
    """Refills cost a single worker cost*b per step on average; an allreduce every step waits for
    whichever of 8 workers refills (about 8x as often), AD-PSGD workers only for their own."""
    platform = Platform(hosts=1, devices_per_host=8, nvlink=Link(latency_s=0.0, bandwidth_bytes_per_s=1e12))
    w = Workload(
        n_params=1000,
        compute="0.1",
        batch_per_worker=100,
        reference_batch=100,
        loader_buffer_samples=2000.0,
        loader_s_per_sample=1e-3,
        loader_buffer_cv=0.3,
    )

    def step_s(name, n):
        alg = make_algorithm(name, n_workers=n) if n > 1 else make_algorithm("sgd")
        res = simulate(alg, platform, w, steps=400, seed=0)
        return n * 100 / summarize(res.trace, samples_per_step=100, warmup_steps=20)["samples_per_s"]

    single = step_s("sgd", 1)
    assert single == pytest.approx(0.1 + 0.1, rel=0.1)  # a 2 s refill every 20 steps
    assert step_s("adpsgd", 8) == pytest.approx(single, rel=0.1)
    # ~8 of every 20 steps wait 2 s: well above one worker's cost, below 8 times it
    assert 0.1 + 0.5 < step_s("ssgd", 8) < 0.1 + 8 * 0.1
