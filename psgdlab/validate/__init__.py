r"""The validation loop on this machine: calibrate, predict, measure, compare.

``psgdlab validate`` (and :func:`validate`) runs, into ``OUT/``::

    OUT/calibration/RUN/     calibration runs of the runtime (validate.plan.calibration_plan: a
                             gradient allreduce and a pairwise average with 2 workers, a case
                             algorithm with a server and one that allreduces the model, at half
                             and 1.5 times the cases' size; with more workers than cores, ssgd
                             oversubscribing the cores, for the CPU work of communication), each
                             ``--calibration-runs`` times (pooled by the fits): never a
                             validated case (other payload sizes); with --calibrate-workers
                             only at those worker counts
    OUT/calibration/probe/   a probe of the transport (psgdlab.runtime.probe), when cases have
                             more workers than cores and no calibration run does: the CPU work
                             of communication, measured (validate.plan.probe_groups)
    OUT/platform.toml        the fitted platform profile (psgdlab.analysis.calibrate)
    OUT/predicted/runs/A-wN  the simulator's prediction of each case on that platform
    OUT/measured/runs/A-wN   the runtime's measurement of each case
    OUT/measured-repeats/    more runs of the cases of a pair measured out of the predicted order
                             (``--remeasure``; the ranking then compares their mean samples/s)
    OUT/compare/             compare.json, report.md (psgdlab.analysis.report)
    OUT/validate.json        the case table, the targets, the load before every run

The machine is shared. Before every run the load averages and the idle cores are recorded
(``--min-idle-cores`` waits for a quieter machine: :mod:`~psgdlab.validate.machine`), and a
measured case in which a step of some worker lasted far longer than the median step (another
process stopped the run: :func:`~psgdlab.validate.run.stall_reason`) is measured once more, the
first attempt's reason kept in ``validate.json``. The learning rate is ``0.5 / dim``, below the
stability limit of one least-squares row (the figures are times, but a run that overflows to
infinity is no model of training).

The model is the least-squares problem (float64, ``dim`` parameters, one minibatch of rows per
worker so memory stays small at 8 workers); compute is emulated by default (each step sleeps to
``compute_time``), so up to 8 workers run on 2 cores. The batch is one row, so the real gradient
stays cheap beside the emulated time; the default size, 250 000 float64 parameters (2 MB)
against 0.05 s of compute, makes the bandwidth term of an allreduce a few percent of the
compute, as on the IBM system (docs/validation.md says why that matters for the ranking;
docs/measurements.md, "Validation", has this machine's figures). The predictions place every
worker on the one host of the fitted platform (H-ADPSGD's nodes are groups of processes of this
machine, as in the runtime). This package sits above :mod:`psgdlab.sim`, :mod:`psgdlab.runtime`
and :mod:`psgdlab.analysis`: :mod:`~psgdlab.validate.plan` (configuration, cases, calibration
plan), :mod:`~psgdlab.validate.run` (measured runs), :mod:`~psgdlab.validate.machine`,
:mod:`~psgdlab.validate.stats` (ranking on pooled runs and seeds) and
:mod:`~psgdlab.validate.report` (the text table).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psgdlab.core.algorithms import algorithm_parameters
from psgdlab.core.trace import atomic_write_json
from psgdlab.validate.machine import load_average, wait_for_quiet
from psgdlab.validate.plan import (
    ALGORITHM_CASES,
    TARGETS,
    ValidateConfig,
    calibration_plan,
    case_name,
    default_calibration_dims,
    probe_groups,
)
from psgdlab.validate.report import case_row, format_table
from psgdlab.validate.run import launch_fresh, measure, remeasure, train_config
from psgdlab.validate.stats import pooled_ranking, predicted_samples_per_s, relabelled_seeds, staleness_ok

__all__ = [
    "ValidateConfig",
    "validate",
    "calibration_plan",
    "case_name",
    "default_calibration_dims",
    "format_table",
    "pooled_ranking",
    "ALGORITHM_CASES",
    "TARGETS",
]


def validate(vc: ValidateConfig, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the whole loop (module docstring) and return the comparison with the case table."""
    from psgdlab.analysis.calibrate import calibrate_runs, platform_profile
    from psgdlab.analysis.compare import compare_dirs, ranking_counts
    from psgdlab.analysis.figures import write_prediction_figures
    from psgdlab.analysis.load import load_run
    from psgdlab.analysis.probe import is_probe_dir
    from psgdlab.analysis.report import write_report
    from psgdlab.analysis.samples import workers_of
    from psgdlab.sim.predict import predict_one
    from psgdlab.sim.report import write_prediction
    from psgdlab.sim.workload import load_config

    say = progress or (lambda msg: None)
    out = Path(vc.out)
    cores = vc.cores or os.cpu_count() or 1
    plan = calibration_plan(vc, cores)  # refuses a plan it cannot fit before anything is written
    out.mkdir(parents=True, exist_ok=True)
    # 1. calibration runs (never the validated cases)
    load: dict[str, Any] = {"start": load_average()}
    calib_dirs = []
    for alg, n, dim, name in plan:
        d = out / "calibration" / name
        say(f"calibration run {d.name}")
        load[d.name] = wait_for_quiet(vc, say)
        launch_fresh(
            train_config(
                vc, algorithm=alg, variant=None, workers=n, dim=dim, straggler="", steps=vc.calibration_steps, out=d
            )
        )
        calib_dirs.append(d)
    groups = probe_groups(vc, cores)
    if groups:  # the CPU work of communication, measured where no calibration run oversubscribes the cores
        from psgdlab.runtime.probe import ProbeConfig, probe

        say(f"probe of the transport (groups {', '.join(map(str, groups))})")
        load["probe"] = wait_for_quiet(vc, say)
        calib_dirs.append(probe(ProbeConfig(out=str(out / "calibration" / "probe"), backend=vc.backend, groups=groups)))
    calibration = calibrate_runs(calib_dirs, cores=cores)
    platform_path = out / "platform.toml"
    platform_profile(
        calibration,
        name="this-machine",
        devices=max(vc.workers),
        n_params=vc.dim,
        itemsize=8,
        batch=vc.batch,
        workers=vc.workers,
    ).write(platform_path)
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
                gpn = vc.gpus_per_node if "gpus_per_node" in algorithm_parameters(algorithm) else None
                say(f"predict {case_name(name, n, straggler)}")
                case: dict[str, Any] = dict(
                    steps=vc.steps, variant=variant, gpus_per_node=gpn, stragglers=straggler or None, workers_per_host=n
                )
                # every seed twice, the workers' compute-time streams in rank order and reversed; the
                # first (seed offset 0, rank order) is the case's prediction, written and compared
                first, *more = relabelled_seeds(n, vc.prediction_seeds)
                p = predict_one(algorithm, n, config, seed=vc.seed + first[0], streams=first[1], **case)
                p.row["algorithm"] = name
                preds.append(p)
                predicted[(name, n)] = [
                    predicted_samples_per_s(q.result.trace, vc.batch)
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
                measure(vc, name, n, straggler, d, case_name(name, n, straggler), load, say)
        if pred_root.exists():
            shutil.rmtree(pred_root)
        write_prediction(pred_root, config, preds, {"validate": dataclasses.asdict(vc), "straggler": straggler})
        write_prediction_figures(
            pred_root, [p.row for p in preds], title=f"{config.platform.name}: {config.workload.name}"
        )
        result = compare_dirs(pred_root, meas_root)
        result["ranking"] = pooled_ranking(result["cases"], {}, predicted)
        if vc.remeasure and not all(r["identical"] for r in result["ranking"].values()):
            runs = remeasure(
                vc, result, pred_root, meas_root.with_name(meas_root.name + "-repeats"), straggler, load, say
            )
            result["ranking"] = pooled_ranking(result["cases"], runs, predicted)
        result["ranking_counts"] = ranking_counts(result["ranking"].values())
        result["ranking_identical"] = result["ranking_counts"]["misordered"] == 0
        write_report(result, out / ("compare" if not straggler else "compare-straggler"), figures=True)
        for c in result["cases"]:
            table.append({**case_row(c), "straggler": straggler})
        ranking_detail[straggler or "none"] = result["ranking"]
    cases = table
    counts = ranking_counts(r for per_n in ranking_detail.values() for r in per_n.values())
    import numpy as np

    errs = np.array([abs(c["step_time_error"]) for c in cases if c["step_time_error"] is not None])
    st_errs = [c["staleness_mean_rel_error"] for c in cases if c["staleness_mean_rel_error"] is not None]
    summary: dict[str, Any] = {
        "cases": cases,
        "median_abs_step_time_error": float(np.median(errs)) if errs.size else None,
        "max_abs_step_time_error": float(errs.max()) if errs.size else None,
        "max_abs_staleness_mean_error": float(max(abs(x) for x in st_errs)) if st_errs else None,
        "ranking": counts,
        "ranking_identical": counts["misordered"] == 0,
        "ranking_detail": ranking_detail,
        "targets": TARGETS,
        "platform": str(platform_path),
        "calibrate_workers": sorted({workers_of(load_run(d)) for d in calib_dirs if not is_probe_dir(d)}),
        "calibration": calibration,
        "config": dataclasses.asdict(vc),
        "load_average": {**load, "end": load_average()},
    }
    summary["targets_met"] = {
        "median_abs_step_time_error": summary["median_abs_step_time_error"] is not None
        and summary["median_abs_step_time_error"] <= TARGETS["median_abs_step_time_error"],
        "max_abs_step_time_error": summary["max_abs_step_time_error"] is not None
        and summary["max_abs_step_time_error"] <= TARGETS["max_abs_step_time_error"],
        "staleness_mean": all(staleness_ok(c) for c in cases),
        "ranking_identical": counts["misordered"] == 0,
    }
    atomic_write_json(out / "validate.json", summary)
    return summary
