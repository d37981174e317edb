"""Which workers mix with which: topologies, mixing matrices, spectral gaps, rebuilt rings.

- :mod:`~psgdlab.core.graphs.topology`: the topologies (static graphs and schedules of
  matchings), built by name;
- :mod:`~psgdlab.core.graphs.mixing`: mixing matrices, their validation and weight rules;
- :mod:`~psgdlab.core.graphs.spectral`: spectral gaps of matrices and schedules;
- :mod:`~psgdlab.core.graphs.membership`: a gossip topology rebuilt over the workers that survive.

Imports nothing of core but :mod:`~psgdlab.core.errors`, :mod:`~psgdlab.core.config` and
:mod:`~psgdlab.core.exchange`.
"""
