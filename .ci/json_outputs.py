"""Record every command's ``--json`` output and the ``summary.json`` files it writes, and compare
two recordings: the check that a change of how results are built keeps their keys and values.

Three steps::

    python .ci/json_outputs.py fixture DIR          # once: the measured inputs (train runs, a tiny
                                                    # validate, a probe) that later steps only read
    python .ci/json_outputs.py record DIR OUT.json  # every command's --json on DIR's inputs (outputs
                                                    # under DIR/out, removed first: the same paths each time)
    python .ci/json_outputs.py compare BEFORE.json AFTER.json

``record`` runs each command in its own ``python -m psgdlab`` process. The simulator is seeded and
the fits read fixed runs, so the same inputs give the same values; what measures this machine
(``train``, a fresh probe) or the clock (``wall_s``, the environment's time) is compared by its
keys and value types only (:data:`MEASURED`, :data:`VOLATILE`). A TOML profile written on the way
is compared by its tables; its notes (comments) are text a change may reword, and ``compare`` says
where they differ. ``compare`` prints every path whose key is missing, added or whose value
differs, and exits 1 if any is not an allowed addition (:func:`added`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

#: keys whose values depend on the clock: compared by presence and type only
VOLATILE = {"wall_s", "time_utc"}
#: commands that measure this machine: every value compared by type only
MEASURED = {"train", "train/summary.json", "calibrate --probe"}


#: top-level keys a recording after the change may add: every document gains ``schema_version``;
#: a summary.json (and train's and emulate's --json, which print theirs) its header's ``kind``;
#: plan's summary.json, which had no header, its ``source`` too
#: fit --json also gains what its text shows (FitResult: one source for both)
def added(name: str) -> tuple[str, ...]:
    if name.endswith("summary.json") or name in ("train", "emulate"):
        return ("schema_version", "kind", "source") if name == "plan/summary.json" else ("schema_version", "kind")
    if name == "fit":
        return ("schema_version", "prior", "prior_log_sd", "noise", "logo_by_grouping")
    return ("schema_version",)


def _psgdlab(*argv: str, cwd: Path) -> Any:
    # one hash seed: a sum over a set of strings (a histogram's keys) is then summed in one order
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run([PY, "-m", "psgdlab", *argv], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"psgdlab {' '.join(argv)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout) if "--json" in argv else None


FIGURES_CSV = "algorithm,workers,batch,period,step_time_s\nssgd,2,32,,0.12\nssgd,4,32,,0.15\n"
BASE_TOML = """
[platform]
devices_per_host = 4
device_flops_per_s = 1e12
compute_efficiency = 0.5
[platform.pcie]
latency_s = 1e-5
bandwidth_bytes_per_s = 1e9
efficiency = 0.5
[workload]
n_params = 2000000
flops_per_sample = 1e7
compute = "lognormal:0.1:0.02"
reference_batch = 32
batch_per_worker = 32
"""


def fixture(d: Path) -> None:
    """The measured inputs: a tiny validate (its calibration runs and cases), a train run, a probe."""
    d.mkdir(parents=True, exist_ok=True)
    tiny = [
        "--steps",
        "15",
        "--lsq-dim",
        "2000",
        "--calibration-runs",
        "1",
        "--prediction-seeds",
        "1",
        "--remeasure",
        "0",
    ]
    _psgdlab(
        "validate",
        "--algorithm",
        "ssgd,adpsgd",
        "--variant",
        "fixed",
        "--workers",
        "2",
        *tiny,
        "--out",
        str(d / "v"),
        cwd=d,
    )
    _psgdlab("calibrate", "--probe", "--probe-out", str(d / "probe"), "--repeats", "3", "--sizes", "8k,64k", cwd=d)
    (d / "figures.csv").write_text(FIGURES_CSV)
    (d / "base.toml").write_text(BASE_TOML)
    nccl_logs(d / "nccl")


def nccl_logs(d: Path) -> None:
    """The nccl-tests logs of the tests' cluster (one node of 8 and two nodes of 8, 2 % noise)."""
    sys.path.insert(0, str(ROOT))
    from tests.analysis.test_nccl_tests import BETWEEN, INSIDE, nccl_log

    d.mkdir(parents=True, exist_ok=True)
    for key, args in {
        "ar1": ("all_reduce", 1, 8, *INSIDE["all_reduce"]),
        "sr1": ("sendrecv", 1, 2, *INSIDE["sendrecv"]),
        "ar2": ("all_reduce", 2, 8, *BETWEEN["all_reduce"]),
        "sr2": ("sendrecv", 2, 1, *BETWEEN["sendrecv"]),
    }.items():
        (d / f"{key}.log").write_text(nccl_log(*args, noise=0.02, seed=len(key) + ord(key[0])))


def record(d: Path, path: Path) -> None:
    """Every command's ``--json`` output on ``d``'s inputs, and the summaries they write."""
    out = d / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    doc: dict[str, Any] = {}
    small = ["--algorithm", "ssgd,adpsgd,hadpsgd", "--workers", "1,2,8", "--steps", "20", "--jobs", "1"]
    doc["predict"] = _psgdlab("predict", *small, "--out", str(out / "predict"), "--json", cwd=d)
    doc["predict --target"] = _psgdlab(
        "predict", *small, "--target", "wer=7.8", "--out", str(out / "target"), "--json", cwd=d
    )
    doc["predict --fail"] = _psgdlab(
        "predict",
        *["--algorithm", "adpsgd", "--workers", "4", "--steps", "20", "--jobs", "1", "--fail", "1@600"],
        *["--preset", "librispeech-gtx1080", "--out", str(out / "fail"), "--json"],
        cwd=d,
    )
    doc["predict --platform"] = _psgdlab(
        "predict", "--platform", str(d / "base.toml"), *small[:2], "--workers", "1,2,4", *small[4:],
        "--out", str(out / "bare"), "--json", cwd=d,
    )  # fmt: skip
    plan = ["--max-gpus", "8", "--batches", "64,1024", "--algorithm", "ssgd,hadpsgd", "--steps", "20"]
    doc["plan"] = _psgdlab("plan", *plan, "--jobs", "1", "--no-figures", "--out", str(out / "plan"), "--json", cwd=d)
    doc["emulate"] = _psgdlab(
        "emulate",
        *["--algorithm", "adpsgd", "--workers", "2", "--model", "least-squares", "--steps", "20"],
        *["--out", str(out / "emulate"), "--json"],
        cwd=d,
    )
    doc["train"] = _psgdlab(
        "train",
        *["--algorithm", "ssgd", "--workers", "2", "--model", "least-squares", "--steps", "8"],
        *["--compute-time", "0.01", "--out", str(out / "train"), "--json"],
        cwd=d,
    )
    doc["validate"] = _psgdlab(
        "validate", "--measured", str(d / "v"), "--prediction-seeds", "1", "--out", str(out / "v"), "--json", cwd=d
    )
    runs = sorted(str(p) for p in (d / "v" / "calibration").iterdir())
    doc["calibrate"] = _psgdlab("calibrate", *runs, "--out", str(out / "cal.toml"), "--json", cwd=d)
    doc["calibrate probe"] = _psgdlab(
        "calibrate", *runs, str(d / "probe"), "--out", str(out / "cal-probe.toml"), "--json", cwd=d
    )
    nccl = sorted(str(p) for p in (d / "nccl").glob("*.log"))
    doc["calibrate --nccl-tests"] = _psgdlab(
        "calibrate", "--nccl-tests", *nccl, "--out", str(out / "nccl.toml"), "--json", cwd=d
    )
    doc["fit"] = _psgdlab(
        "fit",
        *[str(d / "figures.csv"), "--platform", str(d / "base.toml"), "--fit", "platform.pcie.efficiency:0.5"],
        *["--out", str(out / "fitted.toml"), "--json"],
        cwd=d,
    )
    doc["compare"] = _psgdlab(
        "compare", str(d / "v" / "predicted"), str(d / "v" / "measured"), "--no-figures", "--out", str(out / "cmp"),
        "--json", cwd=d,
    )  # fmt: skip
    for name in ("predict", "target", "fail", "bare", "plan", "emulate", "train", "v/predicted"):
        for p in sorted((out / name).rglob("summary.json")):
            doc[f"{p.parent.relative_to(out)}/summary.json"] = json.loads(p.read_text())
    doc["v/validate.json"] = json.loads((out / "v" / "validate.json").read_text())
    for name in ("cal.toml", "cal-probe.toml", "nccl.toml", "fitted.toml"):
        doc[name] = (out / name).read_text()
    path.write_text(json.dumps(doc, indent=1, sort_keys=True))
    print(f"recorded {len(doc)} outputs into {path}")


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {prefix + "/" if prefix else "": "{}"} if not obj else {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}/{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list):
        out = {prefix + "[]": "[]"} if not obj else {}
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


def _same(a: Any, b: Any, *, loose: bool) -> bool:
    if loose:
        return type(a) is type(b) or (isinstance(a, (int, float)) and isinstance(b, (int, float)))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    bad: list[str] = []
    additions: list[str] = []
    notes: list[str] = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            bad.append(f"{name}: only {'after' if name in b else 'before'}")
            continue
        if isinstance(a[name], str):  # a TOML file: its tables must be equal; its comments (notes) are text
            if tomllib.loads(a[name]) != tomllib.loads(b[name]):
                bad.append(f"{name}: the tables differ")
            elif a[name] != b[name]:
                notes.append(f"{name}: the tables are equal; the notes (comments) differ")
            continue
        fa, fb = _flat(a[name]), _flat(b[name])
        for key in sorted(set(fa) | set(fb)):
            last = key.rsplit("/", 1)[-1].split("[", 1)[0]
            if key not in fb:
                bad.append(f"{name}: {key} missing after")
            elif key not in fa:
                top = key.split("/", 1)[0]
                (additions if top in added(name) else bad).append(f"{name}: {key} added ({fb[key]!r})")
            elif not _same(fa[key], fb[key], loose=name in MEASURED or last in VOLATILE):
                bad.append(f"{name}: {key} {fa[key]!r} -> {fb[key]!r}")
    for line in additions:
        print("allowed:", line)
    for line in notes:
        print("notes:", line)
    for line in bad:
        print("DIFFERS:", line)
    print(f"{len(set(a) | set(b))} outputs; {len(additions)} allowed additions; {len(bad)} differences")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["fixture"] and len(argv) == 2:
        fixture(Path(argv[1]).resolve())
        return 0
    if argv[:1] == ["record"] and len(argv) == 3:
        record(Path(argv[1]).resolve(), Path(argv[2]).resolve())
        return 0
    if argv[:1] == ["compare"] and len(argv) == 3:
        return compare(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
