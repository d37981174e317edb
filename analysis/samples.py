r"""Reading runs for a calibration: the samples the fits take, from the traces of run directories.

Each function reads one measured run (:class:`psgdlab.analysis.load.Run`): its payload,
workers and algorithm (rebuilt from the resolved configuration, and asked whether its schedule
allreduces the model), the spans of its allreduces, the link samples of its exchanges, each
worker's host time between steps, and the allreduce schedule the backend reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError, TestbedError
from psgdlab.core.exchange import ExchangeKind, folds_model, trainer_merges
from psgdlab.core.platform.cost import (
    ALLREDUCE_ALGORITHMS,
    allreduce_group_size,
)
from psgdlab.core.records.trace import PHASES

__all__ = [
    "PAIRWISE_QUANTILE",
    "payload_of",
    "algorithm_of",
    "resolved_algorithm",
    "averages_model",
    "workers_of",
    "allreduce_scatter",
    "allreduce_spans",
    "link_samples",
    "pairwise_scatter",
    "SCATTER_QUANTILES",
    "quantile_se",
    "step_gaps",
    "merging_steps",
    "allreduce_algorithm_of",
]


#: pairwise records may include waiting for the peer's lock: keep those at or below this
#: quantile of their payload size
PAIRWISE_QUANTILE = 0.25


def payload_of(run: Any) -> int | None:
    """Bytes of the model the run's exchanges move (its summary's or trace's ``payload_bytes``),
    ``None`` where neither records it."""
    for d in (run.summary, run.meta):
        if d.get("payload_bytes"):
            return int(d["payload_bytes"])
    return None


def algorithm_of(run: Any) -> str:
    """The registry name of the run's algorithm (its :class:`~psgdlab.core.records.rundir.Summary`'s)."""
    return str(run.case.algorithm)


def resolved_algorithm(run: Any) -> Any:
    """The run's algorithm rebuilt from its resolved config (``config.resolved.json``'s
    ``algorithm`` table, as the runtime writes it); ``None`` where there is none or it does not
    build."""
    from psgdlab.core.algorithms import make_algorithm

    params = run.config.get("algorithm")
    if not (isinstance(params, dict) and params.get("algorithm")):
        return None
    params = dict(params)
    try:
        return make_algorithm(params.pop("algorithm"), **params)
    except (TestbedError, TypeError):
        return None


def averages_model(run: Any) -> bool:
    """Whether the run's algorithm allreduces the model at one of the run's steps
    (:func:`psgdlab.core.exchange.folds_model` of its schedule): its allreduce records then also
    hold folding the mean back. The algorithm comes from the resolved config, else from the name
    the run records with its default parameters; one that cannot be rebuilt does not average."""
    from psgdlab.core.algorithms import make_algorithm

    alg = resolved_algorithm(run)
    if alg is None:
        try:
            alg = make_algorithm(algorithm_of(run), n_workers=workers_of(run))
        except (TestbedError, TypeError):
            return False
    steps = np.unique(run.trace["step"]) if run.trace is not None else ()
    return any(folds_model(alg.exchanges(int(s), 0)) for s in steps)


def workers_of(run: Any) -> int:
    """The run's number of workers (its trace's ``n_workers``, else its summary's)."""
    return int(run.meta.get("n_workers") or run.case.workers)


def allreduce_spans(run: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(step, wire bytes, group size, cost)`` of every measured allreduce of ``run``.

    The cost of an allreduce over all the run's workers is its *span*, last end minus last
    arrival: what it adds to the step of the slowest member (the last to arrive waits least, but
    the members need not leave together; docs/measurements.md). For a smaller group (the groups
    are not recorded) it is the shortest member's
    duration. Group sizes come from ``wire = 2 (n-1)/n S`` and the run's payload.
    """
    tr = run.trace
    n_workers = workers_of(run)
    S_model = payload_of(run)
    ar = tr[(tr["kind"] == ExchangeKind.ALLREDUCE) & (tr["phase"] == PHASES["comm"]) & (tr["nbytes"] > 0)]
    if ar.size == 0:
        return (np.array([], dtype=int),) + (np.array([]),) * 3
    keys = np.stack([ar["step"], ar["nbytes"]], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = np.asarray(inv).reshape(-1)
    wire = uniq[:, 1].astype(float)
    if S_model:
        n = allreduce_group_size(wire, S_model)
    else:
        n = np.full(wire.shape, float(n_workers))
    cost = np.empty(len(uniq))
    for i in range(len(uniq)):
        sel = ar[inv == i]
        whole = n[i] == n_workers and sel.size == n_workers
        cost[i] = (
            float(sel["end_s"].max() - sel["start_s"].max()) if whole else float((sel["end_s"] - sel["start_s"]).min())
        )
    return uniq[:, 0].astype(int), wire, n, cost


def _pairwise_durations(trace: np.ndarray, *, from_step: int = 0) -> list[tuple[float, np.ndarray]]:
    """The durations of the pairwise averages of ``trace`` that moved bytes (each from its start,
    phase ``overlap``), of steps ``from_step`` on, per payload size: ``(bytes, durations)``."""
    pw = trace[(trace["kind"] == ExchangeKind.PAIRWISE) & (trace["phase"] == PHASES["overlap"]) & (trace["nbytes"] > 0)]
    pw = pw[pw["step"] >= from_step]
    dur = (pw["end_s"] - pw["start_s"]).astype(float)
    return [(float(size), dur[pw["nbytes"] == size]) for size in np.unique(pw["nbytes"])]


def link_samples(run: Any, *, warmup_steps: int = 2) -> tuple[np.ndarray, ...]:
    """One robust point per exchange kind and payload size of ``run``: ``(durations, model
    payloads, group sizes, pairwise mask, records behind each point, standard error of each
    point within the run)`` (:func:`quantile_se`).

    On a shared machine a single exchange can take many times its usual time, so a point
    summarizes many: allreduces (kind 1, phase comm) give the median of their costs
    (:func:`allreduce_spans`) after ``warmup_steps``; pairwise averages (kind 2, phase overlap),
    which may include waiting for the peer's lock, give the :data:`PAIRWISE_QUANTILE` of their
    durations.
    """
    tr = run.trace
    S_model = payload_of(run)
    pts: list[tuple[float, float, float, bool, int, float]] = []
    step, wire, n, cost = allreduce_spans(run)
    ok = step >= warmup_steps
    for w in np.unique(wire[ok]):
        sel = ok & (wire == w)
        n_w = float(n[sel][0])
        S = float(S_model) if S_model else w * n_w / (2 * (n_w - 1))
        pts.append(
            (float(np.median(cost[sel])), S, n_w, False, int(np.count_nonzero(sel)), quantile_se(cost[sel], 0.5))
        )
    for size, dur in _pairwise_durations(tr):
        q = float(np.quantile(dur, PAIRWISE_QUANTILE))
        pts.append((q, float(size), 2.0, True, int(dur.size), quantile_se(dur, PAIRWISE_QUANTILE)))
    cols = list(zip(*pts)) if pts else [(), (), (), (), (), ()]
    return tuple(np.array(c, dtype=t) for c, t in zip(cols, (float, float, float, bool, int, float)))


#: the quantiles of a pairwise average's duration over its law that a link's ``scatter`` keeps
SCATTER_QUANTILES = tuple(float(q) for q in np.linspace(0.02, 0.98, 25))


def pairwise_scatter(runs: list[Any], *, warmup_steps: int = 2) -> tuple[float, ...]:
    """How the durations of the pairwise averages of the runs of 2 workers among ``runs``
    scatter around the law the calibration fits to them: each average's duration over the
    :data:`PAIRWISE_QUANTILE` of its run's averages of the same payload (the point
    :func:`link_samples` gives the fit), pooled over the runs, at :data:`SCATTER_QUANTILES`
    (``()`` without such averages). Only runs of 2 workers count: theirs are what one average
    meets alone, the scatter of the link, its transport and the processes' wake-ups, not the
    queueing of a larger run."""
    return _scatter_quantiles(
        (dur, float(np.quantile(dur, PAIRWISE_QUANTILE)))
        for run in runs
        if workers_of(run) == 2
        for _size, dur in _pairwise_durations(run.trace, from_step=warmup_steps)
    )


def allreduce_scatter(runs: list[Any], *, warmup_steps: int = 2) -> tuple[float, ...]:
    """How the allreduces of the runs of 2 workers among ``runs`` scatter around the law the
    calibration fits to them: each allreduce's cost (:func:`allreduce_spans`) over the median of
    its run's allreduces of the same payload (the point :func:`link_samples` gives the fit),
    pooled over the runs, at :data:`SCATTER_QUANTILES` (``()`` without such allreduces). Only
    runs of 2 workers count, as in :func:`pairwise_scatter`."""

    def costs(run: Any) -> Iterator[np.ndarray]:
        step, wire, _n, cost = allreduce_spans(run)
        keep = step >= warmup_steps
        for size in np.unique(wire[keep]):
            yield cost[keep & (wire == size)]

    return _scatter_quantiles(
        (dur, float(np.median(dur))) for run in runs if workers_of(run) == 2 for dur in costs(run)
    )


def _scatter_quantiles(samples: Iterable[tuple[np.ndarray, float]]) -> tuple[float, ...]:
    """``(durations, law)`` pairs as durations over their law (a law of 0 skipped), pooled, at
    :data:`SCATTER_QUANTILES`; ``()`` without any."""
    ratios = [dur / law for dur, law in samples if law > 0.0]
    if not ratios:
        return ()
    return tuple(float(x) for x in np.quantile(np.concatenate(ratios), SCATTER_QUANTILES))


def quantile_se(x: np.ndarray, q: float) -> float:
    r"""Standard error of the ``q`` quantile of the sample ``x``, for a normal law of the sample's
    robust spread :math:`\sigma = 1.4826\,\mathrm{MAD}`:
    :math:`\sigma \sqrt{q(1-q)} / (\varphi(\Phi^{-1}(q)) \sqrt{n})` (:math:`1.2533\,\sigma/\sqrt n`
    for the median). Robust to the few exchanges another process stretched.

    >>> round(quantile_se(np.array([1.0, 2.0, 3.0, 4.0]), 0.5), 3)
    0.929
    """
    from scipy import stats

    x = np.asarray(x, dtype=float)
    if x.size < 2:
        return 0.0
    sigma = 1.4826 * float(np.median(np.abs(x - np.median(x))))
    z = stats.norm.ppf(q)
    return float(sigma * np.sqrt(q * (1 - q)) / (stats.norm.pdf(z) * np.sqrt(x.size)))


def step_gaps(trace: np.ndarray, *, warmup_steps: int = 2) -> np.ndarray:
    """``(rank, step, gap)`` rows: each worker's host time from the end of step ``step``'s last
    compute, comm or wait record to the start of its next compute (the update, the snapshot of
    the weights, the loop; the merge of an average the training thread folds back)."""
    keep = np.isin(trace["phase"], [PHASES["compute"], PHASES["comm"], PHASES["wait"]])
    tr = trace[keep & (trace["step"] >= warmup_steps)]
    rows = []
    for r in np.unique(tr["rank"]):
        mine = tr[tr["rank"] == r]
        comp = mine[mine["phase"] == PHASES["compute"]]
        starts = dict(zip(comp["step"].tolist(), comp["start_s"].tolist()))
        for s in np.unique(mine["step"]):
            if int(s) + 1 in starts:
                rows.append((int(r), int(s), starts[int(s) + 1] - float(mine["end_s"][mine["step"] == s].max())))
    return np.array(rows, dtype=float).reshape(-1, 3)


def merging_steps(run: Any, gaps: np.ndarray) -> np.ndarray:
    """For each ``(rank, step)`` row of ``gaps``, whether the run's training thread folded an
    average back in that step (:func:`psgdlab.core.exchange.trainer_merges` of the schedule of
    the algorithm in its resolved config). A run whose algorithm cannot be rebuilt counts every
    step of a run with pairwise exchanges."""
    alg = resolved_algorithm(run)
    if alg is not None:
        return np.array([trainer_merges(alg.exchanges(int(s), int(r))) for r, s, _ in gaps], dtype=bool)
    tr = run.trace
    return np.full(len(gaps), bool(np.any((tr["kind"] == ExchangeKind.PAIRWISE) & (tr["nbytes"] > 0))))


def allreduce_algorithm_of(runs: list[Any]) -> str:
    """The allreduce schedule the runs' transport used (``allreduce_algorithm`` of the trace
    metadata, :data:`psgdlab.core.exchange.ALLREDUCE_ALGORITHMS`): the latency rounds of the
    fits depend on it. Runs that do not record it (older runs, other tools) say nothing; none
    recording it means ``ring``. Runs of different schedules are refused: the fit would mix
    two cost laws."""
    said = {str(a) for r in runs if (a := r.meta.get("allreduce_algorithm") or r.summary.get("allreduce_algorithm"))}
    for a in said:
        if a not in ALLREDUCE_ALGORITHMS:
            raise ConfigError(f"allreduce_algorithm {a!r} of the runs is not one of {', '.join(ALLREDUCE_ALGORITHMS)}")
    if len(said) > 1:
        raise ConfigError(
            f"the runs used different allreduce schedules {sorted(said)} (a transport each); "
            "calibrate the runs of one transport at a time"
        )
    return said.pop() if said else "ring"
