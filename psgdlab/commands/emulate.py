"""``psgdlab emulate``: predict convergence (loss against simulated time) for many virtual workers.

The simulator times every worker's steps on the platform model; the emulator replays that trace
with real replicas of a small model, so staleness (stragglers included) comes from the platform.
Writes a run directory: ``config.resolved.json``, ``env.json``, ``trace.npz`` (the emulator's
trace), ``curves.npz`` (loss, accuracy, consensus distance against simulated time and epochs),
``summary.json``, ``timeline.json`` and the plots ``loss.png`` and ``consensus.png``.
"""

from __future__ import annotations

import argparse
import json
import sys

from psgdlab.core.schedules import LR_SCHEDULE_NAMES

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "emulate", help="predict convergence: real replicas replayed at simulated event times",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--preset", default=None, help="platform/workload preset (default interspeech2019-v100)")
    where.add_argument("--platform", dest="platform_file", default=None, metavar="FILE",
                       help="platform/workload TOML file (the presets' format)")
    p.add_argument("--algorithm", required=True, help="ssgd, adpsgd, hadpsgd, bsp, bmuf, easgd, asgd, dpsgd")
    p.add_argument("--variant", default=None, help="algorithm variant (adpsgd: fixed, random, delay; ...)")
    p.add_argument("--period", type=int, default=None, help="sync period tau (asgd, bsp, bmuf, easgd)")
    p.add_argument("--workers", type=int, required=True, help="virtual workers")
    p.add_argument("--gpus-per-node", type=int, default=None, help="workers per node (H-ADPSGD super-learner size)")
    p.add_argument("--model", default="tiny-blstm",
                   help="model preset (tiny-blstm, blstm-small, blstm, dnn, dnn-small, cldnn) or least-squares")
    p.add_argument("--data", default="synthetic", metavar="FILE",
                   help="'synthetic' (default, as psgdlab train) or a corpus file (psgdlab data layout)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=float, default=None, help="epochs of the training corpus")
    length.add_argument("--steps", type=int, default=None, help="local steps per worker (default 100)")
    p.add_argument("--batch", type=int, default=32, help="windows per worker per step (default 32)")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (ibm: base rate of a 256 batch)")
    p.add_argument("--lr-schedule", choices=LR_SCHEDULE_NAMES, default="const",
                   help="exp: decay from --lr to --lr-final; ibm: the IBM papers' schedule; newbob: halve on "
                        "held-out plateaus")
    p.add_argument("--lr-final", type=float, default=None, help="exp schedule: rate at the last step (default lr / 10)")
    p.add_argument("--lsq-dim", type=int, default=16, help="least-squares: parameters")
    p.add_argument("--straggler", default="", help="straggler spec (RANK:FACTOR, random:P:F, periodic:R:EVERY:S)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, metavar="DIR", help="run directory (default runs/emulate-<time>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from psgdlab.emulate import EmulateConfig, emulate, write_run

    steps = args.steps if (args.steps is not None or args.epochs is not None) else 100
    cfg = EmulateConfig(algorithm=args.algorithm, variant=args.variant, period=args.period, workers=args.workers,
                        gpus_per_node=args.gpus_per_node, preset=args.preset, platform_file=args.platform_file,
                        model=args.model, data=args.data, epochs=args.epochs, steps=steps, batch=args.batch,
                        lr=args.lr, lr_schedule=args.lr_schedule, lr_final=args.lr_final, lsq_dim=args.lsq_dim,
                        straggler=args.straggler, seed=args.seed)
    result, resolved = emulate(cfg)
    summary = write_run(args.out, result, resolved)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(f"emulated {cfg.workers} x {cfg.algorithm} for {summary['simulated_time_s']:.3g} s simulated "
              f"({summary['epochs']:.3g} epochs): loss {summary['final_loss']:.4g}, "
              f"consensus distance {summary['final_consensus_distance']:.3g}, "
              f"staleness mean {summary['staleness_mean']:.3g}; run directory {summary['run_dir']}",
              file=sys.stdout)
    return 0
