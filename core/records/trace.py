r"""The one trace schema every executor writes, and the summary every part computes from it.

A trace is a numpy structured array with one record per (worker, step, phase), columnar so a
million-event simulation stays fast. Columns (:data:`TRACE_DTYPE`):

========== ======= ==================================================================
column     type    meaning
========== ======= ==================================================================
rank       int32   worker
step       int64   the worker's local step (0-based)
phase      uint8   :data:`PHASES`: compute, comm (blocked in an exchange, waiting for
                   peers included), wait (blocked on anything else: a lock, a queue),
                   overlap (an exchange running beside compute on a communication thread)
kind       uint8   exchange kind code (:data:`psgdlab.core.exchange.EXCHANGE_KINDS`), 0 none
start_s    float64 start, seconds since the run's origin (sim time, wall time, or the
                   step index for the clock-less reference executor)
end_s      float64 end, same clock
peer       int32   peer rank for pairwise exchanges, -1 otherwise (-2: the server)
nbytes     int64   bytes this rank sent in the exchange
staleness  int32   on compute records: foreign merges between reading the weights and
                   applying the gradient (unit: updates, see :mod:`psgdlab.core.exchange`);
                   -1 elsewhere
loss       float32 minibatch loss on compute records where known, NaN otherwise; a loss
                   beyond float32's range (a diverged run) is stored as inf
========== ======= ==================================================================

Metadata (a JSON-able dict) travels with it: ``schema_version``, ``source`` (reference,
simulator, emulator, runtime), ``run_id``, ``n_workers``, ``samples_per_step`` (per worker) and
anything else the executor adds. Files are NPZ (numpy only), written through the one safe
writer (:mod:`psgdlab.core.files`).
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError
from psgdlab.core.exchange import kind_name

# the safe writer of every output file, here for the callers that import it with the trace
from psgdlab.core.files import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    json_default,
    temporary_path,
    temporary_writer,
)

__all__ = [
    "SCHEMA_VERSION",
    "TRACE_DTYPE",
    "PHASES",
    "PHASE_NAMES",
    "TraceBuilder",
    "empty_trace",
    "write_trace",
    "read_trace",
    "to_chrome_trace",
    "summarize",
    "step_path",
    "STEP_PATH_KEYS",
    "staleness_histogram",
    "atomic_write_bytes",
    "temporary_path",
    "temporary_writer",
    "atomic_write_text",
    "atomic_write_json",
]

SCHEMA_VERSION = 1
TRACE_DTYPE = np.dtype(
    [
        ("rank", "i4"),
        ("step", "i8"),
        ("phase", "u1"),
        ("kind", "u1"),
        ("start_s", "f8"),
        ("end_s", "f8"),
        ("peer", "i4"),
        ("nbytes", "i8"),
        ("staleness", "i4"),
        ("loss", "f4"),
    ]
)
PHASES = {"compute": 0, "comm": 1, "wait": 2, "overlap": 3}
PHASE_NAMES = {v: k for k, v in PHASES.items()}
SERVER_PEER = -2


def empty_trace(n: int = 0) -> np.ndarray:
    return np.zeros(n, dtype=TRACE_DTYPE)


class TraceBuilder:
    """Accumulates records in Python lists and turns them into a structured array once.

    >>> tb = TraceBuilder()
    >>> tb.add(rank=0, step=0, phase="compute", start_s=0.0, end_s=0.1, staleness=0, loss=1.5)
    >>> tb.array()["end_s"]
    array([0.1])
    """

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: list[tuple[Any, ...]] = []

    def add(
        self,
        *,
        rank: int,
        step: int,
        phase: str,
        start_s: float,
        end_s: float,
        kind: int = 0,
        peer: int = -1,
        nbytes: int = 0,
        staleness: int = -1,
        loss: float = math.nan,
    ) -> None:
        self._rows.append((rank, step, PHASES[phase], kind, start_s, end_s, peer, nbytes, staleness, loss))

    def add_raw(self, row: tuple[Any, ...]) -> None:
        """Append a row already in :data:`TRACE_DTYPE` column order (phase as its code)."""
        self._rows.append(row)

    def extend(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Append rows already in :data:`TRACE_DTYPE` column order (phase as its code), as
        :meth:`add_raw` does one at a time.

        >>> tb = TraceBuilder()
        >>> tb.extend([(1, 0, 0, 0, 0.0, 0.5, -1, 0, 0, 1.0), (0, 0, 0, 0, 0.0, 0.4, -1, 0, 0, 1.0)])
        >>> tb.array()["rank"].tolist()
        [0, 1]
        """
        self._rows.extend(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def array(self) -> np.ndarray:
        """The rows as a :data:`TRACE_DTYPE` array sorted by start time, rank and step.

        >>> tb = TraceBuilder()
        >>> tb.add(rank=0, step=0, phase="compute", start_s=0.0, end_s=1.0, loss=1e300)
        >>> tb.array()["loss"].tolist()
        [inf]
        """
        with np.errstate(over="ignore"):  # a loss beyond float32 is inf, as the run's loss is
            out = np.array(self._rows, dtype=TRACE_DTYPE) if self._rows else empty_trace()
        return np.sort(out, order=("start_s", "rank", "step"), kind="stable")


# ----- reading and writing traces ---------------------------------------------------------------
def write_trace(path: str | os.PathLike[str], trace: np.ndarray, meta: Mapping[str, Any]) -> Path:
    """Save ``trace`` and ``meta`` as NPZ (atomically)."""
    if trace.dtype != TRACE_DTYPE:
        raise ConfigError(f"trace dtype ({trace.dtype}) must be TRACE_DTYPE")
    meta = {"schema_version": SCHEMA_VERSION, **dict(meta)}
    buf = io.BytesIO()
    np.savez_compressed(buf, trace=trace, meta=np.array(json.dumps(meta, default=json_default)))
    return atomic_write_bytes(path, buf.getvalue())


def read_trace(path: str | os.PathLike[str]) -> tuple[np.ndarray, dict[str, Any]]:
    """Load a trace written by :func:`write_trace`; checks the schema version and the columns.

    A file that is not a readable NPZ archive of a trace (truncated, corrupt, another archive,
    metadata that is not a JSON object) is a one-line :class:`ConfigError`.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as npz:
            trace = npz["trace"]
            meta = json.loads(str(npz["meta"]))
    # a corrupt archive raises any of these from zipfile, zlib or numpy's header parser
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error, RecursionError) as exc:
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(f"trace file {path} is not a psgdlab trace ({detail})") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"trace file {path} is not a psgdlab trace (its metadata is not a JSON object)")
    if trace.dtype != TRACE_DTYPE or trace.ndim != 1:
        raise ConfigError(f"trace file {path} is not a psgdlab trace (columns {trace.dtype}, {trace.ndim}-D)")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(
            f"trace file {path} has schema_version {meta.get('schema_version')!r}; this psgdlab reads {SCHEMA_VERSION}"
        )
    return trace, meta


def to_chrome_trace(
    trace: np.ndarray, path: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None, max_events: int = 200_000
) -> Path:
    """Export a Chrome/Perfetto timeline (one row per rank; open in chrome://tracing or
    ui.perfetto.dev). Long traces are cut to their first ``max_events`` records. Each of
    ``meta["membership_changes"]`` (``time_s``, ``removed``) is a global instant event."""
    events: list[dict[str, Any]] = []
    cut = trace[:max_events]
    columns = ("rank", "step", "phase", "kind", "start_s", "end_s", "peer", "nbytes", "staleness")
    names: dict[tuple[int, int], str] = {}
    overlap = PHASES["overlap"]
    # the columns as Python lists: reading numpy scalars record by record is ten times slower
    for rank, step, phase, kind, start, end, peer, nbytes, staleness in zip(*(cut[c].tolist() for c in columns)):
        name = names.get((phase, kind))
        if name is None:
            name = names[(phase, kind)] = PHASE_NAMES[phase] + (f":{kind_name(kind)}" if kind else "")
        args = {"step": step}
        if peer != -1:
            args["peer"] = peer
        if nbytes:
            args["bytes"] = nbytes
        if staleness >= 0:
            args["staleness"] = staleness
        events.append(
            {
                "name": name,
                "ph": "X",
                "pid": 0,
                "tid": rank * 2 + (1 if phase == overlap else 0),
                "ts": start * 1e6,
                "dur": max(end - start, 0.0) * 1e6,
                "args": args,
            }
        )
    for change in (meta or {}).get("membership_changes", []):
        events.append(
            {
                "name": f"membership: removed {list(change['removed'])}",
                "ph": "i",
                "s": "g",
                "pid": 0,
                "tid": 0,
                "ts": float(change["time_s"]) * 1e6,
                "args": {k: v for k, v in change.items() if k not in ("removed", "time_s")},
            }
        )
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(meta or {})}
    return atomic_write_text(path, json.dumps(doc, default=json_default))


# ----- summary (one definition for every executor) ------------------------------------------------
def _worker_steps(compute: np.ndarray, warmup_steps: int) -> tuple[list[np.ndarray], list[float] | None]:
    """Per worker (in rank order) of the compute records ``compute``: the times between its
    consecutive compute starts past ``warmup_steps``, and its own rate, steps per second between
    its first start at or past the first timed step (the first past the warm-up, every step when
    none is) and its last (``None`` when some worker has fewer than two such starts)."""
    past = compute["step"][compute["step"] >= warmup_steps]
    first_timed = past.min() if past.size else compute["step"].min()
    deltas: list[np.ndarray] = []
    rates: list[float] | None = []
    for r in np.unique(compute["rank"]):
        starts = np.sort(compute["start_s"][compute["rank"] == r])
        steps = np.sort(compute["step"][compute["rank"] == r])
        deltas.append(np.diff(starts)[steps[1:] >= warmup_steps] if starts.size > 1 else np.array([]))
        own = starts[steps >= first_timed]
        if rates is not None and own.size > 1 and own[-1] > own[0]:
            rates.append((own.size - 1) / float(own[-1] - own[0]))
        else:
            rates = None
    return deltas, rates


#: the keys of :func:`step_path`
STEP_PATH_KEYS = (
    "worker_step_min_s",
    "worker_step_max_s",
    "compute_end_spread_s",
    "after_compute_s",
    "restart_spread_s",
)


def step_path(trace: np.ndarray, *, warmup_steps: int = 0) -> dict[str, float | None]:
    r"""Where a trace's steps go across its workers: the spread of the workers' own speeds, and
    the path of a step from the last worker's compute end to the last worker's next compute.

    :func:`summarize` gives one step time for the whole run; two runs (a prediction and its
    measurement) can agree on it for different reasons, or miss it in a place a fraction cannot
    show. Here, for each step ``s`` past ``warmup_steps`` that every worker began and followed
    with step ``s + 1``, with :math:`e_r` the end of worker ``r``'s compute of ``s`` and
    :math:`b_r` the start of its compute of ``s + 1``:

    - ``compute_end_spread_s``: :math:`\max_r e_r - \min_r e_r`, how far apart the workers come
      to the step's exchanges;
    - ``after_compute_s``: :math:`\max_r b_r - \max_r e_r`, from the last worker's compute end
      to the last worker's next compute: the exchanges, the waits and the update on the step's
      critical path when every worker waits for the others (a gradient allreduce);
    - ``restart_spread_s``: :math:`\max_r b_r - \min_r b_r`, how far apart the workers leave
      them (members of one collective that leave it at different times);

    each the mean over those steps, and ``worker_step_min_s`` / ``worker_step_max_s``: the
    fastest and the slowest worker's own step (the mean time between its consecutive compute
    starts past the warm-up, :func:`summarize`'s per-worker rate). Workers that drift apart
    (asynchronous algorithms) reach one step index at different times, so there the spreads
    measure the drift and the two worker steps say more. A key is ``None`` where no step (or
    no worker rate) qualifies.

    Examples
    --------
    >>> tb = TraceBuilder()
    >>> for r, (end, restart) in enumerate([(1.0, 1.5), (1.2, 1.6)]):
    ...     tb.add(rank=r, step=0, phase="compute", start_s=0.0, end_s=end)
    ...     tb.add(rank=r, step=1, phase="compute", start_s=restart, end_s=restart + 1.0)
    >>> path = step_path(tb.array())
    >>> [round(path[k], 3) for k in ("compute_end_spread_s", "after_compute_s", "restart_spread_s")]
    [0.2, 0.4, 0.1]
    """
    compute = trace[trace["phase"] == PHASES["compute"]]
    out: dict[str, float | None] = dict.fromkeys(STEP_PATH_KEYS)
    if compute.size == 0:
        return out
    ranks = np.unique(compute["rank"])
    _, rates = _worker_steps(compute, warmup_steps)
    if rates:
        out["worker_step_min_s"] = 1.0 / max(rates)
        out["worker_step_max_s"] = 1.0 / min(rates)
    row = np.searchsorted(ranks, compute["rank"])
    n_steps = int(compute["step"].max()) + 1
    starts = np.full((ranks.size, n_steps), np.nan)
    ends = np.full((ranks.size, n_steps), np.nan)
    starts[row, compute["step"]] = compute["start_s"]
    ends[row, compute["step"]] = compute["end_s"]
    e, b = ends[:, warmup_steps : n_steps - 1], starts[:, warmup_steps + 1 :]
    ok = np.all(np.isfinite(e), axis=0) & np.all(np.isfinite(b), axis=0)
    if ok.any():
        e, b = e[:, ok], b[:, ok]
        out["compute_end_spread_s"] = float(np.mean(e.max(axis=0) - e.min(axis=0)))
        out["after_compute_s"] = float(np.mean(b.max(axis=0) - e.max(axis=0)))
        out["restart_spread_s"] = float(np.mean(b.max(axis=0) - b.min(axis=0)))
    return out


def staleness_histogram(trace: np.ndarray) -> dict[str, int]:
    """Counts of each staleness value on compute records (keys are strings for JSON)."""
    st = trace["staleness"][(trace["phase"] == PHASES["compute"]) & (trace["staleness"] >= 0)]
    values, counts = np.unique(st, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts)}


def summarize(trace: np.ndarray, *, samples_per_step: int, warmup_steps: int = 0) -> dict[str, Any]:
    r"""Throughput and timing figures from a trace, identical for every executor.

    Throughput is the sum of the workers' own rates, not one window over all of them: workers
    that start some milliseconds apart (process launch) or drift apart at different speeds
    (asynchronous algorithms, stragglers) make a window from the first timed start to the last
    end count too few steps of the late ones, by an amount that depends on the algorithm and
    differs between a run and its simulation (every simulated worker starts at 0). Over 80
    steps of 8 processes on 2 cores that window read 0.1-2 % off the summed rates: AD-PSGD's
    random ring 1.5 % low measured and 0.65 % low simulated, more than the gaps that order
    some algorithms.

    Parameters
    ----------
    trace : structured array of :data:`TRACE_DTYPE`
    samples_per_step : int
        Samples one worker consumes per step (its local batch).
    warmup_steps : int
        Steps at the start of each worker to leave out of the timing statistics.

    Returns
    -------
    dict
        ``steps`` (total over workers), ``makespan_s``, ``step_time_s`` (the throughput step:
        ``workers * samples_per_step / samples_per_s``, each worker's mean time between its
        consecutive timed compute starts averaged as a rate over the workers; see below),
        ``step_time_median_s``, ``step_time_mean_s`` and ``step_time_p95_s`` (over every step of
        every worker), ``samples_per_s`` (the sum over workers of each worker's own rate:
        ``samples_per_step`` over its mean time between consecutive timed compute starts; with a
        worker of fewer than two timed steps, samples in the timed window / its length),
        ``compute_fraction``, ``comm_fraction`` (blocked in exchanges),
        ``idle_fraction`` (neither computing nor blocked in an exchange: 1 minus the other two),
        ``overlap_comm_fraction`` (exchanges running beside compute), ``staleness_mean``,
        ``staleness_max``, ``staleness_hist`` (unit: updates), ``loss_first``, ``loss_last``.

    Notes
    -----
    ``step_time_s`` is the step that the throughput implies, the figure a time to train is made
    of and the one :func:`psgdlab.sim.predict.predict_one` reports, not a median. A median of
    steps is the typical step, and where steps come at two speeds it is neither: with H-ADPSGD
    and a straggler half the workers step at the straggler's node's pace, and the median of every
    step pooled is the boundary between the two groups (the fast group's slowest steps against
    the slow group's fastest), a figure of the noise's tails; with AD-PSGD's random ring across
    hosts each worker's steps split between peers on its host and peers across the NIC, and a
    median takes one side or the other. ``step_time_median_s`` is that typical step.
    """
    compute = trace[trace["phase"] == PHASES["compute"]]
    if compute.size == 0:
        raise ConfigError("trace has no compute records to summarize")
    timed = compute[compute["step"] >= warmup_steps]
    if timed.size == 0:
        timed = compute
    t0 = float(timed["start_s"].min())
    window = trace[trace["start_s"] >= t0]
    t1 = float(window["end_s"].max())
    span = max(t1 - t0, 1e-300)
    ranks = np.unique(compute["rank"])
    deltas, rates = _worker_steps(compute, warmup_steps)
    all_d = np.concatenate(deltas) if deltas else np.array([])
    if all_d.size == 0:  # one step each: use the compute durations plus blocking comm
        all_d = np.array([span])

    def busy(phase: str) -> float:
        sel = window[window["phase"] == PHASES[phase]]
        return float(np.sum(np.minimum(sel["end_s"], t1) - sel["start_s"])) if sel.size else 0.0

    samples_per_s = float(samples_per_step * sum(rates) if rates else timed.size * samples_per_step / span)
    total = span * ranks.size
    compute_frac = busy("compute") / total
    comm_frac = busy("comm") / total
    st = compute["staleness"][compute["staleness"] >= 0]
    losses = compute["loss"][~np.isnan(compute["loss"])]
    by_time = np.argsort(compute["end_s"][~np.isnan(compute["loss"])], kind="stable")
    losses = losses[by_time]
    return {
        "workers": int(ranks.size),
        "steps": int(compute.size),
        "makespan_s": float(compute["end_s"].max() - compute["start_s"].min()),
        "step_time_s": float(ranks.size * samples_per_step / samples_per_s),
        "step_time_median_s": float(np.median(all_d)),
        "step_time_mean_s": float(np.mean(all_d)),
        "step_time_p95_s": float(np.percentile(all_d, 95)),
        "samples_per_s": samples_per_s,
        "compute_fraction": compute_frac,
        "comm_fraction": comm_frac,
        "idle_fraction": max(0.0, 1.0 - compute_frac - comm_frac),
        "overlap_comm_fraction": busy("overlap") / total,
        "staleness_mean": float(st.mean()) if st.size else 0.0,
        "staleness_max": int(st.max()) if st.size else 0,
        "staleness_hist": staleness_histogram(trace),
        "staleness_unit": "updates",
        "loss_first": float(losses[0]) if losses.size else None,
        "loss_last": float(losses[-1]) if losses.size else None,
        "warmup_steps": int(warmup_steps),
    }
