"""The exchange interface's message transform, which every payload of every exchange goes through.

The distributed cases run with the float16 transform plugged in once (:data:`TRANSFORM_ENV`):
every exchange kind of both protocols moves float16 messages -- a quarter of the bytes of the
float64 least-squares payloads -- and the deterministic algorithms end within float16's rounding
of the oracle (the identity's trajectory: ``test_driver.py`` holds it to 1e-10).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.exchange import AllReduce, ExchangeKind, Gossip, PairwiseAverage, ServerExchange, wire_bytes
from psgdlab.core.platform.failure import node_sum_elements
from psgdlab.core.records.trace import read_trace
from psgdlab.runtime.config import build_algorithm
from psgdlab.runtime.loop.exchange.surviving import step_mark_period
from psgdlab.runtime.loop.exchange.transform import (
    TRANSFORM_ENV,
    TRANSFORMS,
    Float16,
    Identity,
    MessageTransform,
    Wire,
    transform_named,
)
from psgdlab.tests.runtime._runtime_helpers import (
    TRAJECTORY_ATOL,
    initial_full_loss,
    lsq_config,
    needs_topology,
    reference_for,
    trajectory,
)

#: float16's unit roundoff
U16 = 2.0**-11


# ----- transforms ------------------------------------------------------------------------------------
@given(st.lists(st.floats(-6e4, 6e4, allow_nan=False, width=64), min_size=1, max_size=64))
def test_float16_rounds_each_element_once_and_its_message_is_float16(values):
    x = torch.tensor(values, dtype=torch.float64)
    f = Float16()
    message = f.encode(x)
    assert message.dtype == torch.float16 and message.numel() == x.numel()
    back = f.decode(message, x)
    assert back.dtype == x.dtype and back.shape == x.shape
    np.testing.assert_array_equal(back.numpy(), x.numpy().astype(np.float16).astype(np.float64))
    # relative rounding within the unit roundoff (absolute within the subnormals' spacing)
    assert np.all(np.abs(back.numpy() - x.numpy()) <= U16 * np.abs(x.numpy()) + 2.0**-25)


def test_the_identity_moves_the_payload_itself():
    x = torch.arange(5, dtype=torch.float64)
    i = Identity()
    assert i.encode(x) is x and i.decode(x, x) is x
    assert Wire().message_size(1000, torch.float64) == (1000, 8)
    assert Wire(Float16()).message_size(1000, torch.float64) == (1000, 2)
    ex = AllReduce(group=(0, 1, 2, 3), payload="grad")
    assert Wire(Float16()).nbytes(ex, 1000, torch.float32) * 2 == Wire().nbytes(ex, 1000, torch.float32)


def test_transforms_are_found_by_name_and_an_unknown_name_is_one_line():
    assert set(TRANSFORMS) == {"identity", "float16"}
    assert isinstance(transform_named("float16"), Float16)
    with pytest.raises(ConfigError, match=r"message transform \('fp8'\) must be one of identity, float16"):
        transform_named("fp8")


class _ScaledInt8(MessageTransform):
    """A quantizer with a scale per message (its last element): neither additive nor elementwise."""

    name = "scaled-int8"
    additive = False
    elementwise = False

    def encode(self, payload):
        flat = payload.reshape(-1).to(torch.float32)
        scale = float(flat.abs().max()) / 127 or 1.0
        return torch.cat([torch.round(flat / scale), torch.tensor([scale])])

    def decode(self, message, like):
        return (message[:-1] * message[-1]).to(like.dtype).view(like.shape)

    def empty_message(self, like):
        return torch.empty(like.numel() + 1, dtype=torch.float32, device=like.device)


class _Gathering:
    """A channel whose allgather returns the messages of ``shards`` (every member's), in order."""

    def __init__(self, transform, shards):
        self.messages = [transform.encode(s) for s in shards]

    def allgather(self, shard, sizes, group):
        assert [m.numel() for m in self.messages] == list(sizes)
        return torch.cat(self.messages)


def test_an_allgather_decodes_a_transform_that_is_not_elementwise_piece_by_piece():
    shards = [torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64), torch.tensor([100.0, 50.0], dtype=torch.float64)]
    q = _ScaledInt8()
    got = Wire(q).allgather(_Gathering(q, shards), shards[0], [3, 2], (0, 1))
    expected = torch.cat([q.decode(q.encode(s), s) for s in shards])
    assert torch.equal(got, expected)
    np.testing.assert_allclose(got.numpy(), torch.cat(shards).numpy(), rtol=0, atol=100 / 127 / 2)


def test_a_transform_that_does_not_add_is_refused_by_an_allreduce():
    x = torch.ones(4, dtype=torch.float64)
    with pytest.raises(ConfigError, match=r"message transform \('scaled-int8'\) is not additive: an allreduce"):
        Wire(_ScaledInt8()).allreduce_sum(lambda t, g: None, x, (0, 1))


@given(st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]), st.integers(1, 64))
def test_the_step_check_period_is_the_largest_whose_sums_are_exact(dtype, members):
    p = step_mark_period(dtype, members)
    exact = 2.0 / torch.finfo(dtype).eps
    assert p == 0 or (members * (p - 1) ** 2 < exact and (p & (p - 1)) == 0 and p <= 1024)
    assert p == 1024 or members * (2 * p - 1) ** 2 >= exact  # twice the period would not be exact


# ----- every exchange kind of both protocols through float16 -----------------------------------------
def _expected_bytes(config, n_params: int) -> dict[int, tuple[set[int], set[int]]]:
    """Per trace kind: the bytes of each of its exchanges in float16 messages, and in float64 ones
    (the identity's), from the schedule's first steps."""
    alg = build_algorithm(config)
    out: dict[int, tuple[set[int], set[int]]] = {}
    for s in range(4):
        for r in range(config.workers):
            for ex in alg.exchanges(s, r):
                n = n_params
                if isinstance(ex, AllReduce) and config.failure_policy == "continue":
                    n = node_sum_elements(n_params)  # the node's sum under continue
                kind = {AllReduce: 1, PairwiseAverage: 2, Gossip: 3, ServerExchange: 4}.get(type(ex))
                if kind is not None and wire_bytes(ex, n, 8)[0]:
                    half, full = out.setdefault(kind, (set(), set()))
                    half.add(wire_bytes(ex, n, 2)[0])
                    full.add(wire_bytes(ex, n, 8)[0])
    return out


TRANSFORM_CASES = [
    pytest.param("ssgd", 2, {}, True, id="ssgd-gradient-allreduce"),
    pytest.param("bmuf", 2, {"period": 3}, True, id="bmuf-model-allreduce"),
    pytest.param("dpsgd", 4, {"on_failure": "stop"}, True, id="dpsgd-gossip", marks=needs_topology),
    pytest.param("dpsgd", 4, {"on_failure": "continue"}, True, id="dpsgd-gossip-surviving", marks=needs_topology),
    pytest.param("asgd", 3, {"compute_time": "0.002"}, False, id="asgd-server"),
    pytest.param("adpsgd", 4, {"on_failure": "stop"}, False, id="adpsgd-pairwise", marks=needs_topology),
    pytest.param(
        "hadpsgd", 4, {"gpus_per_node": 2, "on_failure": "stop"}, False, id="hadpsgd-sharded", marks=needs_topology
    ),
    pytest.param(
        "hadpsgd",
        4,
        {"gpus_per_node": 2, "on_failure": "continue"},
        False,
        id="hadpsgd-sharded-surviving",
        marks=needs_topology,
    ),
]


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("algorithm", "workers", "params", "deterministic"), TRANSFORM_CASES)
def test_a_float16_transform_plugged_in_once_changes_what_every_exchange_moves(
    tmp_path, algorithm, workers, params, deterministic
):
    from psgdlab.runtime.launcher.launch import launch

    config = lsq_config(tmp_path, algorithm, workers, steps=16, **params)
    summary = launch(config, quiet=True, timeout_s=90, extra_env={TRANSFORM_ENV: "float16"})
    trace, _ = read_trace(Path(config.out) / "trace.npz")
    expected = _expected_bytes(config, summary["n_params"])
    assert expected, "the schedule has no exchange that moves a payload"
    for kind, (half, full) in expected.items():
        moved = trace[(trace["kind"] == kind) & (trace["nbytes"] > 0)]
        assert moved.size, ExchangeKind(kind).name
        assert set(moved["nbytes"].tolist()) <= half, (ExchangeKind(kind).name, set(moved["nbytes"].tolist()), half)
        assert {4 * b for b in half} == full  # float64 payloads: a quarter of the identity's bytes
    if deterministic:
        got, oracle = trajectory(config), reference_for(config)
        scale = float(np.max(np.abs(oracle)))
        diff = float(np.max(np.abs(got - oracle)))
        # the identity follows the oracle to TRAJECTORY_ATOL; float16 moves it by its rounding: each
        # step rounds what it receives (a gradient, the neighbours' or the mean model) once, at most
        # one unit roundoff of the model's scale, and the updates do not amplify it (measured: 0.2 to
        # 0.7 of one roundoff after 16 steps, against the 16 allowed)
        assert 100 * TRAJECTORY_ATOL < diff <= config.steps * U16 * scale, (diff, scale)
    else:
        assert summary["mean_model_full_loss"] < 0.5 * initial_full_loss(config)
