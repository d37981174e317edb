"""Starting ranks: the local launcher of ``psgdlab train``, emulated hosts, and the probe.

- :mod:`~psgdlab.runtime.launcher.launch`: start every rank, watch them, fail fast;
- :mod:`~psgdlab.runtime.launcher.ranks`: what every launcher gives the ranks it starts;
- :mod:`~psgdlab.runtime.launcher.lifeline`: ranks die with their launcher (a parent-death
  signal, a watch on the launcher's pidfd);
- :mod:`~psgdlab.runtime.launcher.elastic`: ``--on-failure restart``, the ranks under torchrun's
  elastic agent (a launcher that restarts them);
- :mod:`~psgdlab.runtime.launcher.netns`: emulated hosts (network namespaces, shaped links);
- :mod:`~psgdlab.runtime.launcher.hostrun`: one command on each emulated host;
- :mod:`~psgdlab.runtime.launcher.probe`: timed exchanges over a sweep of sizes, on the real
  transport.

The top of the runtime: it imports the run's configuration, the loop, the failure protocols and
the transports, and nothing below imports it. Importing :mod:`~psgdlab.runtime.launcher.launch`
loads no torch: only the ranks need it.
"""
