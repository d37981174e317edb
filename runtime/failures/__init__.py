"""What a run does when a rank dies, stops or hangs.

- :mod:`~psgdlab.runtime.failures.flight`: every rank's flight recorder and watchdog (every
  blocking wait has a deadline);
- :mod:`~psgdlab.runtime.failures.stop`: ``--on-failure stop``, what the launcher does on the
  first failure;
- :mod:`~psgdlab.runtime.failures.survive`: ``--on-failure continue``, the survivors of a gossip
  run go on without the dead.

``--on-failure restart`` is a launcher (torchrun's elastic agent restarts every rank from the
newest complete checkpoint): :mod:`psgdlab.runtime.launcher.elastic`.

Imports nothing else of the runtime: the loop and the launchers use it.
"""
