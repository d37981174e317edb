r"""Fitting a platform profile from measured traces.

- :func:`fit_compute_time`: the per-step compute-time distribution from compute records,
  as a log-normal matched to the measured median and 95th percentile (the form
  :class:`psgdlab.core.timing.ComputeTime` reads), with the sample mean and the
  Kolmogorov–Smirnov distance between the sample and the fitted law as the residual.
- :func:`fit_link`: latency :math:`\alpha` and bandwidth :math:`\beta` of one link class from
  exchanges of different sizes, by least squares on the cost model of each exchange kind
  (pairwise: :math:`t = \alpha + S/\beta`; allreduce over ``n``:
  :math:`t = R(n)\alpha + 2(n-1)/n \cdot S/\beta` with :math:`R` the rounds of the
  implementation's schedule, :func:`psgdlab.core.exchange.allreduce_rounds`: :math:`2(n-1)` for a
  ring), with per-record residuals.

Both refuse to guess: too few records, a single payload size (bandwidth and latency cannot be
separated), or a negative fitted bandwidth raise :class:`psgdlab.core.errors.ConfigError` saying
what more data is needed.

Examples
--------
>>> import numpy as np
>>> sizes = np.array([1e3, 1e5, 1e6, 1e7] * 3)
>>> times = 20e-6 + sizes / 2e9
>>> fit = fit_link(times, sizes)
>>> round(fit["latency_s"] * 1e6, 3), round(fit["bandwidth_bytes_per_s"] / 1e9, 3)
(20.0, 2.0)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from psgdlab.core.cost import (
    ALLREDUCE_ALGORITHMS,
    HOST_AVERAGE_TRAFFIC,
    allreduce_group_size,
    allreduce_terms,
    transfer_s,
    transfer_terms,
)
from psgdlab.core.errors import ConfigError, TestbedError
from psgdlab.core.exchange import ExchangeKind, folds_model, trainer_merges
from psgdlab.core.profile import Defaults, HostCPU, Link, Platform, Profile, ServerSpec, Workload
from psgdlab.core.trace import PHASES

__all__ = [
    "fit_compute_time",
    "fit_link",
    "fit_links",
    "fit_overhead_per_byte",
    "step_gaps",
    "calibrate_runs",
    "platform_profile",
    "allreduce_algorithm_of",
    "MIN_RECORDS",
    "PAIRWISE_QUANTILE",
    "SERVER_QUANTILE",
]

MIN_RECORDS = 8
#: pairwise records may include waiting for the peer's lock: keep those at or below this
#: quantile of their payload size
PAIRWISE_QUANTILE = 0.25
#: server records include queueing behind other workers, which a calibration run of 2 workers
#: rarely meets: the service time is this quantile of the excess over the link (the median; a
#: low quantile picks the luckiest requests and underestimated easgd's step in validation)
SERVER_QUANTILE = 0.5


def fit_compute_time(trace: np.ndarray, *, warmup_steps: int = 2) -> dict[str, Any]:
    r"""Fit the compute-time distribution of ``trace``'s compute records (after ``warmup_steps``).

    A log-normal matched to the sample's median and 95th percentile,
    :math:`\mu = \ln t_{50}`, :math:`\sigma = \ln(t_{95}/t_{50}) / 1.645`: the tail up to p95 is
    kept, but a few steps of another process's burst (on a shared machine one step in a hundred
    can last 20 times its usual time) do not move it, whereas they make the moment fit's
    coefficient of variation 100 times too large. The sample mean is reported beside it.
    """
    sel = trace[(trace["phase"] == PHASES["compute"]) & (trace["step"] >= warmup_steps)]
    d = (sel["end_s"] - sel["start_s"]).astype(float)
    d = d[d > 0]
    if d.size < MIN_RECORDS:
        raise ConfigError(
            f"too little data to fit compute time: {d.size} compute records after "
            f"{warmup_steps} warm-up steps (need >= {MIN_RECORDS}); run more steps"
        )
    p50, p95 = float(np.median(d)), float(np.percentile(d, 95))
    mu, sigma = math.log(p50), math.log(p95 / p50) / stats.norm.ppf(0.95)
    mean, cv = math.exp(mu + sigma * sigma / 2), math.sqrt(math.expm1(sigma * sigma))
    ks = float(stats.kstest(d, "lognorm", args=(sigma, 0, p50)).statistic) if sigma > 0 else 0.0
    return {
        "kind": "lognormal",
        "mean_s": mean,
        "cv": cv,
        "p50_s": p50,
        "p95_s": p95,
        "sample_mean_s": float(d.mean()),
        "samples": int(d.size),
        "ks_distance": ks,
        "spec": f"lognormal:{mean:.6g}:{cv:.6g}",
    }


def fit_link(
    durations_s: np.ndarray,
    payload_bytes: np.ndarray,
    *,
    group_sizes: np.ndarray | None = None,
    pairwise: np.ndarray | None = None,
    records: int | None = None,
    algorithm: str = "ring",
) -> dict[str, Any]:
    r"""Least-squares latency and bandwidth from exchange durations and payloads.

    Parameters
    ----------
    durations_s, payload_bytes : array
        One entry per measured exchange (``S`` is the model bytes moved, not the wire bytes).
    group_sizes : array, optional
        Ranks in each exchange's allreduce group (``None`` or 2 entries mean pairwise exchanges).
    pairwise : bool array, optional
        Marks the pairwise exchanges explicitly; every other entry is then an allreduce over
        its ``group_sizes`` entry, a group of 2 included (:math:`2\alpha + S/\beta`).
    records : int, optional
        Measured exchanges behind the entries when each entry summarizes several (default: one
        each); at least :data:`MIN_RECORDS` are needed.
    algorithm : str
        The allreduces' schedule (:data:`psgdlab.core.exchange.ALLREDUCE_ALGORITHMS`), which sets
        their latency rounds; alike for groups of 2.
    """
    t = np.asarray(durations_s, dtype=float)
    S = np.asarray(payload_bytes, dtype=float)
    if t.size != S.size:
        raise ConfigError(f"durations ({t.size}) and payloads ({S.size}) must have the same length")
    records = t.size if records is None else int(records)
    if records < MIN_RECORDS or t.size < 2:
        raise ConfigError(f"too little data to fit a link: {records} exchanges (need >= {MIN_RECORDS})")
    if np.unique(S).size < 2:
        raise ConfigError(
            "cannot separate latency from bandwidth with a single payload size; measure exchanges of at least two sizes"
        )
    if group_sizes is None:
        a_coef, b_coef = transfer_terms(S)
    else:
        n = np.asarray(group_sizes, dtype=float)
        pair = n <= 2 if pairwise is None else np.asarray(pairwise, dtype=bool)
        rounds, sent = allreduce_terms(n, S, algorithm)
        a_coef = np.where(pair, transfer_terms(S)[0], rounds)
        b_coef = np.where(pair, transfer_terms(S)[1], sent)
    X = np.column_stack([a_coef, b_coef])
    (alpha, inv_beta), *_ = np.linalg.lstsq(X, t, rcond=None)
    if inv_beta <= 0:
        raise ConfigError(
            f"fitted bandwidth is not positive (1/beta = {inv_beta:.3g} s/B): the durations do not "
            "grow with payload size; measure larger payloads"
        )
    pred = X @ np.array([alpha, inv_beta])
    resid = t - pred
    return {
        "latency_s": float(max(alpha, 0.0)),
        "bandwidth_bytes_per_s": float(1.0 / inv_beta),
        "samples": records,
        "points": int(t.size),
        "rms_residual_s": float(np.sqrt(np.mean(resid**2))),
        "max_rel_residual": float(np.max(np.abs(resid) / np.maximum(t, 1e-12))),
    }


# ----- calibration from run directories -----------------------------------------------------------


def _payload_of(run: Any) -> int | None:
    for d in (run.summary, run.meta):
        if d.get("payload_bytes"):
            return int(d["payload_bytes"])
    return None


def _algorithm_of(run: Any) -> str:
    a = run.summary.get("algorithm") or run.meta.get("algorithm") or ""
    return str(a.get("algorithm", "") if isinstance(a, dict) else a)


def _resolved_algorithm(run: Any) -> Any:
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


def _averages_model(run: Any) -> bool:
    """Whether the run's algorithm allreduces the model at one of the run's steps
    (:func:`psgdlab.core.exchange.folds_model` of its schedule): its allreduce records then also
    hold folding the mean back. The algorithm comes from the resolved config, else from the name
    the run records with its default parameters; one that cannot be rebuilt does not average."""
    from psgdlab.core.algorithms import make_algorithm

    alg = _resolved_algorithm(run)
    if alg is None:
        try:
            alg = make_algorithm(_algorithm_of(run), n_workers=_workers_of(run))
        except (TestbedError, TypeError):
            return False
    steps = np.unique(run.trace["step"]) if run.trace is not None else ()
    return any(folds_model(alg.exchanges(int(s), 0)) for s in steps)


def _workers_of(run: Any) -> int:
    n = run.meta.get("n_workers") or run.summary.get("workers")
    if n is None:
        raise ConfigError(f"{run.path}: cannot tell the number of workers (no n_workers in the trace metadata)")
    return int(n)


def allreduce_spans(run: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(step, wire bytes, group size, cost)`` of every measured allreduce of ``run``.

    The cost of an allreduce over all the run's workers is its *span*, last end minus last
    arrival: what it adds to the step of the slowest member (the last to arrive waits least, but
    the members need not leave together; docs/measurements.md). For a smaller group (the groups
    are not recorded) it is the shortest member's
    duration. Group sizes come from ``wire = 2 (n-1)/n S`` and the run's payload.
    """
    tr = run.trace
    n_workers = _workers_of(run)
    S_model = _payload_of(run)
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


def _link_samples(run: Any, *, warmup_steps: int = 2) -> tuple[np.ndarray, ...]:
    """One robust point per exchange kind and payload size of ``run``: ``(durations, model
    payloads, group sizes, pairwise mask, records behind each point)``.

    The machine is shared, so single exchanges can take 100 times their usual time; a point
    summarizes many: allreduces (kind 1, phase comm) give the median of their costs
    (:func:`allreduce_spans`) after ``warmup_steps``; pairwise averages (kind 2, phase overlap),
    which may include waiting for the peer's lock, give the :data:`PAIRWISE_QUANTILE` of their
    durations.
    """
    tr = run.trace
    S_model = _payload_of(run)
    pts: list[tuple[float, float, float, bool, int]] = []
    step, wire, n, cost = allreduce_spans(run)
    ok = step >= warmup_steps
    for w in np.unique(wire[ok]):
        sel = ok & (wire == w)
        n_w = float(n[sel][0])
        S = float(S_model) if S_model else w * n_w / (2 * (n_w - 1))
        pts.append((float(np.median(cost[sel])), S, n_w, False, int(np.count_nonzero(sel))))
    pw = tr[(tr["kind"] == ExchangeKind.PAIRWISE) & (tr["phase"] == PHASES["overlap"]) & (tr["nbytes"] > 0)]
    for size in np.unique(pw["nbytes"]):
        dur = (pw["end_s"] - pw["start_s"])[pw["nbytes"] == size].astype(float)
        pts.append((float(np.quantile(dur, PAIRWISE_QUANTILE)), float(size), 2.0, True, int(dur.size)))
    cols = list(zip(*pts)) if pts else [(), (), (), (), ()]
    return tuple(np.array(c, dtype=t) for c, t in zip(cols, (float, float, float, bool, int)))


def fit_links(
    t: np.ndarray, S: np.ndarray, n: np.ndarray, pair: np.ndarray, rec: np.ndarray, *, algorithm: str = "ring"
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The point-to-point link and, apart from it, the allreduce's (``collective``) from the
    points of :func:`_link_samples` (durations, payloads, group sizes, pairwise mask, records).

    An implementation's allreduce need not move bytes as its point-to-point transfers do (gloo's
    ring against its ``isend``/``irecv``, docs/measurements.md): with at least two payload sizes
    and :data:`MIN_RECORDS` records of each kind,
    the pairwise points fit the link and the allreduce points the collective; otherwise one fit
    over every point is the link and the collective is ``None`` (the simulator then derives it
    from the link). ``algorithm``: the allreduces' schedule, as in :func:`fit_link`.
    """

    def enough(sel: np.ndarray) -> bool:
        return np.unique(S[sel]).size >= 2 and int(rec[sel].sum()) >= MIN_RECORDS

    def one(sel: np.ndarray) -> dict[str, Any]:
        fit = fit_link(
            t[sel], S[sel], group_sizes=n[sel], pairwise=pair[sel], records=int(rec[sel].sum()), algorithm=algorithm
        )
        fit["allreduce_samples"] = int(rec[sel & ~pair].sum())
        fit["pairwise_samples"] = int(rec[sel & pair].sum())
        fit["payload_sizes_bytes"] = sorted({int(x) for x in S[sel]})
        return fit

    if enough(pair) and enough(~pair):
        return one(pair), one(~pair)
    return one(np.ones(t.shape, dtype=bool)), None


def fit_overhead_per_byte(points: list[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)`` of the step overhead :math:`a + bS` from ``(payload bytes, overhead)`` per run:
    the update and the weight snapshots pass over the model, so the host work grows with it.
    The median per payload size,
    then a line through those medians (``b >= 0``); one size gives ``(median, 0)``."""
    if not points:
        return 0.0, 0.0
    S = np.array([p[0] for p in points])
    g = np.array([p[1] for p in points])
    sizes = np.unique(S)
    med = np.array([np.median(g[S == x]) for x in sizes])
    if sizes.size < 2:
        return max(float(med[0]), 0.0), 0.0
    b, a = np.polyfit(sizes, med, 1)
    if b <= 0:
        return max(float(np.median(g)), 0.0), 0.0
    return max(float(a), 0.0), float(b)


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


def calibrate_runs(run_dirs: Any, *, warmup_steps: int = 2, cores: int | None = None) -> dict[str, Any]:
    r"""Fit this machine's platform profile from runtime run directories.

    Runs with at most ``cores`` workers (every worker has a core) give ``compute``
    (:func:`fit_compute_time` over their compute records) with its ``step_overhead_fixed_s`` and
    ``step_overhead_s_per_byte`` (``[platform] step_overhead_s``, ``_per_byte``: the median of
    :func:`step_gaps` per run, :math:`a + bS` over the runs' payloads by
    :func:`fit_overhead_per_byte`; ``step_overhead_s`` is its value at the largest payload), from
    the runs whose training threads never fold an average back when there are some, the steps
    that do giving ``mix_merge`` (:func:`_fit_mix_merge`),
    ``link`` and ``collective``
    (:func:`fit_links` over their allreduce and pairwise records, see :func:`_link_samples`) and
    ``server`` (service overhead: the :data:`SERVER_QUANTILE` of the server-exchange durations
    minus :math:`\alpha + S/\beta`, ``None`` without server records). Runs with more workers
    than cores give ``host_cpu`` (:func:`psgdlab.analysis.cores.fit_host_cpu`; ``None`` without
    such runs). ``cores`` defaults to the ``cpu_count`` the runs recorded in ``env.json`` (no
    count: every run counts as uncontended). Also returned: what the runs were (``runs``,
    ``payload_bytes``, ``itemsize``, ``batch``, ``max_workers``, ``cores``). Too little data
    raises :class:`ConfigError` (from the fits).
    """
    from psgdlab.analysis.cores import cores_of, fit_host_cpu
    from psgdlab.analysis.load import load_run

    runs = [load_run(p) for p in run_dirs]
    if not runs:
        raise ConfigError("calibration needs at least one run directory")
    for run in runs:
        if run.trace is None:
            raise ConfigError(f"{run.path} has no trace.npz to calibrate from")
    cores = cores if cores is not None else cores_of(runs)
    free = [r for r in runs if cores is None or _workers_of(r) <= cores]
    busy = [r for r in runs if r not in free]
    if not free:
        raise ConfigError(
            f"every run has more workers than the {cores} cores: the link and the compute time are "
            f"fitted from runs with at most {cores} workers"
        )
    compute = fit_compute_time(np.concatenate([r.trace for r in free]), warmup_steps=warmup_steps)
    # the step overhead of runs whose training threads never fold an average back, and beyond it
    # that merge, from the steps that do it (an AD-PSGD run's active sides)
    base, merging, passive, sizes = [], [], [], []
    for r in free:
        assert r.trace is not None  # checked above
        gaps = step_gaps(r.trace, warmup_steps=warmup_steps)
        if not gaps.size:
            continue
        S = float(_payload_of(r) or 0)
        sizes.append(S)
        merges = _merging_steps(r, gaps)
        if not merges.any():
            base.append((S, float(np.median(gaps[:, 2]))))
            continue
        merging.append((S, float(np.median(gaps[merges, 2]))))
        if not merges.all():
            passive.append((S, float(np.median(gaps[~merges, 2]))))
    fixed, per_byte = fit_overhead_per_byte(base or merging)
    mix_merge = _fit_mix_merge(merging, passive, fixed, per_byte) if base else None
    compute.update(
        step_overhead_fixed_s=fixed,
        step_overhead_s_per_byte=per_byte,
        step_overhead_s=fixed + per_byte * max(sizes, default=0.0),
    )
    averaging = [r for r in free if _averages_model(r)]
    plain = [r for r in free if r not in averaging]
    if not plain:
        names = ", ".join(_algorithm_of(r) for r in free)
        raise ConfigError(
            "the link is fitted from runs without model averaging (ssgd, adpsgd, ...); every run "
            f"with at most {cores} workers allreduces the model ({names})"
        )
    algorithm = allreduce_algorithm_of(runs)
    parts = [_link_samples(r, warmup_steps=warmup_steps) for r in plain]
    link, collective = fit_links(*(np.concatenate([p[i] for p in parts]) for i in range(5)), algorithm=algorithm)
    model_average = _fit_model_average(averaging, collective or link, algorithm=algorithm, warmup_steps=warmup_steps)
    server = _fit_server(free, link)
    host_cpu = None
    if busy:
        assert cores is not None  # without a core count every run is free
        host_cpu = fit_host_cpu(
            busy,
            cores=int(cores),
            link=collective or link,
            spans=allreduce_spans,
            payload_of=_payload_of,
            workers_of=_workers_of,
            warmup_steps=warmup_steps,
            algorithm=algorithm,
        )
    payloads = [p for p in (_payload_of(r) for r in free) if p]
    itemsizes = [int(r.summary.get("itemsize") or r.meta.get("itemsize") or 0) for r in runs]
    batches = [int(r.summary.get("samples_per_step") or r.meta.get("samples_per_step") or 0) for r in runs]
    return {
        "compute": compute,
        "link": link,
        "collective": collective,
        "server": server,
        "host_cpu": host_cpu,
        "model_average": model_average,
        "mix_merge": mix_merge,
        "cores": cores,
        "allreduce_algorithm": algorithm,
        "runs": [str(r.path) for r in runs],
        "payload_bytes": payloads,
        "itemsize": max(itemsizes) or None,
        "batch": max(batches) or None,
        "max_workers": max(_workers_of(r) for r in runs),
    }


def _merging_steps(run: Any, gaps: np.ndarray) -> np.ndarray:
    """For each ``(rank, step)`` row of ``gaps``, whether the run's training thread folded an
    average back in that step (:func:`psgdlab.core.exchange.trainer_merges` of the schedule of
    the algorithm in its resolved config). A run whose algorithm cannot be rebuilt counts every
    step of a run with pairwise exchanges."""
    alg = _resolved_algorithm(run)
    if alg is not None:
        return np.array([trainer_merges(alg.exchanges(int(s), int(r))) for r, s, _ in gaps], dtype=bool)
    tr = run.trace
    return np.full(len(gaps), bool(np.any((tr["kind"] == ExchangeKind.PAIRWISE) & (tr["nbytes"] > 0))))


def _fit_mix_merge(
    merging: list[tuple[float, float]], passive: list[tuple[float, float]], fixed: float, per_byte: float
) -> dict[str, Any] | None:
    r"""Host work of the training thread folding an average back (``[platform] mix_merge_s``,
    ``mix_merge_s_per_byte``): the median step overhead of the steps that do it (``(payload,
    overhead)`` per run: :func:`_merging_steps`) beyond the overhead line :math:`a + bS` of the
    runs without averages, then :func:`fit_overhead_per_byte` over those excesses. A passive
    side merges in its responder thread, off its step: its own excess (``passive_excess_s``, per
    run) is reported, not priced. ``None`` without such runs."""
    if not merging:
        return None
    out = _overhead_line([(S, max(g - (fixed + per_byte * S), 0.0)) for S, g in merging])
    out["passive_excess_s"] = [round(g - (fixed + per_byte * S), 6) for S, g in sorted(passive)]
    return out


def _overhead_line(points: list[tuple[float, float]]) -> dict[str, Any]:
    """:func:`fit_overhead_per_byte` of ``(payload bytes, excess)`` per run, with the points
    behind it (the fold of an averaged model, the merge of a pairwise one)."""
    a, b = fit_overhead_per_byte(points)
    return {
        "fixed_s": a,
        "s_per_byte": b,
        "runs": len(points),
        "excess_s": [round(x, 6) for _, x in sorted(points)],
        "payloads_bytes": [int(S) for S, _ in sorted(points)],
    }


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


def _fit_model_average(
    runs: list[Any], link: dict[str, Any], *, algorithm: str = "ring", warmup_steps: int
) -> dict[str, Any] | None:
    r"""Host work of folding an averaged model back (``[platform] model_average_s``, ``_s_per_byte``)
    from model-averaging runs (:func:`_averages_model`): their allreduce records hold the clone,
    the allreduce and the algorithm's combine, so per run the median span beyond the ring model
    of ``link`` (:func:`psgdlab.analysis.cores.span_excess`), then :math:`a + bS` over the runs'
    payloads (:func:`fit_overhead_per_byte`). ``None`` without such runs."""
    from psgdlab.analysis.cores import span_excess

    pts = []
    for r in runs:
        S = _payload_of(r)
        got = (
            span_excess(
                r,
                allreduce_spans,
                n_workers=_workers_of(r),
                payload_bytes=float(S or 0),
                link=link,
                warmup_steps=warmup_steps,
                algorithm=algorithm,
            )
            if S
            else None
        )
        if got is not None:
            pts.append((float(S or 0), got[0]))
    return _overhead_line(pts) if pts else None


def _fit_server(runs: list[Any], link: dict[str, Any]) -> dict[str, Any] | None:
    r"""Server service time beyond the link, :math:`t - \alpha - S/\beta`: with one payload size its
    :data:`SERVER_QUANTILE`; with two or more, per size that quantile, fitted as
    ``overhead + 3 S / memory bandwidth`` (the server's update reads the model and the message and
    writes the model: ``apply_on_host``) when it grows with the size."""
    srv_d, srv_s = [], []
    for r in runs:
        tr = r.trace
        sel = tr[(tr["kind"] == ExchangeKind.SERVER) & (tr["phase"] == PHASES["comm"]) & (tr["nbytes"] > 0)]
        srv_d.append((sel["end_s"] - sel["start_s"]).astype(float))
        srv_s.append(sel["nbytes"].astype(float))
    sd, ss = np.concatenate(srv_d), np.concatenate(srv_s)
    if sd.size < MIN_RECORDS:
        return None
    excess = sd - transfer_s(ss, link["bandwidth_bytes_per_s"], link["latency_s"])
    sizes = np.unique(ss)
    per_size = np.array([np.quantile(excess[ss == x], SERVER_QUANTILE) for x in sizes])
    out = {"samples": int(sd.size), "median_excess_s": float(np.median(excess)), "memory_bandwidth_bytes_per_s": None}
    traffic = HOST_AVERAGE_TRAFFIC * sizes  # the update's memory traffic (core.cost.host_average_s)
    slope = np.polyfit(traffic, per_size, 1)[0] if sizes.size >= 2 else 0.0
    if slope > 0:
        overhead = float(np.mean(per_size - slope * traffic))
        out["memory_bandwidth_bytes_per_s"] = float(1.0 / slope)
    else:
        overhead = float(np.quantile(excess, SERVER_QUANTILE))
    out["service_overhead_s"] = max(overhead, 0.0)
    return out


def platform_profile(
    calibration: dict[str, Any],
    *,
    name: str = "calibrated",
    devices: int | None = None,
    n_params: int | None = None,
    itemsize: int | None = None,
    batch: int | None = None,
    workers: tuple[int, ...] | None = None,
) -> Profile:
    """The simulator's platform profile (:class:`psgdlab.core.profile.Profile`) of a
    :func:`calibrate_runs` fit, with the fit's residuals as its notes.

    One host (this machine) of ``devices`` devices (default: the largest worker count of the
    runs), each behind its own link (``sockets_per_host = devices``: the fitted link already is
    what one worker gets, it is not shared again); the fitted link is both ``pcie`` and ``nic``,
    staging ``direct``; the server is the fitted link plus the fitted service overhead; with a
    ``host_cpu`` fit, ``host_cpu`` (the host's cores and the CPU work of communication); with a
    ``collective`` fit, ``collective`` (the allreduce's own link); ``allreduce``, the runs'
    schedule (:func:`allreduce_algorithm_of`). The workload is ``n_params`` items of ``itemsize``
    bytes (default: the runs' payload) with the fitted compute distribution at ``batch``;
    ``workers``, the sweep's default worker counts.
    """
    comp, link, srv = calibration["compute"], calibration["link"], calibration["server"]
    cpu = calibration.get("host_cpu")
    devices = int(devices or calibration["max_workers"])
    itemsize = int(itemsize or calibration.get("itemsize") or 4)
    if n_params is None:
        payloads = calibration.get("payload_bytes") or []
        if not payloads:
            raise ConfigError("the runs do not record their payload (payload_bytes); give n_params")
        n_params = max(1, int(max(payloads)) // itemsize)
    batch = int(batch or calibration.get("batch") or 1)
    overhead = (
        comp.get("step_overhead_fixed_s", comp.get("step_overhead_s", 0.0)),
        comp.get("step_overhead_s_per_byte", 0.0),
    )
    lat, bw = link["latency_s"], link["bandwidth_bytes_per_s"]
    coll_fit = calibration.get("collective")
    avg = calibration.get("model_average")
    mix = calibration.get("mix_merge")
    mem_bw = srv.get("memory_bandwidth_bytes_per_s") if srv else None
    fitted_link = Link(latency_s=float(lat), bandwidth_bytes_per_s=float(bw))
    memory: dict[str, Any] = {"host_memory_bandwidth_bytes_per_s": float(mem_bw)} if mem_bw else {}
    platform = Platform(
        name=name,
        description="this machine, fitted from measured runs (loopback transport, emulated devices)",
        hosts=1,
        devices_per_host=devices,
        sockets_per_host=devices,
        device="cpu-process",
        pcie=fitted_link,
        nic=fitted_link,
        collective=Link(
            latency_s=float(coll_fit["latency_s"]), bandwidth_bytes_per_s=float(coll_fit["bandwidth_bytes_per_s"])
        )
        if coll_fit
        else None,
        allreduce=calibration.get("allreduce_algorithm") or "ring",
        **memory,
        model_average_s=float(avg["fixed_s"]) if avg else 0.0,
        model_average_s_per_byte=float(avg["s_per_byte"]) if avg else 0.0,
        mix_merge_s=float(mix["fixed_s"]) if mix else 0.0,
        mix_merge_s_per_byte=float(mix["s_per_byte"]) if mix else 0.0,
        step_overhead_s=float(overhead[0]),
        step_overhead_s_per_byte=float(overhead[1]),
        staging="direct",
        server=ServerSpec(
            latency_s=float(lat),
            bandwidth_bytes_per_s=float(bw),
            service_overhead_s=float(srv["service_overhead_s"]) if srv else 0.0,
            apply_on_host=bool(mem_bw),
        ),
        host_cpu=HostCPU(
            cores_per_host=int(cpu["cores_per_host"]),
            work_per_message_s=float(cpu["work_per_message_s"]),
            work_per_byte_s=float(cpu["work_per_byte_s"]),
        )
        if cpu
        else None,
    )
    workload = Workload(
        name=name + "-workload",
        description="the calibration runs' model",
        n_params=int(n_params),
        itemsize=itemsize,
        compute=comp["spec"],
        reference_batch=batch,
        batch_per_worker=batch,
    )
    defaults = Defaults(workers=tuple(int(w) for w in workers)) if workers else Defaults()
    notes = [
        f"Platform profile fitted by `psgdlab calibrate` from {len(calibration['runs'])} run(s):",
        *[f"  {r}" for r in calibration["runs"]],
        "Residuals of the fit:",
        f"  compute: lognormal mean {comp['mean_s']:.6g} s, cv {comp['cv']:.4g} (sample mean "
        f"{comp.get('sample_mean_s', comp['mean_s']):.6g} s), median {comp['p50_s']:.6g} s, "
        f"p95 {comp['p95_s']:.6g} s, {comp['samples']} records, Kolmogorov-Smirnov distance {comp['ks_distance']:.4g}",
        f"  link: {link['samples']} exchanges ({link['allreduce_samples']} allreduce, {link['pairwise_samples']} "
        f"pairwise) of sizes {link['payload_sizes_bytes']} B in {link['points']} points (median allreduce span, "
        f"low quantile of pairwise durations per run and size), rms residual {link['rms_residual_s']:.4g} s, "
        f"max relative residual {link['max_rel_residual']:.4g}",
        (
            "  collective (allreduce, fitted apart from the pairwise exchanges): "
            + (
                f"{coll_fit['latency_s']:.4g} s + S / {coll_fit['bandwidth_bytes_per_s']:.4g} B/s from "
                f"{coll_fit['samples']} allreduces, rms residual {coll_fit['rms_residual_s']:.4g} s, max relative "
                f"residual {coll_fit['max_rel_residual']:.4g}"
                if coll_fit
                else "not fitted apart (too few allreduce or pairwise sizes): the link's"
            )
        ),
        (
            "  server: "
            + (
                f"service overhead {srv['service_overhead_s']:.4g} s, update at "
                f"{srv['memory_bandwidth_bytes_per_s'] or 0:.4g} B/s of memory (0: not fitted) from "
                f"{srv['samples']} requests (median excess over the link {srv['median_excess_s']:.4g} s)"
                if srv
                else "no server exchanges measured; overhead 0"
            )
        ),
        (
            "  model average (the fold of an averaged model back, beyond the allreduce): "
            + (
                f"{avg['fixed_s']:.4g} s + {avg['s_per_byte']:.4g} s per byte from {avg['runs']} runs (excess "
                f"{avg['excess_s']} s at {avg['payloads_bytes']} B)"
                if avg
                else "no model-averaging runs: 0"
            )
        ),
        f"  step overhead (host work between a step's exchanges and the next compute, apart from the compute: "
        f"a straggler does not slow it): {overhead[0] + overhead[1] * n_params * itemsize:.4g} s at "
        f"{n_params * itemsize} B ({overhead[0]:.4g} s + {overhead[1]:.4g} s per byte of model)",
        (
            "  merge of an average by the training thread: "
            + (
                f"{mix['fixed_s']:.4g} s + {mix['s_per_byte']:.4g} s per byte from {mix['runs']} runs (excess "
                f"{mix['excess_s']} s at {mix['payloads_bytes']} B; the passive sides' own excess, not priced: "
                f"{mix.get('passive_excess_s', [])} s)"
                if mix
                else "no runs with pairwise averages: 0"
            )
        ),
        (
            "  host cores: "
            + (
                f"{cpu['cores_per_host']} cores; CPU work {cpu['work_per_message_s']:.4g} s per "
                f"message, {cpu['work_per_byte_s']:.4g} s per byte from {cpu['records']} allreduces in "
                f"runs with more workers than cores (median excess {cpu['median_excess_s']} s, "
                f"rms residual "
                f"{cpu['rms_residual_s']:.4g} s)"
                if cpu
                else "no run had more workers than cores: the cores are not modelled"
            )
        ),
    ]
    return Profile(platform=platform, workload=workload, defaults=defaults, notes=tuple(notes))
