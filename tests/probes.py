"""The probe set of issue 45: bad inputs a hostile or careless user gives, each of which must end
in one line on stderr (``psgdlab: error: ...`` or a usage error ``psgdlab COMMAND: error:
...``), with the exit status of its kind (2 bad input, 1 a run that failed), no traceback, and
nothing accepted that should not be.

:func:`build_fixtures` makes the files the inputs name (malformed TOML, corrupt archives, run
directories whole, incomplete and corrupt, directories of another user, a held lock);
:data:`INPUTS` are the inputs, each a :class:`Probe` whose ``argv`` names fixtures as
``{name}``; :func:`run_in_process` runs one through :func:`psgdlab.cli.main` and
:func:`verdict` says what went wrong, if anything. ``tests/test_probe.py`` runs every input in
process; ``bench/bench_probe.py`` runs them as processes (a crash or a hang shows there too),
with the fault scenarios, and prints the tallies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["Probe", "INPUTS", "build_fixtures", "release_fixtures", "run_in_process", "verdict", "Outcome", "ONE_LINE"]

#: an error line: ``psgdlab: error: ...`` or argparse's ``psgdlab COMMAND [SUB]: error: ...``
ONE_LINE = re.compile(r"^psgdlab(?: [a-z-]+)*: error: \S")
#: a uid no account of this machine has (the owner of the "another user's" fixtures)
OTHER_UID = 54321


@dataclasses.dataclass(frozen=True)
class Probe:
    """One bad input: ``argv`` (``{fixture}`` placeholders), the exit status it must end with,
    and a pattern its one line must hold. ``needs_root``: its fixture (another user's directory)
    can only be made by root."""

    name: str
    argv: tuple[str, ...]
    status: int = 2
    match: str = ""
    needs_root: bool = False

    def args(self, fixtures: dict[str, str]) -> list[str]:
        return [a.format(**fixtures) for a in self.argv]


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: int | None
    err_lines: tuple[str, ...]
    traceback: str = ""


def run_in_process(argv: Sequence[str]) -> Outcome:
    """``psgdlab ARGV`` through :func:`psgdlab.cli.main` in this process, stdout and stderr
    captured; an exception that escapes ``main`` is the traceback."""
    from psgdlab.cli import main

    err, out = io.StringIO(), io.StringIO()
    status: int | None
    tb = ""
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            status = main(list(argv))
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 2
        except BaseException as exc:
            status, tb = None, f"{type(exc).__name__}: {exc}"
    lines = tuple(line for line in err.getvalue().splitlines() if line.strip())
    if any(line.startswith("Traceback") for line in lines):
        tb = tb or "Traceback on stderr"
    return Outcome(status, lines, tb)


def verdict(probe: Probe, outcome: Outcome) -> str:
    """``ok``, or what is wrong: ``traceback``, ``accepted`` (exit 0), ``status N`` (another
    kind), ``lines N`` (not one line), ``not an error line``, ``message`` (the pattern missed)."""
    if outcome.traceback:
        return "traceback"
    if outcome.status == 0:
        return "accepted"
    if outcome.status != probe.status:
        return f"status {outcome.status}"
    if len(outcome.err_lines) != 1:
        return f"lines {len(outcome.err_lines)}"
    line = outcome.err_lines[0]
    if not ONE_LINE.match(line):
        return "not an error line"
    if probe.match and not re.search(probe.match, line):
        return "message"
    return "ok"


def _p(name: str, argv: str, status: int = 2, match: str = "", needs_root: bool = False) -> Probe:
    return Probe(name, tuple(argv.split()), status, match, needs_root)


# one small predict, run directories cheap to simulate
_PRED = "predict --algorithm ssgd --workers 2 --steps 4"
_EMU = "emulate --algorithm ssgd --workers 2 --steps 2 --model least-squares"
_TRAIN = "train --model least-squares --steps 2"

INPUTS: tuple[Probe, ...] = (
    # ----- topology ---------------------------------------------------------------------------
    _p("topology-zero-workers", "topology ring --workers 0", match=r"workers \(0\)"),
    _p("topology-negative-workers", "topology ring --workers -3", match=r"workers \(-3\)"),
    _p("topology-ten-million", "topology ring --workers 10000000", match=r"at most 8192 .*728 TiB"),
    _p("topology-huge-int", "topology ring --workers 99999999999999999999999", match="at most 8192"),
    _p("topology-two-ring", "topology ring --workers 2", match=r"workers \(2\) must be >= 3"),
    _p("topology-unknown-kind", "topology rnig --workers 8", match="did you mean 'ring'"),
    _p("topology-odd-fixed-ring", "topology fixed-ring --workers 7", match="even"),
    _p("topology-hypercube-6", "topology hypercube --workers 6", match="power of two"),
    _p("topology-indivisible", "topology hierarchical --workers 8 --workers-per-node 3", match="divisible"),
    _p("topology-workers-text", "topology ring --workers x", match="invalid int value"),
    _p("topology-workers-float", "topology ring --workers 1e3", match="invalid int value"),
    _p("topology-no-workers", "topology ring", match="--workers"),
    _p("topology-no-kind", "topology", match="KIND|kind"),
    _p("topology-inner-static", "topology ring --workers 8 --inner random-ring", match="only applies"),
    _p("topology-inner-unknown", "topology hierarchical --workers 8 --inner tree", match="invalid choice"),
    _p("topology-negative-seed", "topology random-ring --workers 8 --seed -1", match=r"seed \(-1\)"),
    _p("topology-plot-jpg", "topology ring --workers 8 --plot out.jpg", match=r"\.png"),
    _p("topology-plot-max-2", "topology ring --workers 8 --plot {tmp}/g.png --plot-max-workers 2", match=">= 4"),
    _p("topology-plot-is-a-dir", "topology ring --workers 8 --plot {dir_png}", match="is a directory"),
    _p(
        "topology-plot-under-file", "topology ring --workers 8 --plot {afile}/g.png", match="is a file, not a directory"
    ),
    _p("topology-zero-gpus", "topology hierarchical --workers 8 --workers-per-node 0", match=r"gpus_per_node \(0\)"),
    # ----- predict: flags ---------------------------------------------------------------------
    _p("predict-workers-trailing-commas", _PRED + " --workers 2,,", match="empty item"),
    _p("predict-workers-comma", "predict --workers ,", match="at least one integer"),
    _p("predict-workers-text", "predict --workers two", match="comma-separated list of integers"),
    _p("predict-workers-zero", "predict --algorithm ssgd --workers 0 --steps 4", match=r"\(0\)"),
    _p("predict-workers-negative", "predict --algorithm ssgd --workers -4 --steps 4", match=r"-4"),
    _p("predict-workers-beyond-platform", "predict --algorithm ssgd --workers 100000 --steps 4", match="hosts"),
    _p("predict-workers-ten-million", "predict --algorithm adpsgd --workers 10000000 --steps 4", match="hosts"),
    _p("predict-algorithm-unknown", _PRED + " --algorithm nope", match="nope"),
    _p("predict-algorithm-trailing", "predict --algorithm ssgd,, --workers 2", match="empty item"),
    _p("predict-algorithm-empty", "predict --algorithm , --workers 2", match="at least one name"),
    _p("predict-steps-zero", "predict --algorithm ssgd --workers 2 --steps 0", match=r"steps \(0\)"),
    _p("predict-steps-one", "predict --algorithm ssgd --workers 2 --steps 1", match=r"steps \(1\)"),
    _p("predict-steps-negative", "predict --algorithm ssgd --workers 2 --steps -5", match=r"steps \(-5\)"),
    _p("predict-steps-float", "predict --steps 1e9", match="invalid int value"),
    _p("predict-steps-billion", "predict --algorithm ssgd --workers 2 --steps 1000000000", match="steps"),
    _p("predict-batch-zero", _PRED + " --batch 0", match=r"batch"),
    _p("predict-batch-negative", _PRED + " --batch -8", match=r"batch"),
    _p("predict-period-zero", "predict --algorithm bmuf --workers 2 --steps 4 --period 0", match=r"period \(0\)"),
    _p("predict-period-not-taken", _PRED + " --period 3", match="applies to none of ssgd"),
    _p("predict-variant-unknown", "predict --algorithm adpsgd --workers 2 --steps 4 --variant nope", match="nope"),
    _p("predict-variant-not-taken", _PRED + " --variant random", match="variant"),
    _p("predict-gpus-per-node-zero", _PRED + " --workers-per-node 0", match=r"workers-per-node \(0\)"),
    _p("predict-gpus-per-node-99", _PRED + " --workers-per-node 99", match=r"workers-per-node \(99\)"),
    _p("predict-workers-per-host-zero", _PRED + " --workers-per-host 0", match=r"workers-per-host \(0\)"),
    _p("predict-straggler-rank", _PRED + " --straggler 9:2", match="straggler"),
    _p("predict-straggler-factor-zero", _PRED + " --straggler 0:0", match="straggler|factor"),
    _p("predict-straggler-garbage", _PRED + " --straggler bogus", match="straggler"),
    _p("predict-straggler-probability", _PRED + " --straggler random:2:2", match="straggler|prob"),
    _p("predict-straggler-periodic", _PRED + " --straggler periodic:0:0:1", match="straggler|every"),
    _p("predict-seed-negative", _PRED + " --seed -1", match="seed"),
    _p("predict-jobs-zero", _PRED + " --jobs 0", match="jobs"),
    _p("predict-jobs-negative", _PRED + " --jobs -2", match="jobs"),
    _p("predict-fail-rank", _PRED + " --fail 9@10", match="9"),
    _p("predict-fail-garbage", _PRED + " --fail x", match="fail|RANK@SECONDS"),
    _p("predict-fail-negative-time", _PRED + " --fail 0@-1", match="-1"),
    _p("predict-failure-rate-negative", _PRED + " --failure-rate -1", match="failure"),
    _p("predict-failure-rate-nan", _PRED + " --failure-rate nan", match="failure|nan"),
    _p("predict-failure-rate-inf", _PRED + " --failure-rate inf", match="failure|inf"),
    _p("predict-failure-draws-alone", _PRED + " --failure-draws 5", match="needs --fail"),
    _p("predict-on-failure-unknown", _PRED + " --on-failure nope", match="invalid choice"),
    _p("predict-checkpoint-every-negative", _PRED + " --fail 1@1 --checkpoint-every -1", match="checkpoint"),
    _p("predict-target-text", _PRED + " --target wer=abc", match="target|wer"),
    _p("predict-target-metric", _PRED + " --target foo=1", match="target|foo"),
    _p("predict-target-negative", _PRED + " --target wer=-5", match="target|wer|-5"),
    _p("predict-preset-unknown", _PRED + " --preset nope", match="nope"),
    _p("predict-preset-and-platform", _PRED + " --preset x --platform y", match="not allowed with"),
    _p("predict-workload-unknown", _PRED + " --workload nope", match="nope"),
    _p("predict-workload-missing-file", _PRED + " --workload {tmp}/missing.toml", match="missing|does not exist"),
    _p("predict-workload-deep", _PRED + " --workload {deep}", match="too deeply"),
    _p("predict-workload-dir", _PRED + " --workload {dir_toml}", match="directory"),
    _p("predict-convergence-missing", _PRED + " --convergence {tmp}/nowhere", match="nowhere"),
    _p("predict-convergence-file", _PRED + " --convergence {afile}", match="not a run directory"),
    _p("predict-convergence-incomplete", _PRED + " --convergence {pred_incomplete}", match="incomplete|summary"),
    # ----- predict: platform files ------------------------------------------------------------
    _p("platform-missing", _PRED + " --platform {tmp}/missing.toml", match="does not exist"),
    _p("platform-directory", _PRED + " --platform {dir_toml}", match="is a directory"),
    _p("platform-deep-arrays", _PRED + " --platform {deep}", match="too deeply"),
    _p("platform-deep-tables", _PRED + " --platform {deep_tables}", match="nests deeper than 32"),
    _p("platform-int-beyond-64-bits", _PRED + " --platform {bigint}", match="64-bit"),
    _p("platform-inf", _PRED + " --platform {inf}", match="finite"),
    _p("platform-nan", _PRED + " --platform {nan}", match="finite"),
    _p("platform-not-utf8", _PRED + " --platform {notutf8}", match="UTF-8"),
    _p("platform-garbage", _PRED + " --platform {garbage}", match="not valid TOML"),
    _p("platform-empty", _PRED + " --platform {empty}", match=r"\[platform\]"),
    _p("platform-unknown-key", _PRED + " --platform {unknownkey}", match="unknown key"),
    _p("platform-wrong-type", _PRED + " --platform {wrongtype}", match="must be of type"),
    _p("platform-negative-latency", _PRED + " --platform {neglat}", match="latency"),
    _p("platform-zero-bandwidth", _PRED + " --platform {zerobw}", match="bandwidth"),
    _p("platform-zero-devices", _PRED + " --platform {nodevices}", match="devices"),
    _p("platform-zero-hosts", _PRED + " --platform {nohosts}", match="hosts"),
    _p("platform-huge-params", _PRED + " --platform {hugeparams}", match="64-bit|n_params"),
    # ----- run directories ---------------------------------------------------------------------
    _p("out-is-a-file", _PRED + " --out {afile}", match="not a directory"),
    _p("out-under-a-file", _PRED + " --out {afile}/sub", match="a folder on its path is a file"),
    _p("out-holds-a-train-run", _PRED + " --out {train_run}", match="holds another run .*--force"),
    _p("out-holds-a-predict-run", _PRED + " --out {pred}", match="holds another run"),
    _p("out-locked", _PRED + " --out {locked}", match=r"in use by pid \d+"),
    _p("out-lock-is-a-link", _PRED + " --out {lock_link}", match=r"\.lock is a symbolic link"),
    _p("out-of-another-user", _PRED + " --out {other_dir}", match="owned by another user", needs_root=True),
    _p("out-under-another-user", _PRED + " --out {other_dir}/new", match="owned by another user", needs_root=True),
    _p("out-link-of-another-user", _PRED + " --out {other_link}", match="another user", needs_root=True),
    _p("out-under-world-writable", _PRED + " --out {world_writable}/new", match="sticky"),
    _p("emulate-out-train-run", _EMU + " --out {train_run}", match="holds another run"),
    _p("emulate-out-file", _EMU + " --out {afile}", match="not a directory"),
    _p("plan-out-train-run", "plan --steps 4 --max-gpus 2 --out {train_run}", match="holds another run"),
    _p("train-out-predict-run", _TRAIN + " --out {pred}", match="holds another run"),
    _p("train-out-file", _TRAIN + " --out {afile}", match="not a directory"),
    _p("train-out-locked", _TRAIN + " --out {locked}", match="in use by pid"),
    _p("compare-out-file", "compare {pred} {pred} --out {afile}", match="not a directory"),
    _p("compare-out-earlier-report", "compare {pred} {pred} --out {report}", match="holds another run"),
    # ----- emulate ----------------------------------------------------------------------------
    _p("emulate-workers-zero", "emulate --algorithm ssgd --workers 0 --steps 2", match="workers"),
    _p("emulate-algorithm-unknown", "emulate --algorithm nope --workers 2 --steps 2", match="nope"),
    _p("emulate-model-unknown", "emulate --algorithm ssgd --workers 2 --steps 2 --model nope", match="nope"),
    _p("emulate-steps-zero", "emulate --algorithm ssgd --workers 2 --steps 0", match="steps"),
    _p("emulate-epochs-negative", "emulate --algorithm ssgd --workers 2 --epochs -1", match="epochs"),
    _p("emulate-lr-negative", _EMU + " --lr -1", match="lr"),
    _p("emulate-lr-nan", _EMU + " --lr nan", match="lr"),
    _p("emulate-batch-zero", _EMU + " --batch 0", match="batch"),
    _p("emulate-lsq-dim-zero", _EMU + " --lsq-dim 0", match="dim"),
    _p("emulate-period-not-taken", _EMU + " --period 3", match="does not apply"),
    _p("emulate-straggler", _EMU + " --straggler 5:2", match="straggler"),
    _p("emulate-data-missing", "emulate --algorithm ssgd --workers 2 --steps 2 --data {tmp}/no.h5", match="no.h5"),
    _p("emulate-data-not-hdf5", "emulate --algorithm ssgd --workers 2 --steps 2 --data {afile}", match="HDF5"),
    _p("emulate-data-truncated", "emulate --algorithm ssgd --workers 2 --steps 2 --data {trunc_h5}", match="HDF5"),
    _p("emulate-data-nan", "emulate --algorithm ssgd --workers 2 --steps 2 --data {nan_h5}", match="non-finite"),
    _p("emulate-platform-deep", _EMU + " --platform {deep}", match="too deeply"),
    _p("emulate-missing-workers", "emulate --algorithm ssgd", match="--workers"),
    # ----- train ------------------------------------------------------------------------------
    _p("train-workers-zero", _TRAIN + " --workers 0", match=r"workers \(0\)"),
    _p("train-workers-ten-million", _TRAIN + " --workers 10000000", match="at most 512"),
    _p("train-workers-text", _TRAIN + " --workers many", match="invalid int value"),
    _p("train-backend-unknown", _TRAIN + " --backend nope", match="invalid choice"),
    _p("train-model-unknown", "train --model nope --steps 2", match="nope"),
    _p("train-steps-zero", "train --model least-squares --steps 0", match="steps"),
    _p("train-epochs-negative", "train --model least-squares --epochs -1", match="epochs"),
    _p("train-steps-and-epochs", "train --steps 2 --epochs 1", match="not allowed with"),
    _p("train-batch-zero", _TRAIN + " --batch 0", match="batch"),
    _p("train-lr-zero", _TRAIN + " --lr 0", match="lr"),
    _p("train-lr-inf", _TRAIN + " --lr inf", match="lr"),
    _p("train-lr-nan", _TRAIN + " --lr nan", match="lr"),
    _p("train-timeout-zero", _TRAIN + " --timeout 0", match="timeout"),
    _p("train-checkpoint-every-negative", _TRAIN + " --checkpoint-every -1", match="checkpoint"),
    _p("train-hosts-zero", _TRAIN + " --hosts 0", match="hosts"),
    _p("train-hosts-999", _TRAIN + " --hosts 999", match="hosts"),
    _p("train-hosts-indivisible", _TRAIN + " --hosts 3 --workers 4", match="hosts|divide"),
    _p("train-nic-without-hosts", _TRAIN + " --nic-bandwidth 1Gbit/s", match="nic-bandwidth"),
    _p("train-nic-garbage", _TRAIN + " --hosts 2 --nic-bandwidth fast", match="fast|rate"),
    _p("train-continue-ssgd", _TRAIN + " --on-failure continue --algorithm ssgd", match="continue"),
    _p("train-max-restarts-negative", _TRAIN + " --on-failure restart --max-restarts -1", match="restarts"),
    _p("train-newbob", _TRAIN + " --lr-schedule newbob", match="newbob"),
    _p("train-lr-schedule-unknown", _TRAIN + " --lr-schedule nope", match="invalid choice"),
    _p("train-compute-time-garbage", _TRAIN + " --compute-time fast", match="compute time"),
    _p("train-straggler-rank", _TRAIN + " --straggler 9:2", match="straggler"),
    _p("train-lsq-dim-zero", _TRAIN + " --lsq-dim 0", match="dim"),
    _p("train-lsq-samples-zero", _TRAIN + " --lsq-samples 0", match="samples"),
    _p("train-gpus-per-node-zero", _TRAIN + " --workers-per-node 0", match="gpus"),
    _p("train-period-not-taken", _TRAIN + " --period 3", match="does not apply"),
    _p("train-resume-missing", "train --resume {tmp}/nowhere", match="nowhere"),
    _p("train-resume-not-a-run", "train --resume {adir}", match="config.resolved.json"),
    _p("train-resume-bad-json", "train --resume {bad_json_run}", match="JSON|Expecting"),
    _p("train-data-missing", "train --steps 2 --data {tmp}/no.h5", match="no.h5"),
    _p("train-data-not-hdf5", "train --steps 2 --data {afile}", match="HDF5"),
    _p("train-data-nan", "train --steps 2 --data {nan_h5}", match="non-finite"),
    _p("train-held-out-unknown", "train --steps 2 --data {good_h5} --held-out-speakers nobody", match="nobody"),
    _p("train-window-zero", _TRAIN + " --model tiny-blstm --window 0", match="window"),
    # ----- data -------------------------------------------------------------------------------
    _p("data-info-missing", "data info {tmp}/no.h5", match="no.h5"),
    _p("data-info-dir", "data info {adir}", match="HDF5"),
    _p("data-info-not-hdf5", "data info {afile}", match="HDF5"),
    _p("data-info-truncated", "data info {trunc_h5}", match="HDF5"),
    _p("data-synthetic-out-dir", "data synthetic --out {adir}", match="Is a directory"),
    _p("data-synthetic-out-under-file", "data synthetic --out {afile}/s.h5", match="Not a directory|exists"),
    _p("data-synthetic-zero", "data synthetic --out {tmp}/s0.h5 --utterances 0", match="utterances"),
    _p("data-synthetic-dim-zero", "data synthetic --out {tmp}/s1.h5 --dim 0", match="dim"),
    _p("data-kaldi-missing", "data kaldi {tmp}/no.ark --alignments {tmp}/no.ali --out {tmp}/k.h5", match="no"),
    _p("data-fsdd-missing", "data fsdd {tmp}/nowhere --out {tmp}/f.h5", match="nowhere"),
    _p("data-no-kind", "data", match="KIND|required"),
    # ----- compare, calibrate, fit, plan, validate --------------------------------------------
    _p("compare-missing", "compare {tmp}/a {tmp}/b", match="does not exist"),
    _p("compare-files", "compare {afile} {afile}", match="does not exist|not a"),
    _p("compare-empty-dir", "compare {adir} {pred}", match="not a psgdlab run directory"),
    _p("compare-incomplete", "compare {pred_incomplete} {pred}", match="incomplete"),
    _p("compare-corrupt-trace", "compare {pred_bad_trace} {pred}", match="not a psgdlab trace"),
    _p("compare-zip-garbage-trace", "compare {pred_zip_trace} {pred}", match="not a psgdlab trace"),
    _p("compare-bad-summary", "compare {pred_bad_summary} {pred}", match="not valid JSON"),
    _p("compare-locked-incomplete", "compare {locked_run} {pred}", match="still writing it"),
    _p("calibrate-nothing", "calibrate", match="RUN_DIR|--probe"),
    _p("calibrate-out-without-runs", "calibrate --out {tmp}/p.toml", match="RUN_DIR|--probe"),
    _p("calibrate-missing-run", "calibrate {tmp}/nowhere --out {tmp}/p.toml", match="nowhere"),
    _p("calibrate-incomplete-run", "calibrate {pred_incomplete} --out {tmp}/p.toml", match="incomplete"),
    _p("calibrate-probe-sizes", "calibrate --probe --sizes 7,16", match="multiples of 8"),
    _p("calibrate-probe-groups", "calibrate --probe --groups 1", match="groups"),
    _p("calibrate-nccl-missing", "calibrate --nccl-tests {tmp}/no.txt --out {tmp}/n.toml", match="no.txt"),
    _p("calibrate-nccl-garbage", "calibrate --nccl-tests {afile} --out {tmp}/n.toml", match="nccl|rows|row"),
    _p("fit-missing-csv", "fit {tmp}/no.csv --preset interspeech2019-v100 --fit x --out {tmp}/f.toml", match="no.csv"),
    _p(
        "fit-garbage-csv",
        "fit {afile} --preset interspeech2019-v100 --fit x --out {tmp}/f.toml",
        match="csv|CSV|column",
    ),
    _p("plan-max-gpus-zero", "plan --max-gpus 0 --out {tmp}/plan0", match="gpus"),
    _p("plan-deadline-negative", "plan --deadline -1 --out {tmp}/plan1", match="deadline"),
    _p("plan-batches-trailing", "plan --batches 32,, --out {tmp}/plan2", match="empty item"),
    _p("plan-algorithm-empty", "plan --algorithm , --out {tmp}/plan3", match="at least one name"),
    _p("validate-workers-zero", "validate --workers 0 --out {tmp}/v0", match="workers"),
    _p("validate-measured-missing", "validate --measured {tmp}/nowhere --out {tmp}/v1", match="nowhere|validate.json"),
    _p("validate-measured-incomplete", "validate --measured {validate_incomplete} --out {tmp}/v2", match="incomplete"),
    _p("validate-no-out", "validate --workers 2", match="--out"),
    _p("preset-show-unknown", "preset show nope", match="nope"),
    _p("workload-show-unknown", "workload show nope", match="nope"),
    _p("hosts-zero", "hosts --hosts 0 -- true", match="hosts"),
    _p("command-unknown", "frobnicate", match="invalid choice"),
)


# ----- fixtures ------------------------------------------------------------------------------
def _preset_text() -> str:
    from psgdlab.sim.workload import preset_path

    return preset_path("interspeech2019-v100").read_text()


def _edit(text: str, key: str, value: str) -> str:
    """The preset with the first line that sets ``key`` setting it to ``value``."""
    out, done = [], False
    for line in text.splitlines():
        if not done and re.match(rf"^{re.escape(key)}\s*=", line):
            line, done = f"{key} = {value}", True
        out.append(line)
    assert done, key
    return "\n".join(out) + "\n"


def build_fixtures(root: Path) -> dict[str, str]:
    """Make every file and directory :data:`INPUTS` names under ``root``; their paths by name.

    A committed prediction (``pred``, a real ``psgdlab predict`` of two steps) and copies of it
    made incomplete or corrupt, a train run's directory, a held lock (``locked``, held by this
    process until :func:`release_fixtures`), directories of another user (root only)."""
    from psgdlab.core.records.rundir import COMPLETE_FILE, commit_run, open_run_dir
    from psgdlab.models.data import write_corpus

    root.mkdir(parents=True, exist_ok=True)
    f: dict[str, str] = {"tmp": str(root)}

    def path(name: str, rel: str) -> Path:
        p = root / rel
        f[name] = str(p)
        return p

    path("afile", "afile.txt").write_text("not what any command reads\n")
    path("adir", "adir").mkdir()
    path("dir_png", "adir.png").mkdir()
    path("dir_toml", "adir.toml").mkdir()
    text = _preset_text()
    path("deep", "deep.toml").write_text("a = " + "[" * 50_000 + "]" * 50_000 + "\n")
    path("deep_tables", "deep_tables.toml").write_text("a = " + "{b = " * 40 + "1" + "}" * 40 + "\n")
    path("bigint", "bigint.toml").write_text(_edit(text, "hosts", "99999999999999999999999"))
    path("hugeparams", "hugeparams.toml").write_text(_edit(text, "n_params", "99999999999999999999999"))
    path("inf", "inf.toml").write_text(_edit(text, "latency_s", "inf"))
    path("nan", "nan.toml").write_text(_edit(text, "compute_efficiency", "nan"))
    path("notutf8", "notutf8.toml").write_bytes(b"[platform]\nname = '\xff\xfe'\n")
    path("garbage", "garbage.toml").write_text("[platform\nthis is = = not toml\n")
    path("empty", "empty.toml").write_text("")
    path("unknownkey", "unknownkey.toml").write_text(text.replace("[platform]\n", "[platform]\nhostz = 3\n", 1))
    path("wrongtype", "wrongtype.toml").write_text(_edit(text, "devices_per_host", '"eight"'))
    path("neglat", "neglat.toml").write_text(_edit(text, "latency_s", "-1.0"))
    path("zerobw", "zerobw.toml").write_text(_edit(text, "bandwidth_bytes_per_s", "0.0"))
    path("nodevices", "nodevices.toml").write_text(_edit(text, "devices_per_host", "0"))
    path("nohosts", "nohosts.toml").write_text(_edit(text, "hosts", "0"))
    # corpora
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((30, 4)).astype(np.float32) for _ in range(4)]
    labels = [rng.integers(0, 3, 30) for _ in range(4)]
    corpus = dict(utt_ids=["u0", "u1", "u2", "u3"], speakers=["s0", "s0", "s1", "s1"], n_classes=3, feature_kind="t")
    good = path("good_h5", "good.h5")
    write_corpus(good, features_per_utt=feats, labels_per_utt=labels, **corpus)
    nan_h5 = path("nan_h5", "nan.h5")
    shutil.copy(good, nan_h5)
    import h5py

    with h5py.File(nan_h5, "a") as h5:
        h5["features"][40, 1] = np.nan
    path("trunc_h5", "trunc.h5").write_bytes(good.read_bytes()[:300])
    # run directories
    pred = path("pred", "pred")
    outcome = run_in_process(["predict", "--algorithm", "ssgd", "--workers", "2", "--steps", "4", "--out", str(pred)])
    assert outcome.status == 0, outcome
    report = run_in_process(["compare", str(pred), str(pred), "--no-figures", "--out", str(path("report", "report"))])
    assert report.status == 0, report
    for name, change in (
        ("pred_incomplete", lambda d: (d / COMPLETE_FILE).unlink()),
        ("pred_bad_trace", lambda d: (d / "runs" / "ssgd-w2" / "trace.npz").write_bytes(b"garbage")),
        ("pred_zip_trace", lambda d: _zip_garbage(d / "runs" / "ssgd-w2" / "trace.npz")),
        ("pred_bad_summary", lambda d: (d / "runs" / "ssgd-w2" / "summary.json").write_text("{not json")),
    ):
        copy = path(name, name)
        shutil.copytree(pred, copy)
        change(copy)
    train_run = path("train_run", "train_run")
    train_run.mkdir()
    (train_run / "launch.json").write_text(json.dumps({"train": {"algorithm": "ssgd"}}))
    (train_run / "summary.json").write_text(json.dumps({"source": "runtime", "samples_per_s": 1.0}))
    (train_run / "checkpoints").mkdir()
    (train_run / "checkpoints" / "run.json").write_text(json.dumps({"run_id": "0123456789abc", "workers": 2}))
    commit_run(train_run, command="train")
    bad_json = path("bad_json_run", "bad_json_run")
    bad_json.mkdir()
    (bad_json / "config.resolved.json").write_text("{broken")
    validate_inc = path("validate_incomplete", "validate_incomplete")
    validate_inc.mkdir()
    (validate_inc / "validate.json").write_text(json.dumps({"config": {}}))
    # a held lock: a directory another command is writing
    locked = path("locked", "locked")
    held = open_run_dir(locked, command="predict")
    locked_run = path("locked_run", "locked_run")
    shutil.copytree(pred, locked_run)
    (locked_run / COMPLETE_FILE).unlink()
    held_run = open_run_dir(locked_run, command="predict", resume=True)
    _HELD.extend([held, held_run])
    lock_link = path("lock_link", "lock_link")
    lock_link.mkdir()
    (lock_link / ".lock").symlink_to(root / "afile.txt")
    ww = path("world_writable", "world_writable")
    ww.mkdir()
    ww.chmod(0o777)
    if os.geteuid() == 0:
        other = path("other_dir", "other_dir")
        other.mkdir()
        os.chown(other, OTHER_UID, OTHER_UID)
        other.chmod(0o777)
        link = path("other_link", "other_link")
        link.symlink_to(other)
        os.lchown(link, OTHER_UID, OTHER_UID)
    else:
        f["other_dir"] = f["other_link"] = str(root / "needs-root")
    return f


_HELD: list = []


def release_fixtures() -> None:
    """Release the locks :func:`build_fixtures` holds."""
    while _HELD:
        _HELD.pop().release()


def _zip_garbage(path: Path) -> None:
    """A zip archive whose members are not numpy arrays."""
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("trace.npy", b"\x93NUMPY garbage")
        z.writestr("meta.npy", b"xx")
