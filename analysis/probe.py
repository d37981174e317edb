r"""Fitting the link laws from a probe's run directory (:mod:`psgdlab.runtime.launcher.probe` writes it).

A probe times pairwise exchanges and allreduces over a sweep of message sizes and group sizes,
each operation on each participating rank with its wall time and the CPU time its process spent
in it. :func:`fit_probe` reads ``probe.npz`` and ``env.json`` and returns:

- ``points``: one row per (kind, group, size) -- the median over the timed repetitions of the
  slowest member's wall time (the last to finish decides when the group goes on), its standard
  error (:func:`psgdlab.analysis.samples.quantile_se`), the median CPU time of a member, and
  the algorithm bandwidth :math:`S/t` and bus bandwidth :math:`2(n-1)/n \cdot S/t` of
  allreduces (pairwise: :math:`S/t`), as nccl-tests reports them;
- ``link`` and ``collective``: :func:`psgdlab.analysis.fits.fit_links` over the points of
  groups that have a core per member (larger groups measure the cores' contention, not the
  link), with the prior :data:`psgdlab.core.stats.priors.LOOPBACK_BANDWIDTH`;
- ``allreduce_algorithm``: the transport's schedule as it reported it; with two or more group
  sizes that have a core per member, the schedule whose latency rounds fit the allreduce points
  best is reported beside it (``schedule_fit``);
- ``host_cpu``: the CPU work of communication, :math:`W = M\,w_m + B\,w_b`
  (:func:`psgdlab.core.platform.cost.cpu_work_s`; ``M`` messages and ``B`` bytes one member sends:
  :func:`~psgdlab.core.platform.cost.allreduce_messages`, :func:`~psgdlab.core.platform.cost.allreduce_bytes`; a
  pairwise exchange one message of ``S``), non-negative least squares over the median CPU time
  of each point, with the machine's cores (``cpu_count`` of ``env.json``). Measured directly,
  not inferred from oversubscribed runs.

A probe on emulated hosts (``psgdlab calibrate --probe --hosts H --nic-bandwidth RATE``, one rank
per host) fits the link between hosts instead, with the shaped rate as the bandwidth's prior
(:func:`nic_prior`); ``hosts`` and ``rate_bytes_per_s`` say so, and
:func:`psgdlab.analysis.calibrate.calibrate_runs` makes it the platform's NIC.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.analysis.fits import MIN_RECORDS, fit_link, fit_links, nonnegative_log_spread
from psgdlab.analysis.samples import quantile_se
from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.cost import ALLREDUCE_ALGORITHMS, allreduce_bytes, allreduce_messages
from psgdlab.core.records.rundir import require_complete
from psgdlab.core.stats.priors import LOOPBACK_BANDWIDTH, LOOPBACK_LATENCY, RUN_NOISE_CV, Prior

__all__ = ["is_probe_dir", "read_probe", "fit_probe", "nic_prior"]

_PAIRWISE, _ALLREDUCE = 0, 1  # kind codes of psgdlab.runtime.launcher.probe.KINDS


def is_probe_dir(path: Any) -> bool:
    """Whether ``path`` is a probe's run directory (it holds ``probe.npz``)."""
    return (Path(path) / "probe.npz").is_file()


def read_probe(path: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """The probe's records (timed repetitions only) and its ``env.json``."""
    p = Path(path)
    if not is_probe_dir(p):
        raise ConfigError(f"{p} is not a probe directory (no probe.npz)")
    require_complete(p)
    with np.load(p / "probe.npz") as data:
        records = data["records"]
    env = json.loads((p / "env.json").read_text()) if (p / "env.json").is_file() else {}
    return records[~records["warmup"]], env


def fit_probe(path: Any, *, cores: int | None = None) -> dict[str, Any]:
    """The points, link laws and CPU work of the probe in ``path`` (module docstring); ``cores``
    overrides the ``cpu_count`` the probe recorded."""
    records, env = read_probe(path)
    hosts = int(env.get("hosts") or 1)
    rate = env.get("nic_bandwidth_bytes_per_s")
    if hosts > 1 and int(env.get("world_size") or hosts) != hosts:
        raise ConfigError(
            f"the probe in {path} ran {env.get('world_size')} ranks on {hosts} emulated hosts: the link between "
            "hosts is fitted from a probe with one rank per host (--groups H with --hosts H)"
        )
    cores = int(cores or env.get("cpu_count") or 0) or None
    schedule = str(env.get("allreduce_algorithm") or "ring")
    if schedule not in ALLREDUCE_ALGORITHMS:
        raise ConfigError(f"allreduce_algorithm {schedule!r} of {path} is not one of {', '.join(ALLREDUCE_ALGORITHMS)}")
    points = _points(records)
    if not points:
        raise ConfigError(f"the probe in {path} has no timed operations")
    cols = {k: np.array([p[k] for p in points]) for k in points[0]}
    free = cols["group"] <= (cores or np.inf)
    if not free.any():
        raise ConfigError(f"every group of the probe in {path} has more members than the {cores} cores")
    pair = cols["kind"] == _PAIRWISE
    sd = np.sqrt(cols["se_s"] ** 2 + (RUN_NOISE_CV * cols["wall_s"]) ** 2)
    sel = {k: v[free] for k, v in cols.items()}
    link, collective = fit_links(
        sel["wall_s"],
        sel["size_bytes"].astype(float),
        sel["group"].astype(float),
        pair[free],
        sel["records"].astype(int),
        sd[free],
        algorithm=schedule,
        bandwidth_prior=nic_prior(rate) if hosts > 1 else LOOPBACK_BANDWIDTH,
        latency_prior=LOOPBACK_LATENCY,
        between_hosts=hosts > 1,
    )
    out = {
        "points": points,
        "link": link,
        "collective": collective,
        "allreduce_algorithm": schedule,
        "schedule_fit": _schedule_fit(cols, free & ~pair, sd),
        "host_cpu": _fit_cpu(cols, free, schedule, cores),
        "cores": cores,
        "hosts": hosts,
        "rate_bytes_per_s": float(rate) if rate else None,
        "path": str(path),
    }
    return out


def nic_prior(rate: float | None) -> Prior:
    """The prior of the bandwidth between emulated hosts: their shaped rate (x/ 4), or
    :data:`~psgdlab.core.stats.priors.LOOPBACK_BANDWIDTH` unshaped."""
    if not rate:
        return LOOPBACK_BANDWIDTH
    return Prior(value=float(rate), log_sd=float(np.log(4.0)), source="the emulated NIC's shaped rate; x/ 4")


def _points(records: np.ndarray) -> list[dict[str, Any]]:
    """One row per (kind, group, size): the slowest member's wall time per repetition, its
    median and standard error, a member's median CPU time, and the bandwidths."""
    out = []
    keys = np.unique(records[["kind", "group", "size_bytes"]])
    for kind, group, size in keys.tolist():
        sel = records[(records["kind"] == kind) & (records["group"] == group) & (records["size_bytes"] == size)]
        slowest = np.array([sel["wall_s"][sel["rep"] == r].max() for r in np.unique(sel["rep"])])
        t = float(np.median(slowest))
        moved = float(allreduce_bytes(group, size)) if kind == _ALLREDUCE else float(size)
        out.append(
            {
                "kind": int(kind),
                "group": int(group),
                "size_bytes": int(size),
                "wall_s": t,
                "se_s": quantile_se(slowest, 0.5),
                "cpu_s": float(np.median(sel["cpu_s"])),
                "records": int(slowest.size),
                "algbw_bytes_per_s": size / t if t > 0 else None,
                "busbw_bytes_per_s": moved / t if t > 0 else None,
            }
        )
    return out


def _schedule_fit(cols: dict[str, np.ndarray], sel: np.ndarray, sd: np.ndarray) -> dict[str, float] | None:
    """Reduced chi-square of the allreduce points under each schedule's latency rounds, with two
    or more group sizes (one size cannot tell the schedules apart: they agree for a pair)."""
    if np.unique(cols["group"][sel]).size < 2 or int(cols["records"][sel].sum()) < MIN_RECORDS:
        return None
    out = {}
    for schedule in ALLREDUCE_ALGORITHMS:
        fit = fit_link(
            cols["wall_s"][sel],
            cols["size_bytes"][sel].astype(float),
            group_sizes=cols["group"][sel].astype(float),
            pairwise=np.zeros(int(sel.sum()), dtype=bool),
            records=int(cols["records"][sel].sum()),
            algorithm=schedule,
            sd_s=sd[sel],
            bandwidth_prior=LOOPBACK_BANDWIDTH,
        )
        out[schedule] = float(fit["reduced_chi2"]) if fit["reduced_chi2"] is not None else float("nan")
    return out


def _fit_cpu(cols: dict[str, np.ndarray], sel: np.ndarray, schedule: str, cores: int | None) -> dict[str, Any] | None:
    """``cores_per_host``, ``work_per_message_s``, ``work_per_byte_s`` (non-negative least
    squares of the members' median CPU time per operation, relative errors) and their spread
    (``work_log_sd``, ``work_log_correlation``: :func:`psgdlab.analysis.fits.nonnegative_log_spread`);
    ``None`` without a core count."""
    from scipy.optimize import nnls

    if cores is None:
        return None
    n = cols["group"][sel].astype(int)
    S = cols["size_bytes"][sel].astype(float)
    pair = cols["kind"][sel] == _PAIRWISE
    messages = np.where(pair, 1.0, [allreduce_messages(int(k), schedule) for k in n])
    sent = np.where(pair, S, allreduce_bytes(n, S))
    cpu = cols["cpu_s"][sel]
    X = np.column_stack([messages, sent])
    scale = np.maximum(cpu, 1e-9)  # relative errors: small and large messages weigh alike
    (w_m, w_b), _ = nnls(X / scale[:, None], cpu / scale)
    resid = cpu - X @ np.array([w_m, w_b])
    spread = nonnegative_log_spread(X / scale[:, None], cpu / scale, np.array([w_m, w_b]))
    return {
        "cores_per_host": int(cores),
        "work_per_message_s": float(w_m),
        "work_per_byte_s": float(w_b),
        "work_log_sd": spread["log_sd"],
        "work_log_correlation": spread["log_correlation"],
        "records": int(cols["records"][sel].sum()),
        "median_excess_s": float(np.median(cpu)),
        "rms_residual_s": float(np.sqrt(np.mean(resid**2))),
        "source": "probe: CPU time of the members",
    }
