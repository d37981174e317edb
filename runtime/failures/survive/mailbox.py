"""The control messages of a run that survives deaths (``--on-failure continue``): a mailbox per rank.

The backends cannot carry them. gloo gives up on a receive from *any* source by closing every
pair it waited on, so a responder cannot wait for a request with a timeout and go on, nor tell a
dead requester from a slow one; MPI aborts the job. So under ``continue`` the small messages of
the pairwise protocol -- a request, its reply, a rank's *done* --, a rank's announcement of a
stop (``("stop", step)``: :mod:`psgdlab.runtime.loop.exchange.stopping`) and a heartbeat go through
:mod:`multiprocessing.connection` (the standard library's authenticated, framed TCP connections),
and only the payloads through the transport.

Every message is a tuple ``(kind, step, ...)``, ``step`` its sender's local step (the survivors
say how far a dead rank got: :attr:`Mailbox.steps`).

Every rank listens on its host's address; the ranks exchange (address, key) at set-up while all
are alive (:func:`Mailbox.open`), then each connects to every other (one outgoing connection per
peer for what it sends, one incoming for what it receives). One *dispatcher* thread reads every
incoming connection (:func:`multiprocessing.connection.wait`, which a timeout does not disturb)
and files each message: requests in one queue for the responder, replies in one queue per peer
for the active side, *done* in a set, a stop to the listener of stops (:meth:`Mailbox.listen_stops`).
A heartbeat thread sends a beat to every peer several times per deadline.

A peer is *lost*, and ``on_lost(peer, reason, silent_s)`` called (once per peer, on a thread of
its own, so that writing the membership -- a file and its fsync, slow on a busy disk -- never
stalls the reading), when

- its connection ends before the run's end was announced (:meth:`Mailbox.finish`): the process
  died, whatever killed it -- seen at once, on any host;
- nothing came from it for ``deadline_s`` (a stopped process, a host cut off) and nothing of its
  waits unread (a dispatcher that was itself held up does not take its own delay for the peer's
  silence).

Ranks close their mailbox only after the run's summary is written, so an ended connection before
that is always a death.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

from psgdlab.core.errors import TransportError

__all__ = ["Mailbox", "BEATS_PER_DEADLINE", "address_toward"]

log = logging.getLogger(__name__)

#: heartbeats sent to each peer per deadline (a peer silent for a whole deadline is lost)
BEATS_PER_DEADLINE = 10
_POLL_S = 0.1


def address_toward(host: str) -> str:
    """This machine's address on the route to ``host`` (the interface the kernel would send from:
    what a peer on that network reaches this process at; ``127.0.0.1`` toward the loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # a datagram socket's connect sends nothing: it only picks the route
        return str(s.getsockname()[0])


class Mailbox:
    """The control connections of ``rank`` among ``n`` ranks (module docstring).

    Parameters
    ----------
    rank, n : int
    host : str
        The address this rank listens on (its host's, as the other ranks reach it).
    deadline_s : float
        Silence after which a peer is lost.
    on_lost : callable (peer, reason, silent_s) -> None
        Called once per lost peer, on the dispatcher thread.
    """

    def __init__(
        self, rank: int, n: int, *, host: str, deadline_s: float, on_lost: Callable[[int, str, float], None]
    ) -> None:
        self.rank, self.n = rank, n
        self.deadline_s = float(deadline_s)
        self.on_lost = on_lost
        self._key = os.urandom(32)
        # every peer connects at once at set-up: with multiprocessing's default backlog of 1 the
        # kernel dropped the handshake of some while the acceptor authenticated another, and a
        # peer whose connection the listener gave up waited for its challenge for ever
        self._listener = Listener((host, 0), authkey=self._key, backlog=max(n, 8))
        self._out: dict[int, Connection] = {}
        self._out_locks: dict[int, threading.Lock] = {}
        self._in: dict[Connection, int] = {}
        self.requests: queue.SimpleQueue[tuple[int, tuple] | None] = queue.SimpleQueue()
        self.replies: dict[int, queue.SimpleQueue[tuple]] = {p: queue.SimpleQueue() for p in range(n)}
        self.done: set[int] = set()
        #: each peer's announced stop step (``("stop", step)``), in the order they came
        self.stops: dict[int, int] = {}
        self._on_stop: Callable[[int, int], None] | None = None
        self._stops_lock = threading.Lock()
        self.lost: set[int] = set()
        self.heard: dict[int, float] = {}
        #: the last local step each peer said it was at (every message carries its sender's step)
        self.steps: dict[int, int] = {}
        #: this rank's current step, which its heartbeats carry
        self.step = 0
        self._finished = threading.Event()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._losses: queue.SimpleQueue[tuple[int, str, float] | None] = queue.SimpleQueue()

    @property
    def address(self) -> tuple[tuple[str, int], bytes]:
        """What the other ranks need to connect: (address, key)."""
        return self._listener.address, self._key

    def open(self, addresses: Sequence[tuple[tuple[str, int], bytes]], *, deadline_s: float) -> None:
        """Connect to every other rank (``addresses[r]``: rank ``r``'s :attr:`address`) and accept
        their connections, within ``deadline_s``; then start the dispatcher and the heartbeat.

        Raises :class:`~psgdlab.core.errors.TransportError` naming the peers this rank could not
        connect to and those that never connected to it (a peer that died or hung in set-up: the
        standard library's connections have no timeout of their own, so each connection is made on a
        thread of its own and the threads are given up at the deadline)."""
        accepted: dict[int, Connection] = {}
        errors: list[str] = []

        def accept() -> None:
            try:
                for _ in range(self.n - 1):
                    conn = self._listener.accept()
                    accepted[int(conn.recv())] = conn
            except (OSError, EOFError, AuthenticationError) as exc:  # the listener closed, a handshake failed
                errors.append(f"accepting: {exc}")

        def connect(peer: int, address: tuple[str, int], key: bytes) -> None:
            try:
                conn = Client((str(address[0]), int(address[1])), authkey=key)
                conn.send(self.rank)
            except (OSError, EOFError, AuthenticationError) as exc:
                errors.append(f"rank {peer} at {address[0]}:{address[1]}: {exc}")
                return
            self._out[peer], self._out_locks[peer] = conn, threading.Lock()

        threads = [threading.Thread(target=accept, daemon=True, name=f"psgdlab-mailbox-accept-{self.rank}")]
        threads += [
            threading.Thread(
                target=connect, args=(peer, address, key), daemon=True, name=f"psgdlab-mailbox-connect-{peer}"
            )
            for peer, (address, key) in enumerate(addresses)
            if peer != self.rank
        ]
        end = time.monotonic() + deadline_s
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(0.0, end - time.monotonic()))
        others = [p for p in range(self.n) if p != self.rank]
        unreached = [p for p in others if p not in self._out]
        silent = [p for p in others if p not in accepted]
        if unreached or silent:
            self._listener.close()  # ends the acceptor; a connecting thread ends with its process
            raise TransportError(
                f"rank {self.rank}: the mailbox's set-up did not complete in {deadline_s:g} s: "
                f"could not connect to ranks {unreached}, ranks {silent} never connected"
                + (f" ({'; '.join(errors)})" if errors else "")
            )
        now = time.monotonic()
        for peer, conn in accepted.items():
            self._in[conn] = peer
            self.heard[peer] = now
        for target, name in ((self._dispatch, "dispatch"), (self._beat, "beat"), (self._report, "report")):
            t = threading.Thread(target=target, daemon=True, name=f"psgdlab-mailbox-{name}-{self.rank}")
            t.start()
            self._threads.append(t)

    # --- sending ---
    def send(self, peer: int, message: tuple) -> bool:
        """Send ``message`` to ``peer``; False when its connection is gone (the peer died)."""
        conn = self._out.get(peer)
        if conn is None or peer in self.lost:
            return False
        try:
            with self._out_locks[peer]:
                conn.send(message)
            return True
        except (OSError, EOFError, ValueError):
            return False

    def broadcast(self, peers: Sequence[int], message: tuple) -> None:
        """Send ``message`` to each of ``peers`` (but this rank) that still listens."""
        for peer in peers:
            if peer != self.rank:
                self.send(peer, message)

    def listen_stops(self, on_stop: Callable[[int, int], None]) -> None:
        """Call ``on_stop(peer, step)`` for every stop a peer announces (on the dispatcher thread),
        those that came before first."""
        with self._stops_lock:
            self._on_stop = on_stop
            earlier = list(self.stops.items())
        for peer, step in earlier:
            on_stop(peer, step)

    def finish(self) -> None:
        """The run's end is announced (its summary is written): connections that end from now
        on are ranks leaving, not dying."""
        self._finished.set()

    def close(self) -> None:
        """Stop the threads and close every connection."""
        self._finished.set()
        self._closed.set()
        self._losses.put(None)
        for t in self._threads:
            t.join(timeout=2 * _POLL_S + self.deadline_s / BEATS_PER_DEADLINE)
        for conn in [*self._out.values(), *self._in]:
            conn.close()
        self._listener.close()

    # --- the threads ---
    def _lose(self, peer: int, reason: str) -> None:
        if peer in self.lost or peer == self.rank:
            return
        self.lost.add(peer)
        self._losses.put((peer, reason, self.silence(peer)))
        self.requests.put(None)  # the responder re-reads who it still waits for
        self.replies[peer].put(("lost",))

    def silence(self, peer: int) -> float:
        """Seconds since anything came from ``peer`` (0 before its first message)."""
        now = time.monotonic()
        return now - self.heard.get(peer, now)

    def _report(self) -> None:
        while (loss := self._losses.get()) is not None:
            try:
                self.on_lost(*loss)
            except BaseException:  # the callback's own failure must not stop the reporting
                log.exception("rank %d: handling the loss of rank %d failed", self.rank, loss[0])

    def _dispatch(self) -> None:
        while not self._closed.is_set():
            conns = list(self._in)
            ready: list[Any] = wait(conns, timeout=_POLL_S) if conns else []
            for conn in ready:
                peer = self._in[conn]
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    del self._in[conn]
                    self.heard[peer] = time.monotonic()  # alive until its connection ended
                    if not self._finished.is_set():
                        self._lose(peer, f"rank {peer} died (its connection closed)")
                    continue
                self.heard[peer] = time.monotonic()
                self.steps[peer] = max(self.steps.get(peer, 0), int(message[1]))
                self._file(peer, message)
            if self._finished.is_set():
                continue
            now = time.monotonic()
            silent = [p for p, last in self.heard.items() if p not in self.lost and now - last > self.deadline_s]
            if silent:
                waiting: list[Any] = wait([c for c, p in self._in.items() if p in silent], timeout=0)
                pending = {self._in[c] for c in waiting}
                for peer in silent:
                    if peer not in pending:  # else: read at the next turn
                        quiet = now - self.heard[peer]
                        self._lose(peer, f"rank {peer} sent nothing for {quiet:.1f} s (deadline {self.deadline_s:g} s)")

    def _file(self, peer: int, message: Any) -> None:
        kind = message[0]
        if kind == "request":
            self.requests.put((peer, message))
        elif kind == "reply":
            self.replies[peer].put(message)
        elif kind == "done":
            self.done.add(peer)
            self.requests.put(None)
        elif kind == "stop":
            with self._stops_lock:
                self.stops[peer] = int(message[1])
                on_stop = self._on_stop
            if on_stop is not None:
                on_stop(peer, int(message[1]))

    def _beat(self) -> None:
        period = self.deadline_s / BEATS_PER_DEADLINE
        while not self._closed.wait(period):
            for peer in list(self._out):
                if peer not in self.lost:
                    self.send(peer, ("beat", self.step))
