r"""The runs of ``psgdlab validate --convergence``: the held-out corpus, the reference run, the
calibration of this machine, the emulated runs and the measured cases.

Every run of a workload is trained as :mod:`~psgdlab.validate.convergence_plan` says (one rate
law, one emulated compute, one held-out set); this module turns a case into the runtime's or
the emulator's configuration, runs it, and reads back what the comparison needs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.algorithms import algorithm_parameters
from psgdlab.core.convergence.curves import Crossing, time_to_target
from psgdlab.core.errors import ConfigError
from psgdlab.validate.convergence_plan import Case, ConvergenceConfig, WorkloadSpec

__all__ = [
    "held_out_corpus",
    "train_config",
    "reference_config",
    "run_train",
    "read_measured",
    "Measured",
    "calibrated_platform",
    "workload_config",
    "emulate_case",
    "steps_per_epoch",
    "warm_start",
]


def held_out_corpus(cc: ConvergenceConfig, out: Path) -> Path:
    """``OUT/data/fsdd.h5``: the FSDD corpus with every utterance of the training speakers and a
    seeded subset of :attr:`~psgdlab.validate.convergence_plan.WorkloadSpec.held_out_per_speaker`
    utterances of each held-out speaker (scoring a snapshot then takes seconds, not minutes)."""
    from psgdlab.models.data import load_corpus, write_corpus

    assert cc.data is not None  # ConvergenceConfig requires it with fsdd
    keep = cc.spec_of("fsdd").held_out_per_speaker
    path = out / "data" / "fsdd.h5"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = load_corpus(cc.data, add_deltas=False, normalize="none")
    rng = np.random.default_rng([cc.seed, 0xF5DD])
    chosen: list[int] = []
    for speaker in sorted(set(raw.speakers)):
        mine = [u for u, s in enumerate(raw.speakers) if s == speaker]
        if speaker in cc.held_out_speakers:
            mine = sorted(rng.choice(mine, size=min(keep, len(mine)), replace=False).tolist())
        chosen += mine
    missing = set(cc.held_out_speakers) - set(raw.speakers)
    if missing:
        raise ConfigError(
            f"held-out speakers {sorted(missing)} are not in {cc.data} (speakers: {sorted(set(raw.speakers))})"
        )
    chosen.sort()
    return write_corpus(
        path,
        features_per_utt=[raw.features[raw.offsets[u] : raw.offsets[u + 1]] for u in chosen],
        labels_per_utt=[raw.labels[raw.offsets[u] : raw.offsets[u + 1]] for u in chosen],
        utt_ids=[raw.utt_ids[u] for u in chosen],
        speakers=[raw.speakers[u] for u in chosen],
        transcripts=[raw.transcripts[u] for u in chosen],
        n_classes=raw.n_classes,
        feature_kind=raw.feature_kind,
        frame_shift_s=raw.frame_shift_s,
        add_deltas=True,
        source=f"{cc.data}: {keep} utterances of each held-out speaker ({', '.join(cc.held_out_speakers)})",
        credit="Free Spoken Digit Dataset (Jakobovski et al.), CC BY-SA 4.0",
    )


def steps_per_epoch(samples_per_epoch: float, workers: int, batch: int) -> int:
    """Local steps of one epoch at ``workers`` x ``batch`` (as the runtime counts them)."""
    return max(1, math.ceil(samples_per_epoch / (workers * batch)))


def _common(
    cc: ConvergenceConfig, spec: WorkloadSpec, *, workers: int, batch: int, data: Path | None
) -> dict[str, Any]:
    """What every run of ``spec`` at ``workers`` x ``batch`` shares (the data, the model)."""
    if spec.model == "least-squares":
        return {
            "model": spec.model,
            "lsq_dim": spec.lsq_dim,
            "lsq_samples_per_worker": spec.lsq_rows // workers,
        }
    return {"model": spec.model, "data": str(data), "held_out_speakers": tuple(cc.held_out_speakers)}


def train_config(
    cc: ConvergenceConfig,
    spec: WorkloadSpec,
    case: Case,
    *,
    seed: int,
    steps: int,
    samples_per_epoch: float,
    evaluate_every_s: float,
    data: Path | None,
    out: Path,
) -> Any:
    """The runtime's configuration of one measured run of ``case``."""
    from psgdlab.runtime.config import TrainConfig

    B = case.total_batch
    epochs = steps / steps_per_epoch(samples_per_epoch, case.workers, case.batch)
    momentum = spec.momentum if spec.momentum and "momentum" in algorithm_parameters(case.algorithm) else None
    return TrainConfig(
        algorithm=case.algorithm,
        variant=case.variant,
        workers=case.workers,
        gpus_per_node=cc.gpus_per_node,
        backend=cc.backend,
        batch=case.batch,
        steps=steps,
        lr=spec.lr(B),
        lr_schedule=spec.lr_schedule,
        lr_final=spec.lr_final(B, epochs),
        momentum=momentum,
        compute_time=f"{spec.compute_time_s(case.batch):.6g}",
        straggler=case.straggler,
        seed=seed,
        out=str(out),
        evaluate_every_s=evaluate_every_s,
        noise_scale_every=0,  # the cases' figures are times: nothing but the training in their steps
        timeout_s=300.0,
        **_common(cc, spec, workers=case.workers, batch=case.batch, data=data),
    )


def reference_config(cc: ConvergenceConfig, spec: WorkloadSpec, *, data: Path | None, out: Path) -> Any:
    """The reference run of ``spec``: ssgd at :attr:`WorkloadSpec.reference`, real compute (its
    curve is read in epochs, its wall time not used), the gradient noise scale every step,
    ``spec.reference_epochs`` epochs with about ``4 * eval_points`` held-out points."""
    from psgdlab.runtime.config import TrainConfig

    n, b = spec.reference
    B = n * b
    momentum = spec.momentum if spec.momentum else None
    return TrainConfig(
        algorithm="ssgd",
        workers=n,
        backend=cc.backend,
        batch=b,
        epochs=spec.reference_epochs,
        lr=spec.lr(B),
        lr_schedule=spec.lr_schedule,
        lr_final=spec.lr_final(B, spec.reference_epochs),
        momentum=momentum,
        seed=cc.seed,
        out=str(out),
        evaluate_every_s=spec.reference_every_s,
        noise_scale_every=1,
        timeout_s=600.0,
        **_common(cc, spec, workers=n, batch=b, data=data),
    )


def run_train(config: Any) -> dict[str, Any]:
    """Run ``config`` with the runtime into an emptied ``config.out``; its summary."""
    from psgdlab.runtime.launcher.launch import launch

    out = Path(config.out)
    if out.exists():
        shutil.rmtree(out)
    return launch(config, quiet=True, timeout_s=3600.0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """What one measured run gives: its crossing of the target in wall seconds from the end of
    its start-up (:func:`warm_start`: ``start_s``, by which the workers had done ``start_steps``
    steps each on average), its epochs and steps at the crossing, its mean step time and
    staleness, and the steps whose real compute outlasted the emulated compute."""

    seed: int
    run_dir: str
    reached: bool
    time_to_target_s: float | None
    epochs_to_target: float | None
    steps_to_target: float | None
    last_time_s: float | None
    last_loss: float | None
    start_s: float
    start_steps: float
    step_time_s: float | None
    staleness_mean: float | None
    compute_overrun_steps: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def warm_start(trace: np.ndarray) -> tuple[float, float]:
    """When a run's start-up ends, and the steps per worker done by then (mean over the workers):
    the latest, over the workers and the kinds of exchange each runs, of the end of its first
    exchange of that kind -- the first use of a transport connects it (up to a second on this
    machine: a gradient allreduce's first step, BMUF's first model average, a gossip peer's
    first pairwise exchange), which is not training. A run without exchanges starts at its
    second step."""
    from psgdlab.core.records.trace import PHASES

    comp = trace[trace["phase"] == PHASES["compute"]]
    moved = trace[np.isin(trace["phase"], [PHASES["comm"], PHASES["overlap"]]) & (trace["nbytes"] > 0)]
    ends = [
        float(moved["end_s"][(moved["rank"] == r) & (moved["kind"] == k)].min())
        for r in np.unique(moved["rank"])
        for k in np.unique(moved["kind"][moved["rank"] == r])
    ]
    if ends:
        start = max(ends)
    else:
        second = comp[comp["step"] == 1]
        start = float(np.median(second["start_s"])) if second.size else 0.0
    ranks = np.unique(comp["rank"])
    done = [int(np.sum((comp["rank"] == r) & (comp["end_s"] <= start))) for r in ranks]
    return start, float(np.mean(done)) if done else 0.0


def read_measured(run_dir: Path, target: float, *, seed: int) -> Measured:
    """Read a measured run's crossing of ``target`` off its held-out curve (:func:`time_to_target`)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    curve = summary.get("heldout_curve")
    if curve is None:
        raise ConfigError(f"{run_dir}: summary.json has no heldout_curve (was it run with --evaluate-every-s?)")
    from psgdlab.core.records.trace import read_trace

    start, start_steps = warm_start(read_trace(run_dir / "trace.npz")[0])
    c: Crossing = time_to_target(curve, target)
    return Measured(
        seed=seed,
        run_dir=str(run_dir),
        reached=c.reached,
        time_to_target_s=max(c.time_s - start, 0.0) if c.reached and c.time_s is not None else None,
        epochs_to_target=c.epoch,
        steps_to_target=c.step,
        last_time_s=c.last_time_s,
        last_loss=c.last_value,
        start_s=start,
        start_steps=start_steps,
        step_time_s=summary.get("step_time_s"),
        staleness_mean=summary.get("staleness_mean"),
        compute_overrun_steps=int(summary.get("compute_time_overrun_steps", 0)),
    )


# ----- the platform --------------------------------------------------------------------------------
def calibrated_platform(
    cc: ConvergenceConfig,
    out: Path,
    *,
    payload_bytes: int,
    workers: tuple[int, ...],
    say: Callable[[str], None],
    before_run: Callable[[str], None],
) -> tuple[Any, Any]:
    """Calibrate this machine as ``psgdlab validate`` does (its calibration plan, probe and fits:
    :mod:`psgdlab.validate.plan`, :func:`psgdlab.analysis.calibrate.calibrate_runs`,
    :func:`psgdlab.calibration.fitted_profile`) at the payload of the largest workload
    (least-squares runs of as many bytes, never a case), into ``OUT/calibration`` and
    ``OUT/platform.toml``; returns the profile and the calibration."""
    import os

    from psgdlab.analysis.calibrate import calibrate_runs
    from psgdlab.calibration import fitted_profile
    from psgdlab.validate.plan import ValidateConfig, calibration_plan, probe_groups
    from psgdlab.validate.run import launch_fresh
    from psgdlab.validate.run import train_config as calibration_config

    dim = max(4, payload_bytes // 8)
    vc = ValidateConfig(
        out=str(out),
        algorithms=tuple(cc.algorithms),
        workers=workers,
        backend=cc.backend,
        dim=dim,
        gpus_per_node=cc.gpus_per_node,
        calibration_runs=cc.calibration_runs,
        min_idle_cores=cc.min_idle_cores,
        max_idle_wait_s=cc.max_idle_wait_s,
        seed=cc.seed,
    )
    cores = os.cpu_count() or 1
    dirs = []
    for alg, n, d, name in calibration_plan(vc, cores):
        run = out / "calibration" / name
        cfg = calibration_config(
            vc, algorithm=alg, variant=None, workers=n, dim=d, straggler="", steps=vc.calibration_steps, out=run
        )
        before_run(f"calibration run {name}")
        launch_fresh(cfg)
        dirs.append(run)
    groups = probe_groups(vc, cores)
    if groups:
        from psgdlab.runtime.launcher.probe import ProbeConfig, probe

        probe_cfg = ProbeConfig(out=str(out / "calibration" / "probe"), backend=vc.backend, groups=groups)
        before_run("probe of the transport")
        probe(probe_cfg)
        dirs.append(Path(probe_cfg.out))
    say("fit the platform")
    calibration = calibrate_runs(dirs, cores=cores)
    profile, calibration = fitted_profile(
        calibration, dirs, name="this-machine", devices=max(workers), n_params=dim, itemsize=8, batch=1,
        workers=workers,
    )  # fmt: skip
    profile.write(out / "platform.toml")
    return profile, calibration


def workload_config(
    profile: Any, spec: WorkloadSpec, *, batch: int, n_params: int, itemsize: int, samples_per_epoch: float
) -> Any:
    """The simulator's configuration of ``spec`` at ``batch`` on the calibrated ``profile``: its
    payload, its emulated compute :math:`c_0 + c_1 b` (:attr:`WorkloadSpec.compute_s`) and its
    epoch."""
    c0, _ = spec.compute_s
    workload = dataclasses.replace(
        profile.workload,
        name=spec.name,
        description=f"psgdlab validate --convergence: {spec.model}",
        n_params=int(n_params),
        itemsize=int(itemsize),
        compute=f"{spec.compute_time_s(batch):.6g}",
        reference_batch=batch,
        batch_per_worker=batch,
        compute_fixed_s=c0,
        compute_jitter_s=0.0,
        samples_per_epoch=float(samples_per_epoch),
    )
    return dataclasses.replace(profile, workload=workload).resolved()


# ----- emulated runs ---------------------------------------------------------------------------
class _PopulationLoss:
    """Least-squares replicas whose ``evaluate`` is the population loss (the runtime's held-out
    loss of least squares: :meth:`psgdlab.runtime.loop.workloads.LeastSquaresWorkload.evaluate`)."""

    def __init__(self, problem: Any) -> None:
        from psgdlab.core.reference import LeastSquaresReplicas

        self._inner = LeastSquaresReplicas(problem)
        _, _, self._x_true = problem.data_and_truth()
        self._noise = problem.noise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def evaluate(self, params: Any) -> dict[str, float]:
        err = np.asarray(params, dtype=float) - self._x_true
        return {"loss": float(0.5 * (err @ err + self._noise**2))}


def emulate_case(
    cc: ConvergenceConfig,
    spec: WorkloadSpec,
    case: Case,
    *,
    platform_file: Path,
    steps: int,
    samples_per_epoch: float,
    data: Path | None,
    out: Path,
) -> dict[str, Any]:
    """Emulate ``case`` (route (b): the simulator's event times on the calibrated platform, real
    replicas trained as the measured runs are) for ``steps`` steps into ``out``; its summary and
    held-out curve in epochs (``curve``: ``epoch``, ``loss``)."""
    from psgdlab.emulate import EmulateConfig, emulate, write_run

    B = case.total_batch
    epochs = steps / steps_per_epoch(samples_per_epoch, case.workers, case.batch)
    momentum = spec.momentum if spec.momentum and "momentum" in algorithm_parameters(case.algorithm) else None
    cfg = EmulateConfig(
        algorithm=case.algorithm,
        variant=case.variant,
        workers=case.workers,
        gpus_per_node=cc.gpus_per_node if case.algorithm == "hadpsgd" else None,
        platform_file=str(platform_file),
        model=spec.model,
        data=str(data) if data is not None else "synthetic",
        steps=steps,
        batch=case.batch,
        lr=spec.lr(B),
        lr_schedule=spec.lr_schedule,
        lr_final=spec.lr_final(B, epochs),
        momentum=momentum,
        straggler=case.straggler,
        seed=cc.seed,
        eval_points=spec.eval_points,
        lsq_dim=spec.lsq_dim,
        lsq_samples_per_worker=max(1, spec.lsq_rows // case.workers),
    )
    result, resolved = emulate(cfg, replicas=_replicas(cc, spec, case, data))
    summary = write_run(out, result, resolved)
    ev = result.evals
    return {
        "summary": summary,
        "curve": {"epoch": [float(x) for x in ev["epoch"]], "loss": [float(x) for x in ev["loss"]]},
        "staleness_mean": float(summary.get("staleness_mean") or 0.0),
    }


def _replicas(cc: ConvergenceConfig, spec: WorkloadSpec, case: Case, data: Path | None) -> Any:
    """The emulated run's replicas, on the same data and held-out set as the measured runs."""
    if spec.model == "least-squares":
        from psgdlab.core.reference import LeastSquaresProblem

        return _PopulationLoss(
            LeastSquaresProblem(
                n_samples=(spec.lsq_rows // case.workers) * case.workers,
                dim=spec.lsq_dim,
                n_shards=case.workers,
                batch=case.batch,
                seed=cc.seed,
            )
        )
    import torch

    from psgdlab.models.data import load_corpus
    from psgdlab.models.networks import build_model
    from psgdlab.models.replicas import TorchReplicas

    assert data is not None
    held = list(cc.held_out_speakers)
    train = load_corpus(data, exclude_speakers=held)
    heldout = load_corpus(data, speakers=held)
    torch.manual_seed(cc.seed)
    model = build_model(spec.model, input_dim=train.input_dim, n_classes=train.n_classes, window=21)
    return TorchReplicas(
        model, train, n_workers=case.workers, window=21, batch=case.batch, seed=cc.seed, heldout=heldout,
        eval_windows=heldout.n_frames,
    )  # fmt: skip
