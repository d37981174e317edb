"""The summaries of run directories that hold more than one case, and plan's answer.

A run directory's ``summary.json`` has one of three shapes, each a dataclass written by
:func:`psgdlab.core.records.rundir.write_summary` (the one writer of the file) and read by
:func:`psgdlab.core.records.rundir.read_run_summary`; all share a header (:func:`header`):
``schema_version`` (:data:`psgdlab.core.records.results.SCHEMA_VERSION`), ``kind`` and ``source``, the
executor that wrote it.

- ``case`` (:class:`psgdlab.core.records.rundir.Summary`): one configuration's run, by any executor;
- ``sweep`` (:class:`SweepSummary`): ``psgdlab predict``'s sweep, a :class:`~psgdlab.core.records.rows.PredictionRow`
  per configuration (each also a ``case`` under ``runs/``);
- ``plan`` (:class:`PlanSummary`): ``psgdlab plan``'s answer (:class:`PlanAnswer`, what
  ``plan --json`` prints) and a brief row per candidate (:class:`PlanBrief`).

A summary written before the header existed has none; :func:`kind_of` tells its shape from its
keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from psgdlab.core.errors import ConfigError
from psgdlab.core.records.results import SCHEMA_VERSION, Record, document, schema_version_of
from psgdlab.core.records.rows import PlanRow, PredictionRow

__all__ = [
    "Kind",
    "header",
    "kind_of",
    "SweepSummary",
    "NotReaching",
    "PlanAnswer",
    "PlanBrief",
    "PlanSummary",
]

Kind = Literal["case", "sweep", "plan"]
_KINDS: tuple[Kind, ...] = ("case", "sweep", "plan")
#: the header's keys, in order
HEADER_KEYS = ("schema_version", "kind", "source")


def header(kind: Kind, source: str) -> dict[str, Any]:
    """The keys every ``summary.json`` starts with: ``schema_version``, ``kind``, ``source``."""
    return {"schema_version": SCHEMA_VERSION, "kind": kind, "source": source}


def kind_of(obj: Mapping[str, Any], *, where: object) -> Kind:
    """The shape of a ``summary.json`` object: its ``kind``, or for one written before the
    header, ``plan`` where it has ``candidates``, ``sweep`` where it has ``rows``, else ``case``;
    a :class:`ConfigError` naming ``where`` for a kind this psgdlab does not know (or a newer
    ``schema_version``)."""
    schema_version_of(obj, where=where)
    kind = obj.get("kind")
    if kind is None:
        return "plan" if "candidates" in obj else "sweep" if "rows" in obj else "case"
    if kind not in _KINDS:
        raise ConfigError(f"{where}: summary kind ({kind!r}) must be one of {', '.join(_KINDS)}")
    return kind  # type: ignore[no-any-return]  # checked against the literal's values above


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSummary:
    """``psgdlab predict``'s ``summary.json`` (:func:`psgdlab.sim.report.write_prediction`).

    Parameters
    ----------
    platform, workload : str
        Their names.
    payload_bytes : int
        Bytes of the model one exchange moves.
    batch_per_worker : int
        Samples per step of one worker, in ``sample_unit``.
    sample_unit : str
        What a sample is (``21-frame samples``).
    samples_per_epoch : float
        Samples of one epoch.
    epochs : float
        Epochs of the time to train.
    has_unpinned_parameters, noise_extrapolated : bool
        Whether any row has them (:func:`psgdlab.sim.report.row_flags`).
    rows : tuple of PredictionRow
        One per (algorithm, workers), in the sweep's order.
    source : str
        The executor (``simulator``).
    """

    KIND = "sweep"
    SPEEDUP_BASELINE = "single-worker SGD on the same platform, workload and per-worker batch"
    EXTRAPOLATION_NOTE = (
        "time_to_train_s and epoch_time_s are extrapolated from a simulated window of each configuration "
        "(rows[i].extrapolation gives the window and whether it was steady)"
    )
    INTERVAL_NOTE = (
        "KEY_low and KEY_high: the 90 % interval of KEY (rows[i].interval says what it holds: parameter "
        "uncertainty, simulated-window noise, run-to-run noise)"
    )

    platform: str
    workload: str
    payload_bytes: int
    batch_per_worker: int
    sample_unit: str
    samples_per_epoch: float
    epochs: float
    has_unpinned_parameters: bool
    noise_extrapolated: bool
    rows: tuple[PredictionRow, ...]
    source: str = "simulator"

    def to_json(self) -> dict[str, Any]:
        return {
            **header("sweep", self.source),
            "platform": self.platform,
            "workload": self.workload,
            "payload_bytes": self.payload_bytes,
            "batch_per_worker": self.batch_per_worker,
            "sample_unit": self.sample_unit,
            "samples_per_epoch": self.samples_per_epoch,
            "epochs": self.epochs,
            "speedup_baseline": self.SPEEDUP_BASELINE,
            "staleness_unit": "updates",
            "extrapolated": True,
            "extrapolation_note": self.EXTRAPOLATION_NOTE,
            "interval_note": self.INTERVAL_NOTE,
            "has_unpinned_parameters": self.has_unpinned_parameters,
            "noise_extrapolated": self.noise_extrapolated,
            "rows": [r.to_json() for r in self.rows],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SweepSummary:
        plain = {f.name: obj[f.name] for f in fields(cls) if f.name in obj and f.name != "rows"}
        return cls(**plain, rows=tuple(PredictionRow.from_json(r) for r in obj["rows"]))

    def answer(self, *, run_dir: str, wall_s: float) -> dict[str, Any]:
        """What ``predict --json`` prints: the run directory, the names, the wall time (s) the
        command took, the flags and the rows (a document: ``schema_version`` first)."""
        return document(
            {
                "run_dir": run_dir,
                "platform": self.platform,
                "workload": self.workload,
                "wall_s": wall_s,
                "has_unpinned_parameters": self.has_unpinned_parameters,
                "noise_extrapolated": self.noise_extrapolated,
                "rows": [r.to_json() for r in self.rows],
            }
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NotReaching:
    """Candidates of a plan that do not reach the target for one reason: how many, and the
    long reason of one of them."""

    count: int
    example: str | None

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "example": self.example}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> NotReaching:
        return cls(count=obj["count"], example=obj["example"])


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanAnswer(Record):
    """``psgdlab plan``'s answer (what ``plan --json`` prints; :mod:`psgdlab.sim.plan`).

    Parameters
    ----------
    candidates : int
        Configurations searched.
    pareto : tuple of PlanRow
        The Pareto front of time to target against GPU-hours, by time.
    recommended : PlanRow or None
        The recommended configuration (``None``: none within the limits).
    ties : tuple of PlanRow
        The rows tied with it (the model cannot rank them).
    why : str
        Why it was recommended.
    target, objective : str
        The target (``wer=PCT``, ``loss=VALUE``) and what the recommendation minimises.
    simulated, reaching, within_limits : int
        Candidates simulated, expected to reach the target, and of those within the limits.
    not_reaching : dict
        By short reason (prefixed with the algorithm where it needed a simulation), the
        candidates that do not reach the target.
    parallelism : str
        How the candidates were computed.
    steps : int
        Simulated steps per worker of a candidate.
    platform, workload : str
        Their names.
    wall_s : float
        Wall time of the search (s).
    run_dir : str or None
        The run directory written (``None`` in the run directory's own summary).
    """

    candidates: int
    pareto: tuple[PlanRow, ...]
    recommended: PlanRow | None
    ties: tuple[PlanRow, ...]
    why: str
    target: str
    objective: str
    simulated: int
    reaching: int
    within_limits: int
    not_reaching: dict[str, NotReaching]
    parallelism: str
    steps: int
    platform: str
    workload: str
    wall_s: float
    run_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "candidates": self.candidates,
            "pareto": [r.to_json() for r in self.pareto],
            "recommended": self.recommended.to_json() if self.recommended is not None else None,
            "ties": [r.to_json() for r in self.ties],
            "why": self.why,
            "target": self.target,
            "objective": self.objective,
            "simulated": self.simulated,
            "reaching": self.reaching,
            "within_limits": self.within_limits,
            "not_reaching": {k: v.to_json() for k, v in self.not_reaching.items()},
            "parallelism": self.parallelism,
            "steps": self.steps,
            "platform": self.platform,
            "workload": self.workload,
            "wall_s": self.wall_s,
        }
        return out if self.run_dir is None else {**out, "run_dir": self.run_dir}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PlanAnswer:
        rows = ("pareto", "recommended", "ties", "not_reaching")
        plain = {f.name: obj[f.name] for f in fields(cls) if f.name in obj and f.name not in rows}
        rec = obj["recommended"]
        return cls(
            **plain,
            pareto=tuple(PlanRow.from_json(r) for r in obj["pareto"]),
            recommended=PlanRow.from_json(rec) if rec is not None else None,
            ties=tuple(PlanRow.from_json(r) for r in obj["ties"]),
            not_reaching={k: NotReaching.from_json(v) for k, v in obj["not_reaching"].items()},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanBrief:
    """One candidate of a plan in its run directory's summary: the row's label, whether and when
    it reaches the target (s and device-hours, with 90 % intervals; ``None`` where it does not or
    was not simulated), its mean step time (s) and staleness (updates)."""

    config: str
    reaches_target: bool
    target_reason: str | None
    time_to_target_s: float | None = None
    time_to_target_s_low: float | None = None
    time_to_target_s_high: float | None = None
    gpu_hours_to_target: float | None = None
    gpu_hours_to_target_low: float | None = None
    gpu_hours_to_target_high: float | None = None
    step_time_s: float | None = None
    staleness_mean: float | None = None
    simulated: bool = False

    @classmethod
    def of(cls, row: PlanRow) -> PlanBrief:
        """The brief of a plan's row."""
        return cls.from_json(row.to_json())

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PlanBrief:
        values: dict[str, Any] = {f.name: obj.get(f.name) for f in fields(cls)}
        return cls(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSummary:
    """``psgdlab plan``'s ``summary.json``: its answer (without ``run_dir``) and a brief row per
    candidate, in candidate order."""

    KIND = "plan"

    answer: PlanAnswer
    rows: tuple[PlanBrief, ...] = field(default=())
    source: str = "simulator"

    def to_json(self) -> dict[str, Any]:
        answer = replace(self.answer, run_dir=None).to_json()
        return {**header("plan", self.source), **answer, "rows": [r.to_json() for r in self.rows]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PlanSummary:
        rest = {k: v for k, v in obj.items() if k not in (*HEADER_KEYS, "rows")}
        return cls(
            answer=PlanAnswer.from_json(rest),
            rows=tuple(PlanBrief.from_json(r) for r in obj["rows"]),
            source=str(obj.get("source", "simulator")),
        )
