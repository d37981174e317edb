r"""One contiguous 1-D buffer for a module's parameters, and one for its gradients.

:func:`flat_parameters` / :func:`flat_gradients` re-home a module's parameters (gradients) into
one contiguous 1-D buffer, so algorithms that average or send whole models (AD-PSGD, BMUF,
EASGD, ...) act on one tensor and the module sees the result in place. The buffer's order
(:func:`flat_order`) starts with the first recurrent layer's weights, then its biases -- cuDNN's
own layout of that layer's weights, at the start of the storage, which is where cuDNN looks: so
on a GPU cuDNN runs the layer on the buffer in place instead of copying the weights into a
chunk of its own at every call (and warning so). What that is worth on a GPU is in
``docs/measurements.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from psgdlab.core.errors import require

__all__ = ["flat_parameters", "flat_gradients", "flat_order"]


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """Move ``model``'s parameters into one contiguous 1-D buffer and return it.

    After the call every parameter's ``.data`` is a view into the returned tensor (in
    :func:`flat_order`), so in-place changes to the buffer (averaging with a peer,
    a received broadcast) change the model, and optimizer steps on the module change the buffer.
    Calling it again returns a tensor over the same storage (no copy) when the parameters are
    still consecutive views into it. Move the model to its device (``model.to(...)``) *before*
    calling this: ``Module.to``/``cuda()`` replace ``p.data`` and so detach the parameters from
    the buffer.

    Returns
    -------
    torch.Tensor
        1-D tensor of :func:`~psgdlab.models.networks.count_parameters` elements, the dtype and
        device of the first parameter.

    Raises
    ------
    ConfigError
        The model has no parameters, or parameters of mixed dtype or device.
    """
    return _flatten(flat_order(model), lambda p: p.data, _set_data, "parameters")


def flat_gradients(model: nn.Module) -> torch.Tensor:
    """Like :func:`flat_parameters` for the gradients: each ``p.grad`` becomes a view into one buffer.

    Missing gradients are created as zeros. Autograd accumulates into the existing ``.grad``
    tensors in place, so the buffer stays valid across ``backward()`` calls as long as gradients
    are zeroed in place (``optimizer.zero_grad(set_to_none=False)`` or ``buffer.zero_()``).
    With ``set_to_none=True`` (PyTorch's default) call this function again after the backward
    pass; it then re-flattens into a fresh buffer.
    """
    params = flat_order(model)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return _flatten(params, _grad_of, _set_grad, "gradients")


def flat_order(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``model`` (each once) in the order of its flat buffers.

    ``model.parameters()`` order, except that the first recurrent module (``nn.LSTM``,
    ``nn.GRU``, ``nn.RNN``; without ``proj_size``) comes first with its weight matrices before
    its biases: cuDNN's layout of that module's weights, which it uses in place only from the
    start of their storage (module docstring).

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.LSTM(2, 3))
    >>> [tuple(p.shape) for p in flat_order(m)]
    [(12, 2), (12, 3), (12,), (12,), (2, 2), (2,)]
    """
    params = list({id(p): p for p in model.parameters()}.values())
    rnn = next((m for m in model.modules() if isinstance(m, nn.RNNBase)), None)
    if rnn is None or rnn.proj_size:
        return params
    named = list(rnn.named_parameters())
    first = [p for n, p in named if n.startswith("weight")] + [p for n, p in named if n.startswith("bias")]
    ids = {id(p) for p in first}
    return first + [p for p in params if id(p) not in ids]


def _grad_of(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None  # flat_gradients created the missing ones
    return p.grad


def _set_data(p: torch.Tensor, view: torch.Tensor) -> None:
    p.data = view


def _set_grad(p: torch.Tensor, view: torch.Tensor) -> None:
    p.grad = view


def _flatten(
    params: Sequence[torch.Tensor],
    get: Callable[[torch.Tensor], torch.Tensor],
    set_: Callable[[torch.Tensor, torch.Tensor], None],
    what: str,
) -> torch.Tensor:
    require(len(params) > 0, "model", "no parameters", f"has no {what} to flatten")
    tensors = [get(p) for p in params]
    first = tensors[0]
    require(
        all(t.dtype == first.dtype and t.device == first.device for t in tensors),
        what,
        sorted({f"{t.dtype}@{t.device}" for t in tensors}),
        "must share one dtype and device",
    )
    base = first.untyped_storage()
    total = sum(t.numel() for t in tensors)
    if base.nbytes() == total * first.element_size() and _are_consecutive_views(tensors):
        return torch.empty(0, dtype=first.dtype, device=first.device).set_(base, 0, (total,), (1,))
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    offset = 0
    for p, t in zip(params, tensors, strict=True):
        set_(p, flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
    return flat


def _are_consecutive_views(tensors: list[torch.Tensor]) -> bool:
    storage = tensors[0].untyped_storage().data_ptr()
    offset = 0
    for t in tensors:
        if t.untyped_storage().data_ptr() != storage or t.storage_offset() != offset or not t.is_contiguous():
            return False
        offset += t.numel()
    return True
