"""Acoustic models: exact parameter counts, the (batch, window, dim) -> (batch, classes) contract,
the registry, and flat parameter/gradient buffers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from psgdlab.core.errors import ConfigError  # noqa: E402
from psgdlab.models.networks import (  # noqa: E402
    MODEL_NAMES,
    BLSTMAcousticModel,
    CLDNNAcousticModel,
    DNNAcousticModel,
    build_model,
    count_parameters,
)
from psgdlab.runtime.loop.flat import flat_gradients, flat_order, flat_parameters  # noqa: E402


def _blstm_count(input_dim, hidden, layers, projection, n_classes, biases_per_gate=2):
    total = 0
    for layer in range(layers):
        d = input_dim if layer == 0 else 2 * hidden
        total += 2 * (4 * hidden * (d + hidden) + biases_per_gate * 4 * hidden)
    return total + (2 * hidden + 1) * projection + (projection + 1) * n_classes


def test_full_blstm_has_the_ibm_parameter_count():
    model = BLSTMAcousticModel()
    assert count_parameters(model) == 43_154_944
    # ALGORITHMS §D.4: one bias per gate gives 43,130,368 -- 24,576 = 12 LSTMs x 4 gates x 512
    n_bias_hh = sum(p.numel() for n, p in model.named_parameters() if "bias_hh" in n)
    assert count_parameters(model) - n_bias_hh == 43_130_368
    assert _blstm_count(260, 512, 6, 256, 32000) == 43_154_944
    assert _blstm_count(260, 512, 6, 256, 32000, biases_per_gate=1) == 43_130_368


def test_registry_full_size_defaults():
    assert count_parameters(build_model("blstm")) == 43_154_944
    # 6 x 1024 ReLU over 11 x 120 inputs, 5723 outputs (see DNNAcousticModel notes)
    assert count_parameters(build_model("dnn")) == 1321 * 1024 + 5 * 1025 * 1024 + 1025 * 5723
    assert count_parameters(DNNAcousticModel(layers=7)) == 13_516_379
    assert count_parameters(build_model("cldnn")) == 16_208_859


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_preset_maps_windows_to_centre_logits(name):
    if name in ("blstm", "dnn", "cldnn"):
        model = build_model(name, input_dim=80, n_classes=7, window=21)
    else:
        model = build_model(name, input_dim=120, n_classes=31, window=21)
    x = torch.randn(3, 21, model.input_dim)
    assert model(x).shape == (3, model.n_classes)


def test_small_presets_sizes():
    small = count_parameters(build_model("blstm-small", input_dim=120, n_classes=31, window=21))
    tiny = count_parameters(build_model("tiny-blstm", input_dim=120, n_classes=31, window=21))
    assert 2_000_000 <= small <= 4_000_000
    assert tiny < 100_000
    assert small == _blstm_count(120, 256, 2, 128, 31)


def test_blstm_output_depends_on_the_centre_frame_and_its_context():
    torch.manual_seed(0)
    model = build_model("tiny-blstm", input_dim=5, n_classes=4, window=7).eval()
    x = torch.randn(1, 7, 5)
    base = model(x)
    for t in (0, 3, 6):  # a bidirectional LSTM sees every frame of the window
        y = x.clone()
        y[0, t] += 1.0
        assert not torch.allclose(model(y), base)


def test_dnn_uses_only_the_centre_context():
    torch.manual_seed(0)
    model = DNNAcousticModel(input_dim=4, hidden=8, layers=2, n_classes=3, context=3, window=9).eval()
    x = torch.randn(2, 9, 4)
    y = x.clone()
    y[:, [0, 1, 2, 6, 7, 8]] = 0.0  # outside the centre 3 frames
    torch.testing.assert_close(model(x), model(y))
    y[:, 4] += 1.0
    assert not torch.allclose(model(x), model(y))


def test_cldnn_uses_projected_lstm():
    model = CLDNNAcousticModel(input_dim=80, n_classes=10, window=5)
    assert model.lstm.proj_size == 512 and model.lstm.hidden_size == 1024
    assert model.lstm.num_layers == 2


def test_unknown_model_name_lists_known_and_suggests():
    with pytest.raises(
        ConfigError,
        match=(r"model \('blstm-smal'\) is not known \(known: blstm, blstm-small, .*\); did you mean 'blstm-small'\?$"),
    ):
        build_model("blstm-smal", input_dim=1, n_classes=2, window=3)


def test_build_model_options_override_the_preset():
    model = build_model("blstm-small", input_dim=10, n_classes=4, window=5, dropout=0.25, layers=3)
    assert model.lstm.num_layers == 3 and model.lstm.dropout == 0.25 and model.dropout.p == 0.25
    assert build_model("dnn", layers=7, n_classes=5723) is not None
    with pytest.raises(ConfigError, match=r"model 'tiny-blstm' does not take option\(s\) \['heads'\]"):
        build_model("tiny-blstm", input_dim=3, n_classes=2, window=3, heads=4)
    with pytest.raises(ConfigError, match=r"dropout \(1.5\) must lie in \[0, 1\)"):
        build_model("tiny-blstm", input_dim=3, n_classes=2, window=3, dropout=1.5)


def test_small_presets_need_sizes_from_the_data():
    with pytest.raises(ConfigError, match=r"input_dim .* must be given for model 'blstm-small'"):
        build_model("blstm-small", n_classes=31, window=21)


@pytest.mark.parametrize("window", [0, 4, -3])
def test_window_must_be_odd_positive(window):
    with pytest.raises(ConfigError, match="window"):
        build_model("tiny-blstm", input_dim=3, n_classes=2, window=window)


def test_dnn_window_smaller_than_context_rejected():
    with pytest.raises(ConfigError, match=r"window \(5\) must be >= the DNN context \(11\)"):
        DNNAcousticModel(input_dim=3, n_classes=2, context=11, window=5)


def test_cldnn_input_dim_must_split_into_bands():
    with pytest.raises(ConfigError, match="multiple of n_bands"):
        CLDNNAcousticModel(input_dim=50, n_classes=3, window=3)


def _tiny(seed=0):
    torch.manual_seed(seed)
    return build_model("tiny-blstm", input_dim=6, n_classes=5, window=5)


def test_flat_parameters_are_views_of_the_model():
    model = _tiny()
    before = torch.cat([p.detach().reshape(-1).clone() for p in flat_order(model)])
    flat = flat_parameters(model)
    assert flat.shape == (count_parameters(model),)
    torch.testing.assert_close(flat, before)  # same values, in flat_order
    flat.mul_(0.5)  # averaging with a zero model, in place
    after = torch.cat([p.detach().reshape(-1) for p in flat_order(model)])
    torch.testing.assert_close(after, 0.5 * before)
    assert flat_parameters(model).data_ptr() == flat.data_ptr()  # second call: no copy


def test_averaging_flat_buffers_averages_models():
    a, b = _tiny(0), _tiny(1)
    x = torch.randn(4, 5, 6)
    fa, fb = flat_parameters(a), flat_parameters(b)
    expected = {
        n: (pa.detach() + pb.detach()) / 2 for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True)
    }
    mean = (fa + fb) / 2
    fa.copy_(mean)
    fb.copy_(mean)
    for n, p in a.named_parameters():
        torch.testing.assert_close(p.detach(), expected[n])
    torch.testing.assert_close(a(x), b(x))


def test_optimizer_step_on_module_matches_step_on_buffer():
    x, y = torch.randn(8, 5, 6), torch.randint(0, 5, (8,))
    lr = 0.1
    reference = _tiny()
    flat_ref = flat_parameters(reference).clone()
    torch.nn.functional.cross_entropy(reference(x), y).backward()
    grad_ref = torch.cat([p.grad.reshape(-1) for p in flat_order(reference)])

    model = _tiny()
    flat, grads = flat_parameters(model), flat_gradients(model)
    torch.optim.SGD(model.parameters(), lr=lr).zero_grad(set_to_none=False)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.testing.assert_close(grads, grad_ref)  # autograd accumulated into the flat buffer
    torch.optim.SGD(model.parameters(), lr=lr).step()
    torch.testing.assert_close(flat, flat_ref - lr * grad_ref)  # module step moved the buffer

    buffer_model = _tiny()
    buf = flat_parameters(buffer_model)
    buf.sub_(lr * grad_ref)  # the same step applied to the buffer moves the module
    torch.testing.assert_close(buffer_model(x), model(x))


def test_flat_order_puts_the_recurrent_weights_first_in_cudnn_layout():
    model = _tiny()
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for p in flat_order(model)]
    lstm = [n for n, _ in model.named_parameters() if n.startswith("lstm.")]
    assert order[: len(lstm)] == (
        [n for n in lstm if ".weight" in n] + [n for n, _ in model.named_parameters() if n.startswith("lstm.bias")]
    )
    assert order[len(lstm) :] == [n for n, _ in model.named_parameters() if not n.startswith("lstm.")]
    dnn = build_model("dnn-small", input_dim=6, n_classes=5, window=5)
    assert flat_order(dnn) == list(dnn.parameters())  # no recurrent layer: module order


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cudnn_runs_the_lstm_on_the_flat_buffer_in_place():
    import warnings

    model = build_model("tiny-blstm", input_dim=6, n_classes=5, window=5).cuda()
    flat_parameters(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "RNN module weights are not part of single contiguous chunk"
        model(torch.randn(4, 5, 6, device="cuda")).sum().backward()


def test_flat_gradients_creates_missing_grads_as_zeros():
    model = _tiny()
    grads = flat_gradients(model)
    assert grads.shape == (count_parameters(model),)
    assert float(grads.abs().sum()) == 0.0
    assert all(p.grad is not None for p in model.parameters())
