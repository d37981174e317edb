"""``psgdlab calibrate RUN_DIR... --out PLATFORM.toml``: fit this machine's platform profile."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the simulator's platform profile (compute time, link latency and bandwidth) from measured runs",
        description=(
            "Fit, from one or more runtime run directories (psgdlab train), the per-step compute-time "
            "distribution (mean, coefficient of variation, median, 95th percentile) and the latency and "
            "bandwidth of the link (from allreduce and pairwise exchanges of at least two payload sizes; "
            "a server's service overhead when server exchanges were measured; from runs with more "
            "workers than cores, the CPU work of communication per message and per byte), and write "
            "them as a "
            "platform+workload TOML the simulator reads (psgdlab predict --platform FILE.toml), with "
            "the fit's residuals as comments. Too little data is an error, not a guess."
        ),
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by psgdlab train")
    p.add_argument("--out", required=True, metavar="PLATFORM.toml", help="the TOML file to write (atomically)")
    p.add_argument("--name", default="calibrated", help="platform name in the file")
    p.add_argument(
        "--devices",
        type=int,
        default=None,
        help="devices (worker processes) of this machine's one host (default: the runs' largest worker count)",
    )
    p.add_argument(
        "--cores",
        type=int,
        default=None,
        help="CPU cores of the machine the runs ran on (default: the cpu_count in the runs' env.json); "
        "runs with more workers than cores fit the CPU work of communication ([platform.host_cpu])",
    )
    p.add_argument(
        "--n-params", type=int, default=None, help="workload parameters (default: the runs' largest payload / itemsize)"
    )
    p.add_argument("--warmup-steps", type=int, default=2, help="steps per worker left out of the compute fit")
    p.add_argument("--json", action="store_true", help="print the fit as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from psgdlab.analysis.calibrate import calibrate_runs, platform_profile
    from psgdlab.core.cost import allreduce_rounds
    from psgdlab.core.errors import require

    require(args.devices is None or args.devices >= 1, "devices", args.devices, "must be >= 1")
    require(args.n_params is None or args.n_params >= 1, "n-params", args.n_params, "must be >= 1")
    require(args.cores is None or args.cores >= 1, "cores", args.cores, "must be >= 1")
    fit = calibrate_runs(args.run_dirs, warmup_steps=args.warmup_steps, cores=args.cores)
    platform_profile(fit, name=args.name, devices=args.devices, n_params=args.n_params).write(args.out)
    if args.json:
        print(json.dumps({**fit, "out": args.out}, indent=2))
    else:
        c, lk = fit["compute"], fit["link"]
        print(f"compute: mean {c['mean_s']:.6g} s, cv {c['cv']:.3g}, p95 {c['p95_s']:.6g} s ({c['samples']} steps)")
        print(
            f"link: latency {lk['latency_s'] * 1e6:.1f} us, bandwidth {lk['bandwidth_bytes_per_s'] / 1e9:.3g} GB/s "
            f"({lk['samples']} exchanges, rms residual {lk['rms_residual_s'] * 1e3:.3g} ms)"
        )
        co = fit.get("collective")
        schedule = fit["allreduce_algorithm"]
        print(
            f"allreduce schedule: {schedule} (latency rounds over 2, 4, 8 ranks: "
            f"{', '.join(str(allreduce_rounds(n, schedule)) for n in (2, 4, 8))})"
        )
        print(
            f"allreduce (apart): latency {co['latency_s'] * 1e6:.1f} us per round, bandwidth "
            f"{co['bandwidth_bytes_per_s'] / 1e9:.3g} GB/s ({co['samples']} allreduces, rms residual "
            f"{co['rms_residual_s'] * 1e3:.3g} ms)"
            if co
            else "allreduce: the link (too few allreduce or pairwise payload sizes to fit it apart)"
        )
        avg = fit.get("model_average")
        if avg:
            print(
                f"model average (fold of the mean, beyond the allreduce): {avg['fixed_s'] * 1e3:.3g} ms + "
                f"{avg['s_per_byte'] * 1e9:.3g} ns per byte ({avg['runs']} model-averaging runs)"
            )
        print(
            f"step overhead (host work outside compute and exchanges, not slowed by a straggler): "
            f"{c.get('step_overhead_fixed_s', 0.0) * 1e3:.3g} ms + "
            f"{c.get('step_overhead_s_per_byte', 0.0) * 1e9:.3g} ns per byte"
        )
        mix = fit.get("mix_merge")
        if mix:
            print(
                f"merge of an average by the training thread (active sides; beyond the step overhead): "
                f"{mix['fixed_s'] * 1e3:.3g} ms + {mix['s_per_byte'] * 1e9:.3g} ns per byte "
                f"({mix['runs']} runs with pairwise averages; passive sides' own excess "
                f"{', '.join(f'{x * 1e3:.2g}' for x in mix.get('passive_excess_s', [])) or '-'} ms, not priced)"
            )
        if fit["server"]:
            print(f"server: service overhead {fit['server']['service_overhead_s'] * 1e3:.3g} ms")
        cpu = fit["host_cpu"]
        print(
            f"host cores: {cpu['cores_per_host']}, CPU work {cpu['work_per_message_s'] * 1e6:.1f} us per message, "
            f"{cpu['work_per_byte_s'] * 1e9:.3g} ns per byte"
            if cpu
            else "host cores: not modelled (no run had more workers than "
            + (f"the {fit['cores']} cores)" if fit["cores"] else "cores: no core count recorded, give --cores)")
        )
        print(f"wrote {args.out}")
    return 0
