r"""The platform model as the simulator uses it: placement of workers, shared links, host cores.

The profile schema (:class:`Platform`, :class:`Link`, :class:`ServerSpec`, :class:`HostCPU`) is
core's (:mod:`psgdlab.core.platform.profile`, re-exported here), and so are the cost laws
(:mod:`psgdlab.core.platform.cost`) and where workers run (:class:`Placement`, the rule of
:mod:`psgdlab.core.platform.placement` that the launcher follows too); this module says how the simulator
applies the profile (the link classes, ``pcie`` per socket, ``nic`` per host,
``nvlink`` and ``collective`` optional, ``server``, are described in :mod:`psgdlab.core.platform.profile`).

Transfers that share a link share its bandwidth: each transfer registers one *flow* on every
link of its path for its duration, and gets
:math:`\min_l B_l / k_l` where :math:`k_l` counts the flows on link ``l`` when it starts
(snapshot fair share: the share is fixed when a transfer starts; later arrivals do not slow an
earlier transfer down, departures do not speed it up -- so the last of ``k`` simultaneous
transfers finishes at :math:`k S / B`, as under exact fair sharing). The NICs, where the
transfers of asynchronous exchanges overlap most, share exactly: a pairwise average's or a
gossip's bytes between hosts move at their max-min fair rate, recomputed as transfers join and
leave (:class:`~psgdlab.sim.network.FairLinks`).

**Host cores** (``host_cpu``, optional). Where the workers' processes share a few CPU cores
-- several processes per core on a workstation, loopback transports whose every byte is a CPU
copy -- communication is limited by the host's cores as well as by its links. A
:class:`HostCPU` gives ``cores_per_host`` and the CPU work one worker spends on an exchange:
``work_per_message_s`` per message it sends and ``work_per_byte_s`` per byte it sends (a ring
allreduce over ``n`` sends :math:`2(n-1)` messages of :math:`2(n-1)/n \cdot S` bytes in all; a
pairwise average or a gossip transfer one message of :math:`S`). An exchange whose duration on
the links is :math:`T` and that starts while ``k`` worker processes of its host (its own members
on that host included) hold CPU work takes

.. math::
    T + \max(0, k/c - 1)\, W

on that host (the slowest of its hosts for a collective), with :math:`c` = ``cores_per_host``
and :math:`W` the per-worker work: ``k`` processes each needing :math:`W` of CPU on :math:`c`
cores get :math:`c/k` of a core each (processor sharing), so the CPU part stretches from
:math:`W` to :math:`kW/c`; below ``c`` holders it costs nothing beyond the link time, whose fit
already contains it. Between hosts the CPU work overlaps the bytes' time on the NICs,
:math:`w` (the copies into and out of the sockets run while earlier bytes are on the wire), so
the exchange takes :math:`T + \max(0, kW/c - \max(W, w))`: a slow NIC hides the shared cores,
a fast one does not (:func:`psgdlab.core.platform.cost.cpu_stretch_s`). A message between hosts goes
through the kernel's network stack, not a host's shared-memory plane, and costs its own CPU work
where the profile gives it (``work_per_message_between_hosts_s``,
``work_per_byte_between_hosts_s``, from a probe with one rank per host): a transfer or pairwise
average that crosses hosts, a server request from another host, and every message of a
collective whose group spans hosts (process-to-process sockets on every edge). Holders are counted when the
exchange starts (the snapshot rule of the links), per machine: the emulated hosts of one
machine (``hosts_per_machine``) share its cores. A parameter-server request holds the worker
and the server (on host 0) for one message and the server's update. A process's own host work
-- the step overhead between a step's exchanges and its next compute, the merge of an average
back by the training thread (``step_overhead_s``, ``mix_merge_s``, fitted from runs with a core
per worker) -- holds its process the same way and takes :math:`\max(1, k/c)` times its length:
the members that leave a collective together update on the shared cores together, and the
last of them starts its next compute :math:`k/c` updates later. The compute is not
counted (emulated compute sleeps; accelerators compute off the CPU). ``host_cpu = None`` (the
default, and every published preset: no source gives these numbers) means the cores are never
the bottleneck.

``staging = "host"`` routes weights through host memory (the IBM system averaged on the
CPU): a pairwise average then costs a device-to-host copy, the network transfer, an average
on the CPU at ``host_memory_bandwidth_bytes_per_s`` (read two models, write one: :math:`3S`
bytes of memory traffic) and a host-to-device copy, one after another.

Collectives use the standard formulas, one event per collective (never one per chunk):

.. math::
    T_\text{ring}(n, S) = \frac{2(n-1)}{n}\frac{S}{B} + 2(n-1)\alpha

with :math:`B` the slowest link class on the ring (a group that spans hosts is bounded by the
NIC or by the per-device share of a socket's PCIe, whichever is smaller) and :math:`\alpha` its
largest latency, counted from the last member's arrival. A ring that spans hosts and is
bound by the NICs starts earlier in part: chunks that hold no late member's contribution go
round before it arrives, so the edges between hosts have fewer chunks left when it does (a
straggler two hops from its host's edge saves the ring two of its :math:`2(n-1)` steps;
:func:`psgdlab.core.platform.cost.ring_allreduce_after_arrivals`).
Other schedules (``allreduce``) move the same bytes in other numbers of latency rounds:
:math:`2\lceil\log_2 n\rceil\alpha` for ``halving-doubling``, :math:`2\alpha` for ``direct``
(one host's shared memory, where every member reads from the others at once).

Examples
--------
>>> p = Platform(hosts=8, devices_per_host=8, sockets_per_host=2,
...              pcie=Link(latency_s=0.0, bandwidth_bytes_per_s=16e9),
...              nic=Link(latency_s=0.0, bandwidth_bytes_per_s=12.5e9))
>>> Placement.pack(p, 16).host[-1], Placement.pack(p, 16, per_host=4).hosts_used
(1, 4)
"""

from __future__ import annotations

from psgdlab.core.platform.placement import Placement
from psgdlab.core.platform.profile import HostCPU, Link, Platform, ServerSpec

__all__ = ["Link", "ServerSpec", "HostCPU", "Platform", "Placement"]
