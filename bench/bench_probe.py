"""The probe set of issue 45, run as a user runs it: every bad input of
:mod:`psgdlab.tests.probes` as a ``psgdlab`` process, then the fault scenarios, and the tallies.

::

    python bench/bench_probe.py [--jobs 2] [--timeout 120] [--only inputs|scenarios] [--json]

An input passes when its process ends within ``--timeout`` (else it *hangs*) with the exit status
of its kind (2 bad input, 1 a failed run; a signal is a *crash*) and exactly one line on stderr,
``psgdlab: error: ...`` (or a usage error, ``psgdlab COMMAND: error: ...``), holding the input's
pattern; a ``Traceback`` anywhere is a *traceback*, an exit 0 an input *accepted*.

A scenario passes when its own checks hold; each says what it checked. *Data lost*: a file that
must not change changed (a train run under ``predict --out``, a file a planted link points at), or
a directory looks complete (its ``complete.json``) after a failure. Scenarios that need root (a
tmpfs that fills, another user's directory, emulated hosts) are skipped without it.

=========================== ===========================================================================
scenario                    what must hold
=========================== ===========================================================================
planted-links               links for the next 2000 pids beside every output of a prediction, and at
                            a case's final names: the file they point at is unchanged
malicious-checkpoint        a pickle that runs code, planted (with its digest) as the newest
                            checkpoint before ``train --resume``: it runs nothing; the resume falls
                            back to the previous complete checkpoint and finishes
launcher-sigkill            SIGKILL of ``psgdlab train`` (one host; emulated hosts as root): every
                            rank gone within 5 s (the figure: how long after)
predict-out-train-run       ``predict --out`` a train run: refused in one line, none of its files changed
two-runs-one-out            a second ``predict`` into a directory a first one writes: refused at
                            once naming the first's pid; the first finishes and commits
killed-predict              a ``predict`` killed mid-run: its pool workers gone within 5 s, ``compare``
                            refuses the directory (incomplete), the next ``predict --force`` says what
                            it found and cleaned
full-disk-predict           (root) a 64 KiB tmpfs: one line, exit 1, nothing committed, no temporary file
full-disk-hdf5              (root) an HDF5 corpus on it: one line, no SIGSEGV, nothing left
full-disk-train             (root) a training run's checkpoints on it: one line, exit 1, nothing committed
another-users-out           (root) ``--out`` owned by another user, or under their folder: refused
ctrl-c-train                SIGINT to a training run's process group: one line (run interrupted), exit
                            130, no traceback per rank
sigstop-rank                a rank stopped (SIGSTOP) past ``--timeout``: the run stops, one line names it
nan-loss                    a run that diverges: exit 1, the line names the rank and the step
nan-features                a corpus with a NaN: ``train`` refuses it before any rank starts
spawn-sigint                SIGINT to the launcher while its 8 ranks start: no rank alive 5 s later,
                            one line (run interrupted), exit 130
huge-steps                  ``predict --steps 1000000000``: refused in seconds with an estimate
=========================== ===========================================================================
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from psgdlab.core.files import process_start_time
from psgdlab.tests.probes import INPUTS, ONE_LINE, Probe, build_fixtures, release_fixtures

#: the one line of a run the user stopped (an agreed stop, not an error: exit 130)
INTERRUPTED = re.compile(r"^psgdlab: run interrupted by Ctrl-C \(SIGINT\)")

PSGDLAB = [sys.executable, "-m", "psgdlab"]
#: how long after a launcher's SIGKILL (or a SIGINT while its ranks start) none of its ranks may run
DEATH_WITHIN_S = 5.0


# ----- the inputs --------------------------------------------------------------------------------
def run_input(probe: Probe, fixtures: dict[str, str], timeout_s: float, cwd: Path) -> dict[str, Any]:
    """Run one input as a process; its record and verdict."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [*PSGDLAB, *probe.args(fixtures)], capture_output=True, text=True, timeout=timeout_s, cwd=cwd
        )
    except subprocess.TimeoutExpired:
        return {"name": probe.name, "verdict": "hang", "wall_s": timeout_s}
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if "Traceback" in done.stderr:
        verdict = "traceback"
    elif done.returncode < 0:
        verdict = f"crash ({signal.Signals(-done.returncode).name})"
    elif done.returncode == 0:
        verdict = "accepted"
    elif done.returncode != probe.status:
        verdict = f"status {done.returncode}"
    elif len(lines) != 1 or not ONE_LINE.match(lines[0]):
        verdict = f"lines {len(lines)}"
    elif probe.match and not re.search(probe.match, lines[0]):
        verdict = "message"
    else:
        verdict = "ok"
    return {
        "name": probe.name,
        "verdict": verdict,
        "status": done.returncode,
        "wall_s": time.perf_counter() - t0,
        "line": lines[-1] if lines else "",
    }


def run_inputs(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    fixtures = build_fixtures(root / "fixtures")
    cwd = root / "cwd"
    cwd.mkdir()
    probes = [p for p in INPUTS if not (p.needs_root and os.geteuid() != 0)]
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            records = list(pool.map(lambda p: run_input(p, fixtures, args.timeout, cwd), probes))
    finally:
        release_fixtures()
    counts = collections.Counter(r["verdict"].split(" ")[0] for r in records)
    return {
        "inputs": len(records),
        "skipped_needs_root": len(INPUTS) - len(probes),
        "one_line_percent": 100.0 * counts["ok"] / max(len(records), 1),
        "tracebacks": counts["traceback"],
        "accepted": counts["accepted"],
        "hangs": counts["hang"],
        "crashes": counts["crash"],
        "other": {k: v for k, v in counts.items() if k not in ("ok", "traceback", "accepted", "hang", "crash")},
        "left_files_in_cwd": sorted(p.name for p in cwd.iterdir()),
        "failed": [r for r in records if r["verdict"] != "ok"],
        "wall_p50_s": sorted(r["wall_s"] for r in records)[len(records) // 2] if records else None,
    }


# ----- the scenarios -----------------------------------------------------------------------------
def _psgdlab(*argv: str, timeout_s: float = 300.0, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PSGDLAB, *argv], capture_output=True, text=True, timeout=timeout_s, **kw)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _one_error_line(done: subprocess.CompletedProcess[str], status: int, pattern: str = "") -> str | None:
    """None when ``done`` ended with ``status`` and its last line is an error line holding
    ``pattern`` with no traceback; else what is wrong."""
    lines = _lines(done.stderr)
    if "Traceback" in done.stderr:
        return "traceback"
    if done.returncode != status:
        return f"status {done.returncode} ({lines[-1] if lines else ''})"
    if not lines or not ONE_LINE.match(lines[-1]) or (pattern and not re.search(pattern, lines[-1])):
        return f"last line: {lines[-1] if lines else '(none)'}"
    return None


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _train(out: Path, *extra: str) -> list[str]:
    return ["train", "--model", "least-squares", "--workers", "2", "--timeout", "60", "--out", str(out), *extra]


def _wait_pids(out: Path, world: int, proc: subprocess.Popen[str], timeout_s: float = 120.0) -> list[int] | None:
    files = [out / ".ranks" / f"rank{r}.pid" for r in range(world)]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if all(f.is_file() and f.read_text().strip() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    return None


def _gone_after(ranks: list[tuple[int, int | None]], since: float, limit_s: float) -> float | None:
    """Seconds from ``since`` until no rank of ``ranks`` (pid, start time) runs; None past ``limit_s``."""
    while any(process_start_time(pid) == start for pid, start in ranks):
        if time.monotonic() - since > limit_s:
            return None
        time.sleep(0.01)
    return time.monotonic() - since


def scenario_planted_links(tmp: Path) -> dict[str, Any]:
    victim = tmp / "victim.txt"
    victim.write_text("precious\n")
    out = tmp / "run"
    sub = out / "runs" / "ssgd-w2"
    sub.mkdir(parents=True)
    names = ("config.resolved.json", "env.json", "summary.json", "trace.npz", "timeline.json", "speedup.png")
    names += ("staleness.png", "complete.json")
    # the next pid a process gets is near the newest one's: plant from this process's id on
    start = os.getpid()
    for folder in (out, sub):
        for name in names:
            for pid in range(start, start + 2001):
                (folder / f".{name}.tmp{pid}").symlink_to(victim)
    for name in ("summary.json", "trace.npz"):
        (sub / name).symlink_to(victim)
    done = _psgdlab("predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "4", "--out", str(out))
    ok = done.returncode == 0 and victim.read_text() == "precious\n" and (out / "complete.json").is_file()
    return {"ok": ok, "data_lost": victim.read_text() != "precious\n", "links": 2 * len(names) * 2001 + 2}


def scenario_malicious_checkpoint(tmp: Path) -> dict[str, Any]:
    import hashlib as h
    import io

    import torch

    from psgdlab.runtime.loop import checkpoint as ckpt

    out = tmp / "run"
    first = _psgdlab(*_train(out, "--algorithm", "ssgd", "--steps", "8", "--checkpoint-every", "2"))
    if first.returncode != 0:
        return {"ok": False, "why": f"the first run failed: {_lines(first.stderr)[-1:]}"}
    marker = tmp / "ran"

    class Planted:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (marker,))

    newest = ckpt.latest_complete_step(out, 2)
    buf = io.BytesIO()
    torch.save({"params": torch.zeros(2), "hook": Planted()}, buf)
    body = buf.getvalue()
    target = ckpt.checkpoint_root(out) / f"step{newest:08d}" / "rank0.pt"
    target.write_bytes(ckpt.MAGIC + h.sha256(body).digest() + body)
    done = _psgdlab("train", "--resume", str(out), "--steps", "12")
    fell_back = "falling back to the previous complete checkpoint" in done.stderr
    ok = not marker.exists() and done.returncode == 0 and fell_back and "Traceback" not in done.stderr
    return {"ok": ok, "code_ran": marker.exists(), "status": done.returncode, "fell_back": fell_back}


def scenario_launcher_sigkill(tmp: Path, hosts: int) -> dict[str, Any]:
    out = tmp / f"run-h{hosts}"
    argv = _train(out, "--algorithm", "adpsgd", "--steps", "100000", "--compute-time", "0.02", "--hosts", str(hosts))
    proc = subprocess.Popen(
        [*PSGDLAB, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        pids = _wait_pids(out, 2, proc)
        deadline = time.monotonic() + 120
        while pids and not (out / "checkpoints" / "run.json").is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pids:
            return {"ok": False, "why": "the ranks did not start"}
        ranks = [(pid, process_start_time(pid)) for pid in pids]
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait()
        gone = _gone_after(ranks, killed, DEATH_WITHIN_S)
        return {"ok": gone is not None, "ranks_gone_after_s": gone}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def scenario_predict_out_train_run(tmp: Path) -> dict[str, Any]:
    out = tmp / "train"
    first = _psgdlab(*_train(out, "--algorithm", "ssgd", "--steps", "4"))
    if first.returncode != 0:
        return {"ok": False, "why": f"the train run failed: {_lines(first.stderr)[-1:]}"}
    before = _digests(out)
    done = _psgdlab("predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "4", "--out", str(out))
    wrong = _one_error_line(done, 2, "holds another run .*train run")
    lost = _digests(out) != before
    return {"ok": wrong is None and not lost, "why": wrong, "data_lost": lost}


def _long_predict(out: Path, **stderr: Any) -> tuple[list[str], subprocess.Popen[str]]:
    """A prediction of a dozen configurations into ``out`` (long enough to be caught writing),
    started and holding its run directory's lock (or 60 s gone); its arguments and its process."""
    argv = ["predict", "--algorithm", "ssgd,adpsgd,hadpsgd", "--workers", "2,4,8,16", "--steps", "400"]
    argv += ["--out", str(out)]
    proc = subprocess.Popen([*PSGDLAB, *argv], stdout=subprocess.DEVNULL, text=True, **stderr)
    deadline = time.monotonic() + 60
    while not (out / ".lock").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    return argv, proc


def scenario_two_runs_one_out(tmp: Path) -> dict[str, Any]:
    out = tmp / "run"
    argv, first = _long_predict(out, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    second = _psgdlab(*argv, "--force")
    second_s = time.monotonic() - t0
    first.wait(timeout=600)
    wrong = _one_error_line(second, 2, rf"in use by pid {first.pid} \(predict\)")
    committed = (out / "complete.json").is_file() and json.loads((out / "summary.json").read_text())["rows"]
    return {"ok": wrong is None and first.returncode == 0 and bool(committed), "why": wrong, "refused_in_s": second_s}


def scenario_killed_predict(tmp: Path) -> dict[str, Any]:
    out = tmp / "run"
    argv, proc = _long_predict(out, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    workers = _children(proc.pid)
    proc.kill()
    proc.wait()
    workers_gone = _gone_after(workers, time.monotonic(), DEATH_WITHIN_S)
    compared = _psgdlab("compare", str(out), str(out))
    refused = _one_error_line(compared, 2, "incomplete|not a psgdlab run directory")
    again = _psgdlab(*argv[:-1], str(out), "--steps", "4", "--force")
    said = any(line.startswith(f"psgdlab: {out}:") and "stale lock" in line for line in _lines(again.stderr))
    ok = refused is None and again.returncode == 0 and said and (out / "complete.json").is_file()
    ok = ok and workers_gone is not None
    return {
        "ok": ok,
        "compare": refused,
        "next_run_said_what_it_cleaned": said,
        "pool_workers": len(workers),
        "pool_workers_gone_after_s": workers_gone,
    }


def _children(pid: int) -> list[tuple[int, int | None]]:
    """The processes whose parent is ``pid`` (pid, start time), from ``/proc``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append((int(stat.parent.name), process_start_time(int(stat.parent.name))))
    return found


def _tmpfs(tmp: Path, size: str = "64k") -> Path | None:
    mount = tmp / "tmpfs"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    return mount if made.returncode == 0 else None


def _full_disk(tmp: Path, *argv: str) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"ok": None, "why": "needs root"}
    mount = _tmpfs(tmp)
    if mount is None:
        return {"ok": None, "why": "cannot mount a tmpfs"}
    try:
        done = _psgdlab(*[a.format(mount=mount) for a in argv])
        wrong = _one_error_line(done, 1, "No space left on device")
        complete = list(mount.rglob("complete.json"))
        partial = list(mount.rglob(".*.tmp*"))
        ok = wrong is None and not complete and not partial
        return {"ok": ok, "why": wrong, "data_lost": bool(complete), "partial_files": len(partial)}
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def scenario_another_users_out(tmp: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"ok": None, "why": "needs root"}
    theirs = tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, 54321, 54321)
    wrong = []
    for out in (theirs, theirs / "new"):
        done = _psgdlab("predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "4", "--out", str(out))
        wrong.append(_one_error_line(done, 2, "owned by another user"))
    return {"ok": all(w is None for w in wrong), "why": [w for w in wrong if w]}


def scenario_ctrl_c_train(tmp: Path) -> dict[str, Any]:
    out = tmp / "run"
    argv = _train(out, "--algorithm", "ssgd", "--steps", "100000", "--compute-time", "0.02")
    proc = subprocess.Popen(
        [*PSGDLAB, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    pids = _wait_pids(out, 2, proc)
    deadline = time.monotonic() + 120
    while pids and not (out / "checkpoints" / "run.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    _, err = proc.communicate(timeout=120)
    lines = _lines(err)
    said = [line for line in lines if line.startswith("psgdlab")]
    ok = "Traceback" not in err and len(said) == 1 and INTERRUPTED.match(said[0]) is not None
    return {"ok": ok and proc.returncode == 130, "status": proc.returncode, "lines": said[:3]}


def scenario_sigstop_rank(tmp: Path) -> dict[str, Any]:
    out = tmp / "run"
    argv = [*_train(out, "--algorithm", "ssgd", "--steps", "100000", "--compute-time", "0.02"), "--timeout", "5"]
    proc = subprocess.Popen([*PSGDLAB, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pids = _wait_pids(out, 2, proc)
    deadline = time.monotonic() + 120
    while pids and not (out / "checkpoints" / "run.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not pids:
        proc.kill()
        return {"ok": False, "why": "the ranks did not start"}
    os.kill(pids[1], signal.SIGSTOP)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"ok": False, "why": "hang"}
    lines = _lines(err)
    ok = "Traceback" not in err and proc.returncode == 1 and "rank 1 was stopped" in lines[-1]
    return {"ok": ok, "status": proc.returncode, "line": lines[-1] if lines else ""}


def scenario_nan_loss(tmp: Path) -> dict[str, Any]:
    done = _psgdlab(*_train(tmp / "run", "--algorithm", "ssgd", "--lr", "1000", "--steps", "400"))
    wrong = _one_error_line(done, 1, r"rank \d: the loss became non-finite \(\w+\) at step \d+")
    return {"ok": wrong is None and not (tmp / "run" / "complete.json").exists(), "why": wrong}


def scenario_nan_features(tmp: Path) -> dict[str, Any]:
    import h5py
    import numpy as np

    from psgdlab.models.data import synthetic_corpus

    corpus = synthetic_corpus(tmp / "c.h5", n_utterances=16, seed=0)
    with h5py.File(corpus, "a") as f:
        f["features"][5, 3] = np.nan
    t0 = time.monotonic()
    done = _psgdlab("train", "--steps", "2", "--data", str(corpus), "--out", str(tmp / "run"))
    wrong = _one_error_line(done, 2, "non-finite")
    return {"ok": wrong is None and not (tmp / "run").exists(), "why": wrong, "wall_s": time.monotonic() - t0}


def scenario_spawn_sigint(tmp: Path) -> dict[str, Any]:
    out = tmp / "run"
    argv = _train(out, "--algorithm", "ssgd", "--steps", "100000", "--compute-time", "0.02")
    argv[argv.index("--workers") + 1] = "8"
    proc = subprocess.Popen([*PSGDLAB, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    first = out / ".ranks" / "rank0.pid"
    while not (first.is_file() and first.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=120)
    ranks = []
    for f in (out / ".ranks").glob("rank*.pid"):
        text = f.read_text().strip()
        if text.isdigit():
            ranks.append((int(text), process_start_time(int(text))))
    gone = _gone_after([r for r in ranks if r[1] is not None], sent, DEATH_WITHIN_S)
    lines = _lines(err)
    ok = gone is not None and "Traceback" not in err and bool(lines) and INTERRUPTED.match(lines[-1]) is not None
    ok = ok and proc.returncode == 130
    return {
        "ok": ok,
        "status": proc.returncode,
        "ranks_started": len(ranks),
        "gone_after_s": gone,
        "line": lines[-1] if lines else "",
    }


def scenario_huge_steps(tmp: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    done = _psgdlab("predict", "--steps", "1000000000", "--out", str(tmp / "run"))
    wall = time.monotonic() - t0
    wrong = _one_error_line(done, 2, r"steps \(1000000000\)")
    return {"ok": wrong is None and wall < 60 and not (tmp / "run").exists(), "why": wrong, "answered_in_s": wall}


def run_scenarios(root: Path) -> dict[str, Any]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0 and os.geteuid() == 0
    scenarios = {
        "planted-links": scenario_planted_links,
        "malicious-checkpoint": scenario_malicious_checkpoint,
        "launcher-sigkill": lambda t: scenario_launcher_sigkill(t, 1),
        "launcher-sigkill-emulated-hosts": (
            (lambda t: scenario_launcher_sigkill(t, 2)) if netns else (lambda t: {"ok": None, "why": "needs netns"})
        ),
        "predict-out-train-run": scenario_predict_out_train_run,
        "two-runs-one-out": scenario_two_runs_one_out,
        "killed-predict": scenario_killed_predict,
        "full-disk-predict": lambda t: _full_disk(
            t, "predict", "--algorithm", "ssgd,adpsgd", "--workers", "2,4", "--out", "{mount}/p"
        ),
        "full-disk-hdf5": lambda t: _full_disk(t, "data", "synthetic", "--utterances", "2000", "--out", "{mount}/s.h5"),
        "full-disk-train": lambda t: _full_disk(
            t,
            *_train(
                Path("{mount}") / "t",
                "--algorithm",
                "ssgd",
                "--steps",
                "40",
                "--checkpoint-every",
                "1",
                "--lsq-dim",
                "20000",
            ),
        ),
        "another-users-out": scenario_another_users_out,
        "ctrl-c-train": scenario_ctrl_c_train,
        "sigstop-rank": scenario_sigstop_rank,
        "nan-loss": scenario_nan_loss,
        "nan-features": scenario_nan_features,
        "spawn-sigint": scenario_spawn_sigint,
        "huge-steps": scenario_huge_steps,
    }
    records = {}
    for name, run in scenarios.items():
        folder = root / name
        folder.mkdir()
        t0 = time.monotonic()
        try:
            record = run(folder)
        except Exception as exc:
            record = {"ok": False, "why": f"{type(exc).__name__}: {exc}"}
        record["wall_s"] = round(time.monotonic() - t0, 2)
        records[name] = record
        print(f"  {name:34s} {'pass' if record['ok'] else 'skip' if record['ok'] is None else 'FAIL'}", file=sys.stderr)
    ran = [r for r in records.values() if r["ok"] is not None]
    return {
        "scenarios": len(ran),
        "passed": sum(1 for r in ran if r["ok"]),
        "skipped": len(records) - len(ran),
        "data_lost": sum(1 for r in ran if r.get("data_lost")),
        "records": records,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="inputs run side by side (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before an input counts as a hang")
    parser.add_argument("--only", choices=("inputs", "scenarios"), help="run only one half")
    parser.add_argument("--json", action="store_true", help="print every record as one JSON object")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="psgdlab-probe-") as tmp:
        if args.only != "scenarios":
            print(f"{len(INPUTS)} inputs ...", file=sys.stderr)
            result["inputs"] = run_inputs(args, Path(tmp) / "inputs")
        if args.only != "inputs":
            print("scenarios ...", file=sys.stderr)
            (Path(tmp) / "scenarios").mkdir()
            result["scenarios"] = run_scenarios(Path(tmp) / "scenarios")
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    if "inputs" in result:
        r = result["inputs"]
        print(
            f"inputs: {r['inputs']} ({r['skipped_needs_root']} skipped: need root); one-line errors "
            f"{r['one_line_percent']:.1f} %; tracebacks {r['tracebacks']}; wrong inputs accepted {r['accepted']}; "
            f"hangs {r['hangs']}; crashes {r['crashes']}; other {r['other'] or 0}; files left in the cwd "
            f"{r['left_files_in_cwd'] or 0}; median wall {r['wall_p50_s']:.2f} s"
        )
        for f in r["failed"]:
            print(f"  {f['verdict']:12s} {f['name']}: {f.get('line', '')}")
    if "scenarios" in result:
        s = result["scenarios"]
        print(
            f"scenarios: {s['scenarios']} run ({s['skipped']} skipped), {s['passed']} passed, data lost "
            f"{s['data_lost']}"
        )
        for name, rec in s["records"].items():
            state = "pass" if rec["ok"] else "skip" if rec["ok"] is None else "FAIL"
            extra = {k: v for k, v in rec.items() if k not in ("ok",)}
            print(f"  {state:4s} {name:34s} {json.dumps(extra, default=str)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
