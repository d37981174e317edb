"""Real distributed training of the models of :mod:`psgdlab.models` on real transports.

- :mod:`~psgdlab.runtime.config` (the resolved run configuration) and
  :mod:`~psgdlab.runtime.train` (one rank's run; ``python -m psgdlab.runtime`` is its entry);
- :mod:`~psgdlab.runtime.loop`: the training loop (driver, parameter server, checkpoints);
- :mod:`~psgdlab.runtime.transports`: the transport interface and its implementations;
- :mod:`~psgdlab.runtime.failures`: the flight recorder, ``stop`` and ``continue``;
- :mod:`~psgdlab.runtime.launcher`: starting ranks (local, restarted, on emulated hosts), the probe.

Dependencies point one way: ``transports`` and ``failures`` import nothing else of the runtime,
``loop`` imports them, ``config`` imports only the backends' registry
(:mod:`~psgdlab.runtime.transports.backends`), ``launcher`` imports any of them,
and ``train`` all (``tests/test_layering.py``). Imports torch and (in the transports) mpi4py;
nothing in :mod:`psgdlab.core` or :mod:`psgdlab.models` imports this package.

Entry points: :func:`train` (per rank, any launcher), :func:`launch` (local processes, what
``psgdlab train`` calls), :class:`TrainConfig`, :class:`ModuleWorkload` (any ``nn.Module``) and
:class:`LeastSquaresWorkload`; launch lines are in ``runtime/README.md``.
"""

from typing import Any

__all__ = ["train", "launch", "TrainConfig", "ModuleWorkload", "LeastSquaresWorkload"]

_EXPORTS = {
    "train": "psgdlab.runtime.train",
    "launch": "psgdlab.runtime.launcher.launch",
    "TrainConfig": "psgdlab.runtime.config",
    "ModuleWorkload": "psgdlab.runtime.loop.workloads",
    "LeastSquaresWorkload": "psgdlab.runtime.loop.workloads",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'psgdlab.runtime' has no attribute {name!r}")
