"""What prediction intervals cost the default sweep, and how their sensitivities depend on the window.

Runs the default sweep of ``psgdlab predict`` (interspeech2019-v100, 21 configurations) in one
process, interleaved ``--reps`` times: without intervals, with them (the preset has no
``[uncertainty]``: batch means only), and with a 3-parameter ``[uncertainty]`` (PCIe, NIC and host
memory bandwidth: 6 sensitivity re-simulations per configuration). Prints the least CPU seconds of
each (the least is what a loaded machine distorts least) and their ratios. With ``--windows`` it
also prints the parameter log-sd of a few configurations against the sensitivity window.

    PYTHONPATH=$PWD python bench/bench_intervals.py [--reps 5] [--windows]
"""

from __future__ import annotations

import argparse
import dataclasses
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--windows", action="store_true")
    args = parser.parse_args()

    from psgdlab.core.platform.profile import Uncertainty
    from psgdlab.sim import predict
    from psgdlab.sim.workload import load_config

    plain = load_config(preset="interspeech2019-v100")
    uncertain = dataclasses.replace(
        plain,
        uncertainty=Uncertainty(
            parameters=(
                "platform.pcie.bandwidth_bytes_per_s",
                "platform.nic.bandwidth_bytes_per_s",
                "platform.host_memory_bandwidth_bytes_per_s",
            ),
            log_sd=(0.1, 0.1, 0.2),
        ),
    )

    def sweep(config, intervals: bool) -> float:
        predict._BASELINES.clear()
        t = time.process_time()
        for name in config.defaults.algorithms:
            for n in config.defaults.workers:
                predict.predict_one(name, n, config, intervals=intervals)
        return time.process_time() - t

    cases = {"no intervals": (plain, False), "intervals": (plain, True), "intervals, 3 parameters": (uncertain, True)}
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(args.reps):
        for label, (config, intervals) in cases.items():
            best[label] = min(best[label], sweep(config, intervals))
    for label, cpu in best.items():
        print(f"{label:>24}: {cpu:6.2f} CPU s   x{cpu / best['no intervals']:.2f}")

    if args.windows:
        for name, n in (("ssgd", 8), ("ssgd", 64), ("hadpsgd", 16), ("adpsgd", 64)):
            cells = []
            for steps in (20, 30, 50, 200):
                predict.SENSITIVITY_STEPS = steps
                predict._BASELINES.clear()
                row = predict.predict_one(name, n, uncertain).row
                cells.append(f"{steps}: {row['interval']['log_sd']['step_time_parameters']:.4f}")
            print(f"{name} x {n}: parameter log-sd by sensitivity window  " + "  ".join(cells))


if __name__ == "__main__":
    main()
