"""Per-rank entry: ``python -m psgdlab.runtime [train flags | --config RUN/launch.json]``.

Ranks come from the launcher's environment (torchrun: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
mpiexec: ``PMI_RANK``/``PMI_SIZE`` or ``OMPI_COMM_WORLD_*``; srun: ``SLURM_PROCID``/
``SLURM_NTASKS``/``SLURM_LOCALID``). The world size must be ``--workers`` (plus one for the
parameter server of asgd and asynchronous easgd, which runs on the last rank)::

    torchrun --nproc-per-node 4 -m psgdlab.runtime --algorithm adpsgd --workers 4 --backend gloo \\
        --steps 500 --out runs/a
    mpiexec -n 4 python -m psgdlab.runtime --algorithm bmuf --workers 4 --backend mpi --period 5 \\
        --steps 500 --out runs/b
    srun -N 2 --ntasks-per-node 8 --gpus-per-node 8 python -m psgdlab.runtime --algorithm hadpsgd --workers 16 \\
        --workers-per-node 8 --backend nccl --model blstm --data swb.h5 --epochs 16 --out runs/c

Under srun the rendezvous of gloo and NCCL (``MASTER_ADDR``/``MASTER_PORT``, where not exported)
is the step's first node and a port derived from the job
(:func:`psgdlab.runtime.transports.env.slurm_rendezvous`); ``examples/slurm/`` has sbatch
scripts. ``psgdlab train`` starts the local processes itself.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# before torch allocates: torch's default allocator, no huge pages (see runtime.launcher.ranks.RANK_ENV)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "0")


def main(argv: list[str] | None = None) -> int:
    from psgdlab.runtime.launcher.lifeline import die_with_launcher

    die_with_launcher()  # first: a rank never outlives the psgdlab launcher that started it
    from psgdlab.runtime.config import TrainConfig

    parser = argparse.ArgumentParser(prog="python -m psgdlab.runtime", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="a launch.json written by psgdlab train (replaces the other flags)")
    TrainConfig.add_arguments(parser)
    args = parser.parse_args(argv)
    ranks_dir = os.environ.get("PSGDLAB_RANKS_DIR")
    from psgdlab.core.errors import TestbedError
    from psgdlab.runtime.transports.env import launch_env

    env = launch_env()
    held = None
    try:
        if ranks_dir:
            from psgdlab.core.records.trace import atomic_write_text

            atomic_write_text(Path(ranks_dir, f"rank{env.rank}.pid"), str(os.getpid()))
        config = TrainConfig.load(args.config) if args.config else TrainConfig.from_args(args)
        if not ranks_dir and env.rank == 0 and config.out:
            # started by torchrun, mpiexec or srun: no psgdlab launcher holds the run directory, rank 0
            # does (the other ranks write nothing before the rendezvous, where they wait for it)
            from psgdlab.core.records.rundir import open_run_dir

            held = open_run_dir(config.out, command="train", force=args.force, resume=config.resume)
        from psgdlab.runtime.train import train

        summary = train(config, env=env)
        if summary is not None and not args.config:
            import json

            print(
                json.dumps(
                    {
                        k: summary[k]
                        for k in ("samples_per_s", "step_time_s", "staleness_mean", "loss_first", "loss_last")
                        if k in summary
                    }
                )
            )
    except KeyboardInterrupt:  # SIGINT before the loop's own handler (set-up) or after it (the end)
        print(f"psgdlab: rank {env.rank}: interrupted outside the training loop", file=sys.stderr)
        return 130
    except (TestbedError, ValueError, OSError, RuntimeError) as exc:  # OSError: a full disk, say
        status = 2 if isinstance(exc, (ValueError, FileNotFoundError)) else 1
        message = " ".join(str(exc).split())
        print(
            f"psgdlab: error: rank {env.rank}: {message}"
            if f"rank {env.rank}" not in message
            else f"psgdlab: error: {message}",
            file=sys.stderr,
        )
        return status
    finally:
        if held is not None:
            held.release()
    if ranks_dir:
        from psgdlab.core.records.trace import atomic_write_text

        atomic_write_text(Path(ranks_dir, f"rank{env.rank}.done"), "ok")
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # leave without the interpreter's teardown, also after a run that succeeded (its files are
    # written and renamed, its process group destroyed): a failed run must not wait for daemon
    # threads, and in a finished one gloo's threads can abort the teardown ("terminate called
    # without an active exception", pytorch/pytorch#179291), which the launcher would report
    # as a rank killed by SIGABRT. An MPI rank that succeeded leaves through the teardown, where
    # mpi4py finalizes MPI (mpiexec stops the job when a rank leaves without MPI_Finalize)
    if code == 0 and "mpi4py.MPI" in sys.modules:
        raise SystemExit(0)
    os._exit(code)
