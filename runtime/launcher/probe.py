r"""Probing the transport's building blocks, as nccl-tests does: timed pairwise exchanges and
allreduces over a sweep of message sizes and group sizes, on the real transport.

:func:`probe` starts ``max(groups)`` local processes (``python -m psgdlab.runtime.launcher.probe``) on
the chosen backend -- gloo, whose ranks of one host exchange through the shared-memory plane
(:mod:`psgdlab.runtime.transports.shm.shm`), or MPI -- through the channels every run opens
(:func:`psgdlab.runtime.transports.channels.open_channels`). For every message size, every rank meets at a
barrier before each repetition, then:

- **pairwise**: ranks 0 and 1 exchange the message both ways at once (``sendrecv``, what an
  AD-PSGD pairwise average moves);
- **allreduce**: ranks ``0 .. g-1`` sum the message in place, for every group size ``g``.

Each participant records the wall time of the operation and the CPU time its process spent in
it (``time.process_time``: the copies a shared-memory transport makes are CPU work, which the
cores of a host share when its processes outnumber them). The first ``warmup`` repetitions are
recorded and marked. Rank 0 gathers the records and writes the run directory::

    OUT/probe.json     the probe's configuration
    OUT/probe.npz      one row per (kind, group, size, repetition, rank): wall_s, cpu_s, warm-up flag
    OUT/env.json       versions, host, cpu_count, world size, the transport's allreduce schedule
    OUT/complete.json  the commit marker, last (psgdlab.core.records.rundir.commit_run)

:mod:`psgdlab.analysis.probe` fits the link laws from it. Every wait has a deadline
(``timeout_s``): a rank that dies or hangs stops the probe with an error naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.errors import ConfigError, TransportError, require
from psgdlab.core.platform.placement import equal_blocks
from psgdlab.core.records.trace import atomic_write_bytes, atomic_write_json, atomic_write_text
from psgdlab.runtime.transports.backends import cpu_backends

__all__ = ["ProbeConfig", "probe", "PROBE_DTYPE", "KINDS", "DEFAULT_SIZES_BYTES"]

#: the probe's record of one operation on one rank
PROBE_DTYPE = np.dtype(
    [
        ("kind", "u1"),
        ("group", "i4"),
        ("size_bytes", "i8"),
        ("rep", "i4"),
        ("rank", "i4"),
        ("wall_s", "f8"),
        ("cpu_s", "f8"),
        ("warmup", "?"),
    ]
)
#: ``kind`` codes of :data:`PROBE_DTYPE`
KINDS = {"pairwise": 0, "allreduce": 1}

#: 8 KiB to 4 MiB, a factor 8 apart: latency-bound to bandwidth-bound on a loopback transport
DEFAULT_SIZES_BYTES = (8 << 10, 64 << 10, 512 << 10, 4 << 20)

_TAG = 41  # point-to-point tag of the probe's exchanges (psgdlab.runtime.transports.transport.Tags keeps 11-34)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeConfig:
    """What :func:`probe` measures (``psgdlab calibrate --probe --help`` says it for users).

    Parameters
    ----------
    out : str
        The run directory to write.
    backend : {"gloo", "mpi"}
    sizes_bytes : tuple of int
        Message sizes, each a positive multiple of 8 (float64 elements), at least two different.
    groups : tuple of int
        Allreduce group sizes (ranks ``0 .. g-1``), each ``>= 2``; the probe starts ``max(groups)``
        processes.
    repeats : int
        Timed repetitions per (kind, group, size), ``>= 3``.
    warmup : int
        Repetitions before them, recorded and marked, ``>= 0``.
    timeout_s : float
        Deadline of every wait and of the whole probe.
    hosts : int
        Emulated hosts the ranks go on (:mod:`psgdlab.runtime.launcher.netns`, gloo only, needs root), in
        contiguous blocks as ``psgdlab train --hosts`` places them; with one rank per host
        (``--hosts 2`` and the default groups) every exchange crosses the NIC, and
        :func:`psgdlab.analysis.calibrate.calibrate_runs` fits the link between hosts from it.
    nic_bandwidth : str or None
        The emulated hosts' link rate (``1Gbit/s``); ``None``: not shaped.
    """

    out: str
    backend: str = "gloo"
    sizes_bytes: tuple[int, ...] = DEFAULT_SIZES_BYTES
    groups: tuple[int, ...] = (2,)
    repeats: int = 20
    warmup: int = 3
    timeout_s: float = 120.0
    hosts: int = 1
    nic_bandwidth: str | None = None

    def __post_init__(self) -> None:
        require(self.backend in cpu_backends(), "backend", self.backend, f"must be one of {', '.join(cpu_backends())}")
        for s in self.sizes_bytes:
            require(isinstance(s, int) and s >= 8 and s % 8 == 0, "sizes", s, "must be positive multiples of 8 bytes")
        require(
            len(set(self.sizes_bytes)) >= 2,
            "sizes",
            self.sizes_bytes,
            "must hold at least two different sizes (latency and bandwidth cannot be separated otherwise)",
        )
        for g in self.groups:
            require(isinstance(g, int) and g >= 2, "groups", g, "must be integers >= 2")
        require(bool(self.groups), "groups", self.groups, "must name at least one group size")
        require(isinstance(self.repeats, int) and self.repeats >= 3, "repeats", self.repeats, "must be an integer >= 3")
        require(isinstance(self.warmup, int) and self.warmup >= 0, "warmup", self.warmup, "must be an integer >= 0")
        require(self.timeout_s > 0, "timeout_s", self.timeout_s, "must be > 0 seconds")
        require(isinstance(self.hosts, int) and self.hosts >= 1, "hosts", self.hosts, "must be an integer >= 1")
        if self.nic_bandwidth is not None:
            from psgdlab.core.config import parse_rate

            parse_rate(self.nic_bandwidth)
            require(self.hosts >= 2, "nic-bandwidth", self.nic_bandwidth, "applies only with --hosts 2 or more")
        if self.hosts > 1:
            require(
                self.backend == "gloo",
                "hosts",
                self.hosts,
                "is supported by the probe with --backend gloo only (psgdlab train --hosts runs MPI too)",
            )
            equal_blocks(self.world, hosts=self.hosts, what="ranks of the probe (its largest group)")

    @property
    def world(self) -> int:
        """Processes the probe starts: the largest group."""
        return max(self.groups)

    def operations(self) -> int:
        """Timed operations of the whole probe (repetitions of every kind, group and size)."""
        return len(self.sizes_bytes) * (1 + len(self.groups)) * (self.repeats + self.warmup)


def probe(cfg: ProbeConfig, *, progress: Callable[[int, int], None] | None = None) -> Path:
    """Run the probe of ``cfg`` on local processes into ``cfg.out`` (module docstring); returns it.

    ``progress(done, total)`` is called as rank 0 goes through the operations. A rank that fails
    or a probe past ``cfg.timeout_s`` stops every rank and raises :class:`TransportError`.
    """
    from psgdlab.runtime.launcher.launch import mpiexec_path
    from psgdlab.runtime.launcher.lifeline import launcher_environment, set_parent_death_signal
    from psgdlab.runtime.launcher.ranks import RANK_ENV, start_ranks

    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"probe output {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("probe.npz", "progress", "complete.json"):
        (out / name).unlink(missing_ok=True)
    config_path = atomic_write_json(out / "probe.json", asdict(cfg))
    cmd = [sys.executable, "-m", "psgdlab.runtime.launcher.probe", "--config", str(config_path)]
    env = {**os.environ, **RANK_ENV, "PYTHONUNBUFFERED": "1", **launcher_environment()}
    procs: list[subprocess.Popen[bytes]] = []
    hosts = None
    try:
        if cfg.backend == "mpi":
            mpi = [str(mpiexec_path()), "-n", str(cfg.world), *cmd]
            procs.append(
                subprocess.Popen(
                    mpi, env=env, stdout=subprocess.DEVNULL, start_new_session=True, preexec_fn=set_parent_death_signal
                )
            )
        else:
            placement, port = [0] * cfg.world, 0
            if cfg.hosts > 1:
                hosts, placement, port = _up_hosts(cfg)
            # each started rank is in procs at once: a failure to start another still stops it
            start_ranks(
                cmd,
                env,
                cfg.world,
                hosts=hosts,
                placement=placement,
                master_port=port,
                on_start=lambda r, p: procs.append(p),
            )
        _wait(procs, out, cfg, progress)
    finally:
        _stop(procs)
        (out / "progress").unlink(missing_ok=True)
        if hosts is not None:
            from psgdlab.runtime.transports.shm.shm_sys import remove_segments

            remove_segments(p.pid for p in procs)
            hosts.down()
    if not (out / "probe.npz").is_file():
        raise TransportError(f"every probe rank exited but rank 0 wrote no {out / 'probe.npz'}")
    return out


def _up_hosts(cfg: ProbeConfig) -> tuple[Any, list[int], int]:
    """The probe's emulated hosts, made and reachable (the leftovers of killed launchers
    removed first); the host of every rank; the rendezvous port."""
    from psgdlab.core.config import parse_rate
    from psgdlab.runtime.launcher.launch import MASTER_PORT
    from psgdlab.runtime.launcher.netns import EmulatedHosts, remove_stale, require_netns

    require_netns(cfg.hosts)
    remove_stale()
    rate = parse_rate(cfg.nic_bandwidth) if cfg.nic_bandwidth is not None else None
    hosts = EmulatedHosts(cfg.hosts, rate)
    try:
        hosts.up()
        hosts.wait_until_reachable()
    except BaseException:
        hosts.down()
        raise
    return hosts, list(equal_blocks(cfg.world, hosts=cfg.hosts).host), MASTER_PORT


def _wait(
    procs: list[subprocess.Popen[bytes]], out: Path, cfg: ProbeConfig, progress: Callable[[int, int], None] | None
) -> None:
    """Until every process exits: report rank 0's progress; a failed rank or the deadline raises."""
    start, total = time.monotonic(), cfg.operations()
    while True:
        for i, p in enumerate(procs):
            code = p.poll()
            if code not in (None, 0):
                who = "mpiexec" if cfg.backend == "mpi" else f"rank {i}"
                raise TransportError(f"probe failed: {who} exited with status {code}")
        if progress is not None and (out / "progress").is_file():
            text = (out / "progress").read_text().strip()
            if text.isdigit():
                progress(int(text), total)
        if all(p.poll() is not None for p in procs):
            return
        if time.monotonic() - start > cfg.timeout_s:
            raise TransportError(f"probe exceeded its time limit of {cfg.timeout_s:.0f} s; every rank was stopped")
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate (then kill) the probe's processes that still run, and reap them all."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5.0)


# ----- one rank ---------------------------------------------------------------------------------
def run_rank(cfg: ProbeConfig) -> None:
    """The probe on this process (module docstring); rank 0 writes the run directory."""
    import torch

    from psgdlab.core.records.rundir import commit_run, environment
    from psgdlab.runtime.transports.channels import open_channels
    from psgdlab.runtime.transports.env import launch_env

    torch.set_num_threads(1)
    env = launch_env()
    require(env.world_size == cfg.world, "world size", env.world_size, f"must be the largest group ({cfg.world})")
    groups = [tuple(range(g)) for g in sorted(set(cfg.groups))]
    channels = open_channels(cfg.backend, env=env, groups=groups, timeout_s=cfg.timeout_s)
    main = channels["main"]
    rank, rows, done = env.rank, [], 0
    out = Path(cfg.out)

    def timed(kind: str, group: int, size: int, rep: int, op: Callable[..., None], *args: Any) -> None:
        c0, t0 = time.process_time(), time.perf_counter()
        op(*args)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append((KINDS[kind], group, size, rep, rank, wall, cpu, rep < cfg.warmup))

    for size in cfg.sizes_bytes:
        buf = torch.ones(size // 8, dtype=torch.float64)
        other = torch.empty_like(buf)
        plan = [("pairwise", 2)] + [("allreduce", len(g)) for g in groups]
        for kind, g in plan:
            members = tuple(range(g))
            for rep in range(cfg.repeats + cfg.warmup):
                main.barrier()
                if rank in members:
                    if kind == "pairwise":
                        timed(kind, g, size, rep, main.sendrecv, buf, other, 1 - rank, _TAG)
                    else:
                        timed(kind, g, size, rep, main.allreduce_sum, buf, members)
                        buf.fill_(1.0)  # keep the values finite and the work alike
                done += 1
                if rank == 0 and done % 5 == 0:
                    atomic_write_text(out / "progress", str(done))
    gathered = main.gather_object(rows, root=0)
    schedule = str(main.allreduce_algorithm)
    main.barrier()
    _close(cfg.backend)
    if rank != 0:
        return
    assert gathered is not None
    table = np.array([r for part in gathered for r in part], dtype=PROBE_DTYPE)
    import io

    blob = io.BytesIO()
    np.savez(blob, records=table)
    atomic_write_bytes(out / "probe.npz", blob.getvalue())
    atomic_write_json(
        out / "env.json",
        environment(
            source="probe",
            world_size=cfg.world,
            extra={
                "backend": cfg.backend,
                "allreduce_algorithm": schedule,
                "hosts": cfg.hosts,
                "nic_bandwidth_bytes_per_s": _rate(cfg.nic_bandwidth),
            },
        ),
    )
    commit_run(out, command="calibrate --probe")


def _rate(text: str | None) -> float | None:
    from psgdlab.core.config import parse_rate

    return None if text is None else parse_rate(text)


def _close(backend: str) -> None:
    if backend != "mpi":
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Per-rank entry: ``python -m psgdlab.runtime.launcher.probe --config OUT/probe.json``."""
    from psgdlab.runtime.launcher.lifeline import die_with_launcher

    die_with_launcher()
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "0")
    parser = argparse.ArgumentParser(prog="python -m psgdlab.runtime.launcher.probe")
    parser.add_argument(
        "--config", required=True, help="the probe.json that psgdlab.runtime.launcher.probe.probe writes"
    )
    args = parser.parse_args(argv)
    data = json.loads(Path(args.config).read_text())
    for key in ("sizes_bytes", "groups"):
        data[key] = tuple(data[key])
    try:
        run_rank(ProbeConfig(**data))
    except (ConfigError, TransportError, RuntimeError, ValueError) as exc:
        print(f"psgdlab probe: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
