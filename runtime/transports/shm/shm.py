r"""A shared-memory data plane for the gloo transport's co-located ranks (what NCCL does in a node).

gloo moves every payload through TCP sockets, also between processes of one host, where MPICH
uses shared memory (``bench/bench_transport.py`` compares them; docs/measurements.md). Here
pairwise exchanges and allreduces between ranks of one host bypass the sockets; every other
operation, and every peer elsewhere, stays on gloo.

Segments
    At channel setup every rank creates one segment in ``/dev/shm``: a header of control words
    (below) and one data region of ``PSGDLAB_SHM_BYTES`` bytes (default 64 MiB) per channel
    (``main``, ``comm``, ``responder``), reserved with ``posix_fallocate`` so that a full
    ``/dev/shm`` is an error at setup and never a ``SIGBUS`` in a run. The ranks allgather
    (host, setting, capacity), then their segment names; each maps the segments of the peers on
    its host (read-only: a rank writes only its own) and checks their nonce and the identity of
    their process (pid and start time). A last allgather says who mapped whom -- two ranks share
    memory when each mapped the other -- and is the barrier after which every rank unlinks every
    name: from then on nothing of the run is in ``/dev/shm``, the memory lives as long as a
    mapping, and a rank killed at any later moment leaves nothing behind. (A rank killed inside
    setup, before that allgather, leaves its file until a peer that got past it unlinks it, or
    ``psgdlab train``'s launcher does after the run: :func:`~psgdlab.runtime.transports.shm.shm_sys.remove_segments`.)
    The host is :func:`~psgdlab.runtime.transports.env.host_identity`: the machine's name, or the
    emulated host the launcher named (:mod:`psgdlab.runtime.launcher.netns`), so ranks of different
    emulated hosts on one machine never share memory.

Control words, not gloo tokens
    Control travels through words of the header, each written by one process only, which waits
    on a peer's word with a futex (the thread sleeps in the kernel and wakes when the word
    changes; :mod:`psgdlab.runtime.transports.shm.shm_sys`), not through gloo messages: ProcessGroupGloo hands
    each operation to a worker thread, so a small gloo message inside an exchange can cost more
    than the payload's copy (docs/measurements.md). Waits check every 0.5 s that the awaited
    process still runs and give up after the channel's timeout, naming the rank.

Pairwise exchange (``sendrecv``, ``multi_exchange`` of :class:`~.shm_transport.SharedMemoryTransport`)
    The writer fills its slot for the reader (tag, address, size, then a sequence number) and
    bumps its post counter for that reader; the reader takes the first pending message of its
    peer with the right tag -- gloo's matching by source and tag -- copies the payload and
    acknowledges the sequence number in its own header; an exchange returns when its readers
    have acknowledged, so a payload is never overwritten before its reader is done. The copy is
    *one* copy where the kernel allows cross-memory attach between the ranks (``process_vm_readv``
    straight from the writer's tensor, as MPICH does), else two through the writer's data region
    (``PSGDLAB_SHM=copy`` forces the second way).

Allreduce (``allreduce_sum``; ``allreduce_mean`` divides the sum)
    One copy: every member publishes its tensor's address (barrier); member :math:`i` reads
    chunk :math:`i` of the others and sums the chunk in group order,
    :math:`((x_{g_0} + x_{g_1}) + x_{g_2}) + \dots` (barrier); every member reads the others'
    summed chunks (barrier); a tensor whose chunks outgrow the region (the scratch of the
    others' chunks) goes in pieces that fit it, each piece so. Two copies: every member copies
    its tensor into its region
    (barrier), then sums all of them in group order (barrier). Either way each element is summed
    in one fixed order, so results are deterministic and bit-identical on every rank (gloo's ring
    sums in an order of its own: equal to rounding).

Why nothing can deadlock that did not before
    Every message keeps its source, destination, tag and blocking behaviour: a writer's slot is
    the gloo send, the reader's take is the gloo receive (matched the same way), the barriers
    are the allreduce's own synchronisation. The acknowledgement runs between the same two
    ranks after the reader has received, so it waits only on a rank that has already entered
    the same exchange; the bipartite active/passive split and the separate ``comm`` and
    ``responder`` channels (each with its own slots and region) keep their argument.

What stays on gloo
    Peers on another host, or whose segment could not be mapped; with two copies, payloads
    larger than a data region (one copy reads in place and has no limit); allreduce dtypes other
    than integers and floats, and groups with a member on another host or not declared at setup;
    gossip with a repeated peer; any-source receives and every ``send``/``recv`` (pairwise headers,
    the parameter-server exchange); ``broadcast``, ``barrier``, ``allgather`` and
    ``gather_object``. Both sides decide from what both know (sizes, the group, the shared pairs),
    so they always take the same path. ``PSGDLAB_SHM=0`` turns the data plane off; it needs
    x86-64 Linux; NCCL and MPI never use it.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from psgdlab.core.errors import ConfigError, TransportError
from psgdlab.runtime.transports.env import host_identity
from psgdlab.runtime.transports.shm import shm_sys
from psgdlab.runtime.transports.shm.shm_sys import SHM_DIR, segment_prefix
from psgdlab.runtime.transports.transport import CHANNELS

__all__ = [
    "SharedMemoryPlane",
    "open_plane",
    "shm_settings",
    "segment_prefix",
    "SHM_ENV",
    "SHM_BYTES_ENV",
    "DEFAULT_CAPACITY_BYTES",
    "SUM_DTYPES",
]

log = logging.getLogger(__name__)

#: ``"1"`` (default): on, one copy where the kernel allows it; ``"copy"``: on, two copies; ``"0"``: off
SHM_ENV = "PSGDLAB_SHM"
#: size of each channel's data region in bytes; larger payloads go over gloo
SHM_BYTES_ENV = "PSGDLAB_SHM_BYTES"
DEFAULT_CAPACITY_BYTES = 64 * 2**20
_PAGE = 4096
_SPIN = 64  # polls of a word before sleeping on it
_CHECK_S = 0.5  # liveness check period of a sleeping wait
#: the dtypes whose allreduce goes through shared memory (others stay on gloo)
SUM_DTYPES = frozenset(
    {
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
    }
)


def shm_settings(environ: dict[str, str] | None = None) -> tuple[str, int]:
    """The data plane's mode (``"off"``, ``"auto"``, ``"copy"``) and each region's capacity in bytes.

    >>> shm_settings({"PSGDLAB_SHM": "copy"})
    ('copy', 67108864)
    """
    env = os.environ if environ is None else environ
    flag = env.get(SHM_ENV, "1")
    modes = {"0": "off", "1": "auto", "copy": "copy"}
    if flag not in modes:
        raise ConfigError(f"{SHM_ENV} ({flag!r}) must be 0, 1 or copy")
    raw = env.get(SHM_BYTES_ENV, str(DEFAULT_CAPACITY_BYTES))
    capacity = int(raw) if raw.strip().isdigit() else 0
    if capacity < 1:
        raise ConfigError(f"{SHM_BYTES_ENV} ({raw!r}) must be a positive number of bytes")
    return modes[flag], capacity


@dataclass(frozen=True, slots=True)
class _Layout:
    """Cell (int64) indices of a segment header, for ``world`` ranks and ``n_groups`` groups."""

    world: int
    n_groups: int

    def post(self, reader: int) -> int:  # messages posted to ``reader`` (any channel)
        return 8 + reader

    def slot(self, channel: int, reader: int) -> int:  # seq, tag, address, nbytes
        return 8 + self.world + 4 * (channel * self.world + reader)

    def ack(self, writer: int, channel: int) -> int:  # last seq taken from ``writer``'s channel
        return 8 + 13 * self.world + 3 * writer + channel

    def arrive(self, channel: int, group: int) -> int:  # barriers passed
        return 8 + 16 * self.world + channel * self.n_groups + group

    def address(self, channel: int, group: int) -> int:  # the allreduce's tensor
        return 8 + 16 * self.world + 3 * self.n_groups + channel * self.n_groups + group

    @property
    def header_bytes(self) -> int:
        return -(-8 * (8 + 16 * self.world + 6 * self.n_groups) // _PAGE) * _PAGE


@dataclass(eq=False)
class SharedMemoryPlane:
    """The segments this process maps, and the waits, posts and barriers on their header words.

    ``local`` holds the ranks that share memory with this one (itself included); ``groups``
    maps every group declared at setup whose members all share memory to its header index.
    ``given_up`` holds the ranks the run gave up for dead (``--on-failure continue``,
    :mod:`psgdlab.runtime.failures.survive.survivors`): a wait on one of them fails at its next check.
    """

    rank: int
    capacity_bytes: int
    single_copy: bool
    local: frozenset[int]
    groups: dict[tuple[int, ...], int]
    layout: _Layout
    timeout_s: float
    _cells: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _bases: dict[int, int] = field(default_factory=dict, repr=False)
    _regions: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _procs: dict[int, tuple[int, int]] = field(default_factory=dict, repr=False)  # rank -> (pid, start)
    _maps: list[mmap.mmap] = field(default_factory=list, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    taken: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)  # (writer, channel) -> seq
    posted: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)  # (channel, reader) -> seq
    given_up: set[int] = field(default_factory=set, repr=False)

    def region(self, rank: int, channel: int) -> torch.Tensor:
        """The data region (bytes) of ``rank``'s ``channel``."""
        start = self.layout.header_bytes + channel * self.capacity_bytes
        return self._regions[rank][start : start + self.capacity_bytes]

    def cell(self, rank: int, index: int) -> int:
        return int(self._cells[rank][index])

    def pid(self, rank: int) -> int:
        return self._procs[rank][0]

    def write_slot(self, slot: int, *, tag: int, address: int, nbytes: int, seq: int) -> None:
        """Fill this rank's message slot ``slot``: the tag, address and size, then the sequence
        number (x86 stores are seen in order, so a reader that sees the number sees the fields)."""
        cells = self._cells[self.rank]
        cells[slot + 1 : slot + 4] = (tag, address, nbytes)
        cells[slot] = seq

    def publish(self, index: int, value: int) -> None:
        """Write one of this rank's words and wake whoever sleeps on it."""
        self._cells[self.rank][index] = value
        shm_sys.futex_wake(self._bases[self.rank] + 8 * index)

    def wait(self, peer: int, index: int, done: Callable[[int], bool], what: str) -> int:
        """Wait until ``done(word)`` for word ``index`` of ``peer``; returns the word."""
        cells = self._cells[peer]
        for _ in range(_SPIN):
            value = int(cells[index])
            if done(value):
                return value
        start = check = time.monotonic()
        while not done(value):
            shm_sys.futex_wait(self._bases[peer] + 8 * index, value, _CHECK_S)
            value = int(cells[index])
            if peer in self.given_up and not done(value):  # give_up wakes this wait at once
                raise TransportError(f"rank {self.rank}: rank {peer} was given up during a shared-memory {what}")
            now = time.monotonic()
            if now - check >= _CHECK_S and not done(value):
                check = now
                if not shm_sys.is_alive(*self._procs[peer]):
                    raise TransportError(f"rank {self.rank}: rank {peer} died during a shared-memory {what}")
                if now - start > self.timeout_s:
                    raise TransportError(
                        f"rank {self.rank}: rank {peer} did not answer a shared-memory {what} "
                        f"within {self.timeout_s:.0f} s"
                    )
        return value

    def read(self, peer: int, local_address: int, remote_address: int, nbytes: int, what: str) -> None:
        """Copy ``nbytes`` of ``peer``'s memory (cross-memory attach); a peer that died meanwhile
        is a :class:`TransportError` naming it, as in :meth:`wait`."""
        try:
            shm_sys.cma_read(self.pid(peer), local_address, remote_address, nbytes)
        except OSError as exc:
            raise TransportError(f"rank {self.rank}: rank {peer} died during a shared-memory {what} ({exc})") from exc

    def give_up(self, peer: int) -> None:
        """Count ``peer`` as dead (:attr:`given_up`) and wake this process's waits on its words,
        which then fail at once instead of at their next liveness check."""
        if peer in self.given_up or peer not in self._bases:
            self.given_up.add(peer)
            return
        self.given_up.add(peer)
        for index in range(self.layout.header_bytes // 8):
            shm_sys.futex_wake(self._bases[peer] + 8 * index)

    def barrier(self, channel: int, group: tuple[int, ...]) -> None:
        """Every member of ``group`` has reached this point of ``channel``'s operation."""
        index = self.layout.arrive(channel, self.groups[group])
        mine = self.cell(self.rank, index) + 1
        self.publish(index, mine)
        for peer in group:
            if peer != self.rank:  # a member may already be one barrier further
                self.wait(peer, index, lambda v: v >= mine, "allreduce")

    def close(self) -> None:
        """Drop the mappings (the memory goes with the last process that maps it)."""
        self._regions.clear()
        self._cells.clear()
        for mm in self._maps:
            try:
                mm.close()
            except BufferError:  # a view is still alive: the process exit frees it
                pass
        self._maps.clear()


def open_plane(
    ctrl: Any, *, rank: int, world_size: int, groups: Sequence[tuple[int, ...]], timeout_s: float
) -> SharedMemoryPlane | None:
    """Create, exchange, map and unlink the segments of every rank (collective over ``ctrl``).

    Returns None when the data plane is off on some rank, unsupported, or this rank has no
    segment; ``groups`` are the sub-groups of the channels (the world is added).
    """
    mode, capacity = shm_settings()
    infos: list[Any] = [None] * world_size
    dist.all_gather_object(infos, (host_identity(), mode, capacity, shm_sys.SUPPORTED), group=ctrl)
    if world_size < 2 or any(i[1] == "off" or not i[3] for i in infos):
        return None
    all_groups = sorted({tuple(g) for g in groups if len(g) > 1} | {tuple(range(world_size))})
    layout = _Layout(world=world_size, n_groups=len(all_groups))
    plane = SharedMemoryPlane(
        rank=rank,
        capacity_bytes=min(i[2] for i in infos),
        single_copy=False,
        local=frozenset({rank}),
        groups={},
        layout=layout,
        timeout_s=timeout_s,
    )
    size = layout.header_bytes + len(CHANNELS) * plane.capacity_bytes
    path = str(SHM_DIR / f"{segment_prefix(os.getpid())}{secrets.token_hex(6)}")
    names: list[Any] = [None] * world_size
    mine: Any = None
    try:
        try:
            mine = _create(plane, path, size)
        except OSError as exc:
            log.warning("rank %d: no shared-memory segment (%s); its payloads go over gloo", rank, exc)
        dist.all_gather_object(names, mine, group=ctrl)
        mapped, cma = _map_peers(plane, names, infos, size) if mine is not None else (set(), set())
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, (sorted(mapped), sorted(cma)), group=ctrl)  # the barrier before unlinking
    finally:
        for name in [path] + [entry[0] for entry in names if entry is not None]:
            _unlink(name)
    if mine is None:
        plane.close()
        return None
    shares = {r: {p for p in everyone[r][0] if r in everyone[p][0]} | {r} for r in range(world_size)}
    plane.local = frozenset(shares[rank])
    plane.groups = {g: i for i, g in enumerate(all_groups) if all(set(g) <= shares[r] for r in g)}
    plane.single_copy = all(i[1] == "auto" for i in infos) and all(
        p in everyone[r][1] for r in range(world_size) for p in shares[r] - {r}
    )
    if len(plane.local) > 1:
        log.info(
            "rank %d: shared-memory data plane with ranks %s (%d MiB per channel, %s copy)",
            rank,
            sorted(plane.local),
            plane.capacity_bytes // 2**20,
            "one" if plane.single_copy else "two",
        )
    return plane


def _create(plane: SharedMemoryPlane, path: str, size: int) -> tuple[str, bytes, int, int, int]:
    """Create and map this rank's segment; returns what peers need to map and check it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)  # reserve now: a full /dev/shm fails here, not with SIGBUS later
        mm = mmap.mmap(fd, size)
    except OSError:
        _unlink(path)
        raise
    finally:
        os.close(fd)
    nonce = secrets.token_bytes(16)
    pid = os.getpid()
    started = shm_sys.start_time(pid) or 0
    _attach(plane, plane.rank, mm, pid, started)
    mm[:16] = nonce
    return path, nonce, pid, started, plane._bases[plane.rank]


def _attach(plane: SharedMemoryPlane, rank: int, mm: mmap.mmap, pid: int, started: int) -> None:
    cells = np.frombuffer(mm, dtype=np.int64, count=plane.layout.header_bytes // 8)
    with warnings.catch_warnings():  # peers' segments are mapped read-only, and only read
        warnings.simplefilter("ignore", UserWarning)
        plane._regions[rank] = torch.frombuffer(mm, dtype=torch.uint8)
    plane._maps.append(mm)
    plane._cells[rank] = cells
    plane._bases[rank] = int(cells.ctypes.data)
    plane._procs[rank] = (pid, started)


def _map_peers(plane: SharedMemoryPlane, names: list[Any], infos: list[Any], size: int) -> tuple[set[int], set[int]]:
    """Map the segment of every peer on this host; returns the peers mapped, and those whose
    memory this process can also read directly (cross-memory attach)."""
    mapped, cma = set(), set()
    probe = np.zeros(16, dtype=np.uint8)
    for peer, entry in enumerate(names):
        if peer == plane.rank or entry is None or infos[peer][0] != infos[plane.rank][0]:
            continue
        path, nonce, pid, started, base = entry
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            if mm[:16] != nonce or not shm_sys.is_alive(pid, started):
                mm.close()
                raise OSError(f"{path} is not rank {peer}'s segment, or its process is not visible from here")
        except (OSError, ValueError) as exc:  # another host with our host name, another /dev/shm or pid space
            log.info("rank %d: cannot map rank %d's segment (%s); their payloads go over gloo", plane.rank, peer, exc)
            continue
        _attach(plane, peer, mm, pid, started)
        mapped.add(peer)
        try:
            shm_sys.cma_read(pid, int(probe.ctypes.data), base, 16)
            if probe.tobytes() == nonce:
                cma.add(peer)
        except OSError as exc:  # Yama ptrace_scope >= 1, a seccomp filter: two copies
            log.info("rank %d: no cross-memory attach to rank %d (%s)", plane.rank, peer, exc)
    return mapped, cma


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
