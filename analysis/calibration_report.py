"""What a calibration found, as one typed result, and its one rendering.

:func:`psgdlab.analysis.calibrate.calibrate_runs` returns a :class:`Calibration`: the fit of each
cost law (compute, the link and the allreduce inside a host, the link and allreduce between
hosts, the server, the CPU work of communication, the host work of folding an average back),
where the data came from and what it was (runs, payloads, cores), and the run-to-run noise;
:func:`psgdlab.calibration.fitted_profile` adds how the fitted profile predicts the runs it came
from (:class:`Residuals`) and, where it fitted it through the simulator, the latency per round
between hosts (:class:`LatencyBetweenHosts`). ``psgdlab calibrate --json`` prints
:meth:`Calibration.to_json` (with ``out``); :meth:`Calibration.from_json` reads it back (and the
``calibration`` of ``validate.json``).

:meth:`Calibration.describe` renders it, once, for every place that shows it: the fitted
profile's notes (:func:`psgdlab.analysis.calibrate.platform_profile`), what ``psgdlab calibrate``
prints, and the calibration lines of ``psgdlab validate``'s table.

Each law's fit is the JSON object its fitting function returns (:data:`LawFit`; its keys are
that function's: :func:`psgdlab.analysis.fits.fit_link` and
:func:`~psgdlab.analysis.fits.fit_links` for links, :func:`~psgdlab.analysis.fits.fit_compute_time`,
:func:`~psgdlab.analysis.cores.fit_host_cpu`, :func:`~psgdlab.analysis.fits.overhead_line`); the
calibration around them is declared here. Times are in seconds, bandwidths in bytes per second,
spreads are standard deviations of logarithms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from psgdlab.core.platform.cost import allreduce_rounds
from psgdlab.core.platform.profile import Uncertainty
from psgdlab.core.records.results import Record, optional, present
from psgdlab.core.stats.priors import RUN_NOISE_CV, STEP_NOISE_CV

__all__ = [
    "LawFit",
    "MAX_REL_RESIDUAL",
    "CalibrationNoise",
    "RunResidual",
    "Residuals",
    "LatencyBetweenHosts",
    "Calibration",
]

#: one cost law's fit, the JSON object its fitting function returns (module docstring)
LawFit = dict[str, Any]
#: a law whose points miss it by more than this (relative) is flagged: the runs disagree
MAX_REL_RESIDUAL = 0.5


def _plain(cls: type, obj: Mapping[str, Any]) -> dict[str, Any]:
    return {f.name: obj[f.name] for f in fields(cls) if f.name in obj}


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationNoise:
    """The run-to-run noise of the calibration runs: the relative scatter of a link point
    (``link_cv``) and of a mean step (``step_cv``) where a configuration was measured more than
    once (``None`` where none was), the values the fits used (the measured ones, else
    :data:`~psgdlab.core.stats.priors.RUN_NOISE_CV` and :data:`~psgdlab.core.stats.priors.STEP_NOISE_CV`),
    and the most worker processes per core of the runs it was measured on."""

    link_cv: float | None = None
    step_cv: float | None = None
    link_cv_used: float = RUN_NOISE_CV
    step_cv_used: float = STEP_NOISE_CV
    processes_per_core: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "link_cv": self.link_cv,
            "step_cv": self.step_cv,
            "link_cv_used": self.link_cv_used,
            "step_cv_used": self.step_cv_used,
            "processes_per_core": self.processes_per_core,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CalibrationNoise:
        return cls(**_plain(cls, obj))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResidual(Record):
    """One calibration run predicted as it ran on the fitted profile: its directory's name, the
    predicted and measured mean step (s), and its worker processes per core (``None`` where the
    run did not record its machine's cores)."""

    run: str
    predicted_step_time_s: float
    measured_step_time_s: float
    processes_per_core: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "predicted_step_time_s": self.predicted_step_time_s,
            "measured_step_time_s": self.measured_step_time_s,
            "processes_per_core": self.processes_per_core,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RunResidual:
        return cls(**_plain(cls, obj))


@dataclass(frozen=True, slots=True, kw_only=True)
class Residuals(Record):
    """The calibration runs predicted on the fitted profile (:func:`psgdlab.calibration.run_residuals`),
    and the root mean square of their log errors (``None``: no run could be predicted)."""

    runs: tuple[RunResidual, ...]
    residual_cv: float | None

    def to_json(self) -> dict[str, Any]:
        return {"runs": [r.to_json() for r in self.runs], "residual_cv": self.residual_cv}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Residuals:
        return cls(runs=tuple(RunResidual.from_json(r) for r in obj["runs"]), residual_cv=obj["residual_cv"])


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyBetweenHosts(Record):
    """The latency per round of the allreduce between hosts fitted through the simulator
    (:func:`psgdlab.calibration.pin_latency_between_hosts`): the runs, the grid of log latencies
    and its chi-square, the fitted latency (s) and its log spread (``None`` at its bound 0),
    whether the runs pinned it, and where the grid's least value was inside it, the reduced
    chi-square and the runs' log errors at the fit."""

    runs: tuple[str, ...]
    log_latency_s: tuple[float, ...]
    chi2: tuple[float, ...]
    pinned: bool
    latency_s: float
    latency_log_sd: float | None
    reduced_chi2: float | None = None
    log_errors: tuple[float, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": list(self.runs),
            "log_latency_s": list(self.log_latency_s),
            "chi2": list(self.chi2),
            "pinned": self.pinned,
            "latency_s": self.latency_s,
            "latency_log_sd": self.latency_log_sd,
            **present(
                reduced_chi2=self.reduced_chi2,
                log_errors=list(self.log_errors) if self.log_errors is not None else None,
            ),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LatencyBetweenHosts:
        return cls(
            **{
                **_plain(cls, obj),
                "runs": tuple(obj["runs"]),
                "log_latency_s": tuple(obj["log_latency_s"]),
                "chi2": tuple(obj["chi2"]),
                "log_errors": optional(obj, "log_errors", tuple),
            }
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration(Record):
    """A platform calibration from measured runs (module docstring).

    Parameters
    ----------
    compute : LawFit
        The compute-time law (:func:`~psgdlab.analysis.fits.fit_compute_time`) with the step
        overhead (``step_overhead_fixed_s``, ``step_overhead_s_per_byte``, ``step_overhead_s``).
    link : LawFit
        The link inside a host (pairwise exchanges; the allreduce too where ``collective`` is
        ``None``), with ``scatter`` where runs of 2 workers gave it.
    collective : LawFit or None
        The allreduce inside a host, fitted apart.
    nic : LawFit or None
        The link between hosts (:func:`~psgdlab.analysis.calibrate.fit_between_hosts`), with its
        own allreduce (``collective``), the shaped rate, the hosts and their schedule.
    between_hosts_busy : tuple of str
        Runs between hosts with more ranks than cores, left out of the link fit.
    server : LawFit or None
        The parameter server's service overhead and update bandwidth.
    host_cpu, host_cpu_between_hosts : LawFit or None
        The CPU work of communication (a message inside a host, and one between hosts).
    model_average, mix_merge : LawFit or None
        Host work of folding an averaged model back, and of a training thread merging an average.
    link_source : dict
        Per law (``link``, ``collective``), where it came from (``runs``, ``probe``, ...).
    probe : str or None
        The probe directory among the runs.
    noise : CalibrationNoise
        The runs' run-to-run noise.
    cores : int or None
        CPU cores of the machine the runs ran on.
    allreduce_algorithm : str
        The runs' allreduce schedule.
    runs : tuple of str
        The run directories (probes last).
    payload_bytes : tuple of int
        The payload of each run with a core per worker.
    itemsize, batch : int or None
        The model's bytes per parameter and the runs' batch per worker.
    max_workers : int
        The most workers of a run on one host.
    residuals : Residuals or None
        The runs predicted on the fitted profile (only after :func:`psgdlab.calibration.fitted_profile`).
    latency_between_hosts : LatencyBetweenHosts or None
        The latency per round between hosts fitted through the simulator, where it was.
    """

    compute: LawFit
    link: LawFit
    collective: LawFit | None = None
    nic: LawFit | None = None
    between_hosts_busy: tuple[str, ...] = ()
    server: LawFit | None = None
    host_cpu: LawFit | None = None
    host_cpu_between_hosts: LawFit | None = None
    model_average: LawFit | None = None
    mix_merge: LawFit | None = None
    link_source: dict[str, str] = field(default_factory=dict)
    probe: str | None = None
    noise: CalibrationNoise = field(default_factory=CalibrationNoise)
    cores: int | None = None
    allreduce_algorithm: str = "ring"
    runs: tuple[str, ...] = ()
    payload_bytes: tuple[int, ...] = ()
    itemsize: int | None = None
    batch: int | None = None
    max_workers: int = 1
    residuals: Residuals | None = None
    latency_between_hosts: LatencyBetweenHosts | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "compute": self.compute,
            "link": self.link,
            "nic": self.nic,
            "between_hosts_busy": list(self.between_hosts_busy),
            "collective": self.collective,
            "server": self.server,
            "host_cpu": self.host_cpu,
            "host_cpu_between_hosts": self.host_cpu_between_hosts,
            "model_average": self.model_average,
            "mix_merge": self.mix_merge,
            "link_source": self.link_source,
            "probe": self.probe,
            "noise": self.noise.to_json(),
            "cores": self.cores,
            "allreduce_algorithm": self.allreduce_algorithm,
            "runs": list(self.runs),
            "payload_bytes": list(self.payload_bytes),
            "itemsize": self.itemsize,
            "batch": self.batch,
            "max_workers": self.max_workers,
        }
        later = present(
            latency_between_hosts=self.latency_between_hosts.to_json() if self.latency_between_hosts else None,
            residuals=self.residuals.to_json() if self.residuals is not None else None,
        )
        return {**out, **later}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Calibration:
        """The calibration of a JSON object; a key it lacks takes its default (a partial
        calibration, as a test or an older ``validate.json`` has)."""
        return cls(
            **{
                **_plain(cls, obj),
                "between_hosts_busy": tuple(obj.get("between_hosts_busy", ())),
                "noise": CalibrationNoise.from_json(obj.get("noise") or {}),
                "runs": tuple(obj.get("runs", ())),
                "payload_bytes": tuple(obj.get("payload_bytes", ())),
                "residuals": optional(obj, "residuals", Residuals.from_json),
                "latency_between_hosts": optional(obj, "latency_between_hosts", LatencyBetweenHosts.from_json),
            }
        )

    # ----- the one rendering ----------------------------------------------------------------------
    def describe(self, uncertainty: Uncertainty | None = None) -> list[str]:
        """The calibration as lines of text: each law with how well its points fit it, where it
        came from and what it leaves unpinned; the uncertainty of the profile fitted from it
        (``uncertainty``, where given) and how that profile predicts the runs. One rendering for
        the fitted profile's notes, ``psgdlab calibrate``'s output and ``psgdlab validate``'s."""
        return [
            "Residuals of the fit:",
            *self._compute_lines(),
            *self._inside_lines(),
            *self._between_lines(),
            *self._host_work_lines(),
            *self._uncertainty_lines(uncertainty),
        ]

    def _compute_lines(self) -> list[str]:
        c = self.compute
        return [
            f"  compute: lognormal mean {c['mean_s']:.6g} s, cv {c['cv']:.4g} (sample mean "
            f"{c.get('sample_mean_s', c['mean_s']):.6g} s), median {c['p50_s']:.6g} s, "
            f"p95 {c['p95_s']:.6g} s, {c['samples']} records, Kolmogorov-Smirnov distance {c['ks_distance']:.4g}"
        ]

    def _inside_lines(self) -> list[str]:
        lk, co, source = self.link, self.collective, self.link_source
        lines = [
            f"  link: {lk['latency_s']:.4g} s + S / {lk['bandwidth_bytes_per_s']:.4g} B/s from {lk['samples']} "
            f"exchanges ({lk['allreduce_samples']} allreduce, {lk['pairwise_samples']} pairwise) of sizes "
            f"{lk['payload_sizes_bytes']} B in {lk['points']} points (median allreduce span, low quantile of "
            f"pairwise durations per run and size), rms residual {lk['rms_residual_s']:.4g} s, max relative "
            f"residual {lk['max_rel_residual']:.4g}{_disagree(lk)}{_unpinned(lk)}{_source(source, 'link')}",
            *_scatter_line("pairwise averages inside a host", lk),
            "  collective (allreduce, fitted apart from the pairwise exchanges): "
            + (
                f"{co['latency_s']:.4g} s + S / {co['bandwidth_bytes_per_s']:.4g} B/s from "
                f"{co['samples']} allreduces, rms residual {co['rms_residual_s']:.4g} s, max relative "
                f"residual {co['max_rel_residual']:.4g}{_disagree(co)}{_unpinned(co)}{_source(source, 'collective')}"
                if co
                else "not fitted apart (too few allreduce or pairwise sizes): the link's"
            ),
            *(_scatter_line("allreduces inside a host", co) if co else []),
            f"  allreduce schedule: {self.allreduce_algorithm} (latency rounds over 2, 4, 8 ranks: "
            f"{', '.join(str(allreduce_rounds(n, self.allreduce_algorithm)) for n in (2, 4, 8))})",
        ]
        if self.probe is not None:
            lines.append(f"  probe: {self.probe}")
        return lines

    def _between_lines(self) -> list[str]:
        nic = self.nic
        if not nic:
            return ["  between hosts: no runs between hosts: one host, the link above is the NIC too"]
        lines = [
            f"  between hosts: {nic['latency_s']:.4g} s + S / {nic['bandwidth_bytes_per_s']:.4g} B/s end to end "
            f"({nic['allreduce_algorithm']} allreduce) from {nic['samples']} exchanges "
            f"({nic['allreduce_samples']} allreduce, {nic['pairwise_samples']} pairwise) of runs with one "
            f"rank per host, NIC shaped to {nic['rate_bytes_per_s'] or 0:.4g} B/s (0: unshaped), rms "
            f"residual {nic['rms_residual_s']:.4g} s, max relative residual {nic['max_rel_residual']:.4g}"
            f"{_disagree(nic)}{_unpinned(nic)}",
            *_scatter_line("pairwise averages between hosts", nic),
        ]
        span = nic.get("collective")
        if span:
            lines.append(
                "  allreduce between hosts (fitted apart from the pairwise exchanges between hosts): "
                f"{span['latency_s']:.4g} s + S / {span['bandwidth_bytes_per_s']:.4g} B/s from {span['samples']} "
                f"allreduces, rms residual {span['rms_residual_s']:.4g} s, max relative residual "
                f"{span['max_rel_residual']:.4g}{_unpinned(span)}"
                + (f"; its latency per round {span['latency_source']}" if span.get("latency_source") else "")
            )
        return lines

    def _host_work_lines(self) -> list[str]:
        srv, avg, mix, cpu, c = self.server, self.model_average, self.mix_merge, self.host_cpu, self.compute
        fixed = c.get("step_overhead_fixed_s", c.get("step_overhead_s", 0.0))
        per_byte = c.get("step_overhead_s_per_byte", 0.0)
        size = max(self.payload_bytes, default=0)
        return [
            "  server: "
            + (
                f"service overhead {srv['service_overhead_s']:.4g} s, update at "
                f"{srv['memory_bandwidth_bytes_per_s'] or 0:.4g} B/s of memory (0: not fitted) from "
                f"{srv['samples']} requests (median excess over the link {srv['median_excess_s']:.4g} s)"
                if srv
                else "no server exchanges measured; overhead 0"
            ),
            "  model average (the fold of an averaged model back, beyond the allreduce): "
            + (
                f"{avg['fixed_s']:.4g} s + {avg['s_per_byte']:.4g} s per byte from {avg['runs']} runs (excess "
                f"{avg['excess_s']} s at {avg['payloads_bytes']} B)"
                if avg
                else "no model-averaging runs: 0"
            ),
            f"  step overhead (host work between a step's exchanges and the next compute, apart from the compute: "
            f"a straggler does not slow it): {fixed:.4g} s + {per_byte:.4g} s per byte of model "
            f"({fixed + per_byte * size:.4g} s at the runs' largest payload, {size} B)",
            "  merge of an average by the training thread: "
            + (
                f"{mix['fixed_s']:.4g} s + {mix['s_per_byte']:.4g} s per byte from {mix['runs']} runs (excess "
                f"{mix['excess_s']} s at {mix['payloads_bytes']} B; the passive sides' own excess, not priced: "
                f"{mix.get('passive_excess_s', [])} s)"
                if mix
                else "no runs with pairwise averages: 0"
            ),
            "  host cores: "
            + (
                f"{cpu['cores_per_host']} cores; CPU work {cpu['work_per_message_s']:.4g} s per message, "
                f"{cpu['work_per_byte_s']:.4g} s per byte from {cpu['records']} "
                + (
                    "exchanges of the probe (their CPU time; median "
                    if cpu.get("source")
                    else "allreduces in runs with more workers than cores (median excess "
                )
                + f"{cpu['median_excess_s']} s, rms residual {cpu['rms_residual_s']:.4g} s)"
                if cpu
                else "no run had more workers than cores: the cores are not modelled"
                + (f" (this machine's {self.cores} cores)" if self.cores else " (no core count recorded: give --cores)")
            ),
        ]

    def _uncertainty_lines(self, u: Uncertainty | None) -> list[str]:
        lines = []
        if u is not None:
            lines.append(
                "  uncertainty: "
                + ", ".join(f"{p} log-sd {sd:.3g}" for p, sd in zip(u.parameters, u.log_sd))
                + (f"; unpinned (kept at the prior): {', '.join(u.unpinned)}" if u.unpinned else "")
                + f"; run-to-run noise of a mean step {self.noise.step_cv_used:.3g}"
            )
        res = self.residuals
        if res is not None and res.residual_cv is not None:
            cv, run = res.residual_cv, self.noise.step_cv_used
            loads = [r.processes_per_core for r in res.runs if r.processes_per_core]
            load = max([*loads, *([self.noise.processes_per_core] if self.noise.processes_per_core else [])], default=0)
            raised = cv > run
            lines.append(
                f"  the runs predicted on the fitted profile: rms log residual of the mean step {cv:.3g} over "
                f"{len(res.runs)} runs; noise_cv {max(cv, run):.3g} "
                + (
                    f"(raised to the residual): the calibration runs' rms log residual is above their run-to-run "
                    f"noise alone, {run:.3g}" + (f", at up to {load:g} worker processes per core" if load else "")
                    if raised
                    else "(run-to-run)"
                )
            )
        return lines


def _disagree(fit: Mapping[str, Any]) -> str:
    """A warning where a law's points miss it by more than :data:`MAX_REL_RESIDUAL`."""
    bad = fit.get("max_rel_residual", 0.0) > MAX_REL_RESIDUAL
    return " -- the calibration runs disagree (a disturbed machine?): re-run with --min-idle-cores" if bad else ""


def _unpinned(fit: Mapping[str, Any]) -> str:
    unpinned = fit.get("unpinned") or []
    return f"; unpinned (kept at the prior, marked in [uncertainty]): {', '.join(unpinned)}" if unpinned else ""


def _source(source: Mapping[str, str], key: str) -> str:
    where = source.get(key, "runs")
    return "" if where == "runs" else f"; from {where}"


def _scatter_line(what: str, fit: Mapping[str, Any] | None) -> list[str]:
    """How single exchanges (``what``) scatter around their law (``fit["scatter"]``), if measured."""
    q: Sequence[float] = (fit or {}).get("scatter") or ()
    if not q:
        return []
    mid = len(q) // 2
    return [
        f"  {what}, alone (runs of 2): {q[0]:.2g} / {q[mid]:.2g} / {q[-1]:.2g} times the law "
        "(2 / 50 / 98 % quantiles; the simulator draws each one's factor from them)"
    ]
