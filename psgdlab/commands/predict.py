"""``psgdlab predict``: predict step time, speedup, time to train, staleness and straggler cost.

Runs the discrete-event simulator (:mod:`psgdlab.sim`) for every (algorithm, workers) pair on a
preset or a platform file, prints a table (or one JSON object with ``--json``) and writes a run
directory with the summary, traces, timelines and plots.
"""

from __future__ import annotations

import argparse
import sys
import time

DEFAULT_PRESET = "interspeech2019-v100"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not out:
        raise argparse.ArgumentTypeError("needs at least one integer")
    return out


def _name_list(text: str) -> tuple[str, ...]:
    out = tuple(x.strip() for x in text.split(",") if x.strip())
    if not out:
        raise argparse.ArgumentTypeError("needs at least one name")
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "predict",
        help="simulate algorithms on a described cluster: step time, speedup, time to train, staleness",
        description=(
            "Predict, with a discrete-event simulator, how fast each parallel-SGD algorithm trains a "
            "workload on a cluster: step time, samples/s, speedup over one-worker SGD, epoch time and "
            "time to train (extrapolated from a simulated window), communication and idle fractions and "
            "the staleness of updates. With no arguments: preset interspeech2019-v100, algorithms "
            "ssgd,adpsgd,hadpsgd, workers 1,2,4,8,16,32,64."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", metavar="NAME", default=None,
                     help=f"shipped platform+workload preset (interspeech2019-v100, librispeech-gtx1080); "
                          f"default {DEFAULT_PRESET}")
    src.add_argument("--platform", metavar="FILE.toml", default=None,
                     help="platform+workload TOML file in the preset format (copy a preset from sim/presets/)")
    p.add_argument("--algorithm", metavar="A[,B...]", type=_name_list, default=None,
                   help="algorithms from the core registry (sgd, ssgd, asgd, bsp, bmuf, easgd, dpsgd, adpsgd, "
                        "hadpsgd); default: the file's [defaults] or ssgd,adpsgd,hadpsgd")
    p.add_argument("--workers", metavar="N[,M...]", type=_int_list, default=None,
                   help="worker (GPU) counts; default: the file's [defaults] or 1,2,4,8,16,32,64")
    p.add_argument("--gpus-per-node", metavar="M", type=int, default=None,
                   help="workers placed on each host (and H-ADPSGD's super-learner size); default: the "
                        "platform's devices per host, capped by the number of workers")
    p.add_argument("--workers-per-host", metavar="K", type=int, default=None,
                   help="place K workers on each host whatever the super-learner size (e.g. H-ADPSGD nodes of "
                        "--gpus-per-node 2 as groups of one machine's processes on a calibrated this-machine "
                        "platform); default: --gpus-per-node")
    p.add_argument("--batch", metavar="B", type=int, default=None,
                   help="minibatch per worker, in the preset's sample unit (21-frame samples for the BLSTM, "
                        "frames for the LibriSpeech DNN); compute time scales with it")
    p.add_argument("--period", metavar="T", type=int, default=None,
                   help="sync period in local steps of asgd, bsp, bmuf and easgd")
    p.add_argument("--variant", metavar="V", default=None,
                   help="algorithm variant: adpsgd fixed|random|delay, hadpsgd fixed|random, bmuf "
                        "classical|nesterov, easgd async|sync")
    p.add_argument("--steps", metavar="S", type=int, default=None,
                   help="simulated window in local steps per worker (default: 200, or 10 sync periods, "
                        "extended until steady)")
    p.add_argument("--straggler", metavar="SPEC", default=None,
                   help="slow workers, the same spec as `psgdlab train`: RANK:FACTOR (rank computes FACTOR "
                        "times slower), random:PROB:FACTOR, periodic:RANK:EVERY:PAUSE_S (seconds); "
                        "comma-separated")
    p.add_argument("--seed", metavar="K", type=int, default=0, help="seed of compute-time draws and stragglers")
    p.add_argument("--out", metavar="DIR", default=None, help="run directory (default runs/predict-TIMESTAMP)")
    p.add_argument("--json", action="store_true", help="print one JSON object with a list `rows` instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from psgdlab.analysis.figures import write_prediction_figures
    from psgdlab.core.errors import ConfigError
    from psgdlab.core.rundir import default_run_dir
    from psgdlab.sim.predict import predict_sweep
    from psgdlab.sim.report import format_table, write_prediction
    from psgdlab.sim.workload import load_config

    t_start = time.perf_counter()
    if args.platform is not None:
        config = load_config(path=args.platform)
    else:
        config = load_config(preset=args.preset or DEFAULT_PRESET)
    algorithms = args.algorithm or config.defaults.algorithms
    workers = args.workers or config.defaults.workers
    if args.gpus_per_node is not None and not (1 <= args.gpus_per_node <= config.platform.devices_per_host):
        raise ConfigError(f"gpus-per-node ({args.gpus_per_node}) must be in [1, {config.platform.devices_per_host}]: "
                          f"{config.platform.name} has {config.platform.devices_per_host} devices per host")
    if args.workers_per_host is not None and not (1 <= args.workers_per_host <= config.platform.devices_per_host):
        raise ConfigError(f"workers-per-host ({args.workers_per_host}) must be in "
                          f"[1, {config.platform.devices_per_host}]: {config.platform.name} has "
                          f"{config.platform.devices_per_host} devices per host")
    request = {"algorithms": list(algorithms), "workers": list(workers), "gpus_per_node": args.gpus_per_node,
               "workers_per_host": args.workers_per_host,
               "batch": args.batch, "period": args.period, "variant": args.variant, "steps": args.steps,
               "straggler": args.straggler, "seed": args.seed}

    bar = None
    n_configs = len(algorithms) * len(workers)
    if n_configs > 1:
        from tqdm import tqdm

        bar = tqdm(total=n_configs, desc="predict", unit="config", file=sys.stderr, delay=0.5, leave=False)

    def progress(label: str) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"done {label}")

    try:
        predictions = predict_sweep(config, tuple(algorithms), tuple(workers), batch=args.batch, progress=progress,
                                    steps=args.steps, period=args.period, variant=args.variant,
                                    gpus_per_node=args.gpus_per_node, stragglers=args.straggler, seed=args.seed,
                                    workers_per_host=args.workers_per_host)
    finally:
        if bar is not None:
            bar.close()
    out = args.out or default_run_dir("predict")
    run_dir = write_prediction(out, config, predictions, request)
    rows = [p.row for p in predictions]
    write_prediction_figures(run_dir.path, rows, title=f"{config.platform.name}: {config.workload.name}")
    wall = time.perf_counter() - t_start
    if args.json:
        print(json.dumps({"run_dir": str(run_dir.path), "platform": config.platform.name,
                          "workload": config.workload.name, "wall_s": wall, "rows": rows},
                         default=float))
    else:
        print(format_table(config, rows, run_dir=str(run_dir.path), wall_s=wall))
    return 0
