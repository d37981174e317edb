"""psgdlab.analysis: compare run directories -- prediction against measurement.

It reads only what the simulator and the runtime write to disk (``summary.json``,
``config.resolved.json``, ``trace.npz``); it never imports :mod:`psgdlab.sim` or
:mod:`psgdlab.runtime`, so a comparison is between artefacts, not between code paths.

Modules: :mod:`~psgdlab.analysis.load` (run directories and their cases),
:mod:`~psgdlab.analysis.compare` (errors per case), :mod:`~psgdlab.analysis.calibrate`
(a platform profile from measured runs: :mod:`~psgdlab.analysis.samples` reads them,
:mod:`~psgdlab.analysis.fits` and :mod:`~psgdlab.analysis.cores` fit the cost laws,
:mod:`~psgdlab.analysis.probe` the links and CPU work from a probe of the transport),
:mod:`~psgdlab.analysis.figures` and :mod:`~psgdlab.analysis.report`.
"""

from __future__ import annotations

import importlib
from typing import Any

#: the package's names and their modules, imported on first use: a command that draws a figure
#: does not pay for scipy.stats, which only the fits need
_LAZY = {
    "Run": "load",
    "load_run": "load",
    "load_cases": "load",
    "compare_cases": "compare",
    "compare_dirs": "compare",
    "total_variation": "compare",
    "fit_compute_time": "fits",
    "fit_link": "fits",
    "calibrate_runs": "calibrate",
    "platform_profile": "calibrate",
    "fit_probe": "probe",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
