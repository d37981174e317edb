"""The discrete-event simulator: any registry algorithm's schedule run on a platform model.

:func:`simulate` runs ``steps`` local steps of every worker of an algorithm on a
:class:`~psgdlab.sim.platform.Platform` with a :class:`~psgdlab.sim.workload.Workload`, moving
sizes only, and returns the trace in the shared schema (:mod:`psgdlab.core.records.trace`). What each
exchange kind does is in :mod:`psgdlab.sim.engine.simulation`; the links' laws, shares and host
cores are :mod:`psgdlab.sim.network`'s. One simulation is a worker loop over parts that each hold
their own state, and exist, or draw, only where the platform or the run uses them:

=============  ================================================================================
module         holds
=============  ================================================================================
simulation     :func:`simulate`, the worker loop (one simpy process a worker) that asks the parts
               for each exchange of each step, :func:`compute_times`
pairwise       the processes' lanes and the pairwise averages queued on them: analytical FIFO
               queues inside a host, a chain of event callbacks between hosts or where a
               process carries two averages at once
rendezvous     collectives, gossip rounds, the parameter server's queue
kernel         the environment, the trace rows, the merges (staleness), the flows over shared
               links, the scatter draws (made only where a link has a scatter)
deaths         :class:`FailureSpec` and the deaths of a run that has them: nothing is booked in a
               run without
=============  ================================================================================

It imports core, simpy and the rest of sim; nothing outside sim imports its parts, only
:func:`simulate`, :class:`SimResult`, :class:`FailureSpec` and :func:`compute_times`.
"""

from psgdlab.sim.engine.deaths import FailureSpec
from psgdlab.sim.engine.simulation import SimResult, compute_times, simulate

__all__ = ["SimResult", "FailureSpec", "simulate", "compute_times"]
