"""The probe set of issue 45 (:mod:`psgdlab.tests.probes`): every bad input ends in one line with
its exit status and no traceback; and the fault scenarios that run in seconds: links planted for
the next thousands of process ids beside every output, a full disk (simulated, and a real tmpfs
as root), ``--out`` a run of another kind, what a killed command left, a cache directory another
user made. ``bench/bench_probe.py`` runs the inputs as processes with the slower scenarios and
prints the tallies."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psgdlab.cli import main
from psgdlab.tests import probes

ROOT = os.geteuid() == 0
#: links are planted for this process's id and this many after it
PLANTED_PIDS = 1000


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    made = probes.build_fixtures(tmp_path_factory.mktemp("probes"))
    yield made
    probes.release_fixtures()


def test_the_probe_set_holds_at_least_150_inputs_across_every_command():
    assert len(probes.INPUTS) >= 150
    assert len({p.name for p in probes.INPUTS}) == len(probes.INPUTS)
    commands = {p.argv[0] for p in probes.INPUTS}
    assert {"topology", "predict", "emulate", "train", "data", "compare", "calibrate", "plan", "validate"} <= commands


@pytest.mark.parametrize("probe", probes.INPUTS, ids=[p.name for p in probes.INPUTS])
def test_a_bad_input_ends_in_one_line(probe, fixtures, monkeypatch, tmp_path):
    if probe.needs_root and not ROOT:
        pytest.skip("another user's directory can only be made by root")
    monkeypatch.chdir(tmp_path)  # a command that wrongly ran would write its default run directory here
    outcome = probes.run_in_process(probe.args(fixtures))
    assert probes.verdict(probe, outcome) == "ok", outcome
    assert not (tmp_path / "runs").exists()


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def test_predict_into_a_train_run_is_refused_and_changes_none_of_its_files(fixtures):
    train_run = Path(fixtures["train_run"])
    before = _digests(train_run)
    for argv in (["--out", str(train_run)], ["--out", str(train_run), "--json"]):
        outcome = probes.run_in_process(["predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "4", *argv])
        assert (
            outcome.status == 2
            and "holds another run (a complete train run, with checkpoints of run" in (outcome.err_lines[-1])
        )
    assert _digests(train_run) == before
    assert sorted(p.name for p in train_run.iterdir()) == [
        "checkpoints",
        "complete.json",
        "launch.json",
        "summary.json",
    ]


def test_links_planted_for_the_next_thousands_of_pids_beside_every_output_change_nothing(tmp_path):
    """The temporary names were ``.NAME.tmpPID``: a link planted there for the writer's pid made
    its write land in the file the link points at. Links for this process and the next 1000 pids
    (``bench/bench_probe.py``: 2000) beside every file a prediction writes (the run's
    sub-directory made in advance), and links at the sub-directory's final names: nothing they
    point at changes, every output is a file of its own."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "run"
    sub = out / "runs" / "ssgd-w2"
    sub.mkdir(parents=True)
    names = (
        "config.resolved.json",
        "env.json",
        "summary.json",
        "trace.npz",
        "timeline.json",
        "speedup.png",
        "staleness.png",
        "complete.json",
    )
    me = os.getpid()
    planted = 0
    for folder in (out, sub):
        for name in names:
            for pid in range(me, me + PLANTED_PIDS + 1):
                (folder / f".{name}.tmp{pid}").symlink_to(victim)
                planted += 1
    for name in ("summary.json", "trace.npz", "env.json"):  # the final names of the sub-run too
        (sub / name).symlink_to(victim)
    assert main(["predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "4", "--out", str(out)]) == 0
    assert victim.read_text() == "precious\n" and planted == 2 * 8 * (PLANTED_PIDS + 1)
    for folder in (out, sub):
        for name in ("summary.json", "trace.npz", "env.json"):
            assert (folder / name).is_file() and not (folder / name).is_symlink()
    assert (out / "complete.json").is_file() and not (out / "complete.json").is_symlink()
    # the links under this process's id are left (its writer runs) and point where they pointed
    for folder in (out, sub):
        assert os.readlink(folder / f".summary.json.tmp{me}") == str(victim)


def test_a_full_disk_gives_one_line_and_no_directory_that_looks_complete(tmp_path, monkeypatch, capsys):
    """ENOSPC at the first, a middle and the last write of a prediction (the safe writer's one
    write path, made to fail; the last is the commit marker): exit 1, one line naming the file
    and the error, no commit marker anywhere, no temporary file left."""
    from psgdlab.core import files

    real = files._write_all
    argv = ["predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "4", "--jobs", "1"]
    writes: list[int] = []

    def counting(fd, data):
        writes.append(fd)
        real(fd, data)

    monkeypatch.setattr(files, "_write_all", counting)
    assert main([*argv, "--out", str(tmp_path / "counted")]) == 0
    total = len(writes)
    assert total > 10
    for fail_at in (1, total // 2, total):
        writes.clear()

        def failing(fd, data, fail_at=fail_at):
            writes.append(fd)
            if len(writes) == fail_at:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd, data)

        monkeypatch.setattr(files, "_write_all", failing)
        out = tmp_path / f"run{fail_at}"
        capsys.readouterr()
        assert main([*argv, "--out", str(out)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.match(rf"psgdlab: error: {out}/\S+: No space left on device$", err[0]), err
        assert not list(out.parent.glob("run*/**/complete.json")) and not list(tmp_path.rglob(".*.tmp*"))
        monkeypatch.setattr(files, "_write_all", real)
        for where in (out, out / "runs" / "ssgd-w2"):
            assert main(["compare", str(where), str(where)]) == 2  # nothing written (it went), or incomplete
            assert re.search(r"run directory .* (does not exist|is incomplete)", capsys.readouterr().err)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only): a disk that fills for real."""
    if not ROOT:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_really_full_disk_gives_one_line_for_a_prediction_and_an_hdf5_corpus(small_tmpfs):
    """On a 64 KiB tmpfs: a prediction's figures and traces do not fit (exit 1, one line, nothing
    committed); an HDF5 corpus of 4 MB crashed its writer at exit with SIGSEGV and left its
    temporary file: now one line, exit 1, nothing left."""
    run = [sys.executable, "-m", "psgdlab"]
    pred = subprocess.run(
        [*run, "predict", "--algorithm", "ssgd,adpsgd", "--workers", "2,4", "--out", str(small_tmpfs / "p")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    corpus = subprocess.run(
        [*run, "data", "synthetic", "--utterances", "2000", "--out", str(small_tmpfs / "s.h5")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    for done in (pred, corpus):
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("predict:")]
        assert done.returncode == 1, done.stderr
        assert lines[-1].startswith("psgdlab: error: ") and "No space left on device" in lines[-1], done.stderr
        assert "Traceback" not in done.stderr
    assert not list(small_tmpfs.rglob("complete.json")) and not list(small_tmpfs.rglob(".*.tmp*"))
    assert not (small_tmpfs / "s.h5").exists()


def test_the_next_command_says_what_a_killed_one_left_and_cleans_it(tmp_path, capsys):
    """A command killed while writing leaves its lock record and its temporary files: the next
    one takes the stale lock over, removes the files of writers no longer running, and says so
    in one line; a file of a writer still running is left alone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text(f"{dead.pid} 12345 predict\n")
    orphans = [
        out / f".summary.json.0123456789abcdef.tmp{dead.pid}",
        out / f".trace.npz.0123456789abcdef.tmp{dead.pid}",
    ]
    for p in orphans:
        p.write_bytes(b"half")
    mine = out / f".other.json.0123456789abcdef.tmp{os.getpid()}"
    mine.write_bytes(b"being written")
    assert main(["predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "4", "--out", str(out)]) == 0
    found = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"psgdlab: {out}:")]
    assert found == [
        f"psgdlab: {out}: a stale lock of pid {dead.pid} (predict), which no longer runs: taken over; removed 2 "
        f"temporary files left by writers no longer running (pid {dead.pid})"
    ]
    assert not any(p.exists() for p in orphans) and mine.exists()
    assert not (out / ".lock").exists() and (out / "complete.json").is_file()


def test_the_emulators_corpus_cache_must_be_the_users_alone(tmp_path, monkeypatch):
    """The emulator cached its synthetic corpus in /tmp/psgdlab-emulate-data, which another user
    could make first (and plant a corpus or a link in it): the cache is per user and refused
    unless it is theirs alone."""
    import tempfile

    from psgdlab.core.errors import ConfigError
    from psgdlab.emulate import EmulateConfig, _corpus_path

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    cache = tmp_path / f"psgdlab-emulate-data-{os.geteuid()}"
    cfg = EmulateConfig(algorithm="ssgd", workers=2, steps=2, model="tiny-blstm", synthetic_utterances=8)
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    with pytest.raises(ConfigError, match=r"is not yours alone \(owner uid \d+, mode 777\)"):
        _corpus_path(cfg)
    if ROOT:
        os.chown(cache, probes.OTHER_UID, probes.OTHER_UID)
        cache.chmod(0o700)
        with pytest.raises(ConfigError, match="owned by another user"):
            _corpus_path(cfg)
        os.chown(cache, 0, 0)
    cache.chmod(0o700)
    path = _corpus_path(cfg)
    assert path.parent == cache and path.is_file()


def test_force_empties_only_a_directory_that_holds_a_run(tmp_path):
    """``--force`` replaces a run; a directory of the user's own files (``--out ~ --force``) keeps
    them, and the run is written beside them."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    argv = ["predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "4", "--out", str(out), "--force"]
    assert main(argv) == 0
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "complete.json").is_file()
    assert main(argv) == 0  # now it holds a run: replaced, the note with it
    assert not (out / "notes.txt").exists() and (out / "complete.json").is_file()


def _children(pid: int) -> list[tuple[int, int | None]]:
    """The processes whose parent is ``pid`` (pid, start time), from ``/proc``."""
    from psgdlab.core.files import process_start_time

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(stat.parent.name)
            found.append((child, process_start_time(child)))
    return found


def test_a_killed_prediction_leaves_no_process_of_its_own(tmp_path):
    """predict simulates in a pool of forked workers; killed with SIGKILL, it left them waiting
    for work forever (each holds the work queue open for the others). They die with it."""
    from psgdlab.core.files import process_start_time

    argv = ["predict", "--algorithm", "ssgd,adpsgd,hadpsgd", "--workers", "2,4,8,16", "--steps", "4000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "psgdlab", *argv, "--jobs", "2", "--out", str(tmp_path / "run")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(children := _children(proc.pid)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no pool started"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    killed = time.monotonic()
    while any(process_start_time(pid) == start for pid, start in children):
        assert time.monotonic() - killed < 5.0, f"pool workers {children} outlived their command"
        time.sleep(0.02)
