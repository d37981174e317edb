"""The FLOP counting rule of core.workloads (6 FLOPs per weight and sample over forward and
backward) checked against torch's own count on the runtime's DNN."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from psgdlab.core.platform.workloads import dense_cost  # noqa: E402
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


def _conformer(shape):
    """The Conformer transducer of ``core.workloads.conformer_cost``'s docstring, written with torch
    modules (an independent statement of its definition: torch counts the weights and the MACs)."""
    from torch import nn

    d, f, D, V = shape.d_model, shape.ffn_factor, shape.decoder_dim, shape.vocabulary + 1
    f2 = ((shape.features - 1) // 2 - 1) // 2

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ffn = nn.ModuleList(
                nn.Sequential(nn.LayerNorm(d), nn.Linear(d, f * d), nn.SiLU(), nn.Linear(f * d, d)) for _ in range(2)
            )
            self.norm_att, self.qkvo = nn.LayerNorm(d), nn.ModuleList(nn.Linear(d, d) for _ in range(4))
            self.pos = nn.Linear(d, d, bias=False)
            self.bias_u, self.bias_v = nn.Parameter(torch.zeros(d)), nn.Parameter(torch.zeros(d))
            self.norm_conv = nn.LayerNorm(d)
            self.pw1, self.dw = nn.Conv1d(d, 2 * d, 1), nn.Conv1d(d, d, shape.conv_kernel, padding="same", groups=d)
            self.bn, self.pw2, self.norm_out = nn.BatchNorm1d(d), nn.Conv1d(d, d, 1), nn.LayerNorm(d)

        def forward(self, x, p):  # x: (T, d), p: (2T - 1, d) relative position encodings
            x = x + 0.5 * self.ffn[0](x)
            y = self.norm_att(x)
            q, k, v = (lin(y) for lin in self.qkvo[:3])
            pp = self.pos(p)
            ac = (q + self.bias_u) @ k.T
            bd = ((q + self.bias_v) @ pp.T)[:, : x.shape[0]]  # the relative shift moves, it does not multiply
            x = x + self.qkvo[3](torch.softmax(ac + bd, dim=-1) @ v)
            y = self.norm_conv(x).T[None]
            y = self.pw2(torch.nn.functional.silu(self.bn(self.dw(nn.functional.glu(self.pw1(y), dim=1)))))
            x = x + y[0].T
            return self.norm_out(x + 0.5 * self.ffn[1](x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(1, d, 3, 2), nn.ReLU(), nn.Conv2d(d, d, 3, 2), nn.ReLU())
            self.sub_out = nn.Linear(d * f2, d)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.embed, self.lstm = nn.Embedding(V, D), nn.LSTM(D, D)
            self.enc_proj, self.pred_proj, self.out = nn.Linear(d, D), nn.Linear(D, D), nn.Linear(D, V)

        def forward(self, feats, labels):
            x = self.conv(feats[None, None])[0]  # (d, T, F2)
            x = self.sub_out(x.permute(1, 0, 2).reshape(x.shape[1], -1))
            p = torch.randn(2 * x.shape[0] - 1, d)
            for block in self.blocks:
                x = block(x, p)
            e, h, c = self.embed(labels), torch.zeros(D), torch.zeros(D)
            lstm = self.lstm
            w_ih, w_hh, b_ih, b_hh = lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0
            steps = []
            for t in range(e.shape[0]):  # the LSTM's matmuls, step by step (torch counts them this way)
                i, g_f, g, o = (e[t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh).chunk(4)
                c = torch.sigmoid(g_f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                steps.append(h)
            joint = torch.tanh(self.enc_proj(x)[:, None, :] + self.pred_proj(torch.stack(steps))[None, :, :])
            return self.out(joint)

    return Model()


def test_conformer_count_matches_torch():
    """conformer_cost's weights and forward MACs are torch's on the model they describe (a small
    shape: the count is exact at any size)."""
    from psgdlab.core.platform.workloads import ConformerShape, conformer_cost

    shape = ConformerShape(
        d_model=16, layers=2, conv_kernel=5, features=20, decoder_dim=8, vocabulary=10, frames=41, tokens=5
    )
    torch.manual_seed(0)
    model = _conformer(shape).eval()
    feats = torch.randn(shape.frames, shape.features)
    labels = torch.randint(0, shape.vocabulary + 1, (shape.tokens + 1,))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(feats, labels)
    n_params, macs = conformer_cost(shape)
    assert n_params == sum(p.numel() for p in model.parameters())
    assert macs == counter.get_total_flops() / 2
