"""Exchanges that wait for others in the simulator: collectives, gossip rounds, the server queue.

- :class:`Collectives`: an allreduce or a barrier is a rendezvous of its group; the last member
  to arrive prices it (:meth:`Network.allreduce_s <psgdlab.sim.network.Network.allreduce_s>`,
  from the members' arrival times; inside a host times a draw from ``platform.collective``'s
  ``scatter``; a model allreduce then folds the mean into each member) and one timer releases
  the whole group (:func:`~psgdlab.sim.engine.kernel.release_after`).
- :class:`GossipRounds`: after its compute a worker waits for its neighbours to reach the same
  step, then exchanges with all of them (inside a host at the links' snapshot share, between
  hosts on the NICs at their fair share), and merges.
- :class:`ServerQueue`: the parameter server serves one request at a time in arrival order, an
  analytical FIFO queue (a ``busy_until`` time), and counts its versions (staleness).

Each keeps its waits apart so that a death's detection can release them
(:meth:`Collectives.release`, :meth:`GossipRounds.release`).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, cast

import simpy

from psgdlab.core.exchange import AllReduce, Barrier, ExchangeKind, Gossip, wire_bytes
from psgdlab.core.platform.failure import STEP_CHECK_ELEMENTS, node_sum_elements
from psgdlab.core.records.trace import PHASES, SERVER_PEER
from psgdlab.sim.engine.deaths import Deaths
from psgdlab.sim.engine.kernel import Context, Flows, Merges, Scatter, release_after

__all__ = ["Collectives", "GossipRounds", "ServerQueue", "ALLREDUCE", "BARRIER"]

_COMM = PHASES["comm"]
_WAIT = PHASES["wait"]
_NAN = float("nan")
ALLREDUCE = int(ExchangeKind.ALLREDUCE)
BARRIER = int(ExchangeKind.BARRIER)
_K_GOSSIP = int(ExchangeKind.GOSSIP)
_K_SERVER = int(ExchangeKind.SERVER)


class Collectives:
    """Allreduces and barriers (module docstring). ``sums[r]``: whether ``r``'s node sums the
    slices of its averages with its gradient (``continue``'s node protocol): its gradient
    allreduce then carries :func:`~psgdlab.core.platform.failure.node_sum_elements` elements."""

    __slots__ = ("_bytes", "ctx", "deaths", "gathering", "scatter", "sum_bytes", "sum_elements", "sums")

    def __init__(self, ctx: Context, *, sums: list[bool], scatter: Scatter | None, deaths: Deaths | None) -> None:
        self.ctx = ctx
        self.sums = sums
        self.scatter = scatter
        self.deaths = deaths
        self.sum_elements = node_sum_elements(ctx.n_params)
        self.sum_bytes = 2 * ctx.S + STEP_CHECK_ELEMENTS * ctx.itemsize
        # gathering: (kind, payload, first member, members, step) -> (release, group, arrival times)
        self.gathering: dict[tuple[Any, ...], tuple[simpy.Event, tuple[int, ...], dict[int, float]]] = {}
        self._bytes: dict[tuple[int, int, bool], int] = {}  # a member's record: (kind, group size, summed)

    def run(self, r: int, s: int, ex: AllReduce | Barrier, kind: int) -> Generator[simpy.Event, Any, None]:
        """``r``'s part of collective ``ex`` (``kind``: :data:`ALLREDUCE` or :data:`BARRIER`)
        of step ``s``: arrive, wait for the group, record it (phase ``comm`` from the arrival)."""
        group = ex.group
        deaths = self.deaths
        if deaths is not None:
            group = deaths.alive(group)
        if len(group) <= 1:
            return
        env = self.ctx.env
        payload = ex.payload if kind == ALLREDUCE else ""  # type: ignore[union-attr]
        key = (kind, payload, group[0], len(group), s)
        entry = self.gathering.get(key)
        if entry is None:
            entry = self.gathering[key] = (simpy.Event(env), group, {})
        ev, _group, times = entry
        t_arr = times[r] = env.now
        summed = payload == "grad" and self.sums[r]  # the node's slices ride with the gradient
        if len(times) == len(group):
            del self.gathering[key]
            size = 0.0 if kind != ALLREDUCE else self.sum_bytes if summed else self.ctx.S
            ev = release_after(env, ev, self.duration(kind, payload, group, size, tuple(times[g] for g in group)))
        yield ev
        if deaths is not None and payload == "grad" and deaths.tracked:
            deaths.cover(r, env.now, s + 1)  # the group holds this step's gradient
        rows = self.ctx.rows
        if rows is not None:
            rows.append((r, s, _COMM, kind, t_arr, env.now, -1, self._nbytes(ex, kind, summed), -1, _NAN))

    def duration(self, kind: int, payload: str, group: tuple[int, ...], size: float, times: tuple[float, ...]) -> float:
        """How long a collective over ``group`` takes from now, its last member's arrival
        (``times``: each member's): the allreduce times a draw from its ``scatter`` (from the
        first member's stream), then for a model allreduce the fold of the mean into each member."""
        ctx = self.ctx
        net, now = ctx.net, ctx.env.now
        dur = net.allreduce_s(group, size, now, times)
        if kind == ALLREDUCE:
            if self.scatter is not None:
                dur *= self.scatter.draw(net.allreduce_scatter(group), group[0])
            if payload == "model":
                dur += net.model_average_s(group, ctx.S, now + dur)
        return dur

    def release(self, newly: set[int], detected: set[int]) -> None:
        """The dead are known: a collective whose other members are all waiting runs over them;
        the others wait for their living members only."""
        env = self.ctx.env
        for key, (ev, group, times) in list(self.gathering.items()):
            living = tuple(g for g in group if g not in detected)
            if living == group:
                continue
            del self.gathering[key]
            here = {a: t for a, t in times.items() if a not in detected}
            kind, payload, _first, _size, step = key
            if len(here) == len(living):  # every survivor of the group is waiting: go
                size = self.ctx.S if kind == ALLREDUCE else 0.0
                arrived = tuple(here[g] for g in living)
                dur = self.duration(kind, payload, living, size, arrived) if len(living) > 1 else 0.0
                release_after(env, ev, dur)
            else:
                self.gathering[(kind, payload, living[0], len(living), step)] = (ev, living, here)

    def _nbytes(self, ex: AllReduce | Barrier, kind: int, summed: bool) -> int:
        key = (kind, len(ex.group), summed)
        nbytes = self._bytes.get(key)
        if nbytes is None:
            ctx = self.ctx
            elements = self.sum_elements if summed else ctx.n_params
            nbytes = self._bytes[key] = wire_bytes(ex, elements, ctx.itemsize)[0]
        return nbytes


#: a worker that has reached a gossip step nobody waits on yet
_ARRIVED = object()


class GossipRounds:
    """D-PSGD's blocking gossip (module docstring)."""

    __slots__ = ("arrive", "ctx", "deaths", "merges", "wires")

    def __init__(self, ctx: Context, merges: Merges, wires: Flows, *, deaths: Deaths | None) -> None:
        self.ctx = ctx
        self.merges = merges
        self.wires = wires
        self.deaths = deaths
        # (rank, step) -> an event its neighbours wait on, or _ARRIVED once it is there
        self.arrive: dict[tuple[int, int], Any] = {}

    def run(self, r: int, s: int, ex: Gossip) -> Generator[simpy.Event, Any, None]:
        """``r``'s gossip ``ex`` of step ``s``: wait for its neighbours, exchange, merge, record."""
        ctx = self.ctx
        env, net, arrive = ctx.env, ctx.net, self.arrive
        t_arr = env.now
        key = (r, s)
        ev = arrive.get(key)
        if ev is not None:
            ev.succeed()  # neighbours wait on it
        arrive[key] = _ARRIVED
        deaths = self.deaths
        detected = deaths.detected if deaths is not None else ()
        peers = ex.peers
        if detected:
            peers = tuple(j for j in peers if j not in detected)
        waits = []
        for j in peers:
            e = arrive.get((j, s))
            if e is None:
                e = arrive[(j, s)] = simpy.Event(env)
            if e is not _ARRIVED and not e.triggered:
                waits.append(e)
        if waits:
            yield simpy.AllOf(env, waits)
        start = env.now
        end = start
        S = ctx.S
        wires = []
        for j in peers:
            if j in detected:  # a peer found dead while waiting sends nothing
                continue
            if net.crosses(r, j):  # on the NICs at their fair share, then the path's latency
                links, cap, after = net.wire(r, j, S, start, both_ways=False)  # j sends its own
                wires.append((self.wires.join(links, S, cap), after))
            else:
                end = max(end, start + net.transfer_s(r, j, S, start))
        if wires:
            yield simpy.AllOf(env, [w for w, _ in wires])
            end = max(end, *(cast(float, w.value) + after for w, after in wires))  # each value: when it left the NICs
        if end > env.now:
            yield env.timeout(end - env.now)
        if deaths is not None and r in deaths.tracked:
            deaths.shares[r].append((start, env.now))
        self.merges.add(r, env.now)
        arrive.pop((r, s - 2), None)
        rows = ctx.rows
        if rows is not None:
            sent = wire_bytes(ex, ctx.n_params, ctx.itemsize)[0]
            rows.append((r, s, _COMM, _K_GOSSIP, t_arr, env.now, -1, sent, -1, _NAN))

    def release(self, newly: set[int], detected: set[int]) -> None:
        """The dead are known: a neighbour waiting on one of ``newly`` goes on without it."""
        for (j, _s), ev in list(self.arrive.items()):
            if j in newly and ev is not _ARRIVED and not ev.triggered:
                ev.succeed()


class ServerQueue:
    """The parameter server (module docstring): one request at a time in arrival order, on host 0."""

    __slots__ = ("busy_until", "ctx", "last_pull", "per_request", "service_s", "version")

    def __init__(self, ctx: Context, n: int) -> None:
        self.ctx = ctx
        self.busy_until = 0.0
        self.version = 0
        self.last_pull = [0] * n
        self.per_request = ctx.net.server_per_request
        self.service_s = ctx.net.server_s(ctx.S)  # the same for every request without per_request

    def run(self, r: int, s: int) -> Generator[simpy.Event, Any, int]:
        """``r``'s request of step ``s``: queued (phase ``wait``), served (``comm``); returns the
        staleness of its pull (server updates since ``r``'s last one)."""
        ctx = self.ctx
        env = ctx.env
        now = env.now
        start = max(now, self.busy_until)
        end = start + (ctx.net.server_s(ctx.S, rank=r, start=start) if self.per_request else self.service_s)
        self.busy_until = end
        stale = self.version - self.last_pull[r]
        self.version += 1
        self.last_pull[r] = self.version
        rows = ctx.rows
        if rows is not None:
            if start > now:
                rows.append((r, s, _WAIT, _K_SERVER, now, start, SERVER_PEER, 0, -1, _NAN))
            rows.append((r, s, _COMM, _K_SERVER, start, end, SERVER_PEER, int(ctx.S), -1, _NAN))
        yield env.timeout(end - now)
        return stale
