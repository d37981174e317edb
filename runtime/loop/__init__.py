"""The training loop of one rank: the driver and the parameter server over a transport, the
workloads they train, and per-rank checkpoints.

- :mod:`~psgdlab.runtime.loop.driver`: the step loop (any algorithm of the core registry): when
  each exchange runs;
- :mod:`~psgdlab.runtime.loop.exchange`: how -- the exchange protocols (normal, surviving), the
  message transform every payload goes through, the stop the ranks agree on;
- :mod:`~psgdlab.runtime.loop.server`: the parameter server of ASGD and asynchronous EASGD;
- :mod:`~psgdlab.runtime.loop.scan`: what a rank reads from the schedule before it starts;
- :mod:`~psgdlab.runtime.loop.workloads`, :mod:`~psgdlab.runtime.loop.flat`,
  :mod:`~psgdlab.runtime.loop.overlap`: what a worker trains, its flat buffers, and the gradient
  allreduce overlapped with the backward pass;
- :mod:`~psgdlab.runtime.loop.noise`: the gradient noise scale measured as a rank trains;
- :mod:`~psgdlab.runtime.loop.checkpoint`: atomic, checksummed per-rank checkpoints.

Uses :mod:`psgdlab.runtime.transports` and :mod:`psgdlab.runtime.failures` (the flight recorder,
the survivors' protocol); never the launchers.
"""
