r"""What the launcher does when a rank dies, is stopped or fails: ``--on-failure stop``.

:mod:`psgdlab.runtime.launcher.launch` polls its ranks every 0.1 s. A :class:`RankWatch` notes, per rank,
when it was first seen dead (killed by a signal the launcher did not send, or gone without its
``done`` file) or stopped (``/proc/PID/stat`` state ``T``: SIGSTOP, a debugger); a rank stopped
for longer than the deadline (``--timeout``) is treated as dead: the launcher kills it. On the
first failure :func:`stop_run`:

1. writes ``RANKS_DIR/abort``: every surviving rank's watchdog (:mod:`psgdlab.runtime.failures.flight`)
   writes its flight record ``OUT/flight/rank{r}.json``, whatever it waits on;
2. waits up to :data:`ABORT_GRACE_S` for those records, removes the abort file (the survivors
   exit), kills the ranks that are stopped, then terminates what is left (SIGTERM, then SIGKILL);
3. names the rank that failed -- a dead or stopped rank before any rank that merely exited with
   an error (a survivor whose peer vanished errs too, sometimes first), and among those the first
   seen -- with its step (:func:`_step_of`) and which rank waited on which exchange;
4. writes ``OUT/failure.json`` (temporary name, then renamed)::

       {"error": "...", "on_failure": "stop" (the run's --on-failure),
        "membership_changes": [{"time_s", "step", "removed": [ranks], "detection_s"}],
        "survivors": [ranks], "waits": [{"rank", "kind", "what", "peers", "step", "waited_s", "state"}],
        "flight": ["flight/rank0.json", ...]}

   ``time_s``: when the launcher first saw the rank dead or stopped, in seconds since the run's
   origin (its first step; since the launch when no rank got that far, ``"time_origin": "launch"``);
   ``detection_s``: from then to the launcher's decision (about 0 for a dead rank, the deadline
   for a stopped one), both within the 0.1 s poll. ``survivors``: every other rank;

5. removes the temporary files (``.NAME.RANDOM.tmpPID``) that killed ranks left in the run directory,
   so that a failed run holds only complete files.

The run's ``summary.json`` (written only when the run finishes) has the same two keys:
``membership_changes`` empty, ``survivors`` every rank.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psgdlab.core.files import TEMPORARY_GLOB, atomic_write_json, atomic_write_text, temporary_writer
from psgdlab.runtime.failures.flight import ABORT_FILE, FLIGHT_DIR, describe_wait, flight_path

__all__ = ["RankWatch", "RankFailure", "stop_run", "process_state", "remove_partial_files", "FAILURE_FILE"]

FAILURE_FILE = "failure.json"
#: states of ``/proc/PID/stat``: stopped (SIGSTOP; ``t``: by a debugger), and running or sleeping
_STOPPED = frozenset("Tt")
_RUNNING = frozenset("RSDI")
#: after the abort file, how long the survivors have to write their records and leave
ABORT_GRACE_S = 3.0


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (``R``, ``S``, ``T`` stopped, ``Z``...); None: gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


@dataclass(slots=True)
class RankFailure:
    """One rank seen failing: ``dead`` (killed, vanished or stopped) or an error exit."""

    rank: int
    text: str  # "rank 1 was killed by signal SIGKILL"
    dead: bool
    seen_wall: float  # time.time() when first seen (its exit, where the launcher saw it)
    known: bool = True  # an exit status or a stop says why; False: it vanished (mpiexec's ranks)


class RankWatch:
    """Per-rank failure observations of one launch (module docstring)."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.failures: dict[int, RankFailure] = {}
        self.stopped_since: dict[int, float] = {}  # rank -> wall time first seen stopped
        self.killed_by_us: set[int] = set()
        self.started_wall = time.time()
        self.exited: dict[int, float] = {}  # rank -> wall time its process was seen to end
        self._pidfds: dict[int, int] = {}

    def wait_exits(self, pids: dict[int, int], timeout_s: float) -> None:
        """Sleep up to ``timeout_s``, waking when a rank's process ends, and note when each ended
        (``pidfd_open``, also for processes that are not the launcher's children: mpiexec's ranks;
        a rank of mpiexec is killed by it milliseconds after another died, and this tells them apart)."""
        for r, pid in pids.items():
            if r not in self._pidfds and r not in self.exited:
                try:
                    self._pidfds[r] = os.pidfd_open(pid)
                except (OSError, AttributeError):  # gone already, or no pidfd (Linux < 5.3)
                    if process_state(pid) in (None, "Z"):
                        self.exited[r] = time.time()
        fds = {fd: r for r, fd in self._pidfds.items()}
        if not fds:
            time.sleep(timeout_s)
            return
        ready, _, _ = select.select(list(fds), [], [], timeout_s)
        now = time.time()
        for fd in ready:
            self.exited[fds[fd]] = now
            del self._pidfds[fds[fd]]
            os.close(fd)

    def close(self) -> None:
        """Close the process handles."""
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()

    def saw(self, rank: int, text: str, *, dead: bool, when: float | None = None, known: bool = True) -> None:
        """Note a failure of ``rank`` (the first note of a rank is kept); ``known``: its exit status
        or its stop says why (a rank that merely vanished may have been killed by mpiexec after another died)."""
        if rank in self.failures:
            return
        now = time.time() if when is None else when
        since = self.stopped_since.get(rank)
        if dead and since is not None:
            text += f" after it was stopped (SIGSTOP or a debugger) for {now - since:.1f} s"
        self.failures[rank] = RankFailure(rank, text, dead, now, known)

    def check_stopped(self, pids: dict[int, int]) -> list[int]:
        """Note which ranks are stopped; returns those stopped for longer than the deadline."""
        now = time.time()
        overdue = []
        for r, pid in pids.items():
            state = process_state(pid)
            if state in _STOPPED:
                since = self.stopped_since.setdefault(r, now)
                if now - since > self.deadline_s:
                    overdue.append(r)
            elif state in _RUNNING:  # running again (SIGCONT); a rank ending or gone stays noted
                self.stopped_since.pop(r, None)
        return overdue

    def note_stopped(self, ranks: Iterable[int]) -> None:
        """Note stopped ranks as dead, since the first time seen stopped (the cause, whatever was noted)."""
        now = time.time()
        for r in ranks:
            since = self.stopped_since.get(r, now)
            text = f"rank {r} was stopped (SIGSTOP or a debugger) for {now - since:.1f} s and was killed"
            if now - since > self.deadline_s:
                text += f" (past the deadline of {self.deadline_s:g} s, --timeout)"
            self.failures[r] = RankFailure(r, text, True, since)

    def kill_stopped(self, pids: dict[int, int], ranks: Iterable[int]) -> None:
        """SIGKILL stopped ranks (noted dead where they were not yet)."""
        ranks = list(ranks)
        self.note_stopped(r for r in ranks if r not in self.failures)
        for r in ranks:
            self.killed_by_us.add(r)
            try:
                os.kill(pids[r], signal.SIGKILL)
            except (ProcessLookupError, KeyError):
                pass

    def culprits(self) -> list[RankFailure]:
        """The failures, the dead before the erring, each kind in the order first seen."""
        return sorted(self.failures.values(), key=lambda f: (not f.dead, f.seen_wall, f.rank))


def stop_run(
    watch: RankWatch,
    *,
    pids: Callable[[], dict[int, int]],
    poll: Callable[[RankWatch], None],
    all_exited: Callable[[], bool],
    terminate: Callable[[], None],
    ranks_dir: Path,
    out: Path,
    world: int,
    policy: str = "stop",
) -> str:
    """Stop every rank after the first failure and return the error that names the failed rank
    (steps 1-4 of the module docstring). ``poll`` notes failures seen meanwhile; ``terminate``
    stops the ranks left."""
    detected = time.time()
    try:
        atomic_write_text(ranks_dir / ABORT_FILE, watch.culprits()[0].text + "\n")
    except OSError:
        pass
    current = pids()
    stopped = [r for r in watch.stopped_since if r in current]
    watch.note_stopped(stopped)

    def settled() -> bool:  # every rank left, wrote its record, or is stopped
        return all_exited() or all(
            r in stopped or r in watch.exited or flight_path(out, r).exists() for r in range(world)
        )

    end = time.monotonic() + ABORT_GRACE_S
    while time.monotonic() < end and not settled():
        poll(watch)
        watch.wait_exits(pids(), 0.05)
    (ranks_dir / ABORT_FILE).unlink(missing_ok=True)  # every record is in: the survivors may exit
    watch.kill_stopped(current, stopped)  # only now: mpiexec kills every rank when one dies
    poll(watch)
    terminate()
    watch.close()
    records = _read_flight(out, world)
    culprits = watch.culprits()
    first = culprits[0]
    # the first failed rank, and every other whose own exit status or stop says it was killed
    removed = sorted(({f.rank for f in culprits if f.dead and f.known} | {first.rank}) - {-1})
    waits = _waits(records, removed)
    step, how = _step_of(waits, records, removed)
    message = first.text
    own = records.get(first.rank, {})
    if own.get("reason") == "error" and own.get("error"):  # the rank's own one-line error
        message += f" ({own['error']})"
    if step is not None:
        message += {
            "collective": f" at step {step}",
            "request": f" at step {step} or after (its last request a survivor answered)",
            "front": f" by step {step} (the newest step a survivor reached)",
        }[how]

    others = [f.text for f in culprits[1:] if f.dead]
    if others:
        message += f" (also: {'; '.join(others[:3])})"
    if waits:
        said = _say_waits(waits)
        message += "; " + "; ".join(said[:4]) + (f" (and {len(said) - 4} more)" if len(said) > 4 else "")
    if records:
        message += f"; flight records in {out / FLIGHT_DIR}"
    origin = next((rec["origin"] for rec in records.values() if "origin" in rec), None)
    dead_wall = min((f.seen_wall for f in culprits if f.rank in removed), default=first.seen_wall)
    change = {
        "time_s": dead_wall - (origin if origin is not None else watch.started_wall),
        "step": step,
        "removed": removed,
        "detection_s": max(0.0, detected - dead_wall),
    }
    try:
        atomic_write_json(
            out / FAILURE_FILE,
            {
                "error": f"run failed: {message}",
                "on_failure": policy,
                "time_origin": "run" if origin is not None else "launch",
                "membership_changes": [change],
                "survivors": [r for r in range(world) if r not in removed],
                "waits": waits,
                "flight": [str(Path(FLIGHT_DIR) / f"rank{r}.json") for r in sorted(records)],
            },
        )
    except OSError as exc:  # a full disk, as like as not what failed the run: the error still says it all
        message += f"; {FAILURE_FILE} not written: {exc.strerror or exc}"
    return message


def _read_flight(out: Path, world: int) -> dict[int, dict[str, Any]]:
    """The flight records the ranks wrote (unreadable ones are skipped: the error still goes out)."""
    records = {}
    for r in range(world):
        try:
            records[r] = json.loads(flight_path(out, r).read_text())
        except (OSError, ValueError):
            continue
    return records


def _waits(records: dict[int, dict[str, Any]], removed: list[int]) -> list[dict[str, Any]]:
    """What each survivor was blocked on: its pending waits, else the wait that failed; those
    whose peers include a removed rank first."""
    out = []
    for r, rec in sorted(records.items()):
        if r in removed:
            continue
        chosen = list(rec.get("pending", []))
        if not chosen:
            failed = [x for x in rec.get("records", []) if x.get("state") == "failed"]
            chosen = failed[-1:]
        for w in chosen:
            end = w.get("end_s")
            waited = w.get("waited_s", (end if end is not None else rec.get("written_s", 0.0)) - w["start_s"])
            out.append(
                {
                    "rank": r,
                    "kind": w["kind"],
                    "what": w.get("what", ""),
                    "peers": w.get("peers", []),
                    "step": w.get("step"),
                    "waited_s": float(waited),
                    "state": w.get("state", "pending"),
                }
            )
    out.sort(key=lambda w: (not set(w["peers"]) & set(removed), w["rank"]))
    return out


#: the waits every member enters at the same step: one waiting on a removed rank names its step
_COLLECTIVE = frozenset({"allreduce", "barrier", "allgather"})


def _step_of(
    waits: list[dict[str, Any]], records: dict[int, dict[str, Any]], removed: list[int]
) -> tuple[int | None, str]:
    """The step at which the removed ranks failed, and how it is known: ``collective``, the step
    of a collective its peers waited on it in (synchronous algorithms: exact); ``request``, the
    step of its last pairwise or server request a survivor answered (asynchronous ones: it failed
    then or later); ``front``, the newest step any survivor recorded (a dead rank tells nothing)."""
    steps = [w["step"] for w in waits if w["kind"] in _COLLECTIVE and set(w["peers"]) & set(removed)]
    steps = [s for s in steps if s is not None]
    if steps:
        return int(min(steps)), "collective"
    survivors = [rec for r, rec in records.items() if r not in removed]
    asked = [
        x["step"]
        for rec in survivors
        for x in rec.get("records", [])
        if x.get("what") in ("passive", "request")
        and x.get("step") is not None
        and len(x.get("peers", [])) == 1
        and x["peers"][0] in removed
    ]
    if asked:
        return int(max(asked)), "request"
    recorded = [
        x["step"]
        for rec in survivors
        for x in rec.get("records", [])
        if x.get("step") is not None and x.get("kind") not in ("setup", "gather")
    ]
    return (int(max(recorded)), "front") if recorded else (None, "front")


def _say_waits(waits: list[dict[str, Any]]) -> list[str]:
    """``ranks [0, 2] waited 0.1-0.2 s on allreduce (gradient) with ranks [0, 1, 2] at step 5``,
    one phrase per distinct wait."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for w in waits:
        verb = "waited" if w["state"] == "pending" else "failed after"
        grouped.setdefault((verb, describe_wait(w)), []).append(w)
    said = []
    for (verb, what), ws in grouped.items():
        ranks = [w["rank"] for w in ws]
        lo, hi = min(w["waited_s"] for w in ws), max(w["waited_s"] for w in ws)
        span = f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}"
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        said.append(f"{who} {verb} {span} s on {what}")
    return said


def remove_partial_files(out: Path, pids: Iterable[int]) -> list[Path]:
    """Remove the temporary files (:func:`~psgdlab.core.files.temporary_path`) that the processes
    ``pids`` left under ``out`` when killed while writing; returns them."""
    wanted = set(pids)
    removed: list[Path] = []
    if not wanted or not out.is_dir():
        return removed
    for path in out.rglob(TEMPORARY_GLOB):
        if temporary_writer(path) in wanted:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
