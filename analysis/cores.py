r"""Fitting the CPU work of communication from runs with more workers than cores.

The simulator's *host cores* model (``[platform.host_cpu]``, see :mod:`psgdlab.sim.platform`):
an allreduce over ``n`` workers of one host with ``c`` cores, which takes :math:`T(n, S)` on
the links when every worker has a core, takes

.. math::
    T(n, S) + \max(0, n/c - 1)\,W(n, S), \qquad
    W(n, S) = M(n)\,w_m + \frac{2(n-1)}{n} S\, w_b

when its ``n`` workers share the ``c`` cores, with :math:`w_m` the CPU work per message sent
(``work_per_message_s``), :math:`M(n)` the messages of the schedule (:math:`2(n-1)` for a ring,
:func:`psgdlab.core.platform.cost.allreduce_messages`) and :math:`w_b` per byte sent
(``work_per_byte_s``).
:func:`fit_host_cpu` measures them: in runs with more workers than cores, the excess of each
allreduce's span over the link model :math:`T` (fitted from runs with at most ``c`` workers) is
linear in :math:`(w_m, w_b)`; per run and payload size the median excess (the machine is shared:
medians keep another process's burst out) gives one equation, solved by non-negative least
squares. At least two payload sizes are needed, as for the link.

Examples
--------
>>> import numpy as np
>>> n, S = np.array([4.0, 4.0]), np.array([8e4, 8e5])
>>> work = 6 * 2e-4 + 1.5 * S * 3e-9          # w_m = 0.2 ms, w_b = 3 ns/B, c = 2
>>> fit = solve_host_cpu(n, S, (n / 2 - 1) * work, cores=2)
>>> round(fit["work_per_message_s"] * 1e3, 3), round(fit["work_per_byte_s"] * 1e9, 3)
(0.2, 3.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import nnls

from psgdlab.analysis.fits import nonnegative_log_spread
from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.cost import allreduce_s, cpu_stretch_terms

__all__ = ["solve_host_cpu", "fit_host_cpu", "cores_of", "devices_of", "span_excess"]


def cores_of(runs: list[Any]) -> int | None:
    """The CPU count the runs recorded (``env.json``'s ``cpu_count``); ``None`` if none did.
    Runs from machines with different counts are refused."""
    counts = {int(r.env["cpu_count"]) for r in runs if r.env.get("cpu_count")}
    if len(counts) > 1:
        raise ConfigError(
            f"the runs come from machines with different core counts {sorted(counts)}; calibrate one machine at a time"
        )
    return counts.pop() if counts else None


def devices_of(envs: list[dict[str, Any]]) -> int | None:
    """The worker slots of the machine that recorded ``envs`` (the runs' ``env.json``): its GPUs
    (``gpus``) where the runs ran on NCCL, one worker to a GPU, else its CPU cores
    (``cpu_count``); ``None`` where they recorded neither. Machines that differ are refused, as in
    :func:`cores_of`.

    >>> devices_of([{"backend": "gloo", "cpu_count": 2, "gpus": 0}])
    2
    >>> devices_of([{"backend": "nccl", "cpu_count": 64, "gpus": 8}])
    8
    """
    counts = {int(e["gpus"] if e.get("backend") == "nccl" else e.get("cpu_count") or 0) for e in envs}
    counts.discard(0)
    if len(counts) > 1:
        raise ConfigError(
            f"the runs come from machines with different devices {sorted(counts)}; calibrate one machine at a time"
        )
    return counts.pop() if counts else None


def span_excess(
    run: Any,
    spans: Callable[[Any], tuple],
    *,
    n_workers: int,
    payload_bytes: float,
    link: dict[str, Any],
    warmup_steps: int,
    algorithm: str = "ring",
) -> tuple[float, int] | None:
    r"""How much the median allreduce over all ``n_workers`` of ``run`` (after ``warmup_steps``)
    outlasts the model of ``link``, :math:`R(n)\alpha + 2(n-1)/n \cdot S/\beta` with :math:`R` the
    rounds of ``algorithm`` (:func:`psgdlab.core.platform.cost.allreduce_s`; at least 0), and the
    allreduces behind it; ``None`` without such allreduces. ``spans`` as in :func:`fit_host_cpu`."""
    step, _, n, span = spans(run)
    sel = (step >= warmup_steps) & (n == n_workers)
    records = int(np.count_nonzero(sel))
    if records == 0:
        return None
    model = allreduce_s(n_workers, payload_bytes, link["bandwidth_bytes_per_s"], link["latency_s"], algorithm)
    return max(float(np.median(span[sel])) - model, 0.0), records


def solve_host_cpu(
    n: np.ndarray, payload_bytes: np.ndarray, excess_s: np.ndarray, *, cores: int, algorithm: str = "ring"
) -> dict[str, Any]:
    r"""Non-negative least squares of ``excess = max(0, n/c - 1) W(n, S)`` for :math:`(w_m, w_b)`
    (the coefficients are :func:`psgdlab.core.platform.cost.cpu_stretch_terms`, with the messages of
    ``algorithm``'s schedule), with their spread from the points' scatter (``work_log_sd``,
    ``work_log_correlation``: :func:`psgdlab.analysis.fits.nonnegative_log_spread`)."""
    n, S, y = (np.asarray(x, dtype=float) for x in (n, payload_bytes, excess_s))
    over = n / cores - 1.0
    if np.any(over <= 0):
        raise ConfigError(
            f"CPU work is measured with more workers than cores ({cores}); got groups of "
            f"{sorted({int(x) for x in n[over <= 0]})}"
        )
    if np.unique(S).size < 2:
        raise ConfigError(
            "cannot separate the CPU work per message from the work per byte with a single payload "
            "size; run the oversubscribed calibration at two sizes"
        )
    X = np.column_stack(cpu_stretch_terms(n, S, cores, algorithm))
    scale = X.max(axis=0)
    coef, _ = nnls(X / scale, y)
    coef = coef / scale
    resid = y - X @ coef
    spread = nonnegative_log_spread(X, y, coef)
    return {
        "cores_per_host": int(cores),
        "work_per_message_s": float(coef[0]),
        "work_per_byte_s": float(coef[1]),
        "work_log_sd": spread["log_sd"],
        "work_log_correlation": spread["log_correlation"],
        "points": int(y.size),
        "rms_residual_s": float(np.sqrt(np.mean(resid**2))),
        "max_rel_residual": float(np.max(np.abs(resid) / np.maximum(np.abs(y), 1e-6))),
    }


def fit_host_cpu(
    runs: list[Any],
    *,
    cores: int,
    link: dict[str, Any],
    spans: Callable[[Any], tuple],
    payload_of: Callable[[Any], int | None],
    workers_of: Callable[[Any], int],
    warmup_steps: int = 2,
    algorithm: str = "ring",
) -> dict[str, Any]:
    """Fit :math:`(w_m, w_b)` from the allreduce spans of ``runs`` (each with more workers than
    ``cores``, all on one host) over the fitted ``link`` (module docstring).

    ``spans(run)`` returns ``(step, wire bytes, group size, span)`` per allreduce
    (:func:`psgdlab.analysis.samples.allreduce_spans`); only whole-run groups are used.
    """
    n_pts, s_pts, y_pts, records = [], [], [], 0
    for run in runs:
        n_w, S = workers_of(run), payload_of(run)
        if not S:
            raise ConfigError(f"{run.path}: the run does not record its payload (payload_bytes)")
        got = span_excess(
            run, spans, n_workers=n_w, payload_bytes=S, link=link, warmup_steps=warmup_steps, algorithm=algorithm
        )
        if got is None:
            continue
        records += got[1]
        n_pts.append(float(n_w))
        s_pts.append(float(S))
        y_pts.append(got[0])
    if records < 8:
        raise ConfigError(
            f"too little data to fit the CPU work of communication: {records} allreduces over all "
            "workers in the runs with more workers than cores (need >= 8)"
        )
    fit = solve_host_cpu(np.array(n_pts), np.array(s_pts), np.array(y_pts), cores=cores, algorithm=algorithm)
    fit["records"] = records
    fit["median_excess_s"] = [round(y, 6) for y in y_pts]
    return fit
