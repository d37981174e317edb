r"""The cost model of communication, written once: forward for the simulator, inverted for the fits.

Every law here prices one exchange on links described by a latency :math:`\alpha` (seconds) and a
bandwidth :math:`\beta` (bytes per second, per direction), for ``S`` bytes of model:

- **allreduce** over ``n`` ranks (:func:`allreduce_s`): every schedule moves
  :math:`2(n-1)/n \cdot S` per rank (:func:`allreduce_bytes`) in :math:`R(n)` latency rounds
  (:func:`allreduce_rounds`), :math:`t = 2(n-1)/n \cdot S/\beta + R(n)\,\alpha`;
- **a ring whose members arrive apart** (:func:`ring_allreduce_after_arrivals`): the chunks
  that do not hold a late member's contribution go round before it arrives, so the ring's slow
  edges (those between hosts) have less left to carry once it does;
- **allgather** of ``m`` shards (:func:`allgather_s`): the allgather half of an allreduce,
  :math:`(m-1)/m \cdot S/\beta + \lfloor R(m)/2 \rfloor\,\alpha`;
- **point to point** (a pairwise transfer, a server message; :func:`transfer_s`):
  :math:`t = \alpha + S/\beta`;
- **fair sharing** of links by concurrent transfers (:func:`max_min_rates`): each transfer moves
  at its max-min fair rate over the links it crosses (progressive filling), as TCP flows
  through one rate limit do;
- **host averaging** (:func:`host_average_s`): reading two models and writing one,
  :math:`3S` bytes at host memory bandwidth (a CPU average of a pairwise exchange, a server's
  update);
- **parameter server** (:func:`server_s`): :math:`\alpha + S/\beta + o` (+ the host update);
- **host work** of a step (:func:`host_work_s`): :math:`a + bS` (the fold of an averaged model,
  the merge of a pairwise one, the step overhead);
- **host CPU** (:func:`cpu_work_s`, :func:`cpu_stretch_s`): a worker that sends ``m`` messages
  of ``B`` bytes in all spends :math:`W = m\,w_m + B\,w_b` of CPU; when ``k`` processes of a
  host with ``c`` cores hold CPU work, an exchange takes :math:`\max(0, k/c - 1)\,W` longer
  inside a host, and :math:`\max(0, kW/c - \max(W, w))` longer across a wire that its copies
  overlap for :math:`w`.

The fits read the same laws backwards: each law is linear in its unknowns, and the ``*_terms``
functions give the coefficients of those unknowns (a row of the least-squares design matrix):
:func:`allreduce_terms`, :func:`allgather_terms` and :func:`transfer_terms` for :math:`(\alpha, 1/\beta)`,
:func:`cpu_stretch_terms` for :math:`(w_m, w_b)`; :func:`allreduce_group_size` recovers a group
from the bytes a rank sent. They accept numpy arrays where they take sizes.

Examples
--------
>>> round(allreduce_s(8, 172.5e6, 12.5e9, 0.0) * 1e3, 1)  # ALGORITHMS.md D.4: 24.2 ms
24.2
>>> a, b = allreduce_terms(8, 172.5e6)
>>> a * 0.0 + b / 12.5e9 == allreduce_s(8, 172.5e6, 12.5e9, 0.0)
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import numpy as np

from psgdlab.core.errors import require

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "AllreduceAlgorithm",
    "HOST_AVERAGE_TRAFFIC",
    "allreduce_rounds",
    "allreduce_messages",
    "allreduce_bytes",
    "allreduce_s",
    "allreduce_terms",
    "allreduce_group_size",
    "ring_allreduce_after_arrivals",
    "allgather_s",
    "allgather_terms",
    "transfer_s",
    "transfer_terms",
    "max_min_rates",
    "host_average_s",
    "server_s",
    "host_work_s",
    "cpu_work_s",
    "cpu_stretch_s",
    "cpu_stretch_terms",
]

#: how an implementation's allreduce is scheduled, which sets how its latency grows with the group
#: (every one moves :math:`2(n-1)/n \cdot S` per rank, :func:`allreduce_bytes`):
#: ``ring`` -- reduce-scatter then allgather around a ring, :math:`2(n-1)` rounds (NCCL's ring,
#: gloo's allreduce); ``halving-doubling`` -- recursive halving then doubling (Rabenseifner; MPICH
#: and Open MPI for large messages), :math:`2\lceil\log_2 n\rceil` rounds; ``direct`` -- every member
#: reads its chunk of every other member's buffer and then the others' reduced chunks, two rounds
#: whatever ``n`` (one host's shared memory: psgdlab's data plane, ASTRA-sim's "direct")
ALLREDUCE_ALGORITHMS = ("ring", "halving-doubling", "direct")
AllreduceAlgorithm: TypeAlias = Literal["ring", "halving-doubling", "direct"]

#: bytes of host memory traffic per byte of model when a host averages two models (or a server
#: applies a message to its model): read both, write one
HOST_AVERAGE_TRAFFIC = 3.0


# ----- allreduce ----------------------------------------------------------------------------------
def allreduce_rounds(n: int, algorithm: str = "ring") -> int:
    """Latency rounds of an allreduce over ``n`` ranks (:data:`ALLREDUCE_ALGORITHMS`; 0 for one).

    >>> [allreduce_rounds(8, a) for a in ALLREDUCE_ALGORITHMS]
    [14, 6, 2]
    >>> {allreduce_rounds(2, a) for a in ALLREDUCE_ALGORITHMS}  # alike for a pair
    {2}
    """
    require(
        algorithm in ALLREDUCE_ALGORITHMS,
        "allreduce algorithm",
        algorithm,
        f"must be one of {', '.join(ALLREDUCE_ALGORITHMS)}",
    )
    if n <= 1:
        return 0
    if algorithm == "ring":
        return 2 * (n - 1)
    if algorithm == "halving-doubling":
        return 2 * (n - 1).bit_length()  # 2 ceil(log2 n)
    return 2


def allreduce_messages(n: int, algorithm: str = "ring") -> int:
    """Messages one rank sends (or, ``direct``, reads) in an allreduce over ``n`` ranks: the
    rounds, except ``direct``, which reads from each of the other :math:`n-1` members twice.

    >>> [allreduce_messages(8, a) for a in ALLREDUCE_ALGORITHMS]
    [14, 6, 14]
    """
    rounds = allreduce_rounds(n, algorithm)
    return 2 * (n - 1) if algorithm == "direct" else rounds


def allreduce_bytes(n: Any, payload_bytes: Any) -> Any:
    r"""Bytes one rank sends in an allreduce of ``payload_bytes`` over ``n`` ranks,
    :math:`2(n-1)/n \cdot S` (a float; :func:`psgdlab.core.exchange.wire_bytes` gives the integer
    count a trace records). Arrays broadcast.

    >>> allreduce_bytes(4, 1000.0)
    1500.0
    """
    return 2.0 * (n - 1) / n * payload_bytes


def allreduce_s(
    n: int, payload_bytes: float, bandwidth_bytes_per_s: float, latency_s: float, algorithm: str = "ring"
) -> float:
    r"""Allreduce time :math:`2(n-1)/n \cdot S/\beta + R(n)\,\alpha` with :math:`R` =
    :func:`allreduce_rounds` (0 for one member).

    >>> round(allreduce_s(4, 0.0, 1e9, 1e-3, "direct") * 1e3, 1), round(allreduce_s(4, 0.0, 1e9, 1e-3) * 1e3, 1)
    (2.0, 6.0)
    """
    rounds = allreduce_rounds(n, algorithm)
    if rounds == 0:
        return 0.0
    return float(allreduce_bytes(n, payload_bytes) / bandwidth_bytes_per_s + rounds * latency_s)


def allreduce_terms(n: Any, payload_bytes: Any, algorithm: str = "ring") -> tuple[Any, Any]:
    r"""Coefficients of :math:`(\alpha, 1/\beta)` in :func:`allreduce_s`: ``(R(n), 2(n-1)/n S)``
    (``n`` an int or an array of group sizes).

    >>> allreduce_terms(np.array([2.0, 4.0]), 1000.0)
    (array([2., 6.]), array([1000., 1500.]))
    """
    rounds: Any
    if np.ndim(n):
        rounds = np.array([allreduce_rounds(int(k), algorithm) for k in np.asarray(n).ravel()], dtype=float)
        rounds = rounds.reshape(np.shape(n))
    else:
        rounds = allreduce_rounds(int(n), algorithm)
    return rounds, allreduce_bytes(n, payload_bytes)


def allreduce_group_size(sent_bytes: Any, payload_bytes: float) -> Any:
    r"""The group size ``n`` of an allreduce in which one rank sent ``sent_bytes`` of a
    ``payload_bytes`` model: :math:`2(n-1)/n \cdot S = w \Rightarrow n = 2 / (2 - w/S)`, rounded,
    at least 2 (arrays broadcast).

    >>> allreduce_group_size(np.array([1000.0, 1500.0, 1750.0]), 1000.0)
    array([2., 4., 8.])
    """
    return np.rint(2.0 / np.maximum(2.0 - sent_bytes / payload_bytes, 1e-9)).clip(2, None)


def ring_allreduce_after_arrivals(ahead_s: Sequence[float], slow: Sequence[bool], step_s: float) -> tuple[float, float]:
    r"""What a ring allreduce has left when its last member arrives: ``(seconds, done)``, the time
    from that arrival to the end and the fraction of the slow edges' work done before it (the
    chunks they moved, a chunk under way counted in part).

    Member ``i`` arrived ``ahead_s[i] >= 0`` seconds before the last (0 for the last) and sends
    to member ``i + 1`` (modulo ``n``, the ring's order); that edge moves one chunk in ``step_s``
    when ``slow[i]`` (an edge between hosts, the link class that bounds the ring) and at once
    otherwise (an edge inside a host, much faster). The ring runs :math:`2(n-1)` steps
    (reduce-scatter then allgather); step ``k`` on edge ``i`` ends at

    .. math::
        f_{i,k} = \max(a_i, f_{i,k-1}, f_{i-1,k-1}) + \tau_i

    (member ``i`` has arrived, the edge has sent step :math:`k-1`, and member ``i`` has received
    step :math:`k-1` from edge :math:`i-1`). The longest path through these dependencies gives it
    in closed form on a slow edge ``e``: :math:`f_{e,k} = \tau(k+1) + \max_{h \le k}(a_{e-h} -
    \tau\,m_{e,h})`, with :math:`m_{e,h}` the fast edges among :math:`e-h, \dots, e` (a path
    lingers on slow edges and crosses fast ones at once). So a chunk that does not yet hold a
    late member's contribution moves before it arrives, and where the slow edges are only some
    of the ring they have fewer chunks left once it does: :math:`2(n-1) - d` steps for a late
    member :math:`d` fast edges upstream of a slow one. With every edge slow (one member per
    host) or every member on time it is the ring's own :math:`2(n-1)` steps (:func:`allreduce_s`
    with ``step_s`` its time over :math:`2(n-1)`).

    >>> ring_allreduce_after_arrivals([0.0, 0.0, 0.0, 0.0], [False, True, False, True], 1.0)
    (6.0, 0.0)
    >>> ring_allreduce_after_arrivals([9.0, 0.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0], [False, False, False, True] * 2, 1.0)
    (12.0, 0.2857142857142857)
    >>> ring_allreduce_after_arrivals([9.0, 0.0, 9.0, 9.0], [True] * 4, 1.0)[0]  # all slow: no head start
    6.0
    """
    n = len(ahead_s)
    require(len(slow) == n and n >= 2, "ring", n, "needs one edge per member and at least 2 members")
    slow_edges = np.asarray(slow, dtype=bool)
    if step_s <= 0.0 or not slow_edges.any():
        return 0.0, 0.0
    arrive = -np.asarray(ahead_s, dtype=float)
    ends = np.flatnonzero(slow_edges)
    upstream = (ends[:, None] - np.arange(n)[None, :]) % n  # member e - h, for each slow edge e
    fast = np.cumsum(~slow_edges[upstream], axis=1)  # m_{e,h}
    best = np.maximum.accumulate(arrive[upstream] - step_s * fast, axis=1)
    steps = 2 * (n - 1)
    k = np.arange(steps)
    f = step_s * (k + 1) + best[:, np.minimum(k, n - 1)]
    before = float(np.clip(step_s - f, 0.0, step_s).sum())
    return float(f[:, -1].max()), before / (steps * len(ends) * step_s)


def allgather_s(
    m: int, payload_bytes: float, bandwidth_bytes_per_s: float, latency_s: float, algorithm: str = "ring"
) -> float:
    r"""Allgather of ``m`` shards of a ``payload_bytes`` model: the allgather half of an allreduce,
    :math:`(m-1)/m \cdot S/\beta + \lfloor R(m)/2 \rfloor\,\alpha` (ring: :math:`m-1` rounds).
    A reduce-scatter, the other half, moves the same bytes in the same rounds.

    >>> allgather_s(4, 4000.0, 1000.0, 1.0)
    6.0
    """
    rounds, sent = allgather_terms(m, payload_bytes, algorithm)
    return float(sent / bandwidth_bytes_per_s + rounds * latency_s)


def allgather_terms(m: Any, payload_bytes: Any, algorithm: str = "ring") -> tuple[Any, Any]:
    r"""Coefficients of :math:`(\alpha, 1/\beta)` in :func:`allgather_s` (and a reduce-scatter):
    ``(floor(R(m)/2), (m-1)/m S)``, half of :func:`allreduce_terms`'s (``m`` an int or an array).

    >>> allgather_terms(np.array([2.0, 4.0]), 1000.0)
    (array([1., 3.]), array([500., 750.]))
    """
    rounds, sent = allreduce_terms(m, payload_bytes, algorithm)
    return rounds // 2, sent / 2


# ----- point to point, host averaging, server -----------------------------------------------------
def transfer_s(nbytes: Any, bandwidth_bytes_per_s: Any, latency_s: Any) -> Any:
    r"""One transfer of ``nbytes``, :math:`\alpha + S/\beta` (arrays broadcast).

    >>> transfer_s(1e6, 1e9, 1e-4)
    0.0011
    """
    return latency_s + nbytes / bandwidth_bytes_per_s


def transfer_terms(nbytes: Any) -> tuple[Any, Any]:
    r"""Coefficients of :math:`(\alpha, 1/\beta)` in :func:`transfer_s`: ``(1, S)``."""
    return np.ones_like(nbytes, dtype=float) if np.ndim(nbytes) else 1.0, nbytes


def max_min_rates(paths: Sequence[Sequence[int]], capacity: float, caps: Sequence[float]) -> list[float]:
    r"""Max-min fair rates of transfers sharing links of ``capacity`` bytes/s each: transfer ``i``
    crosses the links ``paths[i]`` and moves at most ``caps[i]``. Progressive filling: every
    transfer's rate rises together until a link is full or a transfer reaches its cap, and
    those transfers keep their rate while the others go on rising; so no link carries more
    than its capacity, and no transfer can go faster without slowing one that is no faster.

    Links that carry the same transfers (a NIC's two directions under transfers that go both
    ways) fill alike, step for step: one of them stands for all.

    >>> max_min_rates([(0, 1), (0, 2), (1,)], 6.0, [9.0, 9.0, 1.0])  # link 0 splits; 1 keeps its cap
    [3.0, 3.0, 1.0]
    >>> max_min_rates([(0, 1), (1, 2), (2, 3)], 6.0, [9.0, 9.0, 9.0])  # links 1 and 2 each carry two
    [3.0, 3.0, 3.0]
    """
    n = len(paths)
    rates = [0.0] * n
    users: dict[int, list[int]] = {}
    for i, path in enumerate(paths):
        for link in path:
            held = users.get(link)
            if held is None:
                users[link] = [i]
            else:
                held.append(i)
    alike: dict[tuple[int, ...], int] = {}  # a link's users -> the link that stands for all that carry them
    members: list[list[int]] = []  # per standing link: its users
    stands: dict[int, int] = {}  # a standing link -> its index
    for link, held in users.items():
        key = tuple(held)
        if key not in alike:
            alike[key] = link
            stands[link] = len(members)
            members.append(held)
    on = [[stands[link] for link in path if link in stands] for path in paths]  # standing links per transfer
    room = [capacity] * len(members)
    count = [len(held) for held in members]  # free transfers per standing link
    alive = list(range(len(members)))  # standing links that carry a free transfer
    free = [True] * n
    left = n
    full = 1e-12 * capacity
    by_cap = sorted(range(n), key=caps.__getitem__)  # the free transfer with the least cap is at lo
    lo = 0
    level = 0.0
    while left:
        while not free[by_cap[lo]]:
            lo += 1
        step = caps[by_cap[lo]] - level
        for j in alive:
            share = room[j] / count[j]
            if share < step:
                step = share
        level += max(step, 0.0)
        done = []
        for i in by_cap[lo:]:  # those at their cap: a cap within 1e-9 of the level, at most
            if caps[i] > level * (1.0 + 1e-9):
                break
            if free[i] and caps[i] - level <= 1e-12 * caps[i]:
                done.append(i)
        for j in alive:
            x = room[j] = room[j] - step * count[j]
            if x <= full:
                done.extend(members[j])
        emptied = False
        for i in done:
            if free[i]:
                free[i] = False
                left -= 1
                rates[i] = level
                for j in on[i]:
                    k = count[j] = count[j] - 1
                    if not k:
                        emptied = True  # no free transfer left on it
        if emptied:
            alive = [j for j in alive if count[j]]
    return rates


def host_average_s(nbytes: Any, memory_bandwidth_bytes_per_s: Any) -> Any:
    r"""A host averaging two models of ``nbytes`` (or a server applying a message to its model):
    :data:`HOST_AVERAGE_TRAFFIC` :math:`\cdot S` bytes at host memory bandwidth."""
    return HOST_AVERAGE_TRAFFIC * nbytes / memory_bandwidth_bytes_per_s


def server_s(
    nbytes: float, bandwidth_bytes_per_s: float, latency_s: float, service_overhead_s: float, update_s: float = 0.0
) -> float:
    r"""One parameter-server request of ``nbytes`` each way (message and reply overlap: full
    duplex), :math:`\alpha + S/\beta + o` plus the server's update ``update_s``
    (:func:`host_average_s` when it applies updates on the host)."""
    return latency_s + nbytes / bandwidth_bytes_per_s + service_overhead_s + update_s


def host_work_s(fixed_s: float, per_byte_s: float, nbytes: float) -> float:
    """Host work affine in the model size, :math:`a + bS` (the fold of an averaged model, the
    merge of a pairwise one, a step's overhead)."""
    return fixed_s + per_byte_s * nbytes


# ----- host CPU -----------------------------------------------------------------------------------
def cpu_work_s(messages: float, nbytes: float, work_per_message_s: float, work_per_byte_s: float) -> float:
    r"""CPU work of one worker that sends ``messages`` messages of ``nbytes`` bytes in all,
    :math:`m\,w_m + B\,w_b`."""
    return messages * work_per_message_s + nbytes * work_per_byte_s


def cpu_stretch_s(holders: float, cores: int, work_s: float, wire_s: float = 0.0) -> float:
    r"""How much longer an exchange takes when ``holders`` processes of a host of ``cores`` cores
    hold CPU work: :math:`\max(0, kW/c - \max(W, w))`. Processor sharing stretches the CPU
    work ``W`` to :math:`kW/c`; ``wire_s`` (:math:`w`) is the exchange's time on a wire that
    its CPU work overlaps (a NIC: the copies into and out of the sockets run while the bytes
    are on the wire; 0 inside a host, where the copies are the transfer). So inside a host
    the stretch is :math:`\max(0, k/c - 1)\,W`, nothing below ``c`` holders, and between hosts
    the CPU costs time only where the shared cores are slower than the wire.

    >>> cpu_stretch_s(4, 2, 1.0), cpu_stretch_s(1, 2, 1.0), cpu_stretch_s(4, 2, 1.0, wire_s=1.5)
    (1.0, 0.0, 0.5)
    """
    return max(0.0, holders / cores * work_s - max(work_s, wire_s))


def cpu_stretch_terms(n: Any, payload_bytes: Any, cores: int, algorithm: str = "ring") -> tuple[Any, Any]:
    r"""Coefficients of :math:`(w_m, w_b)` in the stretch of an allreduce over ``n`` workers of
    one host with ``cores`` cores (more workers than cores):
    :math:`(n/c - 1)\,M(n)` and :math:`(n/c - 1) \cdot 2(n-1)/n \cdot S` with :math:`M` =
    :func:`allreduce_messages` (``n`` an array of group sizes)."""
    n = np.asarray(n, dtype=float)
    over = n / cores - 1.0
    messages = np.array([allreduce_messages(int(k), algorithm) for k in n.ravel()], dtype=float).reshape(n.shape)
    return over * messages, over * allreduce_bytes(n, payload_bytes)
