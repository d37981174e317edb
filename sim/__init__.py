"""psgdlab.sim: the discrete-event simulator (simpy) that predicts step time, speedup, time to
train, staleness and straggler cost of every core algorithm on a described cluster.

Entry points: :func:`psgdlab.sim.engine.simulate` (one configuration -> a trace),
:func:`psgdlab.sim.predict.predict` (a sweep -> rows and a run directory), the presets in
``sim/presets/*.toml`` (:func:`psgdlab.sim.workload.load_config`).
"""
