r"""Update kernels: pure functions on flat parameter arrays.

They use only the arithmetic operators that numpy arrays and torch tensors share, so the
reference executor and the emulator call them on numpy arrays and the runtime on torch tensors.
Each returns new arrays; nothing is modified in place.

Examples
--------
>>> import numpy as np
>>> sgd_step(np.array([1.0, 2.0]), np.array([0.5, 0.5]), 0.1)[0]
array([0.95, 1.95])
>>> average(np.array([0.0, 2.0]), np.array([2.0, 0.0]))
array([1., 1.])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "clone",
    "sgd_step",
    "average",
    "weighted_sum",
    "bmuf_filter",
    "bmuf_filter_summed",
    "elastic_pair",
    "elastic_sync",
    "server_apply_delta",
]

Array = Any  # numpy.ndarray or torch.Tensor (flat, 1-D)


def clone(x: Array) -> Array:
    """A copy of ``x`` (``torch.Tensor.clone`` or ``numpy.ndarray.copy``)."""
    return x.clone() if hasattr(x, "clone") else x.copy()


def sgd_step(
    params: Array,
    grad: Array,
    lr: float,
    momentum_buf: Array | None = None,
    momentum: float = 0.0,
    grad_scale: float = 1.0,
) -> tuple[Array, Array | None]:
    r"""One SGD step on the gradient :math:`g = c\,\hat g` (``grad_scale`` :math:`c` times ``grad``),
    with optional heavy-ball momentum (PyTorch's convention).

    .. math:: b \leftarrow \mu b + g, \qquad \theta \leftarrow \theta - \alpha b

    With ``momentum == 0`` this is :math:`\theta - (\alpha c)\hat g`: the scale folds into the
    learning rate at no cost, which is how an executor that allreduces the *sum* of ``n``
    gradients applies their mean (``grad_scale = 1/n``) without a divide pass. With momentum the
    buffer holds the scaled gradient, exactly as if the mean had been passed.
    """
    if momentum == 0.0:
        return params - (lr * grad_scale) * grad, None
    g = grad if grad_scale == 1.0 else grad * grad_scale
    if momentum_buf is None:
        buf = clone(g) if g is grad else g
    else:
        buf = momentum * momentum_buf + g
    return params - lr * buf, buf


def average(a: Array, b: Array) -> Array:
    r"""Pairwise average :math:`(a + b)/2` (AD-PSGD mixing, one pair)."""
    return (a + b) * 0.5


def weighted_sum(self_weight: float, own: Array, weights: Sequence[float], others: Sequence[Array]) -> Array:
    r"""One column of a mixing step: :math:`w_{ii} x_i + \sum_j w_{ji} x_j` (D-PSGD gossip)."""
    out = own * self_weight
    for w, x in zip(weights, others):
        out = out + x * w
    return out


def bmuf_filter(
    mean_model: Array, global_model: Array, delta: Array, *, block_momentum: float, block_lr: float, nesterov: bool
) -> tuple[Array, Array]:
    r"""BMUF block filter (ALGORITHMS.md §A.5, averaged form).

    .. math::
        G_t = \bar w_t - \tilde w_{t-1}, \quad
        \Delta_t = \zeta \Delta_{t-1} + \eta G_t, \quad
        \tilde w_t = \tilde w_{t-1} + \Delta_t

    Returns ``(new_global, new_delta)``. With ``nesterov`` the returned global model is the
    look-ahead point :math:`\tilde w_t + \zeta \Delta_t`, stored as "the previous global model"
    exactly as CNTK and fairseq do; the next block starts from it in both forms.
    """
    new_delta = block_momentum * delta + block_lr * (mean_model - global_model)
    new_global = global_model + new_delta
    if nesterov:
        new_global = new_global + block_momentum * new_delta
    return new_global, new_delta


def bmuf_filter_summed(
    sum_of_block_deltas: Array, global_model: Array, delta: Array, *, block_momentum: float, gain: float, nesterov: bool
) -> tuple[Array, Array]:
    r"""BMUF in the "summed" form of CNTK and kaldi-aslp: allreduce-**sum** the block deltas
    :math:`\sum_i (w^i_t - \tilde w_{t-1})` and use gain :math:`(1-\zeta)C`:

    .. math:: \Delta_t = \zeta \Delta_{t-1} + (1-\zeta) C \sum_i (w^i_t - \tilde w_{t-1})

    ``gain`` is :math:`(1-\zeta)C`. Equal to :func:`bmuf_filter` when
    :math:`\eta = (1-\zeta) N C` (ALGORITHMS.md §E.10).
    """
    new_delta = block_momentum * delta + gain * sum_of_block_deltas
    new_global = global_model + new_delta
    if nesterov:
        new_global = new_global + block_momentum * new_delta
    return new_global, new_delta


def elastic_pair(worker: Array, centre: Array, alpha: float) -> tuple[Array, Array]:
    r"""Asynchronous EASGD exchange with pre-exchange values on both sides:

    .. math:: w \leftarrow w - \alpha (w - \tilde w), \qquad \tilde w \leftarrow \tilde w + \alpha (w - \tilde w)

    Preserves :math:`w + \tilde w` and multiplies :math:`w - \tilde w` by :math:`1 - 2\alpha`.
    """
    diff = worker - centre
    return worker - alpha * diff, centre + alpha * diff


def elastic_sync(
    worker: Array, centre: Array, mean_workers: Array, alpha: float, n_workers: int
) -> tuple[Array, Array]:
    r"""Synchronous EASGD elastic step (gradients aside), all from pre-step values:

    .. math::
        w^i \leftarrow w^i - \alpha (w^i - \tilde w), \qquad
        \tilde w \leftarrow \tilde w + \alpha \sum_i (w^i - \tilde w) = \tilde w + \alpha n (\bar w - \tilde w)

    Preserves :math:`\sum_i w^i + \tilde w`; the step's matrix is doubly stochastic iff
    :math:`n\alpha \le 1`.
    """
    return worker - alpha * (worker - centre), centre + (alpha * n_workers) * (mean_workers - centre)


def server_apply_delta(server: Array, delta: Array, server_lr: float) -> Array:
    r"""Parameter-server ASGD: :math:`\tilde w \leftarrow \tilde w + \alpha_s \delta_i`."""
    return server + server_lr * delta
