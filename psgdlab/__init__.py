"""psgdlab: a testbed for parallel SGD training of speech acoustic models.

Subpackages (imported on demand, so ``import psgdlab`` stays light):

- :mod:`psgdlab.core` -- topologies, mixing matrices, spectral gaps, every algorithm's spec,
  schedule and update kernels, the reference executor, the trace schema, hypothesis strategies;
- :mod:`psgdlab.sim` -- the discrete-event simulator and the emulator (simpy);
- :mod:`psgdlab.runtime` -- real training on torch.distributed (NCCL, gloo) and MPI;
- :mod:`psgdlab.analysis` -- comparing run directories (prediction against measurement).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
