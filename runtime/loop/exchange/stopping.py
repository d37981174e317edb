r"""A stop the ranks agree on without a collective: the final step of an interrupted run.

A synchronous run stops at a step every rank reaches together (a tiny allreduce every few
steps). The ranks of an asynchronous or surviving run are at different steps, and a rank that
stops where it is leaves partners waiting and a checkpoint set of as many steps as ranks. So the
ranks agree on one *final step* ``T`` and each runs to it, checkpoints there, and ends as a
finished run does -- the complete set of step ``T`` is what ``--resume`` starts from:

1. a rank that hears of the stop -- its own SIGINT or SIGTERM, seen after its step, or a peer's
   announcement, seen by a thread beside the loop at any time -- *announces* the last step it
   began, once;
2. it begins no later step until every living member has announced or finished (a finished
   rank's last step stands for its announcement);
3. ``T`` is the largest announcement plus one: no rank has begun a step at or past it, and every
   rank can reach it (a rank behind catches up; its partners' responders still answer it).

Beginning a step and announcing take one lock, so a rank announces exactly the last step it
began. Announcements come from a thread beside the loop, so a rank blocked in a collective with
a member that waits for the agreement still announces, and no member of a node or of a blocking
gossip waits on another. :class:`StopAgreement` is that rule; a protocol gives it the way to
announce and what it has heard: the normal protocol through the run directory
(:class:`FileBoard`, polled by :class:`BoardWatch`), the surviving one through its mailbox.

The members agree on ``T`` when they have heard the same announcements: the normal protocol's
members are every worker, each announcing once. Under ``--on-failure continue`` a rank that
dies while announcing may have reached some members and not others; they may then stop at
different steps (a death leaves no complete checkpoint set past it anyway: every worker's file
is needed to resume).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from psgdlab.core.errors import TransportError
from psgdlab.core.records.trace import atomic_write_text
from psgdlab.runtime.failures.flight import FlightRecorder

__all__ = ["StopAgreement", "FileBoard", "BoardWatch", "STOP_DIR", "POLL_S"]

#: under the run directory: each rank's announcement (:class:`FileBoard`)
STOP_DIR = ".stop"
#: how often a :class:`BoardWatch` reads the board, and a waiting rank re-reads the membership
POLL_S = 0.05


class StopAgreement:
    """This rank's side of the agreement on the final step (module docstring).

    Parameters
    ----------
    rank : int
    start_step : int
        The first step this rank runs (begun as soon as the loop starts).
    announce : callable step -> None
        Tells every other member the step this rank announces (called once, under the lock).
    members : callable -> collection of int
        The living members (this rank included).
    finished : callable -> mapping of int to int
        The members that finished every step, and their last step.
    flight : FlightRecorder
        Where the wait for the others' announcements is recorded (it has the run's deadline).
    answer_s : float, optional
        How long to wait for the others' announcements before giving up with an error naming
        the members that did not answer (None: the run's deadline): where a dead member is not
        removed from ``members``, its announcement never comes.
    """

    def __init__(
        self,
        *,
        rank: int,
        start_step: int,
        announce: Callable[[int], None],
        members: Callable[[], Collection[int]],
        finished: Callable[[], Mapping[int, int]],
        flight: FlightRecorder,
        answer_s: float | None = None,
    ) -> None:
        self.rank = rank
        self._answer_s = answer_s
        self._cond = threading.Condition()
        self._current = start_step  # the last step this rank began
        self._announced: dict[int, int] = {}
        self._announce_to = announce
        self._members = members
        self._finished = finished
        self._flight = flight

    def heard(self, peer: int, step: int) -> None:
        """``peer`` announced ``step``: note it, and announce this rank's own."""
        with self._cond:
            self._announced[peer] = step
            self._announce()
            self._cond.notify_all()

    def end(self, step: int) -> bool:
        """This rank finished every step, the last ``step``: True when it had announced nothing
        (its last step then stands for its announcement, which the caller tells the others)."""
        with self._cond:
            if self.rank in self._announced:
                return False
            self._announced[self.rank] = step
            return True

    def _announce(self) -> None:  # under the lock
        if self.rank not in self._announced:
            self._announced[self.rank] = self._current
            self._announce_to(self._current)

    def final_step(self) -> int | None:
        """``T``, once every living member has announced or finished (None before, or when no
        stop was announced)."""
        with self._cond:
            return self._final_step()

    def _final_step(self) -> int | None:
        if self.rank not in self._announced or self._silent():
            return None
        finished = self._finished()
        return max(self._announced.get(r, finished.get(r, 0)) for r in self._members()) + 1

    def _silent(self) -> list[int]:
        """The members neither announced nor finished."""
        finished = self._finished()
        return [r for r in self._members() if r not in self._announced and r not in finished]

    def after(self, step: int, requested: bool) -> bool:
        """Whether ``step``, just done, is this rank's last (the training thread asks after every
        step; ``requested``: this rank was asked to stop). Blocks while a stop is announced and
        its final step not yet agreed; otherwise this rank begins ``step + 1``."""
        with self._cond:
            if requested:
                self._announce()
            if self.rank not in self._announced:
                self._current = step + 1
                return False
            final = self._final_step() or self._wait(step)
            if step + 1 >= final:
                return True
            self._current = step + 1
            return False

    def _wait(self, step: int) -> int:  # under the lock
        """The final step, once every member has announced (or the error naming those that did not)."""
        end = None if self._answer_s is None else time.monotonic() + self._answer_s
        with self._flight.wait("stop", what="the final step", step=step, peers=self._silent()):
            while (final := self._final_step()) is None:
                if end is not None and time.monotonic() > end:
                    raise TransportError(
                        f"rank {self.rank}: ranks {self._silent()} did not say where they stop within "
                        f"{self._answer_s:g} s of this rank's step {step} (dead, or their word not seen yet): "
                        "the ranks agreed on no final step"
                    )
                self._cond.wait(POLL_S)
        return final


class FileBoard:
    """The ranks' announcements as files ``OUT/.stop/rank{r}`` (``stop STEP`` or ``end STEP``).

    The run directory is on a file system every rank writes already (checkpoints, the
    survivors' membership), on every host of the run; each file is written once, atomically.
    """

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.root = Path(run_dir) / STOP_DIR
        self.rank = rank

    def post(self, kind: str, step: int) -> None:
        """Write this rank's announcement (``kind`` ``stop``) or its last step (``end``)."""
        atomic_write_text(self.root / f"rank{self.rank}", f"{kind} {step}\n")

    def read(self) -> dict[int, tuple[str, int]]:
        """Every rank's entry, ``{rank: (kind, step)}`` (a file being renamed in is skipped)."""
        entries: dict[int, tuple[str, int]] = {}
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return entries
        for name in names:
            if not (name.startswith("rank") and name[4:].isdigit()):
                continue
            try:
                kind, step = (self.root / name).read_text().split()
            except (OSError, ValueError):
                continue
            entries[int(name[4:])] = (kind, int(step))
        return entries

    @staticmethod
    def clear(run_dir: Path) -> None:
        """Remove the board of an earlier run (rank 0, during the set-up: every rank waits)."""
        shutil.rmtree(Path(run_dir) / STOP_DIR, ignore_errors=True)


class BoardWatch:
    """A thread that reads a :class:`FileBoard` every :data:`POLL_S` and tells ``agreement``
    of every other rank's announcement; the other ranks' ``end`` entries are in :attr:`ended`."""

    def __init__(self, board: FileBoard, agreement: StopAgreement) -> None:
        self.board = board
        self.agreement = agreement
        self.ended: dict[int, int] = {}
        self._heard: set[int] = set()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name=f"psgdlab-stop-{board.rank}")

    def start(self) -> BoardWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * POLL_S + 1.0)

    def _watch(self) -> None:
        while not self._closed.wait(POLL_S):
            for rank, (kind, step) in self.board.read().items():
                if rank == self.board.rank or rank in self._heard:
                    continue
                if kind == "stop":
                    self._heard.add(rank)
                    self.agreement.heard(rank, step)
                else:
                    self.ended[rank] = step
