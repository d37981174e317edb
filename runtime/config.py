"""The resolved configuration of one training run, validated before any process starts.

:class:`TrainConfig` is what ``psgdlab train`` builds from its flags, what it writes to
``config.resolved.json`` and what every rank reads back (``python -m psgdlab.runtime --config``).
Bad input raises :class:`~psgdlab.core.errors.ConfigError` (or ``TopologyError``) with one line
naming the value and the rule: odd workers for matching schemes, workers not divisible by
``gpus_per_node``, ``nccl`` without CUDA, a missing or malformed HDF5 file (the missing dataset
named), an unknown model.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psgdlab.core.algorithms import Algorithm, algorithm_parameters, make_algorithm
from psgdlab.core.errors import ConfigError, TopologyError, require
from psgdlab.core.stragglers import StragglerModel
from psgdlab.core.timing import ComputeTime

__all__ = ["TrainConfig", "LSQ_MODEL", "build_algorithm", "world_size_of"]

#: built-in model name: the reference executor's least-squares problem (float64)
LSQ_MODEL = "least-squares"
LR_SCHEDULES = ("const", "ibm", "newbob", "exp")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """Everything a run needs (see ``psgdlab train --help`` for each flag).

    ``model="least-squares"`` trains :class:`psgdlab.core.reference.LeastSquaresProblem`
    (``lsq_dim`` columns, ``lsq_samples_per_worker`` rows per worker) in float64 -- the problem
    the reference executor solves, used to check trajectories against the oracle.
    """

    algorithm: str = "ssgd"
    workers: int = 2
    gpus_per_node: int = 1
    backend: str = "gloo"
    model: str = "tiny-blstm"
    data: str = "synthetic"
    steps: int | None = None
    epochs: float | None = None
    batch: int = 32
    lr: float = 0.05
    lr_schedule: str = "const"
    lr_final: float | None = None
    period: int | None = None
    variant: str | None = None
    momentum: float | None = None
    compute_time: str | None = None
    straggler: str = ""
    seed: int = 0
    out: str = ""
    resume: bool = False
    held_out_speakers: tuple[str, ...] = ()
    window: int = 21
    checkpoint_every: int = 0
    timeout_s: float = 600.0
    record_params: bool = False
    lsq_dim: int = 16
    lsq_samples_per_worker: int = 256
    synthetic_utterances: int = 64
    evaluate: bool = True

    def __post_init__(self) -> None:
        require(isinstance(self.workers, int) and self.workers >= 1, "workers", self.workers, "must be an integer >= 1")
        require(isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 1, "gpus-per-node", self.gpus_per_node,
                "must be an integer >= 1")
        require(self.workers % self.gpus_per_node == 0, "workers", self.workers,
                f"must be divisible by --gpus-per-node ({self.gpus_per_node})", error=TopologyError)
        require(self.backend in ("gloo", "nccl", "mpi"), "backend", self.backend, "must be gloo, nccl or mpi")
        require((self.steps is None) != (self.epochs is None), "steps/epochs", (self.steps, self.epochs),
                "give exactly one of --steps and --epochs")
        if self.steps is not None:
            require(isinstance(self.steps, int) and self.steps >= 1, "steps", self.steps, "must be an integer >= 1")
        if self.epochs is not None:
            require(self.epochs > 0, "epochs", self.epochs, "must be > 0")
        require(isinstance(self.batch, int) and self.batch >= 1, "batch", self.batch, "must be an integer >= 1")
        require(self.lr > 0 and math.isfinite(self.lr), "lr", self.lr, "must be a finite number > 0")
        require(self.lr_schedule in LR_SCHEDULES, "lr-schedule", self.lr_schedule,
                f"must be one of {', '.join(LR_SCHEDULES)}")
        require(self.lr_schedule != "newbob", "lr-schedule", "newbob",
                "needs every worker to agree on a held-out loss after each epoch, which the runtime does "
                "not do (held-out scoring runs after training)", hint="use exp, ibm or const; "
                "psgdlab emulate runs newbob")
        if self.lr_final is not None:
            require(self.lr_schedule == "exp", "lr-final", self.lr_final,
                    f"only applies to --lr-schedule exp, not {self.lr_schedule}")
            require(0 < self.lr_final <= self.lr, "lr-final", self.lr_final, f"must be in (0, lr = {self.lr}]")
        require(self.timeout_s > 0, "timeout", self.timeout_s, "must be > 0 seconds")
        require(self.checkpoint_every >= 0, "checkpoint-every", self.checkpoint_every, "must be >= 0")
        if self.compute_time is not None:
            ComputeTime.parse(self.compute_time)
        StragglerModel.parse(self.straggler, seed=self.seed, n_workers=self.workers)
        build_algorithm(self)  # odd workers for matching schemes, unknown algorithm or parameter
        if self.backend == "nccl":
            import torch

            require(torch.cuda.is_available(), "backend", "nccl",
                    "needs CUDA, which this machine does not have", hint="use --backend gloo or mpi")
        if self.model != LSQ_MODEL:
            from psgdlab.runtime.models import MODEL_PRESETS, build_model

            if self.model not in MODEL_PRESETS:
                build_model(self.model)  # raises the data branch's "unknown model" error
        if self.data != "synthetic" and self.model != LSQ_MODEL:
            from psgdlab.runtime.data import inspect_corpus

            inspect_corpus(self.data)  # missing file, not HDF5, missing dataset named

    # ----- derived -----
    @property
    def has_server(self) -> bool:
        return build_algorithm(self).has_server

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["held_out_speakers"] = list(self.held_out_speakers)
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ConfigError(f"config keys {unknown} are not known (known: {', '.join(sorted(known))})")
        obj = dict(obj)
        obj["held_out_speakers"] = tuple(obj.get("held_out_speakers", ()))
        return cls(**obj)

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"config file {p} does not exist")
        data = json.loads(p.read_text())
        return cls.from_json(data.get("train", data))

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


def build_algorithm(config: TrainConfig) -> Algorithm:
    """The core algorithm the flags describe (``--period``, ``--variant``, ``--gpus-per-node``
    and ``--momentum`` go to the algorithms that take them; elsewhere they are an error)."""
    known = algorithm_parameters(config.algorithm) if config.algorithm else ()
    params: dict[str, Any] = {"n_workers": config.workers, "seed": config.seed}
    for flag, key, value in (("--period", "period", config.period), ("--variant", "variant", config.variant),
                             ("--momentum", "momentum", config.momentum)):
        if value is None:
            continue
        if key not in known:
            raise ConfigError(f"{flag} ({value!r}) does not apply to {config.algorithm} "
                              f"(its parameters: {', '.join(k for k in known if k not in ('n_workers', 'seed'))})")
        params[key] = value
    if "gpus_per_node" in known:
        params["gpus_per_node"] = config.gpus_per_node
    return make_algorithm(config.algorithm, **params)


def world_size_of(config: TrainConfig) -> int:
    """Processes the run needs: the workers, plus one for the parameter server."""
    return config.workers + (1 if build_algorithm(config).has_server else 0)
