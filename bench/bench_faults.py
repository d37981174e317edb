"""Fault-injection campaign: runs of every algorithm, each with one fault at a random time, and a
soak of short gossip runs with random delays on every exchange (issue 18's figures).

::

    python bench/bench_faults.py --runs 40 [--soak 100] [--seed 0] [--json]

Each run is a ``psgdlab train`` of the least-squares model with emulated compute (4 workers,
``--steps`` steps of ``--compute-time``), one algorithm after the other, with one fault drawn at
random (seeded) and injected at a random time after every rank has started:

=============== =================================================================================
sigkill         SIGKILL of a random rank (rank 0 included); the synchronous algorithms run half of
                these with ``--on-failure restart``
sigstop         SIGSTOP of a random rank: it must be treated as dead after the deadline
disk-full       the run directory is a small tmpfs (root only) that a filler file fills, so a
                checkpoint write meets ENOSPC
corrupt         a finished run's newest checkpoint is overwritten with garbage, then ``--resume``
                extends the run: it must fall back to the previous complete checkpoint or say why not
link-down       on two emulated hosts (root only), host 1's link is set down
=============== =================================================================================

A run *hangs* when the launcher has not ended by itself ``--hang-after`` seconds after the fault
(the bench then kills it; default 90 s, beyond the set-up's own deadline of 60 s, within which a
fault during the rendezvous ends the run). A failed or hung run's record (the soak's too) keeps the
last lines of its standard error (``stderr_tail``), which goes to a file while it runs. *Partial
files* are temporary files (``.NAME.RANDOM.tmpPID``, ``core.files.temporary_path``, or the older
``.NAME.PID.tmp``) left anywhere in the run directory (the soak's runs too). *Detection* is the
time from a kill, a stop or a link set down to the run's end under ``stop`` (the launcher's
decision, the survivors' flight records and the clean-up included: an upper bound). Under
``restart``, *work lost* is, per restart, the steps done since the checkpoint it resumed from,
and ``restart_p50_s`` the median time from the failure to the first step after it (the
summary's ``restarts``).
*Named* counts the runs whose error named the rank the bench killed or stopped (``misnamed``: those
that named another).

AD-PSGD's, D-PSGD's and H-ADPSGD's runs with a kill or a stop, and AD-PSGD's and H-ADPSGD's with a
link set down, run ``--on-failure continue``; every other kill, stop or link fault runs
``--on-failure stop`` (or restart, above), and a full disk or a corrupted checkpoint runs the
algorithm's default policy (``default``: continue for AD-PSGD, D-PSGD and H-ADPSGD's nodes of 2
GPUs). Under continue the survivors must finish (status 0) without the victim, or with ranks of
one host only when a host was cut off; a fault that lands in the set-up (policy
``continue-in-setup``) must stop the run as under ``stop``, naming the victim. Their *detection* is
the time from the fault to the survivors' new epoch (``OUT/membership``); ``survivor_steps_lost``
counts the steps the survivors did not do (0 when they lose no work); ``throughput_after_ratio`` is
the median of the runs' summary figure, the survivors' throughput after the failure against before
(their own pace: ``(n-1)/n`` of the whole run's).
``--algorithms adpsgd,dpsgd`` runs only those. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ALGORITHMS = ("ssgd", "bsp", "bmuf", "easgd", "asgd", "adpsgd", "dpsgd", "hadpsgd")
SYNCHRONOUS = ("ssgd", "bsp", "bmuf")
#: what runs --on-failure continue under a kill or a stop (runtime/README.md, "Going on without the dead")
CONTINUING = ("adpsgd", "dpsgd", "hadpsgd")
#: ... and with a host cut off (dpsgd continues on one host only)
CONTINUING_ACROSS_HOSTS = ("adpsgd", "hadpsgd")
#: how the bench names a temporary file of :func:`psgdlab.core.files.atomic_write_bytes` (every writer's)
PARTIAL = re.compile(r"^\..+\.(tmp\d+|\d+\.tmp)$")
WORKERS = 4
#: the soak's algorithms, in turn (the first three with --on-failure stop, the last three with
#: --on-failure continue)
SOAK_ALGORITHMS = ("adpsgd", "dpsgd", "hadpsgd", "adpsgd", "dpsgd", "hadpsgd")
#: lines of a failed or hung run's standard error kept in its record
TAIL_LINES = 20


def _train_command(algorithm: str, out: Path, args: argparse.Namespace, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "psgdlab", "train", "--algorithm", algorithm, "--workers", str(WORKERS)]
    cmd += ["--model", "least-squares", "--steps", str(args.steps), "--compute-time", str(args.compute_time)]
    cmd += ["--checkpoint-every", str(args.checkpoint_every), "--timeout", str(args.deadline), "--out", str(out)]
    if algorithm in ("bmuf", "bsp", "asgd"):
        cmd += ["--period", "4"]
    if algorithm == "easgd":
        cmd += ["--variant", "sync"]
    if algorithm == "hadpsgd":
        cmd += ["--gpus-per-node", "2"]
    return [*cmd, "--json", *extra]


def _rank_pids(out: Path, world: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> list[int] | None:
    """The ranks' pids, once every rank has written its pid file (None if the run ended first)."""
    deadline = time.monotonic() + timeout_s
    files = [out / ".ranks" / f"rank{r}.pid" for r in range(world)]
    while time.monotonic() < deadline and proc.poll() is None:
        texts = [f.read_text().strip() if f.is_file() else "" for f in files]
        if all(texts):
            return [int(t) for t in texts]
        time.sleep(0.05)
    return None


def _joined(out: Path, victim: int | None) -> bool:
    """Whether the victim had joined the survivors' membership (its ``.continuing`` marker,
    :func:`psgdlab.runtime.failures.survive.survivors.continuing_path`); a link fault has no victim: True."""
    return victim is None or (out / ".ranks" / f"rank{victim}.continuing").exists()


def _partial_files(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and PARTIAL.match(p.name)]


def _shm_left(pids: list[int]) -> list[str]:
    return [str(p) for pid in pids for p in Path("/dev/shm").glob(f"psgdlab-{pid}-*")]


def _namespaces(launcher: int) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"psgd-{launcher}-")]


def _is_root() -> bool:
    return os.geteuid() == 0


def _summary(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _failure(out: Path) -> dict[str, Any]:
    """What the launcher wrote of a stopped run (``OUT/failure.json``): the error and the change."""
    try:
        obj = json.loads((out / "failure.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"membership_changes": obj.get("membership_changes", []), "survivors": obj.get("survivors")}


def _wait(proc: subprocess.Popen, limit_s: float) -> tuple[bool, float]:
    """(ended by itself, seconds waited)."""
    start = time.monotonic()
    try:
        proc.wait(timeout=limit_s)
        return True, time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False, time.monotonic() - start


def _reap(pids: list[int]) -> None:
    """SIGCONT and SIGKILL what is left of a run's ranks (a stopped rank the run did not kill)."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break


def one_run(index: int, algorithm: str, fault: str, rng: random.Random, args: argparse.Namespace) -> dict[str, Any]:
    """One training run with one fault; what happened, as a record."""
    base = Path(tempfile.mkdtemp(prefix=f"faults-{index}-"))
    out = base / "run"
    record: dict[str, Any] = {"run": index, "algorithm": algorithm, "fault": fault, "policy": "stop"}
    mounted = False
    proc: subprocess.Popen | None = None
    extra: list[str] = []
    try:
        if fault == "disk-full":
            base.joinpath("run").mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(out)], check=True)
            mounted = True
        if fault == "link-down":
            extra += ["--hosts", "2", "--nic-bandwidth", "1Gbit/s"]
        if fault == "sigkill" and algorithm in SYNCHRONOUS and rng.random() < 0.5:
            record["policy"] = "restart"
            extra += ["--on-failure", "restart", "--max-restarts", "2"]
        if (fault in ("sigkill", "sigstop") and algorithm in CONTINUING) or (
            fault == "link-down" and algorithm in CONTINUING_ACROSS_HOSTS
        ):
            record["policy"] = "continue"
            extra += ["--on-failure", "continue"]
        elif fault in ("disk-full", "corrupt"):  # the run's default policy (continue for gossip)
            record["policy"] = "default"
        elif record["policy"] == "stop":
            extra += ["--on-failure", "stop"]
        if fault == "corrupt":
            first = subprocess.run(_train_command(algorithm, out, args), capture_output=True, text=True)
            if first.returncode != 0:
                record.update(ended=True, rc=first.returncode, error=first.stderr.strip().splitlines()[-1:])
                return record
            steps = sorted((out / "checkpoints").glob("step*"))
            victim = sorted(steps[-1].glob("rank*.pt"))[0]
            victim.write_bytes(os.urandom(max(64, victim.stat().st_size)))
            record.update(corrupted=str(victim.relative_to(out)), injected=True)
            cmd = [sys.executable, "-m", "psgdlab", "train", "--resume", str(out), "--steps", str(2 * args.steps)]
            cmd += ["--json"]
        else:
            cmd = _train_command(algorithm, out, args, *extra)
        # the run's output goes to a file, never to a pipe nobody reads while it runs: a full pipe
        # would block every rank that logs (a hang of the bench's making)
        log_path = base / "stderr.txt"
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_file, text=True, start_new_session=True)
        world = WORKERS + (1 if algorithm == "asgd" else 0)
        pids = _rank_pids(out, world, proc) or []
        injected = time.monotonic()
        if pids and fault != "corrupt":
            time.sleep(rng.uniform(0.2, args.fault_window))
            if fault in ("sigkill", "sigstop"):
                victim_rank = rng.randrange(world)  # asgd's server (the last rank) included
                record["victim"] = victim_rank
            injected, injected_wall = time.monotonic(), time.time()
            record["injected"] = True
            if fault == "sigkill":
                _signal(pids[record["victim"]], signal.SIGKILL)
            elif fault == "sigstop":
                _signal(pids[record["victim"]], signal.SIGSTOP)
            elif fault == "disk-full":
                _fill(out)
            elif fault == "link-down":
                for name in _namespaces(proc.pid):
                    if name.endswith("-h1"):
                        subprocess.run(["ip", "-n", name, "link", "set", "nic0", "down"], check=False)
        ended, _ = _wait(proc, args.hang_after + (time.monotonic() - injected))
        stderr = log_path.read_text(errors="replace")
        _reap(pids)
        record.update(ended=ended, rc=proc.returncode, seconds_after_fault=round(time.monotonic() - injected, 3))
        record["error"] = stderr.strip().splitlines()[-1:] if proc.returncode else []
        if proc.returncode or not ended:  # what the ranks said last, for the post-mortem
            record["stderr_tail"] = stderr.strip().splitlines()[-TAIL_LINES:]
        if "victim" in record and proc.returncode and fault in ("sigkill", "sigstop"):
            failed = re.search(r"run failed: rank (\d+)", " ".join(record["error"]))
            record["named"] = failed is not None and int(failed.group(1)) == record["victim"]
        summary = _summary(out)
        record["restarts"] = summary.get("restarts", [])
        if (
            record["policy"] == "continue"
            and proc.returncode
            and (" on setup " in " ".join(record["error"]) or not _joined(out, record.get("victim")))
        ):
            # a fault in the set-up (the rendezvous needs every rank; the launcher lets the others go
            # on only once every rank has joined the membership) stops the run as under stop
            record["policy"] = "continue-in-setup"
        if record["policy"] == "continue":
            # a kill or a stop: every rank but the victim; a host cut off: ranks of one host only
            survivors = set(summary.get("survivors") or [])
            record["named"] = proc.returncode == 0 and (
                survivors == set(range(WORKERS)) - {record["victim"]}
                if "victim" in record
                else bool(survivors)
                and (survivors <= set(range(WORKERS // 2)) or survivors.isdisjoint(range(WORKERS // 2)))
            )
            epoch = out / "membership" / "epoch00000001.json"
            if epoch.is_file():
                record["detection_s"] = round(json.loads(epoch.read_text())["time_s"] - injected_wall, 3)
            record["survivor_steps_lost"] = len(summary.get("survivors", [])) * args.steps - int(
                summary.get("steps", 0)
            )
            record["throughput_after_ratio"] = summary.get("throughput_after_ratio")
        record["failure"] = _failure(out)
        record["partial_files"] = _partial_files(out) if out.is_dir() else []
        record["shm_left"] = _shm_left(pids)
        record["namespaces_left"] = _namespaces(proc.pid)
        return record
    finally:
        if proc is not None:  # the bench was stopped: end the run first
            _end(proc)
        if mounted:
            subprocess.run(["umount", "-l", str(out)], check=False)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _end(proc: subprocess.Popen) -> None:
    """End a run still in progress (SIGTERM to its session: the launcher removes what it made,
    namespaces and segments; SIGKILL after 30 s)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _fill(out: Path) -> None:
    """Fill the tmpfs under ``out`` but for a few KiB."""
    stat = os.statvfs(out)
    free = stat.f_bavail * stat.f_frsize
    try:
        with open(out / "filler", "wb") as fh:
            fh.write(b"\0" * max(0, free - 8192))
    except OSError:
        pass


def soak(runs: int, rng: random.Random, args: argparse.Namespace) -> dict[str, Any]:
    """``runs`` short gossip runs with random delays (up to ``--soak-jitter`` s) on every exchange;
    one line a run on standard error."""
    hangs = failures = partial = 0
    errors: dict[str, int] = {}
    for i in range(runs):
        algorithm = SOAK_ALGORITHMS[i % len(SOAK_ALGORITHMS)]
        # the second half of each turn runs the survivors' protocol (continue), which no fault ends
        continuing = i % len(SOAK_ALGORITHMS) >= 3
        policy = ["--on-failure", "continue" if continuing else "stop"]
        with tempfile.TemporaryDirectory(prefix="soak-") as tmp, open(Path(tmp) / "stderr.txt", "w+") as log_file:
            cmd = _train_command(algorithm, Path(tmp) / "run", args, *policy)
            cmd[cmd.index("--steps") + 1] = "20"
            cmd += ["--seed", str(rng.randrange(1 << 30))]  # the seed of the delays' draws too
            env = {**os.environ, "PSGDLAB_TEST_JITTER": str(args.soak_jitter)}
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_file, env=env, start_new_session=True)
            try:
                ended, _ = _wait(proc, args.hang_after + 30)
            finally:  # a stopped soak ends its run before its directory goes
                _end(proc)
            log_file.seek(0)
            stderr = log_file.read()
            left = _partial_files(Path(tmp) / "run")
            hangs += not ended
            partial += len(left)
            line = {"soak": i, "algorithm": algorithm, "continue": continuing, "ended": ended, "rc": proc.returncode}
            if ended and proc.returncode != 0:
                failures += 1
                last = (stderr.strip().splitlines() or ["(no message)"])[-1]
                errors[last] = errors.get(last, 0) + 1
                line["error"] = last
            if proc.returncode or not ended:  # what the ranks said last, for the post-mortem
                line["stderr_tail"] = stderr.strip().splitlines()[-TAIL_LINES:]
            if left:
                line["partial_files"] = left
            print(json.dumps(line), file=sys.stderr, flush=True)
    return {"runs": runs, "hangs": hangs, "failures": failures, "partial_files": partial, "errors": errors}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]) if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=16, help="fault runs (default 16)")
    parser.add_argument("--soak", type=int, default=0, help="short gossip runs with random delays (default 0)")
    parser.add_argument("--soak-jitter", type=float, default=0.005, help="largest delay per exchange, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--compute-time", type=float, default=0.01)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--deadline", type=float, default=5.0, help="the runs' --timeout, seconds")
    parser.add_argument("--fault-window", type=float, default=2.5, help="faults land up to this long after start")
    parser.add_argument(
        "--hang-after",
        type=float,
        default=90.0,
        help="a run not ended this long after its fault hangs (default 90: the set-up's own deadline is 60 s)",
    )
    parser.add_argument(
        "--algorithms", default=",".join(ALGORITHMS), help="comma-separated, in turn (default: every algorithm)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # SIGTERM unwinds like an exception, so the run in progress is cleaned up (its tmpfs unmounted,
    # its directory removed) by the finally blocks, as on Ctrl-C
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rng = random.Random(args.seed)
    kinds = ["sigkill", "sigstop", "corrupt"] + (["disk-full", "link-down"] if _is_root() else [])
    records = []
    chosen = [a for a in args.algorithms.split(",") if a]
    unknown = sorted(set(chosen) - set(ALGORITHMS))
    if unknown or not chosen:
        parser.error(f"--algorithms ({args.algorithms!r}) must name some of {', '.join(ALGORITHMS)}")
    for i in range(args.runs):
        algorithm, fault = chosen[i % len(chosen)], rng.choice(kinds)
        if fault == "link-down" and algorithm == "asgd":  # 5 ranks do not split over 2 hosts
            fault = "sigkill"
        record = one_run(i, algorithm, fault, rng, args)
        records.append(record)
        print(json.dumps(record), file=sys.stderr, flush=True)  # one line a run, --json or not
    stops = [
        r
        for r in records
        if r["policy"] in ("stop", "continue-in-setup") and r["fault"] in ("sigkill", "sigstop", "link-down")
    ]
    detections = [r["seconds_after_fault"] for r in stops if r.get("ended") and r.get("rc")]
    continued = [r for r in records if r["policy"] == "continue" and r.get("injected")]
    detections += [r["detection_s"] for r in continued if r.get("detection_s") is not None]
    ratios = [x for r in continued if (x := r.get("throughput_after_ratio")) is not None and math.isfinite(x)]
    restarts = [x for r in records for x in r.get("restarts", [])]
    result = {
        "runs": len(records),
        "faults": sum(1 for r in records if r.get("injected")),
        "hangs": sum(1 for r in records if not r.get("ended", True)),
        "partial_files": sum(len(r.get("partial_files", [])) for r in records),
        "leftovers": sum(len(r.get("shm_left", [])) + len(r.get("namespaces_left", [])) for r in records),
        "named": sum(1 for r in records if r.get("named") is True),
        "misnamed": sum(1 for r in records if r.get("named") is False),
        "work_lost_steps": sum(x.get("steps_lost", 0) for x in restarts),
        "detection_p50_s": _pct(detections, 50),
        "detection_p99_s": _pct(detections, 99),
        "restarts": len(restarts),
        "restart_p50_s": _pct([x["time_to_first_step_s"] for x in restarts if x.get("time_to_first_step_s")], 50),
        "continued": len(continued),
        "continued_finished": sum(1 for r in continued if r.get("named")),
        "survivor_steps_lost": sum(r.get("survivor_steps_lost", 0) for r in continued),
        "continue_detection_p50_s": _pct([r["detection_s"] for r in continued if r.get("detection_s") is not None], 50),
        "continue_detection_p99_s": _pct([r["detection_s"] for r in continued if r.get("detection_s") is not None], 99),
        "throughput_after_ratio": statistics.median(ratios) if ratios else None,
        "throughput_after_ratio_min": min(ratios) if ratios else None,
        "by_fault": {k: sum(1 for r in records if r["fault"] == k) for k in kinds},
    }
    if args.soak:
        result["soak"] = soak(args.soak, rng, args)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
