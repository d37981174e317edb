"""psgdlab: a testbed for parallel SGD training of speech acoustic models.

The Python API (:mod:`psgdlab.api`, imported on first use, so ``import psgdlab`` stays light):
:func:`predict`, :func:`plan`, :func:`load_platform`, :func:`topology` and :func:`read_run`,
taking the keyword names and values of the commands' flags.

>>> import psgdlab
>>> round(psgdlab.topology("fixed-ring", workers=4).spectral_gap, 4)
0.5

Subpackages (imported on demand):

- ``psgdlab.core``: topologies, mixing matrices, spectral gaps, every algorithm's spec,
  schedule and update kernels, the reference executor, the trace schema, hypothesis strategies;
- ``psgdlab.sim``: the discrete-event simulator and the emulator (simpy);
- ``psgdlab.runtime``: real training on torch.distributed (NCCL, gloo) and MPI;
- ``psgdlab.analysis``: comparing run directories (prediction against measurement).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "predict", "plan", "load_platform", "topology", "read_run"]

if TYPE_CHECKING:
    from psgdlab.api import load_platform, plan, predict, read_run, topology

_API = {"predict", "plan", "load_platform", "topology", "read_run"}


def __getattr__(name: str) -> Any:
    """The API's functions, imported from :mod:`psgdlab.api` on first use (PEP 562)."""
    if name in _API:
        from psgdlab import api

        return getattr(api, name)
    raise AttributeError(f"module 'psgdlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
