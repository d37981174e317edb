"""The FLOP counting rule of core.workloads (6 FLOPs per weight and sample over forward and
backward) checked against torch's own count on the runtime's DNN."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from psgdlab.core.workloads import dense_cost  # noqa: E402
from psgdlab.models.networks import build_model, count_parameters  # noqa: E402


def test_dense_counting_rule_matches_torch_on_the_dnn():
    torch.manual_seed(0)
    model = build_model("dnn", input_dim=40, n_classes=500, window=11)
    x = torch.randn(8, 11, 40)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    n = count_parameters(model)
    flops, _ = dense_cost(n, n)  # biases counted as weights: 0.1 % over
    first_layer_macs = 11 * 40 * 1024  # no input gradient is needed for the data
    assert counter.get_total_flops() / x.shape[0] == pytest.approx(flops - 2 * first_layer_macs, rel=2e-3)
