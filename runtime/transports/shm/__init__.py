"""The shared-memory data plane of the gloo transport's co-located ranks.

- :mod:`~psgdlab.runtime.transports.shm.shm`: the plane (segments, slots, the one-copy protocol);
- :mod:`~psgdlab.runtime.transports.shm.shm_sys`: the Linux primitives it needs, through ctypes;
- :mod:`~psgdlab.runtime.transports.shm.shm_transport`: the gloo channel that uses it.
"""
