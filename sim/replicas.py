r"""Model replicas for the emulator: flat parameters, gradients computed in batches.

The emulator (:mod:`psgdlab.sim.emulate`) holds one flat parameter vector per virtual worker
and asks a *replica set* for the minibatch gradients of many ``(rank, step, params)`` entries
at once. Two replica sets ship:

:class:`LeastSquaresReplicas`
    the reference executor's least-squares problem in numpy float64, gradient by gradient with
    the reference's own arithmetic, so a replay can equal
    :func:`psgdlab.core.reference.run_reference` bit for bit;
:class:`TorchReplicas`
    a torch model (``psgdlab.runtime.models``) on a window corpus (``psgdlab.runtime.data``).
    The ``R`` pending entries are stacked into one ``(R, d)`` tensor and differentiated in one
    batched forward/backward:

    - for :class:`~psgdlab.runtime.models.BLSTMAcousticModel` by a replica-batched BiLSTM
      (:func:`batched_blstm_logits`): both directions of all replicas advance together, one
      ``baddbmm`` per time step, and autograd of :math:`\sum_r L_r` with respect to the stacked
      parameters gives every replica's own gradient (the replicas do not interact);
    - for any other model by ``torch.func.vmap(torch.func.grad(loss))`` over the replica
      dimension with ``torch.func.functional_call``.

    ``nn.LSTM`` itself runs under ``vmap`` only through PyTorch's per-sample fallback
    (``aten::mkldnn_rnn_layer`` has no batching rule: a loop over replicas, slower than the
    plain loop), which is why the BiLSTM has its own batched form.

Examples
--------
>>> from psgdlab.core.reference import LeastSquaresProblem
>>> reps = LeastSquaresReplicas(LeastSquaresProblem(n_samples=64, dim=3, n_shards=2, batch=4))
>>> [g.shape for g, _ in reps.gradients([(0, 0, reps.initial_point()), (1, 0, reps.initial_point())])]
[(3,), (3,)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError, require

__all__ = ["LeastSquaresReplicas", "TorchReplicas", "batched_blstm_logits", "consensus_distance"]

Array = Any


def consensus_distance(models: Sequence[Array]) -> float:
    r""":math:`C(\Theta) = \|\Theta - \bar\theta 1^\top\|_F^2` for numpy arrays or torch tensors."""
    first = models[0]
    if isinstance(first, np.ndarray):
        X = np.stack(models)
        return float(np.sum((X - X.mean(axis=0)) ** 2))
    import torch

    X = torch.stack(list(models)).double()
    return float(((X - X.mean(0)) ** 2).sum())


class LeastSquaresReplicas:
    """The reference executor's least-squares problem (numpy float64), for exact replays."""

    def __init__(self, problem: Any) -> None:
        from psgdlab.core.reference import _Bound  # the reference's own gradient arithmetic

        self.problem = problem
        self._bound = _Bound(problem)
        self.n_params = int(problem.dim)

    def initial_point(self) -> np.ndarray:
        return self.problem.initial_point()

    def gradients(self, entries: Sequence[tuple[int, int, np.ndarray]]) -> list[tuple[np.ndarray, float]]:
        """``(gradient, minibatch loss)`` of each ``(rank, step, params)`` entry."""
        return [self._bound.gradient(x, r, s) for r, s, x in entries]

    @staticmethod
    def mean(arrays: Sequence[np.ndarray]) -> np.ndarray:
        return np.mean(arrays, axis=0)  # the reference executor's reduction, bit for bit

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """Full-data loss of ``params`` (the reference's ``losses`` column)."""
        return {"loss": self._bound.loss(params)}


# ----- torch ------------------------------------------------------------------------------------
def _bilstm_layer(h: Any, p: dict[str, Any], layer: int) -> Any:
    """One bidirectional layer for ``R`` replicas: ``h`` (R, B, T, D) -> (R, B, T, 2H)."""
    import torch

    names = [f"lstm.{w}_l{layer}{sfx}" for sfx in ("", "_reverse") for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    wi_f, wh_f, bi_f, bh_f, wi_r, wh_r, bi_r, bh_r = (p[n] for n in names)
    R, B, T, D = h.shape
    H = wh_f.shape[-1]
    wi = torch.stack([wi_f, wi_r], 1)                                      # (R, 2, 4H, D)
    wh = torch.stack([wh_f, wh_r], 1).reshape(R * 2, 4 * H, H).transpose(1, 2)  # (2R, H, 4H)
    b = torch.stack([bi_f + bh_f, bi_r + bh_r], 1)                         # (R, 2, 4H)
    xt = h.transpose(1, 2).reshape(R, 1, T * B, D)                         # time-major
    xp = (torch.matmul(xt, wi.transpose(-1, -2)) + b[:, :, None, :]).view(R, 2, T, B, 4 * H)
    # step k feeds forward time k and reverse time T-1-k; unbind once (cheap backward)
    xs = torch.stack([xp[:, 0], xp[:, 1].flip(1)], 2)                      # (R, T, 2, B, 4H)
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
    r"""Logits of ``R`` replicas of :class:`~psgdlab.runtime.models.BLSTMAcousticModel`.

    ``params`` maps the module's parameter names to tensors with a leading replica dimension
    ``R``; ``x`` is ``(R, B, T, D)``. Returns ``(R, B, n_classes)``; equal (to float rounding)
    to calling the module on each replica's parameters and batch.
    """
    import torch

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
    corpus : psgdlab.runtime.data.Corpus
        Training corpus; rank ``r`` of ``n_workers`` samples its shard with
        :class:`~psgdlab.runtime.batches.WindowSampler` (``seed``, window, batch).
    heldout : Corpus or None
        Held-out corpus for :meth:`evaluate` (cross-entropy and frame accuracy of a model);
        ``None`` evaluates on ``eval_windows`` windows of the training corpus.
    max_replicas : int
        Largest number of replicas differentiated in one batch (memory bound).
    """

    def __init__(self, model: Any, corpus: Any, *, n_workers: int, window: int, batch: int, seed: int = 0,
                 heldout: Any = None, max_replicas: int = 64, eval_windows: int = 4096) -> None:
        import torch

        from psgdlab.runtime.batches import WindowSampler
        from psgdlab.runtime.models import BLSTMAcousticModel

        require(isinstance(max_replicas, int) and max_replicas >= 1, "max_replicas", max_replicas, "must be >= 1")
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in model.named_parameters()]
        self.numels = [p.numel() for _, p in model.named_parameters()]
        self.n_params = int(sum(self.numels))
        self._x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(torch.float32)
        self.samplers = [WindowSampler(corpus, window=window, batch=batch, rank=r, world_size=n_workers, seed=seed)
                         for r in range(n_workers)]
        self.batch = batch
        self.max_replicas = max_replicas
        self.blstm_layers = model.lstm.num_layers if isinstance(model, BLSTMAcousticModel) else None
        if self.blstm_layers is not None:
            require(model.lstm.proj_size == 0, "model", "BLSTM with proj_size", "is not supported batched")
        self._eval = self._eval_set(heldout if heldout is not None else corpus, window, eval_windows, seed)

    # ----- layout ---------------------------------------------------------------------------
    def initial_point(self) -> Any:
        return self._x0.clone()

    def unflatten(self, flat: Any) -> dict[str, Any]:
        """Views of a flat ``(d,)`` or stacked ``(R, d)`` tensor, shaped like the parameters."""
        lead = flat.shape[:-1]
        out, off = {}, 0
        for name, shape, k in zip(self.names, self.shapes, self.numels):
            out[name] = flat[..., off:off + k].reshape(*lead, *shape)
            off += k
        return out

    @staticmethod
    def mean(arrays: Sequence[Any]) -> Any:
        import torch

        return torch.stack(list(arrays)).mean(0)

    # ----- gradients ------------------------------------------------------------------------
    def batch_of(self, rank: int, step: int) -> tuple[Any, Any]:
        return self.samplers[rank].sample(step)

    def gradients(self, entries: Sequence[tuple[int, int, Any]]) -> list[tuple[Any, float]]:
        """``(flat gradient, minibatch loss)`` of each ``(rank, step, params)`` entry, computed
        ``max_replicas`` entries at a time in one batched forward/backward."""
        out: list[tuple[Any, float]] = []
        for i in range(0, len(entries), self.max_replicas):
            out.extend(self._gradients(entries[i:i + self.max_replicas]))
        return out

    def _gradients(self, entries: Sequence[tuple[int, int, Any]]) -> list[tuple[Any, float]]:
        import torch

        batches = [self.batch_of(r, s) for r, s, _ in entries]
        X = torch.stack([b[0] for b in batches])
        Y = torch.stack([b[1] for b in batches])
        P = torch.stack([x for _, _, x in entries])
        grads, losses = self.stacked_gradients(P, X, Y)
        return [(grads[i], float(losses[i])) for i in range(len(entries))]

    def stacked_gradients(self, P: Any, X: Any, Y: Any) -> tuple[Any, Any]:
        """Per-replica gradients ``(R, d)`` and losses ``(R,)`` of stacked parameters ``P``
        ``(R, d)`` on batches ``X`` ``(R, B, T, D)``, ``Y`` ``(R, B)``."""
        import torch
        import torch.nn.functional as F

        R = P.shape[0]
        if self.blstm_layers is not None:
            Pg = P.detach().requires_grad_(True)
            logits = batched_blstm_logits(self.unflatten(Pg), X, self.blstm_layers)
            losses = F.cross_entropy(logits.reshape(R * Y.shape[1], -1), Y.reshape(-1),
                                     reduction="none").reshape(R, -1).mean(1)
            (grads,) = torch.autograd.grad(losses.sum(), Pg)
            return grads, losses.detach()
        from torch.func import functional_call, grad, vmap

        model = self.model

        def loss(flat: Any, x: Any, y: Any) -> Any:
            value = F.cross_entropy(functional_call(model, self.unflatten(flat), (x,)), y)
            return value, value

        grads, losses = vmap(grad(loss, has_aux=True))(P.detach(), X, Y)
        return grads, losses.detach()

    def replica_gradient(self, params: Any, rank: int, step: int) -> tuple[Any, float]:
        """One replica's gradient by the plain module (``functional_call`` + autograd): the
        yardstick the batched path is tested against."""
        import torch
        import torch.nn.functional as F
        from torch.func import functional_call

        x, y = self.batch_of(rank, step)
        flat = params.detach().clone().requires_grad_(True)
        value = F.cross_entropy(functional_call(self.model, self.unflatten(flat), (x,)), y)
        (g,) = torch.autograd.grad(value, flat)
        return g, float(value.detach())

    # ----- evaluation -----------------------------------------------------------------------
    @staticmethod
    def _eval_set(corpus: Any, window: int, n: int, seed: int) -> tuple[Any, Any]:
        import torch

        from psgdlab.runtime.batches import eval_windows

        xs, ys = [], []
        total = 0
        for x, y in eval_windows(corpus, window, batch=1024):
            xs.append(x)
            ys.append(y)
            total += len(y)
        X, Y = torch.cat(xs), torch.cat(ys)
        if len(Y) > n:  # a fixed, seeded subset keeps evaluation cheap
            idx = np.sort(np.random.default_rng([seed, 0xE7A1]).choice(len(Y), size=n, replace=False))
            X, Y = X[idx], Y[idx]
        return X, Y

    def evaluate(self, params: Any) -> dict[str, float]:
        """Held-out cross-entropy and frame accuracy of one model."""
        import torch
        import torch.nn.functional as F
        from torch.func import functional_call

        X, Y = self._eval
        with torch.no_grad():
            logits = functional_call(self.model, self.unflatten(params), (X,))
            loss = float(F.cross_entropy(logits, Y))
            acc = float((logits.argmax(1) == Y).double().mean())
        if not math.isfinite(loss):
            loss = math.inf
        return {"loss": loss, "accuracy": acc}


def check_model_name(name: str) -> None:
    from psgdlab.runtime.models import MODEL_NAMES

    if name not in MODEL_NAMES:
        import difflib

        close = difflib.get_close_matches(name, MODEL_NAMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"model ({name!r}) is not a known model (known: {', '.join(MODEL_NAMES)}){hint}")
