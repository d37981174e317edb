"""Predicted throughput after one failure over (n-1)/n of before, per gossip algorithm and size.

For each gossip algorithm and worker count on a preset, kills rank ``--rank`` (default: the last
one of the first node, a passive AD-PSGD worker whose active neighbours must wait) one hour into
the run and prints, from ``psgdlab predict``'s ``failures`` keys: ``throughput_after_ratio``
(issue 18's target: >= 0.9), the survivors' stall in seconds, the dead worker's lost steps, the
time to train with the failure over the time without, and the CPU seconds the failure windows
took. ``--detection`` overrides the profile's ``failure_detection_s``.

    PYTHONPATH=$PWD python bench/bench_failures.py [--preset interspeech2019-v100] [--workers 8,16,32] [--detection 600]
"""

from __future__ import annotations

import argparse
import dataclasses
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="interspeech2019-v100")
    parser.add_argument("--algorithms", default="adpsgd,dpsgd,hadpsgd")
    parser.add_argument("--workers", default="8,16,32")
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--detection", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from psgdlab.core.platform.failure import Failure
    from psgdlab.sim.failures import FailureRequest
    from psgdlab.sim.predict import predict_one
    from psgdlab.sim.workload import load_config

    config = load_config(preset=args.preset)
    if args.detection is not None:
        config = dataclasses.replace(
            config, platform=dataclasses.replace(config.platform, failure_detection_s=args.detection)
        )
    print(f"{args.preset}, detection {config.platform.failure_detection_s:g} s, failure at 3600 s")
    print(
        f"{'algorithm':>9} {'workers':>7} {'rank':>4} {'after/((n-1)/n)':>15} {'stall s':>8} "
        f"{'lost':>4} {'train ratio':>11} {'window cpu s':>12}"
    )
    for name in args.algorithms.split(","):
        for n in (int(x) for x in args.workers.split(",")):
            plain = predict_one(name, n, config, seed=args.seed, intervals=False)
            per_host = plain.row["gpus_per_node"] or n
            rank = args.rank if args.rank is not None else min(n, per_host) - 2
            request = FailureRequest(failures=(Failure(rank, 3600.0),))
            t0 = time.process_time()
            row = predict_one(name, n, config, seed=args.seed, intervals=False, failures=request).row
            cpu = time.process_time() - t0
            f = row["failures"]
            (change,) = f["membership_changes"]
            print(
                f"{name:>9} {n:>7} {rank:>4} {f['throughput_after_ratio']:>15.3f} {change['stall_s']:>8.1f} "
                f"{f['steps_lost']:>4} {f['time_to_train_s'] / f['time_to_train_without_failures_s']:>11.3f} "
                f"{cpu:>12.1f}"
            )


if __name__ == "__main__":
    main()
