"""``psgdlab validate``: calibrate, predict, measure and compare on this machine; with
``--convergence``, the time to a target held-out loss (:mod:`psgdlab.validate.convergence`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from psgdlab.commands import print_json
from psgdlab.core.errors import ConfigError
from psgdlab.core.flags import DefaultsHelpFormatter, add_flags, add_old_spelling, name_list
from psgdlab.runtime.transports.backends import cpu_backends
from psgdlab.validate.convergence_plan import SCALES
from psgdlab.validate.plan import ALGORITHM_CASES, cases_of, cases_to_flags


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "validate",
        help="the whole loop on this machine: calibration runs, predictions, measured runs, comparison",
        description=(
            "Calibrate the simulator on this machine (a gradient allreduce and a pairwise average at two "
            "payload sizes, the first case with a parameter server for the server, the first case that "
            "allreduces the model for the fold of the averaged model, runs with more workers than cores "
            "for the CPU work of communication; each --calibration-runs times), "
            "predict every (algorithm, workers) case with the fitted platform, "
            "measure the same cases with the runtime (emulated compute by default), and compare: step "
            "time (one definition and window for both, see psgdlab.analysis.compare), mean staleness, "
            "ranking by samples/s (a pair is ranked only when its measured difference exceeds two combined "
            "standard errors of the measured means; exact ties in the prediction are one class). The default (6 "
            "algorithm cases x 2, 4 workers, 80 steps, 0.05 s compute, 250000 float64 parameters) takes "
            "a few minutes; the full target grid is --full (2, 4, 8 workers, with and "
            "without a straggler)."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    _case_flags(p)
    _run_flags(p)
    _machine_flags(p)
    _repeat_flags(p)
    _mode_flags(p)
    p.set_defaults(func=run)


def _case_flags(p: argparse.ArgumentParser) -> None:
    """The cases: the algorithms and their variants, the worker and host counts, the NIC rates."""
    algorithm = p.add_argument(
        "--algorithm",
        type=name_list,
        default=None,
        metavar="NAME[,...]",
        help=f"algorithms among {','.join(dict.fromkeys(a for a, _ in ALGORITHM_CASES.values()))} (default: all)",
    )
    p.add_argument(
        "--variant",
        type=name_list,
        default=None,
        metavar="V[,...]",
        help="the variants of the algorithms that have them, each a case: adpsgd fixed|random (default: all)",
    )
    add_old_spelling(p, "--algorithms", algorithm, type=name_list, translate=cases_to_flags)
    add_flags(
        p,
        "--workers",
        many={"--workers"},
        helps={"--workers": "default 2,4; --full: 2,4,8; with --hosts: 4,8 (workers in all, as for train)"},
    )
    add_flags(
        p,
        "--hosts",
        "--nic-bandwidth",
        many={"--hosts", "--nic-bandwidth"},
        helps={
            "--hosts": "-- here the cases' host counts: every H that divides a --workers count N with at least "
            "2 workers per host is a case H x N/H (every algorithm case; hadpsgd with a node per host, easgd's "
            "server on host 0), predicted on a platform of "
            "the same hosts; calibration adds runs of 2 hosts with one worker each for the link between hosts",
            "--nic-bandwidth": "-- here a comma list: every case at each rate (e.g. one where the NIC is the "
            "bottleneck and one where it is not)",
        },
    )


def _run_flags(p: argparse.ArgumentParser) -> None:
    """How each case runs: the transport, the compute, a straggler, the steps, the seed, the model size."""
    p.add_argument("--backend", choices=cpu_backends(), default="gloo", help="the runtime's transport")
    p.add_argument(
        "--compute-time",
        default="0.05",
        metavar="T",
        help="emulated compute per step (psgdlab.core.platform.timing spec)",
    )
    p.add_argument("--real-compute", action="store_true", help="time the real gradient instead of emulating")
    add_flags(
        p,
        "--straggler",
        "--steps",
        "--seed",
        defaults={"--steps": 80, "--seed": None},
        helps={
            "--seed": "here the runs' seed and the first of the predictions' seeds K, K+1, ... (default 0; with "
            "--measured the earlier validate's, and a seed given re-predicts with it)",
            "--straggler": "also validate every case with this straggler; --full uses '1:2'",
            "--steps": "of each case (about 4 s: one stall of another process weighs less)",
        },
    )
    lsq_dim = p.add_argument(
        "--lsq-dim",
        type=int,
        metavar="D",
        default=250_000,
        help="least-squares parameters (float64) of the cases (the calibration runs use half and 1.5 "
        "times as many; below 100000, 50000 and 500000)",
    )
    add_old_spelling(p, "--dim", lsq_dim)


def _machine_flags(p: argparse.ArgumentParser) -> None:
    """This machine: its cores and the wait for idle ones before each run."""
    p.add_argument(
        "--cores",
        type=int,
        default=None,
        help="CPU cores of this machine (default: os.cpu_count()); with more workers than cores, "
        "calibration also runs ssgd with twice as many workers as cores and with the "
        "largest worker count",
    )
    p.add_argument(
        "--min-idle-cores",
        type=float,
        default=0.0,
        metavar="C",
        help="before each run, wait until C cores have been idle over 2 s (the machine is shared: "
        "other work disturbs the timings); 0: do not wait",
    )
    p.add_argument(
        "--max-idle-wait",
        type=float,
        default=300.0,
        metavar="S",
        help="longest wait for idle cores before a run, seconds (then it runs anyway; validate.json "
        "records the idle cores before each run)",
    )


def _repeat_flags(p: argparse.ArgumentParser) -> None:
    """Repeats: of the measured cases, the predictions and the calibration runs, and the calibration's worker counts."""
    p.add_argument(
        "--remeasure",
        type=int,
        default=4,
        metavar="K",
        help="measure each case of a pair that came out of the predicted order K more times and rank "
        "on the mean samples/s of its runs (single runs of two algorithms of the same speed come out "
        "in either order); 0: one run per case",
    )
    p.add_argument(
        "--prediction-seeds",
        type=int,
        default=8,
        metavar="K",
        help="predict each case with K seeds, each also with the workers' compute-time streams in "
        "reverse rank order, and rank on the mean samples/s of those 2K predictions (one 80-step "
        "prediction is one draw of the compute times and matchings)",
    )
    p.add_argument(
        "--calibration-runs",
        type=int,
        default=3,
        metavar="K",
        help="run each calibration configuration K times and fit on all of them (one calibration "
        "moves between runs by more than the gaps that order some algorithms)",
    )
    p.add_argument(
        "--calibrate-workers",
        type=_counts,
        default=None,
        metavar="N[,...]",
        help="calibrate only from runs with these worker counts (at least one of them at most the cores) "
        "and validate the --workers cases from them: extrapolation in workers (e.g. --calibrate-workers 2 "
        "--workers 4,8). Default: 2 workers, and with more case workers than cores also twice the cores "
        "and the largest case count",
    )


def _mode_flags(p: argparse.ArgumentParser) -> None:
    """What to do and where: the full grid, a refit of an earlier validate's runs, the CI gate, the output."""
    p.add_argument("--full", action="store_true", help="the target grid: workers 2,4,8, with and without a straggler")
    conv = p.add_argument_group(
        "time to accuracy (--convergence)",
        "Real training to a target held-out loss of FSDD's BiLSTM (the README's recipe) and of least squares, "
        "measured against the time predicted from a reference run (ssgd, 2 workers: its noise scale and held-out "
        "curve) and this machine's calibrated platform; with --full the grid of issue 42 (hours). "
        "--algorithms, --workers, --straggler, --backend, --min-idle-cores, --max-idle-wait, --out and --json "
        "apply; the throughput validation's other flags do not.",
    )
    conv.add_argument(
        "--convergence",
        action="store_true",
        help="validate time to accuracy (default: least squares, 10 cases x 2 seeds; --workloads fsdd,lsq adds FSDD)",
    )
    conv.add_argument(
        "--workloads",
        type=name_list,
        default=None,
        metavar="W[,...]",
        help="fsdd, lsq (default: lsq, with --full both; fsdd takes tens of minutes and --data)",
    )
    conv.add_argument("--data", default=None, metavar="FSDD.h5", help="the FSDD corpus (psgdlab data fsdd DIR --out F)")
    conv.add_argument(
        "--batches", type=_counts, default=None, metavar="B[,...]", help="per-worker batches (default: per workload)"
    )
    conv.add_argument("--seeds", type=int, default=None, metavar="K", help="runs of each case (default 2; --full 3)")
    conv.add_argument(
        "--scales",
        choices=SCALES,
        default="emulated",
        help="the staleness, learner and period scales: fitted to an emulated run of each case (on the "
        "calibrated platform), or the model's priors",
    )
    conv.add_argument(
        "--target-loss",
        default=None,
        metavar="W=LOSS[,...]",
        help="the target held-out loss of a workload (default: its reference run's at 60 %% of its epochs)",
    )
    p.add_argument(
        "--measured",
        default=None,
        metavar="DIR",
        help="make no run: take the calibration runs, measured cases and repeats of an earlier validate "
        "in DIR, fit, predict and compare them again with the current model into --out (a change to the "
        "model checked against measurements already made, in seconds; no root needed for emulated hosts). "
        "The cases, their sizes, steps and transport and the calibration plan are DIR's (validate.json): "
        "--algorithm, --variant, --workers, --hosts, --nic-bandwidth, --straggler, --calibrate-workers and --full "
        "are refused with it",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when any target is missed, naming each on stderr (one line each), 0 when all are met: "
        "a gate for CI. With hosts, H-ADPSGD's predicted advantage holds when it is within 10%% of the "
        "measured advantage's size or within two combined standard errors of the measured means",
    )
    add_flags(
        p,
        "--out",
        "--force",
        "--json",
        "--no-figures",
        "--no-progress",
        required={"--out"},
        helps={
            "--out": "required here",
            "--no-progress": "the lines that say which run or prediction comes next (none with --json either)",
        },
    )


def _counts(text: str) -> tuple[int, ...]:
    """``"2,4"`` -> ``(2, 4)``; anything else is a one-line usage error."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated integers (e.g. 2 or 2,4)") from None


def run(args: argparse.Namespace) -> int:
    from psgdlab.validate import ValidateConfig

    if args.convergence:
        return _convergence(args)
    if args.measured:
        return _report(_earlier(args), args)
    if args.nic_bandwidth and not args.hosts:
        raise ConfigError(f"nic-bandwidth ({','.join(args.nic_bandwidth)}) applies only with --hosts")
    if args.hosts:  # one line and exit 2 where emulated hosts cannot be made, before anything runs
        from psgdlab.runtime.launcher.netns import require_netns

        require_netns(max(args.hosts))
    workers = args.workers or ((2, 4, 8) if args.full else (4, 8) if args.hosts else (2, 4))
    straggler = args.straggler if args.straggler is not None else ("1:2" if args.full else None)
    if straggler:
        from psgdlab.core.platform.stragglers import StragglerModel

        StragglerModel.parse(straggler, seed=0, n_workers=min(workers))
    vc = ValidateConfig(
        out=args.out,
        algorithms=cases_of(args.algorithm, args.variant),
        workers=workers,
        backend=args.backend,
        compute_time=None if args.real_compute else args.compute_time,
        stragglers=("",) + ((straggler,) if straggler else ()),
        steps=args.steps,
        dim=args.lsq_dim,
        cores=args.cores,
        min_idle_cores=args.min_idle_cores,
        max_idle_wait_s=args.max_idle_wait,
        remeasure=args.remeasure,
        prediction_seeds=args.prediction_seeds,
        calibration_runs=args.calibration_runs,
        calibrate_workers=args.calibrate_workers,
        hosts=tuple(args.hosts or ()),
        nic_bandwidths=tuple(args.nic_bandwidth or ()),
        seed=args.seed if args.seed is not None else 0,
    )
    return _report(vc, args)


def _convergence(args: argparse.Namespace) -> int:
    """``--convergence``: the time-to-accuracy validation; its table, or its JSON with ``--json``."""
    from psgdlab.core.records.rundir import open_run_dir
    from psgdlab.validate.convergence import validate_convergence
    from psgdlab.validate.convergence_plan import CONVERGENCE_CASES, ConvergenceConfig
    from psgdlab.validate.convergence_results import format_convergence

    for flag, value in (
        ("--measured", args.measured),
        ("--hosts", args.hosts),
        ("--nic-bandwidth", args.nic_bandwidth),
        ("--calibrate-workers", args.calibrate_workers),
    ):
        if value:
            raise ConfigError(f"{flag} does not apply to --convergence (a validation on one host, run now)")
    straggler = args.straggler if args.straggler is not None else ("1:2" if args.full else None)
    cc = ConvergenceConfig(
        out=args.out,
        workloads=tuple(args.workloads or (("fsdd", "lsq") if args.full else ("lsq",))),
        algorithms=tuple(c for c in cases_of(args.algorithm, args.variant) if c in CONVERGENCE_CASES)
        if args.algorithm or args.variant
        else CONVERGENCE_CASES,
        workers=tuple(args.workers) if args.workers else None,
        batches=args.batches,
        stragglers=("",) + ((straggler,) if straggler else ()),
        seeds=args.seeds if args.seeds is not None else (3 if args.full else 2),
        full=args.full,
        data=args.data,
        targets=_targets(args.target_loss),
        scales=args.scales,
        backend=args.backend,
        min_idle_cores=args.min_idle_cores,
        max_idle_wait_s=args.max_idle_wait,
    )
    progress = None if args.json or args.no_progress else (lambda msg: print(msg, file=sys.stderr, flush=True))
    with open_run_dir(cc.out, command="validate", force=args.force) as held:
        report = validate_convergence(cc, progress=progress)
        held.commit()
    if args.json:
        print_json(report)
    else:
        print(format_convergence(report))
        print(f"report: {args.out}/validate_convergence.json")
    if args.check:
        from psgdlab.validate.check import missed_convergence_targets

        return _check(missed_convergence_targets(report))
    return 0


def _targets(text: str | None) -> tuple[tuple[str, float], ...]:
    """``"fsdd=1.9,lsq=0.5"`` -> ``(("fsdd", 1.9), ("lsq", 0.5))``; anything else one line, exit 2."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            out.append((name.strip(), float(value)))
        except ValueError:
            raise ConfigError(f"target-loss ({text!r}) must be WORKLOAD=LOSS[,...], e.g. fsdd=1.9") from None
    return tuple(out)


def _earlier(args: argparse.Namespace) -> Any:
    """The configuration of the earlier validate in ``--measured`` (its grid), to predict again."""
    from psgdlab.validate import ValidateConfig
    from psgdlab.validate.run import earlier_validate

    grid = {
        "--algorithm": args.algorithm,
        "--variant": args.variant,
        "--workers": args.workers,
        "--hosts": args.hosts,
        "--nic-bandwidth": args.nic_bandwidth,
        "--straggler": args.straggler,
        "--calibrate-workers": args.calibrate_workers,
        "--full": args.full or None,
    }
    for flag, value in grid.items():
        if value:
            raise ConfigError(f"{flag} cannot be given with --measured: the cases are those of {args.measured}")
    earlier = earlier_validate(Path(args.measured), Path(args.out))
    config = dict(earlier["config"])
    # a validate made before the server ran on emulated hosts left it out there (hosts.skipped)
    skipped = earlier.get("hosts", {}).get("skipped", [])
    config["algorithms"] = [a for a in config["algorithms"] if a not in skipped]
    seed = {} if args.seed is None else {"seed": args.seed}
    return ValidateConfig.from_json(
        config, out=args.out, measured=args.measured, prediction_seeds=args.prediction_seeds, **seed
    )


def _report(vc: Any, args: argparse.Namespace) -> int:
    """Run :func:`~psgdlab.validate.validate` and print its table, or its JSON with ``--json``."""
    from psgdlab.core.records.rundir import open_run_dir
    from psgdlab.validate import format_table, validate

    progress = None if args.json or args.no_progress else (lambda msg: print(msg, file=sys.stderr, flush=True))
    fresh = vc.measured is not None and not Path(vc.out).exists()
    with open_run_dir(vc.out, command="validate", force=args.force) as held:
        try:
            report = validate(vc, progress=progress, figures=not args.no_figures)
        except BaseException:
            if fresh:  # made by a validate --measured that failed (an earlier validate of another grid)
                held.empty()
            raise
        held.commit()
    if args.json:
        print_json(report.answer())
    else:
        print(format_table(report))
        print(f"reports: {args.out}/compare*/report.md, {args.out}/validate.json")
    if args.check:
        from psgdlab.validate.check import missed_targets

        return _check(missed_targets(report))
    return 0


def _check(missed: list[str]) -> int:
    """``--check``'s exit status: 1 when a target was missed (each said in one line on stderr), 0
    when every target was met."""
    for line in missed:
        print(f"psgdlab validate: target missed: {line}", file=sys.stderr)
    return 1 if missed else 0
