r"""The platform model: hosts with devices, link classes, and the cost of moving bytes.

A :class:`Platform` is ``hosts`` machines of ``devices_per_host`` accelerators split evenly over
``sockets_per_host`` CPU sockets. Link classes, each with a latency and a bandwidth per
direction (:class:`Link`):

- ``pcie`` -- one per socket, **shared** by the devices behind that socket (PCIe Gen3 x16 is
  16 GB/s per direction per socket on the IBM servers);
- ``nvlink`` -- optional, per device, not shared (peer-to-peer inside a host);
- ``nic`` -- one per host (100 Gb/s Ethernet = 12.5 GB/s per direction);
- ``collective`` -- optional: what a ring allreduce *inside a host* runs at, per device, when the
  implementation's collective moves bytes otherwise than its point-to-point transfers (gloo's
  TCP ring against its send/recv, a shared-memory reduction, NCCL's allreduce bus bandwidth
  against its peer-to-peer); ``None``: the per-device share of PCIe (or NVLink);
- ``server`` -- the link of the parameter-server role (its NIC), with a per-request
  ``service_overhead_s``.

Transfers that share a link share its bandwidth: each transfer registers one *flow* on every
link of its path for its duration, and gets
:math:`\min_l B_l / k_l` where :math:`k_l` counts the flows on link ``l`` when it starts
(snapshot fair share: the share is fixed when a transfer starts; later arrivals do not slow an
earlier transfer down, departures do not speed it up -- so the last of ``k`` simultaneous
transfers finishes at :math:`k S / B`, as under exact fair sharing).

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
already contains it. Holders are counted when the exchange starts (the snapshot rule of the
links). A parameter-server request holds the worker and the server (on host 0) for one message
and the server's update. The compute is not counted (emulated compute sleeps; accelerators
compute off the CPU). ``host_cpu = None`` (the default, and every published preset:
no source gives these numbers) means the cores are never the bottleneck.

``staging = "host"`` routes weights through host memory (the IBM system averaged on the
CPU): a pairwise average then costs a device-to-host copy, the network transfer, an average
on the CPU at ``host_memory_bandwidth_bytes_per_s`` (read two models, write one: :math:`3S`
bytes of memory traffic) and a host-to-device copy, one after another.

Collectives use the standard formulas, one event per collective (never one per chunk):

.. math::
    T_\text{ring}(n, S) = \frac{2(n-1)}{n}\frac{S}{B} + 2(n-1)\alpha

with :math:`B` the slowest link class on the ring (a group that spans hosts is bounded by the
NIC or by the per-device share of a socket's PCIe, whichever is smaller) and :math:`\alpha` its
largest latency.
Other schedules (``allreduce``) move the same bytes in other numbers of latency rounds:
:math:`2\lceil\log_2 n\rceil\alpha` for ``halving-doubling``, :math:`2\alpha` for ``direct``
(one host's shared memory: measured here, a 4-rank allreduce's fixed cost was no larger than a
2-rank one's, where the ring formula triples it).

Examples
--------
>>> p = Platform(hosts=8, devices_per_host=8, sockets_per_host=2,
...              pcie=Link(latency_s=0.0, bandwidth_bytes_per_s=16e9),
...              nic=Link(latency_s=0.0, bandwidth_bytes_per_s=12.5e9))
>>> round(ring_allreduce_s(8, 172.5e6, 12.5e9, 0.0) * 1e3, 1)  # ALGORITHMS.md D.4: 24.2 ms
24.2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from psgdlab.core.errors import ConfigError, require
from psgdlab.core.exchange import ALLREDUCE_ALGORITHMS, allreduce_s

__all__ = ["Link", "ServerSpec", "HostCPU", "Platform", "Placement", "ring_allreduce_s"]


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One link class: latency (seconds) and bandwidth (bytes per second, per direction)."""

    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = 1e9

    def __post_init__(self) -> None:
        require(_finite(self.latency_s) and self.latency_s >= 0, "latency_s", self.latency_s, "must be >= 0 seconds")
        require(_finite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0, "bandwidth_bytes_per_s",
                self.bandwidth_bytes_per_s, "must be a positive number of bytes per second")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSpec:
    """The parameter-server role: its link and a fixed cost per request it serves.

    Requests are served one at a time in arrival order. One request costs
    ``latency_s + S / bandwidth_bytes_per_s + service_overhead_s`` (message and reply overlap:
    full duplex, like MPI_Sendrecv) plus, with ``apply_on_host``, the server's update at host
    memory bandwidth (:math:`3S` bytes: read model and message, write model).
    """

    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = 12.5e9
    service_overhead_s: float = 0.0
    apply_on_host: bool = True

    def __post_init__(self) -> None:
        Link(latency_s=self.latency_s, bandwidth_bytes_per_s=self.bandwidth_bytes_per_s)
        require(_finite(self.service_overhead_s) and self.service_overhead_s >= 0, "service_overhead_s",
                self.service_overhead_s, "must be >= 0 seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCPU:
    """The CPU cores of a host and the CPU work of communication (module docstring, *Host cores*).

    Parameters
    ----------
    cores_per_host : int
        Cores the workers' processes of one host share, ``>= 1``.
    work_per_message_s : float
        CPU seconds one worker spends per message it sends (system calls, wake-ups, copies of
        headers), ``>= 0``.
    work_per_byte_s : float
        CPU seconds one worker spends per byte it sends (copies, reductions), ``>= 0``.
    """

    cores_per_host: int = 1
    work_per_message_s: float = 0.0
    work_per_byte_s: float = 0.0

    def __post_init__(self) -> None:
        v = self.cores_per_host
        require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, "cores_per_host", v,
                "must be an integer >= 1")
        for name in ("work_per_message_s", "work_per_byte_s"):
            x = getattr(self, name)
            require(_finite(x) and x >= 0, name, x, "must be >= 0 seconds")

    def work_s(self, messages: float, nbytes: float) -> float:
        """CPU work of one worker that sends ``messages`` messages of ``nbytes`` bytes in all."""
        return messages * self.work_per_message_s + nbytes * self.work_per_byte_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Platform:
    r"""A described cluster (see the module docstring).

    Parameters
    ----------
    name, description : str
    hosts : int
        Number of machines, ``>= 1``.
    devices_per_host : int
        Accelerators per machine.
    sockets_per_host : int
        CPU sockets per machine; devices are split evenly over them and share their PCIe link.
    device : str
        Accelerator name (documentation only).
    pcie : Link
        Per socket, per direction; shared by the devices behind the socket.
    nic : Link
        Per host, per direction.
    nvlink : Link or None
        Per device peer-to-peer link inside a host; ``None`` when absent (traffic then uses PCIe).
    collective : Link or None
        Per device latency (per round) and bandwidth of an allreduce whose group is
        inside one host; ``None`` (default): the point-to-point links' (``nvlink``, or the
        per-device share of ``pcie``). ``psgdlab calibrate`` fits it when the measured
        allreduces and pairwise exchanges disagree.
    allreduce : {"ring", "halving-doubling", "direct"}
        How the implementation schedules an allreduce, which sets its latency rounds over ``n``
        members (:func:`psgdlab.core.exchange.allreduce_rounds`: :math:`2(n-1)`,
        :math:`2\lceil\log_2 n\rceil`, 2). Default ``"ring"`` (NCCL, gloo); ``psgdlab calibrate``
        takes it from the runs (``direct`` for psgdlab's shared-memory data plane).
    host_memory_bandwidth_bytes_per_s : float
        Host memory bandwidth for CPU averaging and staging.
    model_average_s, model_average_s_per_byte : float
        Host work of folding an averaged model back into a worker after a *model* allreduce
        (BMUF's block-momentum filter, BSP's copy), :math:`a + b S` seconds for ``S`` bytes of
        model, on top of the allreduce; with ``host_cpu`` it is CPU work of every member,
        stretched like an exchange's. Default 0 (the published presets: the filter runs on the
        accelerator, small beside the allreduce); ``psgdlab calibrate`` fits it from BMUF runs.
    mix_merge_s, mix_merge_s_per_byte : float
        Host work of the training thread in a step where it folds an average back into its model:
        the active side of a pairwise average (AD-PSGD), every member of a node that takes part
        in a sharded one (H-ADPSGD; a passive node's members apply the merges after agreeing on
        them), a gossip step; :math:`a + b S` seconds for ``S`` bytes of model, after the gradient
        phase. A passive AD-PSGD side merges in its responder thread, off its step (measured here
        at 2 MB: 0.45 ms more per step on the active side than on the passive one, whose step
        overhead is that of SSGD). Default 0 (the published presets); ``psgdlab calibrate`` fits it
        from AD-PSGD runs (the active steps' overhead beyond that of runs without averages).
    step_overhead_s, step_overhead_s_per_byte : float
        Host work of every worker's step outside its compute and exchanges (the update, the
        snapshot of the weights, the loop), :math:`a + b S` seconds for ``S`` bytes of model,
        after the step's last exchange. It is not compute: a straggler's slowdown does not scale
        it (the runtime's emulated straggler slows its compute only). Default 0 (the published
        presets fold it into the compute time); ``psgdlab calibrate`` fits it.
    staging : {"direct", "host"}
        Whether weights travel GPU-direct or through host memory with CPU averaging.
    server : ServerSpec
        The parameter-server role.
    host_cpu : HostCPU or None
        The hosts' cores and the CPU work of communication; ``None`` (default): cores are never
        the bottleneck.
    """

    name: str = "custom"
    description: str = ""
    hosts: int = 1
    devices_per_host: int = 1
    sockets_per_host: int = 1
    device: str = "gpu"
    pcie: Link = field(default_factory=lambda: Link(latency_s=5e-6, bandwidth_bytes_per_s=16e9))
    nic: Link = field(default_factory=lambda: Link(latency_s=1e-5, bandwidth_bytes_per_s=12.5e9))
    nvlink: Link | None = None
    collective: Link | None = None
    allreduce: Literal["ring", "halving-doubling", "direct"] = "ring"
    host_memory_bandwidth_bytes_per_s: float = 5e10
    model_average_s: float = 0.0
    model_average_s_per_byte: float = 0.0
    mix_merge_s: float = 0.0
    mix_merge_s_per_byte: float = 0.0
    step_overhead_s: float = 0.0
    step_overhead_s_per_byte: float = 0.0
    staging: Literal["direct", "host"] = "direct"
    server: ServerSpec = field(default_factory=ServerSpec)
    host_cpu: HostCPU | None = None

    def __post_init__(self) -> None:
        for name in ("hosts", "devices_per_host", "sockets_per_host"):
            v = getattr(self, name)
            require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name, v, "must be an integer >= 1")
        require(self.devices_per_host % self.sockets_per_host == 0, "devices_per_host", self.devices_per_host,
                f"must be a multiple of sockets_per_host ({self.sockets_per_host})")
        require(_finite(self.host_memory_bandwidth_bytes_per_s) and self.host_memory_bandwidth_bytes_per_s > 0,
                "host_memory_bandwidth_bytes_per_s", self.host_memory_bandwidth_bytes_per_s,
                "must be a positive number of bytes per second")
        require(self.staging in ("direct", "host"), "staging", self.staging, "must be 'direct' or 'host'")
        require(self.allreduce in ALLREDUCE_ALGORITHMS, "allreduce", self.allreduce,
                f"must be one of {', '.join(ALLREDUCE_ALGORITHMS)}")
        for name in ("model_average_s", "model_average_s_per_byte", "mix_merge_s", "mix_merge_s_per_byte",
                     "step_overhead_s", "step_overhead_s_per_byte"):
            x = getattr(self, name)
            require(_finite(x) and x >= 0, name, x, "must be >= 0 seconds")

    @property
    def total_devices(self) -> int:
        return self.hosts * self.devices_per_host


def ring_allreduce_s(n: int, payload_bytes: float, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    r"""Ring allreduce time :math:`2(n-1)/n \cdot S/B + 2(n-1)\alpha` (0 for one member);
    other schedules: :func:`psgdlab.core.exchange.allreduce_s`."""
    return allreduce_s(n, payload_bytes, bandwidth_bytes_per_s, latency_s, "ring")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where each worker runs: ``host[r]`` and ``socket[r]`` (global socket id
    ``host * sockets_per_host + local socket``), with ``per_host`` workers per host."""

    host: tuple[int, ...]
    socket: tuple[int, ...]
    per_host: int
    hosts_used: int
    per_socket: tuple[int, ...]  # workers behind each global socket id

    @classmethod
    def pack(cls, platform: Platform, n_workers: int, per_host: int | None = None) -> "Placement":
        """Workers fill hosts ``per_host`` at a time (default: every device of a host),
        spread evenly over the sockets of each host. Raises :class:`ConfigError` when the
        platform is too small."""
        m = platform.devices_per_host if per_host is None else per_host
        m = min(m, n_workers) if per_host is None else m
        require(isinstance(m, int) and m >= 1, "gpus_per_node", m, "must be an integer >= 1")
        if m > platform.devices_per_host:
            raise ConfigError(f"gpus_per_node ({m}) must be <= the platform's devices per host "
                              f"({platform.devices_per_host}) on {platform.name}")
        hosts_used = -(-n_workers // m)
        if hosts_used > platform.hosts:
            raise ConfigError(f"workers ({n_workers}) need {hosts_used} hosts of {m} devices but {platform.name} "
                              f"has {platform.hosts} hosts; use fewer workers or a larger platform")
        k = platform.sockets_per_host
        host = tuple(r // m for r in range(n_workers))
        socket = tuple((r // m) * k + ((r % m) * k) // m for r in range(n_workers))
        per_socket = [0] * (platform.hosts * k)
        for s in socket:
            per_socket[s] += 1
        return cls(host=host, socket=socket, per_host=m, hosts_used=hosts_used, per_socket=tuple(per_socket))
