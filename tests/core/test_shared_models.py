"""Stragglers, compute-time distributions, learning-rate recipes, trace schema, strict config."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.config import apply_overrides, load_dataclass, load_toml
from psgdlab.core.errors import ConfigError
from psgdlab.core.exchange import ExchangeKind
from psgdlab.core.platform.stragglers import StragglerModel, unit_hash
from psgdlab.core.platform.timing import ComputeTime
from psgdlab.core.records.trace import (
    PHASES,
    TRACE_DTYPE,
    TraceBuilder,
    kind_name,
    read_trace,
    summarize,
    to_chrome_trace,
    write_trace,
)
from psgdlab.core.schedules import Newbob, ibm_lr, lr_schedule


# ----- stragglers ---------------------------------------------------------------------------------
def test_straggler_spec_round_trip():
    spec = "3:2.5,random:0.1:3,periodic:*:100:2"
    assert StragglerModel.parse(spec).spec() == spec


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("x", r"straggler term 'x' is not RANK:FACTOR"),
        ("1:0", r"straggler factor \(0.0\) of rank 1 must be > 0"),
        ("9:2", r"straggler rank \(9\) must be in \[0, 4\)"),
        ("random:1.5:2", r"probability \(1.5\) must be in \[0, 1\]"),
        ("periodic:0:0:1", r"every \(0\) must be >= 1"),
    ],
)
def test_bad_straggler_specs(spec, match):
    with pytest.raises(ConfigError, match=match):
        StragglerModel.parse(spec, n_workers=4)


def test_random_slowdown_hits_its_probability_and_is_deterministic():
    model = StragglerModel.parse("random:0.2:4", seed=3)
    hits = np.mean([model.factor(r, s) > 1 for r in range(8) for s in range(2000)])
    assert abs(hits - 0.2) < 0.02
    assert [model.factor(1, s) for s in range(50)] == [
        StragglerModel.parse("random:0.2:4", seed=3).factor(1, s) for s in range(50)
    ]


def test_periodic_pause():
    model = StragglerModel.parse("periodic:1:10:0.5")
    assert model.compute_time(0.1, rank=1, step=9) == pytest.approx(0.6)
    assert model.compute_time(0.1, rank=1, step=8) == pytest.approx(0.1)
    assert model.compute_time(0.1, rank=0, step=9) == pytest.approx(0.1)


@given(st.integers(0, 2**31), st.integers(0, 1024), st.integers(0, 10**9))
def test_unit_hash_is_in_unit_interval(seed, rank, step):
    assert 0.0 <= unit_hash(seed, rank, step) < 1.0


# ----- compute time ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["0.05", "normal:0.05:0.005", "lognormal:0.05:0.2", "gamma:0.05:0.3"])
def test_compute_time_means(spec):
    d = ComputeTime.parse(spec)
    x = d.sample(np.random.default_rng(0), 40_000)
    assert abs(x.mean() - d.mean_s) < 0.01 * d.mean_s
    assert (x >= 0).all()
    assert ComputeTime.parse(d.spec()) == d


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("fast", "is not SECONDS"),
        ("-1", r"mean \(-1.0\) must be a finite number > 0"),
        ("weibull:1:2", r"kind \('weibull'\) must be one of"),
        ("normal:1:-2", r"spread \(-2.0\) must be >= 0"),
    ],
)
def test_bad_compute_time(spec, match):
    with pytest.raises(ConfigError, match=match):
        ComputeTime.parse(spec)


# ----- learning-rate recipes (§E.14) ----------------------------------------------------------------
@given(st.sampled_from([256, 1024, 2560, 4096, 8192, 12288]))
def test_ibm_schedule_peak_and_anneal(batch):
    peak = 0.1 * batch / 256
    assert ibm_lr(10, total_batch=batch) == pytest.approx(peak)
    for e in range(11, 17):
        assert ibm_lr(e, total_batch=batch) / ibm_lr(e - 1, total_batch=batch) == pytest.approx(1 / math.sqrt(2))


def test_ibm_schedule_for_2560_is_the_papers_example():
    assert [round(ibm_lr(e, total_batch=2560), 10) for e in range(1, 11)] == [round(0.1 * k, 10) for k in range(1, 11)]
    assert [round(ibm_lr(e, total_batch=8192), 3) for e in (11, 16)] == [2.263, 0.4]
    assert ibm_lr(1, total_batch=8192, variant="B") == pytest.approx(0.32)


def test_lr_schedule_by_step():
    f = lr_schedule("ibm", lr=0.1, total_batch=2560, steps_per_epoch=10)
    assert f(0) == pytest.approx(0.1) and f(95) == pytest.approx(1.0) and f(105) == pytest.approx(1 / math.sqrt(2))
    unknown = r"^lr-schedule \('cosine'\) is not known \(known: const, ibm, newbob, exp\)$"
    with pytest.raises(ConfigError, match=unknown):
        lr_schedule("cosine", lr=0.1, total_batch=1, steps_per_epoch=1)


def test_exp_schedule_decays_geometrically_to_the_final_rate():
    f = lr_schedule("exp", lr=0.2, total_batch=32, steps_per_epoch=10, total_steps=101)
    assert f(0) == pytest.approx(0.2) and f(100) == pytest.approx(0.02) and f(500) == pytest.approx(0.02)
    ratios = [f(k + 1) / f(k) for k in range(100)]
    np.testing.assert_allclose(ratios, 0.1 ** (1 / 100), rtol=1e-12)  # constant ratio per step
    assert lr_schedule("exp", lr=0.2, total_batch=1, steps_per_epoch=1, total_steps=1, lr_final=0.05)(0) == 0.2
    with pytest.raises(ConfigError, match=r"lr-final \(0.5\) must be in \(0, lr = 0.2\]"):
        lr_schedule("exp", lr=0.2, total_batch=1, steps_per_epoch=1, total_steps=5, lr_final=0.5)
    with pytest.raises(ConfigError, match="must be given"):
        lr_schedule("exp", lr=0.2, total_batch=1, steps_per_epoch=1)


def test_newbob_halves_after_small_improvement_and_stops():
    nb = Newbob(lr=1.0)
    assert nb.update(1.0) and nb.update(0.9) and nb.lr == 1.0
    nb.update(0.895)
    assert nb.halving and nb.lr == 0.5
    assert not nb.update(0.95)  # worse: rejected
    assert nb.stopped


# ----- trace -------------------------------------------------------------------------------------------
def _toy_trace():
    tb = TraceBuilder()
    for r in range(2):
        for s in range(10):
            tb.add(rank=r, step=s, phase="compute", start_s=s * 1.0, end_s=s + 0.75, staleness=s % 2, loss=10 - s)
            tb.add(
                rank=r, step=s, phase="comm", start_s=s + 0.75, end_s=s + 1.0, kind=ExchangeKind.ALLREDUCE, nbytes=100
            )
    return tb.array()


def test_summary_of_a_known_trace():
    s = summarize(_toy_trace(), samples_per_step=8)
    assert s["step_time_s"] == pytest.approx(1.0)
    assert s["compute_fraction"] == pytest.approx(0.75) and s["comm_fraction"] == pytest.approx(0.25)
    assert s["idle_fraction"] == pytest.approx(0.0, abs=1e-12)
    assert s["samples_per_s"] == pytest.approx(20 * 8 / 10.0)
    assert s["staleness_mean"] == pytest.approx(0.5) and s["staleness_hist"] == {"0": 10, "1": 10}
    assert s["loss_first"] == 10 and s["loss_last"] == 1


@given(
    st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(0.0, 5.0)), min_size=1, max_size=6),
    st.integers(3, 30),
    st.integers(0, 2),
    st.integers(1, 16),
)
def test_throughput_is_the_sum_of_the_workers_rates_whatever_their_start_offsets(workers, steps, warmup, batch):
    """Workers of constant step times ``T_r`` that start at offsets ``o_r``: samples/s is exactly
    ``batch * sum(1 / T_r)``, so launch offsets and drift do not bias it (one window over all
    workers would, unless every worker starts together at one speed)."""
    tb = TraceBuilder()
    for r, (T, offset) in enumerate(workers):
        for s in range(steps):
            tb.add(rank=r, step=s, phase="compute", start_s=offset + s * T, end_s=offset + (s + 0.5) * T)
    out = summarize(tb.array(), samples_per_step=batch, warmup_steps=warmup)
    assert out["samples_per_s"] == pytest.approx(batch * sum(1.0 / T for T, _ in workers), rel=1e-9)


def test_throughput_with_a_single_timed_step_falls_back_to_the_window():
    tb = TraceBuilder()
    for r in range(2):
        tb.add(rank=r, step=0, phase="compute", start_s=0.0, end_s=0.5)
        tb.add(rank=r, step=1, phase="compute", start_s=1.0, end_s=2.0)
    out = summarize(tb.array(), samples_per_step=4, warmup_steps=1)
    assert out["samples_per_s"] == pytest.approx(2 * 4 / 1.0)  # two timed steps in the window [1, 2]


def test_trace_round_trip_and_chrome_export(tmp_path):
    trace = _toy_trace()
    write_trace(tmp_path / "t.npz", trace, {"source": "test", "n_workers": 2})
    back, meta = read_trace(tmp_path / "t.npz")
    assert back.tobytes() == trace.tobytes()
    assert back.dtype == TRACE_DTYPE and meta["source"] == "test" and meta["schema_version"] == 1
    doc = json.loads(to_chrome_trace(trace, tmp_path / "tl.json").read_text())
    assert len(doc["traceEvents"]) == trace.size
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary files left


def test_the_timeline_has_one_event_per_record_with_its_fields(tmp_path):
    """Names ``phase[:kind]``, a row per rank and another for its overlapped communication, times in
    microseconds, a negative duration clamped to 0, and only the arguments a record has."""
    trace = np.zeros(3, TRACE_DTYPE)
    trace[0] = (1, 4, PHASES["compute"], 0, 0.5, 0.75, -1, 0, 2, 0.1)
    trace[1] = (1, 4, PHASES["overlap"], 1, 0.5, 0.25, 3, 4096, -1, 0.0)
    trace[2] = (0, 5, PHASES["comm"], 2, 1.0, 1.5, -1, 8, -1, 0.0)
    changes = [{"time_s": 0.6, "removed": [2], "step": 4}]
    doc = json.loads(to_chrome_trace(trace, tmp_path / "tl.json", meta={"membership_changes": changes}).read_text())
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in x] == ["compute", f"overlap:{kind_name(1)}", f"comm:{kind_name(2)}"]
    assert [e["tid"] for e in x] == [2, 3, 0]
    assert [(e["ts"], e["dur"]) for e in x] == [(0.5e6, 0.25e6), (0.5e6, 0.0), (1e6, 0.5e6)]
    assert [e["args"] for e in x] == [
        {"step": 4, "staleness": 2},
        {"step": 4, "peer": 3, "bytes": 4096},
        {"step": 5, "bytes": 8},
    ]
    (instant,) = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert instant["name"] == "membership: removed [2]" and instant["ts"] == 0.6e6 and instant["args"] == {"step": 4}


def test_an_atomic_write_that_fails_leaves_neither_file(tmp_path, monkeypatch):
    import errno
    import os

    from psgdlab.core.records.trace import atomic_write_bytes

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_bytes(tmp_path / "results" / "rank0.pt", b"payload")
    assert not list((tmp_path / "results").iterdir())


def test_bad_trace_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_trace(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="is not a psgdlab trace"):
        read_trace(tmp_path / "bad.npz")


# ----- strict config ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Link:
    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = 1e9


@dataclass(frozen=True, kw_only=True)
class _Platform:
    name: str = "x"
    nic: _Link = _Link()
    hosts: int = 1


def test_strict_loader_builds_nested_dataclasses():
    p = load_dataclass(
        _Platform, {"name": "a", "nic": {"latency_s": 1, "bandwidth_bytes_per_s": 2e9}, "hosts": 3}, where="platform"
    )
    assert p.nic == _Link(latency_s=1.0, bandwidth_bytes_per_s=2e9) and p.hosts == 3


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"hots": 2}, r"platform: unknown key 'hots'; did you mean 'hosts'\?"),
        ({"nic": {"bandwith_bytes_per_s": 1}}, r"platform.nic: unknown key 'bandwith_bytes_per_s'; did you mean"),
        ({"hosts": "4"}, r"platform.hosts \('4'\) must be of type int"),
    ],
)
def test_strict_loader_rejects(data, match):
    with pytest.raises(ConfigError, match=match):
        load_dataclass(_Platform, data, where="platform")


def test_overrides_and_toml_errors(tmp_path):
    assert apply_overrides({"nic": {"latency_s": 0.0}}, ["nic.latency_s=2e-6", "name=abc"]) == {
        "nic": {"latency_s": 2e-6},
        "name": "abc",
    }
    with pytest.raises(ConfigError, match=r"must look like key\.sub=value"):
        apply_overrides({}, ["oops"])
    (tmp_path / "bad.toml").write_text("x = [")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_toml(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "none.toml")
