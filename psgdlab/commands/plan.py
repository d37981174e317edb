"""``psgdlab plan``: search configurations for the Pareto front of time to target against GPU-hours.

Enumerates algorithms x workers x ring variant x period x per-GPU batch (x gossip group size for
H-ADPSGD) on a platform (:mod:`psgdlab.sim.plan`), predicts each candidate's time to a target with
``predict``'s rows, prints the Pareto front with 90 % intervals, the recommended configuration and
why, and writes a run directory (``summary.json``, ``plan.png``).

Parallelism: ``--jobs`` forked processes on this machine, or, run as
``mpiexec -n N python -m mpi4py.futures -m psgdlab plan ...``, the N - 1 worker ranks of an
mpi4py.futures pool (the ranks may span a cluster). Each candidate is seeded by itself, so the
answer is the same whatever the parallelism.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from psgdlab.commands import print_json
from psgdlab.core.convergence import OBJECTIVES
from psgdlab.core.flags import DefaultsHelpFormatter, add_flags, int_list, name_list
from psgdlab.sim.workload import DEFAULT_PRESET

if TYPE_CHECKING:
    from psgdlab.core.convergence import ConvergenceProfile, Target
    from psgdlab.core.records.rows import PlanRow
    from psgdlab.core.records.summaries import NotReaching, PlanAnswer
    from psgdlab.sim.plan import Candidate
    from psgdlab.sim.workload import SimConfig

#: candidates per task sent to a process or an MPI rank (fewer messages; chunks of like cost)
CHUNK = 6


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="search algorithms, workers, batches and periods for the fastest or cheapest way to a target",
        description=(
            "Search algorithms x workers x ring variant x period x per-GPU batch (and GPUs per super-learner "
            "for H-ADPSGD) for the Pareto front of time to a target against GPU-hours, with 90 %% intervals; "
            "recommend one and say why. Configurations whose intervals overlap are ties, not ranked."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    add_flags(src, "--preset", "--platform", helps={"--preset": f"default {DEFAULT_PRESET}"})
    p.add_argument("--workload", metavar="NAME|FILE.toml", default=None, help="as predict's --workload")
    add_flags(p, "--target", "--convergence", "--seed", "--out", "--force", "--json", "--jobs")
    p.add_argument("--max-gpus", type=int, default=None, metavar="G", help="at most G GPUs (default: the platform's)")
    p.add_argument("--deadline", type=float, default=None, metavar="HOURS", help="time to target at most HOURS")
    p.add_argument("--budget-gpu-hours", type=float, default=None, metavar="H", help="GPU-hours to target at most H")
    p.add_argument(
        "--objective",
        choices=tuple(OBJECTIVES),
        default="time",
        help="what the recommendation minimises, by its predicted value (the configurations tied with it "
        "are listed beside it)",
    )
    p.add_argument(
        "--algorithm",
        type=name_list,
        default=None,
        metavar="A,B",
        help="search only these algorithms (default: those the convergence profile covers)",
    )
    p.add_argument("--batches", type=int_list, default=None, metavar="B,B", help="per-GPU batches (default 32..256)")
    p.add_argument("--periods", type=int_list, default=None, metavar="P,P", help="periods (default 5,20,80)")
    p.add_argument("--steps", type=int, default=None, metavar="S", help="simulated steps per worker (default 40)")
    add_flags(p, "--no-figures", helps={"--no-figures": "no plan.png"})
    p.set_defaults(func=run)


def prepare(args: argparse.Namespace) -> tuple[SimConfig, ConvergenceProfile, Target, list[Candidate], int]:
    """The search ``plan``'s flags ask for (``args``: the command's namespace, or the one
    :func:`psgdlab.plan` builds from its keywords): the platform, the convergence model, the
    target, the candidates and the simulated steps; bad values are one-line ConfigErrors."""
    from psgdlab.commands.predict import resolve_convergence
    from psgdlab.core.errors import ConfigError
    from psgdlab.sim.plan import DEFAULT_BATCHES, DEFAULT_PERIODS, PLAN_STEPS, candidates
    from psgdlab.sim.workload import load_config, with_workload

    config = load_config(path=args.platform) if args.platform else load_config(preset=args.preset or DEFAULT_PRESET)
    if args.workload is not None:
        config = with_workload(config, args.workload)
    profile, target = resolve_convergence(config, args.convergence, args.target)
    if profile is None:
        raise ConfigError(
            f"plan needs a convergence model, and workload {config.workload.name} has none: give --convergence "
            "RUN_DIR (a reference run) or RUN_DIR,RUN_DIR,... (psgdlab emulate run directories)"
        )
    target = target or profile.own_target()
    for name, v in (("deadline", args.deadline), ("budget-gpu-hours", args.budget_gpu_hours)):
        if v is not None and not v > 0:
            raise ConfigError(f"--{name} ({v}) must be > 0")
    cands = candidates(
        config,
        profile,
        max_gpus=args.max_gpus,
        batches=args.batches or DEFAULT_BATCHES,
        periods=args.periods or DEFAULT_PERIODS,
        algorithms=args.algorithm,
    )
    steps = args.steps if args.steps is not None else PLAN_STEPS
    return config, profile, target, list(cands), steps


def run(args: argparse.Namespace) -> int:

    from psgdlab.core.records.results import document
    from psgdlab.core.records.rundir import open_run_dir

    t0 = time.perf_counter()
    config, profile, target, cands, steps = prepare(args)
    with open_run_dir(args.out, command="plan", force=args.force) as held:
        answer = plan_into(held, args, config, profile, target, cands, steps, t0)
    if args.json:
        print_json(document(answer.to_json()))
    else:
        print(format_plan(answer))
    return 0


def plan_into(
    held: Any, args: argparse.Namespace, config: Any, profile: Any, target: Any, cands: Any, steps: int, t0: float
) -> PlanAnswer:
    """Search ``cands`` and choose; write and commit the run directory ``held`` holds (``None``:
    write nothing, the answer's ``run_dir`` is ``None``); the plan."""
    from dataclasses import replace

    from psgdlab.core.records.rundir import RunDir, environment, write_summary
    from psgdlab.core.records.summaries import PlanAnswer, PlanBrief, PlanSummary
    from psgdlab.sim.plan import choose

    rows, how = search(cands, config, profile, target, steps=steps, seed=args.seed, jobs=args.jobs)
    choice = choose(
        rows,
        profile.covariance(),
        objective=args.objective,
        deadline_s=args.deadline * 3600 if args.deadline is not None else None,
        budget_gpu_hours=args.budget_gpu_hours,
    )
    wall = time.perf_counter() - t0
    answer = PlanAnswer(
        candidates=len(cands),
        pareto=tuple(choice.pareto),
        recommended=choice.recommended,
        ties=tuple(choice.ties),
        why=choice.why,
        target=str(target),
        objective=args.objective,
        simulated=sum(1 for r in rows if r.simulated),
        reaching=sum(1 for r in rows if r.reaches_target),
        within_limits=choice.feasible,
        not_reaching=not_reaching(rows),
        parallelism=how,
        steps=steps,
        platform=config.platform.name,
        workload=config.workload.name,
        wall_s=wall,
    )
    if held is None:
        return answer
    rd = RunDir(held.path)
    rd.write_json("config.resolved.json", {"request": {k: v for k, v in vars(args).items() if k != "func"}})
    rd.write_json("env.json", environment(source="simulator"))
    if not args.no_figures:
        from psgdlab.analysis.figures import plan_figure, save_figure

        title = f"{config.platform.name}: {config.workload.name} to {target}"
        save_figure(
            plan_figure([r for r in rows if r.reaches_target], choice.pareto, choice.recommended, title=title),
            rd / "plan.png",
        )
    write_summary(rd, PlanSummary(answer=answer, rows=tuple(PlanBrief.of(r) for r in rows)))
    held.commit()
    return replace(answer, run_dir=str(rd.path))


def not_reaching(rows: Sequence[PlanRow]) -> dict[str, NotReaching]:
    """The rows that do not reach the target by short reason (prefixed with the algorithm where
    the row was simulated): how many, and the long reason of the first."""
    from psgdlab.core.records.summaries import NotReaching

    counts: dict[str, int] = {}
    examples: dict[str, str | None] = {}
    for r in rows:
        if r.reaches_target:
            continue
        if r.prediction is not None:
            t = r.to_target
            key = f"{r.prediction.ran_as}: {t.target_short_reason or t.target_reason}"
            reason = t.target_reason
        else:
            key, reason = str(r.target_short_reason or r.target_reason), r.target_reason
        counts[key] = counts.get(key, 0) + 1
        examples.setdefault(key, reason)
    return {k: NotReaching(count=n, example=examples[k]) for k, n in counts.items()}


def search(
    cands: Sequence[Candidate],
    config: SimConfig,
    profile: ConvergenceProfile,
    target: Target,
    *,
    steps: int,
    seed: int,
    jobs: int | None,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[PlanRow], str]:
    """The rows of every candidate, in candidate order, and how they were computed. Chunks of
    :data:`CHUNK` candidates of like cost (most workers first) go to the pool; under
    ``python -m mpi4py.futures`` the pool is the MPI ranks."""
    from psgdlab.sim.plan import evaluate
    from psgdlab.sim.predict import sweep_jobs

    order = sorted(range(len(cands)), key=lambda i: (-cands[i].workers, i))
    chunks = [[(i, cands[i]) for i in order[k : k + CHUNK]] for k in range(0, len(order), CHUNK)]
    done: dict[int, PlanRow] = {}
    pool, how = _pool(sweep_jobs(jobs))
    if pool is None:
        for ch in chunks:
            done.update(evaluate(ch, config, profile, target, steps=steps, seed=seed))
    else:
        with pool:
            futures = [pool.submit(evaluate, ch, config, profile, target, steps=steps, seed=seed) for ch in chunks]
            for f in futures:
                done.update(f.result())
    return [done[i] for i in range(len(cands))], how


def _pool(jobs: int) -> tuple[Any, str]:
    """An executor and its description: the MPI ranks when this process runs under
    ``python -m mpi4py.futures`` with more than one rank, else ``jobs`` forked processes (none
    for one job)."""
    if "mpi4py.futures" in sys.modules:
        from mpi4py import MPI
        from mpi4py.futures import MPIPoolExecutor

        size = MPI.COMM_WORLD.Get_size()
        if size > 1:
            return MPIPoolExecutor(), f"mpi4py.futures, {size - 1} worker rank(s)"
    if jobs <= 1:
        return None, "1 process"
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from psgdlab.core.platform.machine import set_parent_death_signal

    pool = ProcessPoolExecutor(  # the workers die with this process, even killed with SIGKILL
        max_workers=jobs, mp_context=multiprocessing.get_context("fork"), initializer=set_parent_death_signal
    )
    return pool, f"{jobs} processes"


def _hms(seconds: float | None) -> str:
    from psgdlab.sim.report import _hms as hms

    return hms(float("nan") if seconds is None else seconds)


def format_plan(answer: PlanAnswer) -> str:
    """The plan as text: what was searched, why candidates fall out, the Pareto front with
    intervals, the recommendation and its ties."""
    a = answer
    lines = [
        f"plan: {a.platform}: {a.workload} to {a.target}; {a.candidates} candidates "
        f"({a.simulated} simulated over {a.steps} steps per worker; {a.reaching} reach the target, "
        f"{a.within_limits} within the limits); {a.parallelism}; {a.wall_s:.1f} s"
    ]
    for short, v in sorted(a.not_reaching.items(), key=lambda kv: (-kv[1].count, kv[0])):
        lines.append(f"  {v.count:5d} do not reach it ({short}), e.g. {v.example}")
    lines.append("Pareto front (time to target against GPU-hours; [90 %] intervals):")
    lines.append(f"  {'configuration':<36} {'time to target':>26} {'GPU-hours':>22}")
    rec = a.recommended
    for r in a.pareto:
        t = r.to_target
        time_text = f"{_hms(t.time_to_target_s)} [{_hms(t.time_to_target_s_low)}, {_hms(t.time_to_target_s_high)}]"
        g = f"{t.gpu_hours_to_target:.0f} [{t.gpu_hours_to_target_low:.0f}, {t.gpu_hours_to_target_high:.0f}]"
        mark = " *" if rec is not None and r.config == rec.config else ""
        lines.append(f"  {r.config:<36} {time_text:>26} {g:>22}{mark}")
    if rec is None:
        lines.append(a.why)
    else:
        lines.append(
            f"recommended (*): {rec.config}: {_hms(rec.to_target.time_to_target_s)}, "
            f"{rec.to_target.gpu_hours_to_target:.0f} GPU-hours; {a.why}"
        )
        if a.ties:
            names = ", ".join(r.config for r in a.ties[:8])
            more = f" and {len(a.ties) - 8} more" if len(a.ties) > 8 else ""
            lines.append(f"tied with it ({len(a.ties)}): {names}{more}")
    lines.append(f"run directory: {a.run_dir}")
    return "\n".join(lines)
