r"""Fitting a platform profile from measured traces.

- :func:`fit_compute_time`: the per-step compute-time distribution from compute records,
  as a log-normal with the measured mean and coefficient of variation (the form
  :class:`psgdlab.core.timing.ComputeTime` reads), with its median, 95th percentile, and the
  Kolmogorov–Smirnov distance between the sample and the fitted law as the residual.
- :func:`fit_link`: latency :math:`\alpha` and bandwidth :math:`\beta` of one link class from
  exchanges of different sizes, by least squares on the cost model of each exchange kind
  (pairwise: :math:`t = \alpha + S/\beta`; ring allreduce over ``n``:
  :math:`t = 2(n-1)\alpha + 2(n-1)/n \cdot S/\beta`), with per-record residuals.

Both refuse to guess: too few records, a single payload size (bandwidth and latency cannot be
separated), or a negative fitted bandwidth raise :class:`psgdlab.core.errors.ConfigError` saying
what more data is needed.

Examples
--------
>>> import numpy as np
>>> sizes = np.array([1e3, 1e5, 1e6, 1e7] * 3)
>>> times = 20e-6 + sizes / 2e9
>>> fit = fit_link(times, sizes)
>>> round(fit["latency_s"] * 1e6, 3), round(fit["bandwidth_bytes_per_s"] / 1e9, 3)
(20.0, 2.0)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from psgdlab.core.errors import ConfigError
from psgdlab.core.trace import PHASES

__all__ = ["fit_compute_time", "fit_link", "calibrate_runs", "platform_toml", "write_platform", "MIN_RECORDS",
           "PAIRWISE_QUANTILE", "SERVER_QUANTILE"]

MIN_RECORDS = 8
#: pairwise records may include waiting for the peer's lock: keep those at or below this
#: quantile of their payload size
PAIRWISE_QUANTILE = 0.25
#: server records include queueing behind other workers, which a calibration run of 2 workers
#: rarely meets: the service time is this quantile of the excess over the link (the median; a
#: low quantile picks the luckiest requests and underestimated easgd's step in validation)
SERVER_QUANTILE = 0.5


def fit_compute_time(trace: np.ndarray, *, warmup_steps: int = 2) -> dict[str, Any]:
    """Fit the compute-time distribution of ``trace``'s compute records (after ``warmup_steps``)."""
    sel = trace[(trace["phase"] == PHASES["compute"]) & (trace["step"] >= warmup_steps)]
    d = (sel["end_s"] - sel["start_s"]).astype(float)
    d = d[d > 0]
    if d.size < MIN_RECORDS:
        raise ConfigError(f"too little data to fit compute time: {d.size} compute records after "
                          f"{warmup_steps} warm-up steps (need >= {MIN_RECORDS}); run more steps")
    mean, std = float(d.mean()), float(d.std(ddof=1))
    cv = std / mean
    sigma = math.sqrt(math.log1p(cv * cv))
    mu = math.log(mean) - sigma * sigma / 2
    ks = float(stats.kstest(d, "lognorm", args=(sigma, 0, math.exp(mu))).statistic) if cv > 0 else 0.0
    return {"kind": "lognormal", "mean_s": mean, "cv": cv, "p50_s": float(np.median(d)),
            "p95_s": float(np.percentile(d, 95)), "samples": int(d.size), "ks_distance": ks,
            "spec": f"lognormal:{mean:.6g}:{cv:.6g}"}


def fit_link(durations_s: np.ndarray, payload_bytes: np.ndarray, *, group_sizes: np.ndarray | None = None,
             pairwise: np.ndarray | None = None) -> dict[str, Any]:
    r"""Least-squares latency and bandwidth from exchange durations and payloads.

    Parameters
    ----------
    durations_s, payload_bytes : array
        One entry per measured exchange (``S`` is the model bytes moved, not the wire bytes).
    group_sizes : array, optional
        Ranks in each exchange's allreduce group (``None`` or 2 entries mean pairwise exchanges).
    pairwise : bool array, optional
        Marks the pairwise exchanges explicitly; every other entry is then a ring allreduce over
        its ``group_sizes`` entry, a group of 2 included (:math:`2\alpha + S/\beta`).
    """
    t = np.asarray(durations_s, dtype=float)
    S = np.asarray(payload_bytes, dtype=float)
    if t.size != S.size:
        raise ConfigError(f"durations ({t.size}) and payloads ({S.size}) must have the same length")
    if t.size < MIN_RECORDS:
        raise ConfigError(f"too little data to fit a link: {t.size} exchanges (need >= {MIN_RECORDS})")
    if np.unique(S).size < 2:
        raise ConfigError("cannot separate latency from bandwidth with a single payload size; "
                          "measure exchanges of at least two sizes")
    if group_sizes is None:
        a_coef, b_coef = np.ones_like(S), S
    else:
        n = np.asarray(group_sizes, dtype=float)
        pair = n <= 2 if pairwise is None else np.asarray(pairwise, dtype=bool)
        a_coef = np.where(pair, 1.0, 2 * (n - 1))
        b_coef = np.where(pair, S, 2 * (n - 1) / n * S)
    X = np.column_stack([a_coef, b_coef])
    (alpha, inv_beta), *_ = np.linalg.lstsq(X, t, rcond=None)
    if inv_beta <= 0:
        raise ConfigError(f"fitted bandwidth is not positive (1/beta = {inv_beta:.3g} s/B): the durations do not "
                          "grow with payload size; measure larger payloads")
    pred = X @ np.array([alpha, inv_beta])
    resid = t - pred
    return {"latency_s": float(max(alpha, 0.0)), "bandwidth_bytes_per_s": float(1.0 / inv_beta),
            "samples": int(t.size), "rms_residual_s": float(np.sqrt(np.mean(resid ** 2))),
            "max_rel_residual": float(np.max(np.abs(resid) / np.maximum(t, 1e-12)))}


# ----- calibration from run directories -----------------------------------------------------------
_K_ALLREDUCE, _K_PAIR, _K_SERVER = 1, 2, 4


def _payload_of(run: Any) -> int | None:
    for d in (run.summary, run.meta):
        if d.get("payload_bytes"):
            return int(d["payload_bytes"])
    return None


def _workers_of(run: Any) -> int:
    n = run.meta.get("n_workers") or run.summary.get("workers")
    if n is None:
        raise ConfigError(f"{run.path}: cannot tell the number of workers (no n_workers in the trace metadata)")
    return int(n)


def _link_samples(run: Any) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """(durations, model payloads, group sizes, pairwise mask) of one run's usable exchange records.

    Allreduce records (kind 1, phase comm) include waiting for slower members: per (step, bytes)
    the minimum over ranks is kept (the last to arrive waits least). Pairwise records (kind 2,
    phase overlap) may include waiting for the peer's lock: per payload size only those at or
    below the :data:`PAIRWISE_QUANTILE` are kept.
    """
    tr = run.trace
    n_workers = _workers_of(run)
    S_model = _payload_of(run)
    d_out, s_out, n_out, p_out = [], [], [], []
    ar = tr[(tr["kind"] == _K_ALLREDUCE) & (tr["phase"] == PHASES["comm"]) & (tr["nbytes"] > 0)]
    if ar.size:
        keys = np.stack([ar["step"], ar["nbytes"]], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = np.asarray(inv).reshape(-1)
        dur = (ar["end_s"] - ar["start_s"]).astype(float)
        mins = np.full(len(uniq), np.inf)
        np.minimum.at(mins, inv, dur)
        wire = uniq[:, 1].astype(float)
        if S_model:  # wire = 2 (n-1)/n S  ->  n = 2 / (2 - wire/S)
            n = np.rint(2.0 / np.maximum(2.0 - wire / S_model, 1e-9)).clip(2, None)
            S = np.full(wire.shape, float(S_model))
        else:
            n = np.full(wire.shape, float(n_workers))
            S = wire * n / (2 * (n - 1))
        d_out.append(mins)
        s_out.append(S)
        n_out.append(n)
        p_out.append(np.zeros(len(uniq), dtype=bool))
    pw = tr[(tr["kind"] == _K_PAIR) & (tr["phase"] == PHASES["overlap"]) & (tr["nbytes"] > 0)]
    for size in np.unique(pw["nbytes"]):
        sel = pw[pw["nbytes"] == size]
        dur = (sel["end_s"] - sel["start_s"]).astype(float)
        keep = dur[dur <= np.quantile(dur, PAIRWISE_QUANTILE)]
        d_out.append(keep)
        s_out.append(np.full(keep.size, float(size)))
        n_out.append(np.full(keep.size, 2.0))
        p_out.append(np.ones(keep.size, dtype=bool))
    return d_out, s_out, n_out, p_out


def calibrate_runs(run_dirs: Any, *, warmup_steps: int = 2) -> dict[str, Any]:
    r"""Fit this machine's platform profile from runtime run directories.

    Returns ``compute`` (:func:`fit_compute_time` over every run's compute records), ``link``
    (:func:`fit_link` over the allreduce and pairwise records of every run, see
    :func:`_link_samples`), ``server`` (service overhead: the :data:`SERVER_QUANTILE` of the
    server-exchange durations minus :math:`\alpha + S/\beta`, ``None`` without server records),
    and what the runs were (``runs``, ``payload_bytes``, ``itemsize``, ``batch``,
    ``max_workers``). Too little data raises :class:`ConfigError` (from the fits).
    """
    from psgdlab.analysis.load import load_run

    runs = [load_run(p) for p in run_dirs]
    if not runs:
        raise ConfigError("calibration needs at least one run directory")
    for run in runs:
        if run.trace is None:
            raise ConfigError(f"{run.path} has no trace.npz to calibrate from")
    compute = fit_compute_time(np.concatenate([r.trace for r in runs]), warmup_steps=warmup_steps)
    parts = [_link_samples(r) for r in runs]
    cat = [np.concatenate([a for p in parts for a in p[i]]) if any(p[i] for p in parts) else np.array([])
           for i in range(4)]
    link = fit_link(cat[0], cat[1], group_sizes=cat[2], pairwise=cat[3].astype(bool))
    link["allreduce_samples"] = int(np.count_nonzero(~cat[3].astype(bool)))
    link["pairwise_samples"] = int(np.count_nonzero(cat[3].astype(bool)))
    link["payload_sizes_bytes"] = sorted({int(x) for x in cat[1]})
    server = None
    srv_d, srv_s = [], []
    for r in runs:
        tr = r.trace
        sel = tr[(tr["kind"] == _K_SERVER) & (tr["phase"] == PHASES["comm"]) & (tr["nbytes"] > 0)]
        srv_d.append((sel["end_s"] - sel["start_s"]).astype(float))
        srv_s.append(sel["nbytes"].astype(float))
    sd, ss = np.concatenate(srv_d), np.concatenate(srv_s)
    if sd.size >= MIN_RECORDS:
        wire = link["latency_s"] + ss / link["bandwidth_bytes_per_s"]
        excess = sd - wire
        server = {"service_overhead_s": float(max(np.quantile(excess, SERVER_QUANTILE), 0.0)),
                  "samples": int(sd.size), "median_excess_s": float(np.median(excess))}
    payloads = [p for p in (_payload_of(r) for r in runs) if p]
    itemsizes = [int(r.summary.get("itemsize") or r.meta.get("itemsize") or 0) for r in runs]
    batches = [int(r.summary.get("samples_per_step") or r.meta.get("samples_per_step") or 0) for r in runs]
    return {"compute": compute, "link": link, "server": server, "runs": [str(r.path) for r in runs],
            "payload_bytes": payloads, "itemsize": max(itemsizes) or None, "batch": max(batches) or None,
            "max_workers": max(_workers_of(r) for r in runs)}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, float):
        return repr(float(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def platform_toml(calibration: dict[str, Any], *, name: str = "calibrated", devices: int | None = None,
                  n_params: int | None = None, itemsize: int | None = None, batch: int | None = None,
                  workers: tuple[int, ...] | None = None) -> str:
    """The simulator configuration (``sim/presets`` TOML format) of a :func:`calibrate_runs` fit.

    ``devices`` hosts of ``devices`` devices (default: the largest worker count of
    the runs) so that any ``gpus_per_node`` placement fits; the fitted link is both ``pcie`` and
    ``nic``, staging ``direct``; the server is the fitted link plus the fitted service overhead.
    The workload is ``n_params`` items of ``itemsize`` bytes (default: the runs' payload) with the
    fitted compute distribution at ``batch``. The residuals are TOML comments (the loader
    rejects unknown tables).
    """
    comp, link, srv = calibration["compute"], calibration["link"], calibration["server"]
    devices = int(devices or calibration["max_workers"])
    itemsize = int(itemsize or calibration.get("itemsize") or 4)
    if n_params is None:
        payloads = calibration.get("payload_bytes") or []
        if not payloads:
            raise ConfigError("the runs do not record their payload (payload_bytes); give n_params")
        n_params = max(1, int(max(payloads)) // itemsize)
    batch = int(batch or calibration.get("batch") or 1)
    lat, bw = link["latency_s"], link["bandwidth_bytes_per_s"]
    lines = [
        f"# Platform profile fitted by `psgdlab calibrate` from {len(calibration['runs'])} run(s):",
        *[f"#   {r}" for r in calibration["runs"]],
        "# Residuals of the fit:",
        f"#   compute: lognormal mean {comp['mean_s']:.6g} s, cv {comp['cv']:.4g}, median {comp['p50_s']:.6g} s, "
        f"p95 {comp['p95_s']:.6g} s, {comp['samples']} records, Kolmogorov-Smirnov distance {comp['ks_distance']:.4g}",
        f"#   link: {link['samples']} exchanges ({link['allreduce_samples']} allreduce, {link['pairwise_samples']} "
        f"pairwise) of sizes {link['payload_sizes_bytes']} B, rms residual {link['rms_residual_s']:.4g} s, "
        f"max relative residual {link['max_rel_residual']:.4g}",
        ("#   server: " + (f"service overhead {srv['service_overhead_s']:.4g} s from {srv['samples']} requests "
                          f"(median excess over the link {srv['median_excess_s']:.4g} s)" if srv else
                          "no server exchanges measured; overhead 0")),
        "",
        "[platform]",
        f"name = {_toml_value(name)}",
        'description = "this machine, fitted from measured runs (loopback transport, emulated devices)"',
        f"hosts = {devices}",
        f"devices_per_host = {devices}",
        "sockets_per_host = 1",
        'device = "cpu-process"',
        'staging = "direct"',
        "",
    ]
    for table in ("pcie", "nic"):
        lines += [f"[platform.{table}]", f"latency_s = {lat!r}", f"bandwidth_bytes_per_s = {bw!r}", ""]
    lines += ["[platform.server]", f"latency_s = {lat!r}", f"bandwidth_bytes_per_s = {bw!r}",
              f"service_overhead_s = {float(srv['service_overhead_s']) if srv else 0.0!r}",
              "apply_on_host = false", "",
              "[workload]", f"name = {_toml_value(name + '-workload')}",
              'description = "the calibration runs\' model"',
              f"n_params = {int(n_params)}", f"itemsize = {itemsize}",
              f"compute = {_toml_value(comp['spec'])}",
              f"reference_batch = {batch}", f"batch_per_worker = {batch}", ""]
    if workers:
        lines += ["[defaults]", f"workers = {_toml_value(list(workers))}", ""]
    return "\n".join(lines)


def write_platform(path: Any, text: str) -> Any:
    """Write a platform TOML atomically (temporary name, then rename)."""
    from psgdlab.core.trace import atomic_write_text

    return atomic_write_text(path, text)
