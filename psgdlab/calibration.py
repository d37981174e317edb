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
rule with its figures (:func:`psgdlab.core.fitting.fit_parameters`: the larger of the figures'
noise and the fit's residual spread). ``psgdlab calibrate`` and ``psgdlab validate`` both write
their profiles through it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["RunRequest", "run_request", "run_residuals", "residual_cv", "with_residuals"]


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
    resolved ``train`` table, payload or trace (a probe's, an emulator's)."""
    from psgdlab.analysis.samples import payload_of, workers_of

    train = run.config.get("train")
    payload = payload_of(run)
    if not isinstance(train, dict) or not payload or run.trace is None:
        return None
    n = workers_of(run)
    hosts = int(train.get("hosts") or 1)
    gpus_per_node = int(train.get("gpus_per_node") or 1)
    keywords = {
        "steps": int(train["steps"]),
        "seed": int(train.get("seed") or 0),
        "variant": train.get("variant") or None,
        "period": train.get("period") or None,
        "gpus_per_node": gpus_per_node if gpus_per_node > 1 else None,
        "stragglers": train.get("straggler") or None,
        "workers_per_host": n // hosts,
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


def run_residuals(profile: Any, run_dirs: Sequence[str | Path]) -> dict[str, Any]:
    """Each of ``run_dirs`` that ``profile``'s platform can place (at most its hosts, at most its
    devices per host) predicted as it ran and compared: ``{"runs": [{"run",
    "predicted_step_time_s", "measured_step_time_s", "processes_per_core"}, ...], "residual_cv"}``
    (:func:`residual_cv`; ``None`` when no run could be predicted; ``processes_per_core``: its
    workers over the cores of the machine that recorded it, ``None`` where it did not say)."""
    from psgdlab.analysis.compare import cut_at_first_finish, window_summary
    from psgdlab.analysis.cores import cores_of
    from psgdlab.analysis.load import load_run
    from psgdlab.analysis.probe import is_probe_dir
    from psgdlab.sim.predict import predict_one

    def step_time_s(trace: Any, batch: int) -> float:
        return float(window_summary(cut_at_first_finish(trace), samples_per_step=batch)["step_time_s"])

    platform = profile.platform
    pairs: list[tuple[float, float]] = []
    rows: list[dict[str, Any]] = []
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
        pair = (step_time_s(pred.result.trace, req.batch), step_time_s(run.trace, req.batch))
        pairs.append(pair)
        cores = cores_of([run])
        rows.append(
            {
                "run": Path(d).name,
                "predicted_step_time_s": pair[0],
                "measured_step_time_s": pair[1],
                "processes_per_core": req.n_workers / cores if cores else None,
            }
        )
    return {"runs": rows, "residual_cv": residual_cv(pairs)}


def with_residuals(profile: Any, run_dirs: Sequence[str | Path]) -> tuple[Any, dict[str, Any]]:
    """``profile`` with its ``noise_cv`` at least its residual on ``run_dirs``
    (:func:`run_residuals`), a note saying so where it was raised, and the residuals. A profile
    without ``[uncertainty]`` is returned as it is (its parameters are taken as exact)."""
    residuals = run_residuals(profile, run_dirs)
    cv, u = residuals["residual_cv"], profile.uncertainty
    if cv is None or u is None:
        return profile, residuals
    loads = [r["processes_per_core"] for r in residuals["runs"] if r["processes_per_core"]]
    load = max([*loads, *([u.noise_processes_per_core] if u.noise_processes_per_core else [])], default=None)
    if cv <= u.noise_cv:  # the noise covers the residuals: of every run predicted, at its load
        covered = dataclasses.replace(u, noise_processes_per_core=load)
        return dataclasses.replace(profile, uncertainty=covered), residuals
    note = (
        f"  noise_cv: the calibration runs' rms log residual {cv:.3g} over {len(residuals['runs'])} runs "
        f"(run-to-run noise alone {u.noise_cv:.3g})"
        + (f", at up to {load:g} worker processes per core" if load else "")
    )
    raised = dataclasses.replace(u, noise_cv=round(cv, 6), noise_processes_per_core=load)
    return dataclasses.replace(profile, uncertainty=raised, notes=(*profile.notes, note)), residuals
