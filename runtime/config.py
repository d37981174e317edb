"""The resolved configuration of one training run, validated before any process starts.

:class:`TrainConfig` is what ``psgdlab train`` builds from its flags, what it writes to
``config.resolved.json`` and what every rank reads back (``python -m psgdlab.runtime --config``).
Bad input raises :class:`~psgdlab.core.errors.ConfigError` (or ``TopologyError``) with one line
naming the value and the rule: odd workers for matching schemes, workers not divisible by
``gpus_per_node``, ``nccl`` without CUDA, a missing or malformed HDF5 file (the missing dataset
named), an unknown model.

Each model's :class:`~psgdlab.models.recipes.Recipe` gives the learning rate, schedule,
momentum and total batch a run of it uses for every flag not given (:meth:`TrainConfig.from_args`).
:class:`TrainConfig` owns its command-line flags (:meth:`TrainConfig.add_arguments`), so the
per-rank entry and ``psgdlab train`` parse the same ones without the runtime importing the CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psgdlab.core.algorithms import Algorithm, PlatformFacts, algorithm_from_flags, algorithm_parameters
from psgdlab.core.config import check_keys, listing, parse_rate
from psgdlab.core.convergence.noise_scale import HALVES_EVERY
from psgdlab.core.errors import ConfigError, require
from psgdlab.core.flags import add_flags
from psgdlab.core.platform.failure import check_on_failure, default_on_failure, gossip_algorithms
from psgdlab.core.platform.placement import equal_blocks
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.core.platform.timing import ComputeTime
from psgdlab.core.records.rundir import default_run_dir
from psgdlab.core.reference import LeastSquaresProblem, require_lsq_shape
from psgdlab.core.schedules import LR_SCHEDULES, check_lr_schedule
from psgdlab.models.recipes import DEFAULT_MODEL, LSQ_MODEL, MODEL_RECIPES, recipe_of
from psgdlab.runtime.transports.backends import BACKENDS, backends_that, check_backend, cpu_backends, either

__all__ = [
    "TrainConfig",
    "MAX_HOSTS",
    "build_algorithm",
    "platform_facts",
    "world_size_of",
    "lsq_problem",
]

#: the most emulated hosts of a run (``--hosts``): :mod:`psgdlab.runtime.launcher.netns` gives host
#: ``i`` the address ``10.213.0.<i+1>`` of one /24 subnet, whose ``.254`` is the bridge
MAX_HOSTS = 200


#: the flags ``--resume`` takes beside it (the run's length and deadline; where it is and whether
#: to replace it are --resume's own)
RESUME_MAY_CHANGE = frozenset({"steps", "epochs", "timeout", "resume", "out", "force"})
#: flags whose TrainConfig field has another name
_RESUME_FIELDS = {"lsq_samples": "lsq_samples_per_worker", "timeout": "timeout_s", "workers_per_node": "gpus_per_node"}


def _same(given: Any, saved: Any) -> bool:
    """Whether a flag's value is the saved run's (lists and tuples alike)."""
    if isinstance(given, tuple | list) and isinstance(saved, tuple | list):
        return list(given) == list(saved)
    return bool(given == saved)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """Everything a run needs (see ``psgdlab train --help`` for each flag).

    ``model="least-squares"`` trains :class:`psgdlab.core.reference.LeastSquaresProblem`
    (``lsq_dim`` columns, ``lsq_samples_per_worker`` rows per worker) in float64 -- the problem
    the reference executor solves, used to check trajectories against the oracle.
    """

    algorithm: str = "ssgd"
    workers: int = 2
    gpus_per_node: int | None = None
    backend: str = "gloo"
    model: str = DEFAULT_MODEL
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
    evaluate_every_s: float = 0.0
    noise_scale_every: int = HALVES_EVERY
    hosts: int = 1
    nic_bandwidth: str | None = None
    on_failure: str = ""
    max_restarts: int = 3
    mpiexec: str | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.workers, int) and self.workers >= 1, "workers", self.workers, "must be an integer >= 1")
        require(
            self.gpus_per_node is None or (isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 1),
            "gpus-per-node",
            self.gpus_per_node,
            "must be an integer >= 1",
        )
        check_backend(self.backend)
        require(
            (self.steps is None) != (self.epochs is None),
            "steps/epochs",
            (self.steps, self.epochs),
            "give exactly one of --steps and --epochs",
        )
        if self.steps is not None:
            require(isinstance(self.steps, int) and self.steps >= 1, "steps", self.steps, "must be an integer >= 1")
        if self.epochs is not None:
            require(self.epochs > 0, "epochs", self.epochs, "must be > 0")
        require(isinstance(self.batch, int) and self.batch >= 1, "batch", self.batch, "must be an integer >= 1")
        require(self.lr > 0 and math.isfinite(self.lr), "lr", self.lr, "must be a finite number > 0")
        check_lr_schedule(self.lr_schedule)
        require(
            not LR_SCHEDULES[self.lr_schedule].follows_heldout,
            "lr-schedule",
            self.lr_schedule,
            "needs every worker to agree on a held-out loss after each epoch, which the runtime does "
            "not do (held-out scoring runs after training)",
            hint=f"use {listing(_train_schedules())}; psgdlab emulate runs {self.lr_schedule}",
        )
        if self.lr_final is not None:
            require(
                self.lr_schedule == "exp",
                "lr-final",
                self.lr_final,
                f"only applies to --lr-schedule exp, not {self.lr_schedule}",
            )
            require(0 < self.lr_final <= self.lr, "lr-final", self.lr_final, f"must be in (0, lr = {self.lr}]")
        require(self.timeout_s > 0, "timeout", self.timeout_s, "must be > 0 seconds")
        require(
            isinstance(self.evaluate_every_s, (int, float))
            and math.isfinite(self.evaluate_every_s)
            and self.evaluate_every_s >= 0,
            "evaluate-every-s",
            self.evaluate_every_s,
            "must be a finite number of seconds >= 0 (0: score each epoch)",
        )
        require(
            isinstance(self.noise_scale_every, int)
            and not isinstance(self.noise_scale_every, bool)
            and self.noise_scale_every >= 0,
            "noise-scale-every",
            self.noise_scale_every,
            "must be an integer >= 0 (0: no noise-scale estimate)",
        )
        require(self.checkpoint_every >= 0, "checkpoint-every", self.checkpoint_every, "must be >= 0")
        require_lsq_shape(self.lsq_dim, self.lsq_samples_per_worker)
        if self.compute_time is not None:
            ComputeTime.parse(self.compute_time)
        StragglerModel.parse(self.straggler, seed=self.seed, n_workers=self.workers)
        self._check_hosts()
        if self.mpiexec is not None:
            require(
                self.backend == "mpi", "mpiexec", self.mpiexec, f"applies only with --backend mpi, not {self.backend}"
            )
        build_algorithm(self)  # odd workers for matching schemes, unknown algorithm or parameter
        self._check_on_failure()
        if BACKENDS[self.backend].needs_cuda:
            import torch

            require(
                torch.cuda.is_available(),
                "backend",
                self.backend,
                "needs CUDA, which this machine does not have",
                hint=f"use {either(cpu_backends())}",
            )
        if self.model != LSQ_MODEL:
            from psgdlab.models.networks import MODEL_PRESETS, build_model

            if self.model not in MODEL_PRESETS:
                build_model(self.model)  # raises the data branch's "unknown model" error
        if self.data != "synthetic" and self.model != LSQ_MODEL:
            from psgdlab.models.data import inspect_corpus

            inspect_corpus(self.data)  # missing file, not HDF5, missing dataset named

    def _check_hosts(self) -> None:
        """``--hosts`` and ``--nic-bandwidth`` (:mod:`psgdlab.runtime.launcher.netns`): hosts that divide
        the workers, a rate that parses, a backend that crosses emulated hosts."""
        require(
            isinstance(self.hosts, int) and 1 <= self.hosts <= MAX_HOSTS,
            "hosts",
            self.hosts,
            f"must be an integer from 1 to {MAX_HOSTS}",
        )
        if self.nic_bandwidth is not None:
            parse_rate(self.nic_bandwidth)
            require(self.hosts >= 2, "nic-bandwidth", self.nic_bandwidth, "applies only with --hosts 2 or more")
        if self.hosts == 1:
            return
        equal_blocks(self.workers, hosts=self.hosts)
        require(
            BACKENDS[self.backend].crosses_emulated_hosts,
            "hosts",
            self.hosts,
            f"is not supported with --backend {self.backend} (its ranks do not run on emulated hosts: the GPUs of "
            "one machine would still talk through NVLink/PCIe)",
            hint=f"use {either(backends_that(lambda b: b.crosses_emulated_hosts))}",
        )

    @property
    def failure_policy(self) -> str:
        """What the run does when a worker dies: ``on_failure`` when given, else the algorithm's
        default (:func:`psgdlab.core.platform.failure.default_on_failure`: continue for gossip) where the
        runtime's survivors can go on in this configuration (:meth:`_continue_refusal`), else stop."""
        if self.on_failure:
            return self.on_failure
        wanted = default_on_failure(self.algorithm)
        if wanted == "continue" and self._continue_refusal() is not None:
            return "stop"
        return wanted

    def _continue_refusal(self) -> tuple[str, str] | None:
        """Why the runtime's survivors cannot go on in this configuration (the rule broken, and
        what to use instead), or ``None``; what they can do so far is in runtime/README.md."""
        if self.algorithm not in gossip_algorithms():
            return (
                f"is built in the runtime for {listing(gossip_algorithms(), 'and')}, not {self.algorithm}",
                "use stop or restart",
            )
        if not BACKENDS[self.backend].survives_a_death:
            return (
                f"needs {either(backends_that(lambda b: b.survives_a_death))}, not {self.backend}: a backend "
                "whose ranks outlive a dead peer",
                "use stop or restart",
            )
        if self.hosts != 1 and self.algorithm == "dpsgd":
            return (
                f"for dpsgd runs on one host, not --hosts {self.hosts}: a blocking gossip's transfer over "
                "gloo to a host cut off cannot be left without losing the step order of the other neighbours",
                "use stop or restart",
            )
        if not self.out:
            return "needs a run directory (--out): the membership lives there", ""
        return None

    def _check_on_failure(self) -> None:
        """``--on-failure`` (:mod:`psgdlab.core.platform.failure`) and ``--max-restarts``."""
        if self.on_failure:
            check_on_failure(self.algorithm, self.on_failure)
        if self.on_failure == "continue" and (refusal := self._continue_refusal()) is not None:
            rule, hint = refusal
            require(False, "on-failure", "continue", rule, hint=hint)
        require(
            isinstance(self.max_restarts, int) and self.max_restarts >= 0,
            "max-restarts",
            self.max_restarts,
            "must be an integer >= 0",
        )
        if (
            self.on_failure == "restart"
        ):  # torchrun's elastic agent (psgdlab.runtime.launcher.elastic) restarts the ranks
            require(
                BACKENDS[self.backend].restartable,
                "on-failure",
                "restart",
                f"needs {either(backends_that(lambda b: b.restartable))}: torchrun's elastic agent starts "
                "processes, not MPI ranks",
            )
            require(
                self.hosts == 1,
                "on-failure",
                "restart",
                f"does not run on emulated hosts (--hosts {self.hosts}): torchrun's elastic agent cannot "
                "start a rank inside a network namespace",
            )

    @property
    def nic_bandwidth_bytes_per_s(self) -> float | None:
        """The emulated hosts' link rate in bytes per second (None: not shaped)."""
        return None if self.nic_bandwidth is None else parse_rate(self.nic_bandwidth)

    # ----- derived -----
    @property
    def has_server(self) -> bool:
        return build_algorithm(self).has_server

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["held_out_speakers"] = list(self.held_out_speakers)
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TrainConfig:
        check_keys(obj, (f.name for f in dataclasses.fields(cls)), where="train config")
        obj = dict(obj)
        obj["held_out_speakers"] = tuple(obj.get("held_out_speakers", ()))
        return cls(**obj)

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"config file {p} does not exist")
        data = json.loads(p.read_text())
        return cls.from_json(data.get("train", data))

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    # ----- command line -----
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, *, launcher: bool = False) -> None:
        """The training flags, shared by ``psgdlab train`` and ``python -m psgdlab.runtime``.

        Flags that several commands share come from :mod:`psgdlab.core.flags`; ``--lr``,
        ``--lr-schedule``, ``--momentum`` and ``--batch`` default to the model's recipe.
        ``launcher=True`` adds the flags of a command that starts the ranks itself (``--hosts``,
        ``--nic-bandwidth``); the per-rank entry runs where its launcher put it.
        """
        _worker_flags(parser)
        _training_flags(parser)
        _run_flags(parser)
        _step_flags(parser)
        if launcher:
            _launcher_flags(parser)

    def require_resumable_with(self, args: argparse.Namespace, *, launcher: bool) -> None:
        """Refuse, in one line, a flag of ``args`` given beside ``--resume`` that would change this
        saved run (``--workers 4`` on a 2-worker run: the checkpoints are of the run as it was
        configured, which ``--resume`` continues); :data:`RESUME_MAY_CHANGE` may change, and a flag
        given with the run's own value is accepted."""
        parser = argparse.ArgumentParser(add_help=False)
        type(self).add_arguments(parser, launcher=launcher)
        defaults = vars(parser.parse_args([]))
        saved = self.to_json()
        for dest, default in defaults.items():
            value = getattr(args, dest, default)
            if dest in RESUME_MAY_CHANGE or value == default:
                continue
            field = _RESUME_FIELDS.get(dest, dest)
            ours = saved.get(field, None)
            if dest == "held_out_speakers":
                value = [s for s in str(value).split(",") if s]
            if field in saved and _same(value, ours):
                continue
            flag = "--" + dest.replace("_", "-")
            had = f" (the run has {ours!r})" if field in saved else ""
            raise ConfigError(
                f"{flag} ({value}) cannot change the run that --resume {args.resume} continues{had}: only "
                f"{', '.join('--' + d for d in sorted(RESUME_MAY_CHANGE - {'resume', 'out', 'force'}))} may; "
                "start a new run with --out for another configuration"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainConfig:
        """The configuration the flags of :meth:`add_arguments` describe, with the model's recipe
        for the learning rate, schedule, momentum and batch not given; ``--resume DIR`` reloads
        DIR's resolved configuration, or that of its ``launch.json`` when the run failed before
        writing it (``--steps``/``--epochs`` may extend it)."""
        if args.resume:
            path = Path(args.resume) / "config.resolved.json"
            if not path.is_file():  # a run that failed: the configuration it was launched with
                path = Path(args.resume) / "launch.json"
            if not path.is_file():
                raise ConfigError(f"resume directory {args.resume} has no config.resolved.json")
            saved = cls.from_json(json.loads(path.read_text())["train"])
            saved.require_resumable_with(args, launcher=hasattr(args, "hosts"))
            changes: dict[str, Any] = {"resume": True, "out": str(args.resume)}
            if args.steps is not None:
                changes.update(steps=args.steps, epochs=None)
            elif args.epochs is not None:
                changes.update(epochs=args.epochs, steps=None)
            return saved.replace(**changes)
        steps, epochs = args.steps, args.epochs
        if steps is None and epochs is None:
            steps = 100
        recipe = recipe_of(args.model)
        batch, lr, lr_schedule = recipe.resolve(
            workers=args.workers, batch=args.batch, lr=args.lr, lr_schedule=args.lr_schedule, lsq_dim=args.lsq_dim
        )
        momentum = args.momentum
        if momentum is None and recipe.momentum and "momentum" in algorithm_parameters(args.algorithm):
            momentum = recipe.momentum
        return cls(
            algorithm=args.algorithm,
            workers=args.workers,
            gpus_per_node=args.workers_per_node,
            backend=args.backend,
            model=args.model,
            data=args.data,
            steps=steps,
            epochs=epochs,
            batch=batch,
            lr=lr,
            lr_schedule=lr_schedule,
            lr_final=args.lr_final,
            period=args.period,
            variant=args.variant,
            momentum=momentum,
            compute_time=args.compute_time,
            straggler=args.straggler,
            seed=args.seed,
            out=str(args.out or default_run_dir("train")),
            held_out_speakers=tuple(s for s in (args.held_out_speakers or "").split(",") if s),
            evaluate_every_s=args.evaluate_every_s,
            noise_scale_every=args.noise_scale_every,
            window=args.window,
            checkpoint_every=args.checkpoint_every,
            timeout_s=args.timeout,
            record_params=args.record_params,
            lsq_dim=args.lsq_dim,
            lsq_samples_per_worker=args.lsq_samples,
            hosts=getattr(args, "hosts", 1),
            nic_bandwidth=getattr(args, "nic_bandwidth", None),
            on_failure=args.on_failure or "",
            max_restarts=getattr(args, "max_restarts", 3),
            mpiexec=getattr(args, "mpiexec", None),
        )


def _worker_flags(parser: argparse.ArgumentParser) -> None:
    """What runs where: the algorithm, the workers and their hosts, the transports' backend."""
    add_flags(
        parser,
        "--algorithm",
        "--workers",
        "--workers-per-node",
        defaults={"--algorithm": "ssgd", "--workers": 2},
        helps={"--workers-per-node": "default: with --hosts H, workers / H (the ranks of a host); else 1"},
    )
    parser.add_argument(
        "--backend",
        default="gloo",
        choices=tuple(BACKENDS),
        help="the transports' backend: "
        + "; ".join(f"{name}, {b.summary}" for name, b in BACKENDS.items())
        + " (default: gloo)",
    )


def _training_flags(parser: argparse.ArgumentParser) -> None:
    """What is trained and how: the model and data, the run's length, the batch and the optimiser's
    settings (the model's recipe by default), emulated compute."""
    recipes = "; ".join(f"{name}: {r.describe()}" for name, r in MODEL_RECIPES.items())
    recipe_help = "default: the model's recipe"
    add_flags(
        parser,
        "--model",
        defaults={"--model": DEFAULT_MODEL},
        helps={"--model": f"{', '.join(MODEL_RECIPES)} (default: {DEFAULT_MODEL}); recipes: {recipes}"},
    )
    add_flags(parser, "--data", defaults={"--data": "synthetic"})
    steps = parser.add_mutually_exclusive_group()
    add_flags(steps, "--steps", "--epochs", helps={"--steps": "default 100 when --epochs is not given"})
    add_flags(
        parser,
        "--batch",
        "--lr",
        "--lr-schedule",
        "--lr-final",
        "--period",
        "--variant",
        "--momentum",
        helps={
            "--batch": f"{recipe_help}'s total batch / workers",
            "--lr": recipe_help,
            "--lr-schedule": f"{recipe_help}; {', '.join(_heldout_schedules())} refused by train (it needs a "
            "held-out loss every epoch; psgdlab emulate runs it)",
            "--momentum": f"{recipe_help} where the algorithm takes momentum",
        },
    )
    parser.add_argument(
        "--compute-time",
        metavar="SPEC",
        help="emulated compute per step: SECONDS or a distribution (normal:M:S, lognormal:M:CV, gamma:M:CV)",
    )


def _run_flags(parser: argparse.ArgumentParser) -> None:
    """The run: a straggler, the seed, its directory (and resuming one), the least-squares model's
    size, the held-out speakers."""
    add_flags(
        parser,
        "--straggler",
        "--seed",
        "--out",
        "--force",
        "--lsq-dim",
        "--lsq-samples",
        defaults={"--straggler": ""},
    )
    parser.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its newest complete checkpoint")
    parser.add_argument(
        "--held-out-speakers",
        default="",
        metavar="NAMES",
        help="comma-separated speakers scored each epoch, not trained on",
    )
    parser.add_argument(
        "--evaluate-every-s",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="snapshot the workers' models every SECONDS of wall time (and at the start and the end) "
        "instead of each epoch; the mean model of each is scored after training (summary.json: "
        "heldout_curve, with the wall time of each point)",
    )
    parser.add_argument(
        "--noise-scale-every",
        type=int,
        default=HALVES_EVERY,
        metavar="N",
        help="estimate the gradient noise scale (summary.json: noise_scale): every step that allreduces "
        "the gradient, and every N-th step of the others as two half-batch backward passes; 0: never",
    )


def _step_flags(parser: argparse.ArgumentParser) -> None:
    """What each step keeps and how long it waits: checkpoints, the deadline of a blocking wait, the
    input window, the recorded models, the failure policy."""
    add_flags(parser, "--checkpoint-every", defaults={"--checkpoint-every": 0})
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="deadline of every blocking wait (exchange, allreduce, barrier, server request; the set-up "
        "gets at least 60 s): past it a rank writes its flight record and exits, and a stopped rank is dead",
    )
    parser.add_argument("--window", type=int, default=21, help="frames per input window")
    parser.add_argument("--record-params", action="store_true", help="keep every step's model (small models)")
    add_flags(
        parser,
        "--on-failure",
        helps={
            "--on-failure": f"default: continue for {listing(gossip_algorithms(), 'and')} where the runtime's "
            f"survivors can go on ({either(backends_that(lambda b: b.survives_a_death))}, a run directory; "
            "dpsgd on one host), stop otherwise"
        },
    )


def _launcher_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a command that starts the ranks itself: emulated hosts and their NIC, restarts,
    the mpiexec of --backend mpi."""
    add_flags(
        parser,
        "--hosts",
        "--nic-bandwidth",
        "--max-restarts",
        defaults={"--hosts": 1, "--max-restarts": 3},
        helps={"--hosts": f"with {either(backends_that(lambda b: b.crosses_emulated_hosts))}"},
    )
    parser.add_argument(
        "--mpiexec",
        metavar="PATH",
        default=None,
        help="the mpiexec that starts the ranks of --backend mpi (default: that of the MPI mpi4py loads: "
        "the mpich wheel's where psgdlab[mpich] installed it, else the one on PATH, e.g. a cluster's)",
    )


def _heldout_schedules() -> tuple[str, ...]:
    """The schedules that follow a held-out loss every epoch, which the runtime does not compute."""
    return tuple(name for name, s in LR_SCHEDULES.items() if s.follows_heldout)


def _train_schedules() -> tuple[str, ...]:
    """The schedules a training run takes (:data:`~psgdlab.core.schedules.LR_SCHEDULES` but
    :func:`_heldout_schedules`)."""
    return tuple(name for name in LR_SCHEDULES if name not in _heldout_schedules())


def platform_facts(config: TrainConfig) -> PlatformFacts:
    """What the run's platform says that an algorithm takes where no flag gives it: on emulated
    hosts (``--hosts H``) a host holds ``workers / H`` ranks, H-ADPSGD's node; on one machine
    nothing (a node of one, as the algorithm's default), and no default period."""
    if config.hosts > 1:
        return PlatformFacts(devices_per_host=equal_blocks(config.workers, hosts=config.hosts).per_host)
    return PlatformFacts()


def build_algorithm(config: TrainConfig) -> Algorithm:
    """The core algorithm the configuration describes (:func:`~psgdlab.core.algorithms.algorithm_from_flags`
    with :func:`platform_facts`, as every command builds it: ``--period``, ``--variant`` and
    ``--momentum`` go to the algorithms that take them and are an error elsewhere;
    ``--workers-per-node`` to those whose schedule uses it)."""
    return algorithm_from_flags(
        config.algorithm,
        config.workers,
        seed=config.seed,
        platform=platform_facts(config),
        period=config.period,
        variant=config.variant,
        momentum=config.momentum,
        gpus_per_node=config.gpus_per_node,
    )


def lsq_problem(config: TrainConfig) -> LeastSquaresProblem:
    """The least-squares problem of a ``model="least-squares"`` run: ``lsq_samples_per_worker``
    rows per worker, ``lsq_dim`` columns, one shard per worker."""
    return LeastSquaresProblem(
        n_samples=config.lsq_samples_per_worker * config.workers,
        dim=config.lsq_dim,
        n_shards=config.workers,
        batch=config.batch,
        seed=config.seed,
    )


def world_size_of(config: TrainConfig) -> int:
    """Processes the run needs: the workers, plus one for the parameter server."""
    return config.workers + (1 if build_algorithm(config).has_server else 0)
