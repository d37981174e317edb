"""What the parts of one simulation share (:mod:`psgdlab.sim.engine`).

- :class:`CountingEnvironment`: the simpy environment, counting the events it schedules
  (:attr:`~psgdlab.sim.engine.SimResult.events`);
- :class:`Context`: the environment, the network, the payload's sizes and the trace rows (``None``
  when the simulation keeps none);
- :class:`Merges`: when each worker's foreign merges complete, and how many have (staleness);
- :class:`Flows`: simpy events over a :class:`~psgdlab.sim.network.FairLinks` (the NICs' transfers,
  the shares of processes that carry two averages at once);
- :class:`Scatter`: each worker's draws of the ``scatter`` factors of its exchanges, made only
  where the platform gives a link one;
- :func:`release_after`: one timer that resumes a group of waiting processes;
- :class:`Soon`: calls made where a simpy process started now would first run.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from psgdlab.sim.network import FairLinks, Network

__all__ = ["CountingEnvironment", "Context", "Merges", "Flows", "Scatter", "Soon", "release_after"]

_schedule = simpy.Environment.schedule


class CountingEnvironment(simpy.Environment):
    """A simpy environment that counts the events it schedules."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(
        self, event: simpy.Event, priority: simpy.events.EventPriority = simpy.events.NORMAL, delay: float = 0
    ) -> None:
        self.scheduled += 1
        _schedule(self, event, priority, delay)


class Context:
    """One simulation's environment, network, payload and trace rows.

    ``S`` is the payload in bytes (the model, or a gradient of its size), ``n_params`` and
    ``itemsize`` what :func:`~psgdlab.core.exchange.wire_bytes` counts from; ``rows`` collects the
    trace's tuples in :data:`~psgdlab.core.records.trace.TRACE_DTYPE` order, or is ``None`` when the
    simulation records nothing."""

    __slots__ = ("S", "env", "itemsize", "n_params", "net", "rows")

    def __init__(
        self, env: simpy.Environment, net: Network, *, n_params: int, itemsize: int, payload_bytes: float, record: bool
    ) -> None:
        self.env = env
        self.net = net
        self.n_params = n_params
        self.itemsize = itemsize
        self.S = float(payload_bytes)
        self.rows: list[tuple[Any, ...]] | None = [] if record else None


class Merges:
    """The foreign merges of each worker (pairwise averages on either side, gossip merges): the
    times of those still to complete, sorted, and the count of those completed. A worker's
    staleness is the count's growth between reading its weights and applying its gradient."""

    __slots__ = ("done", "queue")

    def __init__(self, n: int) -> None:
        self.queue: list[deque[float]] = [deque() for _ in range(n)]
        self.done = [0] * n

    def add(self, r: int, t: float) -> None:
        """A merge into ``r`` completing at ``t``."""
        queue = self.queue[r]
        if queue and queue[-1] > t:
            bisect.insort(queue, t)
        else:
            queue.append(t)

    def count(self, r: int, t: float) -> int:
        """The merges into ``r`` completed by ``t`` (asked at non-decreasing times for each worker)."""
        queue = self.queue[r]
        done = self.done[r]
        while queue and queue[0] <= t:
            queue.popleft()
            done += 1
        self.done[r] = done
        return done


class Flows:
    """Simpy events over a :class:`~psgdlab.sim.network.FairLinks`: :meth:`join` starts a flow
    and returns an event that succeeds, with the time, when it has gone through (or calls back
    then, :meth:`join_then`); the next departure is one timer, voided whenever a flow joins or
    leaves and moves it (a timer that would go off when the one in force does is not set)."""

    __slots__ = ("at", "env", "events", "key", "links", "timer")

    def __init__(self, env: simpy.Environment, links: FairLinks) -> None:
        self.env = env
        self.links = links
        self.events: dict[int, Any] = {}  # a flow's event, or what to call when it is through
        self.key = 0
        self.timer: simpy.Event | None = None  # the timer in force (a join or a departure voids the earlier one)
        self.at = math.inf  # when it goes off

    def join(self, links: tuple[int, ...], amount: float, cap: float) -> simpy.Event:
        """A flow of ``amount`` over ``links`` at most ``cap`` a second, from now."""
        ev = simpy.Event(self.env)
        self.join_then(links, amount, cap, ev)
        return ev

    def join_then(self, links: tuple[int, ...], amount: float, cap: float, then: Any) -> None:
        """:meth:`join`, calling ``then()`` when the flow is through (``then`` a simpy event: it
        succeeds with the time, as :meth:`join`'s). The flows that leave together are called in
        the order they ended, once the next timer is set: where their events would have resumed
        them, except that they run before, not after, what else was already due at that very
        instant (nothing in the simulator's cases: a flow's end is its own float)."""
        key = self.key = self.key + 1
        self.events[key] = then
        self._ended(self.links.add(key, links, amount, cap, self.env.now))

    def _ended(self, ended: list[tuple[int, float]]) -> None:
        events = self.events
        calls = []
        for key, end in ended:
            then = events.pop(key)
            if type(then) is simpy.Event:
                then.succeed(end)
            else:
                calls.append(then)
        t = self.links.next_end()
        if t < math.inf:
            env = self.env
            delay = max(0.0, t - env.now)
            at = env.now + delay  # when a timer set now goes off (simpy's own sum)
            if self.timer is None or at != self.at:  # the timer in force, if any, goes off then already
                timer = self.timer = env.timeout(delay)
                timer.callbacks.append(self._timer)
                self.at = at
        else:
            self.timer = None
        for then in calls:
            then()

    def _timer(self, timer: simpy.Event) -> None:
        if timer is self.timer:
            self.timer = None  # gone off
            self._ended(self.links.advance(self.env.now))


class Scatter:
    """Each worker's draws of its exchanges' ``scatter`` factors (:attr:`Link.scatter
    <psgdlab.core.platform.profile.Link>`), from its own stream: worker ``r`` draws from
    ``numpy.random.default_rng([seed, streams[r], 0x5CA7])``. A simulation makes one only where
    a link of its platform has a scatter (:attr:`Network.scatters
    <psgdlab.sim.network.Network.scatters>`); without, every exchange takes its law."""

    __slots__ = ("_streams",)

    def __init__(self, seed: int, streams: Sequence[int]) -> None:
        self._streams = [np.random.default_rng([seed, int(x), 0x5CA7]) for x in streams]

    def draw(self, q: tuple[float, ...], r: int) -> float:
        """A draw from the quantiles ``q``, linear between them, from ``r``'s stream; 1 (and no
        draw) without them."""
        if not q:
            return 1.0
        x = float(self._streams[r].random()) * (len(q) - 1)
        i = min(int(x), len(q) - 2)
        return q[i] + (q[i + 1] - q[i]) * (x - i)


def release_after(env: simpy.Environment, waiting: simpy.Event, delay: float) -> simpy.Event:
    """A timeout ``delay`` from now that resumes, in the order they began to wait, the processes
    waiting on ``waiting`` (the group's earlier arrivals), then whoever yields it (the last one):
    one event for the whole group, scheduled now, so the group leaves at the same place among
    simultaneous events as a timeout of the last arrival's would."""
    timeout = env.timeout(delay)
    timeout.callbacks.extend(waiting.callbacks)
    waiting.callbacks.clear()
    return timeout


class _Urgent(simpy.Event):
    """An event that has happened and is processed ahead of every event of this instant not
    already urgent: simpy's urgent priority, which a process's start event (``Initialize``)
    has. Triggered on creation, as simpy's own ``Timeout`` and ``Initialize`` are: by setting
    the event's ``_ok`` and ``_value`` as they do, which simpy has no public call for (its
    ``succeed`` schedules at normal priority); pyproject.toml holds simpy below 4.2 for it, and
    tests/sim/test_kernel.py checks the order it keeps."""

    def __init__(self, env: simpy.Environment) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, simpy.events.URGENT)


class Soon:
    """Calls made where a simpy process started now would first run: once the callbacks of the
    event being processed are done, ahead of every other event of this instant. One event
    carries every call asked for before it runs, in the order asked (the processes' start
    events would have run back to back there, nothing else being urgent)."""

    __slots__ = ("calls", "env")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.calls: list[Any] = []

    def call(self, fn: Any) -> None:
        """Call ``fn(None)`` soon (class docstring)."""
        if not self.calls:
            _Urgent(self.env).callbacks.append(self._run)
        self.calls.append(fn)

    def _run(self, _: simpy.Event) -> None:
        calls, self.calls = self.calls, []
        for fn in calls:
            fn(None)
