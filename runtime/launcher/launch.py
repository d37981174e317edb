"""The local launcher behind ``psgdlab train``: start every rank, watch them, fail fast.

- gloo / nccl: ``world_size`` processes ``python -m psgdlab.runtime --config OUT/launch.json``
  with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and a free ``MASTER_PORT`` on 127.0.0.1;
- mpi: one ``mpiexec -n world_size`` (:func:`mpiexec_path`: ``--mpiexec``, else that of the MPI
  mpi4py loads) running the same;
- ``hosts > 1`` (gloo or mpi): emulated hosts (:mod:`psgdlab.runtime.launcher.netns`): the launcher removes the
  leftovers of runs whose launcher was killed (one line on stderr), makes one network namespace
  per host, starts each rank inside its host's namespace (``ip netns exec``; ranks in contiguous
  blocks) with ``MASTER_ADDR`` = host 0's address, gloo bound to the host's interface and the
  host named in ``PSGDLAB_HOST_ID`` (mpi: mpiexec in the bridge's namespace starts each host's
  proxy inside the host's), writes ``OUT/hosts.json`` (the hosts, the placement, the bytes each
  host's link carried), and removes the namespaces when the run ends however it ends.

Every rank writes ``OUT/.ranks/rank{r}.pid`` when it starts and ``rank{r}.done`` when it ends.
The launcher polls its children (and, under mpiexec, those pids) every 0.1 s: the first rank
that exits with an error, disappears without its ``done`` file, or stays stopped (SIGSTOP) past
the deadline (``--timeout``) stops the run (:mod:`psgdlab.runtime.failures.stop`: the survivors write
their flight records, the others are terminated, :class:`TransportError` names the failed rank
and the step, ``OUT/failure.json`` records it). SIGTERM/SIGINT to the launcher is forwarded to
every rank (as SIGTERM), and the ranks stop at a step they agree on and checkpoint there
(:mod:`psgdlab.runtime.loop.exchange.stopping`); ranks still running :data:`STOP_GRACE_S` later
are killed. The run then raises :class:`~psgdlab.core.errors.RunInterrupted`, which names the
signal and the step ``--resume`` continues from (``psgdlab train`` exits with 130 for SIGINT,
143 for SIGTERM).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from psgdlab.core.errors import ConfigError, RunInterrupted, TransportError, require
from psgdlab.core.files import atomic_write_json, atomic_write_text
from psgdlab.core.platform.machine import available_memory_bytes
from psgdlab.core.platform.placement import equal_blocks
from psgdlab.core.records.rundir import SUMMARY_FILE
from psgdlab.models.recipes import LSQ_MODEL
from psgdlab.runtime.config import TrainConfig, lsq_problem, world_size_of
from psgdlab.runtime.failures.flight import FLIGHT_DIR, flight_path
from psgdlab.runtime.failures.stop import FAILURE_FILE, RankWatch, process_state, remove_partial_files, stop_run
from psgdlab.runtime.failures.survive.survivors import continuing_path
from psgdlab.runtime.launcher.netns import (
    BRIDGE,
    MPI_NETWORK_ENV,
    EmulatedHosts,
    fresh_hosts,
    require_netns,
    set_parent_death_signal,
)
from psgdlab.runtime.launcher.ranks import (
    GRACE_S,
    RANK_ENV,
    RANKS_DIR,
    STOP_GRACE_S,
    describe_exit,
    describe_interruption,
    free_port,
    oom_kills,
    rank_environment,
    signals_to,
    start_ranks,
)
from psgdlab.runtime.transports.backends import BACKENDS, cpu_backends, either
from psgdlab.runtime.transports.env import HOST_ENV
from psgdlab.runtime.transports.shm.shm_sys import remove_orphaned, remove_segments

__all__ = [
    "launch",
    "rank_hosts",
    "require_local_gpus",
    "require_memory",
    "check_limits",
    "rank_memory_bytes",
    "MAX_LOCAL_RANKS",
    "available_memory_bytes",
    "free_port",
    "mpiexec_path",
    "RANKS_DIR",
    "RANK_ENV",
    "GRACE_S",
    "STOP_GRACE_S",
    "rank_environment",
]


#: a rank's own memory before its model and data: a Python interpreter with torch and psgdlab's
#: runtime imported (152 MB of anonymous memory measured, torch 2.13 CPU; the libraries' pages are
#: shared between the ranks)
RANK_BASE_BYTES = 160 * 2**20
#: copies of the model a rank holds: weights, gradient, optimiser momentum, an exchange's send
#: and receive buffers
MODEL_COPIES = 5
#: the most ranks ``psgdlab train`` starts on one machine: each is a process of its own (above),
#: and the ranks connect pairwise (gloo's full mesh: n(n-1) sockets over the machine). More
#: workers run across machines under torchrun, mpiexec or srun.
MAX_LOCAL_RANKS = 512


def check_limits(config: TrainConfig, local_ranks: int | None = None) -> None:
    """Refuse, before anything starts, a run this machine cannot hold: more than
    :data:`MAX_LOCAL_RANKS` ranks, ranks whose memory together passes ``MemAvailable``
    (:func:`require_memory`), or an NCCL run of more ranks than GPUs (:func:`require_local_gpus`);
    and a corpus file that is not one or holds a non-finite feature. One line each, naming the
    value and the reason."""
    ranks = world_size_of(config) if local_ranks is None else local_ranks
    require(
        ranks <= MAX_LOCAL_RANKS,
        "workers",
        config.workers,
        f"must be at most {MAX_LOCAL_RANKS} ranks on one machine ({ranks} asked): every rank is a process of its own "
        f"(a Python interpreter with torch, about {RANK_BASE_BYTES // 2**20} MB) and the ranks connect pairwise",
        hint="run more workers across machines under torchrun, mpiexec or srun (python -m psgdlab.runtime)",
    )
    if config.model != LSQ_MODEL and config.data != "synthetic":
        from psgdlab.models.data import inspect_corpus, require_finite_corpus

        require_finite_corpus(config.data)  # once here, not in every rank: a NaN feature trains to a NaN loss
        unknown = sorted(set(config.held_out_speakers) - set(inspect_corpus(config.data)["speakers"]))
        require(not unknown, "held-out-speakers", ",".join(unknown), f"are not speakers of {config.data}")
    require_memory(config, ranks)
    require_local_gpus(config, ranks)


def rank_memory_bytes(config: TrainConfig) -> tuple[int, str]:
    """The memory one rank of ``config`` needs, estimated, and what it is made of (for a
    message): :data:`RANK_BASE_BYTES`, the model (its parameter count from a build on torch's
    meta device, which allocates nothing, times :data:`MODEL_COPIES` float32 copies) and the
    training data every rank loads (a least-squares problem's rows, a corpus file's features)."""
    if config.model == LSQ_MODEL:
        data = lsq_problem(config).data_bytes
        return RANK_BASE_BYTES + data, f"{RANK_BASE_BYTES / 1e6:.0f} MB of interpreter and {data / 1e9:.3g} GB of data"
    import torch

    from psgdlab.models.networks import build_model, count_parameters

    if config.data == "synthetic":
        input_dim, n_classes, data = SYNTHETIC_INPUT_DIM, SYNTHETIC_CLASSES, 0
    else:
        from psgdlab.models.data import inspect_corpus

        info = inspect_corpus(config.data)
        input_dim, n_classes = int(info["input_dim"]), int(info["n_classes"])
        data = 2 * int(info["n_frames"]) * input_dim * 4  # float32 features, and their normalised copy
    with torch.device("meta"):
        n = count_parameters(build_model(config.model, input_dim=input_dim, n_classes=n_classes, window=config.window))
    model = MODEL_COPIES * 4 * n
    total = RANK_BASE_BYTES + model + data
    return total, (
        f"{RANK_BASE_BYTES / 1e6:.0f} MB of interpreter, {model / 1e6:.3g} MB for {n} parameters x {MODEL_COPIES} "
        f"copies, {data / 1e6:.3g} MB of data"
    )


#: the synthetic corpus's sizes (psgdlab.models.data.synthetic_corpus's defaults, which train uses)
SYNTHETIC_INPUT_DIM, SYNTHETIC_CLASSES = 40, 10


def require_memory(config: TrainConfig, local_ranks: int) -> None:
    """Refuse, before anything starts, ranks whose memory together (:func:`rank_memory_bytes`)
    passes what this machine can give (``MemAvailable``). A least-squares run says how its data
    is made: every rank builds the whole problem (all workers' rows: ``workers x --lsq-samples``
    rows of ``--lsq-dim`` float64 columns)."""
    available = available_memory_bytes()
    if available is None:
        return
    per_rank, parts = rank_memory_bytes(config)
    if per_rank * local_ranks <= available:
        return
    if config.model == LSQ_MODEL and lsq_problem(config).data_bytes * local_ranks > available:
        data = lsq_problem(config).data_bytes
        raise ConfigError(
            f"least-squares data of {data / 1e9:.3g} GB per rank (every rank builds all {config.workers} workers' "
            f"rows: workers x --lsq-samples {config.lsq_samples_per_worker} x (--lsq-dim {config.lsq_dim} + 1) x 8 B) "
            f"times {local_ranks} ranks on this machine is {data * local_ranks / 1e9:.3g} GB, more than the "
            f"{available / 1e9:.3g} GB available: lower --lsq-samples or --lsq-dim"
        )
    raise ConfigError(
        f"workers ({config.workers}): {local_ranks} ranks of about {per_rank / 1e6:.0f} MB each ({parts}) need "
        f"{per_rank * local_ranks / 1e9:.3g} GB, more than the {available / 1e9:.3g} GB this machine has available "
        "(MemAvailable): use fewer workers or a smaller model"
    )


def require_local_gpus(config: TrainConfig, local_ranks: int) -> None:
    """Refuse, before anything starts, an NCCL run of more ranks on this machine than it has
    GPUs: NCCL needs one GPU per rank (each rank's own check is
    :func:`psgdlab.runtime.transports.channels.rank_device`)."""
    if not BACKENDS[config.backend].needs_cuda:
        return
    import torch

    gpus = torch.cuda.device_count()
    server = " and the parameter server" if local_ranks > config.workers else ""
    require(
        local_ranks <= gpus,
        "workers",
        config.workers,
        f"need {local_ranks} GPUs on this machine with --backend {config.backend} (one per worker{server}), "
        f"which has {gpus}",
        hint=f"use fewer workers, or {either(cpu_backends())}",
    )


def mpiexec_path(chosen: str | None = None) -> Path:
    """The ``mpiexec`` that starts the ranks of ``--backend mpi``: ``chosen`` (``--mpiexec PATH``)
    where given; else that of the MPI mpi4py loads: the ``mpich`` wheel's where it is installed in
    this environment (``pip install 'psgdlab[mpich]'``: mpi4py loads the wheel's library, which it
    finds in the environment first), otherwise the environment's own on ``PATH`` (a cluster's MPI,
    whose library mpi4py then finds: a Slurm-integrated MPI is never shadowed by a wheel the
    install did not ask for).

    Raises
    ------
    ConfigError
        ``chosen`` that is not an executable file, or no ``mpiexec`` at all.
    """
    import shutil

    if chosen is not None:
        given = shutil.which(chosen)
        if given is None:
            raise ConfigError(f"mpiexec ({chosen!r}) is not an executable file")
        return Path(given)
    wheel = _wheel_mpiexec()
    if wheel is not None:
        return wheel
    found = shutil.which("mpiexec")
    if found is None:
        raise ConfigError(
            "backend ('mpi') needs mpiexec, and there is none: load your cluster's MPI (its mpiexec on PATH, "
            "its library where mpi4py finds it), or install MPICH from pip: pip install 'psgdlab[mpich]'"
        )
    return Path(found)


def _wheel_mpiexec() -> Path | None:
    """The ``mpiexec`` the ``mpich`` wheel installed in this environment, ``None`` without it."""
    from importlib import metadata

    try:
        wheel = metadata.distribution("mpich")
    except metadata.PackageNotFoundError:
        return None
    for f in wheel.files or []:
        if f.name == "mpiexec" and f.parent.name == "bin":
            path = Path(str(wheel.locate_file(f))).resolve()
            if path.is_file():
                return path
    return None


def launch(
    config: TrainConfig, *, extra_env: dict[str, str] | None = None, timeout_s: float | None = None, quiet: bool = False
) -> dict[str, Any]:
    """Run ``config`` on local processes and return rank 0's summary (``OUT/summary.json``).

    ``config.failure_policy == "restart"``: under torchrun's elastic agent instead
    (:func:`psgdlab.runtime.launcher.elastic.launch_elastic`). A run this machine cannot hold is
    refused first (:func:`check_limits`: too many ranks, too little memory, too few GPUs). SIGINT
    or SIGTERM while the ranks are starting stops the starting (no further rank starts) and the
    ranks started so far."""
    check_limits(config)
    if config.failure_policy == "restart":
        from psgdlab.runtime.launcher.elastic import launch_elastic

        return launch_elastic(config, extra_env=extra_env, timeout_s=timeout_s, quiet=quiet)
    out, ranks_dir = _fresh_run_dir(config)
    world = world_size_of(config)
    placement = rank_hosts(config)  # hosts.json says the same
    config_path = atomic_write_json(out / "launch.json", {"train": config.to_json()})
    env = rank_environment(ranks_dir, extra_env)
    cmd = [sys.executable, "-m", "psgdlab.runtime", "--config", str(config_path)]
    stderr = subprocess.DEVNULL if quiet else None
    procs: dict[int, subprocess.Popen] = {}
    forwarded: dict[str, Any] = {"sig": None, "at": None, "setting_up": True}
    started = time.time() - 1.0  # file times have a coarser clock

    def _forward(signum: int, frame: Any) -> None:
        first = forwarded["sig"] is None
        forwarded["sig"] = signum
        forwarded["at"] = forwarded["at"] or time.monotonic()
        if forwarded["setting_up"] and first and not procs:  # unwind; the finally below removes what was made
            raise _Stopped(signum)
        if forwarded["setting_up"]:  # ranks are starting: start_ranks stops before the next one
            return
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    hosts = None
    with signals_to(_forward):
        try:
            if config.hosts > 1:
                hosts = _emulated_hosts(config)
                hosts.up()
                hosts.wait_until_reachable()
            _start_all(config, cmd, env, procs, forwarded, hosts=hosts, placement=placement, stderr=stderr)
            forwarded["setting_up"] = False
            if forwarded["sig"] is not None:  # arrived while the ranks were starting
                _forward(forwarded["sig"], None)
            _watch(
                procs,
                ranks_dir,
                world,
                timeout_s,
                forwarded,
                deadline_s=config.timeout_s,
                out=out,
                policy=config.failure_policy,
            )
        except _Stopped:
            pass
        finally:
            forwarded["setting_up"] = False
            _clean_up_ranks(config, procs, out, hosts=hosts, placement=placement, started=started)
    if forwarded["sig"] is not None:
        started_ranks = len(procs) if config.backend != "mpi" else world * bool(procs)  # mpiexec starts its own
        raise RunInterrupted(
            describe_interruption(forwarded["sig"], out, config.workers, started=started_ranks, world=world),
            signal_number=forwarded["sig"],
        )
    summary_path = out / SUMMARY_FILE
    if not summary_path.is_file():
        raise TransportError(f"every rank exited but rank 0 wrote no {summary_path}")
    return json.loads(summary_path.read_text())


def _fresh_run_dir(config: TrainConfig) -> tuple[Path, Path]:
    """The run directory (made) and its ranks' folder, emptied of an earlier run's rank and failure records."""
    if not config.out:
        raise ConfigError("launch needs an output directory (config.out)")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    ranks_dir = out / RANKS_DIR
    ranks_dir.mkdir(exist_ok=True)
    for old in ranks_dir.iterdir():
        old.unlink()
    _clear_failure_records(out)
    return out, ranks_dir


def _start_all(
    config: TrainConfig,
    cmd: list[str],
    env: dict[str, str],
    procs: dict[int, subprocess.Popen],
    forwarded: dict[str, Any],
    *,
    hosts: EmulatedHosts | None,
    placement: tuple[int, ...],
    stderr: int | None,
) -> None:
    """Start every rank into ``procs`` (key -1: mpiexec, which starts an MPI run's ranks); a signal
    ``forwarded`` while they start stops the starting (:class:`_Stopped`)."""
    out = Path(config.out)
    if config.backend == "mpi":
        procs[-1] = _start_mpiexec(config, cmd, env, hosts=hosts, ranks_dir=out / RANKS_DIR, stderr=stderr)
        return
    world = world_size_of(config)
    start_ranks(
        cmd,
        env,
        world,
        hosts=hosts,
        placement=placement,
        master_port=MASTER_PORT,
        stderr=stderr,
        on_start=procs.__setitem__,
        stop=lambda: forwarded["sig"] is not None,
    )
    if forwarded["sig"] is not None and len(procs) < world:
        raise _Stopped(forwarded["sig"])  # launch's finally stops the ranks started so far


def _start_mpiexec(
    config: TrainConfig,
    cmd: list[str],
    env: dict[str, str],
    *,
    hosts: EmulatedHosts | None,
    ranks_dir: Path,
    stderr: int | None,
) -> subprocess.Popen:
    """Start every rank of an MPI run with mpiexec; on emulated hosts mpiexec in the bridge's
    namespace and each host's proxy in the host's."""
    world = world_size_of(config)
    mpi_cmd = [str(mpiexec_path(config.mpiexec)), "-n", str(world), *cmd]
    mpi_env = env
    if hosts is not None:
        hydra = _hydra_options(hosts, ranks_dir, equal_blocks(config.workers, hosts=config.hosts).per_host)
        mpi_cmd = [*hosts.exec_prefix(None), str(mpiexec_path(config.mpiexec)), *hydra, "-n", str(world), *cmd]
        mpi_env = {k: v for k, v in env.items() if k != HOST_ENV} | MPI_NETWORK_ENV
    return subprocess.Popen(
        mpi_cmd,
        env=mpi_env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
        preexec_fn=set_parent_death_signal,  # mpiexec dies with the launcher; its ranks watch it
    )


def _clean_up_ranks(
    config: TrainConfig,
    procs: dict[int, subprocess.Popen],
    out: Path,
    *,
    hosts: EmulatedHosts | None,
    placement: tuple[int, ...],
    started: float,
) -> None:
    """Stop the ranks still running and remove what killed ranks left (shared-memory segments,
    partial files, MPICH's segments); record and take down the emulated hosts."""
    _terminate(procs)
    remove_segments(p.pid for r, p in procs.items() if r >= 0)  # of ranks killed in the plane's set-up
    ranks_dir, world = out / RANKS_DIR, world_size_of(config)
    remove_partial_files(out, _rank_pids(procs, ranks_dir, world).values())  # of ranks killed writing
    if config.backend == "mpi":  # MPICH's own, of ranks killed before MPI_Finalize
        remove_orphaned("mpich_shm_*", started)
    if hosts is not None:
        try:
            _record_hosts(hosts, out, placement)
        finally:
            hosts.down()


#: the rendezvous port inside emulated hosts (a fresh namespace: nothing else listens there)
MASTER_PORT = 29500


def _record_hosts(hosts: EmulatedHosts, out: Path, placement: tuple[int, ...]) -> None:
    """``OUT/hosts.json``: the emulated hosts, the placement, and the bytes each host's link
    carried (what crossed the shaped links: traffic between hosts, never within one)."""
    try:
        carried = hosts.link_bytes()
    except (TransportError, LookupError, ValueError):  # set-up did not get that far
        return
    atomic_write_json(
        out / "hosts.json",
        {
            "hosts": hosts.hosts,
            "placement": list(placement),
            "addresses": [hosts.address(h) for h in range(hosts.hosts)],
            "nic_bandwidth_bytes_per_s": hosts.rate_bytes_per_s,
            "link_bytes": carried,
        },
    )


def rank_hosts(config: TrainConfig) -> tuple[int, ...]:
    """The host of every rank of ``config``'s run (a parameter server's included): the workers
    in equal blocks over ``config.hosts``, as :mod:`psgdlab.core.platform.placement` places them for the
    simulator too."""
    return equal_blocks(config.workers, hosts=config.hosts).rank_hosts(world_size_of(config))


def _hydra_options(hosts: EmulatedHosts, ranks_dir: Path, per_host: int) -> list[str]:
    """mpiexec's options for emulated hosts: listen on the bridge, a host file of the hosts'
    addresses with ``per_host`` slots each (the placement's blocks, :mod:`psgdlab.core.platform.placement`;
    mpiexec places the ranks beyond the slots, a parameter server, from the first host again: on
    host 0), the namespace launcher hook."""
    host_file = ranks_dir / "hosts.txt"
    atomic_write_text(host_file, "".join(f"{hosts.address(h)}:{per_host}\n" for h in range(hosts.hosts)))
    hook = hosts.write_hydra_launcher(ranks_dir / "hydra_launcher.sh")
    return ["-iface", BRIDGE, "-f", str(host_file), "-launcher", "ssh", "-launcher-exec", str(hook)]


class _Stopped(Exception):
    """SIGINT/SIGTERM arrived before any rank ran."""


def _emulated_hosts(config: TrainConfig) -> EmulatedHosts:
    """This run's hosts, not made yet, after the leftovers of killed launchers are removed."""
    require_netns(config.hosts)
    return fresh_hosts(config.hosts, config.nic_bandwidth_bytes_per_s)


def _watch(
    procs: dict[int, subprocess.Popen],
    ranks_dir: Path,
    world: int,
    timeout_s: float | None,
    forwarded: dict[str, Any] | None = None,
    *,
    deadline_s: float = float("inf"),
    out: Path | None = None,
    policy: str = "stop",
) -> None:
    """Poll the ranks until they all exit; on the first failure stop the run
    (:func:`psgdlab.runtime.failures.stop.stop_run`) and raise the error that names the failed rank.
    Under ``policy="continue"`` the survivors go on (:mod:`psgdlab.runtime.failures.survive.survivors`) once every
    rank has joined their membership (:func:`~psgdlab.runtime.failures.survive.survivors.continuing_path`; a rank lost
    in the set-up stops the run as under ``stop``): a rank stopped past the deadline is killed, and
    the run fails only when no survivor wrote its summary."""
    start = time.monotonic()
    seen: dict[int, int] = {}
    watch = RankWatch(deadline_s)
    oom_before = oom_kills()

    def poll(w: RankWatch) -> None:
        for r, p in procs.items():
            code = p.poll()
            if code is not None and code != 0 and r >= 0 and r not in w.killed_by_us:
                w.saw(r, f"rank {r} {describe_exit(code, oom_before)}", dead=_killed(code), when=w.exited.get(r))
        for r in range(world):  # under mpiexec: a rank that vanished without finishing
            if r not in seen:
                pid_file = ranks_dir / f"rank{r}.pid"
                if pid_file.is_file():
                    text = pid_file.read_text().strip()
                    if text.isdigit() and int(text) > 0:
                        seen[r] = int(text)
            elif (
                r not in procs and process_state(seen[r]) in (None, "Z") and not (ranks_dir / f"rank{r}.done").exists()
            ):
                # (the launcher's own children are judged by their exit status above)
                # a rank that wrote its flight record left on its own (an error, a deadline)
                wrote = out is not None and flight_path(out, r).exists()
                w.saw(
                    r,
                    f"rank {r} {'exited after an error' if wrote else 'died'}",
                    dead=not wrote,
                    when=w.exited.get(r),
                    known=False,
                )

    try:
        while True:
            poll(watch)
            pids = _rank_pids(procs, ranks_dir, world) | seen
            overdue = watch.check_stopped(pids)
            # the survivors can go on once every rank has joined their membership; a rank lost in
            # the set-up (the rendezvous needs every rank) stops the run as under stop
            surviving = policy == "continue" and all(continuing_path(ranks_dir, r).exists() for r in range(world))
            if surviving:  # the survivors gave it up at the deadline: end the process
                watch.kill_stopped(pids, [r for r in overdue if r not in watch.killed_by_us])
            else:
                watch.note_stopped(overdue)  # stopped past the deadline: dead (stop_run kills it)
            mpi = procs.get(-1)
            if mpi is not None and mpi.poll() not in (None, 0) and not watch.failures:
                watch.saw(
                    -1, f"mpiexec {describe_exit(mpi.returncode)} (a rank failed; see its message above)", dead=False
                )
            if surviving and watch.failures and all(p.poll() is not None for p in procs.values()):
                if out is not None and not (out / SUMMARY_FILE).is_file():  # no survivor finished
                    raise TransportError(f"run failed: every rank exited without a summary; {watch.culprits()[0].text}")
                return
            if not surviving and watch.failures and (forwarded or {}).get("sig") is None:
                # (after a forwarded stop, ranks end as they may; under continue the survivors go on)
                if out is None:
                    _terminate(procs)
                    raise TransportError(f"run failed: {watch.culprits()[0].text}")
                message = stop_run(
                    watch,
                    pids=lambda: _rank_pids(procs, ranks_dir, world) | seen,
                    poll=poll,
                    all_exited=lambda: all(p.poll() is not None for p in procs.values()),
                    terminate=lambda: _terminate(procs),
                    ranks_dir=ranks_dir,
                    out=out,
                    world=world,
                    policy="stop" if policy == "continue" else policy,
                )
                raise TransportError(f"run failed: {message}{_full_disk_note(out)}")
            if all(p.poll() is not None for p in procs.values()):
                return
            stopped_at = (forwarded or {}).get("at")
            if stopped_at is not None and time.monotonic() - stopped_at > STOP_GRACE_S:
                _terminate(procs)  # asked to stop, and some rank did not within the grace period
                return
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                _terminate(procs)
                raise TransportError(f"run exceeded its time limit of {timeout_s:.0f} s; every rank was stopped")
            watch.wait_exits(pids, 0.1)  # the exit times to the millisecond: who died first
    finally:
        watch.close()


#: a run directory's file system with less free than this is full, for a failed run's message
FULL_BELOW_BYTES = 1 << 20


def _full_disk_note(out: Path) -> str:
    """``; the file system of OUT is full (...)`` when it is: a rank that failed to write (a
    checkpoint, its flight record) could not say why in a file there."""
    try:
        st = os.statvfs(out)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free >= FULL_BELOW_BYTES:
        return ""
    return f"; the file system of {out} is full ({free} bytes free: No space left on device)"


def _killed(code: int) -> bool:
    """Whether an exit status says the rank was killed from outside (a signal other than SIGABRT,
    which a rank raises itself: a C++ library's terminate after its peer vanished)."""
    return code < 0 and -code != signal.SIGABRT


def _rank_pids(procs: dict[int, subprocess.Popen], ranks_dir: Path, world: int) -> dict[int, int]:
    """Each rank's process id: the launcher's children, else the ranks' pid files (mpiexec)."""
    pids = {r: p.pid for r, p in procs.items() if r >= 0}
    for r in range(world):
        if r not in pids:
            try:
                text = (ranks_dir / f"rank{r}.pid").read_text().strip()
            except OSError:
                continue
            if text.isdigit():
                pids[r] = int(text)
    return pids


def _clear_failure_records(out: Path) -> None:
    """Remove the flight records and ``failure.json`` of an earlier launch into ``out``."""
    (out / FAILURE_FILE).unlink(missing_ok=True)
    flight = out / FLIGHT_DIR
    if flight.is_dir():
        for old in flight.iterdir():
            old.unlink()


def _terminate(procs: dict[int, subprocess.Popen]) -> None:
    for p in procs.values():
        if p.poll() is None:
            _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for p in procs.values():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(p, signal.SIGKILL)
            p.wait()


def _signal(p: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to a rank process, or to mpiexec's whole process group (its ranks included)."""
    try:
        args = p.args if isinstance(p.args, (list, tuple)) else [p.args]
        if any("mpiexec" in str(a) for a in args[:6]):  # also behind ``ip netns exec NS``
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
    except ProcessLookupError:
        pass
