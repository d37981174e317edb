r"""Torch model replicas for the emulator: flat parameters, gradients computed in batches.

:class:`TorchReplicas` implements :class:`psgdlab.core.replicas.Replicas` for a torch model
(``psgdlab.models.networks``) on a window corpus (``psgdlab.models.data``). The emulator
(:func:`psgdlab.sim.emulate.replay`) holds one flat parameter vector per virtual worker; the
``R`` pending ``(rank, step, params)`` entries are stacked into one ``(R, d)`` tensor and
differentiated in one batched forward/backward:

- for :class:`~psgdlab.models.networks.BLSTMAcousticModel` by a replica-batched BiLSTM
  (:func:`batched_blstm_logits`): both directions of all replicas advance together, one
  ``baddbmm`` per time step, and autograd of :math:`\sum_r L_r` with respect to the stacked
  parameters gives every replica's own gradient (the replicas do not interact);
- for any other model by ``torch.func.vmap(torch.func.grad(loss))`` over the replica
  dimension with ``torch.func.functional_call``.

``nn.LSTM`` itself runs under ``vmap`` only through PyTorch's per-sample fallback
(``aten::mkldnn_rnn_layer`` has no batching rule: a loop over replicas, slower than the plain
loop), which is why the BiLSTM has its own batched form. Its parameters are found by asking the
model's modules (``model.lstm``, ``model.projection``, ``model.output``) for their tensors, not
by their names in the state dict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from psgdlab.core.errors import require
from psgdlab.models.batches import WindowSampler, eval_windows
from psgdlab.models.networks import BLSTMAcousticModel

__all__ = ["TorchReplicas", "batched_blstm_logits", "blstm_roles"]

_LSTM_WEIGHTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
_DIRECTIONS = ("", "_reverse")


def blstm_roles(model: BLSTMAcousticModel) -> dict[str, str]:
    """Map the roles :func:`batched_blstm_logits` uses to the model's parameter names.

    Roles: ``nn.LSTM``'s own attribute names (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...)
    and ``projection.weight``, ``projection.bias``, ``output.weight``, ``output.bias``. The
    names come from the modules' tensors (by identity), so the map follows the model however
    its state dict names them.
    """
    name_of = {id(p): n for n, p in model.named_parameters()}
    lstm = model.lstm
    require(
        lstm.bias and lstm.batch_first and lstm.bidirectional,
        "model",
        type(model).__name__,
        "must have a bidirectional, batch-first LSTM with biases to be batched",
    )
    require(lstm.proj_size == 0, "model", "BLSTM with proj_size", "is not supported batched")
    roles = {
        f"{w}_l{layer}{sfx}": name_of[id(getattr(lstm, f"{w}_l{layer}{sfx}"))]
        for layer in range(lstm.num_layers)
        for sfx in _DIRECTIONS
        for w in _LSTM_WEIGHTS
    }
    for part in ("projection", "output"):
        module = getattr(model, part)
        roles[f"{part}.weight"] = name_of[id(module.weight)]
        roles[f"{part}.bias"] = name_of[id(module.bias)]
    return roles


def _bilstm_layer(h: Any, p: dict[str, Any], layer: int) -> Any:
    """One bidirectional layer for ``R`` replicas: ``h`` (R, B, T, D) -> (R, B, T, 2H)."""
    roles = [f"{w}_l{layer}{sfx}" for sfx in _DIRECTIONS for w in _LSTM_WEIGHTS]
    wi_f, wh_f, bi_f, bh_f, wi_r, wh_r, bi_r, bh_r = (p[n] for n in roles)
    R, B, T, D = h.shape
    H = wh_f.shape[-1]
    wi = torch.stack([wi_f, wi_r], 1)  # (R, 2, 4H, D)
    wh = torch.stack([wh_f, wh_r], 1).reshape(R * 2, 4 * H, H).transpose(1, 2)  # (2R, H, 4H)
    b = torch.stack([bi_f + bh_f, bi_r + bh_r], 1)  # (R, 2, 4H)
    xt = h.transpose(1, 2).reshape(R, 1, T * B, D)  # time-major
    xp = (torch.matmul(xt, wi.transpose(-1, -2)) + b[:, :, None, :]).view(R, 2, T, B, 4 * H)
    # step k feeds forward time k and reverse time T-1-k; unbind once (cheap backward)
    xs = torch.stack([xp[:, 0], xp[:, 1].flip(1)], 2)  # (R, T, 2, B, 4H)
    steps = xs.permute(1, 0, 2, 3, 4).reshape(T, R * 2, B, 4 * H).unbind(0)
    hs = xp.new_zeros(R * 2, B, H)
    c = hs
    outs = []
    for k in range(T):
        gates = torch.baddbmm(steps[k], hs, wh)
        i, f, g, o = gates.chunk(4, -1)  # PyTorch's gate order
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        hs = torch.sigmoid(o) * torch.tanh(c)
        outs.append(hs)
    out = torch.stack(outs, 0).view(T, R, 2, B, H)
    fwd = out[:, :, 0].permute(1, 2, 0, 3)
    rev = out[:, :, 1].flip(0).permute(1, 2, 0, 3)
    return torch.cat([fwd, rev], -1)


def batched_blstm_logits(params: dict[str, Any], x: Any, layers: int) -> Any:
    r"""Logits of ``R`` replicas of :class:`~psgdlab.models.networks.BLSTMAcousticModel`.

    ``params`` maps the roles of :func:`blstm_roles` to tensors with a leading replica
    dimension ``R``; ``x`` is ``(R, B, T, D)``. Returns ``(R, B, n_classes)``; equal (to float
    rounding) to calling the module on each replica's parameters and batch.
    """
    h = x
    for layer in range(layers):
        h = _bilstm_layer(h, params, layer)
    centre = h[:, :, h.shape[2] // 2]
    z = torch.baddbmm(params["projection.bias"][:, None], centre, params["projection.weight"].transpose(1, 2))
    return torch.baddbmm(params["output.bias"][:, None], z, params["output.weight"].transpose(1, 2))


class TorchReplicas:
    """Replicas of one torch model on a window corpus (see the module docstring).

    Parameters
    ----------
    model : torch.nn.Module
        Maps ``(batch, window, input_dim)`` to logits; its parameters are the initial point.
    corpus : psgdlab.models.data.Corpus
        Training corpus; rank ``r`` of ``n_workers`` samples its shard with
        :class:`~psgdlab.models.batches.WindowSampler` (``seed``, window, batch).
    heldout : Corpus or None
        Held-out corpus for :meth:`evaluate` (cross-entropy and frame accuracy of a model);
        ``None`` evaluates on ``eval_windows`` windows of the training corpus.
    max_replicas : int
        Largest number of replicas differentiated in one batch (memory bound).
    """

    def __init__(
        self,
        model: Any,
        corpus: Any,
        *,
        n_workers: int,
        window: int,
        batch: int,
        seed: int = 0,
        heldout: Any = None,
        max_replicas: int = 64,
        eval_windows: int = 4096,
    ) -> None:
        require(isinstance(max_replicas, int) and max_replicas >= 1, "max_replicas", max_replicas, "must be >= 1")
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in model.named_parameters()]
        self.numels = [p.numel() for _, p in model.named_parameters()]
        self.n_params = int(sum(self.numels))
        self._x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(torch.float32)
        self.samplers = [
            WindowSampler(corpus, window=window, batch=batch, rank=r, world_size=n_workers, seed=seed)
            for r in range(n_workers)
        ]
        self.batch = batch
        self.max_replicas = max_replicas
        self._roles = blstm_roles(model) if isinstance(model, BLSTMAcousticModel) else None
        self.blstm_layers = model.lstm.num_layers if self._roles is not None else None
        self._eval = self._eval_set(heldout if heldout is not None else corpus, window, eval_windows, seed)

    # ----- layout ---------------------------------------------------------------------------
    def initial_point(self) -> Any:
        return self._x0.clone()

    def steps_per_epoch(self) -> int:
        """Local steps in which a worker samples as many windows as its shard holds."""
        return self.samplers[0].steps_per_epoch()

    def unflatten(self, flat: Any) -> dict[str, Any]:
        """Views of a flat ``(d,)`` or stacked ``(R, d)`` tensor, shaped like the parameters."""
        lead = flat.shape[:-1]
        out, off = {}, 0
        for name, shape, k in zip(self.names, self.shapes, self.numels):
            out[name] = flat[..., off : off + k].reshape(*lead, *shape)
            off += k
        return out

    @staticmethod
    def mean(arrays: Sequence[Any]) -> Any:
        return torch.stack(list(arrays)).mean(0)

    @staticmethod
    def split(x: Any, n_shards: int, shard: int) -> Any:
        return x.tensor_split(n_shards)[shard]

    @staticmethod
    def concat(parts: Sequence[Any]) -> Any:
        return torch.cat(list(parts))

    @staticmethod
    def consensus_distance(models: Sequence[Any]) -> float:
        r""":math:`C(\Theta) = \|\Theta - \bar\theta 1^\top\|_F^2` (in float64)."""
        X = torch.stack(list(models)).double()
        return float(((X - X.mean(0)) ** 2).sum())

    # ----- gradients ------------------------------------------------------------------------
    def batch_of(self, rank: int, step: int) -> tuple[Any, Any]:
        return self.samplers[rank].sample(step)

    def gradients(self, entries: Sequence[tuple[int, int, Any]]) -> list[tuple[Any, float]]:
        """``(flat gradient, minibatch loss)`` of each ``(rank, step, params)`` entry, computed
        ``max_replicas`` entries at a time in one batched forward/backward."""
        out: list[tuple[Any, float]] = []
        for i in range(0, len(entries), self.max_replicas):
            out.extend(self._gradients(entries[i : i + self.max_replicas]))
        return out

    def _gradients(self, entries: Sequence[tuple[int, int, Any]]) -> list[tuple[Any, float]]:
        batches = [self.batch_of(r, s) for r, s, _ in entries]
        X = torch.stack([b[0] for b in batches])
        Y = torch.stack([b[1] for b in batches])
        P = torch.stack([x for _, _, x in entries])
        grads, losses = self.stacked_gradients(P, X, Y)
        return [(grads[i], float(losses[i])) for i in range(len(entries))]

    def stacked_gradients(self, P: Any, X: Any, Y: Any) -> tuple[Any, Any]:
        """Per-replica gradients ``(R, d)`` and losses ``(R,)`` of stacked parameters ``P``
        ``(R, d)`` on batches ``X`` ``(R, B, T, D)``, ``Y`` ``(R, B)``."""
        R = P.shape[0]
        if self._roles is not None and self.blstm_layers is not None:
            Pg = P.detach().requires_grad_(True)
            named = self.unflatten(Pg)
            logits = batched_blstm_logits(
                {role: named[name] for role, name in self._roles.items()}, X, self.blstm_layers
            )
            losses = (
                F.cross_entropy(logits.reshape(R * Y.shape[1], -1), Y.reshape(-1), reduction="none")
                .reshape(R, -1)
                .mean(1)
            )
            (grads,) = torch.autograd.grad(losses.sum(), Pg)
            return grads, losses.detach()
        model = self.model

        def loss(flat: Any, x: Any, y: Any) -> Any:
            value = F.cross_entropy(functional_call(model, self.unflatten(flat), (x,)), y)
            return value, value

        grads, losses = vmap(grad(loss, has_aux=True))(P.detach(), X, Y)
        return grads, losses.detach()

    def replica_gradient(self, params: Any, rank: int, step: int) -> tuple[Any, float]:
        """One replica's gradient by the plain module (``functional_call`` + autograd): the
        yardstick the batched path is tested against."""
        x, y = self.batch_of(rank, step)
        flat = params.detach().clone().requires_grad_(True)
        value = F.cross_entropy(functional_call(self.model, self.unflatten(flat), (x,)), y)
        (g,) = torch.autograd.grad(value, flat)
        return g, float(value.detach())

    # ----- evaluation -----------------------------------------------------------------------
    @staticmethod
    def _eval_set(corpus: Any, window: int, n: int, seed: int) -> tuple[Any, Any]:
        xs, ys = [], []
        for x, y in eval_windows(corpus, window, batch=1024):
            xs.append(x)
            ys.append(y)
        X, Y = torch.cat(xs), torch.cat(ys)
        if len(Y) > n:  # a fixed, seeded subset keeps evaluation cheap
            idx = np.sort(np.random.default_rng([seed, 0xE7A1]).choice(len(Y), size=n, replace=False))
            X, Y = X[idx], Y[idx]
        return X, Y

    def evaluate(self, params: Any) -> dict[str, float]:
        """Held-out cross-entropy and frame accuracy of one model."""
        X, Y = self._eval
        with torch.no_grad():
            logits = functional_call(self.model, self.unflatten(params), (X,))
            loss = float(F.cross_entropy(logits, Y))
            acc = float((logits.argmax(1) == Y).double().mean())
        if not math.isfinite(loss):
            loss = math.inf
        return {"loss": loss, "accuracy": acc}
