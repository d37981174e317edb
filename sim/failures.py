r"""Failure predictions: what worker deaths cost a run, in work lost and in time to train.

A prediction's row (:func:`psgdlab.sim.predict.predict_one`) gives the steady throughput
:math:`X_0` (samples/s) of the configuration and the samples :math:`N` its training needs. The
failures of a :class:`FailureRequest` (``--fail RANK@SECONDS``, or random ones at
``--failure-rate`` per worker-hour) are priced on top of it, by policy
(:mod:`psgdlab.core.platform.failure`):

``continue`` (gossip algorithms)
    Each failure is simulated in a *failure window* (:func:`failure_window`): the configuration
    with the earlier failures' ranks absent from the start (their schedule rebuilt over the
    survivors), the new failure after a third of the window, detection
    ``platform.failure_detection_s`` later, and as many steps after it again as the prediction's
    window (a longer detection time is simulated as ``window`` steps, and the rest of it priced
    at the survivors' throughput over the second half of the simulated wait,
    :math:`\sigma \mathrel{+}= (D - D_\text{sim})(1 - X_\text{wait}/X_1)`: the wait is
    steady once the survivors that need the dead worker have stopped). The window gives the
    survivors' steady throughput :math:`X_1` (applied samples per
    second from a settling time :math:`t_a` after the detection to the end of the window), the
    *stall*

    .. math:: \sigma = (t_a - t_f) - K(t_f, t_a] / X_1

    (how long the survivors would have needed at :math:`X_1` for what they did between the death
    at :math:`t_f` and :math:`t_a` less than that time: the detection wait and the ramp to the new
    schedule, in seconds of the new throughput) and the dead worker's lost steps (its step in
    flight, and its applied steps that no exchange carried to a survivor before it died:
    :func:`psgdlab.sim.engine.simulate`). The run's timeline is composed from them: samples
    accrue at :math:`X_0` until the failure time, the unshared samples are taken off, then after
    the stall at :math:`X_1`, and so on for each failure; the time to train is when :math:`N`
    samples are done.
``stop``
    The run ends ``failure_detection_s`` after the first failure: no time to train; the samples
    kept are those of the last complete checkpoint (``--checkpoint-every`` steps apart; none
    when 0), the rest are lost.
``restart``
    Each failure costs the detection, ``platform.restart_s`` (relaunch and rendezvous) and the
    reload of a checkpoint (``payload_bytes / checkpoint_bytes_per_s``), and the run goes on
    from its last complete checkpoint with the same workers, at the same throughput: the steps
    since that checkpoint are done again. A failure during a restart's pause is absorbed by it.

With ``--checkpoint-every K`` every K steps all workers pause to write their model
(``payload_bytes / checkpoint_bytes_per_s``): the step time of the timeline is
:math:`t_\text{step} + t_\text{ckpt}/K`. Random failures are drawn ``draws`` times
(:func:`psgdlab.core.platform.failure.draw_failures`, seeded by ``--seed``), each draw composed as above,
and summarised by the mean, the 10th and 90th percentiles of the time to train of the draws that
finish and the fraction that do (a draw not done by 64 times the failure-free time to train does
not finish: under ``restart`` failures can come faster than the run gets back to where it was).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psgdlab.core.algorithms import Algorithm
from psgdlab.core.errors import require
from psgdlab.core.platform.failure import (
    ON_FAILURE,
    Failure,
    check_failures,
    check_on_failure,
    default_on_failure,
    draw_failures,
)
from psgdlab.core.platform.profile import Profile
from psgdlab.sim.engine import FailureSpec, simulate

__all__ = ["FailureRequest", "Timeline", "failure_window", "predict_failures", "DEFAULT_DRAWS"]

DEFAULT_DRAWS = 20
#: a draw of random failures that has not finished by this many times the first horizon (4 times
#: the failure-free time to train) does not finish (restarts that never reach the end)
MAX_HORIZON = 16
#: the failure happens after this fraction of the prediction's window
LEAD_FRACTION = 1 / 3
#: the survivors' throughput is measured after this fraction of the time after the detection
SETTLE_FRACTION = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRequest:
    """What a prediction is asked about failures (the flags ``--fail``, ``--failure-rate``,
    ``--on-failure``, ``--checkpoint-every``); ``policy`` ``None``: each algorithm's default."""

    failures: tuple[Failure, ...] = ()
    rate_per_worker_hour: float | None = None
    policy: str | None = None
    checkpoint_every: int = 0
    draws: int = DEFAULT_DRAWS

    def __post_init__(self) -> None:
        require(
            self.policy is None or self.policy in ON_FAILURE,
            "on-failure",
            self.policy,
            f"must be one of {', '.join(ON_FAILURE)}",
        )
        require(
            isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 0,
            "checkpoint-every",
            self.checkpoint_every,
            "must be an integer >= 0",
        )
        require(isinstance(self.draws, int) and self.draws >= 1, "draws", self.draws, "must be an integer >= 1")
        if self.rate_per_worker_hour is not None:
            draw_failures(self.rate_per_worker_hour, 1, horizon_s=0.0, seed=0)  # validates the rate

    @property
    def is_empty(self) -> bool:
        return not self.failures and not self.rate_per_worker_hour

    def check(self, algorithm: Algorithm) -> str:
        """The policy for ``algorithm`` (refused where it does not apply) with the explicit
        failures checked against its workers."""
        if self.policy is None:
            policy = default_on_failure(algorithm.name)
        else:
            policy = check_on_failure(algorithm.name, self.policy)
        check_failures(self.failures, algorithm.n_workers, policy=policy)
        return policy


@dataclass(frozen=True, slots=True)
class _Effect:
    """What one failure does to a configuration, measured in a failure window."""

    rate_after: float
    stall_s: float
    in_flight_steps: int
    unshared_steps: int
    survivors: tuple[int, ...]
    measured_s: float  # the time after the detection the throughput after is measured over


def failure_window(
    algorithm: Algorithm,
    config: Profile,
    *,
    dead: tuple[int, ...],
    rank: int,
    window: int,
    step_time_s: float,
    seed: int,
    **simulate_kwargs: Any,
) -> _Effect:
    """Simulate ``rank`` dying in ``algorithm``'s configuration without ``dead`` (module
    docstring) and measure its effect. ``step_time_s`` is the configuration's step time before
    the failure (it sizes the window so that the failure, the detection and ``window`` steps
    after it fit). A detection time longer than ``window`` steps is simulated as ``window``
    steps and its remainder priced at the survivors' throughput in the simulated part of it
    (module docstring)."""
    D_full = config.platform.failure_detection_s
    D = min(D_full, window * step_time_s)
    lead = max(1, int(window * LEAD_FRACTION))
    t_fail = lead * step_time_s
    steps = lead + math.ceil(D / step_time_s) + window
    spec = FailureSpec(failures=(Failure(rank, t_fail),), dead=dead, policy="continue", detection_s=D)
    res = simulate(
        algorithm,
        config.platform,
        config.workload,
        steps=steps,
        seed=seed,
        record=False,
        failures=spec,
        **simulate_kwargs,
    )
    f = res.extras["failures"]
    t_end = float(res.meta["window_end_s"])
    t_det = t_fail + D
    t_a = t_det + SETTLE_FRACTION * (t_end - t_det)
    b = config.workload.batch_per_worker
    alive = tuple(f["survivors"])
    times = np.concatenate([f["applied_at_s"][r] for r in alive])
    after = int(np.count_nonzero((times > t_a) & (times <= t_end))) * b
    require(after > 0 and t_end > t_a, "failure window", (t_a, t_end), "has no steps after the detection")
    rate_after = after / (t_end - t_a)
    during = int(np.count_nonzero((times > t_fail) & (times <= t_a))) * b
    stall_s = max(0.0, (t_a - t_fail) - during / rate_after)
    if D_full > D:  # the rest of the wait at the throughput of its simulated second half
        t_h = t_fail + 0.5 * D
        waiting = int(np.count_nonzero((times > t_h) & (times <= t_det))) * b / (t_det - t_h)
        stall_s += (D_full - D) * max(0.0, 1.0 - waiting / rate_after)
    return _Effect(
        rate_after=rate_after,
        stall_s=stall_s,
        in_flight_steps=int(f["steps_in_flight"][rank]),
        unshared_steps=int(f["steps_lost"][rank] - f["steps_in_flight"][rank]),
        survivors=alive,
        measured_s=t_end - t_a,
    )


@dataclass(slots=True)
class Timeline:
    """One run's course under failures (what :func:`predict_failures` reports per draw)."""

    time_to_train_s: float | None
    changes: list[dict[str, Any]] = field(default_factory=list)
    steps_lost: int = 0
    samples_lost: float = 0.0
    stopped_at_s: float | None = None
    samples_done: float = 0.0
    rate_after: float = 0.0
    survivors: tuple[int, ...] = ()


@dataclass(slots=True)
class _Run:
    """The facts of a configuration a timeline is composed from."""

    n: int
    batch: int
    rate: float  # samples/s before any failure (no checkpoint pauses)
    samples_needed: float
    step_time_s: float  # with the checkpoint pauses spread over the steps
    detection_s: float
    restart_s: float
    reload_s: float
    checkpoint_every: int


def _continue(run: _Run, failures: Sequence[Failure], effect: Callable[[tuple[int, ...], int], _Effect]) -> Timeline:
    t, done, rate = 0.0, 0.0, run.rate
    dead: tuple[int, ...] = ()
    out = Timeline(time_to_train_s=None, rate_after=rate, survivors=tuple(range(run.n)))
    for f in failures:
        start = max(t, f.time_s)
        if done + rate * (start - t) >= run.samples_needed:
            break
        done += rate * (start - t)
        e = effect(dead, f.rank)
        lost = (e.in_flight_steps + e.unshared_steps) * run.batch
        done -= e.unshared_steps * run.batch
        out.changes.append(
            {
                "failed_at_s": f.time_s,
                "time_s": f.time_s + run.detection_s,
                "step": int(done / (len(out.survivors) * run.batch)),
                "removed": [f.rank],
                "detection_s": run.detection_s,
                "stall_s": e.stall_s,
                "steps_lost": e.in_flight_steps + e.unshared_steps,  # the dead worker's:
                "steps_in_flight": e.in_flight_steps,  # its step begun, never applied
                "steps_unshared": e.unshared_steps,  # applied, in no survivor's model
                "samples_after_per_s": e.rate_after,
            }
        )
        out.steps_lost += e.in_flight_steps + e.unshared_steps
        out.samples_lost += lost
        t, rate, dead = start + e.stall_s, e.rate_after, (*dead, f.rank)
        out.survivors, out.rate_after = e.survivors, rate
    out.time_to_train_s = t + max(0.0, run.samples_needed - done) / rate
    out.samples_done = run.samples_needed
    return out


def _steps_at(run: _Run, t: float) -> float:
    return t / run.step_time_s


def _stop(run: _Run, failures: Sequence[Failure]) -> Timeline:
    total_s = run.samples_needed / (run.n * run.batch) * run.step_time_s
    if not failures or failures[0].time_s >= total_s:
        return Timeline(time_to_train_s=total_s, rate_after=run.rate, survivors=tuple(range(run.n)))
    f = failures[0]
    reached = _steps_at(run, f.time_s)
    k = run.checkpoint_every
    kept = (int(reached) // k) * k if k > 0 else 0
    lost = math.ceil(reached) - kept  # per worker, the step in flight included
    return Timeline(
        time_to_train_s=None,
        changes=[{**_change(f, run, int(reached)), "steps_lost": lost}],
        steps_lost=lost * run.n,
        samples_lost=lost * run.n * run.batch,
        stopped_at_s=f.time_s + run.detection_s,
        samples_done=kept * run.n * run.batch,
        rate_after=0.0,
        survivors=tuple(r for r in range(run.n) if r != f.rank),
    )


def _restart(run: _Run, failures: Sequence[Failure]) -> Timeline:
    steps_needed = run.samples_needed / (run.n * run.batch)
    k = run.checkpoint_every
    t, p, ckpt = 0.0, 0.0, 0
    out = Timeline(time_to_train_s=None, rate_after=run.rate, survivors=tuple(range(run.n)))
    for f in failures:
        if f.time_s < t:
            continue  # during a restart's pause: absorbed by it
        reached = p + _steps_at(run, f.time_s - t)
        if reached >= steps_needed:
            break
        ckpt = max(ckpt, (int(reached) // k) * k) if k > 0 else ckpt
        lost = math.ceil(reached) - ckpt
        out.steps_lost += lost * run.n
        out.samples_lost += lost * run.n * run.batch
        t = f.time_s + run.detection_s + run.restart_s + run.reload_s
        out.changes.append(
            {
                **_change(f, run, int(reached)),
                "resumed_from_step": ckpt,
                "steps_lost": lost,  # per worker, as the runtime's restart record counts them
                "resumed_at_s": t,
                "time_to_first_step_s": t - f.time_s + run.step_time_s,
            }
        )
        p = float(ckpt)
    out.time_to_train_s = t + (steps_needed - p) * run.step_time_s
    out.samples_done = run.samples_needed
    return out


def _change(f: Failure, run: _Run, step: int) -> dict[str, Any]:
    return {
        "failed_at_s": f.time_s,
        "time_s": f.time_s + run.detection_s,
        "step": step,
        "removed": [f.rank],
        "detection_s": run.detection_s,
    }


def predict_failures(
    algorithm: Algorithm,
    config: Profile,
    row: dict[str, Any],
    request: FailureRequest,
    *,
    seed: int,
    **simulate_kwargs: Any,
) -> dict[str, Any]:
    """The failure keys of a prediction's ``row`` (module docstring): ``policy``,
    ``membership_changes``, ``survivors``, ``steps_lost``, ``samples_lost``,
    ``throughput_before_samples_per_s``, ``throughput_after_samples_per_s``,
    ``throughput_after_ratio`` (after over :math:`k/n` of before, ``k`` survivors of ``n``),
    ``time_to_train_s`` (``None`` when the run stops), ``time_to_train_without_failures_s``,
    ``stopped_at_s``; with a failure rate, ``random`` summarises the draws."""
    policy = request.check(algorithm)
    p, w = config.platform, config.workload
    n, b = algorithm.n_workers, w.batch_per_worker
    ckpt_s = w.payload_bytes / p.checkpoint_bytes_per_s
    k = request.checkpoint_every
    run = _Run(
        n=n,
        batch=b,
        rate=float(row["samples_per_s"]),
        samples_needed=float(row["steps_to_train"] * n * b),
        step_time_s=float(row["step_time_s"]) + (ckpt_s / k if k > 0 else 0.0),
        detection_s=p.failure_detection_s,
        restart_s=p.restart_s,
        reload_s=ckpt_s,
        checkpoint_every=k,
    )
    window = int(row["extrapolation"]["window_steps_per_worker"])
    effects: dict[tuple[tuple[int, ...], int], _Effect] = {}

    def effect(dead: tuple[int, ...], rank: int) -> _Effect:
        key = (tuple(sorted(dead)), rank)
        if key not in effects:
            alive = n - len(dead)
            rate = run.rate if not dead else effects[(tuple(sorted(dead[:-1])), dead[-1])].rate_after
            effects[key] = failure_window(
                algorithm,
                config,
                dead=key[0],
                rank=rank,
                window=window,
                step_time_s=alive * b / rate,
                seed=seed,
                **simulate_kwargs,
            )
        return effects[key]

    def course(failures: Sequence[Failure]) -> Timeline:
        if policy == "continue":
            return _continue(run, failures, effect)
        return _stop(run, failures) if policy == "stop" else _restart(run, failures)

    base = _restart(run, ())
    out: dict[str, Any] = {
        "policy": policy,
        "detection_s": run.detection_s,
        "restart_s": run.restart_s if policy == "restart" else None,
        "checkpoint_every": k,
        "checkpoint_s": ckpt_s,
        "time_to_train_without_failures_s": base.time_to_train_s,
    }
    if request.failures:
        out.update(_timeline_keys(course(check_failures(request.failures, n, policy=policy)), run))
    if request.rate_per_worker_hour:
        out["random"] = _random(
            run, request, course, restart=policy == "restart", horizon_s=4.0 * (base.time_to_train_s or 0.0), seed=seed
        )
    return out


def _timeline_keys(tl: Timeline, run: _Run) -> dict[str, Any]:
    k = len(tl.survivors)
    ratio = tl.rate_after / (k / run.n * run.rate) if tl.stopped_at_s is None else None
    return {
        "membership_changes": tl.changes,
        "survivors": list(tl.survivors),
        "steps_lost": tl.steps_lost,
        "samples_lost": tl.samples_lost,
        "throughput_before_samples_per_s": run.rate,
        "throughput_after_samples_per_s": tl.rate_after if tl.stopped_at_s is None else None,
        "throughput_after_ratio": ratio,
        "time_to_train_s": tl.time_to_train_s,
        "stopped_at_s": tl.stopped_at_s,
        "samples_kept_at_stop": tl.samples_done if tl.stopped_at_s is not None else None,
    }


def _random(
    run: _Run,
    request: FailureRequest,
    course: Callable[[Sequence[Failure]], Timeline],
    *,
    restart: bool,
    horizon_s: float,
    seed: int,
) -> dict[str, Any]:
    """Compose ``request.draws`` seeded draws of random failures and summarise them."""
    rate = float(request.rate_per_worker_hour or 0.0)
    times: list[float] = []
    failures_per_draw: list[int] = []
    stopped = 0
    for d in range(request.draws):
        horizon = horizon_s
        while True:
            drawn = draw_failures(rate, run.n, horizon_s=horizon, seed=seed, draw=d, restart=restart)
            if not restart:
                drawn = _keep_one_alive(drawn, run.n)
            tl = course(drawn)
            end = tl.time_to_train_s if tl.time_to_train_s is not None else tl.stopped_at_s
            if end is None or end <= horizon or horizon >= MAX_HORIZON * horizon_s:
                break
            horizon *= 2
        failures_per_draw.append(len(tl.changes))
        if tl.time_to_train_s is None or tl.time_to_train_s > horizon:
            stopped += 1  # stopped, or past the horizon: failures come faster than the run recovers
        else:
            times.append(tl.time_to_train_s)
    arr = np.asarray(times)
    return {
        "per_worker_hour": rate,
        "draws": request.draws,
        "failures_mean": float(np.mean(failures_per_draw)),
        "finished_fraction": len(times) / request.draws,
        "time_to_train_mean_s": float(arr.mean()) if arr.size else None,
        "time_to_train_p10_s": float(np.percentile(arr, 10)) if arr.size else None,
        "time_to_train_p90_s": float(np.percentile(arr, 90)) if arr.size else None,
    }


def _keep_one_alive(failures: tuple[Failure, ...], n: int) -> tuple[Failure, ...]:
    """Drop the failure that would kill the last worker (a continue run needs one survivor;
    a draw where all die is past any useful horizon)."""
    ranks: set[int] = set()
    out = []
    for f in failures:
        if len(ranks | {f.rank}) >= n:
            break
        ranks.add(f.rank)
        out.append(f)
    return tuple(out)
