r"""The emulation pipeline: simulate a configuration, replay its trace on real replicas, write the run.

``psgdlab emulate`` (and :func:`emulate`) predicts convergence (loss against simulated time)
for many virtual workers: the simulator (:func:`psgdlab.sim.engine.simulate`) times every
worker's steps on the platform model, and the emulator (:func:`psgdlab.sim.emulate.replay`)
replays that trace with real replicas, so staleness (stragglers included) comes from the
platform. It sits above sim and models (never the runtime's transports): the replicas are a torch
model on a window corpus (:class:`psgdlab.models.replicas.TorchReplicas`) or the least-squares
problem (:class:`psgdlab.core.reference.LeastSquaresReplicas`, ``--model least-squares``).

:func:`write_run` writes the run directory::

    OUT/config.resolved.json  the configuration, fully resolved
    OUT/env.json              versions, git SHA, host
    OUT/trace.npz             the emulator's trace (staleness and minibatch loss on compute records)
    OUT/curves.npz            eval_* (held-out loss, accuracy, consensus distance against simulated
                              time and epochs), round_*, staleness, batch_loss
    OUT/timeline.json         Chrome/Perfetto timeline
    OUT/loss.png, consensus.png  (psgdlab.analysis.figures)
    OUT/summary.json          a psgdlab.core.records.rundir.Summary (after the rest)
    OUT/complete.json         the commit marker, last (psgdlab.core.records.rundir.commit_run)
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from psgdlab.core.errors import require
from psgdlab.core.schedules import check_lr_schedule
from psgdlab.models.recipes import DEFAULT_MODEL

if TYPE_CHECKING:
    from psgdlab.core.algorithms import Algorithm
    from psgdlab.core.platform.stragglers import StragglerModel
    from psgdlab.sim.emulate import EmulationResult
    from psgdlab.sim.workload import SimConfig

__all__ = [
    "EmulateConfig",
    "emulate",
    "platform_of",
    "build_algorithm",
    "resolve_inputs",
    "write_run",
    "build_replicas",
    "SYNTHETIC",
]

#: the ``data`` value that asks for the synthetic corpus (as ``psgdlab train --data synthetic``)
SYNTHETIC = "synthetic"


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulateConfig:
    """One emulation (the flags of ``psgdlab emulate``).

    Parameters
    ----------
    algorithm, variant, period, workers, gpus_per_node : str, str or None, int or None, int, int or None
        The algorithm (:func:`build_algorithm`: a variant or period it does not take is an
        error; what is not given, the platform says, as for ``psgdlab predict``), the number of
        virtual workers and the workers per node (H-ADPSGD's super-learner size, default a
        host's devices; also the placement).
    preset, platform_file : str or None
        Platform model and workload timing (one of them; default
        :data:`psgdlab.sim.workload.DEFAULT_PRESET`).
    model : str
        A model of :data:`psgdlab.models.recipes.MODEL_RECIPES` (a ``psgdlab.models.networks``
        preset, default :data:`~psgdlab.models.recipes.DEFAULT_MODEL`, or ``"least-squares"``).
    data : str
        A corpus file (``psgdlab data`` layout) or ``"synthetic"`` (the synthetic corpus of
        ``psgdlab train --data synthetic``, ``synthetic_utterances`` utterances).
    epochs, steps : float or None, int or None
        Length: local steps per worker, or epochs of the training corpus (one of them).
    batch : int
        Windows (least squares: rows) per worker per step.
    lr, lr_schedule, lr_final, warmup_epochs : float, str, float or None, int
        Learning rate and schedule (:func:`psgdlab.core.schedules.lr_schedule`: for ``ibm`` the
        base rate of a 256-sample batch, peak ``lr * workers * batch / 256`` after
        ``warmup_epochs`` (10 in the paper; shorter for small experiments); ``exp`` decays to
        ``lr_final``; ``newbob`` follows the held-out loss of every epoch).
    momentum : float or None
        The algorithm's momentum where it takes one (``None``: its default), as ``psgdlab train
        --momentum``.
    straggler : str
        A :class:`psgdlab.core.platform.stragglers.StragglerModel` spec.
    seed : int
        Seeds the simulator, the data, the model initialisation and randomised schedules.
    window : int
        Frames per window.
    eval_points : int
        Evaluations of the mean model over the run.
    heldout_speakers : int
        Speakers of the corpus held out for evaluation (the last ones in sorted order).
    synthetic_utterances : int
        Size of the synthetic corpus.
    lsq_dim, lsq_samples_per_worker : int
        The least-squares problem's parameters and rows per worker (as ``psgdlab train``).
    workdir : str or None
        Where the synthetic corpus is cached.
    """

    algorithm: str = "adpsgd"
    variant: str | None = None
    period: int | None = None
    workers: int = 8
    gpus_per_node: int | None = None
    preset: str | None = None
    platform_file: str | None = None
    model: str = DEFAULT_MODEL
    data: str = SYNTHETIC
    epochs: float | None = None
    steps: int | None = None
    batch: int = 32
    lr: float = 0.1
    lr_schedule: str = "const"
    lr_final: float | None = None
    momentum: float | None = None
    straggler: str = ""
    seed: int = 0
    window: int = 21
    eval_points: int = 20
    heldout_speakers: int = 1
    synthetic_utterances: int = 1000
    lsq_dim: int = 16
    lsq_samples_per_worker: int = 256
    warmup_epochs: int = 10
    workdir: str | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.workers, int) and self.workers >= 1, "workers", self.workers, "must be an integer >= 1")
        require(
            self.preset is None or self.platform_file is None,
            "platform",
            self.platform_file,
            "cannot be given together with --preset",
        )
        require(
            self.epochs is None or self.steps is None, "steps", self.steps, "cannot be given together with --epochs"
        )
        require(
            self.steps is None or (isinstance(self.steps, int) and self.steps >= 1),
            "steps",
            self.steps,
            "must be an integer >= 1",
        )
        require(self.epochs is None or self.epochs > 0, "epochs", self.epochs, "must be > 0")
        require(isinstance(self.batch, int) and self.batch >= 1, "batch", self.batch, "must be an integer >= 1")
        require(
            isinstance(self.data, str) and self.data != "", "data", self.data, f"must be a corpus file or {SYNTHETIC!r}"
        )
        require(self.lr > 0 and math.isfinite(self.lr), "lr", self.lr, "must be a finite number > 0")
        check_lr_schedule(self.lr_schedule)
        if self.lr_final is not None:
            require(
                self.lr_schedule == "exp",
                "lr-final",
                self.lr_final,
                f"only applies to --lr-schedule exp, not {self.lr_schedule}",
            )
        require(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "must be an integer >= 0")
        require(self.eval_points >= 1, "eval_points", self.eval_points, "must be >= 1")
        require(self.heldout_speakers >= 0, "heldout_speakers", self.heldout_speakers, "must be >= 0")
        require(
            isinstance(self.warmup_epochs, int) and self.warmup_epochs >= 1,
            "warmup_epochs",
            self.warmup_epochs,
            "must be an integer >= 1",
        )
        from psgdlab.core.reference import require_lsq_shape

        require_lsq_shape(self.lsq_dim, self.lsq_samples_per_worker)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _corpus_path(cfg: EmulateConfig) -> Path:
    """The corpus file: ``cfg.data``, or the synthetic corpus (cached in ``cfg.workdir``)."""
    from psgdlab.models.data import synthetic_corpus

    if cfg.data != SYNTHETIC:
        path = Path(cfg.data)
        if not path.exists():
            raise FileNotFoundError(f"data file {path} does not exist")
        return path
    # a cache reused between runs; in the shared temporary folder, one of this user's own that
    # nobody else can write to (another user could plant a corpus or a link in a shared one)
    from psgdlab.core.records.rundir import require_own_directory, require_private_directory

    workdir = Path(cfg.workdir or os.path.join(tempfile.gettempdir(), f"psgdlab-emulate-data-{os.geteuid()}"))
    require_own_directory(workdir, what="the emulator's corpus cache")
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if cfg.workdir is None:
        require_private_directory(workdir, what="the emulator's corpus cache")
    path = workdir / f"synthetic-seed{cfg.seed}-utt{cfg.synthetic_utterances}.h5"
    if not path.exists():  # the corpus of `psgdlab train --data synthetic` (runtime.train), same arguments
        synthetic_corpus(path, n_utterances=cfg.synthetic_utterances, seed=cfg.seed)  # written atomically
    return path


def _load_data(cfg: EmulateConfig) -> tuple[Any, Any]:
    from psgdlab.models.data import load_corpus

    path = _corpus_path(cfg)
    full = load_corpus(path)
    speakers = sorted(set(full.speakers))
    if cfg.heldout_speakers == 0 or len(speakers) <= cfg.heldout_speakers:
        return full, None
    held = speakers[-cfg.heldout_speakers :]
    return load_corpus(path, exclude_speakers=held), load_corpus(path, speakers=held)


def build_replicas(cfg: EmulateConfig) -> tuple[Any, dict[str, Any]]:
    """The replicas of ``cfg`` (:class:`psgdlab.core.replicas.Replicas`, with ``steps_per_epoch()``)
    and what they add to the resolved configuration."""
    from psgdlab.models.recipes import LSQ_MODEL

    if cfg.model == LSQ_MODEL:
        from psgdlab.core.reference import LeastSquaresProblem, LeastSquaresReplicas

        problem = LeastSquaresProblem(
            n_samples=cfg.lsq_samples_per_worker * cfg.workers,
            dim=cfg.lsq_dim,
            n_shards=cfg.workers,
            batch=cfg.batch,
            seed=cfg.seed,
        )
        return LeastSquaresReplicas(problem), {"train_samples": problem.n_samples}
    import torch

    from psgdlab.models.networks import MODEL_PRESETS, build_model
    from psgdlab.models.replicas import TorchReplicas

    if cfg.model not in MODEL_PRESETS:
        build_model(cfg.model)  # raises the "unknown model" error with the closest name
    train, heldout = _load_data(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, input_dim=train.input_dim, n_classes=train.n_classes, window=cfg.window)
    replicas = TorchReplicas(
        model, train, n_workers=cfg.workers, window=cfg.window, batch=cfg.batch, seed=cfg.seed, heldout=heldout
    )
    return replicas, {
        "train_frames": int(train.n_frames),
        "heldout_frames": int(heldout.n_frames) if heldout is not None else 0,
    }


def platform_of(cfg: EmulateConfig) -> SimConfig:
    """The platform and workload ``cfg`` emulates on: its ``platform_file``, its ``preset``, or
    :data:`~psgdlab.sim.workload.DEFAULT_PRESET`."""
    from psgdlab.sim.workload import DEFAULT_PRESET, load_config

    if cfg.platform_file:
        return load_config(path=cfg.platform_file)
    return load_config(preset=cfg.preset or DEFAULT_PRESET)


def build_algorithm(cfg: EmulateConfig, sim_cfg: SimConfig) -> Algorithm:
    """The algorithm ``cfg`` emulates on ``sim_cfg``: built from its flags and what the platform
    says (:func:`psgdlab.core.algorithms.algorithm_from_flags` with
    :attr:`~psgdlab.core.platform.profile.Profile.facts`), as ``psgdlab predict`` builds it with the
    same flags."""
    from psgdlab.core.algorithms import algorithm_from_flags

    return algorithm_from_flags(
        cfg.algorithm,
        cfg.workers,
        seed=cfg.seed,
        platform=sim_cfg.facts,
        variant=cfg.variant,
        period=cfg.period,
        gpus_per_node=cfg.gpus_per_node,
        momentum=cfg.momentum,
    )


def emulate(
    cfg: EmulateConfig,
    *,
    replicas: Any = None,
    inputs: tuple[Algorithm, StragglerModel, SimConfig] | None = None,
) -> tuple[EmulationResult, dict[str, Any]]:
    """Simulate ``cfg`` with the platform model and replay it on real replicas.

    ``replicas`` replaces the ones ``cfg`` names (anything with the
    :class:`~psgdlab.core.replicas.Replicas` methods and ``steps_per_epoch()``); ``inputs`` is
    :func:`resolve_inputs` of ``cfg`` where the caller has checked them already (its corpus is not
    read through again). Returns the :class:`~psgdlab.sim.emulate.EmulationResult` and the
    resolved configuration (JSON-able).
    """
    import torch

    from psgdlab.core.schedules import Newbob, lr_schedule
    from psgdlab.sim.emulate import replay
    from psgdlab.sim.engine import simulate

    torch.set_num_threads(1)
    algorithm, stragglers, sim_cfg = inputs if inputs is not None else resolve_inputs(cfg)
    workload = sim_cfg.workload.with_batch(cfg.batch)
    extra: dict[str, Any] = {}
    if replicas is None:
        replicas, extra = build_replicas(cfg)
    spe = replicas.steps_per_epoch()
    steps = cfg.steps if cfg.steps is not None else max(1, math.ceil((cfg.epochs or 1.0) * spe))
    sim = simulate(
        algorithm,
        sim_cfg.platform,
        workload,
        steps=steps,
        seed=cfg.seed,
        stragglers=stragglers,
        gpus_per_node=cfg.gpus_per_node,
        until="all",
    )
    total_batch = cfg.workers * cfg.batch
    lr_fn = lr_schedule(
        cfg.lr_schedule,
        lr=cfg.lr,
        total_batch=total_batch,
        steps_per_epoch=spe,
        total_steps=steps,
        lr_final=cfg.lr_final,
        warmup_epochs=cfg.warmup_epochs,
    )
    on_epoch = None
    if isinstance(lr_fn, Newbob):  # the schedule follows the held-out loss of every epoch

        def on_epoch(_epoch: int, res: dict[str, float], _nb: Newbob = lr_fn) -> None:
            _nb.update(res["loss"])

    result = replay(
        algorithm,
        sim.trace,
        replicas,
        lr=lr_fn,
        meta=dict(sim.meta),
        steps_per_epoch=spe,
        eval_points=cfg.eval_points,
        on_epoch=on_epoch,
    )
    resolved = {
        "command": "emulate",
        **cfg.to_json(),
        "algorithm_params": algorithm.params(),
        "platform": sim_cfg.platform.name,
        "workload": workload.name,
        "workload_n_params": workload.n_params,
        "model_n_params": replicas.n_params,
        "steps_per_worker": steps,
        "steps_per_epoch": spe,
        "total_batch": total_batch,
        **extra,
    }
    result.meta.update({"samples_per_step": cfg.batch, "model": cfg.model})
    return result, resolved


def resolve_inputs(cfg: EmulateConfig) -> tuple[Algorithm, StragglerModel, SimConfig]:
    """The algorithm (:func:`build_algorithm`), the straggler model and the platform
    (:func:`platform_of`) ``cfg`` names, each checked (a bad flag, a flag the algorithm does not
    take, a platform file that does not load, a corpus file that is missing, not a corpus or
    holds a non-finite feature: a one-line :class:`~psgdlab.core.errors.ConfigError`) before
    anything runs or is written."""
    from psgdlab.core.platform.stragglers import StragglerModel
    from psgdlab.models.recipes import LSQ_MODEL

    sim_cfg = platform_of(cfg)
    algorithm = build_algorithm(cfg, sim_cfg)
    stragglers = StragglerModel.parse(cfg.straggler, seed=cfg.seed, n_workers=cfg.workers)
    if cfg.data != SYNTHETIC and cfg.model != LSQ_MODEL:  # a corpus file: there, a corpus, finite
        from psgdlab.models.data import require_finite_corpus

        require_finite_corpus(_corpus_path(cfg))
    return algorithm, stragglers, sim_cfg


def write_run(
    out: str | os.PathLike[str] | None, result: EmulationResult, resolved: Mapping[str, Any], *, figures: bool = True
) -> dict[str, Any]:
    """Write the run directory of an emulation (see the module docstring; ``summary.json`` after
    the rest, then the commit marker; the plots unless ``figures`` is false) and return its
    summary (``summary.json``'s object, with ``run_dir``)."""
    from psgdlab.analysis.figures import consensus_figure, emulation_loss_figure, save_figure
    from psgdlab.core.records.rundir import RunDir, Summary, commit_run, default_run_dir, environment, write_summary
    from psgdlab.core.records.trace import atomic_write_bytes, summarize, to_chrome_trace, write_trace

    rd = RunDir(out if out is not None else default_run_dir("emulate"))
    workers = int(result.meta["n_workers"])
    rd.write_json("config.resolved.json", dict(resolved))
    rd.write_json("env.json", environment(source="emulator", world_size=workers))
    write_trace(rd / "trace.npz", result.trace, result.meta)
    buf = io.BytesIO()
    curves: dict[str, Any] = {
        **{f"eval_{k}": v for k, v in result.evals.items()},
        **{f"round_{k}": v for k, v in result.rounds.items()},
        "staleness": result.staleness,
        "batch_loss": result.batch_loss,
    }
    np.savez_compressed(buf, **curves)
    atomic_write_bytes(rd / "curves.npz", buf.getvalue())
    to_chrome_trace(result.trace, rd / "timeline.json", meta={"source": "emulator"})
    params = dict(resolved.get("algorithm_params") or result.meta["algorithm"])
    title = f"{params['algorithm']} x {workers}"
    if figures:
        save_figure(emulation_loss_figure(result.evals, title=title), rd / "loss.png")
        save_figure(consensus_figure(result.rounds, title=title), rd / "consensus.png")
    numbers = {
        **result.summary(),
        "timing": summarize(result.trace, samples_per_step=int(result.meta.get("samples_per_step", 1))),
        "run_dir": str(rd.path),
    }
    summary = Summary(
        source="emulator", algorithm=str(params["algorithm"]), algorithm_params=params, workers=workers, figures=numbers
    )
    write_summary(rd, summary)
    commit_run(rd.path, command="emulate")
    return summary.to_json()
