"""``psgdlab train``: real data-parallel training with any algorithm on gloo, NCCL or MPI.

Starts the N local processes itself (gloo/nccl: spawned processes on 127.0.0.1 with a free
port; mpi: the ``mpiexec`` beside the Python interpreter), watches them, and prints the summary
(``--json``: the summary object). For torchrun, mpiexec and srun use the per-rank entry
``python -m psgdlab.runtime`` with the same flags.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register", "run", "add_train_arguments", "config_from_args"]


def add_train_arguments(parser: argparse.ArgumentParser, *, per_rank: bool = False) -> None:
    """The training flags shared by ``psgdlab train`` and ``python -m psgdlab.runtime``."""
    p = parser
    p.add_argument("--algorithm", default="ssgd", help="ssgd, asgd, bsp, bmuf, easgd, dpsgd, adpsgd, hadpsgd, sgd")
    p.add_argument("--workers", type=int, default=2, help="number of workers (learners)")
    p.add_argument("--gpus-per-node", type=int, default=1, help="workers per node (H-ADPSGD super-learner size)")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl", "mpi"])
    p.add_argument("--model", default="tiny-blstm",
                   help="model preset (tiny-blstm, blstm-small, blstm, dnn, dnn-small, cldnn) or least-squares")
    p.add_argument("--data", default="synthetic", help="'synthetic' or an HDF5 corpus file")
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("--steps", type=int, help="local steps per worker")
    steps.add_argument("--epochs", type=float, help="epochs over the training data")
    p.add_argument("--batch", type=int, default=32, help="minibatch per worker")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (the IBM schedule's base rate)")
    p.add_argument("--lr-schedule", default="const", choices=["const", "ibm", "newbob", "exp"],
                   help="exp: decay exponentially from --lr to --lr-final over the run (Kaldi nnet3); ibm: the "
                        "IBM papers' schedule; newbob is refused here (it needs a held-out loss every epoch; "
                        "psgdlab emulate runs it)")
    p.add_argument("--lr-final", type=float, help="exp schedule: rate at the last step (default lr / 10)")
    p.add_argument("--period", type=int, help="sync period tau (asgd, bsp, bmuf, easgd)")
    p.add_argument("--variant", help="algorithm variant (adpsgd: fixed|random|delay; bmuf: classical|nesterov; "
                                     "easgd: async|sync; hadpsgd: fixed|random)")
    p.add_argument("--momentum", type=float, help="local momentum")
    p.add_argument("--compute-time", help="emulated compute per step: SECONDS or a distribution "
                                          "(normal:M:S, lognormal:M:CV, gamma:M:CV)")
    p.add_argument("--straggler", default="", help="RANK:FACTOR, random:PROB:FACTOR, periodic:RANK:EVERY:PAUSE_S")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="run directory (default runs/train-<time>)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its newest complete checkpoint")
    p.add_argument("--held-out-speakers", default="", help="comma-separated speakers scored each epoch, not trained on")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at the end only)")
    p.add_argument("--timeout", type=float, default=600.0, help="communication timeout in seconds")
    p.add_argument("--window", type=int, default=21, help="frames per input window")
    p.add_argument("--record-params", action="store_true", help="keep every step's model (small models)")
    p.add_argument("--lsq-dim", type=int, default=16, help="least-squares: parameters")
    if not per_rank:
        p.add_argument("--json", action="store_true", help="print the summary as JSON")


def config_from_args(args: argparse.Namespace) -> Any:
    from psgdlab.core.rundir import default_run_dir
    from psgdlab.runtime.config import TrainConfig

    if args.resume:
        import json
        from pathlib import Path

        path = Path(args.resume) / "config.resolved.json"
        if not path.is_file():
            from psgdlab.core.errors import ConfigError

            raise ConfigError(f"resume directory {args.resume} has no config.resolved.json")
        saved = TrainConfig.from_json(json.loads(path.read_text())["train"])
        changes: dict[str, Any] = {"resume": True, "out": str(args.resume)}
        if args.steps is not None:
            changes.update(steps=args.steps, epochs=None)
        elif args.epochs is not None:
            changes.update(epochs=args.epochs, steps=None)
        return saved.replace(**changes)
    held = tuple(s for s in (args.held_out_speakers or "").split(",") if s)
    steps, epochs = args.steps, args.epochs
    if steps is None and epochs is None:
        steps = 100
    return TrainConfig(
        algorithm=args.algorithm, workers=args.workers, gpus_per_node=args.gpus_per_node, backend=args.backend,
        model=args.model, data=args.data, steps=steps, epochs=epochs, batch=args.batch, lr=args.lr,
        lr_schedule=args.lr_schedule, lr_final=args.lr_final, period=args.period, variant=args.variant,
        momentum=args.momentum,
        compute_time=args.compute_time, straggler=args.straggler, seed=args.seed,
        out=str(args.out or default_run_dir("train")), held_out_speakers=held, window=args.window,
        checkpoint_every=args.checkpoint_every, timeout_s=args.timeout, record_params=args.record_params,
        lsq_dim=args.lsq_dim)


def _draw_loss(config: Any, summary: dict[str, Any]) -> None:
    """``loss.png`` of the run directory, from the summary the run wrote."""
    from pathlib import Path

    from psgdlab.analysis.figures import save_figure, training_loss_figure

    n = config.workers
    title = f"{config.algorithm}, {n} worker{'s' if n != 1 else ''}, {config.backend}"
    fig = training_loss_figure(summary["loss_curve"], summary.get("held_out", []), title=title)
    save_figure(fig, Path(config.out) / "loss.png")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("train", help="real distributed training (gloo, nccl, mpi)",
                                   description=__doc__.split("\n\n")[0])
    add_train_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from psgdlab.runtime.launch import launch

    config = config_from_args(args)
    summary = launch(config)
    _draw_loss(config, summary)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    keys = ("workers", "steps", "samples_per_s", "step_time_s", "comm_fraction", "idle_fraction",
            "staleness_mean", "loss_first", "loss_last")
    print(f"run directory: {config.out}")
    for key in keys:
        value = summary.get(key)
        print(f"  {key:16s} {value:.6g}" if isinstance(value, float) else f"  {key:16s} {value}")
    if "held_out_last" in summary:
        print(f"  held_out         {summary['held_out_last']}")
    return 0
