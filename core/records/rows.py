r"""A prediction's row and its parts: what ``psgdlab predict`` and ``psgdlab plan`` give per configuration.

:class:`PredictionRow` is one simulated configuration (:func:`psgdlab.sim.predict.predict_one`):
its throughput, step time, speedup, time to train, fractions and staleness, always; its 90 %
intervals (:class:`RowIntervals`) where the prediction computed them; its time to a target
(:class:`TargetColumns`) where the workload has a convergence model; the cost of failures where
the request priced them. Each optional part adds its keys to the row's JSON object only where
it is there, so ``"speedup_low" in row`` says whether the row has intervals. :class:`PlanRow` is
a candidate of ``psgdlab plan``: a prediction's row with the candidate's label, or, for a
candidate that cannot reach the target whatever its step time, only why.

Every row is a read-only mapping over its JSON keys (:class:`psgdlab.core.records.results.Record`):
``row["speedup"]`` is ``row.speedup``. Times are in seconds, throughputs in the workload's
samples per second, staleness in updates (foreign model merges, or server updates, between
reading the weights and applying the gradient), fractions of a step's wall time in [0, 1].

Examples
--------
>>> t = TargetColumns(target="loss=1", reaches_target=False, target_reason="period 80 is beyond ...",
...                   target_short_reason="period>40")
>>> TargetColumns.from_json(t.to_json()) == t, t["time_to_target_s"], "target_log_sd" in t
(True, None, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from psgdlab.core.records.intervals import INTERVAL_KEYS
from psgdlab.core.records.results import OpenDict, Record, optional, present

__all__ = [
    "STALENESS_UNIT",
    "EXTRAPOLATION_METHOD",
    "Extrapolation",
    "IntervalLogSd",
    "IntervalInfo",
    "RowIntervals",
    "TargetLogSd",
    "TargetColumns",
    "PredictionRow",
    "PlanRow",
]

STALENESS_UNIT = (
    "updates (foreign model merges, or server updates, between reading the weights and applying the gradient)"
)
EXTRAPOLATION_METHOD = (
    "time_to_train_s = steps_to_train x steady mean step time of the window; "
    "epoch_time_s = samples_per_epoch / window samples_per_s"
)


def _plain(cls: type, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``cls`` (a dataclass of plain fields) in ``obj``."""
    return {f.name: obj[f.name] for f in fields(cls) if f.name in obj}


@dataclass(frozen=True, slots=True, kw_only=True)
class Extrapolation:
    """How a row's long-run figures follow from its simulated window.

    Parameters
    ----------
    window_steps_per_worker : int
        Steps per worker simulated (doubled until steady, up to four times).
    warmup_steps : int
        Steps per worker left out at the window's start.
    steady : bool
        Whether the throughput of the window's two halves differs by less than
        :data:`psgdlab.sim.predict.STEADY_TOLERANCE`.
    half_window_throughput_difference : float
        That relative difference.
    extrapolated : bool
        Always true: ``time_to_train_s`` and ``epoch_time_s`` are extrapolated (``method``).
    """

    window_steps_per_worker: int
    warmup_steps: int
    steady: bool
    half_window_throughput_difference: float
    extrapolated: bool = True
    method: str = EXTRAPOLATION_METHOD

    def to_json(self) -> dict[str, Any]:
        return {
            "extrapolated": self.extrapolated,
            "window_steps_per_worker": self.window_steps_per_worker,
            "warmup_steps": self.warmup_steps,
            "steady": self.steady,
            "half_window_throughput_difference": self.half_window_throughput_difference,
            "method": self.method,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Extrapolation:
        return cls(**_plain(cls, obj))


@dataclass(frozen=True, slots=True, kw_only=True)
class IntervalLogSd:
    """The log-sds behind a row's intervals (:func:`psgdlab.core.records.intervals.row_intervals`):
    ``step_time`` and ``speedup``, and the parts of each, summed in quadrature: the profile's
    parameters (``*_parameters``), the simulated window's noise (``*_simulation``) and the
    run-to-run noise (``*_run_to_run``)."""

    step_time: float
    speedup: float
    step_time_parameters: float
    step_time_simulation: float
    step_time_run_to_run: float
    speedup_parameters: float
    speedup_simulation: float
    speedup_run_to_run: float

    def to_json(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> IntervalLogSd:
        return cls(**_plain(cls, obj))


@dataclass(frozen=True, slots=True, kw_only=True)
class IntervalInfo:
    """What a row's 90 % intervals hold (its ``interval`` key;
    :func:`psgdlab.core.records.intervals.interval_description`).

    Parameters
    ----------
    level : float
        The intervals' coverage (0.9).
    method : str
        How they are computed.
    parameters : tuple of str
        The profile's uncertain parameters (dotted paths); ``parameters_exact`` when none has a
        spread.
    directions : int
        Principal directions of their covariance re-simulated.
    unpinned : tuple of str
        The parameters the data did not pin down.
    noise_cv : float
        The profile's run-to-run relative noise of a mean step.
    noise_processes_per_core : float or None
        The most worker processes per core that noise was measured at.
    log_sd : IntervalLogSd
        The spreads, by source.
    sensitivity_window_steps : int
        Steps per worker of a sensitivity re-simulation (0: none).
    simulation_batches : int
        Batches of the window's batch-means standard error.
    """

    level: float
    method: str
    parameters: tuple[str, ...]
    parameters_exact: bool
    directions: int
    unpinned: tuple[str, ...]
    noise_cv: float
    noise_processes_per_core: float | None
    log_sd: IntervalLogSd
    sensitivity_window_steps: int
    simulation_batches: int

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "method": self.method,
            "parameters": list(self.parameters),
            "parameters_exact": self.parameters_exact,
            "directions": self.directions,
            "unpinned": list(self.unpinned),
            "noise_cv": self.noise_cv,
            "noise_processes_per_core": self.noise_processes_per_core,
            "log_sd": self.log_sd.to_json(),
            "sensitivity_window_steps": self.sensitivity_window_steps,
            "simulation_batches": self.simulation_batches,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> IntervalInfo:
        return cls(
            **{
                **_plain(cls, obj),
                "parameters": tuple(obj["parameters"]),
                "unpinned": tuple(obj["unpinned"]),
                "log_sd": IntervalLogSd.from_json(obj["log_sd"]),
            }
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RowIntervals:
    """A row's 90 % intervals: ``KEY_low`` and ``KEY_high`` for each of
    :data:`~psgdlab.core.records.intervals.INTERVAL_KEYS`
    (same units as ``KEY``), what they hold (``interval``), whether any of the profile's
    parameters is unpinned, and whether the row runs more worker processes per core than the
    profile's noise was measured at (``noise_extrapolated``: its interval leaves out what sharing
    a core adds)."""

    step_time_s_low: float
    step_time_s_high: float
    samples_per_s_low: float
    samples_per_s_high: float
    speedup_low: float
    speedup_high: float
    epoch_time_s_low: float
    epoch_time_s_high: float
    time_to_train_s_low: float
    time_to_train_s_high: float
    interval: IntervalInfo
    has_unpinned_parameters: bool
    noise_extrapolated: bool

    def to_json(self) -> dict[str, Any]:
        bounds = {f"{k}_{side}": getattr(self, f"{k}_{side}") for k in INTERVAL_KEYS for side in ("low", "high")}
        return {
            **bounds,
            "interval": self.interval.to_json(),
            "has_unpinned_parameters": self.has_unpinned_parameters,
            "noise_extrapolated": self.noise_extrapolated,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RowIntervals:
        return cls(**{**_plain(cls, obj), "interval": IntervalInfo.from_json(obj["interval"])})


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetLogSd:
    """The log-sd of a row's time to target (its ``target_log_sd``): the convergence model's
    (``convergence``), the throughput's (``throughput``), both in quadrature (``total``); and for
    comparing two rows (:func:`psgdlab.core.convergence.paired_log_sd`), the derivatives of the
    log epochs in the convergence parameters' logs (``gradient``) and one run's scatter
    (``scatter``)."""

    convergence: float
    throughput: float
    total: float
    gradient: tuple[float, ...]
    scatter: float

    def to_json(self) -> dict[str, Any]:
        return {
            "convergence": self.convergence,
            "throughput": self.throughput,
            "total": self.total,
            "gradient": list(self.gradient),
            "scatter": self.scatter,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TargetLogSd:
        return cls(**{**_plain(cls, obj), "gradient": tuple(obj["gradient"])})


_TARGET_FIGURES = (
    "steps_to_target",
    "epochs_to_target",
    "time_to_target_s",
    "time_to_target_s_low",
    "time_to_target_s_high",
    "gpu_hours_to_target",
    "gpu_hours_to_target_low",
    "gpu_hours_to_target_high",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetColumns(Record):
    """A configuration's time to a target (:func:`psgdlab.core.convergence.target_columns`).

    Parameters
    ----------
    target : str
        The target, ``wer=PCT`` or ``loss=VALUE``.
    reaches_target : bool
        Whether the configuration is expected to reach it.
    target_reason, target_short_reason : str or None
        Why not (the short form only for a row that does not reach it); ``None`` when it does.
    steps_to_target, epochs_to_target : float or None
        Steps per worker and epochs to the target.
    time_to_target_s, gpu_hours_to_target : float or None
        Wall time (s) and device-hours to the target; ``_low`` and ``_high``: the 90 % interval.
        Every figure is ``None`` where the target is not reached.
    target_log_sd : TargetLogSd or None
        The spread behind the intervals (only for a row that reaches the target).
    target_factors : dict or None
        The convergence model's factors of the epochs, by name (``batch``, ``learners``,
        ``staleness``, ``period``, ``epochs_min``, ...: open, as the model's families name them;
        only for a row that reaches the target).
    """

    target: str
    reaches_target: bool
    target_reason: str | None = None
    steps_to_target: float | None = None
    epochs_to_target: float | None = None
    time_to_target_s: float | None = None
    time_to_target_s_low: float | None = None
    time_to_target_s_high: float | None = None
    gpu_hours_to_target: float | None = None
    gpu_hours_to_target_low: float | None = None
    gpu_hours_to_target_high: float | None = None
    target_log_sd: TargetLogSd | None = None
    target_factors: dict[str, float] | None = None
    target_short_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "target": self.target,
            "reaches_target": self.reaches_target,
            "target_reason": self.target_reason,
            **{k: getattr(self, k) for k in _TARGET_FIGURES},
        }
        if self.reaches_target:
            log_sd = self.target_log_sd.to_json() if self.target_log_sd is not None else None
            out.update(target_log_sd=log_sd, target_factors=self.target_factors)
        else:
            out["target_short_reason"] = self.target_short_reason
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TargetColumns:
        return cls(
            **{
                **_plain(cls, obj),
                "target_log_sd": optional(obj, "target_log_sd", TargetLogSd.from_json),
                "target_factors": optional(obj, "target_factors", dict),
            }
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictionRow(Record):
    """One simulated configuration (module docstring; :mod:`psgdlab.sim.predict` defines each figure).

    Parameters
    ----------
    algorithm : str
        The name asked for (a validation's case name, where it set one).
    ran_as : str
        The algorithm simulated (``sgd`` for a sweep's one-worker point).
    workers : int
        Workers (devices).
    node_shape : str
        ``HOSTSxPER_HOST`` of the placement (``?`` where unknown).
    gpus_per_node : int or None
        Workers per host of the placement.
    sockets : str or None
        Workers per socket of each host (:meth:`psgdlab.sim.platform.Placement.sockets_text`).
    processes_per_core : float or None
        Worker processes per CPU core of a host (``None``: the platform models no cores).
    step_time_s, step_time_median_s, step_time_p95_s : float
        Mean time per local step of one worker (s), and the median and 95th percentile of a step.
    samples_per_s : float
        Throughput of all workers, in the workload's samples per second.
    speedup : float
        ``samples_per_s`` over single-worker SGD's on the same platform, workload and batch.
    epoch_time_s, time_to_train_s : float
        Time per epoch and for the workload's epochs (s), extrapolated (``extrapolation``).
    steps_to_train : int
        Steps per worker for the workload's epochs.
    comm_fraction, idle_fraction, compute_fraction, overlap_comm_fraction : float
        Fractions of the workers' wall time.
    staleness_mean : float
        Mean staleness of an update (:data:`STALENESS_UNIT`).
    staleness_max : int
        Its largest value.
    staleness_hist : dict
        Updates by staleness (keys: the staleness as text).
    extrapolation : Extrapolation
        The simulated window behind the figures.
    params : dict
        The algorithm's hyperparameters (:meth:`psgdlab.core.algorithms.Algorithm.params`; open:
        each algorithm has its own).
    stragglers : str
        The straggler model's spec (``""``: none).
    batch_per_worker : int
        Samples per step of one worker.
    sim_events : int
        Events the simulator processed.
    intervals : RowIntervals or None
        The 90 % intervals (``None``: not computed).
    to_target : TargetColumns or None
        The time to the target (``None``: no convergence model).
    failures : dict or None
        What failures cost (:func:`psgdlab.sim.failures.predict_failures`' report, open;
        ``None``: none priced).
    staleness_unit : str
        :data:`STALENESS_UNIT`.
    """

    algorithm: str
    ran_as: str
    workers: int
    node_shape: str
    gpus_per_node: int | None
    sockets: str | None
    processes_per_core: float | None
    step_time_s: float
    step_time_median_s: float
    step_time_p95_s: float
    samples_per_s: float
    speedup: float
    epoch_time_s: float
    time_to_train_s: float
    steps_to_train: int
    comm_fraction: float
    idle_fraction: float
    compute_fraction: float
    overlap_comm_fraction: float
    staleness_mean: float
    staleness_max: int
    staleness_hist: dict[str, int]
    extrapolation: Extrapolation
    params: OpenDict
    stragglers: str
    batch_per_worker: int
    sim_events: int
    intervals: RowIntervals | None = None
    to_target: TargetColumns | None = None
    failures: OpenDict | None = None
    staleness_unit: str = STALENESS_UNIT

    #: the keys of the row's JSON object that are its own fields, in order
    _OWN = (
        "algorithm",
        "ran_as",
        "workers",
        "node_shape",
        "gpus_per_node",
        "sockets",
        "processes_per_core",
        "step_time_s",
        "step_time_median_s",
        "step_time_p95_s",
        "samples_per_s",
        "speedup",
        "epoch_time_s",
        "time_to_train_s",
        "steps_to_train",
        "comm_fraction",
        "idle_fraction",
        "compute_fraction",
        "overlap_comm_fraction",
        "staleness_mean",
        "staleness_max",
        "staleness_hist",
        "staleness_unit",
    )

    @property
    def reaches_target(self) -> bool:
        """Whether the row reaches its target (``False`` without a convergence model)."""
        return self.to_target is not None and self.to_target.reaches_target

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self._OWN}
        out.update(
            extrapolation=self.extrapolation.to_json(),
            params=self.params,
            stragglers=self.stragglers,
            batch_per_worker=self.batch_per_worker,
            sim_events=self.sim_events,
        )
        if self.intervals is not None:
            out.update(self.intervals.to_json())
        if self.to_target is not None:
            out.update(self.to_target.to_json())
        return {**out, **present(failures=self.failures)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PredictionRow:
        return cls(
            **{k: obj[k] for k in (*cls._OWN, "params", "stragglers", "batch_per_worker", "sim_events")},
            extrapolation=Extrapolation.from_json(obj["extrapolation"]),
            intervals=RowIntervals.from_json(obj) if "interval" in obj else None,
            to_target=TargetColumns.from_json(obj) if "reaches_target" in obj else None,
            failures=optional(obj, "failures"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRow(Record):
    """A candidate of ``psgdlab plan`` (:func:`psgdlab.sim.plan.evaluate`): its label
    (``config``) and its prediction's row where it was simulated; a candidate beyond a limit that
    does not depend on the simulation (batch, learners, period) has only why it does not reach the
    target (``target_reason``, and the short form ``target_short_reason``)."""

    config: str
    prediction: PredictionRow | None = None
    target_reason: str | None = None
    target_short_reason: str | None = None

    @property
    def simulated(self) -> bool:
        return self.prediction is not None

    @property
    def reaches_target(self) -> bool:
        return self.prediction is not None and self.prediction.reaches_target

    @property
    def to_target(self) -> TargetColumns:
        """The simulated row's time to target (a :class:`ValueError` for a row not simulated)."""
        if self.prediction is None or self.prediction.to_target is None:
            raise ValueError(f"plan row {self.config!r} has no time to target")
        return self.prediction.to_target

    def to_json(self) -> dict[str, Any]:
        if self.prediction is not None:
            return {**self.prediction.to_json(), "config": self.config, "simulated": True}
        return {
            "config": self.config,
            "reaches_target": False,
            "simulated": False,
            "target_reason": self.target_reason,
            "target_short_reason": self.target_short_reason,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PlanRow:
        if obj["simulated"]:
            rest = {k: v for k, v in obj.items() if k not in ("config", "simulated")}
            return cls(config=obj["config"], prediction=PredictionRow.from_json(rest))
        return cls(
            config=obj["config"],
            target_reason=obj.get("target_reason"),
            target_short_reason=obj.get("target_short_reason"),
        )
