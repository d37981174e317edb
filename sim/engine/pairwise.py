"""Pairwise averages in the simulator: each process's two lanes, and the averages that queue on them.

An active pairwise average of ``r`` with ``peer`` (AD-PSGD, H-ADPSGD's nodes) runs on ``r``'s
communication thread (its *active lane*) and on ``peer``'s responder (its *passive lane*); each
lane carries one average at a time, in arrival order. Where no process of the schedule is active
in one average and passive in another (the fixed ring, H-ADPSGD), a process has one lane for
both (:func:`both_sides`). An average begins when both its lanes are free, takes its link's law
(:meth:`Network.pair_average_s <psgdlab.sim.network.Network.pair_average_s>`) times a draw from
the link's ``scatter`` (none: the law), and merges into both models at its end (:class:`Merges
<psgdlab.sim.engine.kernel.Merges>`).

A lane is free from a time, or when the :class:`Pending` average holding it ends. With service
times known when a request is made, the lanes are analytical FIFO queues: an average inside a
host costs no simpy event. An average between hosts has no service time known in advance -- its
bytes share the NICs with transfers that join later (:class:`~psgdlab.sim.network.FairLinks`)
-- nor has one on a schedule whose processes are active and passive at once -- its work shares
its processes with averages that join later (a second :class:`~psgdlab.sim.network.FairLinks`,
one link a process, capacity 1) -- so it, and any average queued behind it, runs as a chain of
callbacks of the events that end its steps (:class:`_Chain`), where a simpy process of it would
run, and the worker waits on its end (:class:`Pending`).
"""

from __future__ import annotations

import functools
from typing import Any

import simpy

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.exchange import ExchangeKind, PairwiseAverage, wire_bytes
from psgdlab.core.records.trace import PHASES
from psgdlab.sim.engine.deaths import Deaths
from psgdlab.sim.engine.kernel import Context, Flows, Merges, Scatter, Soon
from psgdlab.sim.network import FairLinks

__all__ = ["Pending", "PairwiseAverages", "both_sides", "gathers"]

_COMM = PHASES["comm"]
_K_PAIR = int(ExchangeKind.PAIRWISE)
_NAN = float("nan")


class Pending:
    """A pairwise average whose end is not known when it is asked for: ``end`` is set when it
    ends. :meth:`wait` gives an event that succeeds then (made only for those that wait)."""

    __slots__ = ("_done", "end")

    def __init__(self) -> None:
        self.end: float | None = None
        self._done: simpy.Event | None = None

    def wait(self, env: simpy.Environment) -> simpy.Event:
        """An event that succeeds when the average ends (it has not yet)."""
        if self._done is None:
            self._done = simpy.Event(env)
        return self._done

    def finish(self, end: float) -> None:
        self.end = end
        if self._done is not None:
            self._done.succeed()


def gathers(r: int, ex: PairwiseAverage) -> int:
    """The slices whose allgather inside the node follows ``r``'s exchange ``ex``: all of them
    after the last slice ``r`` averages in the step (one per member between equal nodes; a member
    of the smaller of two unequal nodes averages several, :func:`~psgdlab.core.graphs.membership.survivor_exchanges`),
    none after the others; 1 when ``r`` averages the whole model itself.

    >>> slice_ = lambda j: PairwiseAverage(peer=9, active=True, shard=j, n_shards=3, gather_group=(4, 5))
    >>> [gathers(4, slice_(0)), gathers(4, slice_(2)), gathers(5, slice_(1))]  # rank 4 averages slices 0 and 2
    [1, 3, 3]
    """
    group = ex.gather_group
    if not group:
        return 1
    k, i = len(group), group.index(r)
    last = i + k * ((ex.n_shards - 1 - i) // k)
    return ex.n_shards if ex.shard == last else 1


@functools.lru_cache(maxsize=256)
def both_sides(algorithm: Algorithm, steps: int) -> bool:
    """Whether some process of ``algorithm``'s schedule is active in one pairwise average and
    passive in another (AD-PSGD's random ring; not its fixed ring, whose processes keep their
    side), over its first ``steps`` steps (callers pass at most 64: a schedule's pattern shows
    by then). Cached: a prediction simulates one schedule with many seeds."""
    active, passive = set(), set()
    for s in range(steps):
        for r in range(algorithm.n_workers):
            for ex in algorithm.exchanges(s, r):
                if type(ex) is PairwiseAverage and ex.active:
                    active.add(r)
                    passive.add(ex.peer)
        if active & passive:
            return True
    return False


def _end(x: float | Pending) -> float:
    """When a lane held by ``x`` is free."""
    if type(x) is Pending:
        assert x.end is not None
        return x.end
    return x  # type: ignore[return-value]


class PairwiseAverages:
    """The pairwise averages of one simulation (module docstring).

    Parameters
    ----------
    ctx : Context
    merges : Merges
        Where an average's merge into both sides is booked.
    wires : Flows
        The NICs' transfers (shared with gossip's).
    shares_process : bool
        Whether a process carries its active and its passive average at once, at fair shares of
        it (:func:`both_sides`); otherwise one lane a process.
    sums : list of bool
        Per rank, whether its node shares the slices of its averages through the gradient
        allreduce (``continue``'s node protocol): then no allgather follows them.
    scatter : Scatter or None
        The draws of the links' scatter; ``None``: no link has one.
    deaths : Deaths or None
        The simulation's deaths; ``None``: nobody dies.
    """

    __slots__ = (
        "_bytes",
        "_cpu",
        "_host",
        "_soon",
        "ctx",
        "deaths",
        "lane",
        "merges",
        "passive",
        "scatter",
        "shares_process",
        "sums",
        "wires",
    )

    def __init__(
        self,
        ctx: Context,
        merges: Merges,
        wires: Flows,
        *,
        shares_process: bool,
        sums: list[bool],
        scatter: Scatter | None,
        deaths: Deaths | None,
    ) -> None:
        n = len(sums)
        self.ctx = ctx
        self.merges = merges
        self.wires = wires
        self.shares_process = shares_process
        self.sums = sums
        self.scatter = scatter
        self.deaths = deaths
        self._host = ctx.net.placement.host
        # a lane is free from a time (float) or when the Pending average holding it ends
        self.lane: list[Any] = [0.0] * n
        self.passive: list[Any] = [0.0] * n if shares_process else self.lane
        self._cpu = Flows(ctx.env, FairLinks(1.0)) if shares_process else None  # the processes' shares
        self._bytes: dict[int, int] = {}  # wire bytes of an average by its number of shards
        self._soon = Soon(ctx.env)

    def start(self, r: int, ex: PairwiseAverage, t: float, s: int, phase: int) -> float | Pending:
        """Start ``r``'s active average ``ex`` of step ``s`` at ``t``, queued behind the averages
        on its lanes, and record it (``phase``: ``overlap`` from its start, ``comm`` from ``t``).
        Returns its end, or a :class:`Pending` when that is not known yet."""
        peer = ex.peer
        lane, passive = self.lane, self.passive
        mine, theirs = lane[r], passive[peer]
        if (
            type(mine) is not float
            or type(theirs) is not float
            or self.shares_process
            or self._host[r] != self._host[peer]
        ):
            h = Pending()
            lane[r] = passive[peer] = h
            self._later(r, ex, t, s, phase, mine, theirs, h)
            return h
        start = max(t, mine, theirs)
        if self.deaths is not None:
            return self._start_with_deaths(r, ex, t, s, phase, start)
        ctx = self.ctx
        nbytes = self._bytes.get(ex.n_shards) or self._nbytes(ex)
        gather = 1 if self.sums[r] or not ex.gather_group else gathers(r, ex)
        dur = ctx.net.pair_average_s(r, peer, nbytes, start, gather, ctx.S)
        if self.scatter is not None:
            dur *= self.scatter.draw(ctx.net.pair_scatter(r, peer), r)
        end = start + dur
        self.merges.add(r, end)
        self.merges.add(peer, end)
        rows = ctx.rows
        if rows is not None:
            rows.append((r, s, phase, _K_PAIR, t if phase == _COMM else start, end, peer, nbytes, -1, _NAN))
        lane[r] = passive[peer] = end
        return end

    def _start_with_deaths(self, r: int, ex: PairwiseAverage, t: float, s: int, phase: int, start: float) -> float:
        """:meth:`start` of an average inside a host, its lanes free from ``start``, in a run
        where workers die: with a peer known dead nothing is averaged (and the lanes stay)."""
        peer = ex.peer
        assert self.deaths is not None
        if start >= self.deaths.detect[peer]:  # a peer known dead: nothing to average with
            return self._settle(r, ex, s, phase, t, start, start)[0]
        ctx = self.ctx
        dur = ctx.net.pair_average_s(r, peer, self._nbytes(ex), start, gather=self._gather(r, ex), model_bytes=ctx.S)
        if self.scatter is not None:
            dur *= self.scatter.draw(ctx.net.pair_scatter(r, peer), r)
        end, merged = self._settle(r, ex, s, phase, t, start, start + dur)
        self.lane[r] = end
        if merged:
            self.passive[peer] = end
        return end

    def _later(
        self, r: int, ex: PairwiseAverage, t: float, s: int, phase: int, mine: Any, theirs: Any, h: Pending
    ) -> None:
        """Run an average whose end is not known when it is asked for (:class:`_Chain`), from
        where a simpy process of it started now would first run."""
        self._soon.call(_Chain(self, r, ex, t, s, phase, mine, theirs, h).lanes)

    def _settle(
        self, r: int, ex: PairwiseAverage, s: int, phase: int, t: float, start: float, end: float
    ) -> tuple[float, bool]:
        """Close ``r``'s average ``ex`` of step ``s``, asked for at ``t``, begun at ``start``, its
        transfer over at ``end`` (``start`` itself when the peer was known dead: nothing was
        sent): merge it into both sides unless the peer died first (:meth:`Deaths.pair_outcome
        <psgdlab.sim.engine.deaths.Deaths.pair_outcome>`), and record it. Returns its end and whether
        it merged."""
        peer = ex.peer
        merged = True
        deaths = self.deaths
        if deaths is not None:
            end, merged = deaths.pair_outcome(peer, start, end)
            if merged and deaths.tracked:
                deaths.share(r, peer, start, end)
        if merged:
            self.merges.add(r, end)
            self.merges.add(peer, end)
        rows = self.ctx.rows
        if rows is not None:
            nbytes = self._nbytes(ex) if merged else 0
            rows.append((r, s, phase, _K_PAIR, t if phase == _COMM else start, end, peer, nbytes, -1, _NAN))
        return end, merged

    def _gather(self, r: int, ex: PairwiseAverage) -> int:
        """Shards of the allgather after ``r``'s average ``ex`` (1: none; a node that sums its
        slices with the gradient has none, :func:`gathers` otherwise)."""
        return 1 if self.sums[r] else gathers(r, ex)

    def _nbytes(self, ex: PairwiseAverage) -> int:
        nbytes = self._bytes.get(ex.n_shards)
        if nbytes is None:
            ctx = self.ctx
            nbytes = self._bytes[ex.n_shards] = wire_bytes(ex, ctx.n_params, ctx.itemsize)[0]
        return nbytes


class _Chain:
    """An average whose end is not known when it is asked for, step by step: it waits for the
    averages ahead of it on its lanes, then (between hosts) for its device-to-host copies, its
    bytes' time on the NICs at their fair share, the path's latency, its CPU work's stretch, the
    host average and copies back, its scatter (past its bytes' time), and the allgather after
    it. Where processes are shared what follows the bytes -- inside a host, the whole average --
    is work of both processes at their fair shares.

    Each step is a callback of the event that ends the step before, where a simpy process of
    the average would resume (its bytes' end is called from the NICs' timer,
    :meth:`~psgdlab.sim.engine.kernel.Flows.join_then`), and the first runs where the
    process's start would (:class:`~psgdlab.sim.engine.kernel.Soon`): the same steps at the
    same places among simultaneous events, without a process (its generator, its start event
    for each average, its end event)."""

    __slots__ = (
        "avgs",
        "end",
        "ex",
        "gather",
        "h",
        "mine",
        "nbytes",
        "phase",
        "r",
        "s",
        "start",
        "t",
        "theirs",
        "wired",
    )

    def __init__(
        self,
        avgs: PairwiseAverages,
        r: int,
        ex: PairwiseAverage,
        t: float,
        s: int,
        phase: int,
        mine: Any,
        theirs: Any,
        h: Pending,
    ) -> None:
        self.avgs = avgs
        self.r, self.ex, self.t, self.s, self.phase = r, ex, t, s, phase
        self.mine, self.theirs, self.h = mine, theirs, h
        self.start = self.end = 0.0
        self.nbytes = self.gather = 0
        self.wired: tuple[float, float, float] = (0.0, 0.0, 0.0)  # before, cap, after

    def lanes(self, _: Any) -> None:
        """Wait for the averages ahead on both lanes, then until the later of their ends."""
        env = self.avgs.ctx.env
        for x in (self.mine, self.theirs):
            if type(x) is Pending and x.end is None:
                x.wait(env).callbacks.append(self.lanes)
                return
        start = self.start = max(self.t, _end(self.mine), _end(self.theirs))
        if start > env.now:
            env.timeout(start - env.now).callbacks.append(self.begin)
        else:
            self.begin(None)

    def begin(self, _: Any) -> None:
        """The average from its start: nothing with a peer known dead; between hosts the copies
        before its bytes; inside a host the whole of it."""
        avgs = self.avgs
        ctx = avgs.ctx
        env, net, r, ex = ctx.env, ctx.net, self.r, self.ex
        peer = ex.peer
        deaths = avgs.deaths
        if deaths is not None and self.start >= deaths.detect[peer]:
            self.settle(None)
            return
        nbytes, gather = self.nbytes, self.gather = avgs._nbytes(ex), avgs._gather(r, ex)
        if avgs._host[r] != avgs._host[peer]:
            before = net.pair_before_wire(r, peer, nbytes, self.start)
            self.wired = (before, 0.0, 0.0)
            if before > 0.0:
                env.timeout(before).callbacks.append(self.wire)
            else:
                self.wire(None)
            return
        dur = net.pair_average_s(r, peer, nbytes, self.start, gather=gather, model_bytes=ctx.S)
        if avgs.scatter is not None:
            dur *= avgs.scatter.draw(net.pair_scatter(r, peer), r)
        self._work(dur)

    def wire(self, _: Any) -> None:
        """The bytes go on the NICs."""
        ctx = self.avgs.ctx
        links, cap, after = ctx.net.wire(self.r, self.ex.peer, self.nbytes, ctx.env.now)
        self.wired = (self.wired[0], cap, after)
        self.avgs.wires.join_then(links, self.nbytes, cap, self.unwired)

    def unwired(self) -> None:
        """The bytes are through: what follows them."""
        avgs = self.avgs
        ctx = avgs.ctx
        net, r, peer, nbytes = ctx.net, self.r, self.ex.peer, self.nbytes
        before, cap, after = self.wired
        now = ctx.env.now
        after += net.pair_after_wire(r, peer, nbytes, now + after)
        if avgs.scatter is not None:
            factor = avgs.scatter.draw(net.pair_scatter(r, peer), r)
            if factor != 1.0:  # the law is the whole average; the bytes' time stays
                after = max(0.0, after + (factor - 1.0) * (before + nbytes / cap + after))
        if self.gather > 1:
            after += net.allgather_s(r, self.gather, ctx.S, now + after)
        self._work(after)

    def _work(self, dur: float) -> None:
        """``dur`` of work of both processes: at their fair shares where they are shared."""
        avgs = self.avgs
        cpu = avgs._cpu
        if cpu is not None:
            cpu.join_then((self.r, self.ex.peer), dur, 1.0, self.settle)
        else:
            avgs.ctx.env.timeout(dur).callbacks.append(self.settle)

    def settle(self, _: Any = None) -> None:
        """Close the average (:meth:`PairwiseAverages._settle`); a request to a peer that died
        first hangs until its deadline."""
        avgs = self.avgs
        env = avgs.ctx.env
        end = self.end = avgs._settle(self.r, self.ex, self.s, self.phase, self.t, self.start, env.now)[0]
        if end > env.now:
            env.timeout(end - env.now).callbacks.append(self.free)
        else:
            self.free(None)

    def free(self, _: Any) -> None:
        """Free the lanes that nothing is queued on behind it, and wake who waits."""
        avgs, end, h = self.avgs, self.end, self.h
        for lane, x in ((avgs.lane, self.r), (avgs.passive, self.ex.peer)):
            if lane[x] is h:  # nothing queued behind it: the lane is free from its end
                lane[x] = end
        h.finish(end)
