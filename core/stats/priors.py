r"""Priors of the values a calibration may not pin down: the figure a fit keeps, with its spread.

A fit that cannot separate a value from the others (one payload size, durations that do not grow
with the size on a loaded machine) keeps the value's prior and says so: the profile marks it
*unpinned* (:class:`psgdlab.core.platform.profile.Uncertainty`) with the prior's spread as its ``log_sd``,
and a prediction's interval widens by it. A prior is a value, the standard deviation of its
natural logarithm and where the value comes from.

Examples
--------
>>> round(LOOPBACK_BANDWIDTH.low(), -6), round(LOOPBACK_BANDWIDTH.high(), -6)  # one sd either side
(500000000.0, 8000000000.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from psgdlab.core.errors import require

__all__ = ["Prior", "LOOPBACK_BANDWIDTH", "LOOPBACK_LATENCY", "RUN_NOISE_CV", "STEP_NOISE_CV", "NCCL_TESTS_CV"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prior:
    """A value known before the data: ``value`` (positive), ``log_sd`` (the standard deviation
    of its natural logarithm, positive) and ``source`` (one line: where the value comes from)."""

    value: float
    log_sd: float
    source: str

    def __post_init__(self) -> None:
        require(math.isfinite(self.value) and self.value > 0, "prior value", self.value, "must be positive")
        require(math.isfinite(self.log_sd) and self.log_sd > 0, "prior log_sd", self.log_sd, "must be positive")

    def low(self) -> float:
        """The value one standard deviation below, :math:`v e^{-\\sigma}`."""
        return self.value * math.exp(-self.log_sd)

    def high(self) -> float:
        """The value one standard deviation above, :math:`v e^{\\sigma}`."""
        return self.value * math.exp(self.log_sd)


#: bandwidth of the link between worker processes of one host (shared memory or loopback): one
#: core copying the message through host memory (a few GB/s of memcpy per core on current hosts)
#: once or twice, behind the transport's synchronisation; a factor of 4 either way covers the
#: fits on this machine (docs/measurements.md, "Priors": 0.7-1.9 GB/s)
LOOPBACK_BANDWIDTH = Prior(
    value=2e9,
    log_sd=math.log(4.0),
    source="one core copying through host memory behind the transport's synchronisation; x/ 4",
)

#: latency (per message, per allreduce round) between worker processes of one host: waking a
#: waiting process and the transport's handshakes, tens of microseconds to a few milliseconds
#: on a busy host (docs/measurements.md, "Priors": 0.1-2.9 ms fitted here); a factor of 10
#: either way
LOOPBACK_LATENCY = Prior(
    value=5e-4,
    log_sd=math.log(10.0),
    source="a wake-up of a waiting process and the transport's handshakes on one host; x/ 10",
)

#: relative run-to-run scatter of one run's summary of an exchange (the median allreduce span,
#: the low quantile of pairwise durations) when the runs repeat no configuration to measure it:
#: repeated calibrations on this machine moved the allreduce's latency per round by 0.7-1.3 ms
#: (docs/validation.md)
RUN_NOISE_CV = 0.2

#: relative run-to-run scatter of a configuration's mean step time when the runs repeat none:
#: six runs each of two cases on this machine, about 0.5 % (docs/validation.md)
STEP_NOISE_CV = 0.005

#: relative scatter of one time nccl-tests prints (the mean of its ``-n`` iterations, 20 by
#: default) from one run to the next: a few per cent [INF]. It weighs the points of a fit of
#: nccl-tests output (:mod:`psgdlab.analysis.nccl_tests`), whose spreads grow by the residuals
#: where the points scatter more about the law (:func:`psgdlab.analysis.fits.fit_link`)
NCCL_TESTS_CV = 0.03
