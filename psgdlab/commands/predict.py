"""``psgdlab predict``: predict step time, speedup, time to train or to a target, staleness and straggler cost.

Runs the discrete-event simulator (:mod:`psgdlab.sim`) for every (algorithm, workers) pair on a
preset or a platform file, prints a table (or one JSON object with ``--json``) and writes a run
directory with the summary, traces, timelines and plots.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psgdlab.commands import print_json, show_progress
from psgdlab.core.flags import DefaultsHelpFormatter, add_flags
from psgdlab.core.platform.profile import Defaults
from psgdlab.core.platform.workloads import BY_MODEL, WORKLOADS
from psgdlab.sim.workload import DEFAULT_PRESET

if TYPE_CHECKING:
    from psgdlab.core.convergence import ConvergenceProfile, Target
    from psgdlab.core.records.rundir import RunDir, RunLock
    from psgdlab.sim.failures import FailureRequest
    from psgdlab.sim.predict import Prediction
    from psgdlab.sim.workload import SimConfig

#: a prediction estimated to simulate longer than this (wall seconds) runs only with --yes
CONFIRM_AFTER_S = 600.0
#: requests of fewer worker-steps than this (every configuration's, together) are not estimated:
#: at the simulator's 40-250 us per worker-step they take a few minutes at most
ESTIMATE_FROM_WORKER_STEPS = 1_000_000
#: steps per worker of the timed simulation an estimate comes from
ESTIMATE_PROBE_STEPS = 50
#: memory of one trace record while a simulation builds its trace (a Python tuple of ten values,
#: then the array and its sorted copy): 450 B measured with tracemalloc (AD-PSGD, 64 workers)
BYTES_PER_RECORD = 450


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "predict",
        help="simulate algorithms on a described cluster: step time, speedup, time to train, staleness",
        description=(
            "Predict, with a discrete-event simulator, how fast each parallel-SGD algorithm trains a "
            "workload on a cluster: step time, samples/s, speedup over one-worker SGD, epoch time and "
            "time to train (extrapolated from a simulated window), communication and idle fractions and "
            f"the staleness of updates. With no arguments: preset {DEFAULT_PRESET}, algorithms "
            f"{','.join(Defaults().algorithms)}, workers {','.join(map(str, Defaults().workers))}."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    _cluster_flags(p)
    _configuration_flags(p)
    _output_flags(p)
    _failure_flags(p)
    p.set_defaults(func=run)


def _cluster_flags(p: argparse.ArgumentParser) -> None:
    """The platform (a preset or a file) and the workload predicted on it."""
    src = p.add_mutually_exclusive_group()
    add_flags(
        src,
        "--preset",
        "--platform",
        helps={
            "--preset": f"psgdlab preset list names them; default {DEFAULT_PRESET}",
            "--platform": "psgdlab preset show NAME > FILE.toml writes one to edit",
        },
    )
    p.add_argument(
        "--workload",
        metavar="NAME|FILE.toml",
        default=None,
        help="predict another model on the same platform: a named workload (psgdlab workload list: "
        f"{', '.join(sorted(WORKLOADS))}; or the runtime's model preset that trains it, {', '.join(BY_MODEL)}) "
        "or a TOML file with a [workload] table (psgdlab workload show NAME writes one); its compute time follows "
        "from the "
        "platform's device (peak FLOP/s and memory bandwidth times the platform's efficiencies); "
        "default: the file's own [workload]",
    )


def _configuration_flags(p: argparse.ArgumentParser) -> None:
    """The configurations: algorithms, worker counts, their placement on hosts, the batch, the
    period, the variant, the simulated window, a straggler, the seed."""
    add_flags(
        p,
        "--algorithm",
        "--workers",
        many={"--algorithm", "--workers"},
        helps={
            "--algorithm": f"default: the file's [defaults] or {','.join(Defaults().algorithms)}",
            "--workers": f"default: the file's [defaults] or {','.join(map(str, Defaults().workers))}",
        },
    )
    add_flags(
        p,
        "--workers-per-node",
        helps={"--workers-per-node": "default: the platform's devices per host, capped by the number of workers"},
    )
    p.add_argument(
        "--workers-per-host",
        metavar="K",
        type=int,
        default=None,
        help="place K workers on each host whatever the super-learner size (e.g. H-ADPSGD nodes of "
        "--workers-per-node 2 as groups of one machine's processes on a calibrated this-machine "
        "platform); default: --workers-per-node",
    )
    add_flags(
        p,
        "--batch",
        "--period",
        "--variant",
        "--steps",
        "--straggler",
        "--seed",
        helps={
            "--batch": "default: the workload's; compute time scales with it",
            "--period": "default: the file's [defaults] period",
            "--steps": "the simulated window (default: 200, or 10 sync periods, extended until steady)",
        },
    )


def _output_flags(p: argparse.ArgumentParser) -> None:
    """The run directory and printing, parallel jobs, the time-to-target columns, and the
    confirmation a long prediction needs."""
    add_flags(
        p,
        "--out",
        "--force",
        "--json",
        "--jobs",
        "--target",
        "--convergence",
        helps={
            "--json": "the object has (schema_version, run_dir, platform, workload, wall_s, has_unpinned_parameters, "
            "noise_extrapolated) with a list rows; each row's KEY_low and KEY_high are its 90 %% interval",
        },
    )
    add_flags(p, "--no-figures", "--no-progress")
    p.add_argument(
        "--yes",
        action="store_true",
        help=f"run a prediction estimated to simulate longer than {CONFIRM_AFTER_S / 60:.0f} minutes (a large "
        "--steps; the estimate comes from a short timed simulation)",
    )


def _failure_flags(p: argparse.ArgumentParser) -> None:
    """Worker failures priced into the rows (an argument group of their own in --help)."""
    fail = p.add_argument_group(
        "failures",
        "price worker deaths: detection (the platform's failure_detection_s), the schedule rebuilt over "
        "the survivors or a stop or a restart from the last checkpoint (restart_s, checkpoint_bytes_per_s), "
        "the work lost and the time to train; rows of one worker have none",
    )
    add_flags(
        fail,
        "--fail",
        "--failure-rate",
        "--on-failure",
        "--checkpoint-every",
        defaults={"--checkpoint-every": 0},
        helps={
            "--failure-rate": "the time to train is the mean over --failure-draws draws",
            "--on-failure": "the runs' policy (default: the algorithm's with --fail or --failure-rate, else stop): "
            "continue prices the survivors' protocol too, where a node of several GPUs sums its slices with the "
            "gradient (psgdlab train's default for gossip on gloo with a run directory)",
        },
    )
    fail.add_argument(
        "--failure-draws",
        type=int,
        default=None,
        metavar="K",
        help="draws of random failures with --failure-rate (default 20)",
    )


@dataclass(frozen=True, slots=True)
class Request:
    """What a ``predict`` namespace asks for, resolved: the platform and workload (``config``, given
    room for the largest case; ``calibrated``, as the file or preset says it, on which each case is
    simulated with its own room: :func:`psgdlab.sim.workload.with_room_for`), the algorithms and
    worker counts, the failures and the convergence model with its target; ``room``, the line
    that says a calibrated machine runs more workers than it has as more processes, or None."""

    config: SimConfig
    algorithms: tuple[str, ...]
    workers: tuple[int, ...]
    failures: FailureRequest | None
    convergence: ConvergenceProfile | None
    target: Target | None
    calibrated: SimConfig
    room: str | None


def resolve(args: argparse.Namespace) -> Request:
    """The request of ``predict``'s flags (``args``: the command's namespace, or the one
    :func:`psgdlab.predict` builds from its keywords); bad values are one-line ConfigErrors,
    raised before anything is simulated or written."""
    from psgdlab.core.errors import ConfigError
    from psgdlab.sim.workload import load_config, with_room_for

    if args.platform is not None:
        config = load_config(path=args.platform)
    else:
        config = load_config(preset=args.preset or DEFAULT_PRESET)
    if args.workload is not None:
        from psgdlab.sim.workload import with_workload

        config = with_workload(config, args.workload)
    algorithms = tuple(args.algorithm or config.defaults.algorithms)
    workers = tuple(args.workers or config.defaults.workers)
    # a calibrated machine's processes: more workers than it has run there as more processes (each
    # case gets its own room in predict_sweep; the largest says so, and bounds the flags below)
    calibrated = config
    config, room = with_room_for(config, max(max(workers), args.workers_per_host or args.workers_per_node or 1))
    if args.workers_per_node is not None and not (1 <= args.workers_per_node <= config.platform.devices_per_host):
        raise ConfigError(
            f"workers-per-node ({args.workers_per_node}) must be in [1, {config.platform.devices_per_host}]: "
            f"{config.platform.name} has {config.platform.devices_per_host} devices per host"
        )
    if args.workers_per_host is not None and not (1 <= args.workers_per_host <= config.platform.devices_per_host):
        raise ConfigError(
            f"workers-per-host ({args.workers_per_host}) must be in "
            f"[1, {config.platform.devices_per_host}]: {config.platform.name} has "
            f"{config.platform.devices_per_host} devices per host"
        )
    failures = _failure_request(args)
    convergence, target = resolve_convergence(config, args.convergence, args.target)
    _require_affordable(args, config, algorithms, workers)
    return Request(config, algorithms, workers, failures, convergence, target, calibrated, room)


def run(args: argparse.Namespace) -> int:

    from psgdlab.core.records.rundir import open_run_dir
    from psgdlab.sim.report import format_table, sweep_summary

    t_start = time.perf_counter()
    req = resolve(args)
    with open_run_dir(args.out, command="predict", force=args.force) as held:
        predictions = simulate(args, req)
        run_dir = write_into(held, args, req, predictions)
        held.commit()
    wall = time.perf_counter() - t_start
    if args.json:
        answer = sweep_summary(req.config, predictions).answer(run_dir=str(run_dir.path), wall_s=wall)
        print_json(answer)
    else:
        rows = [p.row for p in predictions]
        print(format_table(req.config, rows, run_dir=str(run_dir.path), wall_s=wall))
    if req.room is not None:  # under the table; beside --json's object, on stderr
        print(req.room, file=sys.stderr if args.json else sys.stdout)
    return 0


def simulate(args: argparse.Namespace, req: Request) -> list[Prediction]:
    """Simulate every (algorithm, workers) of ``req`` (:func:`psgdlab.sim.predict.predict_sweep`,
    ``args.jobs`` processes), with a progress bar by the commands' rule
    (:func:`psgdlab.commands.show_progress`)."""
    from psgdlab.sim.predict import predict_sweep

    bar = None
    n_configs = len(req.algorithms) * len(req.workers)
    if n_configs > 1 and show_progress(args):
        from tqdm import tqdm

        bar = tqdm(
            total=n_configs,
            desc="predict",
            unit="config",
            file=sys.stderr,
            delay=0.5,
            leave=False,
        )

    def progress(label: str) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"done {label}")

    try:
        return predict_sweep(
            req.calibrated,
            req.algorithms,
            req.workers,
            batch=args.batch,
            progress=progress,
            steps=args.steps,
            period=args.period,
            variant=args.variant,
            gpus_per_node=args.workers_per_node,
            stragglers=args.straggler,
            seed=args.seed,
            workers_per_host=args.workers_per_host,
            failures=req.failures,
            on_failure=args.on_failure,
            jobs=args.jobs,
            convergence=req.convergence,
            target=req.target,
        )
    finally:
        if bar is not None:
            bar.close()


def write_into(held: RunLock, args: argparse.Namespace, req: Request, predictions: list[Prediction]) -> RunDir:
    """Write the run directory ``held`` holds (:func:`psgdlab.sim.report.write_prediction`, and
    the figures unless ``args.no_figures``; not committed); the run directory."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from psgdlab.analysis.figures import write_prediction_figures
    from psgdlab.core.platform.machine import set_parent_death_signal
    from psgdlab.sim.predict import sweep_jobs
    from psgdlab.sim.report import write_prediction

    convergence, target = req.convergence, req.target
    request = {
        "algorithms": list(req.algorithms),
        "workers": list(req.workers),
        "gpus_per_node": args.workers_per_node,
        "workers_per_host": args.workers_per_host,
        "batch": args.batch,
        "period": args.period,
        "variant": args.variant,
        "steps": args.steps,
        "straggler": args.straggler,
        "seed": args.seed,
        "fail": list(args.fail or []),
        "failure_rate": args.failure_rate,
        "on_failure": args.on_failure,
        "checkpoint_every": args.checkpoint_every,
        "failure_draws": args.failure_draws,
        "target": str(target or convergence.own_target()) if convergence is not None else None,
        "convergence": args.convergence,
    }
    out = held.path
    rows = [p.row for p in predictions]
    title = f"{req.config.platform.name}: {req.config.workload.name}"
    if args.no_figures:
        return write_prediction(out, req.config, predictions, request)
    if sweep_jobs(args.jobs) > 1:  # the figures are drawn beside the writing
        with ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("fork"), initializer=set_parent_death_signal
        ) as pool:
            figures = pool.submit(write_prediction_figures, out, rows, title=title)
            run_dir = write_prediction(out, req.config, predictions, request)
            figures.result()
    else:
        run_dir = write_prediction(out, req.config, predictions, request)
        write_prediction_figures(run_dir.path, rows, title=title)
    return run_dir


def _require_affordable(
    args: argparse.Namespace, config: SimConfig, algorithms: tuple[str, ...], workers: tuple[int, ...]
) -> None:
    """Refuse, before anything is written, a ``--steps`` so large that the prediction would run
    for longer than :data:`CONFIRM_AFTER_S` without ``--yes``, or hold traces larger than this
    machine's available memory at all. The estimate: a timed simulation of
    :data:`ESTIMATE_PROBE_STEPS` steps of each algorithm at the largest worker count (its time
    per worker-step and its trace records per worker-step, times every configuration's
    worker-steps); requests under :data:`ESTIMATE_FROM_WORKER_STEPS` are not estimated."""
    from psgdlab.core.errors import ConfigError
    from psgdlab.core.platform.machine import available_memory_bytes
    from psgdlab.sim.predict import predict_one, sweep_jobs

    if args.steps is None or args.steps * (sum(workers) * len(algorithms) + 1) < ESTIMATE_FROM_WORKER_STEPS:
        return
    n = max(workers)
    seconds, records, fastest = 0.0, 0.0, float("inf")
    for name in algorithms:
        t0 = time.perf_counter()
        probe = predict_one(
            name,
            n,
            config,
            steps=ESTIMATE_PROBE_STEPS,
            period=args.period,
            variant=args.variant,
            gpus_per_node=args.workers_per_node,
            workers_per_host=args.workers_per_host,
            intervals=False,
            baseline_samples_per_s=1.0,
        )
        per_worker_step = (time.perf_counter() - t0) / (n * ESTIMATE_PROBE_STEPS)
        seconds += per_worker_step * args.steps * sum(workers)
        records = max(records, len(probe.result.trace) / (n * ESTIMATE_PROBE_STEPS))
        fastest = min(fastest, per_worker_step)
    seconds += fastest * args.steps  # the 1-worker baseline every speedup divides by
    need = records * n * args.steps * BYTES_PER_RECORD * min(sweep_jobs(args.jobs), len(algorithms) * len(workers))
    available = available_memory_bytes()
    if available is not None and need > available:
        raise ConfigError(
            f"steps ({args.steps}): the traces of {n} workers x {args.steps} steps would need about "
            f"{need / 1e9:.3g} GB ({records:.2g} records per worker-step, from a timed simulation of "
            f"{ESTIMATE_PROBE_STEPS} steps), more than the {available / 1e9:.3g} GB available: use fewer --steps"
        )
    if seconds > CONFIRM_AFTER_S and not args.yes:
        raise ConfigError(
            f"steps ({args.steps}): this prediction would simulate for about {_duration(seconds)} here (from a timed "
            f"simulation of {ESTIMATE_PROBE_STEPS} steps of {n} workers), past the {CONFIRM_AFTER_S / 60:.0f} minutes "
            "it runs without asking: add --yes to run it, or use fewer --steps"
        )


def _duration(seconds: float) -> str:
    """``3.2 days``, ``5.1 h``, ``12 min``."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.2g} {unit}"
    return f"{seconds:.2g} s"


def resolve_convergence(
    config: SimConfig, source: str | None, target_text: str | None
) -> tuple[ConvergenceProfile | None, Target | None]:
    """The convergence profile of a prediction and its target: from ``--convergence`` (run
    directories) or the workload's shipped profile, and ``--target`` parsed; ``(None, None)``
    for a workload without a profile and no target. A target without a profile, or of another
    metric than the profile's, is a one-line ConfigError."""
    from psgdlab.core.convergence import Target
    from psgdlab.core.convergence.fit import load_convergence
    from psgdlab.core.convergence.published import convergence_profile, profile_names
    from psgdlab.core.errors import ConfigError

    target = Target.parse(target_text) if target_text is not None else None
    name = config.workload.name
    profile: ConvergenceProfile | None
    if source is not None:
        profile = load_convergence(source, workload=name, target=target.value if target is not None else None)
    else:
        profile = convergence_profile(name)
    if profile is None:
        if target is not None:
            raise ConfigError(
                f"--target ({target}) needs a convergence model, and workload {name} has none (shipped for: "
                f"{', '.join(profile_names())}); give one with --convergence RUN_DIR (a reference run whose "
                "summary.json has noise_scale and heldout_curve) or --convergence RUN_DIR,RUN_DIR,... "
                "(psgdlab emulate run directories)"
            )
        return None, None
    if target is not None:
        profile.check_target(target)
    return profile, target


def _failure_request(args: argparse.Namespace) -> FailureRequest | None:
    """The failures the flags ask about, or ``None`` (bad values: one-line ConfigError)."""
    from psgdlab.core.errors import ConfigError
    from psgdlab.core.platform.failure import Failure
    from psgdlab.sim.failures import DEFAULT_DRAWS, FailureRequest

    given = bool(args.fail) or args.failure_rate is not None
    if not given:
        if args.failure_draws is not None:
            raise ConfigError(f"--failure-draws ({args.failure_draws}) needs --fail or --failure-rate")
        return None
    if args.failure_draws is not None and args.failure_rate is None:
        raise ConfigError(f"--failure-draws ({args.failure_draws}) needs --failure-rate")
    return FailureRequest(
        failures=tuple(Failure.parse(text) for text in args.fail or ()),
        rate_per_worker_hour=args.failure_rate,
        policy=args.on_failure,
        checkpoint_every=args.checkpoint_every,
        draws=args.failure_draws if args.failure_draws is not None else DEFAULT_DRAWS,
    )
