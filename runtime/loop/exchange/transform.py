r"""What every payload goes through on its way to the wire: the run's message transform.

Every exchange of both protocols -- pairwise averages (active and passive side), gossip, the
allgather inside a node, gradient and model allreduces, the parameter server's push and reply --
moves its payloads through one :class:`Wire`, which encodes each payload with the run's
:class:`MessageTransform` before it leaves and decodes what arrives. A compression scheme is one
more transform, and nothing else changes: not the loop, not the protocols, not the transports.
Headers, the stop check and the survivors' control messages are no payload and stay as they are.

A transform's contract:

- :meth:`~MessageTransform.encode` ``(payload) -> message``: a flat tensor on the payload's
  device (the payload itself is a valid message: :class:`Identity`);
- :meth:`~MessageTransform.decode` ``(message, like) -> tensor`` shaped and typed like ``like``
  (only its shape and dtype count: it may be a ``meta`` tensor);
- :meth:`~MessageTransform.empty_message` ``(like)``: the receive buffer of the message of a
  payload like ``like``: a message's size and dtype depend only on the payload's (a receiver
  allocates before anything arrives). Its size is also what the trace records: the bytes of an
  exchange are :func:`psgdlab.core.exchange.wire_bytes` of the message's elements and itemsize
  (:meth:`Wire.nbytes`);
- :attr:`~MessageTransform.additive`: the messages of several payloads sum to the message of their
  sum, up to the transform's rounding (a cast does; a quantizer with a scale per message does
  not): allreduces sum messages, so a transform that is not additive cannot ride one
  (:meth:`Wire.require_additive`: a :class:`~psgdlab.core.errors.ConfigError` naming it);
- :attr:`~MessageTransform.elementwise`: the message of a concatenation is the concatenation of
  the messages, so an allgather decodes what it gathered at once (else piece by piece).

:class:`Float16` casts to half precision and back, as PyTorch's ``fp16_compress_hook`` does for
DDP's gradient buckets: the bytes of every exchange shrink by the cast's ratio (a half of float32's,
a quarter of float64's), and the trajectory moves by the rounding of the cast (unit roundoff
:math:`2^{-11}` per element per exchange).

The run's transform is :attr:`psgdlab.runtime.loop.driver.DriverOptions.transform` (identity by
default); a launched run takes it by name from :data:`TRANSFORM_ENV` (:data:`TRANSFORMS`), a hook
that stands until the low-communication work gives it a flag the simulator also prices.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch

from psgdlab.core.errors import ConfigError
from psgdlab.core.exchange import Exchange, wire_bytes
from psgdlab.runtime.transports.transport import Transport

__all__ = [
    "MessageTransform",
    "Identity",
    "Float16",
    "TRANSFORMS",
    "TRANSFORM_ENV",
    "Wire",
    "transform_named",
]

#: the name (:data:`TRANSFORMS`) of the transform every exchange of a launched run goes through
TRANSFORM_ENV = "PSGDLAB_TRANSFORM"


class MessageTransform(ABC):
    """How a payload travels (module docstring: the contract)."""

    #: the name :data:`TRANSFORMS` knows it by
    name: ClassVar[str]
    #: messages sum to the message of the payloads' sum (allreduces may sum them)
    additive: ClassVar[bool] = True
    #: the message of a concatenation is the concatenation of the messages
    elementwise: ClassVar[bool] = True

    @abstractmethod
    def encode(self, payload: torch.Tensor) -> torch.Tensor:
        """The message of ``payload`` (flat, on its device)."""

    @abstractmethod
    def decode(self, message: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The payload of ``message``, shaped and typed like ``like`` (whose device may be ``meta``)."""

    @abstractmethod
    def empty_message(self, like: torch.Tensor) -> torch.Tensor:
        """A receive buffer for the message of a payload like ``like``."""


class Identity(MessageTransform):
    """The payload is the message: nothing is copied, every exchange moves what it always did."""

    name = "identity"

    def encode(self, payload: torch.Tensor) -> torch.Tensor:
        return payload

    def decode(self, message: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return message

    def empty_message(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(like)


class Float16(MessageTransform):
    """Cast to float16 before the wire and back after it (PyTorch's ``fp16_compress_hook``).

    Additive: an allreduce sums the float16 messages (each partial sum rounded to float16), as the
    hook does; the range is float16's (at most 65504 in magnitude).

    Examples
    --------
    >>> f = Float16()
    >>> x = torch.tensor([1.0, 1.0 + 2.0**-12, 3.0], dtype=torch.float64)
    >>> m = f.encode(x)
    >>> m.dtype, m.element_size(), f.decode(m, x).tolist()
    (torch.float16, 2, [1.0, 1.0, 3.0])
    """

    name = "float16"

    def encode(self, payload: torch.Tensor) -> torch.Tensor:
        return payload.reshape(-1).to(torch.float16)

    def decode(self, message: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return message.to(like.dtype).view(like.shape)

    def empty_message(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(like.numel(), dtype=torch.float16, device=like.device)


#: every transform by name
TRANSFORMS: dict[str, type[MessageTransform]] = {t.name: t for t in (Identity, Float16)}


def transform_named(name: str) -> MessageTransform:
    """The transform ``name`` (:data:`TRANSFORMS`); :class:`ConfigError` naming the known ones."""
    cls = TRANSFORMS.get(name)
    if cls is None:
        raise ConfigError(f"message transform ({name!r}) must be one of {', '.join(TRANSFORMS)}")
    return cls()


def _at_once(transfer: Callable[[], None]) -> None:
    transfer()


class Wire:
    """The payload operations of the exchanges, each through ``transform`` (module docstring).

    Each operation takes the channel (:class:`~psgdlab.runtime.transports.transport.Transport`)
    that carries it; ``via`` runs the transfer itself (default: at once; the surviving protocol
    runs it on a thread it can leave once a peer is given up).
    """

    def __init__(self, transform: MessageTransform | None = None) -> None:
        self.transform = transform if transform is not None else Identity()

    # --- what the trace says ---
    def message_size(self, n_elements: int, dtype: torch.dtype) -> tuple[int, int]:
        """The elements and itemsize of the message of a payload of ``n_elements`` of ``dtype``."""
        message = self.transform.empty_message(torch.empty(n_elements, dtype=dtype, device="meta"))
        return message.numel(), message.element_size()

    def message_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype of the messages of payloads of ``dtype``."""
        return self.transform.empty_message(torch.empty(1, dtype=dtype, device="meta")).dtype

    def nbytes(self, exchange: Exchange, n_elements: int, dtype: torch.dtype) -> int:
        """The bytes one rank sends in ``exchange`` of payloads of ``n_elements`` of ``dtype``."""
        return wire_bytes(exchange, *self.message_size(n_elements, dtype))[0]

    def require_additive(self, what: str) -> None:
        """Refuse, in one line, a transform whose messages an allreduce cannot sum."""
        if not self.transform.additive:
            raise ConfigError(
                f"message transform ({self.transform.name!r}) is not additive: {what} sums messages "
                "in an allreduce, which needs messages that add"
            )

    # --- the operations ---
    def encode(self, payload: torch.Tensor) -> torch.Tensor:
        return self.transform.encode(payload)

    def decode(self, message: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.transform.decode(message, like)

    def sendrecv(
        self,
        channel: Transport,
        payload: torch.Tensor,
        peer: int,
        tag: int,
        *,
        via: Callable[[Callable[[], None]], None] = _at_once,
    ) -> torch.Tensor:
        """Send ``payload`` to ``peer`` and return the payload it sent back (a pairwise exchange)."""
        message = self.transform.encode(payload)
        received = self.transform.empty_message(payload)
        via(lambda: channel.sendrecv(message, received, peer, tag))
        return self.transform.decode(received, payload)

    def multi_exchange(self, channel: Transport, payload: torch.Tensor, peers: Sequence[int], tag: int) -> list:
        """Send ``payload`` to every peer and return the payload each sent (gossip)."""
        message = self.transform.encode(payload)
        received = [self.transform.empty_message(payload) for _ in peers]
        channel.multi_exchange(message, received, list(peers), tag)
        return [self.transform.decode(m, payload) for m in received]

    def allreduce_sum(
        self,
        reduce: Callable[[torch.Tensor, Sequence[int]], None],
        payload: torch.Tensor,
        group: Sequence[int],
        *,
        via: Callable[[Callable[[], None]], None] = _at_once,
    ) -> torch.Tensor:
        """The sum of ``payload`` over ``group`` by ``reduce`` (an in-place sum of messages: a
        channel's ``allreduce_sum``); with the identity the payload itself is summed in place."""
        self.require_additive("an allreduce")
        message = self.transform.encode(payload)
        via(lambda: reduce(message, group))
        return self.transform.decode(message, payload)

    def allreduce_mean(self, channel: Transport, payload: torch.Tensor, group: Sequence[int]) -> torch.Tensor:
        """The mean of ``payload`` over ``group`` (a model allreduce; in place with the identity)."""
        self.require_additive("an allreduce")
        message = self.transform.encode(payload)
        channel.allreduce_mean(message, group)
        return self.transform.decode(message, payload)

    def allgather(
        self, channel: Transport, shard: torch.Tensor, sizes: Sequence[int], group: Sequence[int]
    ) -> torch.Tensor:
        """The concatenation of the members' shards in group order (``sizes[i]``: member i's
        elements), as payloads."""
        dtype = shard.dtype
        counts = [self.message_size(n, dtype)[0] for n in sizes]
        gathered = channel.allgather(self.transform.encode(shard), counts, group)
        whole = torch.empty(int(sum(sizes)), dtype=dtype, device="meta")
        if self.transform.elementwise:
            return self.transform.decode(gathered, whole)
        pieces, lo, m = [], 0, 0
        for n, c in zip(sizes, counts):
            pieces.append(self.transform.decode(gathered[m : m + c], whole[lo : lo + n]))
            lo, m = lo + n, m + c
        return torch.cat(pieces)

    def send(self, channel: Transport, payload: torch.Tensor, dst: int, tag: int) -> None:
        channel.send(self.transform.encode(payload).contiguous(), dst, tag)

    def recv(self, channel: Transport, like: torch.Tensor, src: int, tag: int) -> torch.Tensor:
        """Receive the message of a payload like ``like`` from ``src`` and return the payload."""
        message = self.transform.empty_message(like)
        channel.recv(message, src, tag)
        return self.transform.decode(message, like)
