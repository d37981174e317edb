"""psgdlab.analysis: compare run directories -- prediction against measurement.

It reads only what the simulator and the runtime write to disk (``summary.json``,
``config.resolved.json``, ``trace.npz``); it never imports :mod:`psgdlab.sim` or
:mod:`psgdlab.runtime`, so a comparison is between artefacts, not between code paths.

Modules: :mod:`~psgdlab.analysis.load` (run directories and their cases),
:mod:`~psgdlab.analysis.compare` (errors per case), :mod:`~psgdlab.analysis.calibrate`
(a platform profile from measured runs: :mod:`~psgdlab.analysis.samples` reads them,
:mod:`~psgdlab.analysis.fits` and :mod:`~psgdlab.analysis.cores` fit the cost laws),
:mod:`~psgdlab.analysis.figures` and :mod:`~psgdlab.analysis.report`.
"""

from psgdlab.analysis.calibrate import calibrate_runs, platform_profile
from psgdlab.analysis.compare import compare_cases, compare_dirs, total_variation
from psgdlab.analysis.fits import fit_compute_time, fit_link
from psgdlab.analysis.load import Run, load_cases, load_run

__all__ = [
    "Run",
    "load_run",
    "load_cases",
    "compare_cases",
    "compare_dirs",
    "total_variation",
    "fit_compute_time",
    "fit_link",
    "calibrate_runs",
    "platform_profile",
]
