"""The simulator's kernel (sim.engine.kernel): where its calls run among simpy's events."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.sim.engine.kernel import CountingEnvironment, Flows, Soon
from psgdlab.sim.network import FairLinks


def _instant(start: Callable[[simpy.Environment, list[str], str], None]) -> list[str]:
    """An instant with two events, the first with two callbacks: each event's first callback
    starts something (``start``) that logs its name when it first runs; a later timer of the
    same instant logs too."""
    env = simpy.Environment()
    log: list[str] = []
    first, second = env.timeout(1.0), env.timeout(1.0)
    first.callbacks += [lambda _: (log.append("a"), start(env, log, "x")), lambda _: log.append("b")]
    second.callbacks.append(lambda _: (log.append("c"), start(env, log, "y"), start(env, log, "z")))
    env.timeout(1.0).callbacks.append(lambda _: log.append("d"))
    env.run()
    return log


def test_soon_calls_run_where_processes_started_then_would_first_run():
    """After the callbacks of the event that asked, ahead of the instant's other events, in
    the order asked: a process's start, without one event per call."""

    def process(env: simpy.Environment, log: list[str], name: str) -> None:
        def body() -> Any:
            log.append(name)
            yield env.timeout(0.0)

        env.process(body())

    soons: dict[int, Soon] = {}

    def soon(env: simpy.Environment, log: list[str], name: str) -> None:
        soons.setdefault(id(env), Soon(env)).call(lambda _: log.append(name))

    assert _instant(soon) == _instant(process) == ["a", "b", "x", "c", "y", "z", "d"]


def _ends(joins: list[tuple[float, tuple[int, ...], float]], by_event: bool) -> list[tuple[int, float]]:
    """Each flow's end (in the order they end) when the flows of ``joins`` (from when, links,
    bytes) join one Flows, waited on through join's events or through join_then's calls."""
    env = simpy.Environment()
    flows = Flows(env, FairLinks(1e9))
    ends: list[tuple[int, float]] = []

    def join(i: int, links: tuple[int, ...], nbytes: float) -> None:
        if by_event:
            flows.join(links, nbytes, math.inf).callbacks.append(lambda ev: ends.append((i, ev.value)))
        else:
            flows.join_then(links, nbytes, math.inf, lambda: ends.append((i, env.now)))

    for i, (at, links, nbytes) in enumerate(joins):
        env.timeout(at).callbacks.append(lambda _, i=i, links=links, nbytes=nbytes: join(i, links, nbytes))
    env.run()
    return ends


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.7]),
            st.sampled_from([(0,), (0, 1), (1, 2), (3,), (0, 1, 2, 3)]),
            st.sampled_from([1e8, 5e8, 1e9, 2e9]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_join_then_calls_back_when_and_in_the_order_join_s_events_succeed(joins):
    """join_then is join without the event: the same ends, in the same order."""
    assert _ends(joins, by_event=False) == _ends(joins, by_event=True)


def test_a_join_that_moves_no_first_end_sets_no_timer():
    """Two transfers on links of their own: the later one, ending after the first, leaves the
    timer in force; the first's end sets the timer for the second's."""
    env = CountingEnvironment()
    flows = Flows(env, FairLinks(1.0))
    ends: list[float] = []
    flows.join_then((0,), 1.0, 1.0, lambda: ends.append(env.now))  # ends at 1
    before = env.scheduled
    flows.join_then((1,), 3.0, 1.0, lambda: ends.append(env.now))  # ends at 3
    assert env.scheduled == before  # no timer: the one for t = 1 stays in force
    flows.join_then((2,), 0.5, 1.0, lambda: ends.append(env.now))  # ends at 0.5, first
    assert env.scheduled == before + 1
    env.run()
    assert ends == [0.5, 1.0, 3.0]
