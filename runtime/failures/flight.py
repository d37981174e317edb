r"""The flight recorder and the watchdog of a rank: every blocking wait has a deadline.

Every exchange a rank waits on -- the driver's exchanges (pairwise, gossip, allreduce, server,
barrier, on whichever thread runs them), the parameter server's requests, and the run's set-up
and final gather -- is recorded by :meth:`FlightRecorder.wait` in a ring buffer of the last
``capacity`` records (:data:`FLIGHT_CAPACITY_ENV`, default 64): kind, step, peers, bytes, tag,
thread, start and end times (seconds since the run's origin), state ``pending``/``done``/``failed``.

The :class:`Watchdog` thread looks at the records every :data:`POLL_S`:

- a wait still pending after the deadline (``--timeout``) -- a peer that hangs, is stopped
  (SIGSTOP) or died where the backend cannot tell (MPI has no timeout; gloo's own timeout is the
  same deadline) -- makes the rank write its record (reason ``deadline``), print one error naming
  the exchange, its peers, its step and how long it waited, and exit (status 1);
- the launcher's abort file (``RANKS_DIR/abort``, written by :mod:`psgdlab.runtime.launcher.launch` when
  some rank failed) makes the rank write its record (reason ``abort``) and exit (status 1),
  whatever it is blocked in.

Either way the rank exits once the launcher has every survivor's record (it removes the abort file
then), or :data:`LINGER_S` after its own: under mpiexec the first rank to exit takes the others
with it, and they must have written theirs first.

A rank whose run raised writes its record too (reason ``error``, :func:`dump_on_error`). Records
go to ``OUT/flight/rank{r}.json`` (written to a temporary name, then renamed):
``{"rank", "reason", "error", "written_s", "origin", "deadline_s", "pending": [...], "records": [...]}``;
the launcher reads them to say which ranks waited on which exchange (:mod:`psgdlab.runtime.failures.stop`).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from psgdlab.core.errors import ConfigError
from psgdlab.core.records.trace import atomic_write_json

__all__ = [
    "FlightRecorder",
    "Watchdog",
    "flight_path",
    "describe_wait",
    "FLIGHT_DIR",
    "FLIGHT_CAPACITY_ENV",
    "ABORT_FILE",
    "POLL_S",
    "SETUP_DEADLINE_S",
]

#: the records' folder in the run directory
FLIGHT_DIR = "flight"
#: how many exchanges each rank keeps (the ring buffer's length)
FLIGHT_CAPACITY_ENV = "PSGDLAB_FLIGHT_RECORDS"
DEFAULT_CAPACITY = 64
#: written by the launcher into its ranks folder when the run failed: every rank dumps and leaves
ABORT_FILE = "abort"
#: how often the watchdog looks at the pending waits and for the abort file
POLL_S = 0.2
#: the least deadline of the set-up (the rendezvous waits for the slowest rank to start: imports,
#: MPI_Init; seconds apart on a loaded machine), and of the backends' own timeouts, which back the
#: watchdog up (gloo's process groups, the shared-memory plane)
SETUP_DEADLINE_S = 60.0
#: how long a rank past its deadline waits for the launcher's abort file before it exits
LINGER_S = 3.0


def flight_path(out: str | os.PathLike[str], rank: int) -> Path:
    """``OUT/flight/rank{rank}.json``."""
    return Path(out) / FLIGHT_DIR / f"rank{rank}.json"


def _capacity(environ: dict[str, str] | None = None) -> int:
    raw = (os.environ if environ is None else environ).get(FLIGHT_CAPACITY_ENV, str(DEFAULT_CAPACITY))
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ConfigError(f"{FLIGHT_CAPACITY_ENV} ({raw!r}) must be a positive number of records")
    return int(raw)


def describe_wait(record: dict[str, Any]) -> str:
    """One phrase for a record: ``allreduce (gradient) with ranks [0, 1, 2] at step 17``.

    >>> describe_wait({"kind": "pairwise", "what": "passive", "peers": [3], "step": 5})
    'pairwise (passive) with rank 3 at step 5'
    """
    what = f" ({record['what']})" if record.get("what") else ""
    peers = list(record.get("peers") or [])
    if not peers:
        who = " from any rank"
    elif len(peers) == 1:
        who = f" with rank {peers[0]}"
    else:
        who = f" with ranks {peers}"
    step = "" if record.get("step") is None else f" at step {record['step']}"
    return f"{record['kind']}{what}{who}{step}"


class FlightRecorder:
    """The last ``capacity`` waits of one rank (module docstring); safe to use from every thread.

    Parameters
    ----------
    rank : int
    out : path, optional
        The run directory (records go to ``OUT/flight``); None: :meth:`dump` writes nothing.
    deadline_s : float
        How long a wait may stay pending (``--timeout``).
    capacity : int, optional
        Records kept; default :data:`FLIGHT_CAPACITY_ENV` or 64.
    """

    def __init__(
        self, rank: int, *, out: str | os.PathLike[str] | None, deadline_s: float, capacity: int | None = None
    ) -> None:
        self.rank = rank
        self.out = None if out is None else Path(out)
        self.deadline_s = float(deadline_s)
        self.origin = time.time()  # until the run's origin is agreed (set_origin)
        self._records: deque[dict[str, Any]] = deque(maxlen=capacity or _capacity())
        self._pending: dict[int, dict[str, Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._dumped = False

    def set_origin(self, origin: float) -> None:
        """Times are seconds since ``origin`` (the run's agreed start, wall clock) from now on;
        records made before are shifted to it."""
        with self._lock:
            shift = self.origin - origin
            for rec in self._records:
                rec["start_s"] += shift
                if rec["end_s"] is not None:
                    rec["end_s"] += shift
            self.origin = origin

    def now(self) -> float:
        return time.time() - self.origin

    @contextmanager
    def wait(
        self,
        kind: str,
        *,
        step: int | None,
        peers: Sequence[int] = (),
        nbytes: int = 0,
        what: str = "",
        tag: int | None = None,
        deadline_s: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Record the blocking wait of the ``with`` body (pending until it ends; ``failed`` if it
        raises). The body may fill ``peers`` of the yielded record once it knows them.
        ``deadline_s``: this wait's own deadline (default: the recorder's)."""
        rec: dict[str, Any] = {
            "kind": kind,
            "what": what,
            "step": step,
            "peers": [int(p) for p in peers],
            "nbytes": int(nbytes),
            "tag": tag,
            "thread": threading.current_thread().name,
            "start_s": self.now(),
            "end_s": None,
            "state": "pending",
            "deadline_s": self.deadline_s if deadline_s is None else float(deadline_s),
        }
        key = next(self._ids)
        with self._lock:
            self._records.append(rec)
            self._pending[key] = rec
        try:
            yield rec
        except BaseException:
            rec["state"] = "failed"
            raise
        else:
            rec["state"] = "done"
        finally:
            rec["end_s"] = self.now()
            with self._lock:
                self._pending.pop(key, None)

    def overdue(self) -> tuple[dict[str, Any], float] | None:
        """The pending wait that has waited longest past its deadline, and how long it waited."""
        now = self.now()
        with self._lock:
            late = [r for r in self._pending.values() if now - r["start_s"] > r["deadline_s"]]
        if not late:
            return None
        oldest = min(late, key=lambda r: r["start_s"])
        return dict(oldest), now - oldest["start_s"]

    def snapshot(self) -> dict[str, Any]:
        """What :meth:`dump` writes, less the reason and the error."""
        now = self.now()
        with self._lock:
            records = [dict(r) for r in self._records]
            pending = [dict(r, waited_s=now - r["start_s"]) for r in self._pending.values()]
        pending.sort(key=lambda r: r["start_s"])
        return {
            "rank": self.rank,
            "written_s": now,
            "origin": self.origin,
            "deadline_s": self.deadline_s,
            "pending": pending,
            "records": records,
        }

    def dump(self, reason: str, error: str = "") -> Path | None:
        """Write ``OUT/flight/rank{r}.json`` once (the first reason wins); None without a run directory."""
        if self.out is None:
            return None
        with self._lock:
            if self._dumped:
                return None
            self._dumped = True
        try:
            return atomic_write_json(
                flight_path(self.out, self.rank), {**self.snapshot(), "reason": reason, "error": error}
            )
        except OSError as exc:  # a full or vanished run directory: say so, the exit goes on
            print(f"psgdlab: rank {self.rank}: could not write its flight record: {exc}", file=sys.stderr)
            return None


class Watchdog:
    """The thread that ends a rank whose wait outlived the deadline, or whose launcher aborted
    the run (module docstring). :meth:`start` it once the recorder exists; :meth:`stop` at the end."""

    def __init__(self, recorder: FlightRecorder, *, ranks_dir: str | os.PathLike[str] | None) -> None:
        self.recorder = recorder
        self.abort_file = None if ranks_dir is None else Path(ranks_dir) / ABORT_FILE
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"psgdlab-watchdog-{recorder.rank}")

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        rec = self.recorder
        while not self._stop.wait(POLL_S):
            if self.abort_file is not None and self.abort_file.exists():
                rec.dump("abort", _read(self.abort_file))
                self._linger()
                _leave()
            late = rec.overdue()
            if late is not None:
                record, waited = late
                message = (
                    f"rank {rec.rank}: waited {waited:.1f} s on {describe_wait(record)}, past the "
                    f"deadline of {record['deadline_s']:g} s (--timeout); a peer is dead, stopped or hung"
                )
                rec.dump("deadline", message)
                print(f"psgdlab: error: {message}", file=sys.stderr, flush=True)
                self._linger()
                _leave()

    def _linger(self) -> None:
        """After its record is written, stay until the launcher has every survivor's (it removes
        its abort file then), at most :data:`LINGER_S`: an MPI launcher kills every rank as soon as
        one exits, and the other survivors, whose deadlines pass about now too, would lose theirs."""
        end = time.monotonic() + LINGER_S
        seen = False
        while self.abort_file is not None and time.monotonic() < end:
            there = self.abort_file.exists()
            if seen and not there:
                return
            seen = seen or there
            time.sleep(POLL_S / 4)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _leave() -> None:
    """Exit the process now: the other threads may be blocked in a backend call that never returns."""
    sys.stderr.flush()
    os._exit(1)
