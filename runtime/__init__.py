"""Real training: torch models, HDF5 speech data, the speech front end, scoring and the
distributed runtime (transports, drivers, launcher).

Imports torch, h5py and (in the transports) mpi4py; nothing in :mod:`psgdlab.core` imports this
package.


Entry points: :func:`train` (per rank, any launcher), :func:`launch` (local processes, what
``psgdlab train`` calls), :class:`TrainConfig`, :class:`ModuleWorkload` (any ``nn.Module``) and
:class:`LeastSquaresWorkload`; launch lines are in ``runtime/README.md``.
"""

from typing import Any

__all__ = ["train", "launch", "TrainConfig", "ModuleWorkload", "LeastSquaresWorkload"]

_EXPORTS = {
    "train": "psgdlab.runtime.train",
    "launch": "psgdlab.runtime.launch",
    "TrainConfig": "psgdlab.runtime.config",
    "ModuleWorkload": "psgdlab.runtime.workloads",
    "LeastSquaresWorkload": "psgdlab.runtime.workloads",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'psgdlab.runtime' has no attribute {name!r}")
