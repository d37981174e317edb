"""What a rank of a gossip run needs to go on without dead peers (``--on-failure continue``).

:class:`Survivors` ties three pieces together for the driver:

- the membership every survivor agrees on (:class:`~psgdlab.runtime.failures.survive.agreement.Agreement`, epochs
  in the run directory, owned by no rank);
- the control messages and the detection (:class:`~psgdlab.runtime.failures.survive.mailbox.Mailbox`: a peer whose
  connection ends is dead at once, one silent for the deadline is given up);
- the schedule over the survivors: :func:`psgdlab.core.graphs.membership.rebuild` of the algorithm's
  :meth:`~psgdlab.core.algorithms.Algorithm.membership_topology` over the newest epoch, and
  :func:`~psgdlab.core.graphs.membership.survivor_exchanges` of each step (the simulator's rule, so the
  prediction of ``psgdlab predict --fail`` and the run follow one schedule);
- the collectives over groups the survivors form alone (:attr:`Survivors.groups`,
  :class:`~psgdlab.runtime.failures.survive.regroup.SurvivorGroups`): an H-ADPSGD node that lost a GPU.

When a peer is lost the survivor that sees it first writes the next epoch; the others read it at
their next step or exchange. A lost peer is also given up by the shared-memory plane
(:attr:`~psgdlab.runtime.transports.shm.shm.SharedMemoryPlane.given_up`), so a payload exchange blocked on a
stopped process returns an error instead of waiting for the backend's timeout.

The pairwise protocol under ``continue`` (:mod:`psgdlab.runtime.loop.driver`): the active side sends
``("request", step, epoch)``; the passive side refreshes its membership and replies
``("reply", step, ok, epoch)`` -- ``ok`` false when the requester is no longer a member (it was given up
for dead: fenced) -- and only then do both move the payload. A request of a slice (nodes of several
GPUs) ends with ``shard, n_shards, weight``: both average slice ``shard`` of ``n_shards``
(:func:`~psgdlab.runtime.loop.scan.shard_bounds`), the requester's node weighted ``1 - weight``, so the
two sides use the sizes the requester saw. So two ranks exchange only while
both are members of the newest epoch either of them has read. A rank sends ``("done", step)`` to every
member after its last step; its responder serves until every member still alive is done.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.algorithms.base import Algorithm
from psgdlab.core.errors import TransportError
from psgdlab.core.exchange import Exchange, Gossip
from psgdlab.core.graphs.membership import Rebuilt, rebuild, survivor_exchanges, without_peers
from psgdlab.core.records.rundir import SUMMARY_FILE
from psgdlab.runtime.failures.survive.agreement import MEMBERSHIP_DIR, Agreement, Epoch, Removed
from psgdlab.runtime.failures.survive.mailbox import Mailbox

__all__ = [
    "Survivors",
    "Removed",
    "SURVIVOR_RESULTS_DIR",
    "SWITCH_AFTER_WORKERS",
    "clear_previous_segment",
    "continuing_path",
    "survivor_throughput",
    "work_lost",
]

#: a blocking gossip's epoch switches schedules this many times the workers (plus 2) steps after
#: its proposer's step (:attr:`Survivors.switch_after`)
SWITCH_AFTER_WORKERS = 2

#: under the run directory: each survivor's result at the end of a ``continue`` run
SURVIVOR_RESULTS_DIR = "results"

log = logging.getLogger(__name__)


def continuing_path(ranks_dir: str | Path, rank: int) -> Path:
    """``RANKS_DIR/rank{r}.continuing``: written by a rank once it has joined the survivors'
    membership (its mailbox connected to every other); until every rank has, a death stops the
    run (the set-up's rendezvous needs every rank)."""
    return Path(ranks_dir) / f"rank{rank}.continuing"


def clear_previous_segment(run_dir: Path) -> None:
    """Remove what an earlier run in ``run_dir`` (the segment before a ``--resume``) left of its
    membership, its survivors' results and its summary: read as this run's, its epochs would fence
    ranks that are alive and its summary would end this run's survivors before they finish. Rank 0
    calls it during the set-up, while every rank waits at the rendezvous."""
    for name in (MEMBERSHIP_DIR, SURVIVOR_RESULTS_DIR):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    (run_dir / SUMMARY_FILE).unlink(missing_ok=True)


class Survivors:
    """The membership of ``rank``'s run in ``run_dir`` (module docstring).

    Parameters
    ----------
    algorithm : Algorithm
        A gossip algorithm (its :meth:`membership_topology` is not None).
    rank : int
    run_dir : Path
    deadline_s : float
        Silence after which a peer is given up (``--timeout``).
    host : str
        The address other ranks reach this one at.
    origin : float
        The run's start (wall clock): membership changes are timed from it.
    plane : SharedMemoryPlane, optional
        The shared-memory plane, whose waits on a given-up peer end at once.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        *,
        rank: int,
        run_dir: Path,
        deadline_s: float,
        host: str,
        origin: float,
        plane: Any = None,
    ) -> None:
        topology = algorithm.membership_topology()
        if topology is None:
            raise ValueError(f"{algorithm.name} has no topology to rebuild over survivors")
        self.alg = algorithm
        self.rank = rank
        self.topology = topology
        self.origin = origin
        self.plane = plane
        self.agreement = Agreement(run_dir, algorithm.n_workers, rank)
        self.mailbox = Mailbox(rank, algorithm.n_workers, host=host, deadline_s=deadline_s, on_lost=self._on_lost)
        #: the groups of survivors this rank's collectives run over once a member of a group made
        #: at start-up has died (their rendezvous files beside the epochs)
        # regroup imports torch, which the launcher (importing this module for continuing_path) does without
        from psgdlab.runtime.failures.survive.regroup import GROUPS_DIR, SurvivorGroups

        self.groups = SurvivorGroups(run_dir / MEMBERSHIP_DIR / GROUPS_DIR, rank=rank, timeout_s=deadline_s)
        self._lock = threading.Lock()
        self._rebuilt: dict[int, Rebuilt] = {}
        self._seen_at: dict[int, int] = {0: 0}  # epoch -> the step at which this rank first read it
        #: a schedule whose both sides block (gossip) changes at one step on every member: an
        #: epoch switches ``SWITCH_AFTER_WORKERS * n + 2`` steps after its proposer's step, beyond
        #: any member (neighbours of a blocking gossip are at most a step apart, so no member is
        #: more than the diameter ahead of another)
        self.switch_after = (
            SWITCH_AFTER_WORKERS * algorithm.n_workers + 2
            if any(isinstance(ex, Gossip) for ex in algorithm.exchanges(0, rank))
            else None
        )
        self.summary_path = run_dir / SUMMARY_FILE
        #: every rank's host (:func:`~psgdlab.runtime.transports.env.host_identity`), learnt at set-up
        self.hosts: list[str] = []
        #: each peer's local step at its last exchange with this rank that completed: the peer's
        #: work up to there lives on in this rank's model
        self.last_shared: dict[int, int] = {}

    @property
    def step(self) -> int:
        """The training thread's current step (the one its heartbeats carry), for the records of
        what this rank found."""
        return self.mailbox.step

    # --- membership ---
    def epoch(self) -> Epoch:
        """The newest epoch (raises :class:`Removed` when this rank is out of it)."""
        with self._lock:
            current = self.agreement.refresh()
        if self.plane is not None:
            for peer in set(range(self.alg.n_workers)) - set(current.alive) - self.plane.given_up:
                self.plane.give_up(peer)
        return current

    def alive(self, peer: int) -> bool:
        """Whether ``peer`` is a member of the newest epoch and its connection is up."""
        return peer not in self.mailbox.lost and peer in self.epoch().alive

    def remove(self, peer: int, reason: str, silent_s: float | None = None) -> None:
        """Agree that ``peer`` is dead (``reason`` is logged); idempotent. ``silent_s``: how long
        nothing came from it (default: since its last message, as the mailbox heard it)."""
        if self.summary_path.exists():  # the run is over: a peer leaving is not a death
            return
        if silent_s is None:  # found dead in an exchange rather than by the mailbox
            silent_s = self.mailbox.silence(peer)
        if self.plane is not None:
            self.plane.give_up(peer)
        with self._lock:
            before = self.agreement.current.epoch
            epoch = self.agreement.remove([peer], step=self.step, detection_s=silent_s, switch_after=self.switch_after)
        if epoch.epoch != before:
            log.warning("rank %d: %s; survivors now %s (epoch %d)", self.rank, reason, list(epoch.alive), epoch.epoch)

    def _on_lost(self, peer: int, reason: str, silent_s: float) -> None:
        try:
            self.remove(peer, reason, silent_s)
        except Removed:
            pass  # this rank was given up itself: the training thread finds out at its next step

    def exchanges(self, step: int) -> tuple[Exchange, ...]:
        """This rank's exchanges of ``step``: the schedule rebuilt over the newest epoch whose
        switch step has come (the original schedule while everyone is alive), less the peers
        found dead since (a gossip's weight for them goes to the rank itself:
        :func:`~psgdlab.core.graphs.membership.without_peers`)."""
        self.mailbox.step = step
        current = self.epoch()
        template = self.alg.exchanges(step, self.rank)
        if current.epoch == 0:
            return template
        for e in self.agreement.chain:
            if e.epoch not in self._seen_at:
                self._seen_at[e.epoch] = step
                if e.switch_step is not None and step > e.switch_step:
                    raise TransportError(
                        f"rank {self.rank} read epoch {e.epoch} at step {step}, after its switch step "
                        f"{e.switch_step}: the members would no longer follow one schedule"
                    )
        base = max(
            (e for e in self.agreement.chain if e.switch_step is None or e.switch_step <= step), key=lambda e: e.epoch
        )
        exchanges = template
        if base.epoch > 0:
            rebuilt = self._rebuilt.get(base.epoch)
            if rebuilt is None:
                rebuilt = self._rebuilt[base.epoch] = rebuild(self.topology, base.alive)
            exchanges = survivor_exchanges(rebuilt, template, self.rank, step)
        if base is current:
            return exchanges
        dead = set(range(self.alg.n_workers)) - set(current.alive)
        return tuple(without_peers(ex, dead) if isinstance(ex, Gossip) else ex for ex in exchanges)

    def shared(self, peer: int, peer_step: int) -> None:
        """An exchange with ``peer``, at its local step ``peer_step``, completed."""
        self.last_shared[peer] = max(self.last_shared.get(peer, -1), peer_step)

    def report(self) -> dict[str, dict[int, int]]:
        """What this rank knows of how far each peer got: ``heard`` (the last step it said it was
        at) and ``shared`` (its step at its last exchange with this rank)."""
        return {"heard": dict(self.mailbox.steps), "shared": dict(self.last_shared)}

    # --- the end of the run ---
    def finish_steps(self) -> None:
        """Tell every member this rank has no more requests to make."""
        self.mailbox.broadcast(self.epoch().alive, ("done", self.step))

    def peers_done(self) -> bool:
        """Whether every other living member has said it is done (the responder may stop)."""
        alive = set(self.epoch().alive) - self.mailbox.lost - {self.rank}
        return alive <= self.mailbox.done

    def history(self) -> list[dict[str, Any]]:
        """The membership changes of the run: ``time_s`` (since the run's start), ``step`` (the
        proposer's), ``removed``, ``detection_s`` (how long the proposer heard nothing from them),
        ``by`` (the proposer)."""
        return [
            {
                "time_s": e.time_s - self.origin,
                "step": e.step,
                "removed": list(e.removed),
                "detection_s": e.detection_s,
                "by": e.by,
                "epoch": e.epoch,
            }
            for e in self.agreement.history()
        ]

    def wait_for(self, paths: dict[int, Path], timeout_s: float) -> dict[int, Path]:
        """Wait until each member's file in ``paths`` exists or the member is given up; returns
        those that exist. A member that writes nothing within ``timeout_s`` is given up."""
        start = time.monotonic()
        while True:
            alive = set(self.epoch().alive)
            missing = [r for r in alive if r in paths and not paths[r].exists()]
            if not missing:
                return {r: p for r, p in paths.items() if r in alive and p.exists()}
            if time.monotonic() - start > timeout_s:
                for r in missing:
                    self.remove(r, f"rank {r} wrote no result within {timeout_s:g} s")
            time.sleep(0.05)

    def close(self) -> None:
        self.mailbox.close()
        self.groups.close()


def survivor_throughput(
    trace: np.ndarray, changes: Sequence[dict[str, Any]], *, samples_per_step: int
) -> dict[str, float | None]:
    """The survivors' training throughput (samples per second) before the first death and after
    the last membership change, and their ratio.

    ``trace`` holds the survivors' records (a dead rank's trace dies with it), so the ratio compares
    the same ranks: 1 when they keep their own pace, which is the simulator's
    ``throughput_after_ratio`` = :math:`X_1 / ((k/n) X_0)` for workers of equal pace. Before: from the
    end of the first step to the first death (the first change's time less its detection time);
    after: from the last change until the first survivor has done all its steps (from then on
    fewer ranks train: a survivor that waited on the dead catches up alone). None where a window
    holds no step (a failure near the end: the survivors finished before they had settled).
    """
    compute = trace[trace["phase"] == 0]
    ends = np.sort(compute["end_s"])
    if ends.size < 2 or not changes:
        return {}
    died = min(c["time_s"] - (c.get("detection_s") or 0.0) for c in changes)
    settled = max(c["time_s"] for c in changes)
    first_done = min(float(compute["end_s"][compute["rank"] == r].max()) for r in np.unique(compute["rank"]))

    def rate(lo: float, hi: float) -> float | None:
        n = int(np.count_nonzero((ends > lo) & (ends <= hi)))
        return n * samples_per_step / (hi - lo) if n and hi > lo else None

    before = rate(float(ends[0]), died)
    after = rate(settled, first_done)
    ratio = after / before if after is not None and before is not None else None
    return {"throughput_before": before, "throughput_after": after, "throughput_after_ratio": ratio}


def work_lost(changes: Sequence[dict[str, Any]], reports: Sequence[dict[str, dict[int, int]]]) -> None:
    """Add to each membership change the steps each removed rank lost (``steps_lost``, by rank):
    from its step at its last exchange with any survivor (what it had done before lives on in the
    survivors' models; 0 if it never exchanged) to the last step it was heard at or exchanged
    at, that step included (in flight, or applied after the exchange read the model).
    A lower bound: a rank may have gone further after its last word (a heartbeat comes every
    tenth of the deadline). ``reports``: :meth:`Survivors.report` of every survivor."""
    for change in changes:
        lost = {}
        for rank in change["removed"]:
            shared = max((r["shared"][rank] for r in reports if rank in r["shared"]), default=0)
            heard = max([shared, *(r["heard"][rank] for r in reports if rank in r["heard"])])  # an exchange is a word
            lost[rank] = heard - shared + 1 if heard >= shared else 0
        change["steps_lost"] = lost
