"""``psgdlab train``: real data-parallel training with any algorithm on gloo, NCCL or MPI.

Starts the N local processes itself (gloo/nccl: spawned processes on 127.0.0.1 with a free
port; mpi: the ``mpiexec`` beside the Python interpreter; ``--hosts H``: inside H emulated hosts,
network namespaces with links shaped to ``--nic-bandwidth``, see :mod:`psgdlab.runtime.launcher.netns`),
watches them, and prints the summary (``--json``: the summary object). For torchrun, mpiexec
and srun use the per-rank entry ``python -m psgdlab.runtime`` with the same flags.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from psgdlab.commands import plain_text, print_json
from psgdlab.core.flags import add_flags
from psgdlab.runtime.config import TrainConfig
from psgdlab.runtime.transports.backends import BACKENDS

__all__ = ["register", "run"]


def _draw_loss(config: Any, summary: dict[str, Any]) -> None:
    """``loss.png`` of the run directory, from the summary the run wrote."""
    from pathlib import Path

    from psgdlab.analysis.figures import save_figure, training_loss_figure

    n = config.workers
    title = f"{config.algorithm}, {n} worker{'s' if n != 1 else ''}, {config.backend}"
    fig = training_loss_figure(summary["loss_curve"], summary.get("held_out", []), title=title)
    save_figure(fig, Path(config.out) / "loss.png")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train",
        help=f"real distributed training ({', '.join(BACKENDS)})",
        description=plain_text(__doc__ or "").split("\n\n")[0],
    )
    TrainConfig.add_arguments(parser, launcher=True)
    add_flags(
        parser,
        "--json",
        "--no-figures",
        "--no-progress",
        helps={"--no-figures": "no loss.png", "--no-progress": "the bar of rank 0"},
    )
    parser.set_defaults(func=run)


@contextlib.contextmanager
def _progress_env(args: argparse.Namespace) -> Iterator[None]:
    """The ranks' progress rule (psgdlab.runtime.train): with --no-progress, PSGDLAB_PROGRESS=0 in
    the environment they inherit, while the run lasts."""
    if not args.no_progress:
        yield
        return
    old = os.environ.get("PSGDLAB_PROGRESS")
    os.environ["PSGDLAB_PROGRESS"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PSGDLAB_PROGRESS", None)
        else:
            os.environ["PSGDLAB_PROGRESS"] = old


def run(args: argparse.Namespace) -> int:

    from psgdlab.commands import require_torch
    from psgdlab.core.records.rundir import open_run_dir
    from psgdlab.runtime.launcher.launch import check_limits, launch

    require_torch("train")  # the ranks import it; said once, here

    config = TrainConfig.from_args(args)
    check_limits(config)  # before the run directory is taken: too many ranks, too little memory
    fresh = args.out is None and not args.resume  # a new runs/train-TIMESTAMP, made exclusively
    # held for the run's life: the launcher writes launch.json, its ranks everything else; rank 0
    # commits the run, and the commit is written again once loss.png is drawn
    with (
        open_run_dir(None if fresh else config.out, command="train", force=args.force, resume=config.resume) as held,
        _progress_env(args),
    ):
        config = config.replace(out=str(held.path))
        summary = launch(config)
        if not args.no_figures:
            _draw_loss(config, summary)
        held.commit()
    if args.json:
        print_json(summary)
        return 0
    keys = (
        "workers",
        "steps",
        "samples_per_s",
        "step_time_s",
        "comm_fraction",
        "idle_fraction",
        "staleness_mean",
        "loss_first",
        "loss_last",
    )
    print(f"run directory: {config.out}")
    for key in keys:
        value = summary.get(key)
        print(f"  {key:16s} {value:.6g}" if isinstance(value, float) else f"  {key:16s} {value}")
    if "held_out_last" in summary:
        print(f"  held_out         {_held_out_line(summary['held_out_last'])}")
    return 0


def _held_out_line(last: dict[str, Any]) -> str:
    """``WER 17.6 % (george 23.0 %, theo 12.2 %), frame accuracy 0.586, loss 1.69 at step 640``."""
    parts = []
    if "wer" in last:
        speakers = ", ".join(f"{s} {w * 100:.1f} %" for s, w in sorted(last.get("wer_by_speaker", {}).items()))
        parts.append(f"WER {last['wer'] * 100:.1f} %" + (f" ({speakers})" if speakers else ""))
    parts += [f"{k.replace('_', ' ')} {last[k]:.3g}" for k in ("frame_accuracy", "loss") if k in last]
    return ", ".join(parts) + (f" at step {last['step']}" if "step" in last else "")
