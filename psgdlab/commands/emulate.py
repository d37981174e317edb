"""``psgdlab emulate``: predict convergence (loss against simulated time) for many virtual workers.

The simulator times every worker's steps on the platform model; the emulator replays that trace
with real replicas of a small model, so staleness (stragglers included) comes from the platform.
Writes a run directory: ``config.resolved.json``, ``env.json``, ``trace.npz`` (the emulator's
trace), ``curves.npz`` (loss, accuracy, consensus distance against simulated time and epochs),
``timeline.json``, the plots ``loss.png`` and ``consensus.png``, ``summary.json`` and, last, the
commit marker ``complete.json``. A directory that holds another run is refused (``--force``
replaces it).
"""

from __future__ import annotations

import argparse
import sys

from psgdlab.commands import plain_text, print_json
from psgdlab.core.flags import add_flags
from psgdlab.emulate import SYNTHETIC
from psgdlab.models.recipes import DEFAULT_MODEL, MODEL_RECIPES
from psgdlab.sim.workload import DEFAULT_PRESET

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "emulate",
        help="predict convergence: real replicas replayed at simulated event times",
        description=plain_text(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group()
    add_flags(
        where,
        "--preset",
        "--platform",
        dests={"--platform": "platform_file"},
        helps={"--preset": f"default {DEFAULT_PRESET}"},
    )
    add_flags(
        p,
        "--algorithm",
        "--variant",
        "--period",
        "--workers",
        "--workers-per-node",
        "--model",
        "--data",
        required={"--algorithm", "--workers"},
        defaults={"--model": DEFAULT_MODEL, "--data": SYNTHETIC},
        helps={
            "--workers": "virtual workers",
            "--workers-per-node": "default: the platform's devices per host, capped by the number of workers",
            "--model": ", ".join(MODEL_RECIPES),
        },
    )
    length = p.add_mutually_exclusive_group()
    add_flags(length, "--epochs", "--steps", helps={"--steps": "default 100"})
    recipe = "default: the model's recipe (psgdlab train --help)"
    add_flags(
        p,
        "--batch",
        "--lr",
        "--lr-schedule",
        helps={"--batch": f"{recipe}'s total batch / workers", "--lr": recipe, "--lr-schedule": recipe},
    )
    add_flags(p, "--lr-final", "--lsq-dim", "--lsq-samples")
    add_flags(
        p,
        "--straggler",
        "--seed",
        "--out",
        "--force",
        "--json",
        "--no-figures",
        defaults={"--straggler": ""},
        helps={"--no-figures": "no loss.png, consensus.png"},
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from psgdlab.commands import require_torch

    require_torch("emulate")  # the replicas are torch models
    from psgdlab.core.records.rundir import open_run_dir
    from psgdlab.emulate import EmulateConfig, emulate, resolve_inputs, write_run
    from psgdlab.models.recipes import recipe_of

    steps = args.steps if (args.steps is not None or args.epochs is not None) else 100
    batch, lr, lr_schedule = recipe_of(args.model).resolve(
        workers=args.workers, batch=args.batch, lr=args.lr, lr_schedule=args.lr_schedule, lsq_dim=args.lsq_dim
    )
    cfg = EmulateConfig(
        algorithm=args.algorithm,
        variant=args.variant,
        period=args.period,
        workers=args.workers,
        gpus_per_node=args.workers_per_node,
        preset=args.preset,
        platform_file=args.platform_file,
        model=args.model,
        data=args.data,
        epochs=args.epochs,
        steps=steps,
        batch=batch,
        lr=lr,
        lr_schedule=lr_schedule,
        lr_final=args.lr_final,
        lsq_dim=args.lsq_dim,
        lsq_samples_per_worker=args.lsq_samples,
        straggler=args.straggler,
        seed=args.seed,
    )
    inputs = resolve_inputs(cfg)  # bad input is said before the run directory is taken
    with open_run_dir(args.out, command="emulate", force=args.force) as held:
        result, resolved = emulate(cfg, inputs=inputs)
        summary = write_run(held.path, result, resolved, figures=not args.no_figures)
    if args.json:
        print_json(summary)
    else:
        print(
            f"emulated {cfg.workers} x {cfg.algorithm} for {summary['simulated_time_s']:.3g} s simulated "
            f"({summary['epochs']:.3g} epochs): loss {summary['final_loss']:.4g}, "
            f"consensus distance {summary['final_consensus_distance']:.3g}, "
            f"staleness mean {summary['staleness_mean']:.3g}; run directory {summary['run_dir']}",
            file=sys.stdout,
        )
    return 0
