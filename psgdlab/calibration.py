"""A calibrated platform checked against the runs it was fitted from.

:func:`psgdlab.analysis.calibrate.calibrate_runs` fits the links from the runs' exchanges, the
compute from their compute records and the host work from what lies between; it never fits a
step time. Composing those parts into a step (the simulator) can still miss the measured step:
overlap, the cores' scheduling, anything the parts leave out. :func:`run_residuals` predicts each
run as it ran (its algorithm, workers, hosts, size, batch, steps, seed, straggler and failure
policy, read from its ``config.resolved.json`` and summary) on the fitted profile and compares
the mean steps under the comparison's window (:func:`psgdlab.analysis.compare.window_summary`);
:func:`with_residuals` raises the profile's ``noise_cv`` to the root mean square of the log
errors where that is larger than the run-to-run noise, and records the most processes per core
among those runs (``noise_processes_per_core``): a prediction beyond it is more loaded than
anything the noise was measured on. No prediction from the profile can
honestly be surer than the model is on the runs it has seen; a fitted preset follows the same
rule with its figures (:func:`psgdlab.core.stats.fitting.fit_parameters`: the larger of the figures'
noise and the fit's residual spread). ``psgdlab calibrate`` and ``psgdlab validate`` both write
their profiles through it (:func:`fitted_profile`).

One value is fitted through the simulator here, because only the simulator prices what its runs
also hold. Allreduces between hosts of one group size (2 hosts) cannot tell a latency per round
from a cost per call, so their rounds take the messages' latency, which the runs rarely pin
(:func:`psgdlab.analysis.fits.fit_links`); an allreduce of more hosts can, but on a machine with
fewer cores than its ranks (emulated hosts share this machine's cores) its exchanges also hold
the cores' contention, which the simulator's host-cores model prices
(:class:`psgdlab.core.platform.profile.HostCPU`, ``hosts_per_machine``). :func:`pin_latency_between_hosts`
simulates those runs as they ran over a grid of latencies per round and keeps the one their mean
steps say, with its spread.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from psgdlab.analysis.calibration_report import Calibration, LatencyBetweenHosts, Residuals, RunResidual

__all__ = [
    "RunRequest",
    "run_request",
    "run_residuals",
    "residual_cv",
    "with_residuals",
    "LATENCY_GRID",
    "pin_latency_between_hosts",
    "fitted_profile",
]

#: the logarithms, about the prior's value, at which :func:`pin_latency_between_hosts` simulates
#: the runs, in steps of a factor e^0.5: from e^-8 of it (3000 times less: as good as none) to
#: e^3 (20 times more)
LATENCY_GRID = tuple(0.5 * k for k in range(-16, 7))


class RunRequest(NamedTuple):
    """What simulates a ``psgdlab train`` run as it ran (:func:`run_request`): the
    :func:`psgdlab.sim.predict.predict_one` positionals and keywords, and what places it on a
    profile (``hosts``, ``payload_bytes``, ``batch`` per worker)."""

    name: str
    n_workers: int
    hosts: int
    payload_bytes: int
    batch: int
    keywords: dict[str, Any]


def run_request(run: Any) -> RunRequest | None:
    """How to simulate ``run`` (an :class:`psgdlab.analysis.load.Run` of ``psgdlab train``) as it
    ran, read from its ``config.resolved.json`` and summary; ``None`` for a run that recorded no
    resolved ``train`` table, payload or trace (a probe's, an emulator's). The algorithm's
    variant, period and node size are the ones it ran with (the resolved ``algorithm`` table,
    where the run wrote one), never what the profile's platform would say for flags the run was
    not given."""
    from psgdlab.analysis.samples import payload_of, workers_of
    from psgdlab.core.platform.placement import equal_blocks

    train = run.config.get("train")
    payload = payload_of(run)
    if not isinstance(train, dict) or not payload or run.trace is None:
        return None
    n = workers_of(run)
    hosts = int(train.get("hosts") or 1)
    ran = run.config.get("algorithm")
    ran = ran if isinstance(ran, dict) else {}
    keywords = {
        "steps": int(train["steps"]),
        "seed": int(train.get("seed") or 0),
        **{key: ran.get(key, train.get(key)) or None for key in ("variant", "period", "gpus_per_node")},
        "stragglers": train.get("straggler") or None,
        "workers_per_host": equal_blocks(n, hosts=hosts).per_host,
        "on_failure": run.summary.get("on_failure") or None,  # the protocol it ran (a node's, under continue)
    }
    return RunRequest(str(train["algorithm"]), n, hosts, int(payload), int(train["batch"]), keywords)


def residual_cv(pairs: Sequence[tuple[float, float]]) -> float | None:
    r"""Root mean square of :math:`\log(m / p)` over ``(predicted, measured)`` step times: how far
    a measured mean step falls from its prediction, the model's bias included (it is not
    centred); ``None`` without a pair.

    >>> round(residual_cv([(1.0, 1.1), (1.0, 1 / 1.1)]), 4)
    0.0953
    """
    logs = [math.log(m / p) for p, m in pairs if p > 0 and m > 0]
    return math.sqrt(sum(x * x for x in logs) / len(logs)) if logs else None


def run_residuals(profile: Any, run_dirs: Sequence[str | Path]) -> Residuals:
    """Each of ``run_dirs`` that ``profile``'s platform can place (at most its hosts, at most its
    devices per host) predicted as it ran and compared
    (:class:`~psgdlab.analysis.calibration_report.Residuals`: per run its predicted and measured
    mean step and its workers over the cores of the machine that recorded it, ``None`` where it
    did not say; and :func:`residual_cv`, ``None`` when no run could be predicted)."""
    from psgdlab.analysis.cores import cores_of
    from psgdlab.analysis.load import load_run
    from psgdlab.analysis.probe import is_probe_dir
    from psgdlab.sim.predict import predict_one

    platform = profile.platform
    pairs: list[tuple[float, float]] = []
    rows: list[RunResidual] = []
    configs: dict[tuple[int, int], Any] = {}
    for d in run_dirs:
        if is_probe_dir(d):
            continue
        run = load_run(d)
        req = run_request(run)
        if req is None or req.hosts > platform.hosts or req.keywords["workers_per_host"] > platform.devices_per_host:
            continue
        key = (req.payload_bytes // profile.workload.itemsize, req.batch)
        if key not in configs:
            configs[key] = profile.with_values(
                {"workload.n_params": key[0], "workload.batch_per_worker": key[1]}
            ).resolved()
        pred = predict_one(req.name, req.n_workers, configs[key], intervals=False, **req.keywords)
        pair = (_step_time_s(pred.result.trace, req.batch), _step_time_s(run.trace, req.batch))
        pairs.append(pair)
        cores = cores_of([run])
        rows.append(
            RunResidual(
                run=Path(d).name,
                predicted_step_time_s=pair[0],
                measured_step_time_s=pair[1],
                processes_per_core=req.n_workers / cores if cores else None,
            )
        )
    return Residuals(runs=tuple(rows), residual_cv=residual_cv(pairs))


def with_residuals(profile: Any, run_dirs: Sequence[str | Path]) -> tuple[Any, Residuals]:
    """``profile`` with its ``noise_cv`` at least its residual on ``run_dirs``
    (:func:`run_residuals`), and the residuals (the profile's notes say so where it was raised:
    :meth:`~psgdlab.analysis.calibration_report.Calibration.describe`). A profile without
    ``[uncertainty]`` is returned as it is (its parameters are taken as exact)."""
    residuals = run_residuals(profile, run_dirs)
    cv, u = residuals.residual_cv, profile.uncertainty
    if cv is None or u is None:
        return profile, residuals
    loads = [r.processes_per_core for r in residuals.runs if r.processes_per_core]
    load = max([*loads, *([u.noise_processes_per_core] if u.noise_processes_per_core else [])], default=None)
    if cv <= u.noise_cv:  # the noise covers the residuals: of every run predicted, at its load
        covered = dataclasses.replace(u, noise_processes_per_core=load)
        return dataclasses.replace(profile, uncertainty=covered), residuals
    raised = dataclasses.replace(u, noise_cv=round(cv, 6), noise_processes_per_core=load)
    return dataclasses.replace(profile, uncertainty=raised), residuals


def _step_time_s(trace: Any, batch: int) -> float:
    """The mean step of ``trace`` under the comparison's window (the first worker's finish)."""
    from psgdlab.analysis.compare import cut_at_first_finish, window_summary

    return float(window_summary(cut_at_first_finish(trace), samples_per_step=batch)["step_time_s"])


def _as_run(profile: Any, req: RunRequest) -> Any:
    """``profile`` resolved for ``req``: its hosts, its workers per host (each behind its own
    link, as :func:`psgdlab.analysis.calibrate.platform_profile` places devices), every emulated
    host on this machine's cores, its model size and batch; no uncertainty (a point prediction)."""
    per_host = int(req.keywords["workers_per_host"])
    cpu = profile.platform.host_cpu
    platform = dataclasses.replace(
        profile.platform,
        hosts=req.hosts,
        devices_per_host=per_host,
        sockets_per_host=per_host,
        host_cpu=dataclasses.replace(cpu, hosts_per_machine=req.hosts) if cpu is not None else None,
    )
    bare = dataclasses.replace(profile, platform=platform, uncertainty=None)
    n_params = req.payload_bytes // profile.workload.itemsize
    return bare.with_values({"workload.n_params": n_params, "workload.batch_per_worker": req.batch}).resolved()


def pin_latency_between_hosts(
    calibration: Calibration, profile: Any, *, predict: Any = None
) -> tuple[Calibration, LatencyBetweenHosts | None]:
    r"""The latency per round of the allreduce between hosts, fitted through the simulator from
    the runs between hosts with more ranks than cores (``calibration["between_hosts_busy"]``,
    :func:`psgdlab.analysis.calibrate.calibrate_runs`), where the link fit left it unpinned at the
    messages' latency :math:`\alpha_0` (module docstring).

    Each run is simulated as it ran on ``profile`` (the fit's, with its hosts' cores) at latencies
    :math:`\alpha = \alpha_0 e^{x}` over :data:`LATENCY_GRID`, the allreduce's bandwidth moving
    with it as its fit given the latency does: that fit is linear in :math:`\alpha`, so
    :math:`1/\beta(\alpha) = (1 + s\,(1 - \alpha/\alpha_0))/\beta_0` with :math:`s` its
    ``bandwidth_latency_slope`` (:func:`psgdlab.analysis.fits.fit_bandwidth_at_latency`). The log
    errors of the runs' mean steps, at the calibration's run-to-run noise of a mean step, and the
    prior (:math:`\alpha_0` and its spread) give :math:`\chi^2(x)`:

    - a least value inside the grid: a parabola through it and its neighbours gives :math:`\hat x`
      and the spread :math:`1/\sqrt{A}` (:math:`A` the curvature of :math:`\chi^2/2`), widened by
      :math:`\sqrt{\chi^2_\nu}` where the runs scatter more than their noise, never wider than the
      prior; pinned where that is at most :data:`psgdlab.analysis.fits.PINNED_SHRINK` times the
      prior's spread;
    - at the grid's low end: the runs price no latency per round, which is then at its bound 0
      (no spread, as a fitted latency at 0 has none);
    - at its high end: the runs say more than the grid holds; nothing changes.

    Returns the calibration with ``nic.collective`` updated (its latency, bandwidth, spreads and
    their correlation; ``latency_given`` off, ``latency_source`` saying where it came from) and
    ``latency_between_hosts``, the report
    (:class:`~psgdlab.analysis.calibration_report.LatencyBetweenHosts`), and the report;
    ``(calibration, None)`` unchanged where there is nothing to fit.
    ``predict(profile, run, request)`` -> mean step time (default: the simulator,
    :func:`psgdlab.sim.predict.predict_one`) is for tests.
    """
    scan = _latency_scan(calibration, profile, predict)
    if scan is None:
        return calibration, None
    chi2 = [scan.data_chi2(scan.log_errors(scan.alpha0 * math.exp(x))) + (x / scan.prior_sd) ** 2 for x in LATENCY_GRID]
    report = LatencyBetweenHosts(
        runs=tuple(str(run.path) for run, _ in scan.runs),
        log_latency_s=tuple(math.log(scan.alpha0) + x for x in LATENCY_GRID),
        chi2=tuple(chi2),
        pinned=False,
        latency_s=scan.alpha0,
        latency_log_sd=scan.prior_sd,
    )
    least = _least_latency(chi2, scan.alpha0)
    if least is None:  # the runs want more latency than the grid holds: nothing is changed
        return dataclasses.replace(calibration, latency_between_hosts=report), report
    fitted, report = _fitted_latency(scan, report, *least)
    nic = {**(calibration.nic or {}), "collective": fitted}
    return dataclasses.replace(calibration, nic=nic, latency_between_hosts=report), report


@dataclasses.dataclass(frozen=True)
class _LatencyScan:
    """What :func:`pin_latency_between_hosts` scans: the runs between hosts and their measured
    log mean steps, the allreduce between hosts as the link fit left it (``span``: latency
    :math:`\\alpha_0`, bandwidth :math:`\\beta_0`, the prior's log-sd, the bandwidth's slope with the
    latency), the step noise, and the profile and predictor the runs are simulated with."""

    span: dict[str, Any]
    runs: list[tuple[Any, RunRequest]]
    measured: list[float]
    sigma: float
    alpha0: float
    beta0: float
    prior_sd: float
    slope: float
    link0: Any
    profile: Any
    predict: Any

    def bandwidth(self, alpha: float) -> float:
        """The allreduce's bandwidth fitted given latency ``alpha``."""
        return self.beta0 / max(1e-9, 1.0 + self.slope * (1.0 - alpha / self.alpha0))

    def log_errors(self, alpha: float) -> list[float]:
        """The runs' log errors (measured - predicted mean step) at latency ``alpha``."""
        link = dataclasses.replace(self.link0, latency_s=alpha, bandwidth_bytes_per_s=self.bandwidth(alpha))
        platform = dataclasses.replace(self.profile.platform, collective_between_hosts=link)
        prof = dataclasses.replace(self.profile, platform=platform)
        return [m - math.log(self.predict(prof, run, req)) for m, (run, req) in zip(self.measured, self.runs)]

    def data_chi2(self, errors: list[float]) -> float:
        """The runs' :math:`\\chi^2` of ``errors`` at the step noise."""
        return sum((e / self.sigma) ** 2 for e in errors)


def _latency_scan(calibration: Calibration, profile: Any, predict: Any) -> _LatencyScan | None:
    """The scan of :func:`pin_latency_between_hosts`; ``None`` where there is nothing to fit (no
    busy runs between hosts, a latency the link fit pinned or gave no spread, no run to simulate)."""
    from psgdlab.analysis.load import load_run

    span = (calibration.nic or {}).get("collective")
    busy = calibration.between_hosts_busy
    if not busy or not span or not span.get("latency_given") or "latency_s" not in span.get("unpinned", ()):
        return None
    link0 = profile.platform.collective_between_hosts
    if link0 is None or not span.get("latency_log_sd") or not span["latency_s"] > 0:
        return None
    if predict is None:
        from psgdlab.sim.predict import predict_one

        def predict(prof: Any, run: Any, req: RunRequest) -> float:
            pred = predict_one(req.name, req.n_workers, _as_run(prof, req), intervals=False, **req.keywords)
            return _step_time_s(pred.result.trace, req.batch)

    runs = [(run, req) for run in map(load_run, busy) if (req := run_request(run)) is not None]
    if not runs:
        return None
    return _LatencyScan(
        span=span,
        runs=runs,
        measured=[math.log(_step_time_s(run.trace, req.batch)) for run, req in runs],
        sigma=float(calibration.noise.step_cv_used),
        alpha0=float(span["latency_s"]),
        beta0=float(span["bandwidth_bytes_per_s"]),
        prior_sd=float(span["latency_log_sd"]),
        slope=float(span.get("bandwidth_latency_slope") or 0.0),
        link0=link0,
        profile=profile,
        predict=predict,
    )


def _least_latency(chi2: list[float], alpha0: float) -> tuple[float, float] | None:
    """The latency at the least :math:`\\chi^2` over :data:`LATENCY_GRID` and the curvature of
    :math:`\\chi^2/2` there (a parabola through it and its neighbours); at the grid's low end the
    bound 0 and no curvature; ``None`` at its high end."""
    k = min(range(len(chi2)), key=chi2.__getitem__)
    if k == len(chi2) - 1:
        return None
    alpha, curvature = 0.0, 0.0  # the least value at the low end: at its bound 0, as a fitted latency at 0
    if k > 0:
        h = LATENCY_GRID[1] - LATENCY_GRID[0]
        curvature = (chi2[k + 1] - 2 * chi2[k] + chi2[k - 1]) / (2 * h * h)
        alpha = alpha0 * math.exp(LATENCY_GRID[k] - (chi2[k + 1] - chi2[k - 1]) / (4 * h * curvature))
    return alpha, curvature


def _fitted_latency(
    scan: _LatencyScan, report: LatencyBetweenHosts, alpha: float, curvature: float
) -> tuple[dict[str, Any], LatencyBetweenHosts]:
    """The allreduce between hosts at latency ``alpha`` (its bandwidth, spreads and their
    correlation, where it came from) and the report completed."""
    from psgdlab.analysis.fits import PINNED_SHRINK

    span, prior_sd = scan.span, scan.prior_sd
    errors = scan.log_errors(alpha)
    red = scan.data_chi2(errors) / (len(errors) - 1) if len(errors) > 1 else 1.0
    sd = min(prior_sd, math.sqrt(max(1.0, red) / curvature)) if alpha > 0 else None
    pinned = sd is None or sd <= PINNED_SHRINK * prior_sd
    beta = scan.bandwidth(alpha)
    gain = scan.slope * (alpha / scan.alpha0) * beta / scan.beta0  # d ln(beta) / d ln(alpha) at the fit
    bw_sd_given = float(span.get("bandwidth_log_sd") or 0.0)
    bw_sd = math.hypot(bw_sd_given, gain * sd) if sd is not None else bw_sd_given
    fitted = {
        **span,
        "latency_s": alpha,
        "bandwidth_bytes_per_s": beta,
        "latency_log_sd": sd,
        "bandwidth_log_sd": bw_sd,
        "log_correlation": gain * sd / bw_sd if sd is not None and bw_sd > 0 else None,
        "latency_given": False,
        "unpinned": [u for u in span.get("unpinned", ()) if not (pinned and u == "latency_s")],
        "latency_source": (
            f"fitted through the simulator from {len(scan.runs)} runs between hosts with more ranks than cores "
            f"(reduced chi-square {red:.3g}" + (", at its bound 0)" if alpha == 0 else ")")
        ),
    }
    report = dataclasses.replace(
        report, pinned=pinned, latency_s=alpha, latency_log_sd=sd, reduced_chi2=red, log_errors=tuple(errors)
    )
    return fitted, report


def fitted_profile(
    calibration: Calibration, run_dirs: Sequence[str | Path], **platform: Any
) -> tuple[Any, Calibration]:
    """The profile of a :func:`psgdlab.analysis.calibrate.calibrate_runs` fit
    (:func:`~psgdlab.analysis.calibrate.platform_profile` with ``platform``'s keywords), its
    latency per round between hosts fitted through the simulator where the link fit left it
    unpinned (:func:`pin_latency_between_hosts`), and its noise at least its residual on
    ``run_dirs`` (:func:`with_residuals`), its notes describing the calibration as it ends; and
    the calibration, with ``residuals`` (and ``latency_between_hosts`` where that was fitted)."""
    from psgdlab.analysis.calibrate import calibration_notes, platform_profile

    profile = platform_profile(calibration, **platform)
    nic = calibration.nic
    calibration, _ = pin_latency_between_hosts(calibration, profile)
    if calibration.nic is not nic:  # the ring's latency was fitted: its platform and spread follow
        profile = platform_profile(calibration, **platform)
    profile, residuals = with_residuals(profile, run_dirs)
    calibration = dataclasses.replace(calibration, residuals=residuals)
    return dataclasses.replace(profile, notes=calibration_notes(calibration, profile.uncertainty)), calibration
