"""psgdlab.core: every algorithm defined once, and the pieces every executor shares.

numpy, scipy and the standard library only (no torch, no simpy, no matplotlib): importing it
is cheap, and sim, runtime and analysis all build on it.

Folders (each imports only those below it; ``tests/test_layering.py`` keeps the rule):

- :mod:`~psgdlab.core.graphs`: topologies, mixing matrices, spectral gaps, rebuilt rings;
- :mod:`~psgdlab.core.algorithms`: one module per algorithm, one registry, and the one builder
  from flags and what the platform says;
- :mod:`~psgdlab.core.platform`: what a cluster and a job cost (the profile, the cost laws,
  workloads, compute time and stragglers, placement, failures, this machine);
- :mod:`~psgdlab.core.records`: what every executor writes and reads (trace, typed results,
  prediction intervals and rows, summaries, run directories);
- :mod:`~psgdlab.core.convergence`: the convergence model, its fits and the published profiles,
  the gradient noise scale and the time to a target read off a held-out curve;
- :mod:`~psgdlab.core.stats`: fits of a few parameters, and priors.

Modules of this folder: :mod:`~psgdlab.core.errors`; :mod:`~psgdlab.core.config` (strict
TOML/dict loading, and the one "did you mean" of a mistyped name); :mod:`~psgdlab.core.files`
(the one writer of output files); the algorithm contract every executor uses:
:mod:`~psgdlab.core.exchange` (the exchange kinds and step semantics),
:mod:`~psgdlab.core.kernels`, :mod:`~psgdlab.core.schedules` (learning-rate recipes),
:mod:`~psgdlab.core.replicas` (the protocol of the emulator's model replicas),
:mod:`~psgdlab.core.flags` (the command-line flags every command shares);
:mod:`~psgdlab.core.reference` (the oracle executor and the least-squares replicas);
:mod:`~psgdlab.core.strategies` (hypothesis strategies, needs ``hypothesis``).

Names are imported from their module (``from psgdlab.core.graphs.topology import ring``): this
package re-exports only the exceptions, so importing any part of core loads no other part.
"""

from psgdlab.core.errors import (
    ConfigError,
    InvalidMixingMatrixError,
    SimulationError,
    TestbedError,
    TestbedWarning,
    TopologyError,
    TransportError,
)

__all__ = [
    "ConfigError",
    "InvalidMixingMatrixError",
    "SimulationError",
    "TestbedError",
    "TestbedWarning",
    "TopologyError",
    "TransportError",
]
