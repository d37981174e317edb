r"""Predictions: sweep algorithms x worker counts on one platform and summarise each run.

Each (algorithm, workers) configuration is simulated over a *window* of local steps, its trace
summarised with :func:`psgdlab.core.records.trace.summarize` (the first 10 % of steps left out as warm-up),
and the long run extrapolated from the window:

- ``step_time_s`` -- mean time per local step of one worker in the steady window,
  :math:`n b / \text{samples\_per\_s}`;
- ``speedup`` -- ``samples_per_s`` over that of single-worker SGD (same platform, workload and
  per-worker batch, no stragglers);
- ``epoch_time_s`` = ``samples_per_epoch / samples_per_s``;
- ``time_to_train_s`` = steps needed for the workload's epochs (per worker,
  :math:`\lceil E N / (n b) \rceil`) :math:`\times` ``step_time_s`` -- **extrapolated** from the
  window, which the summary names (``extrapolation``).

With a convergence profile (:mod:`psgdlab.core.convergence`) a row also carries the time to a
target (:func:`target_row`): whether the configuration reaches it (``reaches_target``, and
``target_reason`` when not), ``steps_to_target`` per worker, ``time_to_target_s`` = steps
:math:`\times` ``step_time_s`` and ``gpu_hours_to_target``, with 90 % intervals that combine the
step time's log-sd and the convergence model's.

The window is steady when the throughput of its two halves differs by less than
``STEADY_TOLERANCE``; if not, it is doubled (up to four times) before extrapolating, and the
summary says whether steadiness was reached.

Every row also carries a 90 % interval for each of those five figures (``KEY_low``,
``KEY_high``) and says what it holds (``interval``; ``has_unpinned_parameters``;
``noise_extrapolated``: more worker processes per core, ``processes_per_core``, than any run
the profile's noise was measured on, ``noise_processes_per_core``): the profile's
parameter uncertainty propagated by the delta method, the simulated window's own noise and the
profile's run-to-run noise, as :mod:`psgdlab.core.records.intervals` defines them. The parameter
sensitivities re-simulate the configuration along each principal direction of the parameters'
covariance, with the same seed, over a window of :func:`sensitivity_window` steps
(``SENSITIVITY_STEPS`` per worker up to eight workers and as many worker-steps beyond, at least
four sync periods, at most the prediction's window): a sensitivity is a difference under common
random numbers, which a short window gives nearly as well as a long one, at a seventh of the cost.
A profile without ``[uncertainty]`` costs no extra simulation.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from psgdlab.core.algorithms import ALGORITHMS, Algorithm, algorithm_from_flags, algorithm_parameters, check_flags
from psgdlab.core.convergence import ConvergenceProfile, Target, predict_steps, setting_of, target_columns
from psgdlab.core.errors import ConfigError, require
from psgdlab.core.platform.failure import check_on_failure
from psgdlab.core.platform.machine import set_parent_death_signal
from psgdlab.core.platform.profile import Profile
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.core.records.intervals import (
    INTERVAL_KEYS,
    Spread,
    batch_log_step_times,
    central_sensitivities,
    directions,
    interval_description,
    log_step_time,
    row_intervals,
)
from psgdlab.core.records.rows import (
    Extrapolation,
    IntervalInfo,
    IntervalLogSd,
    PredictionRow,
    RowIntervals,
    TargetColumns,
)
from psgdlab.core.records.trace import PHASES, summarize
from psgdlab.sim.engine import SimResult, simulate
from psgdlab.sim.failures import FailureRequest, predict_failures
from psgdlab.sim.platform import Placement
from psgdlab.sim.workload import SimConfig, with_room_for

__all__ = [
    "Prediction",
    "target_row",
    "predict_one",
    "predict_sweep",
    "sweep_jobs",
    "build_algorithm",
    "sensitivity_window",
    "STEADY_TOLERANCE",
    "DEFAULT_STEPS",
    "SENSITIVITY_STEPS",
]

STEADY_TOLERANCE = 0.03
DEFAULT_STEPS = 200
#: the single-worker baseline simulates at least this many steps: every speedup of a sweep divides
#: by it, and one worker's window costs little (no exchanges), so its sampling noise is kept small
BASELINE_MIN_STEPS = 2000
#: the shortest window of a sensitivity re-simulation (module docstring)
SENSITIVITY_STEPS = 30
SENSITIVITY_WORKERS = 8
MIN_SENSITIVITY_STEPS = 10


@dataclass(slots=True)
class Prediction:
    """One configuration's row, its simulation result and the trace's summary
    (:func:`psgdlab.core.records.trace.summarize`)."""

    row: PredictionRow
    result: SimResult
    summary: dict[str, Any] = field(default_factory=dict)


def build_algorithm(
    name: str,
    n_workers: int,
    config: SimConfig,
    *,
    period: int | None = None,
    variant: str | None = None,
    gpus_per_node: int | None = None,
    seed: int = 0,
) -> Algorithm:
    """The algorithm ``name`` for ``n_workers`` on ``config``'s platform, built by
    :func:`~psgdlab.core.algorithms.algorithm_from_flags` with what the platform says
    (:attr:`~psgdlab.core.platform.profile.Profile.facts`: H-ADPSGD's node is a host's devices, the
    default period the file's ``[defaults] period``), as every command builds it; a flag
    ``name`` does not take is an error.

    One rule of a sweep on top: its 1-worker point is single-worker SGD, the speedup baseline,
    whatever ``name`` is (after ``name``'s flags are checked; the row's ``ran_as`` says so)."""
    if n_workers == 1:
        check_flags(name, period=period, variant=variant)
        return algorithm_from_flags("sgd", 1, seed=seed)
    return algorithm_from_flags(
        name, n_workers, seed=seed, platform=config.facts, period=period, variant=variant, gpus_per_node=gpus_per_node
    )


def sweep_flags(name: str, flags: dict[str, Any]) -> dict[str, Any]:
    """The flags of a sweep that go to ``name``: a sweep's ``period`` and ``variant`` go to the
    algorithms of the sweep that take them (``--algorithm bmuf,asgd --period 20`` with ssgd in
    the sweep too); :func:`predict_sweep` refuses one that no algorithm of the sweep takes."""
    known = algorithm_parameters(name)
    return {k: v for k, v in flags.items() if k not in _SWEEP_FLAGS or k in known}


_SWEEP_FLAGS = ("period", "variant")


def _steadiness(trace: np.ndarray, warmup: int) -> float:
    """Relative throughput difference between the two halves of the timed window."""
    comp = trace[(trace["phase"] == PHASES["compute"]) & (trace["step"] >= warmup)]
    if comp.size < 4:
        return 0.0
    t0, t1 = float(comp["start_s"].min()), float(comp["end_s"].max())
    mid = 0.5 * (t0 + t1)
    first = np.count_nonzero(comp["end_s"] <= mid)
    second = comp.size - first
    if first + second == 0 or max(first, second) == 0:
        return 0.0
    return abs(first - second) / max(first, second)


def _period(algorithm: Algorithm) -> int:
    return int(getattr(algorithm, "period", 1) or 1)


def _window(algorithm: Algorithm, steps: int | None) -> int:
    """Steps per worker of a prediction's window: ``steps``, else ``DEFAULT_STEPS`` or ten sync
    periods; one worker (the speedup baseline) at least ``BASELINE_MIN_STEPS``."""
    if steps is not None:
        require(isinstance(steps, int) and steps >= 2, "steps", steps, "must be an integer >= 2")
        window = steps
    else:
        window = max(DEFAULT_STEPS, 10 * _period(algorithm))
    return max(window, BASELINE_MIN_STEPS) if algorithm.n_workers == 1 else window


def sensitivity_window(algorithm: Algorithm, window: int) -> int:
    """Steps per worker of a sensitivity re-simulation: ``SENSITIVITY_STEPS`` worker-steps per
    worker up to ``SENSITIVITY_WORKERS`` workers (beyond, the same number of worker-steps over
    more workers: a window's throughput averages its workers), at least ``MIN_SENSITIVITY_STEPS``
    and four sync periods, and at most the prediction's ``window``."""
    n = max(1, algorithm.n_workers)
    per_worker = -(-SENSITIVITY_STEPS * SENSITIVITY_WORKERS // max(n, SENSITIVITY_WORKERS))
    return min(window, max(per_worker, MIN_SENSITIVITY_STEPS, 4 * _period(algorithm)))


def _spread(
    algorithm: Algorithm,
    config: SimConfig,
    trace: np.ndarray,
    *,
    window: int,
    warmup: int,
    seed: int,
    **simulate_kwargs: Any,
) -> tuple[Spread, int]:
    """The batch means of a simulated window's trace and the configuration's sensitivities to
    the profile's parameter directions (:mod:`psgdlab.core.records.intervals`), and the sensitivity
    window (0 when there is nothing to re-simulate)."""
    bounds, logs = batch_log_step_times(trace, warmup_steps=warmup, period=_period(algorithm))
    shifts = directions(config.uncertainty)
    if not shifts:
        return Spread(bounds, logs, ()), 0
    w = sensitivity_window(algorithm, window)

    def log_t(profile: Profile) -> float:
        res = simulate(algorithm, profile.platform, profile.workload, steps=w, seed=seed, **simulate_kwargs)
        return log_step_time(res.trace, warmup_steps=max(1, w // 10))

    # a sweep's one-worker rows and its baseline are one configuration: re-simulate it once
    given = {k: v for k, v in simulate_kwargs.items() if v is not None}
    key = (repr(algorithm), config.platform, config.workload, config.uncertainty, w, seed, repr(given))
    if key not in _SENSITIVITIES:
        _SENSITIVITIES[key] = central_sensitivities(log_t, config, shifts)
    return Spread(bounds, logs, _SENSITIVITIES[key]), w


_SENSITIVITIES: dict[tuple[Any, ...], tuple[float, ...]] = {}


def _prepare(
    name: str,
    n_workers: int,
    config: SimConfig,
    *,
    period: int | None,
    variant: str | None,
    gpus_per_node: int | None,
    stragglers: str | None,
    seed: int,
    workers_per_host: int | None = None,
    failures: FailureRequest | None = None,
    on_failure: str | None = None,
) -> tuple[Algorithm, StragglerModel | None]:
    """The algorithm and straggler model of one configuration, with its placement checked (every
    configuration error surfaces here, before anything is simulated; placement as in
    :func:`predict_one`)."""
    algorithm = build_algorithm(
        name, n_workers, config, period=period, variant=variant, gpus_per_node=gpus_per_node, seed=seed
    )
    model = StragglerModel.parse(stragglers, seed=seed, n_workers=n_workers) if stragglers else None
    per_host = workers_per_host or (
        gpus_per_node if gpus_per_node is not None else getattr(algorithm, "gpus_per_node", None)
    )
    Placement.pack(config.platform, n_workers, per_host)
    if failures is not None and not failures.is_empty and n_workers > 1:
        failures.check(algorithm)
    elif on_failure is not None and n_workers > 1:
        check_on_failure(algorithm.name, on_failure)
    return algorithm, model


def predict_one(
    name: str,
    n_workers: int,
    config: SimConfig,
    *,
    steps: int | None = None,
    period: int | None = None,
    variant: str | None = None,
    gpus_per_node: int | None = None,
    stragglers: str | None = None,
    seed: int = 0,
    baseline_samples_per_s: float | None = None,
    record: bool = True,
    workers_per_host: int | None = None,
    streams: Sequence[int] | None = None,
    intervals: bool = True,
    failures: FailureRequest | None = None,
    on_failure: str | None = None,
    convergence: ConvergenceProfile | None = None,
    target: Target | None = None,
) -> Prediction:
    """Simulate one configuration and build its row (see the module docstring).

    ``workers_per_host`` places the workers on hosts independently of the algorithm's
    ``gpus_per_node`` (default: the same), e.g. H-ADPSGD's nodes of 2 as logical groups of one
    machine's processes, as ``psgdlab validate`` runs them. ``streams`` relabels the workers'
    compute-time streams (:func:`psgdlab.sim.engine.simulate`). ``intervals=False`` leaves the
    interval keys out and simulates nothing beyond the window (for callers that only need the
    point values, such as fits). ``failures`` prices worker failures (:mod:`psgdlab.sim.failures`)
    into the row's ``failures`` (not for one worker: the speedup baseline has none).
    ``on_failure`` is the run's policy when ``failures`` is not given (default stop): it decides
    the protocol a node of several members runs (:func:`psgdlab.core.platform.failure.sums_node_slices`),
    so a failure-free run under continue is priced as it runs. ``convergence`` adds the time to
    ``target`` (default: the profile's own) to the row (:func:`target_row`)."""
    algorithm, model = _prepare(
        name,
        n_workers,
        config,
        period=period,
        variant=variant,
        gpus_per_node=gpus_per_node,
        stragglers=stragglers,
        seed=seed,
        workers_per_host=workers_per_host,
        failures=failures,
        on_failure=on_failure,
    )
    failing = failures is not None and not failures.is_empty and n_workers > 1
    policy = failures.check(algorithm) if failures is not None and failing else on_failure
    # how every simulation of this configuration runs: the window's, the spread's, the failures'
    runs_as: dict[str, Any] = dict(
        seed=seed, stragglers=model, gpus_per_node=workers_per_host or gpus_per_node, streams=streams, on_failure=policy
    )
    # one worker is the speedup baseline's configuration: simulated as it is, so its speedup is 1
    window = _steady_window(
        algorithm, config, steps, fixed=steps is not None or n_workers == 1, record=record, **runs_as
    )
    summ = summarize(window.result.trace, samples_per_step=config.workload.batch_per_worker, warmup_steps=window.warmup)
    if baseline_samples_per_s is None:
        baseline_samples_per_s = baseline(config, steps=steps, seed=seed)
    row = _row(name, n_workers, algorithm, config, window, summ, speedup_base=baseline_samples_per_s, stragglers=model)
    if intervals:
        spread, sens_window = _spread(
            algorithm, config, window.result.trace, window=window.steps, warmup=window.warmup, **runs_as
        )
        row = replace(row, intervals=_row_intervals(row, spread, sens_window, config, steps=steps, seed=seed))
    if convergence is not None:
        row = replace(row, to_target=target_row(row, algorithm, convergence, target))
    if failures is not None and failing:
        row = replace(row, failures=predict_failures(algorithm, config, row.to_json(), failures, **runs_as))
    return Prediction(row=row, result=window.result, summary=summ)


@dataclass(frozen=True, slots=True)
class _Window:
    """The simulation of :func:`_steady_window` and its window: local steps per worker, the
    warm-up steps left out, the two half windows' throughput difference and whether it is steady."""

    result: SimResult
    steps: int
    warmup: int
    drift: float
    steady: bool


def _steady_window(
    algorithm: Algorithm, config: SimConfig, steps: int | None, *, fixed: bool, record: bool, **runs_as: Any
) -> _Window:
    """Simulate ``algorithm`` on its window (``steps``, else the default :func:`_window`), doubled
    until the throughput is steady (at most 4 times the default) unless the window is ``fixed``."""
    window = _window(algorithm, steps)
    while True:
        result = simulate(algorithm, config.platform, config.workload, steps=window, record=record, **runs_as)
        warmup = max(1, window // 10)
        drift = _steadiness(result.trace, warmup)
        steady = drift < STEADY_TOLERANCE
        if steady or fixed or window >= 4 * _window(algorithm, None):
            return _Window(result=result, steps=window, warmup=warmup, drift=drift, steady=bool(steady))
        window *= 2


def _row(
    name: str,
    n_workers: int,
    algorithm: Algorithm,
    config: SimConfig,
    window: _Window,
    summ: dict[str, Any],
    *,
    speedup_base: float,
    stragglers: StragglerModel | None,
) -> PredictionRow:
    """The prediction row of a steady window's summary ``summ`` (speedup over ``speedup_base``
    samples per second), without intervals, time to target or failures."""
    workload = config.workload
    b = workload.batch_per_worker
    sps = summ["samples_per_s"]
    step_time = n_workers * b / sps
    steps_needed = math.ceil(workload.epochs * workload.samples_per_epoch / (n_workers * b))
    placement = window.result.placement
    return PredictionRow(
        algorithm=name,
        ran_as=algorithm.name,
        workers=n_workers,
        node_shape=f"{placement.hosts_used}x{placement.per_host}" if placement is not None else "?",
        gpus_per_node=placement.per_host if placement is not None else None,
        sockets=placement.sockets_text() if placement is not None else None,
        processes_per_core=placement.processes_per_core(config.platform.host_cpu) if placement is not None else None,
        step_time_s=step_time,
        step_time_median_s=summ["step_time_median_s"],
        step_time_p95_s=summ["step_time_p95_s"],
        samples_per_s=sps,
        speedup=sps / speedup_base,
        epoch_time_s=workload.samples_per_epoch / sps,
        time_to_train_s=steps_needed * step_time,
        steps_to_train=steps_needed,
        comm_fraction=summ["comm_fraction"],
        idle_fraction=summ["idle_fraction"],
        compute_fraction=summ["compute_fraction"],
        overlap_comm_fraction=summ["overlap_comm_fraction"],
        staleness_mean=summ["staleness_mean"],
        staleness_max=summ["staleness_max"],
        staleness_hist=summ["staleness_hist"],
        extrapolation=Extrapolation(
            window_steps_per_worker=window.steps,
            warmup_steps=window.warmup,
            steady=window.steady,
            half_window_throughput_difference=window.drift,
        ),
        params=algorithm.params(),
        stragglers=stragglers.spec() if stragglers is not None else "",
        batch_per_worker=b,
        sim_events=window.result.events,
    )


def target_row(
    row: PredictionRow, algorithm: Algorithm, convergence: ConvergenceProfile, target: Target | None
) -> TargetColumns:
    """The time to target of a simulated row (:func:`psgdlab.core.convergence.target_columns`):
    the convergence model at the row's algorithm, total batch and mean staleness, times the row's
    mean step time; the interval adds the step time's log-sd (0 for a row without intervals)."""
    goal = target if target is not None else convergence.own_target()
    setting = setting_of(algorithm, int(row.batch_per_worker), staleness_mean=float(row.staleness_mean))
    outcome = predict_steps(convergence, setting, goal)
    log_sd = float(row.intervals.interval.log_sd.step_time) if row.intervals is not None else 0.0
    return target_columns(
        outcome, goal, step_time_s=float(row.step_time_s), step_time_log_sd=log_sd, workers=int(row.workers)
    )


def _row_intervals(
    row: PredictionRow, spread: Spread, sensitivity_window: int, config: SimConfig, *, steps: int | None, seed: int
) -> RowIntervals:
    """The 90 % intervals of ``row`` (:func:`psgdlab.core.records.intervals.row_intervals`) from its
    configuration's ``spread`` and the single-worker baseline's."""
    base = _reference(config, steps=steps, seed=seed)
    if base.spread is None:
        base.spread, _ = _spread(
            base.algorithm, config, base.trace, window=base.window, warmup=max(1, base.window // 10), seed=seed
        )
    u = config.uncertainty
    values = {k: getattr(row, k) for k in INTERVAL_KEYS}
    keys, log_sd = row_intervals(values, spread, base.spread, noise_cv=u.noise_cv if u is not None else 0.0)
    described = interval_description(u, len(spread.sensitivities))
    info = IntervalInfo(
        level=described["level"],
        method=described["method"],
        parameters=tuple(described["parameters"]),
        parameters_exact=described["parameters_exact"],
        directions=described["directions"],
        unpinned=tuple(described["unpinned"]),
        noise_cv=described["noise_cv"],
        noise_processes_per_core=described["noise_processes_per_core"],
        log_sd=IntervalLogSd.from_json(log_sd),
        sensitivity_window_steps=sensitivity_window,
        simulation_batches=max(0, len(spread.batch_bounds) - 1),
    )
    measured_at, load = (u.noise_processes_per_core if u is not None else None), row.processes_per_core
    return RowIntervals(
        **keys,
        interval=info,
        has_unpinned_parameters=bool(u is not None and u.unpinned),
        noise_extrapolated=bool(measured_at and load and load > measured_at * (1 + 1e-9)),
    )


@dataclass(slots=True)
class _Reference:
    """The single-worker SGD run a speedup is taken over, and its spread (filled when an
    interval first needs it)."""

    algorithm: Algorithm
    window: int
    trace: np.ndarray
    samples_per_s: float
    spread: Spread | None = None


_BASELINES: dict[tuple[Any, ...], _Reference] = {}


def _reference(config: SimConfig, *, steps: int | None, seed: int) -> _Reference:
    key = (config.platform, config.workload, config.uncertainty, steps, seed)
    if key not in _BASELINES:
        algorithm = algorithm_from_flags("sgd", 1, seed=seed)
        window = _window(algorithm, steps)
        res = simulate(algorithm, config.platform, config.workload, steps=window, seed=seed)
        sps = summarize(
            res.trace, samples_per_step=config.workload.batch_per_worker, warmup_steps=max(1, window // 10)
        )["samples_per_s"]
        _BASELINES[key] = _Reference(algorithm, window, res.trace, sps)
    return _BASELINES[key]


def baseline(config: SimConfig, *, steps: int | None = None, seed: int = 0) -> float:
    """Samples per second of single-worker SGD on the same platform and workload (cached), over
    a window of at least :data:`BASELINE_MIN_STEPS` steps."""
    return _reference(config, steps=steps, seed=seed).samples_per_s


def sweep_jobs(jobs: int | None) -> int:
    """The processes a sweep runs in: ``jobs`` (an integer >= 1), or by default the cores this
    process may run on."""
    if jobs is None:
        return len(os.sched_getaffinity(0))
    require(isinstance(jobs, int) and jobs >= 1, "jobs", jobs, "must be an integer >= 1")
    return jobs


def predict_sweep(
    config: SimConfig,
    algorithms: tuple[str, ...],
    workers: tuple[int, ...],
    *,
    batch: int | None = None,
    progress: Callable[[str], None] | None = None,
    jobs: int | None = None,
    **kwargs: Any,
) -> list[Prediction]:
    """:func:`predict_one` for every (algorithm, workers) pair, in order.

    The configurations are independent and each is seeded by itself, so ``jobs`` processes
    simulate them side by side (forked after the baseline is cached, so they share it) with the
    same rows as one (default: the cores this process may run on, at most one per configuration),
    the configurations of most workers first. ``progress`` is called in the order they finish.

    On a platform of worker processes (a calibrated machine) each configuration gets the room it
    needs (:func:`~psgdlab.sim.workload.with_room_for`) by itself: one that fits the machine as
    calibrated is placed as calibrated whatever else the sweep holds."""
    require(len(algorithms) >= 1, "algorithms", algorithms, "must name at least one algorithm")
    for w in workers:
        require(isinstance(w, int) and w >= 1, "workers", w, "must be integers >= 1")
    for name in algorithms:
        algorithm_parameters(name)
    if batch is not None:
        require(isinstance(batch, int) and batch >= 1, "batch", batch, "must be an integer >= 1")
        config = replace(config, workload=config.workload.with_batch(batch))
    for key in _SWEEP_FLAGS:
        if kwargs.get(key) is not None and not any(key in algorithm_parameters(a) for a in algorithms):
            takers = sorted(a for a in ALGORITHMS if key in algorithm_parameters(a))
            raise ConfigError(
                f"--{key} ({kwargs[key]!r}) applies to none of {', '.join(algorithms)}; "
                f"it is a parameter of {', '.join(takers)}"
            )

    def roomy(n: int, flags: dict[str, Any]) -> SimConfig:
        per_host = flags.get("workers_per_host") or flags.get("gpus_per_node") or 1
        return with_room_for(config, max(n, per_host))[0]

    for name in algorithms:  # a bad configuration fails before the sweep has simulated anything
        flags = sweep_flags(name, kwargs)
        for n in workers:
            _prepare(
                name,
                n,
                roomy(n, flags),
                period=flags.get("period"),
                variant=flags.get("variant"),
                gpus_per_node=flags.get("gpus_per_node"),
                stragglers=flags.get("stragglers"),
                seed=flags.get("seed", 0),
                workers_per_host=flags.get("workers_per_host"),
                failures=flags.get("failures"),
                on_failure=flags.get("on_failure"),
            )
    cases = [(name, n) for name in algorithms for n in workers]
    jobs = min(len(cases), sweep_jobs(jobs))
    base = baseline(config, steps=kwargs.get("steps"), seed=kwargs.get("seed", 0))
    if jobs <= 1:
        out = []
        for name, n in cases:
            flags = sweep_flags(name, kwargs)
            out.append(predict_one(name, n, roomy(n, flags), baseline_samples_per_s=base, **flags))
            if progress is not None:
                progress(f"{name} x {n}")
        return out
    # fork: the children inherit the imports and the cached baseline (a fresh interpreter would
    # spend a second importing before it simulated anything)
    # the most workers first (the longest simulations), so that no long one is left for the end
    order = sorted(range(len(cases)), key=lambda i: -cases[i][1])
    # the workers die with this process (a killed predict left them waiting for work forever)
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context("fork"), initializer=set_parent_death_signal
    ) as pool:
        futures = {}
        for i in order:
            name, n = cases[i]
            flags = sweep_flags(name, kwargs)
            futures[pool.submit(predict_one, name, n, roomy(n, flags), baseline_samples_per_s=base, **flags)] = i
        done: dict[int, Prediction] = {}
        for future in as_completed(futures):
            i = futures[future]
            done[i] = future.result()
            if progress is not None:
                progress(f"{cases[i][0]} x {cases[i][1]}")
    return [done[i] for i in range(len(cases))]
