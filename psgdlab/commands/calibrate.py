"""``psgdlab calibrate [--probe] RUN_DIR... --out PLATFORM.toml``: fit this machine's platform profile;
``psgdlab calibrate --nccl-tests FILE... [--preset NAME | --platform FILE] --out PLATFORM.toml``: a
cluster's links from nccl-tests output, on a base profile."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from psgdlab.commands import print_json, show_progress


def register(sub: argparse._SubParsersAction) -> None:
    from psgdlab.core.flags import DefaultsHelpFormatter

    p = sub.add_parser(
        "calibrate",
        formatter_class=DefaultsHelpFormatter,
        help="fit the simulator's platform profile (compute time, link latency and bandwidth) from measured runs",
        description=(
            "Fit, from one or more runtime run directories (psgdlab train), the per-step compute-time "
            "distribution (mean, coefficient of variation, median, 95th percentile) and the latency and "
            "bandwidth of the link (from allreduce and pairwise exchanges of at least two payload sizes; "
            "a server's service overhead when server exchanges were measured; from runs with more "
            "workers than cores, the CPU work of communication per message and per byte), and write "
            "them as a "
            "platform+workload TOML the simulator reads (psgdlab predict --platform FILE.toml), with "
            "the fit's residuals and each fitted value's uncertainty ([uncertainty]: standard errors in "
            "log terms, run-to-run noise) as comments and tables; each run is then predicted on the fitted profile as "
            "it ran, and the profile's noise is raised to the model's residual on them where that is larger. "
            "Too little data is an error; a value the "
            "data cannot pin down (one payload size, durations that do not grow with the size) keeps its "
            "prior and is marked unpinned. "
            "--probe first measures the transport's building blocks as nccl-tests does: pairwise "
            "exchanges and allreduces timed over a sweep of message sizes (--sizes) and group sizes "
            "(--groups), --repeats times each after a barrier, with the CPU time of each exchange; its "
            "samples go to a run directory (--probe-out) and give the link laws (latency, bandwidth, "
            "bus bandwidth per size, the allreduce schedule) and the CPU work of communication, while the "
            "RUN_DIRs (short psgdlab train runs of your model) give the compute law. A probe directory may "
            "also be given as a RUN_DIR. Without RUN_DIRs, --probe prints the probe's fit and writes no "
            "profile. "
            "--nccl-tests FILE... reads the text output of nccl-tests (all_reduce_perf, sendrecv_perf, "
            "all_gather_perf, reduce_scatter_perf) run on a GPU cluster, with the ranks and nodes each ran on, "
            "and fits the collective and point-to-point laws inside a node and between nodes (latency and "
            "bus bandwidth from the out-of-place times, with their uncertainty from the fit's residuals) into a "
            "base profile: --preset NAME or --platform FILE, or else the preset whose device the logs name; "
            "docs/cluster.md says which runs to make."
        ),
    )
    _input_flags(p)
    _probe_flags(p)
    _profile_flags(p)
    _fit_output_flags(p)
    p.set_defaults(func=run)


def _input_flags(p: argparse.ArgumentParser) -> None:
    """What is fitted and written: the run directories, nccl-tests output with its base profile, the TOML file."""
    from psgdlab.core.flags import add_flags

    p.add_argument(
        "run_dirs", nargs="*", metavar="RUN_DIR", help="run directories written by psgdlab train (or a probe's)"
    )
    p.add_argument(
        "--nccl-tests",
        nargs="+",
        metavar="FILE",
        default=None,
        help="nccl-tests output files, one run each (without RUN_DIRs); --json adds nccl_tests: per file its "
        "test, ranks, nodes, sizes_bytes, measured_s (out-of-place) and fitted_s",
    )
    add_flags(
        p.add_mutually_exclusive_group(),
        "--preset",
        "--platform",
        helps={
            "--preset": "the base profile of --nccl-tests (default: the preset whose device the logs name)",
            "--platform": "the base profile of --nccl-tests, a file",
        },
    )
    p.add_argument("--out", metavar="PLATFORM.toml", help="the TOML file to write (atomically); needs a RUN_DIR")


def _probe_flags(p: argparse.ArgumentParser) -> None:
    """The probe: whether to run one, its directory, transport, message and group sizes, repeats and hosts."""
    from psgdlab.core.flags import add_flags
    from psgdlab.runtime.transports.backends import cpu_backends

    p.add_argument("--probe", action="store_true", help="probe the transport first (about 10-20 s with the defaults)")
    add_flags(p, "--force", helps={"--force": "here of --probe-out"})
    p.add_argument(
        "--probe-out",
        metavar="DIR",
        default=None,
        help="the probe's run directory (default: runs/probe-TIMESTAMP)",
    )
    p.add_argument("--backend", choices=cpu_backends(), default="gloo", help="the transport the probe measures")
    p.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        metavar="BYTES[,...]",
        help="message sizes of the probe, with an optional k or M suffix (KiB, MiB), multiples of 8 bytes "
        "(default: 8k,64k,512k,4M)",
    )
    p.add_argument(
        "--groups",
        type=_ints,
        default=(2,),
        metavar="N[,...]",
        help="allreduce group sizes of the probe (it starts max(N) processes; groups with more members than "
        "cores measure the cores' contention and stay out of the link fit)",
    )
    p.add_argument("--repeats", type=int, default=20, help="timed repetitions per kind, group and size of the probe")
    add_flags(
        p,
        "--hosts",
        "--nic-bandwidth",
        defaults={"--hosts": 1},
        helps={
            "--hosts": "-- here the probe's ranks (gloo): with one rank per host (--hosts 2 and the default "
            "--groups 2) every exchange crosses the NIC, and the fit is the link between hosts, the "
            "platform's [platform.nic]; train runs with --hosts and one worker per host give it too",
        },
    )


def _profile_flags(p: argparse.ArgumentParser) -> None:
    """The profile written: its hosts, name, workers per host, the cores the runs had, the model size."""
    from psgdlab.core.flags import add_old_spelling

    p.add_argument(
        "--platform-hosts",
        type=int,
        default=None,
        metavar="H",
        help="hosts of the platform written, when a probe or runs between hosts fitted the link between "
        "them (default: as many as they used); --workers-per-node is then the devices of each host; with --nccl-tests "
        "(default: the base's)",
    )
    p.add_argument(
        "--name", default=None, help="platform name in the file (default: calibrated; with --nccl-tests the base's)"
    )
    per_node = p.add_argument(
        "--workers-per-node",
        type=int,
        default=None,
        metavar="M",
        help="workers (devices or worker processes) of this machine's one host (default: what the machine that "
        "ran the runs has: its cores, or its GPUs after runs on NCCL, and at least the runs' largest worker count; "
        "predict runs more workers there as more processes, and says so); with --nccl-tests, of each host of the "
        "platform written (default: the base's)",
    )
    add_old_spelling(p, "--devices", per_node)
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


def _fit_output_flags(p: argparse.ArgumentParser) -> None:
    """The compute fit's warm-up and what is printed."""
    from psgdlab.core.flags import add_flags

    add_flags(p, "--no-progress", helps={"--no-progress": "of the probe"})
    p.add_argument("--warmup-steps", type=int, default=2, help="steps per worker left out of the compute fit")
    p.add_argument("--json", action="store_true", help="print the fit as one JSON object on one line")


def _ints(text: str) -> tuple[int, ...]:
    """``"2,4"`` -> ``(2, 4)``; anything else is a one-line usage error."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated integers (e.g. 2,4)") from None


def _sizes(text: str) -> tuple[int, ...]:
    """``"8k,4M"`` -> ``(8192, 4194304)``; anything else is a one-line usage error."""
    units = {"k": 1 << 10, "K": 1 << 10, "m": 1 << 20, "M": 1 << 20}
    try:
        return tuple(int(x[:-1]) * units[x[-1]] if x[-1:] in units else int(x) for x in text.split(","))
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated byte counts (e.g. 8k,64k,4M)") from None


def run(args: argparse.Namespace) -> int:
    from psgdlab.analysis.calibrate import calibrate_runs
    from psgdlab.calibration import fitted_profile
    from psgdlab.core.errors import ConfigError, require
    from psgdlab.core.records.results import document

    require(
        args.workers_per_node is None or args.workers_per_node >= 1,
        "workers-per-node",
        args.workers_per_node,
        "must be >= 1",
    )
    require(args.n_params is None or args.n_params >= 1, "n-params", args.n_params, "must be >= 1")
    require(args.cores is None or args.cores >= 1, "cores", args.cores, "must be >= 1")
    require(
        args.platform_hosts is None or args.platform_hosts >= 1, "platform-hosts", args.platform_hosts, "must be >= 1"
    )
    probing = (args.sizes, args.probe_out, args.nic_bandwidth) != (None, None, None) or (args.groups, args.hosts) != (
        (2,),
        1,
    )
    if args.nccl_tests is not None:
        if args.run_dirs or args.probe or probing:
            raise ConfigError(
                "--nccl-tests calibrates a GPU cluster's links on a base profile; RUN_DIRs and --probe calibrate this "
                "machine: give one or the other"
            )
        return _run_nccl_tests(args)
    if args.preset is not None or args.platform is not None:
        raise ConfigError("--preset and --platform give the base profile of --nccl-tests")
    if not args.probe and probing:
        raise ConfigError("--sizes, --groups, --probe-out, --hosts and --nic-bandwidth set up a probe; add --probe")
    if not args.run_dirs and not args.probe:
        raise ConfigError("give RUN_DIRs of psgdlab train, or --probe to measure the transport")
    if args.out is None and args.run_dirs:
        raise ConfigError("--out PLATFORM.toml is needed to write the profile fitted from the RUN_DIRs")
    if args.out is not None and not args.run_dirs:
        raise ConfigError(
            f"--out {args.out}: a profile needs a RUN_DIR of psgdlab train for the compute law (the probe "
            "measures the links only)"
        )
    for path in args.run_dirs:  # before a probe spends its seconds
        if not os.path.isdir(path):
            raise ConfigError(f"run directory {path} does not exist (give directories written by psgdlab train)")
    run_dirs = list(args.run_dirs)
    if args.probe:
        run_dirs.append(_run_probe(args))
    if not args.run_dirs:
        return _print_probe(run_dirs[-1], args)
    fit = calibrate_runs(run_dirs, warmup_steps=args.warmup_steps, cores=args.cores)
    # the model's miss on the runs it has seen raises the noise; the latency per round between
    # hosts is fitted through the simulator where the link fit could not pin it
    profile, fit = fitted_profile(
        fit,
        run_dirs,
        name=args.name or "calibrated",
        devices=args.workers_per_node
        if args.workers_per_node is not None or fit.nic is not None
        else _measured_devices(fit, run_dirs, args),
        n_params=args.n_params,
        hosts=args.platform_hosts,
    )
    profile.write(args.out)
    if args.json:
        print_json(document({**fit.to_json(), "out": args.out}))
    else:
        print("\n".join(fit.describe(profile.uncertainty)))
        print(f"wrote {args.out}")
    return 0


def _measured_devices(fit: Any, run_dirs: list[str], args: argparse.Namespace) -> int:
    """The devices of the one host a calibration of one machine writes: what that machine has (its
    cores, ``--cores`` where given, or its GPUs after runs on NCCL), and at least the runs' largest
    worker count."""
    import json
    from pathlib import Path

    from psgdlab.analysis.cores import devices_of

    envs = []
    for path in run_dirs:
        env_file = Path(path, "env.json")
        env = json.loads(env_file.read_text()) if env_file.is_file() else {}
        envs.append({**env, "cpu_count": args.cores} if args.cores is not None else env)
    return max(devices_of(envs) or 0, fit.max_workers)


def _run_probe(args: argparse.Namespace) -> str:
    """Run the probe of ``args`` (a progress bar on stderr); its run directory."""
    import dataclasses

    from tqdm import tqdm

    from psgdlab.core.records.rundir import open_run_dir
    from psgdlab.runtime.launcher.probe import DEFAULT_SIZES_BYTES, ProbeConfig, probe

    cfg = ProbeConfig(  # checked before the run directory is taken
        out=str(args.probe_out or "runs/probe"),
        backend=args.backend,
        sizes_bytes=args.sizes or DEFAULT_SIZES_BYTES,
        groups=args.groups,
        repeats=args.repeats,
        hosts=args.hosts,
        nic_bandwidth=args.nic_bandwidth,
    )
    held = open_run_dir(args.probe_out, command="calibrate --probe", kind="probe", force=args.force, what="--probe-out")
    cfg = dataclasses.replace(cfg, out=str(held.path))
    bar = tqdm(
        total=cfg.operations(), file=sys.stderr, unit="op", desc="probe", leave=False, disable=not show_progress(args)
    )

    def progress(done: int, total: int) -> None:
        bar.update(max(done - bar.n, 0))

    try:
        return str(probe(cfg, progress=progress))  # rank 0 commits it
    finally:
        bar.close()
        held.release()


def _print_probe(path: str, args: argparse.Namespace) -> int:
    """The probe's points and fitted laws (or ``--json``)."""
    from psgdlab.analysis.probe import fit_probe
    from psgdlab.core.records.results import document

    fit = fit_probe(path, cores=args.cores)
    if args.json:
        print_json(document(fit))
        return 0
    print(
        f"{'kind':<10} {'group':>5} {'bytes':>10} {'time us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11} {'cpu us':>8}"
    )
    for p in fit["points"]:
        kind = "pairwise" if p["kind"] == 0 else "allreduce"
        print(
            f"{kind:<10} {p['group']:>5} {p['size_bytes']:>10} {p['wall_s'] * 1e6:>10.1f} "
            f"{p['algbw_bytes_per_s'] / 1e9:>11.3f} {p['busbw_bytes_per_s'] / 1e9:>11.3f} {p['cpu_s'] * 1e6:>8.1f}"
        )
    if fit["hosts"] > 1:
        print(f"between {fit['hosts']} emulated hosts, one rank each: the links below are the link between hosts")
    for what, lk in (("pairwise link", fit["link"]), ("allreduce", fit["collective"])):
        if lk:
            print(
                f"{what}: latency {lk['latency_s'] * 1e6:.1f} us (log-sd {lk['latency_log_sd'] or 0:.2f}), bandwidth "
                f"{lk['bandwidth_bytes_per_s'] / 1e9:.3g} GB/s (log-sd {lk['bandwidth_log_sd'] or 0:.2f})"
                + (f"; unpinned: {', '.join(lk['unpinned'])}" if lk["unpinned"] else "")
            )
    print(
        f"allreduce schedule: {fit['allreduce_algorithm']}"
        + (f" (fit per schedule, reduced chi-square: {fit['schedule_fit']})" if fit["schedule_fit"] else "")
    )
    cpu = fit["host_cpu"]
    if cpu:
        print(
            f"CPU work of communication: {cpu['work_per_message_s'] * 1e6:.1f} us per message, "
            f"{cpu['work_per_byte_s'] * 1e9:.3g} ns per byte ({cpu['cores_per_host']} cores)"
        )
    print(f"probe samples: {path}/probe.npz")
    return 0


def _run_nccl_tests(args: argparse.Namespace) -> int:
    """``--nccl-tests``: read the files, fit their laws, write them into the base profile."""
    from psgdlab.analysis.nccl_tests import LAWS, fit_nccl_tests, nccl_profile, read_nccl_tests
    from psgdlab.core.records.results import document
    from psgdlab.sim.workload import load_config

    logs = [read_nccl_tests(path) for path in args.nccl_tests]
    base = (
        load_config(path=args.platform)
        if args.platform is not None
        else load_config(preset=args.preset or _preset_of(logs[0].device))
    )
    p = base.platform
    fit = fit_nccl_tests(logs, algorithm=p.allreduce, algorithm_between_hosts=p.allreduce_between_hosts)
    profile = nccl_profile(base, fit, logs, name=args.name, hosts=args.platform_hosts, devices=args.workers_per_node)
    if args.out is not None:
        profile.write(args.out)
    if args.json:
        laws = {key: fit[key] for key, _, _ in LAWS.values()}
        doc = {**laws, "allreduce_algorithm": p.allreduce, "runs": [], "base": base.source, "out": args.out}
        print_json(document({**doc, "nccl_tests": fit["nccl_tests"]}))
        return 0
    for entry in fit["nccl_tests"]:
        sizes = entry["sizes_bytes"]
        print(
            f"{entry['file']}: {entry['test']}_perf, {entry['ranks']} ranks on {entry['nodes']} node(s) "
            f"({entry['device']}), {len(sizes)} sizes {min(sizes)}-{max(sizes)} B"
        )
    for key, table, what in LAWS.values():
        law = fit[key]
        if law is None:
            continue
        target = table or ("nvlink" if base.platform.nvlink is not None else "pcie")
        lat_sd, bw_sd = law["latency_log_sd"], law["bandwidth_log_sd"]
        print(
            f"{what} -> [platform.{target}]: latency {law['latency_s'] * 1e6:.3g} us"
            + (" per round" if "collective" in key else "")
            + (f" (log-sd {lat_sd:.2g})" if lat_sd is not None else " (at its bound 0)")
            + f", bandwidth {law['bandwidth_bytes_per_s'] / 1e9:.4g} GB/s"
            + (f" (log-sd {bw_sd:.2g})" if bw_sd is not None else "")
            + f"; max relative residual {law['max_rel_residual']:.2g} over {law['points']} points"
        )
    print(f"base: {base.source}; " + (f"wrote {args.out}" if args.out else "no --out: nothing written"))
    return 0


def _preset_of(device: str) -> str:
    """The one shipped preset whose device the logs' device names (``H100`` in ``NVIDIA H100 80GB
    HBM3``), or a one-line error asking for the base."""
    from psgdlab.core.errors import ConfigError
    from psgdlab.sim.workload import load_config, preset_names

    def squeeze(text: str) -> str:
        return "".join(c for c in text.lower() if c.isalnum())

    found = [name for name in preset_names() if squeeze(load_config(preset=name).platform.device) in squeeze(device)]
    if len(found) != 1:
        said = f"the presets {', '.join(found)} all name" if found else "no preset names"
        raise ConfigError(
            f"{said} the logs' device ({device!r}): give the base profile with --preset NAME or --platform FILE "
            "(psgdlab preset list)"
        )
    return found[0]
