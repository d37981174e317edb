"""core.workloads and the device law of core.profile: t(b) = F b / (P e_c) + M / (W e_m)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.profile import Link, Platform, Profile
from psgdlab.core.platform.workloads import (
    WORKLOADS,
    ConformerShape,
    conformer_cost,
    dense_cost,
    load_workload,
    workload,
    workload_names,
)

positive = st.floats(1e-3, 1e3)
efficiency = st.floats(0.01, 1.0)


@given(
    flops=st.floats(1e3, 1e10),
    traffic=st.floats(0.0, 1e10),
    peak=st.floats(1e9, 1e15),
    bw=st.floats(1e9, 1e13),
    e_c=efficiency,
    e_m=efficiency,
    batch=st.integers(1, 10_000),
    ref=st.integers(1, 10_000),
)
@settings(max_examples=100, deadline=None)
def test_device_law_at_any_batch(flops, traffic, peak, bw, e_c, e_m, batch, ref):
    w = dataclasses.replace(workload("dnn-13.5m"), flops_per_sample=flops, bytes_per_step=traffic, reference_batch=ref)
    platform = Platform(
        device_flops_per_s=peak, device_memory_bandwidth_bytes_per_s=bw, compute_efficiency=e_c, memory_efficiency=e_m
    )
    p = Profile(platform=platform, workload=w)
    r = p.resolved()
    expected = flops * batch / (peak * e_c) + traffic / (bw * e_m)
    assert r.workload.mean_compute_s(batch) == pytest.approx(expected, rel=1e-9)
    assert r.resolved() == r  # idempotent
    # the per-sample time never grows with the batch: a small batch does not fill the device
    assert r.workload.mean_compute_s(batch + 1) / (batch + 1) <= r.workload.mean_compute_s(batch) / batch * (1 + 1e-12)


def test_no_device_no_law():
    p = Profile(platform=Platform(), workload=workload("dnn-13.5m"))
    assert not p.device_law and p.resolved() is p


def test_catalog_entries_follow_the_counting_rule():
    assert set(WORKLOADS) == {"bilstm-43m", "dnn-13.5m", "cldnn-13.8m", "conformer-120m"}
    assert set(workload_names()) == set(WORKLOADS) | {"blstm", "dnn", "cldnn"}
    for name in ("dnn-13.5m", "cldnn-13.8m"):
        w = workload(name)
        assert (w.flops_per_sample, w.bytes_per_step) == dense_cost(w.n_params, w.n_params)
    blstm = workload("bilstm-43m")
    assert blstm.flops_per_sample == pytest.approx(6 * 21 * blstm.n_params)
    assert dense_cost(10, 3, itemsize=2) == (60.0, 30.0)


@pytest.mark.parametrize(
    "shape,published",
    [
        (ConformerShape(), 118.8e6),  # Conformer (L), Gulati et al. 2020 Table 1
        (ConformerShape(d_model=144, layers=16, decoder_dim=320), 10.3e6),  # Conformer (S)
    ],
)
def test_conformer_count_is_the_published_size(shape, published):
    """The count from the definition lands within 2 % of Table 1 (the subsampling and the joint
    network, which the table does not size, make the difference)."""
    n, _ = conformer_cost(shape)
    assert n == pytest.approx(published, rel=0.02)


def test_conformer_workload_is_its_count():
    w = workload("conformer-120m")
    n, macs = conformer_cost(ConformerShape())
    assert w.n_params == n and (w.flops_per_sample, w.bytes_per_step) == dense_cost(macs, n)
    assert w.input_bytes_per_sample == 1229 * 80 * 4
    assert w.samples_per_epoch * 12.29 / 3600 == pytest.approx(960, rel=0.001)  # 281,241 utterances of 960 h


@given(tokens=st.integers(0, 200), frames=st.integers(30, 4000))
@settings(max_examples=30, deadline=None)
def test_conformer_macs_grow_with_the_utterance_and_the_weights_do_not(tokens, frames):
    shape = ConformerShape(d_model=64, layers=2, decoder_dim=32, vocabulary=50, tokens=tokens, frames=frames)
    n, macs = conformer_cost(shape)
    longer = conformer_cost(
        ConformerShape(d_model=64, layers=2, decoder_dim=32, vocabulary=50, tokens=tokens + 1, frames=frames + 8)
    )
    assert longer[0] == n and longer[1] > macs


def test_the_runtimes_model_presets_name_the_workloads_they_train():
    """``predict --workload cldnn`` is the workload the runtime's ``--model cldnn`` trains, as
    the issue's example writes it; every entry names a preset the runtime has."""
    from psgdlab.core.platform.workloads import BY_MODEL
    from psgdlab.models.networks import MODEL_PRESETS

    assert BY_MODEL == {"blstm": "bilstm-43m", "dnn": "dnn-13.5m", "cldnn": "cldnn-13.8m"}
    assert set(BY_MODEL) <= set(MODEL_PRESETS)
    for model, name in BY_MODEL.items():
        assert workload(model) == workload(name) == load_workload(model)


def test_workload_errors_and_files(tmp_path):
    with pytest.raises(ConfigError, match=r"did you mean 'cldnn'"):
        workload("cldn")
    with pytest.raises(ConfigError, match="does not exist"):
        load_workload(str(tmp_path / "none.toml"))
    f = tmp_path / "mine.toml"
    f.write_text('[workload]\nname = "mine"\nn_params = 1000\nflops_per_sample = 6000.0\n')
    assert load_workload(str(f)).name == "mine"
    f.write_text("[workload]\nn_param = 1000\n")
    with pytest.raises(ConfigError, match="n_params"):
        load_workload(str(f))
    f.write_text("[platform]\nhosts = 1\n")
    with pytest.raises(ConfigError):
        load_workload(str(f))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"compute_efficiency": 0.0}, "compute_efficiency"),
        ({"memory_efficiency": 1.5}, "memory_efficiency"),
        ({"input_efficiency": -1.0}, "input_efficiency"),
        ({"device_flops_per_s": -1.0}, "device_flops_per_s"),
        ({"device_flops_per_s": math.inf}, "device_flops_per_s"),
        ({"socket_fill": "scatter"}, "socket_fill"),
    ],
)
def test_platform_efficiencies_are_checked(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Platform(**kwargs)
    with pytest.raises(ConfigError, match="efficiency"):
        Link(efficiency=0.0)
