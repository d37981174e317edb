r"""The platform profile: a cluster (links, host CPU, parameter server) and a workload, as data.

One schema for every profile the testbed reads or writes: the shipped presets
(``sim/presets/*.toml``), the profile ``psgdlab calibrate`` fits from measured runs, and the one
``python -m psgdlab.sim.fit`` fits to published tables. The simulator prices exchanges on it
(:mod:`psgdlab.core.platform.cost` holds the laws); what follows says what each parameter means.

A :class:`Platform` is ``hosts`` machines of ``devices_per_host`` accelerators split evenly over
``sockets_per_host`` CPU sockets. Link classes, each with a latency and a bandwidth per
direction (:class:`Link`):

- ``pcie`` -- one per socket, **shared** by the devices behind that socket;
- ``nvlink`` -- optional, per device, not shared (peer-to-peer inside a host);
- ``nic`` -- one per host;
- ``socket_link`` -- optional, one per host: between its sockets (QPI, UPI), shared;
- ``collective`` -- optional: what an allreduce *inside a host* runs at, per device, when the
  implementation's collective moves bytes otherwise than its point-to-point transfers (gloo's
  TCP ring against its send/recv, a shared-memory reduction, NCCL's allreduce bus bandwidth
  against its peer-to-peer); ``None``: the per-device share of PCIe (or NVLink);
- ``collective_between_hosts`` -- optional: the same for an allreduce whose group spans hosts,
  per connection, where it moves bytes otherwise than a point-to-point message between hosts
  (gloo's TCP ring against its send/recv both ways on one connection); ``None``: the NIC's;
- ``server`` (:class:`ServerSpec`) -- the link of the parameter-server role, with a per-request
  ``service_overhead_s``.

``host_cpu`` (:class:`HostCPU`, optional) gives the hosts' cores and the CPU work one worker
spends on an exchange, for hosts whose worker processes outnumber their cores
(:func:`psgdlab.core.platform.cost.cpu_stretch_s`). A :class:`Workload` is what one training job asks of
the platform; :class:`Defaults` the sweep a file suggests.

TOML layout
-----------
A :class:`Profile` reads and writes one TOML document with the tables ``[platform]`` (sub-tables
``pcie``, ``nic``, ``nvlink``, ``collective``, ``collective_between_hosts``, ``server``,
``host_cpu``), ``[workload]`` and
``[defaults]``; keys are the dataclass fields (unknown keys are rejected with the closest valid
key suggested, :func:`psgdlab.core.config.load_dataclass`). Two kinds of comment travel with the
values: ``notes``, the comment lines at the head of the file (where a profile came from, a fit's
residuals; comment lines elsewhere in a hand-written file join them), and ``provenance``, the
comment at the end of a key's or a table's line (``"platform.pcie.latency_s" -> "[INF]"``).
:meth:`Profile.to_toml` writes every field that is not ``None`` (floats by ``repr``, so they read
back exactly); :meth:`Profile.from_toml` of its output gives the same profile.

Examples
--------
>>> p = Profile(platform=Platform(hosts=2), workload=Workload(n_params=10), notes=("a test",),
...             provenance={"platform.hosts": "[INF]"})
>>> text = p.to_toml()
>>> print(text.splitlines()[0]); print(text.splitlines()[5])
# a test
hosts = 2                                # [INF]
>>> Profile.from_toml(text) == p
True
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from psgdlab.core.algorithms import PlatformFacts
from psgdlab.core.config import check_keys, closest, load_dataclass, parse_toml, read_config_text
from psgdlab.core.errors import ConfigError, require
from psgdlab.core.platform.cost import ALLREDUCE_ALGORITHMS, AllreduceAlgorithm, cpu_work_s
from psgdlab.core.platform.timing import ComputeTime

__all__ = [
    "Link",
    "ServerSpec",
    "HostCPU",
    "Platform",
    "Workload",
    "Defaults",
    "Uncertainty",
    "Profile",
    "TABLES",
    "PROCESS_DEVICE",
]

#: the top-level tables of a profile document
TABLES = ("platform", "workload", "defaults", "uncertainty")
#: the ``device`` of a platform whose devices are worker processes on CPUs (what ``psgdlab
#: calibrate`` writes for the runs of one machine): a host runs as many of them as it is given,
#: sharing its cores, as ``psgdlab train`` runs them (:func:`psgdlab.sim.workload.with_room_for`)
PROCESS_DEVICE = "cpu-process"


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _require_efficiency(name: str, x: float) -> None:
    require(_finite(x) and 0 < x <= 1, name, x, "must be an efficiency in (0, 1]")


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One link class: latency (seconds) and bandwidth (bytes per second, per direction), and the
    achieved fraction of that bandwidth, ``efficiency`` in (0, 1] (a spec-sheet bandwidth times
    what the software reaches on it; 1 when ``bandwidth_bytes_per_s`` is itself measured).

    ``scatter``: how a pairwise average over the link (on ``Platform.collective``: an allreduce
    inside a host) scatters around its law, as evenly spaced quantiles of *duration / law*
    (non-decreasing, positive; a calibration measures them,
    :func:`psgdlab.analysis.samples.pairwise_scatter`, :func:`~psgdlab.analysis.samples.allreduce_scatter`).
    The simulator draws each one's factor from them (:mod:`psgdlab.sim.engine`); ``()``: each
    takes its law."""

    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = 1e9
    efficiency: float = 1.0
    scatter: tuple[float, ...] = ()

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency

    def __post_init__(self) -> None:
        _require_efficiency("efficiency", self.efficiency)
        require(_finite(self.latency_s) and self.latency_s >= 0, "latency_s", self.latency_s, "must be >= 0 seconds")
        require(
            _finite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0,
            "bandwidth_bytes_per_s",
            self.bandwidth_bytes_per_s,
            "must be a positive number of bytes per second",
        )
        q = self.scatter
        require(
            all(_finite(x) and x > 0 for x in q) and all(a <= b for a, b in itertools.pairwise(q)) and len(q) != 1,
            "scatter",
            list(q),
            "must be positive quantiles in non-decreasing order, at least 2 (or none)",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSpec:
    """The parameter-server role: its link and a fixed cost per request it serves.

    Requests are served one at a time in arrival order. One request costs
    ``latency_s + S / (bandwidth_bytes_per_s * efficiency) + service_overhead_s`` (message and reply overlap:
    full duplex, like MPI_Sendrecv) plus, with ``apply_on_host``, the server's update at host
    memory bandwidth (:math:`3S` bytes: read model and message, write model).
    """

    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = 12.5e9
    service_overhead_s: float = 0.0
    apply_on_host: bool = True
    efficiency: float = 1.0

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency

    def __post_init__(self) -> None:
        Link(latency_s=self.latency_s, bandwidth_bytes_per_s=self.bandwidth_bytes_per_s, efficiency=self.efficiency)
        require(
            _finite(self.service_overhead_s) and self.service_overhead_s >= 0,
            "service_overhead_s",
            self.service_overhead_s,
            "must be >= 0 seconds",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCPU:
    """The CPU cores of a host and the CPU work of communication (the *Host cores* section of
    :mod:`psgdlab.sim.platform` says how the simulator applies it).

    Parameters
    ----------
    cores_per_host : int
        Cores the workers' processes of one host share, ``>= 1``.
    work_per_message_s : float
        CPU seconds one worker spends per message it sends (system calls, wake-ups, copies of
        headers), ``>= 0``.
    work_per_byte_s : float
        CPU seconds one worker spends per byte it sends (copies, reductions), ``>= 0``.
    hosts_per_machine : int
        Hosts whose processes share one machine's ``cores_per_host`` cores, ``>= 1``: 1 on a
        cluster (every host has its own cores); every emulated host of one machine
        (``psgdlab train --hosts H``: network namespaces of this machine, ``H``). Hosts
        ``h`` with the same ``h // hosts_per_machine`` count their CPU holders together.
    work_per_message_between_hosts_s, work_per_byte_between_hosts_s : float or None
        The same for a message to another host, ``>= 0``, where it differs: a socket through
        the kernel's network stack (TCP: copies into and out of socket buffers, the stack's
        processing) instead of a host's shared-memory plane, measured by a probe with one rank
        per host. ``None``: as inside a host.
    """

    cores_per_host: int = 1
    work_per_message_s: float = 0.0
    work_per_byte_s: float = 0.0
    hosts_per_machine: int = 1
    work_per_message_between_hosts_s: float | None = None
    work_per_byte_between_hosts_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("cores_per_host", "hosts_per_machine"):
            v = getattr(self, name)
            require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name, v, "must be an integer >= 1")
        for name in ("work_per_message_s", "work_per_byte_s"):
            x = getattr(self, name)
            require(_finite(x) and x >= 0, name, x, "must be >= 0 seconds")
        for name in ("work_per_message_between_hosts_s", "work_per_byte_between_hosts_s"):
            x = getattr(self, name)
            require(x is None or (_finite(x) and x >= 0), name, x, "must be >= 0 seconds (or absent: as inside a host)")

    def work_s(self, messages: float, nbytes: float, *, between_hosts: bool = False) -> float:
        """CPU work of one worker that sends ``messages`` messages of ``nbytes`` bytes in all
        (``between_hosts``: to another host, at the between-hosts work where it is given)."""
        per_message, per_byte = self.work_per_message_s, self.work_per_byte_s
        if between_hosts:
            if self.work_per_message_between_hosts_s is not None:
                per_message = self.work_per_message_between_hosts_s
            if self.work_per_byte_between_hosts_s is not None:
                per_byte = self.work_per_byte_between_hosts_s
        return cpu_work_s(messages, nbytes, per_message, per_byte)


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
    socket_fill : {"spread", "pack"}
        How the workers of a host that uses fewer than all its devices sit on its sockets:
        ``spread`` evenly over the sockets, or ``pack`` the first socket's devices first (device
        order, as ``CUDA_VISIBLE_DEVICES=0,1,2,3`` takes a two-socket server's first socket). It
        decides which workers share a socket's PCIe link.
    device : str
        Accelerator name (documentation only), or :data:`PROCESS_DEVICE`: the devices are worker
        processes on CPUs, and a host holds more of them where a prediction asks.
    pcie : Link
        Per socket, per direction; shared by the devices behind the socket.
    nic : Link
        Per host, per direction: a point-to-point message between hosts (and, without
        ``collective_between_hosts``, an allreduce that spans hosts).
    endpoints : {"device", "process"}
        What the two ends of a message between hosts are. ``device`` (default): an accelerator
        behind its socket's PCIe, so the message crosses the sender's PCIe, both NICs and the
        receiver's PCIe (latency :math:`\alpha_\text{nic} + 2\alpha_\text{pcie}`), and an
        allreduce that spans hosts runs at the slower of the NIC share and the link inside each
        host. ``process``: the workers are CPU processes that are the network's endpoints
        themselves (a CPU cluster; psgdlab's emulated hosts, TCP from process to process), so a
        message between hosts and every edge of an allreduce that spans hosts take the network
        path alone, at the NIC's latency and share.
    nvlink : Link or None
        Per device peer-to-peer link inside a host; ``None`` when absent (traffic then uses PCIe).
    socket_link : Link or None
        The link between the sockets of a host (QPI, UPI, Infinity Fabric), per direction,
        shared by every transfer between workers on different sockets of the host (a
        host-staged pairwise exchange, the edges of an allreduce that cross it); ``None``
        (default): not a bottleneck.
    collective : Link or None
        Per device latency (per round) and bandwidth of an allreduce whose group is
        inside one host; ``None`` (default): the point-to-point links' (``nvlink``, or the
        per-device share of ``pcie``). ``psgdlab calibrate`` fits it when the measured
        allreduces and pairwise exchanges disagree.
    collective_between_hosts : Link or None
        Latency (per round) and bandwidth per connection of an allreduce whose group spans
        hosts; ``None`` (default): the NIC's (``nic``, which then prices every message between
        hosts). ``psgdlab calibrate`` fits it when the allreduces and pairwise exchanges of its
        runs between hosts disagree, as it fits ``collective`` inside a host.
    allreduce : {"ring", "halving-doubling", "direct"}
        How the implementation schedules an allreduce, which sets its latency rounds over ``n``
        members (:func:`psgdlab.core.exchange.allreduce_rounds`: :math:`2(n-1)`,
        :math:`2\lceil\log_2 n\rceil`, 2). Default ``"ring"`` (NCCL, gloo); ``psgdlab calibrate``
        takes it from the runs (``direct`` for psgdlab's shared-memory data plane).
    allreduce_between_hosts : {"ring", "halving-doubling", "direct"} or None
        The schedule of an allreduce whose group spans hosts, where the implementation runs
        another one there (psgdlab's shared-memory plane inside a host, gloo's ring between
        emulated hosts); ``None`` (default): ``allreduce``. ``psgdlab calibrate`` takes it from
        runs with ranks on several hosts.
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
        phase. A passive AD-PSGD side merges in its responder thread, off its step. Default 0 (the
        published presets); ``psgdlab calibrate`` fits it from AD-PSGD runs (the active steps'
        overhead beyond that of runs without averages).
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
    device_flops_per_s, device_memory_bandwidth_bytes_per_s : float
        The accelerator's peak FLOP/s and memory bandwidth (spec sheet); 0 (default): unknown,
        and the workload's ``compute`` time is taken as given. With them and a workload that
        gives ``flops_per_sample``, the compute time follows from the device
        (:meth:`Profile.resolved`, :mod:`psgdlab.core.platform.workloads`).
    compute_efficiency, memory_efficiency : float
        Achieved fractions, in (0, 1], of the peak FLOP/s and of the memory bandwidth in a
        training step.
    input_efficiency : float
        Achieved fraction, in (0, 1], of the socket's effective PCIe bandwidth by the per-step
        input copies (``input_bytes_per_sample`` of every sample; a minibatch copied from
        pageable host memory reaches less than the large copies of the model).
    host_cpu : HostCPU or None
        The hosts' cores and the CPU work of communication; ``None`` (default): cores are never
        the bottleneck.
    failure_detection_s : float
        Seconds from a worker's death until the survivors act on it (notice it and agree on the
        new membership, or stop). Default 600 s: the runtime's deadline on a wait (``train
        --timeout``), after which a rank whose peer is silent -- a lost host, a hung process --
        gives up on it. A process killed on a host whose launcher watches it is seen within the
        launcher's poll (0.1 s): set 0.1 to price that case (:mod:`psgdlab.core.platform.failure`).
    restart_s : float
        Seconds to relaunch a run after a detected failure under ``--on-failure restart``:
        torchrun's elastic agent tears the workers down, re-runs the rendezvous and starts new
        processes (interpreter, torch and device set-up). Default 20 s (an estimate of those
        steps on one host, not a measurement); the checkpoint's reload is priced apart.
    checkpoint_bytes_per_s : float
        Bandwidth of writing or reading one worker's checkpoint (its model, ``payload_bytes``);
        every worker writes its own at once. Prices each checkpoint's write (a pause of every
        worker) and the reload after a restart. Default 1e9 (a local SSD).
    """

    name: str = "custom"
    description: str = ""
    hosts: int = 1
    devices_per_host: int = 1
    sockets_per_host: int = 1
    socket_fill: Literal["spread", "pack"] = "spread"
    device: str = "gpu"
    pcie: Link = field(default_factory=lambda: Link(latency_s=5e-6, bandwidth_bytes_per_s=16e9))
    nic: Link = field(default_factory=lambda: Link(latency_s=1e-5, bandwidth_bytes_per_s=12.5e9))
    endpoints: Literal["device", "process"] = "device"
    nvlink: Link | None = None
    socket_link: Link | None = None
    collective: Link | None = None
    collective_between_hosts: Link | None = None
    allreduce: AllreduceAlgorithm = "ring"
    allreduce_between_hosts: AllreduceAlgorithm | None = None
    host_memory_bandwidth_bytes_per_s: float = 5e10
    model_average_s: float = 0.0
    model_average_s_per_byte: float = 0.0
    mix_merge_s: float = 0.0
    mix_merge_s_per_byte: float = 0.0
    step_overhead_s: float = 0.0
    step_overhead_s_per_byte: float = 0.0
    staging: Literal["direct", "host"] = "direct"
    server: ServerSpec = field(default_factory=ServerSpec)
    device_flops_per_s: float = 0.0
    device_memory_bandwidth_bytes_per_s: float = 0.0
    compute_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    input_efficiency: float = 1.0
    host_cpu: HostCPU | None = None
    failure_detection_s: float = 600.0
    restart_s: float = 20.0
    checkpoint_bytes_per_s: float = 1e9

    def __post_init__(self) -> None:
        for name in ("device_flops_per_s", "device_memory_bandwidth_bytes_per_s"):
            x = getattr(self, name)
            require(_finite(x) and x >= 0, name, x, "must be >= 0 (0: unknown)")
        for name in ("compute_efficiency", "memory_efficiency", "input_efficiency"):
            _require_efficiency(name, getattr(self, name))
        for name in ("hosts", "devices_per_host", "sockets_per_host"):
            v = getattr(self, name)
            require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name, v, "must be an integer >= 1")
        require(
            self.devices_per_host % self.sockets_per_host == 0,
            "devices_per_host",
            self.devices_per_host,
            f"must be a multiple of sockets_per_host ({self.sockets_per_host})",
        )
        require(
            _finite(self.host_memory_bandwidth_bytes_per_s) and self.host_memory_bandwidth_bytes_per_s > 0,
            "host_memory_bandwidth_bytes_per_s",
            self.host_memory_bandwidth_bytes_per_s,
            "must be a positive number of bytes per second",
        )
        require(self.staging in ("direct", "host"), "staging", self.staging, "must be 'direct' or 'host'")
        require(self.socket_fill in ("spread", "pack"), "socket_fill", self.socket_fill, "must be 'spread' or 'pack'")
        require(self.endpoints in ("device", "process"), "endpoints", self.endpoints, "must be 'device' or 'process'")
        require(
            self.allreduce in ALLREDUCE_ALGORITHMS,
            "allreduce",
            self.allreduce,
            f"must be one of {', '.join(ALLREDUCE_ALGORITHMS)}",
        )
        require(
            self.allreduce_between_hosts is None or self.allreduce_between_hosts in ALLREDUCE_ALGORITHMS,
            "allreduce_between_hosts",
            self.allreduce_between_hosts,
            f"must be one of {', '.join(ALLREDUCE_ALGORITHMS)}",
        )
        for name in (
            "model_average_s",
            "model_average_s_per_byte",
            "mix_merge_s",
            "mix_merge_s_per_byte",
            "step_overhead_s",
            "step_overhead_s_per_byte",
            "failure_detection_s",
            "restart_s",
        ):
            x = getattr(self, name)
            require(_finite(x) and x >= 0, name, x, "must be >= 0 seconds")
        require(
            _finite(self.checkpoint_bytes_per_s) and self.checkpoint_bytes_per_s > 0,
            "checkpoint_bytes_per_s",
            self.checkpoint_bytes_per_s,
            "must be a positive number of bytes per second",
        )

    @property
    def total_devices(self) -> int:
        return self.hosts * self.devices_per_host

    @property
    def ends_latency_s(self) -> float:
        """The latency the two ends add to a message between hosts and to each round of an
        allreduce's edge between hosts, beyond ``nic`` (``collective_between_hosts``): the sender's
        and the receiver's PCIe with ``endpoints = "device"``, none where processes are the ends.

        >>> Platform(pcie=Link(latency_s=1e-6)).ends_latency_s, Platform(endpoints="process").ends_latency_s
        (2e-06, 0.0)
        """
        return 0.0 if self.endpoints == "process" else 2 * self.pcie.latency_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    r"""A training job: what one worker asks of the platform each step.

    - ``n_params`` and ``itemsize`` -- the payload :math:`S` = ``n_params * itemsize`` bytes of
      every model or gradient exchange;
    - ``compute`` -- the compute time of one step at ``reference_batch`` samples per worker, a
      distribution (:class:`psgdlab.core.platform.timing.ComputeTime` spec: ``"0.171"``,
      ``"lognormal:0.171:0.05"``, ...). At another batch ``b`` the time is scaled affinely:
      :math:`t(b) = t_0 + (\bar t - t_0)\, b / b_\text{ref}` with :math:`t_0` =
      ``compute_fixed_s`` (the part of a step that does not depend on the batch); the spread is
      scaled with it, plus an absolute jitter ``compute_jitter_s`` (seconds of standard deviation
      that do not shrink with the batch: CV :math:`\sqrt{cv^2 + (j/t(b))^2}`);
    - ``input_bytes_per_sample`` -- features copied to the device each step over the socket's PCIe
      link, which the devices behind a socket share (0 to ignore);
    - ``loader_buffer_samples``, ``loader_s_per_sample`` and ``loader_buffer_cv`` -- a host-side
      data loader that prepares features a buffer at a time: when a worker's buffer runs out, the
      worker blocks while the next one is read and prepared, ``loader_s_per_sample`` seconds per
      sample of that buffer; buffer sizes are gamma-distributed with mean
      ``loader_buffer_samples`` and CV ``loader_buffer_cv``; 0 samples means a streaming loader
      that never blocks (:func:`psgdlab.sim.workload.loader_pauses`);
    - ``samples_per_epoch``, ``epochs``, ``batch_per_worker`` and ``sample_unit`` (what one sample
      is: a 21-frame BLSTM chunk, one frame, ...);
    - ``flops_per_sample`` and ``bytes_per_step`` -- the forward and backward FLOPs of one sample
      and the device-memory bytes of a step whatever its batch (:mod:`psgdlab.core.platform.workloads`);
      0 (default): not given. With a platform that gives its device, they set the compute time
      (:meth:`Profile.resolved`).
    """

    name: str = "model"
    description: str = ""
    n_params: int = 1_000_000
    itemsize: int = 4
    compute: str = "0.1"
    reference_batch: int = 128
    batch_per_worker: int = 128
    compute_fixed_s: float = 0.0
    compute_jitter_s: float = 0.0
    input_bytes_per_sample: float = 0.0
    loader_buffer_samples: float = 0.0
    loader_s_per_sample: float = 0.0
    loader_buffer_cv: float = 0.0
    samples_per_epoch: float = 1e6
    epochs: float = 1.0
    sample_unit: str = "samples"
    flops_per_sample: float = 0.0
    bytes_per_step: float = 0.0

    def __post_init__(self) -> None:
        for name in ("flops_per_sample", "bytes_per_step"):
            x = getattr(self, name)
            require(_finite(x) and x >= 0, name, x, "must be >= 0 (0: not given)")
        require(
            isinstance(self.n_params, int) and self.n_params >= 1, "n_params", self.n_params, "must be an integer >= 1"
        )
        require(self.itemsize in (1, 2, 4, 8), "itemsize", self.itemsize, "must be 1, 2, 4 or 8 bytes")
        dist = ComputeTime.parse(self.compute)
        for name in ("reference_batch", "batch_per_worker"):
            v = getattr(self, name)
            require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name, v, "must be an integer >= 1")
        require(
            math.isfinite(self.compute_fixed_s) and 0 <= self.compute_fixed_s <= dist.mean_s,
            "compute_fixed_s",
            self.compute_fixed_s,
            f"must be in [0, the mean compute time {dist.mean_s:g} s]",
        )
        require(
            math.isfinite(self.compute_jitter_s) and self.compute_jitter_s >= 0,
            "compute_jitter_s",
            self.compute_jitter_s,
            "must be >= 0 seconds",
        )
        require(
            math.isfinite(self.input_bytes_per_sample) and self.input_bytes_per_sample >= 0,
            "input_bytes_per_sample",
            self.input_bytes_per_sample,
            "must be >= 0",
        )
        require(
            math.isfinite(self.loader_buffer_samples)
            and (self.loader_buffer_samples == 0 or self.loader_buffer_samples >= 1),
            "loader_buffer_samples",
            self.loader_buffer_samples,
            "must be 0 (streaming) or >= 1 samples",
        )
        require(
            math.isfinite(self.loader_s_per_sample) and self.loader_s_per_sample >= 0,
            "loader_s_per_sample",
            self.loader_s_per_sample,
            "must be >= 0 seconds",
        )
        require(
            math.isfinite(self.loader_buffer_cv) and 0 <= self.loader_buffer_cv <= 10,
            "loader_buffer_cv",
            self.loader_buffer_cv,
            "must be in [0, 10]",
        )
        require(self.samples_per_epoch > 0, "samples_per_epoch", self.samples_per_epoch, "must be > 0")
        require(self.epochs > 0, "epochs", self.epochs, "must be > 0")

    @property
    def payload_bytes(self) -> int:
        return self.n_params * self.itemsize

    @property
    def compute_time(self) -> ComputeTime:
        """The compute-time distribution at ``batch_per_worker`` (scaled from the reference)."""
        dist = ComputeTime.parse(self.compute)
        mean = self.mean_compute_s(self.batch_per_worker)
        if mean == dist.mean_s and self.compute_jitter_s == 0:
            return dist
        j = self.compute_jitter_s
        if dist.kind == "normal":
            spread = math.hypot(dist.spread * mean / dist.mean_s, j)
        else:
            spread = math.hypot(dist.spread, j / mean)
        kind = "lognormal" if dist.kind == "const" and j > 0 else dist.kind
        return ComputeTime(kind=kind, mean_s=mean, spread=spread)

    def mean_compute_s(self, batch: int) -> float:
        t_ref = ComputeTime.parse(self.compute).mean_s
        t0 = self.compute_fixed_s
        return t0 + (t_ref - t0) * batch / self.reference_batch

    def with_batch(self, batch: int | None) -> Workload:
        if batch is None:
            return self
        return dataclasses.replace(self, batch_per_worker=batch)


@dataclass(frozen=True, slots=True, kw_only=True)
class Defaults:
    """Sweep defaults a configuration file may set."""

    algorithms: tuple[str, ...] = ("ssgd", "adpsgd", "hadpsgd")
    workers: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    period: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Uncertainty:
    r"""What the fit that produced a profile knows about its own parameters.

    Each uncertain parameter is named by its dotted path in the profile (``"platform.pcie.
    bandwidth_bytes_per_s"``, :meth:`Profile.paths`) and must hold a positive number there. Its
    uncertainty is the standard deviation of the natural logarithm of its value (``log_sd``;
    about the relative standard deviation when small), so a draw
    :math:`v \exp(\sigma z)` stays positive. ``correlation`` (optional) is the correlation
    matrix of those logarithms in the order of ``parameters``; empty means uncorrelated.

    Parameters
    ----------
    parameters : tuple of str
        Dotted paths of the uncertain parameters, each once.
    log_sd : tuple of float
        Standard deviation of the log of each parameter, ``>= 0``, in the order of ``parameters``.
    correlation : tuple of tuple of float
        Symmetric, unit diagonal, entries in [-1, 1]; ``()`` for none.
    unpinned : tuple of str
        Parameters the data could not pin down (a flat direction of the fit): their value is
        the prior (a spec-sheet figure) and their ``log_sd`` the prior's spread. A subset of
        ``parameters``.
    noise_cv : float
        Relative standard deviation of a measured mean step time about the prediction, ``>= 0``:
        what one measurement of the same configuration scatters by, or in a fitted profile the
        fit's residual over its data where that is larger.
    noise_processes_per_core : float or None
        The most worker processes per CPU core among the runs whose scatter and residuals
        ``noise_cv`` covers, ``> 0`` (emulated hosts share their machine's cores); ``None``: not
        recorded (published figures, GPUs). A prediction with more processes per core than this
        carries the noise of a less loaded machine: the scheduling of a shared core is not in it.
    in_sample_error, loo_error, logo_error : float or None
        Median absolute relative error of the fit on the data it was fitted to, leave-one-out
        and leave-one-group-out; ``None`` when not computed.
    """

    parameters: tuple[str, ...] = ()
    log_sd: tuple[float, ...] = ()
    correlation: tuple[tuple[float, ...], ...] = ()
    unpinned: tuple[str, ...] = ()
    noise_cv: float = 0.0
    noise_processes_per_core: float | None = None
    in_sample_error: float | None = None
    loo_error: float | None = None
    logo_error: float | None = None

    def __post_init__(self) -> None:
        n = len(self.parameters)
        require(len(set(self.parameters)) == n, "uncertainty.parameters", self.parameters, "must name each path once")
        require(
            len(self.log_sd) == n,
            "uncertainty.log_sd",
            self.log_sd,
            f"must have one value per parameter ({n})",
        )
        for x in self.log_sd:
            require(_finite(x) and x >= 0, "uncertainty.log_sd", x, "must be >= 0")
        if self.correlation:
            c = self.correlation
            require(
                len(c) == n and all(len(row) == n for row in c),
                "uncertainty.correlation",
                c,
                f"must be a {n} x {n} matrix (one row and column per parameter)",
            )
            for i in range(n):
                require(abs(c[i][i] - 1.0) < 1e-9, "uncertainty.correlation", c[i][i], "must have a unit diagonal")
                for j in range(n):
                    require(
                        _finite(c[i][j]) and -1.0 <= c[i][j] <= 1.0 and abs(c[i][j] - c[j][i]) < 1e-9,
                        "uncertainty.correlation",
                        c[i][j],
                        "must be symmetric with entries in [-1, 1]",
                    )
        for path in self.unpinned:
            require(path in self.parameters, "uncertainty.unpinned", path, "must be one of the parameters")
        require(_finite(self.noise_cv) and self.noise_cv >= 0, "uncertainty.noise_cv", self.noise_cv, "must be >= 0")
        load = self.noise_processes_per_core
        ok = load is None or (_finite(load) and load > 0)
        require(ok, "uncertainty.noise_processes_per_core", load, "must be > 0")
        for name in ("in_sample_error", "loo_error", "logo_error"):
            x = getattr(self, name)
            require(x is None or (_finite(x) and x >= 0), f"uncertainty.{name}", x, "must be >= 0")

    def covariance(self) -> list[list[float]]:
        """The covariance matrix of the parameters' logarithms (``log_sd`` and ``correlation``)."""
        n = len(self.parameters)
        corr = self.correlation or tuple(tuple(1.0 if i == j else 0.0 for j in range(n)) for i in range(n))
        return [[corr[i][j] * (self.log_sd[i] * self.log_sd[j]) for j in range(n)] for i in range(n)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A platform, a workload and sweep defaults, with the comments that say where they come from
    (module docstring, *TOML layout*).

    Parameters
    ----------
    platform : Platform
    workload : Workload
    defaults : Defaults
    uncertainty : Uncertainty or None
        What the fit that produced the profile knows about its parameters; ``None``: nothing is
        known (every value taken as exact).
    source : str
        Where it was read from (a path, ``"<dict>"``); not compared.
    notes : tuple of str
        Comment lines at the head of the TOML document, one line each, no trailing whitespace.
    provenance : dict of str to str
        A comment for the line of a key or table, by dotted path (``"platform.pcie"``,
        ``"workload.n_params"``); each path must be one the document has.
    """

    platform: Platform
    workload: Workload
    defaults: Defaults = field(default_factory=Defaults)
    uncertainty: Uncertainty | None = None
    source: str = field(default="", compare=False)
    notes: tuple[str, ...] = ()
    provenance: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for line in self.notes:
            require(
                isinstance(line, str) and _comment_ok(line),
                "note",
                line,
                "must be one line without control characters or trailing whitespace",
            )
        paths = set(self.paths())
        for key, text in self.provenance.items():
            if key not in paths:  # the closest-key hint only for a failing key (difflib is slow)
                require(
                    False, "provenance key", key, "must name a key or table the profile writes" + _closest(key, paths)
                )
            require(
                isinstance(text, str) and text != "" and _comment_ok(text),
                f"provenance of {key}",
                text,
                "must be one non-empty line without control characters or trailing whitespace",
            )
        if self.uncertainty is not None:
            for path in self.uncertainty.parameters:
                value = self.get(path) if path in paths else None
                if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
                    require(
                        False,
                        "uncertainty parameter",
                        path,
                        "must name a positive number of the profile" + _closest(path, paths),
                    )

    @property
    def facts(self) -> PlatformFacts:
        """What this profile says that an algorithm takes where no flag gives it: the devices of
        a host (H-ADPSGD's node) and the ``[defaults] period``
        (:func:`psgdlab.core.algorithms.algorithm_from_flags`)."""
        return PlatformFacts(devices_per_host=self.platform.devices_per_host, period=self.defaults.period)

    # ----- the device's compute law ------------------------------------------------------------
    @property
    def device_law(self) -> bool:
        """Whether the compute time follows from the device: the platform gives its peak FLOP/s
        and the workload its FLOPs per sample."""
        return self.platform.device_flops_per_s > 0 and self.workload.flops_per_sample > 0

    def resolved(self) -> Profile:
        r"""The profile with the workload's compute time set by the device where
        :attr:`device_law` holds (else unchanged):

        .. math::
            t(b) = \frac{F\,b}{P\,e_c} + \frac{M}{W\,e_m}

        (:mod:`psgdlab.core.platform.workloads`): the mean at ``reference_batch`` goes into ``compute``
        (its kind and spread kept) and the batch-independent memory term into
        ``compute_fixed_s``, so :meth:`Workload.mean_compute_s` gives :math:`t(b)` at any batch.

        >>> from psgdlab.core.platform.workloads import workload
        >>> p = Profile(platform=Platform(device_flops_per_s=1e13, compute_efficiency=0.5,
        ...             device_memory_bandwidth_bytes_per_s=3e11), workload=workload("dnn-13.5m"))
        >>> w = p.resolved().workload
        >>> round(w.mean_compute_s(4096) * 1e3, 2), round(w.compute_fixed_s * 1e3, 2)
        (67.26, 0.9)
        """
        if not self.device_law:
            return self
        p, w = self.platform, self.workload
        fixed = (
            w.bytes_per_step / (p.device_memory_bandwidth_bytes_per_s * p.memory_efficiency)
            if p.device_memory_bandwidth_bytes_per_s > 0
            else 0.0
        )
        mean = w.flops_per_sample * w.reference_batch / (p.device_flops_per_s * p.compute_efficiency) + fixed
        dist = ComputeTime.parse(w.compute)
        spec = repr(mean) if dist.kind == "const" else f"{dist.kind}:{mean!r}:{dist.spread!r}"
        return dataclasses.replace(self, workload=dataclasses.replace(w, compute=spec, compute_fixed_s=fixed))

    # ----- values by path ---------------------------------------------------------------------
    def get(self, path: str) -> Any:
        """The value at a dotted path (``"platform.pcie.bandwidth_bytes_per_s"``).

        >>> Profile(platform=Platform(), workload=Workload()).get("platform.pcie.bandwidth_bytes_per_s")
        16000000000.0
        """
        obj: Any = self
        for part in path.split("."):
            if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
                raise ConfigError(f"profile path {path!r} names no value" + _closest(path, set(self.paths())))
            obj = getattr(obj, part)
        return obj

    def with_values(self, values: Mapping[str, Any]) -> Profile:
        """A copy with the values at the given dotted paths replaced (each validated again by its
        dataclass).

        >>> p = Profile(platform=Platform(), workload=Workload())
        >>> p.with_values({"platform.pcie.bandwidth_bytes_per_s": 8e9}).platform.pcie.bandwidth_bytes_per_s
        8000000000.0
        """
        out: Any = self
        for path, value in values.items():
            self.get(path)
            out = _replace_at(out, path.split("."), value)
        return out  # type: ignore[no-any-return]

    # ----- reading ----------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        source: str = "<dict>",
        notes: tuple[str, ...] = (),
        provenance: Mapping[str, str] | None = None,
    ) -> Profile:
        """Build a profile from nested tables (``{"platform": {...}, "workload": {...}}``),
        strictly: unknown keys are rejected with the closest valid key suggested."""
        check_keys(data, TABLES, where=source)
        if "platform" not in data or "workload" not in data:
            raise ConfigError(f"{source}: needs both a [platform] and a [workload] table")
        return cls(
            platform=load_dataclass(Platform, data["platform"], where="platform"),
            workload=load_dataclass(Workload, data["workload"], where="workload"),
            defaults=load_dataclass(Defaults, data.get("defaults", {}), where="defaults"),
            uncertainty=(
                load_dataclass(Uncertainty, data["uncertainty"], where="uncertainty") if "uncertainty" in data else None
            ),
            source=source,
            notes=tuple(notes),
            provenance=dict(provenance or {}),
        )

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<string>") -> Profile:
        """Read a TOML document (module docstring): the values with :mod:`tomllib`, the head
        comments as ``notes`` and the end-of-line comments as ``provenance``."""
        data = parse_toml(text, source=source)
        notes, comments = _read_comments(text)
        profile = cls.from_dict(data, source=source, notes=notes)
        paths = set(profile.paths())
        return dataclasses.replace(profile, provenance={k: v for k, v in comments.items() if k in paths})

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Profile:
        """:meth:`from_toml` of a file; a missing file is a one-line :class:`ConfigError`."""
        return cls.from_toml(read_config_text(path), source=str(path))

    # ----- writing ----------------------------------------------------------------------------
    def tables(self, names: Sequence[str] = TABLES) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
        """``(dotted table name, [(key, value), ...])`` in the order :meth:`to_toml` writes them:
        each table's plain values, then its sub-tables; ``None`` values are left out. ``names``:
        the top-level tables (:data:`TABLES`) to give."""
        for name in TABLES:
            if name in names and getattr(self, name) is not None:
                yield from _tables(name, getattr(self, name))

    def paths(self) -> Iterator[str]:
        """Every dotted table and key path the TOML document of this profile has."""
        for table, items in self.tables():
            yield table
            for key, _ in items:
                yield f"{table}.{key}"

    def to_toml(self, tables: Sequence[str] = TABLES) -> str:
        """The TOML document (module docstring); :meth:`from_toml` reads it back to an equal profile.
        ``tables``: the top-level tables to write (``("workload",)``: a workload file, as
        ``psgdlab predict --workload FILE`` reads one), with the notes at its head.

        >>> p = Profile(platform=Platform(), workload=Workload(n_params=7), provenance={"workload.n_params": "[INF]"})
        >>> print(p.to_toml(tables=("workload",)).splitlines()[:4])
        ['[workload]', 'name = "model"', 'description = ""', 'n_params = 7                             # [INF]']
        """
        lines = [f"# {line}" if line else "#" for line in self.notes]
        for table, items in self.tables(tables):
            if lines:
                lines.append("")
            lines.append(self._line(f"[{table}]", table))
            lines.extend(self._line(f"{key} = {_toml_value(value)}", f"{table}.{key}") for key, value in items)
        return "\n".join(lines) + "\n"

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_toml` to ``path`` atomically (temporary file, then rename)."""
        from psgdlab.core.files import atomic_write_text

        return atomic_write_text(path, self.to_toml())

    def _line(self, text: str, path: str) -> str:
        note = self.provenance.get(path)
        return f"{text:<40} # {note}" if note else text


def _replace_at(obj: Any, parts: list[str], value: Any) -> Any:
    if len(parts) == 1:
        return dataclasses.replace(obj, **{parts[0]: value})
    return dataclasses.replace(obj, **{parts[0]: _replace_at(getattr(obj, parts[0]), parts[1:], value)})


def _tables(name: str, obj: Any) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    items: list[tuple[str, Any]] = []
    subs: list[tuple[str, Any]] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None or (value == () and f.default == ()):
            continue
        (subs if dataclasses.is_dataclass(value) else items).append((f.name, value))
    yield name, items
    for key, sub in subs:
        yield from _tables(f"{name}.{key}", sub)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_value(v: Any) -> str:
    """One TOML value: booleans, integers, floats by ``repr`` (exact), basic strings, arrays."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # shortest repr that reads back to the same float; 'inf', 'nan' are TOML too
    if isinstance(v, str):
        return (
            '"'
            + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in v)
            + '"'
        )
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write a value of type {type(v).__name__} to TOML: {v!r}")


def _comment_ok(text: str) -> bool:
    """TOML comments hold no control characters but tab; a line read back loses trailing blanks."""
    return text == text.rstrip() and not any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in text)


def _closest(key: str, known: set[str]) -> str:
    return closest(key, sorted(known))


def _read_comments(text: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """Comment lines (``notes``) and end-of-line comments by dotted path of a TOML document."""
    notes: list[str] = []
    by_path: dict[str, str] = {}
    table = ""
    for raw in text.split("\n"):  # TOML's newlines only (str.splitlines also breaks at U+0085, U+2028, ...)
        line = raw.strip(" \t\r")
        if not line:
            continue
        if line.startswith("#"):
            notes.append(_comment_text(line))
            continue
        code, comment = _split_comment(line)
        if code.startswith("[") and not code.startswith("[["):
            table = code.strip("[] \t")
            path = table
        elif "=" in code:
            key = ".".join(part.strip() for part in code.split("=", 1)[0].split("."))
            path = f"{table}.{key}" if table else key
        else:
            continue
        if comment is not None and _comment_text(comment):
            by_path[path] = _comment_text(comment)
    return tuple(notes), by_path


def _comment_text(comment: str) -> str:
    text = comment[1:]
    return (text[1:] if text.startswith(" ") else text).rstrip()


def _split_comment(line: str) -> tuple[str, str | None]:
    """``(code, comment)`` of one line: the comment starts at the first ``#`` outside a string."""
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote is None:
            if c in "\"'":
                quote = c
            elif c == "#":
                return line[:i].rstrip(), line[i:]
        elif c == "\\" and quote == '"':
            i += 1
        elif c == quote:
            quote = None
        i += 1
    return line, None
