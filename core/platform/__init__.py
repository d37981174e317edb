"""What a cluster and a job cost: the platform profile, its cost laws and what runs on it.

- :mod:`~psgdlab.core.platform.profile`: the platform profile schema (links, host CPU, parameter
  server, workload) and its TOML round trip;
- :mod:`~psgdlab.core.platform.cost`: the communication cost laws, forward and as the fits'
  design rows;
- :mod:`~psgdlab.core.platform.workloads`: named workloads apart from any platform;
- :mod:`~psgdlab.core.platform.timing` and :mod:`~psgdlab.core.platform.stragglers`:
  compute-time and straggler models shared by the simulator and the runtime;
- :mod:`~psgdlab.core.platform.placement`: which rank sits on which host, device and socket;
- :mod:`~psgdlab.core.platform.failure`: what a run does when a worker dies, and failures;
- :mod:`~psgdlab.core.platform.machine`: what this machine gives a run (memory, parent death).

Sits above :mod:`~psgdlab.core.algorithms` (a profile fills what an algorithm's flags leave
out) and below :mod:`~psgdlab.core.records`.
"""
