"""Shared fixtures and hypothesis profiles.

Profiles: ``dev`` (fast, the default) and ``ci`` (more examples); choose with
``HYPOTHESIS_PROFILE=ci``. Numerical code gets ``deadline=None`` in both: eigen-solvers and
process start-up make per-example timing meaningless.
"""

from __future__ import annotations

import os
from pathlib import Path

# one BLAS thread per process: the suite runs beside other processes on 2 cores, and threaded
# BLAS made small eigen-solves tens of times slower there (must be set before numpy loads)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the BLAS thread count above)
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

REPO_ROOT = Path(__file__).resolve().parent.parent
FSDD_DIR = Path(os.environ.get("PSGDLAB_FSDD", REPO_ROOT.parent / "shared" / "data" / "fsdd"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
