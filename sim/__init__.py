"""psgdlab.sim: the discrete-event simulator and the emulator (real replicas replayed at the
simulated event times, :mod:`psgdlab.sim.emulate`)."""
