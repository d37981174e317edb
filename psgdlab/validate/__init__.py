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
    OUT/calibration/probe/   a probe of the transport (psgdlab.runtime.launcher.probe), when cases have
                             more workers than cores and no calibration run does: the CPU work
                             of communication, measured (validate.plan.probe_groups)
    OUT/calibration/probe-h2-RATE/  with --hosts, when a case has more workers than cores, a
                             probe between 2 emulated hosts (one rank each) per NIC rate: the
                             CPU work of a message between hosts
    OUT/platform.toml        the fitted platform profile (psgdlab.analysis.calibrate), its
                             noise_cv at least the calibration runs' residual, its latency
                             per round between hosts fitted through the simulator where the
                             runs of more hosts than cores say it (psgdlab.calibration.fitted_profile)
    OUT/predicted/runs/A-wN  the simulator's prediction of each case on that platform
    OUT/measured/runs/A-wN   the runtime's measurement of each case
    OUT/measured-repeats/    more runs of the cases of a pair measured out of the predicted order
                             (``--remeasure``; the ranking then compares their mean samples/s)
    OUT/compare/             compare.json, report.md (psgdlab.analysis.report)
    OUT/validate.json        the case table, the targets, the ranking (pairs ranked, measured
                             as ties, misordered: psgdlab.analysis.compare.ranking), the load
                             before every run

**On emulated hosts** (``--hosts H[,...] --nic-bandwidth RATE[,...]``, :mod:`psgdlab.runtime.launcher.netns`,
needs root): the cases are every ``H x N/H`` (:func:`~psgdlab.validate.plan.host_cases`: ``H``
divides a ``--workers`` count ``N`` with at least 2 workers per host), every algorithm case, with
hadpsgd's node a host and easgd's server on host 0, each at every NIC rate, and calibration adds
runs of 2 hosts with one worker each (a gradient allreduce and a pairwise average at both
calibration sizes, per rate; and an allreduce of 4 hosts, whose latency per round the runs of 2
cannot tell from a cost per call: :func:`~psgdlab.validate.plan.between_hosts_plan`), from which
:func:`psgdlab.analysis.calibrate.fit_between_hosts` fits the link between hosts. One platform
per rate, ``OUT/platform-RATE.toml``: this machine's fits inside a host and that rate's between
hosts, ``H`` hosts of ``N/H`` devices; the predictions place the workers on hosts as the runtime
does (contiguous blocks). Directories get ``-hH-RATE`` appended; ``validate.json`` adds
``hosts``: the cases, the algorithms left out, and H-ADPSGD's advantage over AD-PSGD and SSGD,
predicted and measured (:func:`~psgdlab.validate.stats.hadpsgd_advantage`). What the simulator
does not see: every emulated host shares this machine's cores (its CPU model counts the cores
per host).

**Again, without running** (``--measured DIR``): the calibration runs, measured cases and repeats
of an earlier validate in ``DIR`` are fitted, predicted and compared again with the current model
into ``OUT`` (its grid read from ``DIR/validate.json``; ``validate.json`` then records
``measured_in`` and the earlier load): a change to the model is checked against every
measurement already made in a minute instead of an hour, and the earlier comparison is kept.

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
machine, as in the runtime), under the failure policy the case's run follows
(:func:`~psgdlab.validate.run.case_policy`: under continue, the runtime's default for gossip, a
node of several members sums its slices with the gradient, and the prediction prices that). This
package sits above :mod:`psgdlab.sim`, :mod:`psgdlab.runtime`
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
from functools import partial
from pathlib import Path
from typing import Any

from psgdlab.analysis.calibration_report import Calibration
from psgdlab.calibration import fitted_profile
from psgdlab.core.platform.placement import equal_blocks
from psgdlab.core.records.results import document
from psgdlab.core.records.trace import atomic_write_json
from psgdlab.validate.machine import load_average, wait_for_quiet
from psgdlab.validate.plan import (
    ALGORITHM_CASES,
    TARGETS,
    ValidateConfig,
    between_hosts_plan,
    between_hosts_probes,
    calibration_plan,
    case_name,
    default_calibration_dims,
    host_cases,
    probe_groups,
    rate_slug,
    targets_for,
)
from psgdlab.validate.report import case_row, format_table
from psgdlab.validate.results import RankingCounts, ValidationCase, ValidationReport
from psgdlab.validate.run import (
    case_policy,
    earlier_repeats,
    earlier_run,
    earlier_validate,
    launch_fresh,
    measure,
    remeasure,
    train_config,
)
from psgdlab.validate.stats import (
    hadpsgd_advantage,
    interval_coverage,
    mark_intervals,
    pooled_ranking,
    predicted_samples_per_s,
    relabelled_seeds,
    staleness_ok,
)

__all__ = [
    "ValidateConfig",
    "ValidationCase",
    "ValidationReport",
    "validate",
    "calibration_plan",
    "case_name",
    "default_calibration_dims",
    "format_table",
    "pooled_ranking",
    "ALGORITHM_CASES",
    "TARGETS",
]


def validate(
    vc: ValidateConfig, *, progress: Callable[[str], None] | None = None, figures: bool = True
) -> ValidationReport:
    """Run the whole loop (module docstring) and return its report (what ``validate.json`` holds);
    ``figures=False`` draws no figure into the predictions and comparisons (``--no-figures``).

    With ``vc.measured`` (an earlier validate's directory) no run is made: its runs are fitted,
    predicted and compared again into ``vc.out``, which is removed again if that fails (an earlier
    validate of another grid: a run missing) and it did not exist before.
    """
    out = Path(vc.out)
    made = vc.measured is not None and not out.exists()
    try:
        return _validate(vc, progress, figures)
    except BaseException:
        if made:
            shutil.rmtree(out, ignore_errors=True)
        raise


@dataclasses.dataclass
class _Session:
    """What every phase of one validate shares: its config, the directory written (``out``), the
    one its runs are in (``source``: ``out``, or ``--measured``'s earlier validate), the progress
    line and the load average before each run made (``load``, keyed by the run's directory name)."""

    vc: ValidateConfig
    out: Path
    source: Path
    say: Callable[[str], None]
    load: dict[str, Any]

    def obtain(self, d: Path, label: str, start: Callable[[], Any]) -> Path:
        """Run ``d`` now (``start``), or with ``--measured`` take the earlier validate's run there."""
        if self.vc.measured:
            return earlier_run(self.source, d)
        self.say(label)
        self.load[d.name] = wait_for_quiet(self.vc, self.say)
        start()
        return d


#: one platform per NIC rate and host count: (the NIC rate, None for an unshaped link; hosts)
_Setting = tuple[str | None, int]


def _validate(vc: ValidateConfig, progress: Callable[[str], None] | None, figures: bool = True) -> ValidationReport:
    if vc.hosts and not vc.measured:  # one line and nothing written where emulated hosts cannot be made
        from psgdlab.runtime.launcher.netns import require_netns

        require_netns(max(vc.hosts))

    out = Path(vc.out)
    # the runs: made now into OUT, or (--measured) an earlier validate's, predicted and compared again
    source = Path(vc.measured) if vc.measured else out
    earlier = earlier_validate(source, out) if vc.measured else {}
    cores = vc.cores or os.cpu_count() or 1
    plan = calibration_plan(vc, cores)  # refuses a plan it cannot fit before anything is written
    out.mkdir(parents=True, exist_ok=True)
    s = _Session(vc, out, source, progress or (lambda msg: None), {"start": load_average()})
    # 1. calibration runs (never the validated cases)
    calib_dirs = _calibration_runs(s, plan, cores)
    between = _between_hosts_runs(s, cores) if vc.hosts else {}
    settings: list[_Setting] = (
        [(rate, h) for rate in (vc.nic_bandwidths or (None,)) for h in vc.hosts] if vc.hosts else [(None, 1)]
    )
    configs, calibrations = _fit_platforms(s, settings, calib_dirs, between, cores)
    # 2. one measured run and one prediction per case
    table: list[ValidationCase] = []
    ranking_detail: dict[str, dict[str, Any]] = {}
    for rate, hosts in settings:
        for straggler in vc.stragglers:
            rows, label, ranking = _validate_cases(s, configs[rate], (rate, hosts), straggler, figures=figures)
            table.extend(rows)
            ranking_detail[label] = ranking
    report = _report(s, tuple(table), ranking_detail, calibrations, calib_dirs, earlier)
    atomic_write_json(out / "validate.json", document(report.to_json()))
    return report


def _calibration_runs(s: _Session, plan: list[tuple[str, int, int, str]], cores: int) -> list[Path]:
    """Make (or find) the calibration runs of ``plan`` and the probe of the transport; their directories."""
    vc = s.vc
    calib_dirs = []
    for alg, n, dim, name in plan:
        cfg = train_config(
            vc,
            algorithm=alg,
            variant=None,
            workers=n,
            dim=dim,
            straggler="",
            steps=vc.calibration_steps,
            out=s.source / "calibration" / name,
        )
        calib_dirs.append(s.obtain(Path(cfg.out), f"calibration run {name}", partial(launch_fresh, cfg)))
    groups = probe_groups(vc, cores)
    if groups:  # the CPU work of communication, measured where no calibration run oversubscribes the cores
        from psgdlab.runtime.launcher.probe import ProbeConfig, probe

        probe_cfg = ProbeConfig(out=str(s.source / "calibration" / "probe"), backend=vc.backend, groups=groups)
        label = f"probe of the transport (groups {', '.join(map(str, groups))})"
        calib_dirs.append(s.obtain(Path(probe_cfg.out), label, partial(probe, probe_cfg)))
    return calib_dirs


def _between_hosts_runs(s: _Session, cores: int) -> dict[str | None, list[Path]]:
    """Make (or find) the calibration runs and probes between emulated hosts; their directories by NIC rate."""
    from psgdlab.runtime.launcher.probe import ProbeConfig, probe

    vc, source = s.vc, s.source
    between: dict[str | None, list[Path]] = {}
    for alg, h, dim, rate, name in between_hosts_plan(vc):
        cfg = train_config(
            vc,
            algorithm=alg,
            variant=None,
            workers=h,
            dim=dim,
            straggler="",
            steps=vc.calibration_steps,
            out=source / "calibration" / name,
            hosts=h,
            nic_bandwidth=rate,
        )
        if vc.measured and h > 2 and not Path(cfg.out).is_dir():  # a validate older than these runs
            s.say(f"{name}: not in {source}; the allreduce between hosts takes the messages' latency per round")
            continue
        label = f"calibration run {name} ({h} emulated hosts, one worker each)"
        between.setdefault(rate, []).append(s.obtain(Path(cfg.out), label, partial(launch_fresh, cfg)))
    for rate, name in between_hosts_probes(vc, cores):  # the CPU work of a message between hosts
        d = source / "calibration" / name
        if vc.measured and not d.is_dir():  # a validate older than this probe
            s.say(f"{d.name}: not in {source}; a message between hosts costs the CPU work of one inside a host")
            continue
        nic_cfg = ProbeConfig(out=str(d), backend="gloo", groups=(2,), hosts=2, nic_bandwidth=rate)
        label = f"probe between 2 emulated hosts at {rate or 'an unshaped link'} (one rank each)"
        between.setdefault(rate, []).append(s.obtain(d, label, partial(probe, nic_cfg)))
    return between


def _fit_platforms(
    s: _Session,
    settings: list[_Setting],
    calib_dirs: list[Path],
    between: dict[str | None, list[Path]],
    cores: int,
) -> tuple[dict[str | None, Any], dict[str, Calibration]]:
    """One platform per NIC rate: this machine's fits inside a host, the rate's between hosts; each
    written to OUT/platform*.toml. Returns the configs to predict with (by rate) and the
    calibrations (by the platform file's name)."""
    from psgdlab.analysis.calibrate import calibrate_runs
    from psgdlab.sim.workload import load_config

    vc = s.vc
    configs: dict[str | None, Any] = {}
    calibrations: dict[str, Calibration] = {}
    for rate in dict.fromkeys(r for r, _ in settings):
        fitted = calib_dirs + between.get(rate, [])
        calibration = calibrate_runs(fitted, cores=cores)
        platform_path = s.out / ("platform.toml" if not vc.hosts else f"platform-{rate_slug(rate)}.toml")
        per_host = max(n // h for h, n in host_cases(vc)) if vc.hosts else max(vc.workers)
        s.say("predict the calibration runs")
        profile, calibration = fitted_profile(
            calibration,
            fitted,
            name="this-machine" if not vc.hosts else f"emulated-hosts-{rate_slug(rate)}",
            devices=per_host,
            n_params=vc.dim,
            itemsize=8,
            batch=vc.batch,
            workers=vc.workers,
            hosts=max(vc.hosts) if vc.hosts else None,
        )
        profile.write(platform_path)
        configs[rate] = load_config(path=platform_path)
        calibrations[str(platform_path.name)] = calibration
    return configs, calibrations


def _validate_cases(
    s: _Session, config: Any, setting: _Setting, straggler: str, *, figures: bool
) -> tuple[list[ValidationCase], str, dict[str, Any]]:
    """Predict, measure and compare every case of one setting and straggler; returns the table's
    rows, the setting's label and its ranking (by worker count)."""
    from psgdlab.analysis.figures import write_prediction_figures
    from psgdlab.analysis.report import write_report
    from psgdlab.core.records.rundir import commit_run
    from psgdlab.sim.report import write_prediction

    vc, out = s.vc, s.out
    rate, hosts = setting
    tag = "" if hosts == 1 else f"-h{hosts}-{rate_slug(rate)}"
    label = (
        (straggler or "none")
        if hosts == 1
        else f"{hosts} hosts, nic {rate or 'unshaped'}, straggler {straggler or 'none'}"
    )
    meas_root = s.source / (("measured" if not straggler else "measured-straggler") + tag)
    pred_root = out / (("predicted" if not straggler else "predicted-straggler") + tag)
    preds, predicted = _predict_and_measure(s, config, setting, straggler, meas_root)
    if pred_root.exists():
        shutil.rmtree(pred_root)
    write_prediction(
        pred_root,
        config,
        preds,
        {"validate": dataclasses.asdict(vc), "straggler": straggler, "hosts": hosts, "nic_bandwidth": rate},
    )
    if figures:
        write_prediction_figures(
            pred_root, [p.row for p in preds], title=f"{config.platform.name}: {config.workload.name}"
        )
    commit_run(pred_root, command="validate")
    result = _compare(s, pred_root, meas_root, predicted, setting, straggler)
    mark_intervals(result["cases"], [p.row for p in preds])
    write_report(result, out / (("compare" if not straggler else "compare-straggler") + tag), figures=figures)
    rows = [case_row(c, straggler=straggler, hosts=hosts, nic_bandwidth=rate) for c in result["cases"]]
    return rows, label, {str(n): r for n, r in result["ranking"].items()}


def _predict_and_measure(
    s: _Session, config: Any, setting: _Setting, straggler: str, meas_root: Path
) -> tuple[list[Any], dict[tuple[str, int], list[float]]]:
    """Predict each case (and measure it, unless ``--measured``); returns the predictions written
    and the samples/s of each of a case's predictions (every seed, both stream orders)."""
    from psgdlab.sim.predict import predict_one

    vc = s.vc
    rate, hosts = setting
    counts_n = [n for h, n in host_cases(vc) if h == hosts] if vc.hosts else list(vc.workers)
    preds = []
    predicted: dict[tuple[str, int], list[float]] = {}  # samples/s of each of a case's predictions
    for name in vc.algorithms:
        algorithm, variant = ALGORITHM_CASES[name]
        for n in counts_n:
            per_host = equal_blocks(n, hosts=hosts).per_host
            # the run's node: on emulated hosts a host (psgdlab.runtime.config.platform_facts)
            gpn = vc.gpus_per_node if hosts == 1 else per_host
            cname = case_name(name, n, straggler, hosts, rate)
            d = meas_root / "runs" / f"{name}-w{n}"
            s.say(f"predict {cname}")
            case: dict[str, Any] = dict(
                steps=vc.steps,
                variant=variant,
                gpus_per_node=gpn,
                stragglers=straggler or None,
                workers_per_host=per_host,
                on_failure=case_policy(vc, name, n, d, hosts, rate),  # the protocol the run follows
            )
            # every seed twice, the workers' compute-time streams in rank order and reversed; the
            # first (seed offset 0, rank order) is the case's prediction, written and compared
            first, *more = relabelled_seeds(n, vc.prediction_seeds)
            p = predict_one(algorithm, n, config, seed=vc.seed + first[0], streams=first[1], **case)
            p.row = dataclasses.replace(p.row, algorithm=name)
            preds.append(p)
            predicted[(name, n)] = [
                predicted_samples_per_s(q.result.trace, vc.batch)
                for q in [
                    p,
                    *(predict_one(algorithm, n, config, seed=vc.seed + k, streams=order, **case) for k, order in more),
                ]
            ]
            if vc.measured:
                earlier_run(s.source, d)
            else:
                s.say(f"measure {cname}")
                measure(vc, name, n, straggler, d, cname, s.load, s.say, hosts, rate)
    return preds, predicted


def _compare(
    s: _Session,
    pred_root: Path,
    meas_root: Path,
    predicted: dict[tuple[str, int], list[float]],
    setting: _Setting,
    straggler: str,
) -> dict[str, Any]:
    """Compare the predictions with the measured runs and rank the cases, pooling the repeats of
    pairs misordered (the earlier validate's with ``--measured``, new ones with ``--remeasure``)."""
    from psgdlab.analysis.compare import compare_dirs, ranking_counts

    vc = s.vc
    rate, hosts = setting
    result = compare_dirs(pred_root, meas_root)
    result["ranking"] = pooled_ranking(result["cases"], {}, predicted)
    repeats = meas_root.with_name(meas_root.name + "-repeats")
    if vc.measured:  # the earlier validate's repeats, of the pairs its prediction misordered
        runs = earlier_repeats(result, pred_root, repeats)
        result["ranking"] = pooled_ranking(result["cases"], runs, predicted)
    elif vc.remeasure and not all(r["identical"] for r in result["ranking"].values()):
        runs = remeasure(vc, result, pred_root, repeats, straggler, s.load, s.say, hosts, rate)
        result["ranking"] = pooled_ranking(result["cases"], runs, predicted)
    result["ranking_counts"] = ranking_counts(result["ranking"].values())
    result["ranking_identical"] = result["ranking_counts"]["misordered"] == 0
    return result


def _report(
    s: _Session,
    cases: tuple[ValidationCase, ...],
    ranking_detail: dict[str, dict[str, Any]],
    calibrations: dict[str, Calibration],
    calib_dirs: list[Path],
    earlier: dict[str, Any],
) -> ValidationReport:
    """The validation's report: the errors, the interval coverage and the ranking against their targets."""
    import numpy as np

    from psgdlab.analysis.compare import ranking_counts
    from psgdlab.analysis.load import load_run
    from psgdlab.analysis.probe import is_probe_dir
    from psgdlab.analysis.samples import workers_of

    vc, out = s.vc, s.out
    counts = ranking_counts(r for per_n in ranking_detail.values() for r in per_n.values())
    errs = np.array([abs(c.step_time_error) for c in cases if c.step_time_error is not None])
    st_errs = [c.staleness_mean_rel_error for c in cases if c.staleness_mean_rel_error is not None]
    coverage, widest = interval_coverage(cases)
    only = next(iter(calibrations.values()))
    calibrate_workers = sorted({workers_of(load_run(d)) for d in calib_dirs if not is_probe_dir(d)})
    targets = targets_for(vc, calibrate_workers)
    advantage = hadpsgd_advantage(cases) if vc.hosts else []
    median = float(np.median(errs)) if errs.size else None
    largest = float(errs.max()) if errs.size else None
    return ValidationReport(
        cases=cases,
        interval_coverage=coverage,
        interval_max_half_width=widest,
        median_abs_step_time_error=median,
        max_abs_step_time_error=largest,
        max_abs_staleness_mean_error=float(max(abs(x) for x in st_errs)) if st_errs else None,
        ranking=RankingCounts.from_json(counts),
        ranking_identical=counts["misordered"] == 0,
        ranking_detail=ranking_detail,
        targets=targets,
        targets_met={
            "median_abs_step_time_error": median is not None and median <= targets["median_abs_step_time_error"],
            "max_abs_step_time_error": largest is not None and largest <= targets["max_abs_step_time_error"],
            "staleness_mean": all(staleness_ok(c) for c in cases),
            "ranking_identical": counts["misordered"] == 0,
            "interval_coverage": coverage is not None and coverage >= targets["interval_coverage"],
            "interval_max_half_width": widest is not None and widest <= targets["interval_half_width"],
            # with hosts: every predicted advantage of H-ADPSGD holds (validate.stats.advantage_holds)
            **({"hadpsgd_advantage": all(a["holds"] for a in advantage)} if vc.hosts else {}),
        },
        platform=str(out / "platform.toml") if not vc.hosts else tuple(str(out / k) for k in calibrations),
        calibrate_workers=tuple(calibrate_workers),
        calibration=only if not vc.hosts else calibrations,
        config=dataclasses.asdict(vc),
        # with --measured the load is the earlier validate's, when its runs were made
        load_average=earlier.get("load_average", {}) if vc.measured else {**s.load, "end": load_average()},
        measured_in=str(s.source) if vc.measured else None,
        hosts={"cases": [f"{h}x{n // h}" for h, n in host_cases(vc)], "advantage": advantage} if vc.hosts else None,
    )
