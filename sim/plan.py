r"""Planning: search configurations for the cheapest and the fastest way to a target.

A *candidate* is an algorithm the convergence profile covers, a number of workers (GPUs), a
per-GPU batch, and where the algorithm takes them a ring variant, an averaging period and a
gossip group size (H-ADPSGD's GPUs per super-learner). :func:`candidates` enumerates them;
:func:`evaluate` turns a chunk of them into rows of ``psgdlab predict``
(:func:`psgdlab.sim.predict.predict_one`: one code path for a row, the time to target included);
:func:`choose` takes the Pareto front of time to target against GPU-hours among the rows within
the limits, the recommended configuration and the rows tied with it.

What the search needs of the simulator, and no more:

- **no simulation where the answer is known without one**: a candidate beyond a limit that does
  not depend on the simulation (batch, learners on the ring, period) does not reach the target
  whatever its step time; only its reason is kept. The staleness limit needs the simulated
  staleness, so those are simulated;
- **short windows** (:data:`PLAN_STEPS` steps per worker, against ``predict``'s 200): the mean
  step time of a steady window, and the batch-means noise of a short window goes into the
  interval;
- every candidate is seeded by itself (``seed``), so a row does not depend on which process
  simulated it: the answer is the same with one process, many, or ranks of an MPI pool.

**Choosing.** The Pareto front: rows that reach the target within ``--deadline`` and
``--budget-gpu-hours`` (their point values) that no other such row beats on both time and
GPU-hours. The recommended row is the best on the objective (``time``, the default, or
``gpu-hours``), by its point value; the rows whose 90 % interval overlaps it are *ties*, listed
beside it: the model cannot rank them. A tie is not a licence to trade the objective for the
other one: a user who asks for the soonest time gets the configuration predicted soonest, and
the cheaper ties are in the answer to choose from (``--objective gpu-hours`` asks for the
cheapest). Two rows share most of their uncertainty (the same convergence parameters, the same
platform), which moves both together and says nothing about their order; the intervals
compared are therefore those of the *ratio* of the two rows' times
(:func:`psgdlab.core.convergence.paired_log_sd`): a tie when it holds 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from psgdlab.core.algorithms import ALGORITHMS, algorithm_parameters
from psgdlab.core.convergence import (
    OBJECTIVES,
    ConvergenceProfile,
    Target,
    paired_log_sd,
    predict_steps,
    setting_of,
)
from psgdlab.core.errors import TestbedError, require
from psgdlab.core.records.intervals import Z
from psgdlab.core.records.rows import PlanRow
from psgdlab.sim.platform import Placement
from psgdlab.sim.predict import build_algorithm, predict_one
from psgdlab.sim.workload import SimConfig

__all__ = [
    "PLAN_STEPS",
    "DEFAULT_BATCHES",
    "DEFAULT_PERIODS",
    "Candidate",
    "candidates",
    "evaluate",
    "choose",
    "Choice",
]

#: steps per worker of a candidate's simulated window (module docstring)
PLAN_STEPS = 40
#: per-GPU batches searched by default (in the workload's sample unit)
DEFAULT_BATCHES = (32, 48, 64, 96, 128, 192, 256)
#: averaging periods searched by default (algorithms that have one)
DEFAULT_PERIODS = (5, 20, 80)
Objective = Literal["time", "gpu-hours"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration of the search (``None``: the algorithm does not take it)."""

    algorithm: str
    workers: int
    batch: int
    variant: str | None = None
    period: int | None = None
    gpus_per_node: int | None = None

    @property
    def label(self) -> str:
        parts = [self.algorithm]
        if self.variant is not None:
            parts.append(self.variant)
        parts.append(f"x{self.workers}")
        if self.gpus_per_node is not None:
            parts.append(f"({self.gpus_per_node}/node)")
        if self.period is not None:
            parts.append(f"period {self.period}")
        parts.append(f"b{self.batch}")
        return " ".join(parts)


def _worker_counts(max_gpus: int) -> list[int]:
    return [1, *range(2, max_gpus + 1, 2)]


def candidates(
    config: SimConfig,
    profile: ConvergenceProfile,
    *,
    max_gpus: int | None = None,
    batches: Sequence[int] = DEFAULT_BATCHES,
    periods: Sequence[int] = DEFAULT_PERIODS,
    algorithms: Sequence[str] | None = None,
) -> list[Candidate]:
    """Every configuration of the search, in a fixed order: algorithms the profile covers (or
    ``algorithms``) x worker counts (1 and the even counts up to ``max_gpus``, default the
    platform's devices) x per-GPU ``batches`` x the algorithm's ring variants, ``periods`` and
    gossip group sizes (divisors of the devices per host, >= 2). One worker is single-worker
    SGD whatever the algorithm, so it is one candidate per batch. A configuration the algorithm
    or the platform refuses (an odd ring, more workers than GPUs) is not a candidate."""
    total = config.platform.total_devices
    top = total if max_gpus is None else max_gpus
    require(isinstance(top, int) and 1 <= top <= total, "max_gpus", top, f"must be in [1, {total}] on this platform")
    for b in batches:
        require(isinstance(b, int) and b >= 1, "batch", b, "must be integers >= 1")
    names = list(algorithms) if algorithms is not None else [a for a in profile.algorithms if a in ALGORITHMS]
    names = [a for a in names if a != "sgd"] or names  # sgd is the one-worker candidate of every algorithm
    per_host = config.platform.devices_per_host
    groups = [g for g in range(2, per_host + 1) if per_host % g == 0]
    out: list[Candidate] = []
    seen_single: set[int] = set()
    for name in names:
        params = algorithm_parameters(name)
        variants: list[str | None] = [*ALGORITHMS[name].variants] or [None]
        pers: list[int | None] = list(periods) if "period" in params else [None]
        gpns: list[int | None] = list(groups) if "gpus_per_node" in params else [None]
        for n in _worker_counts(top):
            for b in batches:
                if n == 1:
                    if b not in seen_single:
                        seen_single.add(b)
                        out.append(Candidate(algorithm="sgd", workers=1, batch=b))
                    continue
                for v in variants:
                    for p in pers:
                        for g in gpns:
                            c = Candidate(algorithm=name, workers=n, batch=b, variant=v, period=p, gpus_per_node=g)
                            if _valid(c, config):
                                out.append(c)
    return out


def _valid(c: Candidate, config: SimConfig) -> bool:
    try:
        build_algorithm(
            c.algorithm, c.workers, config, period=c.period, variant=c.variant, gpus_per_node=c.gpus_per_node
        )
    except TestbedError:  # a configuration error, an odd ring, a placement that does not fit
        return False
    try:
        Placement.pack(config.platform, c.workers, c.gpus_per_node)
    except TestbedError:
        return False
    return True


def _static_outcome(c: Candidate, config: SimConfig, profile: ConvergenceProfile, target: Target) -> PlanRow | None:
    """The row of a candidate that cannot reach the target whatever the simulation says (a limit
    on batch, learners or period, or a target below the floor): why; else ``None``."""
    alg = build_algorithm(
        c.algorithm, c.workers, config, period=c.period, variant=c.variant, gpus_per_node=c.gpus_per_node
    )
    outcome = predict_steps(profile, setting_of(alg, c.batch), target)
    if outcome.reaches or (outcome.short or "").startswith("staleness"):
        return None
    return PlanRow(config=c.label, target_reason=outcome.reason, target_short_reason=f"{alg.name}: {outcome.short}")


def evaluate(
    chunk: Sequence[tuple[int, Candidate]],
    config: SimConfig,
    profile: ConvergenceProfile,
    target: Target,
    *,
    steps: int = PLAN_STEPS,
    seed: int = 0,
) -> list[tuple[int, PlanRow]]:
    """The rows of a chunk of indexed candidates (:class:`~psgdlab.core.records.rows.PlanRow`): a row of
    ``predict`` with the candidate's label for each candidate that needs a simulation, only why it
    cannot reach the target for the rest."""
    out = []
    for i, c in chunk:
        static = _static_outcome(c, config, profile, target)
        if static is not None:
            out.append((i, static))
            continue
        pred = predict_one(
            c.algorithm,
            c.workers,
            _with_batch(config, c.batch),
            steps=steps,
            period=c.period,
            variant=c.variant,
            gpus_per_node=c.gpus_per_node,
            seed=seed,
            record=True,
            convergence=profile,
            target=target,
        )
        out.append((i, PlanRow(config=c.label, prediction=pred.row)))
    return out


def _with_batch(config: SimConfig, batch: int) -> SimConfig:
    import dataclasses

    return dataclasses.replace(config, workload=config.workload.with_batch(batch))


@dataclass(frozen=True, slots=True)
class Choice:
    """What :func:`choose` found: the Pareto front (by time), the recommended row, the rows tied
    with it, why it was recommended, and how many rows reach the target within the limits."""

    pareto: list[PlanRow]
    recommended: PlanRow | None
    ties: list[PlanRow]
    why: str
    feasible: int


def _figure(row: PlanRow, key: str) -> float:
    """A row's time to target (s) or GPU-hours to it: ``key`` of its
    :class:`~psgdlab.core.records.rows.TargetColumns`."""
    value = getattr(row.to_target, key)
    return float(value)


def choose(
    rows: Iterable[PlanRow],
    covariance: np.ndarray,
    *,
    objective: Objective = "time",
    deadline_s: float | None = None,
    budget_gpu_hours: float | None = None,
) -> Choice:
    """The Pareto front, the recommended row and its ties (module docstring). ``rows`` in
    candidate order; a tie between equal values goes to the earlier row. ``covariance``: the
    convergence profile's (:meth:`~psgdlab.core.convergence.ConvergenceProfile.covariance`), for
    comparing two rows with their shared uncertainty cancelled
    (:func:`~psgdlab.core.convergence.paired_log_sd`)."""
    require(objective in OBJECTIVES, "objective", objective, f"must be one of {', '.join(OBJECTIVES)}")
    ok = [
        r
        for r in rows
        if r.reaches_target
        and (deadline_s is None or _figure(r, "time_to_target_s") <= deadline_s)
        and (budget_gpu_hours is None or _figure(r, "gpu_hours_to_target") <= budget_gpu_hours)
    ]
    if not ok:
        return Choice([], None, [], "no configuration reaches the target within the limits", 0)
    t = [_figure(r, "time_to_target_s") for r in ok]
    g = [_figure(r, "gpu_hours_to_target") for r in ok]
    order = sorted(range(len(ok)), key=lambda i: (t[i], g[i], i))
    pareto, best_g = [], float("inf")
    for i in order:
        if g[i] < best_g:
            pareto.append(ok[i])
            best_g = g[i]
    key = OBJECTIVES[objective]
    values, other_values = (t, g) if key == "time_to_target_s" else (g, t)
    best = min(range(len(ok)), key=lambda i: (values[i], other_values[i], i))
    tied = [i for i in range(len(ok)) if i != best and _tie(ok[best], ok[i], key, covariance)]
    rec = ok[best]
    ties = [ok[i] for i in tied]
    what = "time to target" if objective == "time" else "GPU-hours to target"
    worse = "slower" if objective == "time" else "costlier"
    if tied:
        thrift = min(tied, key=lambda i: (other_values[i], i))
        cheaper = (
            f"; of them {ok[thrift].config} needs the fewest {'GPU-hours' if objective == 'time' else 'hours'}"
            if other_values[thrift] < other_values[best]
            else ""
        )
        why = (
            f"{rec.config} has the best {what}; {len(tied)} other configuration(s) are tied with it (the 90 % "
            f"interval of the ratio of their {what} holds 1: the model cannot rank them){cheaper}"
        )
    else:
        why = f"{rec.config} has the best {what}, and every other configuration is {worse} beyond the 90 % interval"
    return Choice(pareto, rec, ties, why, len(ok))


def _tie(a: PlanRow, b: PlanRow, key: str, covariance: np.ndarray) -> bool:
    """Whether the 90 % interval of ``b``'s ``key`` over ``a``'s holds 1."""
    assert a.prediction is not None and b.prediction is not None  # rows that reach the target
    ratio = _figure(b, key) / _figure(a, key)
    return abs(math.log(ratio)) <= Z * paired_log_sd(a.prediction, b.prediction, covariance)
