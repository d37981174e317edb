"""psgdlab.sim: the discrete-event simulator (simpy) that predicts step time, speedup, time to
train, staleness and straggler cost of every core algorithm on a described cluster.

Entry points: :func:`psgdlab.sim.engine.simulate` (one configuration -> a trace),
:func:`psgdlab.sim.predict.predict` (a sweep -> rows and a run directory), the presets in
``sim/presets/*.toml`` (:func:`psgdlab.sim.workload.load_config`), and
:func:`psgdlab.sim.emulate.replay` (a trace replayed on any :class:`psgdlab.core.replicas.Replicas`;
the pipeline that runs it on a torch model is :mod:`psgdlab.emulate`).
"""
