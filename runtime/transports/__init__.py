"""How ranks exchange tensors: one small interface and its implementations.

- :mod:`~psgdlab.runtime.transports.transport`: the :class:`Transport` interface (imports none of
  its implementations);
- :mod:`~psgdlab.runtime.transports.torch_dist` (gloo, NCCL) and
  :mod:`~psgdlab.runtime.transports.mpi` (mpi4py): the implementations;
- :mod:`~psgdlab.runtime.transports.shm`: the shared-memory data plane of co-located gloo ranks;
- :mod:`~psgdlab.runtime.transports.channels`: the factory, the one module that knows them all;
- :mod:`~psgdlab.runtime.transports.env`: where a process sits in the job, as its launcher said;
- :mod:`~psgdlab.runtime.transports.backends`: the backends by name and what each can do (no torch).

Imports nothing else of the runtime.
"""
