r"""Fitting a platform profile from measured runs: :func:`calibrate_runs` reads the runs
(:mod:`psgdlab.analysis.samples`), fits each cost law (:mod:`psgdlab.analysis.fits`,
:mod:`psgdlab.analysis.cores`) and returns the fits; :func:`platform_profile` turns them into a
:class:`psgdlab.core.platform.profile.Profile` (``profile.write(path)`` writes the TOML).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict, cast

import numpy as np

from psgdlab.analysis.calibration_report import Calibration, CalibrationNoise
from psgdlab.analysis.fits import (
    MIN_RECORDS,
    PINNED_SHRINK,
    fit_compute_time,
    fit_link,
    fit_links,
    fit_overhead_per_byte,
    overhead_line,
)
from psgdlab.analysis.samples import (
    PAIRWISE_QUANTILE,
    algorithm_of,
    allreduce_algorithm_of,
    allreduce_scatter,
    allreduce_spans,
    averages_model,
    link_samples,
    merging_steps,
    pairwise_scatter,
    payload_of,
    step_gaps,
    workers_of,
)
from psgdlab.core.errors import ConfigError
from psgdlab.core.exchange import ExchangeKind
from psgdlab.core.platform.cost import (
    HOST_AVERAGE_TRAFFIC,
    AllreduceAlgorithm,
    transfer_s,
)
from psgdlab.core.platform.profile import (
    PROCESS_DEVICE,
    Defaults,
    HostCPU,
    Link,
    Platform,
    Profile,
    ServerSpec,
    Uncertainty,
    Workload,
)
from psgdlab.core.records.trace import PHASES
from psgdlab.core.stats.priors import LOOPBACK_BANDWIDTH, LOOPBACK_LATENCY, RUN_NOISE_CV, STEP_NOISE_CV, Prior

__all__ = [
    "Calibration",
    "calibrate_runs",
    "platform_profile",
    "calibration_notes",
    "fit_uncertainty",
    "fit_between_hosts",
    "hosts_of",
    "nic_rate_of",
    "SERVER_QUANTILE",
    # fitted and read by the modules above, named here too
    "fit_compute_time",
    "fit_link",
    "fit_links",
    "fit_overhead_per_byte",
    "step_gaps",
    "allreduce_algorithm_of",
    "MIN_RECORDS",
    "PAIRWISE_QUANTILE",
]

#: server records include queueing behind other workers, which a calibration run of 2 workers
#: rarely meets: the service time is this quantile of the excess over the link (the median; a
#: low quantile picks the luckiest requests: docs/measurements.md, "The cost model")
SERVER_QUANTILE = 0.5


def calibrate_runs(run_dirs: Any, *, warmup_steps: int = 2, cores: int | None = None) -> Calibration:
    r"""Fit this machine's platform profile from runtime run directories: a
    :class:`~psgdlab.analysis.calibration_report.Calibration`.

    Runs with at most ``cores`` workers (every worker has a core) give ``compute``
    (:func:`fit_compute_time` over their compute records) with its ``step_overhead_fixed_s`` and
    ``step_overhead_s_per_byte`` (``[platform] step_overhead_s``, ``_per_byte``: the median of
    :func:`step_gaps` per run, :math:`a + bS` over the runs' payloads by
    :func:`fit_overhead_per_byte`; ``step_overhead_s`` is its value at the largest payload), from
    the runs whose training threads never fold an average back when there are some, the steps
    that do giving ``mix_merge`` (:func:`_fit_mix_merge`),
    ``link`` and ``collective``
    (:func:`fit_links` over their allreduce and pairwise records, see :func:`link_samples`;
    ``link["scatter"]``, how the pairwise averages of the runs of 2 workers scatter around it,
    :func:`~psgdlab.analysis.samples.pairwise_scatter`, and ``collective["scatter"]`` their
    allreduces, :func:`~psgdlab.analysis.samples.allreduce_scatter`) and
    ``server`` (service overhead: the :data:`SERVER_QUANTILE` of the server-exchange durations
    minus :math:`\alpha + S/\beta`, ``None`` without server records). Runs with more workers
    than cores give ``host_cpu`` (:func:`psgdlab.analysis.cores.fit_host_cpu`; ``None`` without
    such runs). ``cores`` defaults to the ``cpu_count`` the runs recorded in ``env.json`` (no
    count: every run counts as uncontended). Also returned: what the runs were (``runs``,
    ``payload_bytes``, ``itemsize``, ``batch``, ``max_workers``, ``cores``). Too little data
    raises :class:`ConfigError` (from the fits).

    Each link point is weighted by its error: its standard error within the run and a
    run-to-run part, the scatter of repeated configurations (``noise``; else
    :data:`~psgdlab.core.stats.priors.RUN_NOISE_CV`); a bandwidth the points do not pin keeps
    :data:`~psgdlab.core.stats.priors.LOOPBACK_BANDWIDTH` and is reported unpinned
    (:func:`fit_link`). One of ``run_dirs`` may be a probe's
    (:func:`psgdlab.analysis.probe.fit_probe`): the bandwidths it pinned are the priors of the
    runs' fits, so a bandwidth the runs do not pin is the probe's while the latency stays the
    runs' (what a step sees: arrival skew, wake-ups); its laws replace the runs' where those
    cannot be fitted at all (``link_source``, per law); its measured CPU work is ``host_cpu``
    unless runs with more workers than cores fit it. Runs with ranks on several emulated hosts
    (one rank per host) give the link between hosts (``nic``, :func:`fit_between_hosts`), those
    with a core per rank only where there are some (the others are ``between_hosts_busy``, for
    :func:`psgdlab.calibration.pin_latency_between_hosts`). Another may be a probe between emulated
    hosts (one rank per host): the link between hosts where no run between hosts gives it
    (``nic``), and its measured CPU work is ``host_cpu_between_hosts``, the work of a message
    that goes through the network stack instead of a host's shared-memory plane (``None``
    without one, or without ``host_cpu``: charged as inside a host, or not at all).
    """
    inputs = _read_inputs(list(run_dirs), cores)
    compute = fit_compute_time(np.concatenate([r.trace for r in inputs.free]), warmup_steps=warmup_steps)
    mix_merge = _fit_step_overhead(inputs.free, compute, warmup_steps=warmup_steps)
    links = _fit_links_inside(inputs, warmup_steps=warmup_steps)
    return _calibration(inputs, compute, mix_merge, links, warmup_steps=warmup_steps)


@dataclass(frozen=True)
class _Inputs:
    """What :func:`calibrate_runs` reads, sorted by what each part is fitted from."""

    #: runs on one host, with their traces
    runs: list[Any]
    #: runs with ranks on several emulated hosts, and those of them with a core per rank (all of
    #: them when none has)
    crossing: list[Any]
    crossing_free: list[Any]
    #: runs on one host with at most ``cores`` workers (the link and compute fits), and the others
    free: list[Any]
    busy: list[Any]
    #: the probe directories given, the probe on one host and the probe between hosts (fitted)
    probe_dirs: list[Any]
    probe: dict[str, Any] | None
    nic_probe: dict[str, Any] | None
    #: the cores the runs had (given, or the ``cpu_count`` they recorded)
    cores: int | None


def _read_inputs(run_dirs: list[Any], cores: int | None) -> _Inputs:
    """Load the runs and fit the probes among ``run_dirs``, refusing what cannot be calibrated
    from (no run on one host, a run without a trace, two probes of a kind, no run with a core
    per worker)."""
    from psgdlab.analysis.cores import cores_of
    from psgdlab.analysis.load import load_run
    from psgdlab.analysis.probe import fit_probe, is_probe_dir

    probe_dirs = [p for p in run_dirs if is_probe_dir(p)]
    runs = [load_run(p) for p in run_dirs if not is_probe_dir(p)]
    crossing = [r for r in runs if hosts_of(r) > 1]
    runs = [r for r in runs if hosts_of(r) == 1]
    if not runs:
        raise ConfigError(
            "calibration needs at least one run directory of psgdlab train on one host (the compute law and "
            "the links inside a host come from end-to-end runs; a probe measures the links only, runs with "
            "--hosts the link between hosts)"
        )
    for run in runs:
        if run.trace is None:
            raise ConfigError(f"{run.path} has no trace.npz to calibrate from")
    cores = cores if cores is not None else cores_of(runs)
    probes = [fit_probe(p, cores=cores) for p in probe_dirs]
    # a probe between emulated hosts measures the NIC and the CPU work of a message between
    # hosts, not this host: at most one of each kind
    inside = [p for p in probes if p["hosts"] == 1]
    across = [p for p in probes if p["hosts"] > 1]
    for kind, found in (("on one host", inside), ("between hosts", across)):
        if len(found) > 1:
            raise ConfigError(
                f"give at most one probe directory {kind} ({len(found)} given: "
                f"{', '.join(str(p['path']) for p in found)})"
            )
    free = [r for r in runs if cores is None or workers_of(r) <= cores]
    if not free:
        raise ConfigError(
            f"every run has more workers than the {cores} cores: the link and the compute time are "
            f"fitted from runs with at most {cores} workers"
        )
    return _Inputs(
        runs=runs,
        crossing=crossing,
        crossing_free=[r for r in crossing if cores is None or workers_of(r) <= cores] or crossing,
        free=free,
        busy=[r for r in runs if r not in free],
        probe_dirs=probe_dirs,
        probe=inside[0] if inside else None,
        nic_probe=across[0] if across else None,
        cores=cores,
    )


def _fit_step_overhead(free: list[Any], compute: dict[str, Any], *, warmup_steps: int) -> dict[str, Any] | None:
    """Add the step overhead of runs whose training threads never fold an average back to
    ``compute`` (``step_overhead_fixed_s``, ``_s_per_byte``, ``step_overhead_s``) and return, beyond
    it, the merge of the steps that do fold one (an AD-PSGD run's active sides; ``None`` where
    every run merges)."""
    base, merging, passive, sizes = [], [], [], []
    for r in free:
        assert r.trace is not None  # checked by _read_inputs
        gaps = step_gaps(r.trace, warmup_steps=warmup_steps)
        if not gaps.size:
            continue
        S = float(payload_of(r) or 0)
        sizes.append(S)
        merges = merging_steps(r, gaps)
        if not merges.any():
            base.append((S, float(np.median(gaps[:, 2]))))
            continue
        merging.append((S, float(np.median(gaps[merges, 2]))))
        if not merges.all():
            passive.append((S, float(np.median(gaps[~merges, 2]))))
    fixed, per_byte = fit_overhead_per_byte(base or merging)
    mix_merge = _fit_mix_merge(merging, passive, fixed, per_byte) if base else None
    compute.update(
        step_overhead_fixed_s=fixed,
        step_overhead_s_per_byte=per_byte,
        step_overhead_s=fixed + per_byte * max(sizes, default=0.0),
    )
    return mix_merge


@dataclass(frozen=True)
class _LinksInside:
    """The links inside a host, as :func:`_fit_links_inside` fitted them."""

    link: dict[str, Any]
    collective: dict[str, Any] | None
    #: where each law came from ("runs", "probe", "runs, bandwidth from the probe")
    source: dict[str, str]
    #: the allreduce schedule the laws are of
    algorithm: str
    #: run-to-run relative scatter of the link points (``None``: no configuration repeats)
    noise_cv: float | None


def _fit_links_inside(inputs: _Inputs, *, warmup_steps: int) -> _LinksInside:
    """The pairwise link and the allreduce's own link from the runs without model averaging,
    their points weighted by their errors, a probe's pinned bandwidths as the priors (its laws
    where the runs' cannot be fitted), and the scatter of single exchanges around them."""
    free, probe = inputs.free, inputs.probe
    plain = [r for r in free if not averages_model(r)]
    if not plain:
        names = ", ".join(algorithm_of(r) for r in free)
        raise ConfigError(
            "the link is fitted from runs without model averaging (ssgd, adpsgd, ...); every run "
            f"with at most {inputs.cores} workers allreduces the model ({names})"
        )
    algorithm = allreduce_algorithm_of(inputs.runs)
    if (
        probe is not None
        and probe["allreduce_algorithm"] != algorithm
        and any(r.meta.get("allreduce_algorithm") for r in inputs.runs)
    ):
        raise ConfigError(
            f"the probe's allreduce schedule ({probe['allreduce_algorithm']}) is not the runs' ({algorithm}); "
            "probe the transport the runs used"
        )
    parts = [link_samples(r, warmup_steps=warmup_steps) for r in plain]
    pts = [np.concatenate([p[i] for p in parts]) for i in range(6)]  # durations, sizes, groups, pairwise, ...
    link_noise = _run_noise_cv([(key, float(x)) for p in parts for key, x in zip(zip(p[3], p[2], p[1]), p[0])])
    sd = np.sqrt(pts[5] ** 2 + ((link_noise if link_noise is not None else RUN_NOISE_CV) * pts[0]) ** 2)
    # a probe's pinned bandwidths are the priors of the runs' fits: where the runs' points pin a
    # bandwidth it is theirs (what a training step sees), where they do not it is the probe's
    priors = {
        key: _measured_prior(probe[key], f"the probe's {key}") if probe is not None else None
        for key in ("link", "collective")
    }
    source = {"link": "runs", "collective": "runs"}
    try:
        link, collective = fit_links(
            pts[0],
            pts[1],
            pts[2],
            pts[3],
            pts[4],
            sd,
            algorithm=algorithm,
            bandwidth_prior=priors["link"] or LOOPBACK_BANDWIDTH,
            collective_prior=priors["collective"] or LOOPBACK_BANDWIDTH,
            latency_prior=LOOPBACK_LATENCY,
        )
    except ConfigError:
        if probe is None:
            raise
        link, collective = probe["link"], probe["collective"]
        source = {"link": "probe", "collective": "probe"}
        algorithm = probe["allreduce_algorithm"]
    if link is not None:  # how single averages scatter around the law: runs of 2 workers
        link["scatter"] = pairwise_scatter(plain, warmup_steps=warmup_steps)
    if collective is not None:  # and single allreduces around theirs
        collective["scatter"] = allreduce_scatter(plain, warmup_steps=warmup_steps)
    _mark_probe_bandwidths(source, priors, link=link, collective=collective)
    return _LinksInside(link=link, collective=collective, source=source, algorithm=algorithm, noise_cv=link_noise)


def _mark_probe_bandwidths(
    source: dict[str, str], priors: dict[str, Prior | None], **fits: dict[str, Any] | None
) -> None:
    """Where the probe pinned a bandwidth the runs did not: say so in ``source``, and keep the
    bandwidth unpinned only where the result is as wide as the spec-sheet prior's spread."""
    bw = "bandwidth_bytes_per_s"
    for key, fit in fits.items():
        if fit is not None and source[key] == "runs" and priors[key] is not None and bw in fit["unpinned"]:
            source[key] = "runs, bandwidth from the probe"
            wide = (fit["bandwidth_log_sd"] or np.inf) > PINNED_SHRINK * LOOPBACK_BANDWIDTH.log_sd
            fit["unpinned"] = [x for x in fit["unpinned"] if x != bw] + ([bw] if wide else [])


def _fit_host_cpu_of(inputs: _Inputs, links: _LinksInside, *, warmup_steps: int) -> dict[str, Any] | None:
    """The CPU work of communication: fitted from the runs with more workers than cores where
    there are some, else the probe's measurement (``None`` without either)."""
    from psgdlab.analysis.cores import fit_host_cpu

    if not inputs.busy:
        return inputs.probe["host_cpu"] if inputs.probe is not None else None
    assert inputs.cores is not None  # without a core count every run is free
    return fit_host_cpu(
        inputs.busy,
        cores=int(inputs.cores),
        link=links.collective or links.link,
        spans=allreduce_spans,
        payload_of=payload_of,
        workers_of=workers_of,
        warmup_steps=warmup_steps,
        algorithm=links.algorithm,
    )


def _calibration(
    inputs: _Inputs,
    compute: dict[str, Any],
    mix_merge: dict[str, Any] | None,
    links: _LinksInside,
    *,
    warmup_steps: int,
) -> Calibration:
    """The rest of the fits (the step noise, model averaging, the server, the host's CPU work, the
    link between hosts) and what the runs were, with ``compute``, ``mix_merge`` and ``links``, as
    one :class:`~psgdlab.analysis.calibration_report.Calibration`."""
    runs, free, cores = inputs.runs, inputs.free, inputs.cores
    probe, nic_probe = inputs.probe, inputs.nic_probe
    link, collective, algorithm = links.link, links.collective, links.algorithm
    step_noise = _run_noise_cv([((algorithm_of(r), workers_of(r), payload_of(r)), _mean_step_s(r)) for r in free])
    averaging = [r for r in free if averages_model(r)]
    model_average = _fit_model_average(averaging, collective or link, algorithm=algorithm, warmup_steps=warmup_steps)
    server = _fit_server(free, link)
    host_cpu = _fit_host_cpu_of(inputs, links, warmup_steps=warmup_steps)
    payloads = [p for p in (payload_of(r) for r in free) if p]
    itemsizes = [int(r.summary.get("itemsize") or r.meta.get("itemsize") or 0) for r in runs]
    batches = [int(r.summary.get("samples_per_step") or r.meta.get("samples_per_step") or 0) for r in runs]
    crossing_free = inputs.crossing_free
    return Calibration(
        compute=compute,
        link=link,
        nic=fit_between_hosts(crossing_free, warmup_steps=warmup_steps) if crossing_free else _probe_nic(nic_probe),
        # runs between hosts with more ranks than cores: left out of the link fit (the cores'
        # contention is in their exchanges), for what the simulator, which prices it, can pin
        # with them (psgdlab.calibration.pin_latency_between_hosts)
        between_hosts_busy=tuple(str(r.path) for r in inputs.crossing if r not in crossing_free),
        collective=collective,
        server=server,
        host_cpu=host_cpu,
        # the CPU work of a message between hosts (a socket through the network stack), measured
        # by the probe between hosts, where the host's cores are modelled; None: charged as inside
        # a host
        host_cpu_between_hosts=nic_probe["host_cpu"] if nic_probe is not None and host_cpu else None,
        model_average=model_average,
        mix_merge=mix_merge,
        link_source=links.source,
        probe=probe["path"] if probe is not None else nic_probe["path"] if nic_probe is not None else None,
        noise=CalibrationNoise(
            link_cv=links.noise_cv,
            step_cv=step_noise,
            link_cv_used=links.noise_cv if links.noise_cv is not None else RUN_NOISE_CV,
            step_cv_used=step_noise if step_noise is not None else STEP_NOISE_CV,
            # the runs whose repeats measured it: the load it was measured at
            processes_per_core=max(workers_of(r) for r in free) / cores if cores else None,
        ),
        cores=cores,
        allreduce_algorithm=algorithm,
        runs=tuple([str(r.path) for r in runs + inputs.crossing] + [str(p) for p in inputs.probe_dirs]),
        payload_bytes=tuple(payloads),
        itemsize=max(itemsizes) or None,
        batch=max(batches) or None,
        max_workers=max(workers_of(r) for r in runs),
    )


def hosts_of(run: Any) -> int:
    """The hosts a run's ranks ran on (1 where the summary does not say: one machine)."""
    return int(run.case.hosts or 1)


def nic_rate_of(run: Any) -> float | None:
    """The shaped NIC rate of a run on emulated hosts, bytes/s (``hosts.json``), or ``None``."""
    import json

    path = run.path / "hosts.json"
    if not path.is_file():
        return None
    rate = json.loads(path.read_text()).get("nic_bandwidth_bytes_per_s")
    return float(rate) if rate else None


def fit_between_hosts(runs: list[Any], *, warmup_steps: int = 2) -> dict[str, Any]:
    r"""The link between hosts from runs with one rank per host (``psgdlab train --hosts H
    --workers H``, :mod:`psgdlab.runtime.launcher.netns`): every exchange of such a run crosses hosts, so
    their allreduce and pairwise points (:func:`link_samples`, with the schedule the runs
    recorded) give what a message between two hosts costs, end to end: :math:`\alpha + S/\beta`.
    As inside a host (:func:`fit_links`), where the runs give both kinds at two sizes or more,
    the pairwise points fit the link (a message between hosts) and the allreduce points, apart,
    the allreduce across hosts (``collective``: gloo's ring moves its bytes between two hosts
    faster than its send/recv both ways on one connection, docs/measurements.md) -- at the
    messages' latency per round where its allreduces all have one group size
    (:func:`fit_links` ``between_hosts``); otherwise ``collective`` is ``None`` and one fit
    prices both. The bandwidth's prior is the shaped rate the runs recorded (``hosts.json``,
    :func:`psgdlab.analysis.probe.nic_prior`), the latency's
    :data:`~psgdlab.core.stats.priors.LOOPBACK_LATENCY`. Runs of different rates, or with several
    ranks on a host (their exchanges mix the two links), are refused. Returned: the fit, with
    ``scatter`` (the runs of 2 ranks', :func:`~psgdlab.analysis.samples.pairwise_scatter`),
    ``collective``, ``rate_bytes_per_s`` (the shaped rate, ``None`` unshaped), ``hosts`` (the
    most of the runs) and ``allreduce_algorithm`` (the schedule of an allreduce across hosts)."""
    for r in runs:
        placement = list(r.case.placement or [])
        if len(set(placement)) != len(placement) or not placement:
            raise ConfigError(
                f"{r.path} has several ranks on one host (placement {placement}): the link between hosts is "
                "fitted from runs with one rank per host (--hosts H --workers H)"
            )
        if r.trace is None:
            raise ConfigError(f"{r.path} has no trace.npz to calibrate from")
    rates = {nic_rate_of(r) for r in runs}
    if len(rates) > 1:
        raise ConfigError(
            f"the runs between hosts were shaped to different NIC rates {sorted(map(str, rates))}: "
            "calibrate one rate at a time"
        )
    rate = rates.pop()
    algorithm = allreduce_algorithm_of(runs)
    parts = [link_samples(r, warmup_steps=warmup_steps) for r in runs]
    pts = [np.concatenate([p[i] for p in parts]) for i in range(6)]
    noise = _run_noise_cv([(key, float(x)) for p in parts for key, x in zip(zip(p[3], p[2], p[1]), p[0])])
    sd = np.sqrt(pts[5] ** 2 + ((noise if noise is not None else RUN_NOISE_CV) * pts[0]) ** 2)
    from psgdlab.analysis.probe import nic_prior

    fit, collective = fit_links(
        pts[0],
        pts[1],
        pts[2],
        pts[3],
        pts[4],
        sd,
        algorithm=algorithm,
        bandwidth_prior=nic_prior(rate),
        latency_prior=LOOPBACK_LATENCY,
        between_hosts=True,
    )
    return {
        **fit,
        "scatter": pairwise_scatter(runs, warmup_steps=warmup_steps),
        "collective": collective,
        "rate_bytes_per_s": rate,
        "hosts": max(hosts_of(r) for r in runs),
        "allreduce_algorithm": algorithm,
        "runs": [str(r.path) for r in runs],
    }


def _between_hosts_work(cpu: dict[str, Any] | None) -> dict[str, float]:
    """The :class:`~psgdlab.core.platform.profile.HostCPU` fields of the CPU work of a message between
    hosts from a probe's ``host_cpu`` fit between hosts (none without one)."""
    if not cpu:
        return {}
    return {
        "work_per_message_between_hosts_s": float(cpu["work_per_message_s"]),
        "work_per_byte_between_hosts_s": float(cpu["work_per_byte_s"]),
    }


def _probe_nic(probe: dict[str, Any] | None) -> dict[str, Any] | None:
    """The link between hosts of a probe on emulated hosts (:func:`psgdlab.analysis.probe.fit_probe`):
    its pairwise link (a message between two hosts), its allreduce fitted apart (``collective``,
    ``None`` when not), the schedule it reported."""
    if probe is None:
        return None
    return {
        **probe["link"],
        "collective": probe["collective"],
        "rate_bytes_per_s": probe["rate_bytes_per_s"],
        "hosts": probe["hosts"],
        "allreduce_algorithm": probe["allreduce_algorithm"],
        "runs": [probe["path"]],
    }


def _measured_prior(fit: dict[str, Any] | None, source: str) -> Prior | None:
    """A pinned bandwidth of a probe's link fit as the prior of another fit; ``None`` when the
    probe did not pin it."""
    if not fit or fit.get("unpinned") or not fit.get("bandwidth_log_sd"):
        return None
    return Prior(value=float(fit["bandwidth_bytes_per_s"]), log_sd=float(fit["bandwidth_log_sd"]), source=source)


def _run_noise_cv(points: list[tuple[Any, float]]) -> float | None:
    """Run-to-run relative scatter of ``(configuration, value)`` points: the standard deviation
    of the logarithms of the values of each configuration measured more than once, pooled over
    configurations (by their degrees of freedom); ``None`` when no configuration repeats."""
    groups: dict[Any, list[float]] = {}
    for key, value in points:
        if value > 0:
            groups.setdefault(key, []).append(float(np.log(value)))
    ss = sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in groups.values() if len(v) > 1)
    dof = sum(len(v) - 1 for v in groups.values() if len(v) > 1)
    return float(np.sqrt(ss / dof)) if dof else None


def _mean_step_s(run: Any) -> float:
    """The run's mean time between consecutive compute starts, over its workers (after 2 steps)."""
    tr = run.trace
    comp = tr[(tr["phase"] == PHASES["compute"]) & (tr["step"] >= 2)]
    gaps = [np.diff(np.sort(comp["start_s"][comp["rank"] == r])) for r in np.unique(comp["rank"])]
    gaps = [g for g in gaps if g.size]
    return float(np.mean(np.concatenate(gaps))) if gaps else 0.0


def _fit_mix_merge(
    merging: list[tuple[float, float]], passive: list[tuple[float, float]], fixed: float, per_byte: float
) -> dict[str, Any] | None:
    r"""Host work of the training thread folding an average back (``[platform] mix_merge_s``,
    ``mix_merge_s_per_byte``): the median step overhead of the steps that do it (``(payload,
    overhead)`` per run: :func:`merging_steps`) beyond the overhead line :math:`a + bS` of the
    runs without averages, then :func:`fit_overhead_per_byte` over those excesses. A passive
    side merges in its responder thread, off its step: its own excess (``passive_excess_s``, per
    run) is reported, not priced. ``None`` without such runs."""
    if not merging:
        return None
    out = overhead_line([(S, max(g - (fixed + per_byte * S), 0.0)) for S, g in merging])
    out["passive_excess_s"] = [round(g - (fixed + per_byte * S), 6) for S, g in sorted(passive)]
    return out


def _fit_model_average(
    runs: list[Any], link: dict[str, Any], *, algorithm: str = "ring", warmup_steps: int
) -> dict[str, Any] | None:
    r"""Host work of folding an averaged model back (``[platform] model_average_s``, ``_s_per_byte``)
    from model-averaging runs (:func:`averages_model`): their allreduce records hold the clone,
    the allreduce and the algorithm's combine, so per run the median span beyond the ring model
    of ``link`` (:func:`psgdlab.analysis.cores.span_excess`), then :math:`a + bS` over the runs'
    payloads (:func:`fit_overhead_per_byte`). ``None`` without such runs."""
    from psgdlab.analysis.cores import span_excess

    pts = []
    for r in runs:
        S = payload_of(r)
        got = (
            span_excess(
                r,
                allreduce_spans,
                n_workers=workers_of(r),
                payload_bytes=float(S or 0),
                link=link,
                warmup_steps=warmup_steps,
                algorithm=algorithm,
            )
            if S
            else None
        )
        if got is not None:
            pts.append((float(S or 0), got[0]))
    return overhead_line(pts) if pts else None


def _fit_server(runs: list[Any], link: dict[str, Any]) -> dict[str, Any] | None:
    r"""Server service time beyond the link, :math:`t - \alpha - S/\beta`: with one payload size its
    :data:`SERVER_QUANTILE`; with two or more, per size that quantile, fitted as
    ``overhead + 3 S / memory bandwidth`` (the server's update reads the model and the message and
    writes the model: ``apply_on_host``) when it grows with the size."""
    srv_d, srv_s = [], []
    for r in runs:
        tr = r.trace
        sel = tr[(tr["kind"] == ExchangeKind.SERVER) & (tr["phase"] == PHASES["comm"]) & (tr["nbytes"] > 0)]
        srv_d.append((sel["end_s"] - sel["start_s"]).astype(float))
        srv_s.append(sel["nbytes"].astype(float))
    sd, ss = np.concatenate(srv_d), np.concatenate(srv_s)
    if sd.size < MIN_RECORDS:
        return None
    excess = sd - transfer_s(ss, link["bandwidth_bytes_per_s"], link["latency_s"])
    sizes = np.unique(ss)
    per_size = np.array([np.quantile(excess[ss == x], SERVER_QUANTILE) for x in sizes])
    out = {"samples": int(sd.size), "median_excess_s": float(np.median(excess)), "memory_bandwidth_bytes_per_s": None}
    traffic = HOST_AVERAGE_TRAFFIC * sizes  # the update's memory traffic (core.cost.host_average_s)
    slope = np.polyfit(traffic, per_size, 1)[0] if sizes.size >= 2 else 0.0
    if slope > 0:
        overhead = float(np.mean(per_size - slope * traffic))
        out["memory_bandwidth_bytes_per_s"] = float(1.0 / slope)
    else:
        overhead = float(np.quantile(excess, SERVER_QUANTILE))
    out["service_overhead_s"] = max(overhead, 0.0)
    return out


def platform_profile(
    calibration: Calibration,
    *,
    name: str = "calibrated",
    devices: int | None = None,
    n_params: int | None = None,
    itemsize: int | None = None,
    batch: int | None = None,
    workers: tuple[int, ...] | None = None,
    hosts: int | None = None,
) -> Profile:
    """The simulator's platform profile (:class:`psgdlab.core.platform.profile.Profile`) of a
    :func:`calibrate_runs` fit, with the fit described as its notes
    (:meth:`~psgdlab.analysis.calibration_report.Calibration.describe`).

    One host (this machine) of ``devices`` devices (default: the largest worker count of the
    runs), each behind its own link (``sockets_per_host = devices``: the fitted link already is
    what one worker gets, it is not shared again); the fitted link is both ``pcie`` and ``nic``,
    staging ``direct``; the server is the fitted link plus the fitted service overhead; with a
    ``host_cpu`` fit, ``host_cpu`` (the host's cores and the CPU work of communication); with a
    ``collective`` fit, ``collective`` (the allreduce's own link); ``allreduce``, the runs'
    schedule (:func:`allreduce_algorithm_of`). The workload is ``n_params`` items of ``itemsize``
    bytes (default: the runs' payload) with the fitted compute distribution at ``batch``;
    ``workers``, the sweep's default worker counts.

    With a fit of the link between hosts (``nic``, :func:`fit_between_hosts`): ``hosts`` hosts
    (default: the most the runs between hosts used) of ``devices`` devices each, joined by
    ``nic``: its bandwidth and latency the fitted end-to-end ones, and ``allreduce_between_hosts``
    the runs' schedule across hosts. Without it, one host and the fitted link is the NIC too.
    Either way ``endpoints = "process"``: the ranks are processes that are the network's
    endpoints, so a message between hosts takes the NIC path alone, and so does every edge of an
    allreduce across hosts (gloo's, process to process).
    """
    devices = int(devices or calibration.max_workers)
    itemsize = int(itemsize or calibration.itemsize or 4)
    if n_params is None:
        payloads = calibration.payload_bytes
        if not payloads:
            raise ConfigError("the runs do not record their payload (payload_bytes); give n_params")
        n_params = max(1, int(max(payloads)) // itemsize)
    batch = int(batch or calibration.batch or 1)
    platform = _calibrated_platform(calibration, name=name, devices=devices, hosts=hosts)
    workload = Workload(
        name=name + "-workload",
        description="the calibration runs' model",
        n_params=int(n_params),
        itemsize=itemsize,
        compute=calibration.compute["spec"],
        reference_batch=batch,
        batch_per_worker=batch,
    )
    defaults = Defaults(workers=tuple(int(w) for w in workers)) if workers else Defaults()
    uncertainty = fit_uncertainty(calibration)
    notes = calibration_notes(calibration, uncertainty)
    return Profile(platform=platform, workload=workload, defaults=defaults, uncertainty=uncertainty, notes=notes)


def _fitted_link(fit: dict[str, Any]) -> Link:
    """A fitted law (latency, bandwidth, the scatter around it) as a :class:`Link`."""
    return Link(
        latency_s=float(fit["latency_s"]),
        bandwidth_bytes_per_s=float(fit["bandwidth_bytes_per_s"]),
        scatter=tuple(fit.get("scatter") or ()),
    )


def _between_hosts(calibration: Calibration, hosts: int | None) -> dict[str, Any]:
    """The :class:`Platform` fields of the link between hosts (``hosts``, ``nic``, the allreduce
    across hosts and its own link where fitted apart); empty without a fit of it."""
    nic_fit = calibration.nic
    if not nic_fit:
        return {}
    between = {
        "hosts": int(hosts or nic_fit["hosts"]),
        "nic": _fitted_link(nic_fit),
        "allreduce_between_hosts": nic_fit["allreduce_algorithm"],
    }
    span = nic_fit.get("collective")  # the allreduce between hosts, fitted apart
    if span:
        between["collective_between_hosts"] = Link(
            latency_s=float(span["latency_s"]), bandwidth_bytes_per_s=float(span["bandwidth_bytes_per_s"])
        )
    return between


class _HostWork(TypedDict):
    """The :class:`Platform` fields of the host work a calibration measured."""

    host_memory_bandwidth_bytes_per_s: NotRequired[float]
    model_average_s: float
    model_average_s_per_byte: float
    mix_merge_s: float
    mix_merge_s_per_byte: float
    step_overhead_s: float
    step_overhead_s_per_byte: float


def _host_work(calibration: Calibration) -> _HostWork:
    """The :class:`Platform` fields of the host work the fit measured (zero where it did not):
    model averaging, the mix merge, the step overhead, the server's memory bandwidth."""
    comp, srv = calibration.compute, calibration.server
    avg, mix = calibration.model_average, calibration.mix_merge
    mem_bw = srv.get("memory_bandwidth_bytes_per_s") if srv else None
    work: _HostWork = {
        "model_average_s": float(avg["fixed_s"]) if avg else 0.0,
        "model_average_s_per_byte": float(avg["s_per_byte"]) if avg else 0.0,
        "mix_merge_s": float(mix["fixed_s"]) if mix else 0.0,
        "mix_merge_s_per_byte": float(mix["s_per_byte"]) if mix else 0.0,
        "step_overhead_s": float(comp.get("step_overhead_fixed_s", comp.get("step_overhead_s")) or 0.0),
        "step_overhead_s_per_byte": float(comp.get("step_overhead_s_per_byte") or 0.0),
    }
    if mem_bw:
        work["host_memory_bandwidth_bytes_per_s"] = float(mem_bw)
    return work


def _calibrated_platform(calibration: Calibration, *, name: str, devices: int, hosts: int | None) -> Platform:
    """The :class:`Platform` of :func:`platform_profile`: this machine (or its emulated hosts) with
    the fitted links, host work, server and CPU work of communication."""
    link, srv, cpu = calibration.link, calibration.server, calibration.host_cpu
    fitted_link = _fitted_link(link)
    between = _between_hosts(calibration, hosts)
    return Platform(
        name=name,
        description=(
            f"{between['hosts']} emulated hosts of this machine (network namespaces, shaped links), fitted from "
            "measured runs"
            if between
            else "this machine, fitted from measured runs (loopback transport, emulated devices)"
        ),
        hosts=between.get("hosts", 1),
        devices_per_host=devices,
        sockets_per_host=devices,
        device=PROCESS_DEVICE,
        pcie=fitted_link,
        nic=between.get("nic", fitted_link),
        endpoints="process",
        allreduce_between_hosts=between.get("allreduce_between_hosts"),
        collective_between_hosts=between.get("collective_between_hosts"),
        collective=_fitted_link(calibration.collective) if calibration.collective else None,
        allreduce=cast(AllreduceAlgorithm, calibration.allreduce_algorithm or "ring"),
        **_host_work(calibration),
        staging="direct",
        server=ServerSpec(
            latency_s=float(link["latency_s"]),
            bandwidth_bytes_per_s=float(link["bandwidth_bytes_per_s"]),
            service_overhead_s=float(srv["service_overhead_s"]) if srv else 0.0,
            apply_on_host=bool(srv.get("memory_bandwidth_bytes_per_s") if srv else None),
        ),
        host_cpu=HostCPU(
            cores_per_host=int(cpu["cores_per_host"]),
            work_per_message_s=float(cpu["work_per_message_s"]),
            work_per_byte_s=float(cpu["work_per_byte_s"]),
            hosts_per_machine=int(between.get("hosts", 1)),
            **_between_hosts_work(calibration.host_cpu_between_hosts),
        )
        if cpu
        else None,
    )


def calibration_notes(calibration: Calibration, uncertainty: Uncertainty | None) -> tuple[str, ...]:
    """The header notes of a profile fitted from ``calibration``: where it came from, then the
    calibration described (:meth:`~psgdlab.analysis.calibration_report.Calibration.describe`)."""
    return (
        f"Platform profile fitted by `psgdlab calibrate` from {len(calibration.runs)} run(s):",
        *[f"  {r}" for r in calibration.runs],
        *calibration.describe(uncertainty),
    )


def _tie_latency(
    params: list[str], sds: list[float], corr: list[list[float]], slope: float
) -> tuple[list[float], list[list[float]]]:
    r"""The spread of an allreduce between hosts whose rounds take the NIC's latency
    (:func:`psgdlab.analysis.fits.fit_bandwidth_at_latency`): its latency *is* the NIC's, and
    its bandwidth, fitted given that latency, moves with it by ``slope``
    (:math:`\partial \ln\beta / \partial \ln\alpha`: a longer latency leaves the measured
    allreduces less time for their bytes) beside its own spread given the latency. Both are
    linear in the NIC's log latency, so the covariance is :math:`J \Sigma J^\top`."""
    a = params.index("platform.nic.latency_s")
    sd = np.array(sds)
    J = np.eye(len(params))
    for key, gain, own in (("latency_s", 1.0, 0.0), ("bandwidth_bytes_per_s", slope, 1.0)):
        path = f"platform.collective_between_hosts.{key}"
        if path in params:
            i = params.index(path)
            J[i, i], J[i, a] = own, gain
    cov = J @ (np.array(corr) * np.outer(sd, sd)) @ J.T
    sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    scale = np.where(sd > 0, sd, 1.0)
    out = np.clip(cov / np.outer(scale, scale), -1.0, 1.0)
    np.fill_diagonal(out, 1.0)
    return sd.tolist(), out.tolist()


def fit_uncertainty(calibration: Calibration) -> Uncertainty:
    """The :class:`~psgdlab.core.platform.profile.Uncertainty` of a :func:`calibrate_runs` fit: the
    log-sd of each fitted latency and bandwidth (``platform.pcie`` and, fitted apart,
    ``platform.collective`` and ``platform.nic``; a latency at its bound 0 has none) and of the CPU work of
    communication (``platform.host_cpu``, per message and per byte, from the probe's or the
    oversubscribed runs' scatter, and between hosts from the probe between hosts; one at its
    bound 0 has none), their correlation within each
    table, the bandwidths the data did not pin (kept at
    :data:`~psgdlab.core.stats.priors.LOOPBACK_BANDWIDTH`, marked unpinned) and the run-to-run noise of
    a mean step (measured where a configuration repeats, else
    :data:`~psgdlab.core.stats.priors.STEP_NOISE_CV`) with the processes per core it was measured at.
    The link between hosts (``platform.nic``, fitted from runs with hosts or a probe between
    them) is one more table, and its allreduce fitted apart (``platform.collective_between_hosts``)
    another (its latency, where it is the messages', with their spread: one value); a platform of
    one host does not use them, so their spread moves no prediction there."""
    params: list[str] = []
    sds: list[float] = []
    blocks: list[tuple[int, int, float]] = []
    unpinned: list[str] = []
    span = (calibration.nic or {}).get("collective") or {}
    links = (
        ("platform.pcie", calibration.link),
        ("platform.collective", calibration.collective),
        ("platform.nic", calibration.nic),
        ("platform.collective_between_hosts", span),
    )
    for table, fit in links:
        if not fit:
            continue
        first = len(params)
        for key, sd_key in (("latency_s", "latency_log_sd"), ("bandwidth_bytes_per_s", "bandwidth_log_sd")):
            if fit.get(sd_key) is not None and fit[key] > 0:
                params.append(f"{table}.{key}")
                sds.append(float(fit[sd_key]))
                if key in fit.get("unpinned", ()):
                    unpinned.append(f"{table}.{key}")
        if len(params) - first == 2 and fit.get("log_correlation") is not None:
            # +-1 (one size: the latency is the duration less the prior's bytes term) would make the
            # matrix singular; 0.999 keeps it positive definite for a Cholesky factor
            blocks.append((first, first + 1, float(np.clip(fit["log_correlation"], -0.999, 0.999))))
    between = calibration.host_cpu_between_hosts
    for cpu, suffix in ((calibration.host_cpu, "s"), (between, "between_hosts_s")):
        if not cpu or not cpu.get("work_log_sd"):
            continue
        first = len(params)
        for key, sd in zip(("work_per_message", "work_per_byte"), cpu["work_log_sd"]):
            if sd is not None and cpu[f"{key}_s"] > 0:
                params.append(f"platform.host_cpu.{key}_{suffix}")
                sds.append(float(sd))
        if len(params) - first == 2 and cpu.get("work_log_correlation") is not None:
            blocks.append((first, first + 1, float(np.clip(cpu["work_log_correlation"], -0.999, 0.999))))
    corr = [[1.0 if i == j else 0.0 for j in range(len(params))] for i in range(len(params))]
    for i, j, c in blocks:
        corr[i][j] = corr[j][i] = c
    correlated = bool(blocks)
    if span.get("latency_given") and "platform.nic.latency_s" in params:
        sds, corr = _tie_latency(params, sds, corr, span["bandwidth_latency_slope"])
        correlated = True
    return Uncertainty(
        parameters=tuple(params),
        log_sd=tuple(sds),
        correlation=tuple(tuple(row) for row in corr) if correlated else (),
        unpinned=tuple(unpinned),
        noise_cv=float(calibration.noise.step_cv_used),
        noise_processes_per_core=calibration.noise.processes_per_core,
    )
