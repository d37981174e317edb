r"""Per-rank training entry and the run directory rank 0 writes.

:func:`train` runs on **every** rank (launched by ``psgdlab train``, torchrun, mpiexec or srun):
it opens the transport from the launcher's environment, builds the workload (or takes the
caller's), runs the worker loop (or the parameter server on rank ``n_workers``), gathers every
rank's trace to rank 0 and writes the run directory there::

    OUT/config.resolved.json  env.json  trace.npz  timeline.json
    OUT/noise_scale.npz       (every pair of gradient norms the ranks took: psgdlab.runtime.loop.noise)
    OUT/trajectory.npz        (with record_params: models after every step, for oracle checks)
    OUT/final_params.npz      (models up to 2 M parameters)
    OUT/checkpoints/...       (psgdlab.runtime.loop.checkpoint)
    OUT/summary.json          (after the rest)
    OUT/complete.json         the commit marker, last (psgdlab.core.records.rundir.commit_run); not
                              for a run stopped early (SIGTERM), which --resume continues

Any ``torch.nn.Module`` trains through ``workload_factory``::

    from psgdlab.runtime import TrainConfig, ModuleWorkload, train
    cfg = TrainConfig(algorithm="adpsgd", workers=4, steps=200, out="runs/mine")
    train(cfg, workload_factory=lambda rank, world: ModuleWorkload(make_net, MySampler(rank, world),
                                                                   samples_per_step=cfg.batch))
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from psgdlab.core.convergence.noise_scale import NOISE_ROWS_DTYPE, summarize_noise_scale
from psgdlab.core.errors import ConfigError, TransportError
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.core.platform.timing import ComputeTime
from psgdlab.core.records.rundir import RunDir, Summary, commit_run, environment, write_summary
from psgdlab.core.records.trace import (
    TRACE_DTYPE,
    atomic_write_bytes,
    empty_trace,
    read_trace,
    summarize,
    to_chrome_trace,
    write_trace,
)
from psgdlab.core.schedules import lr_schedule
from psgdlab.models.recipes import LSQ_MODEL
from psgdlab.runtime.config import TrainConfig, build_algorithm, lsq_problem, world_size_of
from psgdlab.runtime.failures.flight import SETUP_DEADLINE_S, FlightRecorder, Watchdog
from psgdlab.runtime.failures.survive.mailbox import address_toward
from psgdlab.runtime.failures.survive.survivors import (
    SURVIVOR_RESULTS_DIR,
    Survivors,
    clear_previous_segment,
    continuing_path,
    survivor_throughput,
    work_lost,
)
from psgdlab.runtime.launcher.elastic import Progress, restart_count
from psgdlab.runtime.loop import checkpoint as ckpt
from psgdlab.runtime.loop.driver import DriverOptions, RankResult, Snapshot, run_worker
from psgdlab.runtime.loop.exchange.stopping import FileBoard
from psgdlab.runtime.loop.exchange.transform import TRANSFORM_ENV, transform_named
from psgdlab.runtime.loop.noise import method_of
from psgdlab.runtime.loop.scan import collect_groups
from psgdlab.runtime.loop.server import run_server
from psgdlab.runtime.loop.workloads import LeastSquaresWorkload, ModuleWorkload
from psgdlab.runtime.transports.channels import open_channels, rank_device
from psgdlab.runtime.transports.env import LaunchEnv, host_identity, launch_env

__all__ = ["train", "build_workload", "steps_per_epoch", "HELD_OUT_KEYS", "heldout_curve"]

#: what each held-out evaluation records (psgdlab.models.scoring.score_corpus): frame accuracy,
#: frame cross-entropy, the HMM decoder's WER (``wer`` = ``wer_viterbi``) and the majority vote's
HELD_OUT_KEYS = ("frame_accuracy", "loss", "wer", "wer_viterbi", "wer_vote")

log = logging.getLogger(__name__)


def _corpora(config: TrainConfig, rank: int) -> tuple[Any, Any]:
    from psgdlab.models.data import load_corpus, synthetic_corpus

    held = list(config.held_out_speakers)

    def load(path: str | Path) -> tuple[Any, Any]:
        return load_corpus(path, exclude_speakers=held or None), (load_corpus(path, speakers=held) if held else None)

    if config.data != "synthetic":
        return load(config.data)
    # the corpus is read into memory, so its file lives only as long as the loading
    with tempfile.TemporaryDirectory(prefix=f"psgdlab-synth-{rank}-") as tmp:
        made = synthetic_corpus(Path(tmp) / "synthetic.h5", n_utterances=config.synthetic_utterances, seed=config.seed)
        return load(made)


def build_workload(config: TrainConfig, rank: int, *, device: torch.device | None = None) -> tuple[Any, int]:
    """The workload of ``rank`` and the steps per epoch (same on every rank)."""
    if config.model == LSQ_MODEL:
        problem = lsq_problem(config)
        return LeastSquaresWorkload(problem, device=device), max(1, config.lsq_samples_per_worker // config.batch)
    from psgdlab.models.batches import WindowSampler
    from psgdlab.models.networks import build_model
    from psgdlab.models.scoring import score_corpus, state_priors

    train_corpus, held = _corpora(config, rank)
    sampler = WindowSampler(
        train_corpus, window=config.window, batch=config.batch, rank=rank, world_size=config.workers, seed=config.seed
    )
    total_windows = max(1, train_corpus.n_frames // config.window)
    spe = max(1, math.ceil(total_windows / (config.batch * config.workers)))
    evaluator = None
    if held is not None:
        priors = state_priors(train_corpus.labels, train_corpus.n_classes)

        def evaluator(model: torch.nn.Module, _held: Any = held) -> dict[str, float]:
            scores = score_corpus(model, _held, window=config.window, priors=priors)
            return {
                **{key: float(scores[key]) for key in HELD_OUT_KEYS},
                "wer_by_speaker": scores.get("wer_by_speaker", {}),
            }

    def factory() -> torch.nn.Module:
        return build_model(
            config.model, input_dim=train_corpus.input_dim, n_classes=train_corpus.n_classes, window=config.window
        )

    workload = ModuleWorkload(
        factory, sampler, samples_per_step=config.batch, seed=config.seed, device=device, evaluator=evaluator
    )
    workload.samples_per_epoch = float(total_windows)
    return workload, spe


def steps_per_epoch(config: TrainConfig) -> int:
    return build_workload(config, 0)[1]


def _progress_bar(total: int, initial: int) -> Callable[[int, float, float], None] | None:
    # the commands' rule: a bar on a terminal; PSGDLAB_PROGRESS=0 (train --no-progress) or 1 decides
    if os.environ.get("PSGDLAB_PROGRESS") == "0" or not (
        sys.stderr.isatty() or os.environ.get("PSGDLAB_PROGRESS") == "1"
    ):
        return None
    from tqdm import tqdm

    bar = tqdm(total=total, initial=initial, file=sys.stderr, unit="step", dynamic_ncols=True)

    def update(step: int, loss: float, rate: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4g}", samples_per_s=f"{rate:.4g}" if math.isfinite(rate) else "-")
        if step + 1 >= total:
            bar.close()

    return update


def train(
    config: TrainConfig,
    *,
    workload_factory: Callable[[int, int], Any] | None = None,
    env: LaunchEnv | None = None,
    master: tuple[str, int] | None = None,
) -> dict[str, Any] | None:
    """Run this rank's part of the training run ``config``; returns the summary on rank 0.

    Parameters
    ----------
    config : TrainConfig
    workload_factory : callable (rank, n_workers) -> Workload, optional
        Plug in any model and sampler (:class:`~psgdlab.runtime.loop.workloads.ModuleWorkload`);
        default: the model and data named by ``config``. Pass ``steps`` (not ``epochs``) then.
    env : LaunchEnv, optional
        Default: from the launcher's environment variables.
    master : (host, port), optional
        The rendezvous of torch.distributed where ``MASTER_ADDR``/``MASTER_PORT`` do not say it;
        default: ``env.master`` (under ``srun``, derived from the Slurm job).

    Notes
    -----
    Every blocking wait of the rank has the deadline ``config.timeout_s`` (:mod:`psgdlab.runtime.failures.flight`):
    past it, or when the launcher aborts the run, the rank writes ``OUT/flight/rank{r}.json`` and
    exits the process; a run that raises writes it too.

    ``config.resume``, or ``config.failure_policy == "restart"`` in a worker group torchrun's agent
    restarted (``TORCHELASTIC_RESTART_COUNT`` > 0): the ranks resume from the newest complete
    checkpoint every rank can read (:func:`_agree_on_checkpoint`; a restart with none starts at
    step 0). Under ``psgdlab train --on-failure restart`` every worker also keeps its
    :class:`~psgdlab.runtime.launcher.elastic.Progress` record.
    """
    env = env or launch_env()
    flight = FlightRecorder(env.rank, out=config.out or None, deadline_s=config.timeout_s)
    watchdog = Watchdog(flight, ranks_dir=os.environ.get("PSGDLAB_RANKS_DIR")).start()
    try:
        return _train(config, flight, workload_factory=workload_factory, env=env, master=master or env.master)
    except BaseException as exc:
        flight.dump("error", " ".join(str(exc).split()) or type(exc).__name__)
        raise
    finally:
        watchdog.stop()


def _train(
    config: TrainConfig,
    flight: FlightRecorder,
    *,
    workload_factory: Callable[[int, int], Any] | None,
    env: LaunchEnv,
    master: tuple[str, int] | None,
) -> dict[str, Any] | None:
    """:func:`train`, its waits recorded in ``flight``."""
    algorithm = build_algorithm(config)
    world = _checked_world(config, algorithm, env)
    rank = env.rank
    # NCCL: the workload lives on this rank's GPU, where the transport moves the payloads
    device = rank_device(config.backend, env)
    workload, steps, spe = _rank_workload(config, rank, device, workload_factory)
    out = Path(config.out) if config.out else None
    restarted = _check_resume(config, out)
    torch.set_num_threads(1)
    # the watchdog holds every exchange to --timeout; the set-up and the backends' own timeouts
    # (a backstop) get at least SETUP_DEADLINE_S: the rendezvous waits for the slowest rank to start
    backstop_s = max(config.timeout_s, SETUP_DEADLINE_S)
    setup = _set_up(
        config,
        flight,
        algorithm,
        env=env,
        master=master,
        device=device,
        groups=collect_groups(algorithm, steps),
        out=out,
        restarted=restarted,
        backstop_s=backstop_s,
    )
    start_step, main, everyone = setup.start_step, setup.channels["main"], tuple(range(world))
    flight.set_origin(setup.origin)
    options = _driver_options(
        config, rank=rank, steps=steps, spe=spe, start_step=start_step, out=out, run_id=setup.run_id
    )
    survivors = None
    if config.failure_policy == "continue":  # every rank is a worker (continue has no server)
        with flight.wait("setup", what="mailbox", step=start_step, peers=everyone, deadline_s=backstop_s + 5.0):
            survivors = _open_survivors(
                algorithm, rank=rank, out=out, config=config, origin=setup.origin, main=main, deadline_s=backstop_s
            )
    t0 = time.time()
    result = _run_rank(
        config, algorithm, workload, setup, options=options, rank=rank, flight=flight, survivors=survivors
    )
    result.extra["host"] = host_identity()
    result.extra["launch"] = _launch_record(config, env)
    plane = getattr(main, "plane", None)
    result.extra["shm_peers"] = sorted(plane.local - {rank}) if plane is not None else []
    if survivors is not None:
        return _finish_surviving(
            config,
            algorithm,
            survivors,
            result,
            workload=workload,
            steps=steps,
            start_step=start_step,
            out=out,  # type: ignore[arg-type]  # continue needs a run directory (TrainConfig)
            world=world,
            wall_s=time.time() - t0,
        )
    return _gather_and_write(
        config,
        algorithm,
        workload,
        result,
        main,
        rank=rank,
        t0=t0,
        steps=steps,
        start_step=start_step,
        out=out,
        world=world,
        flight=flight,
    )


def _checked_world(config: TrainConfig, algorithm: Any, env: LaunchEnv) -> int:
    """The run's world size, refused (:class:`ConfigError`) where the launcher's differs."""
    world = world_size_of(config)
    if env.world_size != world:
        server = " (workers + 1 parameter server)" if algorithm.has_server else ""
        batch = "; this is a Slurm job's batch script, not a task of srun: start the ranks with srun"
        raise ConfigError(
            f"world size ({env.world_size}) from the launcher must be {world}{server} for "
            f"--workers {config.workers} with {config.algorithm}" + (batch if env.launcher == "slurm-batch" else "")
        )
    return world


def _check_resume(config: TrainConfig, out: Path | None) -> bool:
    """Whether this is a restarted attempt (``--on-failure restart``); a resume (or restart) without
    a run directory, or ``--resume`` of one without a complete checkpoint, refused."""
    restarted = config.failure_policy == "restart" and restart_count() > 0
    if (config.resume or restarted) and out is None:
        raise ConfigError("resume needs the run directory (--resume DIR)")
    if config.resume and ckpt.latest_complete_step(out, config.workers) is None:  # type: ignore[arg-type]
        raise ConfigError(f"run directory {out} has no complete checkpoint to resume from")
    return restarted


def _rank_workload(
    config: TrainConfig, rank: int, device: torch.device | None, workload_factory: Callable[[int, int], Any] | None
) -> tuple[Any, int, int | None]:
    """This rank's workload (a server rank takes the last worker's), the steps per worker and the
    steps per epoch (``None`` for a custom workload)."""
    spe: int | None
    if workload_factory is not None:
        workload, spe = workload_factory(min(rank, config.workers - 1), config.workers), None
    else:
        workload, spe = build_workload(config, min(rank, config.workers - 1), device=device)
    if config.steps is not None:
        return workload, config.steps, spe
    if spe is None:
        raise ConfigError("epochs needs the built-in data; give --steps with a custom workload")
    return workload, max(1, math.ceil(config.epochs * spe)), spe  # type: ignore[operator]


@dataclasses.dataclass
class _SetUp:
    """What every rank agreed on at the set-up: the ``channels``, the step to start from (with the
    checkpoint's ``resume_payload``), the ``run_id`` and the run's start (``origin``, epoch s)."""

    channels: dict[str, Any]
    start_step: int
    resume_payload: dict[str, Any] | None
    run_id: str
    origin: float


def _set_up(
    config: TrainConfig,
    flight: FlightRecorder,
    algorithm: Any,
    *,
    env: LaunchEnv,
    master: tuple[str, int] | None,
    device: torch.device | None,
    groups: Any,
    out: Path | None,
    restarted: bool,
    backstop_s: float,
) -> _SetUp:
    """Open the channels, agree on the checkpoint to resume from and on the run's start and id
    (rank 0 writes a new run's record)."""
    rank, world = env.rank, env.world_size  # the run's (_checked_world)
    everyone = tuple(range(world))
    with flight.wait("setup", step=0, peers=everyone, deadline_s=backstop_s):
        channels = open_channels(
            config.backend,
            env=env,
            groups=groups,
            timeout_s=backstop_s,
            master=master,
            device=device,
        )
        main = channels["main"]
        start_step, resume_payload, run_id = 0, None, None
        if config.resume or (restarted and ckpt.has_run_record(out)):  # type: ignore[arg-type]
            run_id = ckpt.check_run_record(out, workers=config.workers, world_size=world, algorithm=algorithm.params())  # type: ignore[arg-type]
            start_step, resume_payload = _agree_on_checkpoint(main, out, workers=config.workers, run_id=run_id)  # type: ignore[arg-type]
            if config.resume and start_step == 0 and resume_payload is None:
                raise ConfigError(f"run directory {out} has no readable complete checkpoint to resume from")
        if rank == 0 and out is not None:  # every rank waits at the broadcast below
            FileBoard.clear(out)  # the stop announcements of an earlier run in the directory
        # the run's start and, for a new run, its id (52 random bits: exact in a float64)
        stamp = torch.tensor([time.time(), float(secrets.randbits(52))], dtype=torch.float64, device=main.device)
        main.broadcast(stamp, 0, everyone)
        if run_id is None:
            run_id = f"{int(stamp[1].item()):013x}"
            if rank == 0 and out is not None:
                ckpt.write_run_record(
                    out, run_id=run_id, workers=config.workers, world_size=world, algorithm=algorithm.params()
                )
    return _SetUp(channels, start_step, resume_payload, run_id, float(stamp[0].item()))


def _driver_options(
    config: TrainConfig, *, rank: int, steps: int, spe: int | None, start_step: int, out: Path | None, run_id: str
) -> DriverOptions:
    """The step loop's options: the LR schedule, the emulated compute time and stragglers, the
    checkpoints, the held-out evaluations and the progress (rank 0's bar, a restart's record)."""
    progress = _progress_bar(steps, start_step) if rank == 0 else None
    ranks_dir = os.environ.get("PSGDLAB_RANKS_DIR")
    if config.failure_policy == "restart" and ranks_dir and rank < config.workers:
        record = Progress(ranks_dir, rank=rank, attempt=restart_count(), start_step=start_step)
        progress = record if progress is None else _both(progress, record)
    base_lr = lr_schedule(
        config.lr_schedule,
        lr=config.lr,
        total_batch=config.batch * config.workers,
        steps_per_epoch=spe or max(steps, 1),
        total_steps=steps,
        lr_final=config.lr_final,
    )
    return DriverOptions(
        steps=steps,
        lr_of=base_lr,
        start_step=start_step,
        compute_time=ComputeTime.parse(config.compute_time) if config.compute_time else None,
        stragglers=StragglerModel.parse(config.straggler, seed=config.seed, n_workers=config.workers),
        run_dir=out,
        run_id=run_id,
        checkpoint_every=config.checkpoint_every,
        record_params=config.record_params,
        seed=config.seed,
        evaluate_every=(spe or 0) if config.evaluate else 0,
        evaluate_every_s=config.evaluate_every_s if config.evaluate else 0.0,
        noise_scale_every=config.noise_scale_every,
        progress=progress,
        transform=transform_named(os.environ.get(TRANSFORM_ENV, "identity") or "identity"),
    )


def _run_rank(
    config: TrainConfig,
    algorithm: Any,
    workload: Any,
    setup: _SetUp,
    *,
    options: DriverOptions,
    rank: int,
    flight: FlightRecorder,
    survivors: Survivors | None,
) -> RankResult:
    """Run this rank's steps: a worker's, or the parameter server's; a transport's error as
    :class:`TransportError` naming the rank."""
    try:
        if rank < config.workers:
            return run_worker(
                algorithm,
                workload,
                setup.channels,
                options=options,
                origin=setup.origin,
                resume_payload=setup.resume_payload,
                flight=flight,
                survivors=survivors,
            )
        info = run_server(
            algorithm, workload, setup.channels, options=options, resume_payload=setup.resume_payload, flight=flight
        )
        return RankResult(
            rank=rank, trace=empty_trace(), final_params=None, trajectory=None, evaluations=[], extra={"server": info}
        )
    except RuntimeError as exc:
        if survivors is not None:
            survivors.close()
        if isinstance(exc, TransportError):
            raise
        raise TransportError(f"rank {rank}: {exc}") from exc


def _gather_and_write(
    config: TrainConfig,
    algorithm: Any,
    workload: Any,
    result: RankResult,
    main: Any,
    *,
    rank: int,
    t0: float,
    steps: int,
    start_step: int,
    out: Path | None,
    world: int,
    flight: FlightRecorder,
) -> dict[str, Any] | None:
    """Gather every rank's result and the mean model snapshots on rank 0, leave the process group,
    and (rank 0) score the snapshots and write the run directory; rank 0's summary, ``None`` elsewhere."""
    everyone = tuple(range(world))
    own, result.snapshots = result.snapshots, []  # averaged below; nothing to send
    with flight.wait("gather", what="results", step=steps, peers=everyone):
        results = main.gather_object(result, root=0)
    wall_s = time.time() - t0
    with flight.wait("gather", what="model snapshots", step=steps, peers=everyone):
        snapshots = _mean_snapshots(main, own, rank=rank, workers=config.workers)
        main.barrier()
    if rank == 0 and out is not None:  # every rank is past its last step
        FileBoard.clear(out)
    if config.backend != "mpi":
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if rank != 0:
        return None
    assert results is not None
    # held-out scoring after training: the other ranks have left, the training time is measured
    next(r for r in results if r.rank == 0).evaluations = _score_snapshots(workload, snapshots)
    return _write_run_dir(
        config,
        algorithm,
        results,
        steps=steps,
        start_step=start_step,
        out=out,
        world=world,
        wall_s=wall_s,
        evaluate=workload.evaluate if config.evaluate else None,
        payload=_payload(workload),
        samples_per_epoch=getattr(workload, "samples_per_epoch", None),
    )


def _open_survivors(
    algorithm: Any,
    *,
    rank: int,
    out: Path | None,
    config: TrainConfig,
    origin: float,
    main: Any,
    deadline_s: float,
) -> Survivors:
    """The membership of a ``--on-failure continue`` run (:mod:`psgdlab.runtime.failures.survive.survivors`): the
    mailboxes' addresses are exchanged while every rank is alive, then each connects to all within
    ``deadline_s`` (the error names the ranks that did not connect)."""
    import torch.distributed as dist

    assert out is not None  # TrainConfig requires a run directory for continue
    if rank == 0:
        clear_previous_segment(out)
    dist.barrier()
    survivors = Survivors(
        algorithm,
        rank=rank,
        run_dir=out,
        deadline_s=config.timeout_s,
        host=address_toward(os.environ.get("MASTER_ADDR", "127.0.0.1")),  # where its peers reach it
        origin=origin,
        plane=getattr(main, "plane", None),
    )
    found: list[Any] = [None] * config.workers
    dist.all_gather_object(found, (survivors.mailbox.address, host_identity()))
    survivors.mailbox.open([address for address, _ in found], deadline_s=deadline_s)
    survivors.hosts = [host for _, host in found]
    ranks_dir = os.environ.get("PSGDLAB_RANKS_DIR")
    if ranks_dir:  # from here a death is one the others survive (the launcher reads it)
        continuing_path(ranks_dir, rank).touch()
    return survivors


def _finish_surviving(
    config: TrainConfig,
    algorithm: Any,
    survivors: Survivors,
    result: RankResult,
    *,
    workload: Any,
    steps: int,
    start_step: int,
    out: Path,
    world: int,
    wall_s: float,
) -> dict[str, Any] | None:
    """The end of a ``continue`` run: no collective (a member may be dead), files instead. Each
    survivor writes its result to ``OUT/results/rank{r}.pt``; the lowest living member waits for
    every other living member's (giving up one that writes none within ``--timeout``), averages
    their model snapshots, scores them and writes the run directory; the others wait for the
    summary, standing in for the writer if it dies. Returns the summary on the rank that wrote it."""
    rank = survivors.rank
    result.extra["survivor_report"] = survivors.report()
    folder = out / SURVIVOR_RESULTS_DIR
    folder.mkdir(exist_ok=True)
    buf = io.BytesIO()
    torch.save(_result_state(result), buf)
    try:
        atomic_write_bytes(folder / f"rank{rank}.pt", buf.getvalue())
    except OSError as exc:
        raise TransportError(
            f"rank {rank}: its result could not be written to {folder} ({exc.strerror or exc}); "
            f"the checkpoints in {out / 'checkpoints'} are intact"
        ) from None
    paths = {r: folder / f"rank{r}.pt" for r in range(config.workers)}
    try:
        while not survivors.summary_path.exists():
            if rank != min(survivors.epoch().alive):
                time.sleep(0.05)
                continue
            found = survivors.wait_for(paths, config.timeout_s)
            results = [_result_of_state(torch.load(p, weights_only=True)) for p in found.values()]
            snapshots = _mean_surviving_snapshots(results)
            for r in results:
                r.snapshots = []
            next(r for r in results if r.rank == rank).evaluations = _score_snapshots(workload, snapshots)
            changes = survivors.history()
            work_lost(changes, [r.extra["survivor_report"] for r in results])
            for change in changes:
                change["samples_lost"] = sum(change["steps_lost"].values()) * _samples_per_step(config)
            survivors.mailbox.finish()  # from here ranks leaving are not deaths
            survivors.groups.remove()  # every survivor is past its last collective
            return _write_run_dir(
                config,
                algorithm,
                results,
                steps=steps,
                start_step=start_step,
                out=out,
                world=world,
                wall_s=wall_s,
                evaluate=workload.evaluate if config.evaluate else None,
                payload=_payload(workload),
                membership=(changes, sorted(found)),
                hosts=survivors.hosts,
                samples_per_epoch=getattr(workload, "samples_per_epoch", None),
            )
        return None
    finally:
        survivors.close()


def _result_state(result: RankResult) -> dict[str, Any]:
    """``result`` as tensors and plain values, which ``torch.load(weights_only=True)`` reads back
    without running code (:func:`_result_of_state` inverts it)."""

    def tensor(a: np.ndarray | None) -> torch.Tensor | None:
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a))

    extra = dict(result.extra)
    if "noise_rows" in extra:  # a structured array, as bytes (weights_only reads no numpy)
        raw = extra["noise_rows"].tobytes()
        extra["noise_rows"] = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        )
    return {
        "rank": result.rank,
        "trace": torch.frombuffer(bytearray(result.trace.tobytes()), dtype=torch.uint8),
        "final_params": tensor(result.final_params),
        "trajectory": tensor(result.trajectory),
        "evaluations": result.evaluations,
        "preempted": result.preempted,
        "snapshots": result.snapshots,
        "extra": extra,
    }


def _result_of_state(state: dict[str, Any]) -> RankResult:
    def array(t: torch.Tensor | None) -> np.ndarray | None:
        return None if t is None else t.numpy()

    extra = dict(state["extra"])
    if "noise_rows" in extra:
        extra["noise_rows"] = np.frombuffer(extra["noise_rows"].numpy().tobytes(), dtype=NOISE_ROWS_DTYPE).copy()
    return RankResult(
        rank=state["rank"],
        trace=np.frombuffer(state["trace"].numpy().tobytes(), dtype=TRACE_DTYPE).copy(),
        final_params=array(state["final_params"]),
        trajectory=array(state["trajectory"]),
        evaluations=state["evaluations"],
        preempted=state["preempted"],
        snapshots=[(int(key), int(step), float(t), p) for key, step, t, p in state["snapshots"]],
        extra=extra,
    )


def _mean_surviving_snapshots(results: list[RankResult]) -> list[tuple[int, float, float, torch.Tensor]]:
    """The mean over the survivors of the snapshots every one of them took (by key): ``(key, mean
    step, mean wall time, mean model)``."""
    common = _common_keys([[s[0] for s in r.snapshots] for r in results])
    out = []
    for key in common:
        taken = [next(s for s in r.snapshots if s[0] == key) for r in results]
        out.append(
            (
                key,
                float(np.mean([t[1] for t in taken])),
                float(np.mean([t[2] for t in taken])),
                torch.stack([t[3] for t in taken]).mean(dim=0),
            )
        )
    return out


def _common_keys(keys: list[list[int]]) -> list[int]:
    """The snapshot keys every worker has, in order."""
    if not keys:
        return []
    common = set(keys[0]).intersection(*map(set, keys[1:]))
    return sorted(common)


def _agree_on_checkpoint(main: Any, out: Path, *, workers: int, run_id: str) -> tuple[int, dict[str, Any] | None]:
    """The newest complete checkpoint of run ``run_id`` every rank can read, and this rank's
    payload of it; ``(0, None)`` if there is none. Collective over every rank: each loads its own
    file of the newest complete step (:func:`psgdlab.runtime.loop.checkpoint.complete_steps`) and rank 0
    decides; when some rank's file is corrupt, unreadable or of another run, rank 0 says so in one
    line and every rank tries the previous complete step. The parameter server loads ``server.pt``."""
    rank, world = main.rank, main.world_size
    everyone = tuple(range(world))
    for step in ckpt.complete_steps(out, workers):
        payload, problem = None, None
        if rank < workers:
            try:
                payload = ckpt.load_checkpoint(out, step=step, rank=rank, run_id=run_id)
            except ckpt.CheckpointError as exc:
                problem = str(exc)
        problems = main.gather_object(problem, root=0)
        verdict = torch.zeros(1, dtype=torch.float64, device=main.device)
        if rank == 0:
            bad = [p for p in problems if p is not None]
            verdict[0] = float(len(bad))
            if bad:
                print(
                    f"psgdlab: the checkpoint of step {step} is unusable ({'; '.join(bad)}); "
                    "falling back to the previous complete checkpoint",
                    file=sys.stderr,
                    flush=True,
                )
        main.broadcast(verdict, 0, everyone)
        if verdict.item() == 0:
            if rank >= workers:
                payload = ckpt.load_server(out, run_id=run_id)
            return step, payload
    return 0, None


def _both(first: Callable[[int, float, float], None], second: Callable[[int, float, float], None]) -> Callable:
    def call(step: int, loss: float, rate: float) -> None:
        first(step, loss, rate)
        second(step, loss, rate)

    return call


def _mean_snapshots(
    main: Any, snapshots: list[Snapshot], *, rank: int, workers: int
) -> list[tuple[int, float, float, torch.Tensor]]:
    """On rank 0, the mean over the workers of their snapshots, as ``(key, mean step, mean wall
    time, mean model)`` (a decentralized run's replicas differ: their mean is the model a user
    keeps; synchronous replicas equal it); ``[]`` on the other ranks. Collective over the workers
    (a server rank returns at once). The snapshots averaged are those of the keys every worker
    took (:data:`~psgdlab.runtime.loop.driver.Snapshot`; after a SIGTERM stop some took fewer):
    the keys go round first, padded to the longest list."""
    if rank >= workers:
        return []
    if workers == 1:
        return [(key, float(step), t, params) for key, step, t, params in snapshots]
    group = tuple(range(workers))
    mine = torch.tensor([float(len(snapshots))], dtype=torch.float64, device=main.device)
    counts = [int(c) for c in main.allgather(mine, [1] * workers, group).tolist()]
    longest = max(counts)
    if longest == 0:
        return []
    padded = torch.full((longest,), -1.0, dtype=torch.float64, device=main.device)
    padded[: len(snapshots)] = torch.tensor([float(s[0]) for s in snapshots], dtype=torch.float64)
    every = main.allgather(padded, [longest] * workers, group).reshape(workers, longest).cpu().tolist()
    common = _common_keys([[int(k) for k in row[:c]] for row, c in zip(every, counts, strict=True)])
    by_key = {s[0]: s for s in snapshots}
    out = []
    for key in common:
        _, step, t, params = by_key[key]
        buf = params.to(main.device, copy=True)
        when = torch.tensor([float(step), t], dtype=torch.float64, device=main.device)
        main.allreduce_sum(buf, group)
        main.allreduce_sum(when, group)
        if rank == 0:
            mean_step, mean_t = (when / workers).tolist()
            out.append((key, mean_step, mean_t, (buf / workers).cpu()))
    return out


def _score_snapshots(workload: Any, snapshots: list[tuple[int, float, float, torch.Tensor]]) -> list[dict[str, Any]]:
    """``workload.evaluate`` of every snapshot ``(key, mean step, mean wall time, params)`` (the
    workers' mean model), logged as it goes: each evaluation has ``step`` (the workers' mean,
    rounded), ``steps_mean``, ``time_s`` (wall seconds since the run's start) and ``score_s``."""
    evaluations = []
    for _, step_mean, time_s, params in snapshots:
        t0 = time.perf_counter()
        step = round(step_mean)
        scores = workload.evaluate(params.to(getattr(workload, "device", params.device)))
        evaluations.append(
            {
                "step": step,
                "steps_mean": step_mean,
                "time_s": time_s,
                **scores,
                "score_s": time.perf_counter() - t0,
            }
        )
        log.info(
            "held-out after step %d: %s",
            step,
            ", ".join(f"{k} {v:.4g}" for k, v in scores.items() if isinstance(v, float)),
        )
    return evaluations


def _write_run_dir(
    config: TrainConfig,
    algorithm: Any,
    results: list[RankResult],
    *,
    steps: int,
    start_step: int,
    out: Path | None,
    world: int,
    wall_s: float,
    evaluate: Callable | None,
    payload: dict[str, int] | None = None,
    membership: tuple[list[dict[str, Any]], list[int]] | None = None,
    hosts: list[str] | None = None,
    samples_per_epoch: float | None = None,
) -> dict[str, Any]:
    """Write the run directory from the ranks' ``results`` (the survivors' under ``continue``,
    whose ``membership`` is (changes, survivors), and ``hosts`` every rank's host); returns the
    summary. With ``samples_per_epoch`` (the built-in workloads) the summary has the keys a
    reference run needs (:data:`psgdlab.core.convergence.fit.REFERENCE_KEYS`)."""
    workers = [r for r in results if r.rank < config.workers]
    trace = _run_trace(config, workers, start_step=start_step, out=out)
    samples = _samples_per_step(config)
    summary = _step_figures(
        config, trace, steps=steps, start_step=start_step, world=world, wall_s=wall_s, samples=samples
    )
    summary.update(
        {
            # a run that finished lost no rank unless it went on without some (continue); a
            # failed run writes OUT/failure.json instead (psgdlab.runtime.failures.stop: the same keys)
            "membership_changes": membership[0] if membership else [],
            "survivors": membership[1] if membership else list(range(world)),
            **(payload or {}),
        }
    )
    if membership and membership[0]:
        summary.update(survivor_throughput(trace, membership[0], samples_per_step=samples))
    finals = [r.final_params for r in sorted(workers, key=lambda r: r.rank) if r.final_params is not None]
    summary.update(_model_figures(config, algorithm, results, finals, evaluate=evaluate))
    summary.update(_held_out_figures(config, workers, samples=samples, samples_per_epoch=samples_per_epoch))
    noise_rows = [r.extra["noise_rows"] for r in workers if "noise_rows" in r.extra]
    rows = np.concatenate(noise_rows) if noise_rows else None
    if rows is not None:
        methods = {m for r in workers for m in r.extra.get("noise_methods", [])}
        summary.update(summarize_noise_scale(rows, method=method_of(rows, methods)).to_json())
    params = algorithm.params()
    n_hosts, placement = _placement(
        hosts or [str(r.extra.get("host", "")) for r in sorted(results, key=lambda r: r.rank)]
    )
    summary["shm_peers"] = [r.extra.get("shm_peers", []) for r in sorted(results, key=lambda r: r.rank)]
    if config.nic_bandwidth is not None:
        summary["nic_bandwidth_bytes_per_s"] = config.nic_bandwidth_bytes_per_s
    case = Summary(
        source="runtime",
        algorithm=str(params["algorithm"]),
        algorithm_params=params,
        workers=config.workers,
        hosts=n_hosts,
        placement=placement,
        figures=summary,
    )
    if out is None:
        return case.to_json()
    meta = _trace_meta(config, algorithm, workers, out=out, samples=samples, payload=payload, membership=membership)
    _write_run_files(
        config, algorithm, results, case, trace, meta, out=out, steps=steps, start_step=start_step, world=world
    )
    if len(finals) == len(workers):
        _save_npz(out / "final_params.npz", params=np.stack(finals))
    if rows is not None:
        _save_npz(out / "noise_scale.npz", rows=rows)
    write_summary(RunDir(out), case)
    if not any(r.preempted for r in workers):  # a run stopped early (SIGTERM) is not complete: --resume it
        commit_run(out, command="train")
    return case.to_json()


def _run_trace(config: TrainConfig, workers: list[RankResult], *, start_step: int, out: Path | None) -> np.ndarray:
    """The workers' traces in one, in time order; after ``--resume`` the resumed run's before them."""
    trace = np.concatenate([r.trace for r in workers])
    # the trace of the run resumed (a restart keeps no trace of its failed attempt: steps before the
    # restart's checkpoint are missing from it unless that checkpoint came from --resume's run)
    if config.resume and start_step > 0 and out is not None and (out / "trace.npz").is_file():
        old, _ = read_trace(out / "trace.npz")
        old = old[old["step"] < start_step]
        if old.size:
            shift = float(old["end_s"].max())
            trace["start_s"] += shift
            trace["end_s"] += shift
            trace = np.concatenate([old, trace])
    return np.sort(trace, order=("start_s", "rank", "step"), kind="stable")


def _step_figures(
    config: TrainConfig, trace: np.ndarray, *, steps: int, start_step: int, world: int, wall_s: float, samples: int
) -> dict[str, Any]:
    """The trace's figures (:func:`summarize`), its loss curve (at most about 1000 points) and the run's set-up."""
    summary = summarize(trace, samples_per_step=samples, warmup_steps=1 if steps - start_step > 4 else 0)
    compute = trace[trace["phase"] == 0]
    steps_idx = np.unique(compute["step"])
    curve = [float(np.nanmean(compute["loss"][compute["step"] == s])) for s in steps_idx]
    stride = max(1, len(steps_idx) // 1000)
    summary["loss_curve"] = {"step": [int(s) for s in steps_idx[::stride]], "loss": curve[::stride]}
    summary.pop("workers")  # a case key of the Summary
    summary.update(
        {
            "backend": config.backend,
            "world_size": world,
            "samples_per_step": samples,
            "steps_per_worker": steps,
            "wall_s": wall_s,
            "on_failure": config.failure_policy,
        }
    )
    return summary


def _model_figures(
    config: TrainConfig,
    algorithm: Any,
    results: list[RankResult],
    finals: list[np.ndarray],
    *,
    evaluate: Callable | None,
) -> dict[str, Any]:
    """The compute-time overruns, the parameter server's figures, the workers' final models'
    consensus distance and (least squares) the mean model's scores."""
    workers = [r for r in results if r.rank < config.workers]
    figures: dict[str, Any] = {}
    if config.compute_time:  # steps whose real compute outlasted --compute-time (emulation not honoured)
        figures["compute_time_overrun_steps"] = int(sum(r.extra.get("compute_overruns", 0) for r in workers))
    if algorithm.has_server:
        figures["server"] = {
            "rank": config.workers,
            **next(r.extra["server"] for r in results if r.rank == config.workers),
        }
    if len(finals) == len(workers):
        stack = np.stack(finals)
        figures["consensus_distance"] = float(np.sum((stack - stack.mean(axis=0)) ** 2))
        if evaluate is not None and config.model == LSQ_MODEL:
            figures.update({f"mean_model_{k}": v for k, v in evaluate(torch.as_tensor(stack.mean(axis=0))).items()})
    return figures


def _held_out_figures(
    config: TrainConfig, workers: list[RankResult], *, samples: int, samples_per_epoch: float | None
) -> dict[str, Any]:
    """The held-out evaluations and, with ``samples_per_epoch``, the held-out curve in epochs."""
    figures: dict[str, Any] = {}
    evaluations = [e for r in workers for e in r.evaluations]
    if evaluations:
        figures["held_out"] = evaluations
        figures["held_out_model"] = "rank 0" if config.workers == 1 else f"mean of {len(workers)} workers"
        figures["held_out_last"] = evaluations[-1]
    if samples_per_epoch:
        figures["samples_per_epoch"] = float(samples_per_epoch)
        held = heldout_curve(evaluations, workers=config.workers, batch=samples, samples_per_epoch=samples_per_epoch)
        if held is not None:
            figures["heldout_curve"] = held
    figures["batch_per_worker"] = samples
    return figures


def _trace_meta(
    config: TrainConfig,
    algorithm: Any,
    workers: list[RankResult],
    *,
    out: Path,
    samples: int,
    payload: dict[str, int] | None,
    membership: tuple[list[dict[str, Any]], list[int]] | None,
) -> dict[str, Any]:
    """What ``trace.npz`` and ``timeline.json`` say of the run."""
    meta = {
        "source": "runtime",
        "n_workers": config.workers,
        "samples_per_step": samples,
        "algorithm": algorithm.params(),
        "backend": config.backend,
        "run_id": out.name,
        **(payload or {}),
    }
    if membership and membership[0]:  # the timeline marks each change (core.trace.to_chrome_trace)
        meta["membership_changes"] = membership[0]
        meta["survivors"] = membership[1]
    schedules = {r.extra["allreduce_algorithm"] for r in workers if r.extra.get("allreduce_algorithm")}
    if len(schedules) == 1:  # what psgdlab calibrate fits the allreduce's latency rounds with
        meta["allreduce_algorithm"] = schedules.pop()
    return meta


def _write_run_files(
    config: TrainConfig,
    algorithm: Any,
    results: list[RankResult],
    case: Summary,
    trace: np.ndarray,
    meta: dict[str, Any],
    *,
    out: Path,
    steps: int,
    start_step: int,
    world: int,
) -> None:
    """Write the resolved config, the environment, the trace, the timeline and the trajectory."""
    run = RunDir(out)
    run.write_json(
        "config.resolved.json",
        {
            "train": config.to_json(),
            "algorithm": algorithm.params(),
            "steps": steps,
            "world_size": world,
            "server_rank": config.workers if algorithm.has_server else None,
        },
    )
    launch: dict[str, Any] = next((r.extra["launch"] for r in results if "launch" in r.extra), {})
    run.write_json(
        "env.json",
        environment(
            source="runtime", world_size=world, extra={"backend": config.backend, "torch_threads": 1, **launch}
        ),
    )
    write_trace(run / "trace.npz", trace, meta)
    to_chrome_trace(trace, run / "timeline.json", meta=meta)
    workers = [r for r in results if r.rank < config.workers]
    if any(r.trajectory is not None for r in workers):
        traj = np.stack([np.asarray(r.trajectory) for r in sorted(workers, key=lambda r: r.rank)], axis=1)
        _save_npz(run / "trajectory.npz", params=traj, start_step=np.array(start_step))


def _launch_record(config: TrainConfig, env: LaunchEnv) -> dict[str, Any]:
    """What ``env.json`` says of the launch: the ``launcher`` that started the ranks (``slurm``,
    ``torchrun``, ``mpi``, ...), the ``rendezvous`` of torch.distributed (``host:port``; ``None`` on
    MPI) and the ``gpus`` of this rank's machine (what ``psgdlab calibrate`` takes for its devices
    after runs on NCCL)."""
    rendezvous = None
    if config.backend != "mpi":
        rendezvous = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
    return {"launcher": env.launcher, "rendezvous": rendezvous, "gpus": torch.cuda.device_count()}


def heldout_curve(
    evaluations: list[dict[str, Any]], *, workers: int, batch: int, samples_per_epoch: float
) -> dict[str, list[float]] | None:
    """The held-out curve of a run's evaluations, in the shape of
    :data:`psgdlab.core.convergence.fit.REFERENCE_KEYS` (``heldout_curve``): ``epoch`` (samples
    the workers had seen, from their mean steps, over ``samples_per_epoch``), ``loss``, ``wer`` in
    percent (where the data has words), ``step`` and ``time_s`` (where the snapshot recorded it);
    ``None`` without evaluations that have a loss.

    >>> heldout_curve([{"step": 10, "steps_mean": 10.0, "time_s": 1.5, "loss": 2.0, "wer": 0.25}],
    ...               workers=2, batch=8, samples_per_epoch=320.0)
    {'epoch': [0.5], 'loss': [2.0], 'step': [10.0], 'time_s': [1.5], 'wer': [25.0]}
    """
    rows = [e for e in evaluations if isinstance(e.get("loss"), float) and math.isfinite(e["loss"])]
    if not rows:
        return None
    rows.sort(key=lambda e: (e.get("time_s", 0.0), e["step"]))
    steps = [float(e.get("steps_mean", e["step"])) for e in rows]
    curve: dict[str, list[float]] = {
        "epoch": [s * workers * batch / samples_per_epoch for s in steps],
        "loss": [float(e["loss"]) for e in rows],
        "step": steps,
    }
    if all("time_s" in e for e in rows):
        curve["time_s"] = [float(e["time_s"]) for e in rows]
    wer = [e.get("wer") for e in rows]
    if all(isinstance(w, float) and math.isfinite(w) for w in wer):
        curve["wer"] = [100.0 * float(w) for w in wer]  # type: ignore[arg-type]
    return curve


def _placement(hosts: list[str]) -> tuple[int, tuple[int, ...]]:
    """How many hosts the ranks ran on, and each rank's host (numbered in order of first
    appearance), from the host of each rank in rank order (:func:`~psgdlab.runtime.transports.env.host_identity`)."""
    numbers: dict[str, int] = {}
    placement = tuple(numbers.setdefault(host, len(numbers)) for host in hosts)
    return len(numbers), placement


def _payload(workload: Any) -> dict[str, int] | None:
    """``n_params``, ``itemsize`` and ``payload_bytes`` of the model (what every exchange moves)."""
    try:
        n, item = int(workload.n_params), int(torch.empty((), dtype=workload.dtype).element_size())
    except (AttributeError, TypeError):
        return None
    return {"n_params": n, "itemsize": item, "payload_bytes": n * item}


def _samples_per_step(config: TrainConfig) -> int:
    return config.batch


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    import io

    from psgdlab.core.records.trace import atomic_write_bytes

    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds like its allow_pickle flag
    atomic_write_bytes(path, buf.getvalue())
