"""Dependencies point one way: core loads neither torch, simpy, mpi4py nor matplotlib."""

import subprocess
import sys

import pytest

CHECK = """
import sys
import {module}
bad = sorted(m for m in {forbidden!r} if m in sys.modules)
print(",".join(bad))
"""


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("psgdlab.core", ("torch", "simpy", "mpi4py", "matplotlib", "hypothesis", "networkx")),
        ("psgdlab.core.algorithms", ("torch", "simpy", "mpi4py", "matplotlib")),
        ("psgdlab.core.reference", ("torch", "simpy", "mpi4py", "matplotlib")),
        ("psgdlab.core.topology", ("torch", "simpy", "mpi4py", "matplotlib", "networkx")),
        ("psgdlab.cli", ("torch", "simpy", "mpi4py", "matplotlib")),
    ],
)
def test_import_does_not_load_heavy_dependencies(module, forbidden):
    out = subprocess.run([sys.executable, "-c", CHECK.format(module=module, forbidden=forbidden)],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {module} loaded {out.stdout.strip()}"


def test_analysis_does_not_import_sim_or_runtime():
    code = ("import sys, importlib.util\n"
            "if importlib.util.find_spec('psgdlab.analysis') is None: raise SystemExit(0)\n"
            "import psgdlab.analysis\n"
            "bad = [m for m in ('psgdlab.sim', 'psgdlab.runtime', 'simpy', 'torch', 'mpi4py') if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
