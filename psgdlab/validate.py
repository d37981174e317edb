r"""The validation loop on this machine: calibrate, predict, measure, compare.

``psgdlab validate`` (and :func:`validate`) runs, into ``OUT/``::

    OUT/calibration/RUN/     calibration runs of the runtime (ssgd and adpsgd with 2 workers at
                             half and 1.5 times the cases' size, default_calibration_dims; easgd
                             at both for the server, bmuf at both for the fold of the averaged
                             model; ssgd with twice as many
                             workers as cores, and with the cases' largest worker count, at the
                             same two sizes, for the CPU work of communication, when a case has
                             more workers than cores: one oversubscription level fitted the
                             4-worker allreduces and missed the 8-worker ones by 25 %), each
                             ``--calibration-runs`` times (default 3, pooled by the fits): never
                             a validated case (other payload sizes)
    OUT/platform.toml        the fitted platform (psgdlab.analysis.calibrate)
    OUT/predicted/runs/A-wN  the simulator's prediction of each case on that platform
    OUT/measured/runs/A-wN   the runtime's measurement of each case
    OUT/measured-repeats/    more runs of the cases of a pair measured out of the predicted order
                             (``--remeasure``; the ranking then compares their mean samples/s)
    OUT/compare/             compare.json, report.md (psgdlab.analysis.report)
    OUT/validate.json        the case table, the targets, the load before every run

The machine is shared. Before every run the load averages and the idle cores are recorded
(``--min-idle-cores`` waits for a quieter machine), and a measured case in which a step of some
worker lasted more than :data:`STALL_FACTOR` times the median step and more than
:data:`STALL_MIN_S` (another process stopped the run; a stall of the runtime itself would come
back) is measured once more, the first attempt's reason kept in ``validate.json``. The learning
rate is ``0.5 / dim``, below the stability limit of one least-squares row (the figures are times,
but a run that overflows to infinity is no model of training).

The model is the least-squares problem (float64, ``dim`` parameters, one minibatch of rows per
worker so memory stays small at 8 workers); compute is emulated by default (each step sleeps to
``compute_time``), so up to 8 workers run on 2 cores. The batch is one row: the real gradient
must stay cheap beside the emulated time (with 8 rows of a 2 MB model each step copied 16 MB,
and with 8 processes on 2 cores the "emulated" 0.05 s grew to 0.061 s on average). The
default size, 250 000 float64 parameters (2 MB) against 0.05 s of compute, puts the bandwidth
term of an allreduce on this machine's loopback at roughly 4-14 % of the compute (0.5-1 GB/s,
2-8 workers), like the IBM system's 8-16 % (``docs/validation.md`` says why that matters for
the ranking). The predictions place every
worker on the one host of the fitted platform (H-ADPSGD's nodes are groups of processes of this
machine, as in the runtime). This module sits outside :mod:`psgdlab.analysis`, which only reads
run directories.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psgdlab.core.errors import require
from psgdlab.core.trace import atomic_write_json

__all__ = [
    "ValidateConfig",
    "validate",
    "calibration_plan",
    "case_name",
    "default_calibration_dims",
    "pooled_ranking",
    "ALGORITHM_CASES",
    "TARGETS",
]

#: (case name, algorithm, variant) -- adpsgd is validated with both peer schedules
ALGORITHM_CASES = {
    "ssgd": ("ssgd", None),
    "bmuf": ("bmuf", None),
    "easgd": ("easgd", None),
    "adpsgd": ("adpsgd", "fixed"),
    "adpsgd-random": ("adpsgd", "random"),
    "hadpsgd": ("hadpsgd", None),
}
TARGETS = {"median_abs_step_time_error": 0.10, "max_abs_step_time_error": 0.20, "staleness_mean_rel_error": 0.10}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ValidateConfig:
    """What :func:`validate` runs (see ``psgdlab validate --help``)."""

    out: str
    algorithms: tuple[str, ...] = tuple(ALGORITHM_CASES)
    workers: tuple[int, ...] = (2, 4)
    backend: str = "gloo"
    compute_time: str | None = "0.05"
    stragglers: tuple[str, ...] = ("",)
    steps: int = 80
    calibration_steps: int = 40
    batch: int = 1
    dim: int = 250_000
    #: default :func:`default_calibration_dims` of ``dim``
    calibration_dims: tuple[int, int] | None = None
    gpus_per_node: int = 2
    seed: int = 0
    cores: int | None = None
    min_idle_cores: float = 0.0
    max_idle_wait_s: float = 300.0
    #: runs more of each case of a pair measured out of the predicted order (0: none)
    remeasure: int = 4
    #: seeds each case is predicted with, each also with the workers relabelled; the ranking
    #: compares the mean samples/s of those 2 x prediction_seeds predictions
    prediction_seeds: int = 8
    #: runs of each calibration configuration (the fits pool them: calibrations moved between
    #: runs by more than the gaps that order some algorithms)
    calibration_runs: int = 3

    def __post_init__(self) -> None:
        for a in self.algorithms:
            require(a in ALGORITHM_CASES, "algorithms", a, f"must be one of {', '.join(ALGORITHM_CASES)}")
        for w in self.workers:
            require(isinstance(w, int) and w >= 2, "workers", w, "must be integers >= 2")
        require(self.backend in ("gloo", "mpi"), "backend", self.backend, "must be gloo or mpi")
        require(self.steps >= 10, "steps", self.steps, "must be >= 10 (warm-up and window)")
        require(self.calibration_steps >= 10, "calibration_steps", self.calibration_steps, "must be >= 10")
        require(isinstance(self.dim, int) and self.dim >= 4, "dim", self.dim, "must be an integer >= 4")
        if self.calibration_dims is None:
            object.__setattr__(self, "calibration_dims", default_calibration_dims(self.dim))
        assert self.calibration_dims is not None  # set just above
        require(
            len(set(self.calibration_dims)) == 2,
            "calibration_dims",
            self.calibration_dims,
            "must be two different sizes (latency and bandwidth cannot be separated otherwise)",
        )
        require(
            self.dim not in self.calibration_dims,
            "dim",
            self.dim,
            f"must differ from the calibration sizes {self.calibration_dims} (calibration runs are never cases)",
        )
        require(
            self.cores is None or (isinstance(self.cores, int) and self.cores >= 1),
            "cores",
            self.cores,
            "must be an integer >= 1",
        )
        require(self.min_idle_cores >= 0, "min_idle_cores", self.min_idle_cores, "must be >= 0")
        require(self.max_idle_wait_s >= 0, "max_idle_wait_s", self.max_idle_wait_s, "must be >= 0 seconds")
        require(
            isinstance(self.remeasure, int) and self.remeasure >= 0,
            "remeasure",
            self.remeasure,
            "must be an integer >= 0",
        )
        require(
            isinstance(self.prediction_seeds, int) and self.prediction_seeds >= 1,
            "prediction_seeds",
            self.prediction_seeds,
            "must be an integer >= 1",
        )
        require(
            isinstance(self.calibration_runs, int) and self.calibration_runs >= 1,
            "calibration_runs",
            self.calibration_runs,
            "must be an integer >= 1",
        )


#: below this many parameters (0.8 MB of float64) a case is latency-bound: calibrating at half
#: and 1.5 times its size cannot separate bandwidth from latency (8 and 24 KB gave negative
#: bandwidths), so the wide fixed pair is used
MIN_BRACKETED_DIM = 100_000


def default_calibration_dims(dim: int) -> tuple[int, int]:
    """The calibration runs' sizes for cases of ``dim`` parameters: ``(dim // 2, 3 * dim // 2)``
    -- exchange costs are not linear in the size on this machine (2-rank allreduce spans 0.5,
    2.9 and 3.8 ms at 0.4, 2 and 4 MB), so the straight line the simulator takes is fitted close
    around the cases' size -- or ``(50_000, 500_000)`` below :data:`MIN_BRACKETED_DIM`. Not
    closer: they are convex (a 2-worker easgd server exchange took 5.5, 9.7 and 18.1 ms at 1, 2
    and 3 MB, so the chord over-predicts the middle by 2 ms), but at 0.75 and 1.25 times the
    latency and bandwidth came apart badly (1.7 ms per round and 6.4 GB/s for the allreduce)
    and the predictions of another run's measurements were worse: median |samples/s error|
    1.1 % and max 6.9 % against 0.9 % and 2.9 %.

    >>> default_calibration_dims(250_000), default_calibration_dims(2_000)
    ((125000, 375000), (50000, 500000))
    """
    return (dim // 2, 3 * dim // 2) if dim >= MIN_BRACKETED_DIM else (50_000, 500_000)


def case_name(name: str, workers: int, straggler: str) -> str:
    return f"{name}-w{workers}" + ("" if not straggler else "-straggler")


def _train_config(
    vc: ValidateConfig,
    *,
    algorithm: str,
    variant: str | None,
    workers: int,
    dim: int,
    straggler: str,
    steps: int,
    out: Path,
) -> Any:
    from psgdlab.runtime.config import LSQ_MODEL, TrainConfig

    return TrainConfig(
        algorithm=algorithm,
        variant=variant,
        workers=workers,
        gpus_per_node=vc.gpus_per_node if algorithm == "hadpsgd" else 1,
        backend=vc.backend,
        model=LSQ_MODEL,
        lsq_dim=dim,
        lsq_samples_per_worker=vc.batch,
        batch=vc.batch,
        steps=steps,
        lr=0.5 / dim,
        compute_time=vc.compute_time,
        straggler=straggler,
        seed=vc.seed,
        out=str(out),
        evaluate=False,
        timeout_s=300.0,
    )


def _launch(cfg: Any) -> dict[str, Any]:
    from psgdlab.runtime.launch import launch

    out = Path(cfg.out)
    if out.exists():
        shutil.rmtree(out)
    return launch(cfg, quiet=True, timeout_s=600.0)


def _relabel(run_dir: Path, name: str) -> None:
    """Name the case by its validation name (``adpsgd-random``) so the two adpsgd cases differ."""
    from dataclasses import replace

    from psgdlab.core.rundir import read_summary, write_summary

    write_summary(run_dir, replace(read_summary(run_dir), case=name))


def calibration_plan(vc: ValidateConfig, cores: int) -> list[tuple[str, int, int, str]]:
    """The calibration runs of ``vc`` on ``cores`` cores, ``(algorithm, workers, dim, directory
    name)`` each (module docstring); never a validated case (other sizes)."""
    dims = vc.calibration_dims or ()  # set by ValidateConfig
    kinds = [("ssgd", 2), ("adpsgd", 2)]
    if any(ALGORITHM_CASES[a][0] == "easgd" for a in vc.algorithms):
        kinds.append(("easgd", 2))
    if "bmuf" in vc.algorithms:  # the fold of the averaged model (block-momentum filter) beyond the allreduce
        kinds.append(("bmuf", 2))
    if max(vc.workers) > cores:  # the CPU work of communication, from runs that oversubscribe the cores
        kinds += [("ssgd", n) for n in sorted({2 * cores, max(vc.workers)})]
    # every configuration ``calibration_runs`` times, interleaved, and the fits pool the runs: one
    # calibration moved between --full runs by more than some gaps of the ranking (bmuf's fold
    # 3.4-8.2 ms at 2 MB, the server's overhead 1.2-4.9 ms); the pooled calibrations of three
    # --full runs ordered the pairs that their own had swapped (docs/validation.md)
    plan = [(alg, n, d) for _ in range(vc.calibration_runs) for alg, n in kinds for d in dims]
    out = []
    for i, (alg, n, dim) in enumerate(plan):
        again = sum(p == (alg, n, dim) for p in plan[:i])
        out.append((alg, n, dim, f"{alg}-w{n}-d{dim}" + (f"-r{again + 1}" if again else "")))
    return out


def validate(vc: ValidateConfig, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the whole loop (module docstring) and return the comparison with the case table."""
    from psgdlab.analysis.calibrate import calibrate_runs, platform_toml, write_platform
    from psgdlab.analysis.compare import compare_dirs
    from psgdlab.analysis.figures import write_prediction_figures
    from psgdlab.analysis.report import write_report
    from psgdlab.sim.predict import predict_one
    from psgdlab.sim.report import write_prediction
    from psgdlab.sim.workload import load_config

    say = progress or (lambda msg: None)
    out = Path(vc.out)
    out.mkdir(parents=True, exist_ok=True)
    # 1. calibration runs (never the validated cases)
    cores = vc.cores or os.cpu_count() or 1
    load: dict[str, Any] = {"start": _load()}
    calib_dirs = []
    for alg, n, dim, name in calibration_plan(vc, cores):
        d = out / "calibration" / name
        say(f"calibration run {d.name}")
        load[d.name] = _quiet(vc, say)
        _launch(
            _train_config(
                vc, algorithm=alg, variant=None, workers=n, dim=dim, straggler="", steps=vc.calibration_steps, out=d
            )
        )
        calib_dirs.append(d)
    calibration = calibrate_runs(calib_dirs, cores=cores)
    platform_path = out / "platform.toml"
    write_platform(
        platform_path,
        platform_toml(
            calibration,
            name="this-machine",
            devices=max(vc.workers),
            n_params=vc.dim,
            itemsize=8,
            batch=vc.batch,
            workers=vc.workers,
        ),
    )
    config = load_config(path=platform_path)
    # 2. one measured run and one prediction per case
    table: list[dict[str, Any]] = []
    ranking_detail: dict[str, Any] = {}
    for straggler in vc.stragglers:
        preds = []
        predicted: dict[tuple[str, int], list[float]] = {}  # samples/s of each of a case's predictions
        meas_root = out / ("measured" if not straggler else "measured-straggler")
        pred_root = out / ("predicted" if not straggler else "predicted-straggler")
        for name in vc.algorithms:
            algorithm, variant = ALGORITHM_CASES[name]
            for n in vc.workers:
                gpn = vc.gpus_per_node if algorithm == "hadpsgd" else None
                say(f"predict {case_name(name, n, straggler)}")
                case: dict[str, Any] = dict(
                    steps=vc.steps, variant=variant, gpus_per_node=gpn, stragglers=straggler or None, workers_per_host=n
                )
                # every seed twice, the workers' compute-time streams in rank order and reversed; the
                # first (seed offset 0, rank order) is the case's prediction, written and compared
                first, *more = _relabelled_seeds(n, vc.prediction_seeds)
                p = predict_one(algorithm, n, config, seed=vc.seed + first[0], streams=first[1], **case)
                p.row["algorithm"] = name
                preds.append(p)
                predicted[(name, n)] = [
                    _samples_per_s(q.result.trace, vc.batch)
                    for q in [
                        p,
                        *(
                            predict_one(algorithm, n, config, seed=vc.seed + k, streams=order, **case)
                            for k, order in more
                        ),
                    ]
                ]
                say(f"measure {case_name(name, n, straggler)}")
                d = meas_root / "runs" / f"{name}-w{n}"
                cfg = _train_config(
                    vc,
                    algorithm=algorithm,
                    variant=variant,
                    workers=n,
                    dim=vc.dim,
                    straggler=straggler,
                    steps=vc.steps,
                    out=d,
                )
                _measure(vc, cfg, d, name, case_name(name, n, straggler), load, say)
        if pred_root.exists():
            shutil.rmtree(pred_root)
        write_prediction(pred_root, config, preds, {"validate": dataclasses.asdict(vc), "straggler": straggler})
        write_prediction_figures(
            pred_root, [p.row for p in preds], title=f"{config.platform.name}: {config.workload.name}"
        )
        result = compare_dirs(pred_root, meas_root)
        result["ranking"] = pooled_ranking(result["cases"], {}, predicted)
        if vc.remeasure and not all(r["identical"] for r in result["ranking"].values()):
            runs = _remeasure(
                vc, result, pred_root, meas_root.with_name(meas_root.name + "-repeats"), straggler, load, say
            )
            result["ranking"] = pooled_ranking(result["cases"], runs, predicted)
        result["ranking_identical"] = all(r["identical"] for r in result["ranking"].values())
        write_report(result, out / ("compare" if not straggler else "compare-straggler"), figures=True)
        for c in result["cases"]:
            table.append({**_case_row(c), "straggler": straggler})
        ranking_detail[straggler or "none"] = result["ranking"]
    cases = table
    rankings = {k: all(r["identical"] for r in v.values()) for k, v in ranking_detail.items()}
    import numpy as np

    errs = np.array([abs(c["step_time_error"]) for c in cases if c["step_time_error"] is not None])
    st_errs = [c["staleness_mean_rel_error"] for c in cases if c["staleness_mean_rel_error"] is not None]
    summary: dict[str, Any] = {
        "cases": cases,
        "median_abs_step_time_error": float(np.median(errs)) if errs.size else None,
        "max_abs_step_time_error": float(errs.max()) if errs.size else None,
        "max_abs_staleness_mean_error": float(max(abs(x) for x in st_errs)) if st_errs else None,
        "ranking_identical": rankings,
        "ranking": ranking_detail,
        "targets": TARGETS,
        "platform": str(platform_path),
        "calibration": calibration,
        "config": dataclasses.asdict(vc),
        "load_average": {**load, "end": _load()},
    }
    summary["targets_met"] = {
        "median_abs_step_time_error": summary["median_abs_step_time_error"] is not None
        and summary["median_abs_step_time_error"] <= TARGETS["median_abs_step_time_error"],
        "max_abs_step_time_error": summary["max_abs_step_time_error"] is not None
        and summary["max_abs_step_time_error"] <= TARGETS["max_abs_step_time_error"],
        "staleness_mean": all(_staleness_ok(c) for c in cases),
        "ranking_identical": all(rankings.values()),
    }
    atomic_write_json(out / "validate.json", summary)
    return summary


def _measure(
    vc: ValidateConfig, cfg: Any, d: Path, name: str, label: str, load: dict[str, Any], say: Callable[[str], None]
) -> None:
    """One measured run of a case (measured once more if another process stalled it)."""
    load[label] = _quiet(vc, say)
    _launch(cfg)
    stall = _stall(d)
    if stall is not None:  # another process stopped the machine: measure the case once more
        say(f"  {label} was stalled ({stall}); measuring it again")
        load[label] = {**_quiet(vc, say), "repeated_after": stall, "first": load[label]}
        _launch(cfg)
    _relabel(d, name)


def _remeasure(
    vc: ValidateConfig,
    result: dict[str, Any],
    pred_root: Path,
    rep_root: Path,
    straggler: str,
    load: dict[str, Any],
    say: Callable[[str], None],
) -> dict[tuple[str, int], list[float]]:
    """Measure each case of a swapped pair of ``result["ranking"]`` ``vc.remeasure`` more times
    (interleaved, into ``rep_root``); returns the samples/s of every run of every case, first run
    first, for :func:`pooled_ranking` to rank again on their means.

    One run of a case varies by about 0.5 % in samples/s here, so two algorithms that run at the
    same speed are measured in either order; more runs shrink that (the standard error of the
    mean falls as one over the root of the runs) without changing the rule: the means must come
    in the predicted order.
    """
    from psgdlab.analysis.compare import compare_cases
    from psgdlab.analysis.load import load_cases, load_run

    involved = sorted(
        {(name, int(n)) for n, r in result["ranking"].items() for a, b, *_ in r["swaps"] for name in (a, b)}
    )
    preds = load_cases(pred_root)
    runs: dict[tuple[str, int], list[float]] = {
        (c["algorithm"], c["workers"]): [c["samples_per_s"]["measured"]] for c in result["cases"]
    }
    for i in range(vc.remeasure):
        for name, n in involved:
            algorithm, variant = ALGORITHM_CASES[name]
            d = rep_root / f"{name}-w{n}-r{i + 1}"
            label = f"{case_name(name, n, straggler)} run {i + 2}"
            say(f"measure {label} (a pair came out of the predicted order)")
            _measure(
                vc,
                _train_config(
                    vc,
                    algorithm=algorithm,
                    variant=variant,
                    workers=n,
                    dim=vc.dim,
                    straggler=straggler,
                    steps=vc.steps,
                    out=d,
                ),
                d,
                name,
                label,
                load,
                say,
            )
            got = compare_cases(preds[(name, n)], load_run(d))["samples_per_s"]["measured"]
            runs[(name, n)].append(got)
    return runs


def _relabelled_seeds(n: int, seeds: int) -> list[tuple[int, list[int] | None]]:
    """The (seed offset, compute-time streams) of a case's predictions: every seed in rank order
    (``None``) and with the streams reversed, seed offset 0 in rank order first.

    The workers' compute times are independent draws of one law, so relabelling whose stream
    each worker takes changes no expectation; averaged over both orders, two configurations
    that are one system with the workers renamed get the same figure. AD-PSGD's two rings with
    2 workers are: the fixed ring's active side is rank 1, the random ring's the lower rank 0,
    and without a straggler nothing else tells the ranks apart. Their 8-seed means came out
    0.10 % apart (one 80-step prediction moves by 0.6 % from seed to seed), and the ranking
    counted it as a claim that the measurement (0.05 % apart, 0.3 standard errors) could not
    check. With a straggler on rank 1 they are two systems (the straggler is active on one ring,
    passive on the other) and stay apart."""
    reverse = list(range(n))[::-1]
    return [(k, order) for k in range(seeds) for order in (None, reverse)]


def pooled_ranking(
    cases: list[dict[str, Any]],
    runs: dict[tuple[str, int], list[float]],
    predicted: dict[tuple[str, int], list[float]] | None = None,
) -> dict[str, Any]:
    """:func:`psgdlab.analysis.compare.ranking` of ``cases`` on the mean measured samples/s of
    ``runs`` (``(algorithm, workers)`` -> the samples/s of each run, the cases' own first) and
    the mean predicted samples/s of ``predicted`` (the same, one entry per simulated seed); a
    group with a case of more than one run gets ``remeasured`` (:func:`_spread` per such case),
    one predicted more than once ``predictions`` (how many).

    A prediction of 80 steps is one draw of the compute times and matchings: AD-PSGD's fixed and
    random rings under a straggler came out 0.2 % apart either way from one seed to the next,
    while 640 steps put them within 0.1 %, always in the same order. The mean over seeds (each
    also with the workers' streams relabelled, :func:`_relabelled_seeds`) is the prediction's
    expected value; ties between algorithms that exchange alike, also up to renaming the
    workers, stay exact.

    >>> cases = [{"algorithm": a, "workers": 4, "samples_per_s": {"predicted": p, "measured": m}}
    ...          for a, p, m in (("easgd", 74.0, 73.5), ("bmuf", 73.0, 73.9))]
    >>> r = pooled_ranking(cases, {("easgd", 4): [73.5, 74.4, 74.3], ("bmuf", 4): [73.9, 73.1, 73.3]})["4"]
    >>> r["identical"], r["measured"], [round(r["remeasured"]["bmuf"]["mean"], 2)]
    (True, ['easgd', 'bmuf'], [73.43])
    """
    import numpy as np

    from psgdlab.analysis.compare import ranking

    predicted = predicted or {}
    pooled = []
    for c in cases:
        key, sp = (c["algorithm"], c["workers"]), c["samples_per_s"]
        meas = np.array(runs.get(key, [sp["measured"]]), dtype=float)
        pred = np.array(predicted.get(key, [sp["predicted"]]), dtype=float)
        pooled.append({**c, "samples_per_s": {**sp, "measured": float(meas.mean()), "predicted": float(pred.mean())}})
    ranked = {str(n): r for n, r in ranking(pooled).items()}
    for n, r in ranked.items():
        more = {a: _spread(v) for (a, m), v in sorted(runs.items()) if str(m) == n and len(v) > 1}
        if more:
            r["remeasured"] = more
        counts = {len(v) for (a, m), v in predicted.items() if str(m) == n}
        if counts and max(counts) > 1:
            r["predictions"] = max(counts)
    return ranked


def _samples_per_s(trace: Any, samples_per_step: int) -> float:
    """Samples/s of a predicted trace under the comparison's window
    (:func:`psgdlab.analysis.compare.window_summary`, as against a measured run of as many steps)."""
    from psgdlab.analysis.compare import cut_at_first_finish, window_summary

    return float(window_summary(cut_at_first_finish(trace), samples_per_step=samples_per_step)["samples_per_s"])


def _spread(values: list[float]) -> dict[str, Any]:
    """The samples/s of every run of a case, their mean and the standard error of the mean."""
    import numpy as np

    v = np.array(values, dtype=float)
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else None
    return {"samples_per_s": [round(float(x), 4) for x in v], "mean": float(v.mean()), "se": se}


#: a step of any worker this much longer than the run's median step, and longer than a second,
#: is the machine stopping the run (another process), not the algorithm
STALL_FACTOR, STALL_MIN_S = 10.0, 1.0
#: a link fit whose points miss it by more than this (relative) is flagged in the table
MAX_REL_RESIDUAL = 0.5


def _stall(run_dir: Path) -> str | None:
    """Why a measured run looks stalled (module docstring of ``validate``), or ``None``."""
    import numpy as np

    from psgdlab.core.trace import PHASES, read_trace

    trace, _ = read_trace(run_dir / "trace.npz")
    comp = trace[trace["phase"] == PHASES["compute"]]
    per_rank = [np.diff(np.sort(comp["start_s"][comp["rank"] == r])) for r in np.unique(comp["rank"])]
    steps = np.concatenate(per_rank) if per_rank else np.array([])
    if steps.size == 0:
        return None
    longest, median = float(steps.max()), float(np.median(steps))
    if longest > max(STALL_FACTOR * median, STALL_MIN_S):
        return f"a step of {longest:.2f} s against a median of {median:.3f} s"
    return None


def _idle_cores(window_s: float = 2.0) -> float | None:
    """Cores left idle by every process of the machine over ``window_s`` (``/proc/stat``);
    ``None`` where that file is not readable."""

    def sample() -> tuple[float, float]:
        with open("/proc/stat") as f:
            ticks = [float(x) for x in f.readline().split()[1:]]
        return sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)  # all, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / max(total1 - total0, 1e-9) * (os.cpu_count() or 1)


def _quiet(vc: ValidateConfig, say: Callable[[str], None]) -> dict[str, Any]:
    """Wait (up to ``vc.max_idle_wait_s``) until ``vc.min_idle_cores`` cores are idle, then say how
    loaded the machine was: the load averages and the idle cores just before the run."""
    t0 = time.monotonic()
    idle = _idle_cores()
    while idle is not None and idle < vc.min_idle_cores and time.monotonic() - t0 < vc.max_idle_wait_s:
        say(f"  waiting for {vc.min_idle_cores:g} idle cores (now {idle:.2f})")
        time.sleep(5.0)
        idle = _idle_cores()
    return {
        "load_average": _load(),
        "idle_cores": None if idle is None else round(idle, 2),
        "waited_s": round(time.monotonic() - t0, 1),
    }


def _load() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine is shared: other work disturbs timings)."""
    return [round(x, 2) for x in os.getloadavg()]


def _staleness_ok(c: dict[str, Any]) -> bool:
    p, m = c["staleness_mean_predicted"], c["staleness_mean_measured"]
    if p is None or m is None:
        return False
    if m == 0:
        return abs(p) <= 0.05  # both zero (synchronous): an absolute tolerance of 0.05 updates
    return abs(p - m) / m <= TARGETS["staleness_mean_rel_error"]


def _case_row(c: dict[str, Any]) -> dict[str, Any]:
    sm = c["staleness_mean"]
    return {
        "algorithm": c["algorithm"],
        "workers": c["workers"],
        "predicted_step_time_s": c["predicted_step_time_s"],
        "measured_step_time_s": c["measured_step_time_s"],
        "step_time_error": c["step_time_error"],
        "staleness_mean_predicted": c["staleness_mean_predicted"],
        "staleness_mean_measured": c["staleness_mean_measured"],
        "staleness_mean_rel_error": sm["rel_error"] if sm["measured"] else None,
        "predicted_samples_per_s": c["samples_per_s"]["predicted"],
        "measured_samples_per_s": c["samples_per_s"]["measured"],
    }


def format_table(summary: dict[str, Any]) -> str:
    """The case table and the target lines as plain text."""
    head = (
        f"{'case':<28} {'pred step s':>11} {'meas step s':>11} {'error':>8} {'stale pred':>10} "
        f"{'stale meas':>10} {'pred samples/s':>14} {'meas samples/s':>14} {'error':>8}"
    )
    lines = [head, "-" * len(head)]
    for c in summary["cases"]:
        label = case_name(c["algorithm"], c["workers"], c["straggler"])
        err = c["step_time_error"]
        ps, ms = c["predicted_samples_per_s"], c["measured_samples_per_s"]
        lines.append(
            f"{label:<28} {c['predicted_step_time_s']:>11.4f} {c['measured_step_time_s']:>11.4f} "
            f"{(err * 100 if err is not None else float('nan')):>7.1f}% "
            f"{c['staleness_mean_predicted']:>10.3f} {c['staleness_mean_measured']:>10.3f} "
            f"{ps:>14.1f} {ms:>14.1f} {(ps - ms) / ms * 100:>7.1f}%"
        )
    med, mx = summary["median_abs_step_time_error"], summary["max_abs_step_time_error"]
    met = summary["targets_met"]
    lines += [
        "",
        f"median |step-time error| {med * 100:.1f}% "
        f"(target <= 10%: {'met' if met['median_abs_step_time_error'] else 'MISSED'})",
        f"max    |step-time error| {mx * 100:.1f}% "
        f"(target <= 20%: {'met' if met['max_abs_step_time_error'] else 'MISSED'})",
        f"mean staleness within 10%: {'met' if met['staleness_mean'] else 'MISSED'}",
        f"ranking by samples/s identical (exact ties in the prediction are one class): {summary['ranking_identical']}",
    ]
    for straggler, per_n in summary.get("ranking", {}).items():
        for n, r in per_n.items():
            pred = " > ".join(" = ".join(c) for c in r["predicted"])
            seeds = f" (mean of {r['predictions']} predictions)" if r.get("predictions") else ""
            lines.append(
                f"  straggler {straggler}, {n} workers: predicted{seeds} {pred}; measured {' > '.join(r['measured'])}"
            )
            for a, b, dp, dm in r["swaps"]:
                lines.append(f"    swap: {a} predicted {dp * 100:+.2f}% over {b}, measured {dm * 100:+.2f}%")
            for a, sp in r.get("remeasured", {}).items():
                lines.append(
                    f"    re-measured {a}: {sp['mean']:.2f} +- {sp['se']:.2f} samples/s (mean +- standard "
                    f"error of {len(sp['samples_per_s'])} runs: "
                    f"{', '.join(f'{x:.1f}' for x in sp['samples_per_s'])})"
                )
    calibration = summary.get("calibration", {})
    schedule = calibration.get("allreduce_algorithm") or "ring"
    for what, link in (
        ("link", calibration.get("link")),
        (f"allreduce ({schedule} schedule; latency per round)", calibration.get("collective")),
    ):
        if not link:
            continue
        flag = link["max_rel_residual"] > MAX_REL_RESIDUAL
        lines.append(
            f"calibration: {what} {link['latency_s'] * 1e3:.3g} ms + S / "
            f"{link['bandwidth_bytes_per_s'] / 1e9:.3g} GB/s, rms residual "
            f"{link['rms_residual_s'] * 1e3:.3g} ms, max relative residual {link['max_rel_residual']:.2f}"
            + (" -- the calibration runs disagree (a disturbed machine?): re-run with --min-idle-cores" if flag else "")
        )
    load = summary.get("load_average", {})
    if load:
        idle = [v["idle_cores"] for v in load.values() if isinstance(v, dict) and v.get("idle_cores") is not None]
        lines.append(
            f"load average (1, 5, 15 min) at the start {load['start']}, at the end {load['end']}"
            + (
                f"; idle cores before the runs: median {sorted(idle)[len(idle) // 2]:.2f}, min {min(idle):.2f}"
                if idle
                else ""
            )
        )
    return "\n".join(lines)
