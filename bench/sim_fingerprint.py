"""Record what the simulator predicts for a fixed set of cases, and compare a later tree with it.

A change to the engine that is meant to be a refactoring or a speed-up must leave every
prediction bit-identical: the trace arrays, ``SimResult.meta`` and ``extras`` (failures), and the
rows of ``predict --json``. This script runs the same cases on whatever ``psgdlab`` it imports and
writes (``record DIR``) or checks against (``compare DIR``) what it got:

- the presets (``interspeech2019-v100``, ``librispeech-gtx1080``) with every registry algorithm,
  both AD-PSGD rings and its delay-by-one, H-ADPSGD's two schedules, stragglers, relabelled
  streams, ``until="all"``, and the V100 preset widened as ``bench_sim.py`` does at 256 and 1024
  workers;
- two platforms that use every feature of the model: link ``scatter`` quantiles (NIC, PCIe or
  NVLink, the collective), ``host_cpu`` (between hosts too, emulated hosts sharing a machine),
  shared NICs (the fair-share flows), a socket link, ``staging="host"``, process endpoints, the
  collective between hosts, step overhead, merges and the model fold, a loader and input copies;
- failures: ``continue`` (deaths, ranks dead from the start), ``stop`` with checkpoints, and
  ``predict --fail``/``--failure-rate`` under ``continue``, ``stop`` and ``restart``.

``SimResult.events`` and the rows' ``sim_events`` count simpy events, which an engine change may
well change (the point of some changes); they are recorded and reported, not compared.

Run: ``python bench/sim_fingerprint.py record /tmp/fp`` on the base tree, then
``python bench/sim_fingerprint.py compare /tmp/fp`` after each change (about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.algorithms import make_algorithm
from psgdlab.core.platform.failure import Failure
from psgdlab.core.platform.profile import Profile
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.sim.engine import FailureSpec, simulate
from psgdlab.sim.platform import HostCPU, Link, Platform, ServerSpec
from psgdlab.sim.workload import Workload, load_config

#: keys that are not predictions (counts of the engine's events, wall time, where a run went)
NOT_COMPARED = frozenset({"events", "sim_events", "wall_s", "run_dir"})

SCATTER = (0.8, 0.95, 1.0, 1.1, 1.6)


def featured_cluster() -> Platform:
    """4 hosts of 4 devices on 2 sockets: every link scatters, host cores are shared (two emulated
    hosts a machine), devices send directly over the shared NICs, a socket link, the collective's
    own laws inside and between hosts, host work between steps, a server."""
    return Platform(
        name="featured-cluster",
        hosts=4,
        devices_per_host=4,
        sockets_per_host=2,
        pcie=Link(latency_s=5e-6, bandwidth_bytes_per_s=8e9, efficiency=0.8, scatter=SCATTER),
        nic=Link(latency_s=2e-5, bandwidth_bytes_per_s=1.25e9, efficiency=0.9, scatter=(0.9, 1.0, 1.3)),
        socket_link=Link(latency_s=1e-6, bandwidth_bytes_per_s=2e10, efficiency=0.7),
        collective=Link(latency_s=3e-5, bandwidth_bytes_per_s=4e9, scatter=(0.7, 1.0, 1.05, 2.0)),
        collective_between_hosts=Link(latency_s=4e-5, bandwidth_bytes_per_s=1e9),
        allreduce_between_hosts="ring",
        host_cpu=HostCPU(
            cores_per_host=2,
            work_per_message_s=1e-4,
            work_per_byte_s=2e-10,
            hosts_per_machine=2,
            work_per_message_between_hosts_s=2e-4,
            work_per_byte_between_hosts_s=1e-9,
        ),
        model_average_s=1e-4,
        model_average_s_per_byte=1e-11,
        mix_merge_s=2e-4,
        mix_merge_s_per_byte=1e-11,
        step_overhead_s=3e-4,
        step_overhead_s_per_byte=1e-11,
        server=ServerSpec(latency_s=1e-5, bandwidth_bytes_per_s=1e9, service_overhead_s=1e-4),
        failure_detection_s=0.3,
        restart_s=2.0,
    )


def featured_machine() -> Platform:
    """Emulated hosts of one workstation: process endpoints, host staging, NVLink that scatters,
    the NICs scattering, a halving-doubling allreduce inside a host, 3 cores a machine."""
    return Platform(
        name="featured-machine",
        hosts=2,
        devices_per_host=4,
        sockets_per_host=1,
        endpoints="process",
        staging="host",
        nvlink=Link(latency_s=1e-5, bandwidth_bytes_per_s=2e9, scatter=(0.85, 1.0, 1.0, 1.4)),
        nic=Link(latency_s=1e-4, bandwidth_bytes_per_s=6e8, scatter=(0.95, 1.0, 1.2)),
        collective=Link(latency_s=5e-5, bandwidth_bytes_per_s=1.5e9, scatter=(0.9, 1.1)),
        allreduce="halving-doubling",
        host_cpu=HostCPU(cores_per_host=3, work_per_message_s=5e-5, work_per_byte_s=5e-10, hosts_per_machine=2),
        mix_merge_s=1e-4,
        step_overhead_s=2e-4,
        failure_detection_s=0.2,
    )


def small_workload(compute: str = "lognormal:0.05:0.2") -> Workload:
    return Workload(
        name="small",
        n_params=2_000_000,
        compute=compute,
        batch_per_worker=32,
        reference_batch=32,
        input_bytes_per_sample=4000,
        loader_buffer_samples=256,
        loader_s_per_sample=2e-5,
        samples_per_epoch=100_000,
        epochs=2.0,
    )


def _algorithms(n: int, per_host: int) -> list[tuple[str, Any]]:
    return [
        ("sgd", make_algorithm("sgd")),
        ("ssgd", make_algorithm("ssgd", n_workers=n)),
        ("asgd", make_algorithm("asgd", n_workers=n, period=1)),
        ("bsp", make_algorithm("bsp", n_workers=n, period=3)),
        ("bmuf", make_algorithm("bmuf", n_workers=n, period=4)),
        ("easgd", make_algorithm("easgd", n_workers=n, period=2)),
        ("easgd-sync", make_algorithm("easgd", n_workers=n, period=2, variant="sync")),
        ("dpsgd", make_algorithm("dpsgd", n_workers=n)),
        ("adpsgd", make_algorithm("adpsgd", n_workers=n)),
        ("adpsgd-random", make_algorithm("adpsgd", n_workers=n, variant="random")),
        ("adpsgd-delay", make_algorithm("adpsgd", n_workers=n, variant="delay")),
        ("hadpsgd", make_algorithm("hadpsgd", n_workers=n, gpus_per_node=per_host)),
        ("hadpsgd-random", make_algorithm("hadpsgd", n_workers=n, gpus_per_node=per_host, variant="random")),
    ]


def simulate_cases() -> dict[str, dict[str, Any]]:
    """Every ``simulate`` case: name -> keyword arguments."""
    v100 = load_config(preset="interspeech2019-v100")
    gtx = load_config(preset="librispeech-gtx1080")
    cases: dict[str, dict[str, Any]] = {}
    for cfg, n, per_host, steps in ((v100, 16, 8, 30), (gtx, 8, 8, 30)):
        p, w = cfg.platform, cfg.workload
        for name, alg in _algorithms(n, per_host):
            cases[f"{p.name}/{name}"] = dict(algorithm=alg, platform=p, workload=w, steps=steps, seed=3)
        cases[f"{p.name}/adpsgd-stragglers"] = dict(
            algorithm=make_algorithm("adpsgd", n_workers=n),
            platform=p,
            workload=w,
            steps=steps,
            seed=1,
            stragglers=StragglerModel.parse("3:2,random:0.1:3,periodic:1:5:0.05"),
        )
    v100_64 = dict(platform=v100.platform, workload=v100.workload, steps=20, seed=0)
    for name in ("adpsgd", "adpsgd-random", "hadpsgd", "ssgd"):
        alg = dict(_algorithms(64, 8))[name]
        cases[f"v100-64/{name}"] = dict(algorithm=alg, **v100_64)
    wide = dataclasses.replace(v100.platform, hosts=128)  # bench_sim's platform: 1024 workers fit
    for name, n, steps in (("adpsgd-random", 256, 30), ("hadpsgd", 256, 30), ("adpsgd", 1024, 10)):
        cases[f"v100-{n}/{name}"] = dict(
            algorithm=dict(_algorithms(n, 8))[name], platform=wide, workload=v100.workload, steps=steps, seed=0
        )
    cases["v100/ssgd-streams-all"] = dict(
        algorithm=make_algorithm("ssgd", n_workers=8),
        platform=v100.platform,
        workload=v100.workload,
        steps=12,
        seed=2,
        until="all",
        streams=[3, 1, 4, 0, 5, 2, 7, 6],
    )
    for plat, n, per_host in ((featured_cluster(), 16, 4), (featured_machine(), 8, 4)):
        for name, alg in _algorithms(n, per_host):
            base = dict(algorithm=alg, platform=plat, workload=small_workload(), steps=25, seed=5)
            cases[f"{plat.name}/{name}"] = base
            if name in ("adpsgd", "ssgd", "hadpsgd", "adpsgd-random"):
                cases[f"{plat.name}/{name}-stragglers-all"] = dict(
                    base, stragglers=StragglerModel.parse("2:1.5,random:0.2:2"), until="all", seed=6
                )
        for name in ("adpsgd", "adpsgd-random", "dpsgd", "hadpsgd", "adpsgd-delay"):
            alg = dict(_algorithms(n, per_host))[name]
            spec = FailureSpec(
                failures=(Failure(1, 0.4), Failure(6, 0.9)), dead=(3,), policy="continue", detection_s=0.15
            )
            cases[f"{plat.name}/{name}-continue"] = dict(
                algorithm=alg, platform=plat, workload=small_workload(), steps=40, seed=7, failures=spec
            )
        for name in ("ssgd", "hadpsgd", "bmuf"):
            alg = dict(_algorithms(n, per_host))[name]
            spec = FailureSpec(failures=(Failure(2, 0.5),), policy="stop", detection_s=0.1, checkpoint_every=5)
            cases[f"{plat.name}/{name}-stop"] = dict(
                algorithm=alg, platform=plat, workload=small_workload(), steps=40, seed=8, failures=spec
            )
        cases[f"{plat.name}/hadpsgd-continue-protocol"] = dict(
            algorithm=dict(_algorithms(n, per_host))["hadpsgd"],
            platform=plat,
            workload=small_workload(),
            steps=20,
            seed=9,
            on_failure="continue",
        )
    return cases


def predict_cases(tmp: Path) -> dict[str, list[str]]:
    """Every ``predict --json`` case: name -> the command's arguments."""
    cluster = tmp / "featured-cluster.toml"
    Profile(platform=featured_cluster(), workload=small_workload()).write(cluster)
    machine = tmp / "featured-machine.toml"
    Profile(platform=featured_machine(), workload=small_workload()).write(machine)
    common = ["--json", "--jobs", "1", "--steps", "30"]
    return {
        "v100": ["--algorithm", "ssgd,adpsgd,hadpsgd", "--workers", "1,8,16", *common],
        "v100-variants": ["--algorithm", "adpsgd", "--variant", "random", "--workers", "16", *common],
        "v100-straggler": ["--algorithm", "ssgd,adpsgd", "--workers", "16", "--straggler", "3:2", *common],
        "gtx": ["--preset", "librispeech-gtx1080", "--algorithm", "bmuf,easgd,asgd", "--workers", "8", *common],
        "cluster": ["--platform", str(cluster), "--algorithm", "ssgd,dpsgd,adpsgd,hadpsgd", "--workers", "8,16"]
        + ["--gpus-per-node", "4", *common],
        "machine": ["--platform", str(machine), "--algorithm", "adpsgd,hadpsgd,bsp", "--workers", "8"]
        + ["--gpus-per-node", "4", *common],
        "fail-continue": ["--platform", str(cluster), "--algorithm", "adpsgd", "--workers", "8"]
        + ["--fail", "2@5", "--fail", "5@9", "--on-failure", "continue", *common],
        "fail-stop": ["--platform", str(cluster), "--algorithm", "ssgd", "--workers", "8"]
        + ["--fail", "2@5", "--on-failure", "stop", "--checkpoint-every", "10", *common],
        "fail-restart-rate": ["--platform", str(machine), "--algorithm", "ssgd,adpsgd", "--workers", "8"]
        + ["--failure-rate", "8", "--on-failure", "restart", "--failure-draws", "4", *common],
        "fail-continue-rate": ["--platform", str(machine), "--algorithm", "adpsgd", "--workers", "8"]
        + ["--failure-rate", "60", "--on-failure", "continue", "--failure-draws", "3", *common],
    }


def _plain(x: Any) -> Any:
    """``x`` as JSON (numpy arrays as lists; floats keep their repr, so equal JSON is equal bits)."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items() if k not in NOT_COMPARED}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def run_simulations(traces: dict[str, np.ndarray] | None = None) -> tuple[dict[str, Any], dict[str, int]]:
    out, events = {}, {}
    for name, kw in simulate_cases().items():
        res = simulate(**kw)
        if traces is not None:
            traces[name] = res.trace
        out[name] = {
            "trace_sha256": hashlib.sha256(res.trace.tobytes()).hexdigest(),
            "trace_rows": len(res.trace),
            "meta": _plain(res.meta),
            "extras": _plain(res.extras),
            "placement": _plain(dataclasses.asdict(res.placement)) if res.placement is not None else None,
        }
        events[name] = res.events
    return out, events


def run_predictions() -> tuple[dict[str, Any], dict[str, list[int]]]:
    from psgdlab.cli import main

    out, events = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in predict_cases(Path(tmp)).items():
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
                rc = main(["predict", *args, "--out", str(Path(tmp) / name)])
            doc = json.loads(buf.getvalue())
            events[name] = [int(r.get("sim_events", 0)) for r in doc["rows"]]
            out[name] = {"rc": rc, "doc": _plain(doc)}
    return out, events


def _key(name: str) -> str:
    return name.replace("/", "__")


def _numbers(x: Any, path: str = "") -> dict[str, Any]:
    """Every leaf of a JSON value by its path."""
    if isinstance(x, dict):
        return {k: v for key, item in x.items() for k, v in _numbers(item, f"{path}.{key}").items()}
    if isinstance(x, list):
        return {k: v for i, item in enumerate(x) for k, v in _numbers(item, f"{path}[{i}]").items()}
    return {path: x}


def _how_far(want: Any, got: Any) -> str:
    """How far two JSON values are apart: the largest relative difference of their numbers, and
    the leaves that differ otherwise."""
    a, b = _numbers(want), _numbers(got)
    worst, where, other = 0.0, "", []
    for path in sorted(set(a) | set(b)):
        x, y = a.get(path), b.get(path)
        if x == y:
            continue
        if isinstance(x, int | float) and isinstance(y, int | float) and not isinstance(x, bool):
            rel = abs(x - y) / max(abs(x), abs(y), 1e-300)
            if rel > worst:
                worst, where = rel, path
        else:
            other.append(path)
    text = f"largest relative difference {worst:.3g} at {where or '-'}"
    return text + (f"; {len(other)} other leaves differ, first {other[0]}" if other else "")


def _trace_gap(want: np.ndarray, got: np.ndarray) -> str:
    if want.shape != got.shape:
        return f"{len(want)} rows before, {len(got)} now"
    same = [f for f in want.dtype.names if np.array_equal(want[f], got[f], equal_nan=want[f].dtype.kind == "f")]
    gaps = {
        f: float(np.nanmax(np.abs(want[f] - got[f]) / np.maximum(np.abs(want[f]), 1e-300)))
        for f in ("start_s", "end_s")
        if f not in same
    }
    changed = [f for f in want.dtype.names if f not in same and f not in gaps]
    return f"times' largest relative difference {max(gaps.values(), default=0.0):.3g}" + (
        f", other columns differ: {changed}" if changed else ""
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("record", "compare"))
    ap.add_argument("dir", type=Path)
    args = ap.parse_args()
    traces: dict[str, np.ndarray] = {}
    sims, sim_events = run_simulations(traces)
    preds, pred_events = run_predictions()
    got = {"simulate": sims, "predict": preds}
    if args.mode == "record":
        args.dir.mkdir(parents=True, exist_ok=True)
        np.savez(args.dir / "traces.npz", **{_key(name): trace for name, trace in traces.items()})
        (args.dir / "results.json").write_text(json.dumps(got, indent=1, sort_keys=True))
        (args.dir / "events.json").write_text(json.dumps({"simulate": sim_events, "predict": pred_events}, indent=1))
        print(f"recorded {len(sims)} simulations and {len(preds)} predictions in {args.dir}")
        return 0
    want = json.loads((args.dir / "results.json").read_text())
    old_events = json.loads((args.dir / "events.json").read_text())
    got = json.loads(json.dumps(got, sort_keys=True))  # the same JSON round trip as the record
    differ = [
        f"{part}/{name}"
        for part in ("simulate", "predict")
        for name in sorted(set(want[part]) | set(got[part]))
        if want[part].get(name) != got[part].get(name)
    ]
    print("case                                          events before  after")
    for name, n in sim_events.items():
        print(f"{name:46}{old_events['simulate'].get(name, -1):13d}  {n:5d}")
    old_traces = np.load(args.dir / "traces.npz")
    for line in differ:
        part, name = line.split("/", 1)
        how = _how_far(want[part].get(name), got[part].get(name))
        if part == "simulate" and _key(name) in old_traces:
            how = f"{how}; trace: {_trace_gap(old_traces[_key(name)], traces[name])}"
        print(f"DIFFERS: {line}: {how}", file=sys.stderr)
    total = len(sims) + len(preds)
    print(f"{total - len(differ)} of {total} cases bit-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
