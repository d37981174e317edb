"""The prediction-only install (``pip install 'psgdlab[sim]'``: no torch, no MPI) runs the
prediction commands: ``predict``, ``plan``, ``topology``, ``preset`` and ``workload`` import
none of torch, mpi4py or h5py. Each command runs in a fresh interpreter where importing any of
them fails, as in an environment that lacks them (a fresh venv is too slow for the suite; the
install itself was checked by hand, README "Install")."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: what the prediction-only install does not have
ABSENT = ("torch", "mpi4py", "mpich", "h5py", "kaldiio", "jiwer")

RUN = """
import sys

class Absent:  # `import name` raises ModuleNotFoundError, as where it is not installed
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in {absent!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Absent)
from psgdlab.cli import main
code = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {absent!r})
assert not loaded, loaded
raise SystemExit(code)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--algorithm", "ssgd,adpsgd", "--workers", "2,4", "--steps", "20", "--json", "--out", "{tmp}/p"],
        ["plan", "--max-gpus", "4", "--algorithm", "ssgd", "--json", "--no-figures", "--out", "{tmp}/plan"],
        ["topology", "fixed-ring", "--workers", "8", "--json"],
        ["preset", "list"],
        ["preset", "show", "h100-sxm-ndr"],
        ["workload", "show", "bilstm-43m"],
    ],
    ids=lambda argv: argv[0] + ("-" + argv[1] if argv[0] in ("preset", "workload") else ""),
)
def test_the_prediction_commands_run_without_torch_or_mpi(argv, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = subprocess.run(
        [sys.executable, "-c", RUN.format(absent=ABSENT), *argv], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip()


@pytest.mark.parametrize("command", ["train", "emulate"])
def test_train_and_emulate_there_say_what_is_missing_in_one_line(command, tmp_path):
    argv = [command, "--algorithm", "ssgd", "--workers", "2", "--model", "least-squares", "--steps", "2"]
    argv += ["--out", str(tmp_path / "run")]
    out = subprocess.run(
        [sys.executable, "-c", RUN.format(absent=ABSENT), *argv], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"psgdlab: error: psgdlab {command} needs torch, which this environment lacks (a prediction-only "
        "install, psgdlab[sim]): pip install 'psgdlab[runtime]' (docs/install.md)"
    ]
    assert not (tmp_path / "run").exists()
