r"""Gradient allreduce overlapped with the backward pass, in buckets (PyTorch DDP's scheme).

The gradients of a :class:`~psgdlab.runtime.loop.workloads.ModuleWorkload` live in one flat buffer
(each ``p.grad`` is a view into it). :class:`OverlappedAllreduce` cuts that buffer into
*buckets* -- runs of consecutive parameters taken from the end of the model, where the backward
pass starts -- and registers a post-accumulate-grad hook on every parameter. When the last
gradient of a bucket has been accumulated the bucket's allreduce (a *sum*) is started without
blocking (:meth:`Transport.allreduce_sum_async`), so communication runs while autograd computes
the earlier layers. :meth:`OverlappedAllreduce.finish` starts what is left and waits.

Buckets are started strictly in bucket order on every rank (a bucket that is ready early waits
for its predecessors), so the sequence of collectives is the same on every rank whatever order
the hooks fire in, and a parameter that got no gradient (its bucket never becomes ready by
hooks) is reduced at :meth:`finish` with its zeros -- the order never depends on timing, and no
rank can wait for a collective another rank will not start.

The result is the elementwise sum of the flat gradients over the group, the same numbers an
allreduce of the whole buffer after the backward pass gives (each element is reduced once, by
one collective over the same ranks). Each bucket goes through the run's message transform
(:mod:`psgdlab.runtime.loop.exchange.transform`): its message is summed, then decoded into the
bucket (with the identity the bucket itself is summed in place).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from psgdlab.core.errors import require
from psgdlab.runtime.loop.exchange.transform import Identity, MessageTransform, Wire
from psgdlab.runtime.transports.transport import Transport

__all__ = ["OverlappedAllreduce", "FIRST_BUCKET_BYTES", "BUCKET_BYTES"]

#: DDP's defaults: a small first bucket (the last layers: its allreduce starts early), then larger
FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 4 << 20


class OverlappedAllreduce:
    """Sum the gradients of ``params`` over ``group`` in buckets started from backward hooks.

    Parameters
    ----------
    transport : Transport
        The channel whose collectives carry the buckets (the training thread's ``main``; nothing
        else may use it between :meth:`arm` and :meth:`finish`).
    group : sequence of int
        Ranks of the allreduce (every member builds the same buckets: same model).
    params : sequence of torch.nn.Parameter
        Every parameter, in the order of ``flat_grad``; each ``p.grad`` must be a view into it.
    flat_grad : torch.Tensor
        The flat gradient buffer.
    first_bucket_bytes, bucket_bytes : int
        Bucket caps (a parameter larger than the cap gets a bucket of its own).
    transform : MessageTransform, optional
        What each bucket goes through on the wire (default: the identity); it must be additive.
    """

    def __init__(
        self,
        transport: Transport,
        group: Sequence[int],
        params: Sequence[torch.nn.Parameter],
        flat_grad: torch.Tensor,
        *,
        first_bucket_bytes: int = FIRST_BUCKET_BYTES,
        bucket_bytes: int = BUCKET_BYTES,
        transform: MessageTransform | None = None,
    ) -> None:
        require(
            first_bucket_bytes >= 1 and bucket_bytes >= 1,
            "bucket_bytes",
            (first_bucket_bytes, bucket_bytes),
            "must be >= 1",
        )
        self.transport = transport
        self.transform = transform if transform is not None else Identity()
        Wire(self.transform).require_additive("the overlapped gradient allreduce")
        self.group = tuple(group)
        self.flat_grad = flat_grad
        base, item = flat_grad.data_ptr(), flat_grad.element_size()
        spans = []
        for p in params:
            if p.grad is None or p.grad.data_ptr() < base:
                raise ValueError("every p.grad must be a view into flat_grad (runtime.flat.flat_gradients)")
            lo = (p.grad.data_ptr() - base) // item
            spans.append((lo, lo + p.numel(), p))
        spans.sort(key=lambda s: s[0], reverse=True)  # backward starts at the last layers
        buckets: list[list[tuple[int, int, Any]]] = [[]]
        cap, size = first_bucket_bytes, 0
        for span in spans:
            nbytes = (span[1] - span[0]) * item
            if buckets[-1] and size + nbytes > cap:
                buckets.append([])
                cap, size = bucket_bytes, 0
            buckets[-1].append(span)
            size += nbytes
        self._views = [flat_grad[min(s[0] for s in b) : max(s[1] for s in b)] for b in buckets]
        self._sizes = [len(b) for b in buckets]
        self._bucket_of = {id(s[2]): i for i, b in enumerate(buckets) for s in b}
        self._handles: list[Any] = []
        self._messages: list[torch.Tensor] = []
        self._pending: list[int] = []
        self._armed = False
        self.first_start_s: float | None = None
        #: the squared norm of this rank's own gradient, summed over the buckets as each is sent
        #: (a float64 0-d tensor, complete after :meth:`finish`; the gradient noise scale's small batch)
        self.local_sq: torch.Tensor | None = None
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for _, _, p in spans]

    @property
    def n_buckets(self) -> int:
        return len(self._views)

    def arm(self) -> None:
        """Get ready for one backward pass (the gradient buffer must have been zeroed)."""
        self._pending = list(self._sizes)
        self._handles = []
        self._messages = []
        self.first_start_s = None
        self.local_sq = None
        self._armed = True

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if not self._armed:
            return
        b = self._bucket_of[id(p)]
        self._pending[b] -= 1
        while len(self._handles) < len(self._views) and self._pending[len(self._handles)] <= 0:
            self._start(len(self._handles))

    def _start(self, b: int) -> None:
        if self.first_start_s is None:
            self.first_start_s = time.time()
        view = self._views[b]
        sq = torch.dot(view, view).to(torch.float64)  # before the sum overwrites the bucket
        self.local_sq = sq if self.local_sq is None else self.local_sq + sq
        message = self.transform.encode(view)
        self._messages.append(message)
        self._handles.append(self.transport.allreduce_sum_async(message, self.group))

    def finish(self) -> torch.Tensor:
        """Start the buckets not started yet (in order), wait for all; returns the summed buffer."""
        if not self._armed:
            raise RuntimeError("OverlappedAllreduce.finish without arm()")
        self._armed = False
        while len(self._handles) < len(self._views):
            self._start(len(self._handles))
        for h in self._handles:
            h.wait()
        for view, message in zip(self._views, self._messages):
            if message is not view:  # the identity summed the bucket itself
                view.copy_(self.transform.decode(message, view))
        return self.flat_grad

    def remove(self) -> None:
        """Remove the hooks (the model goes back to plain backward passes)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
