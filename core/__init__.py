"""psgdlab.core: every algorithm defined once, and the pieces every executor shares.

numpy, scipy and the standard library only (no torch, no simpy, no matplotlib): importing it
is cheap, and sim, runtime and analysis all build on it.

Modules: :mod:`~psgdlab.core.graphs.topology`, :mod:`~psgdlab.core.graphs.mixing`,
:mod:`~psgdlab.core.graphs.spectral` (topologies, mixing matrices, spectral gaps);
:mod:`~psgdlab.core.graphs.membership` (a topology rebuilt over the workers that survive);
:mod:`~psgdlab.core.platform.failure` (what a run does when a worker dies, failures ``RANK@SECONDS``
and seeded random ones);
:mod:`~psgdlab.core.algorithms` (specs, schedules and kernels, one registry, and the one builder
from flags and what the platform says);
:mod:`~psgdlab.core.platform.placement` (which rank sits on which host, device and socket);
:mod:`~psgdlab.core.exchange` (the exchange kinds and step semantics);
:mod:`~psgdlab.core.platform.cost` (the communication cost laws, forward and as the fits' design rows);
:mod:`~psgdlab.core.platform.profile` (the platform profile schema and its TOML round trip, the device's
compute law); :mod:`~psgdlab.core.platform.workloads` (named workloads apart from any platform);
:mod:`~psgdlab.core.stats.fitting` (fits of a few parameters with their uncertainty and
cross-validated errors); :mod:`~psgdlab.core.records.intervals` (prediction intervals);
:mod:`~psgdlab.core.flags` (the command-line flags every command shares);
:mod:`~psgdlab.core.records.rundir` (the run directory, and the one writer of its summary);
:mod:`~psgdlab.core.records.results` (typed results: JSON round trip, schema version);
:mod:`~psgdlab.core.records.rows` (a prediction's row and its parts); :mod:`~psgdlab.core.records.summaries`
(the summaries of a sweep and a plan);
:mod:`~psgdlab.core.replicas` (the protocol of the emulator's model replicas);
:mod:`~psgdlab.core.kernels`; :mod:`~psgdlab.core.reference` (the oracle executor and the
least-squares replicas);
:mod:`~psgdlab.core.schedules` (learning-rate recipes); :mod:`~psgdlab.core.platform.stragglers` and
:mod:`~psgdlab.core.platform.timing` (straggler and compute-time models shared by the simulator and the
runtime); :mod:`~psgdlab.core.records.trace` (the trace schema and summary); :mod:`~psgdlab.core.config`
(strict TOML/dict loading, and the one "did you mean" of a mistyped name);
:mod:`~psgdlab.core.strategies` (hypothesis strategies, needs ``hypothesis``);
:mod:`~psgdlab.core.errors`.
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
