"""What ``psgdlab validate`` found, as typed results: each case, and the report (``validate.json``).

:class:`ValidationCase` is one predicted and measured case (a row of the table);
:class:`ValidationReport` is the whole validation, written as ``validate.json`` and returned by
:func:`psgdlab.validate.validate`; :meth:`ValidationReport.answer` is what ``validate --json``
prints. ``validate.json`` is the report as a document (with ``schema_version``). Both are
read-only mappings over their JSON keys (:class:`psgdlab.core.records.results.Record`),
so the text table (:func:`psgdlab.validate.report.format_table`) reads either them or the JSON
read back. Times are in seconds, throughputs in samples per second, errors relative
(``(predicted - measured) / measured``), staleness in updates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from psgdlab.analysis.calibration_report import Calibration
from psgdlab.core.records.results import OpenDict, Record, document, optional, present, schema_version_of

__all__ = ["ValidationCase", "RankingCounts", "ValidationReport", "ANSWER_KEYS"]

#: the keys of ``validate.json`` that ``validate --json`` prints (with ``hosts`` and
#: ``measured_in`` where the report has them)
ANSWER_KEYS = (
    "cases",
    "median_abs_step_time_error",
    "max_abs_step_time_error",
    "max_abs_staleness_mean_error",
    "ranking",
    "ranking_identical",
    "ranking_detail",
    "interval_coverage",
    "interval_max_half_width",
    "targets",
    "targets_met",
    "platform",
    "calibrate_workers",
    "load_average",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationCase(Record):
    """One case of a validation, predicted and measured (:func:`psgdlab.validate.report.case_row`).

    Parameters
    ----------
    algorithm : str
        The case's name (:data:`psgdlab.validate.plan.ALGORITHM_CASES`).
    workers : int
        Workers in all.
    predicted_step_time_s, measured_step_time_s : float or None
        Mean step over the comparison's window (:mod:`psgdlab.analysis.compare`).
    step_time_error : float or None
        Their relative error.
    staleness_mean_predicted, staleness_mean_measured : float or None
        Mean staleness of an update.
    staleness_mean_rel_error : float or None
        Its relative error (``None`` where nothing was measured).
    predicted_samples_per_s, measured_samples_per_s : float or None
        Throughput of all workers.
    measured_samples_per_s_se : float or None
        The standard error of the measured throughput (batch means within the run,
        :func:`psgdlab.analysis.compare.samples_per_s_se`; ``None``: not known, as in a
        ``validate.json`` written before it was recorded).
    interval_low, interval_high : float or None
        The prediction's 90 % step-time interval relative to the prediction (``None``: none).
    in_interval : bool or None
        Whether the measured step fell inside it.
    noise_extrapolated : bool or None
        Whether the interval's run-to-run noise was measured at fewer worker processes per core.
    path : dict
        Where the step went on each side: per key of :data:`psgdlab.core.records.trace.STEP_PATH_KEYS`,
        ``{"predicted": s, "measured": s}``.
    straggler : str
        The straggler spec (``""``: none).
    hosts : int
        Hosts the workers ran on.
    nic_bandwidth : str or None
        The shaped NIC rate between them (``None``: one host, or unshaped).
    """

    algorithm: str
    workers: int
    predicted_step_time_s: float | None
    measured_step_time_s: float | None
    step_time_error: float | None
    staleness_mean_predicted: float | None
    staleness_mean_measured: float | None
    staleness_mean_rel_error: float | None
    predicted_samples_per_s: float | None
    measured_samples_per_s: float | None
    interval_low: float | None
    interval_high: float | None
    in_interval: bool | None
    noise_extrapolated: bool | None
    path: dict[str, dict[str, float | None]]
    straggler: str = ""
    hosts: int = 1
    nic_bandwidth: str | None = None
    measured_samples_per_s_se: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ValidationCase:
        return cls(**{f.name: obj[f.name] for f in fields(cls) if f.name in obj})


@dataclass(frozen=True, slots=True, kw_only=True)
class RankingCounts(Record):
    """Pairs of cases ranked by samples/s: ``ranked`` (the measured difference beyond two combined
    standard errors), ``tied`` (within them) and, of the ranked, ``misordered`` by the prediction
    (:func:`psgdlab.analysis.compare.ranking_counts`)."""

    ranked: int
    tied: int
    misordered: int

    def to_json(self) -> dict[str, Any]:
        return {"ranked": self.ranked, "tied": self.tied, "misordered": self.misordered}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RankingCounts:
        return cls(ranked=obj["ranked"], tied=obj["tied"], misordered=obj["misordered"])


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationReport(Record):
    """A validation (``validate.json``; the module docstring of :mod:`psgdlab.validate`).

    Parameters
    ----------
    cases : tuple of ValidationCase
        Every case, in the order measured.
    interval_coverage : float or None
        The fraction of cases measured inside their 90 % interval (``None``: no intervals).
    interval_max_half_width : float or None
        The widest interval's half-width, relative.
    median_abs_step_time_error, max_abs_step_time_error, max_abs_staleness_mean_error : float or None
        Over the cases.
    ranking : RankingCounts
        Over every group of cases.
    ranking_identical : bool
        Whether no ranked pair is misordered.
    ranking_detail : dict
        Per group (straggler, or hosts, rate and straggler) and worker count (as text), the
        ranking of :func:`psgdlab.validate.stats.pooled_ranking` (open: its keys are that
        function's).
    targets : dict
        The targets of this grid (:func:`psgdlab.validate.plan.targets_for`), by name.
    targets_met : dict
        Whether each was met, by name.
    platform : str or tuple of str
        The fitted platform file(s), one per NIC rate with hosts.
    calibrate_workers : tuple of int
        The worker counts of the calibration runs.
    calibration : Calibration or dict
        The calibration (one per platform file with hosts, by its name).
    config : dict
        The validation's :class:`psgdlab.validate.plan.ValidateConfig`, its fields.
    load_average : dict
        The machine before each run (:func:`psgdlab.validate.machine.wait_for_quiet`) and at the
        start and end (open: a key per run).
    measured_in : str or None
        The earlier validate whose runs were compared again (``--measured``).
    hosts : dict or None
        With hosts: the cases (``HxN``) and H-ADPSGD's advantage, predicted and measured
        (:func:`psgdlab.validate.stats.hadpsgd_advantage`).
    """

    cases: tuple[ValidationCase, ...]
    interval_coverage: float | None
    interval_max_half_width: float | None
    median_abs_step_time_error: float | None
    max_abs_step_time_error: float | None
    max_abs_staleness_mean_error: float | None
    ranking: RankingCounts
    ranking_identical: bool
    ranking_detail: dict[str, dict[str, OpenDict]]
    targets: dict[str, float]
    targets_met: dict[str, bool]
    platform: str | tuple[str, ...]
    calibrate_workers: tuple[int, ...]
    calibration: Calibration | dict[str, Calibration]
    config: OpenDict
    load_average: OpenDict
    measured_in: str | None = None
    hosts: OpenDict | None = None

    def to_json(self) -> dict[str, Any]:
        cal = self.calibration
        return {
            "cases": [c.to_json() for c in self.cases],
            "interval_coverage": self.interval_coverage,
            "interval_max_half_width": self.interval_max_half_width,
            "median_abs_step_time_error": self.median_abs_step_time_error,
            "max_abs_step_time_error": self.max_abs_step_time_error,
            "max_abs_staleness_mean_error": self.max_abs_staleness_mean_error,
            "ranking": self.ranking.to_json(),
            "ranking_identical": self.ranking_identical,
            "ranking_detail": self.ranking_detail,
            "targets": self.targets,
            "platform": self.platform if isinstance(self.platform, str) else list(self.platform),
            "calibrate_workers": list(self.calibrate_workers),
            "calibration": cal.to_json() if isinstance(cal, Calibration) else {k: c.to_json() for k, c in cal.items()},
            "config": self.config,
            "load_average": self.load_average,
            **present(measured_in=self.measured_in, hosts=self.hosts),
            "targets_met": self.targets_met,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ValidationReport:
        """The report of a ``validate.json`` object (a :class:`ConfigError` for one a newer psgdlab
        wrote)."""
        schema_version_of(obj, where="validate.json")
        cal = obj["calibration"]
        one = "link" in cal or not cal
        platform = obj["platform"]
        return cls(
            **{k: obj[k] for k in ("interval_coverage", "interval_max_half_width", "ranking_identical")},
            **{k: obj[k] for k in ("median_abs_step_time_error", "max_abs_step_time_error")},
            **{k: obj[k] for k in ("max_abs_staleness_mean_error", "ranking_detail", "targets", "targets_met")},
            **{k: obj[k] for k in ("config", "load_average")},
            cases=tuple(ValidationCase.from_json(c) for c in obj["cases"]),
            ranking=RankingCounts.from_json(obj["ranking"]),
            platform=platform if isinstance(platform, str) else tuple(platform),
            calibrate_workers=tuple(obj["calibrate_workers"]),
            calibration=Calibration.from_json(cal) if one else {k: Calibration.from_json(c) for k, c in cal.items()},
            measured_in=obj.get("measured_in"),
            hosts=optional(obj, "hosts"),
        )

    def answer(self) -> dict[str, Any]:
        """What ``validate --json`` prints: :data:`ANSWER_KEYS` (and ``hosts``, ``measured_in``
        where the report has them) of the report, as a document."""
        obj = self.to_json()
        return document({k: obj[k] for k in (*ANSWER_KEYS, "hosts", "measured_in") if k in obj})
