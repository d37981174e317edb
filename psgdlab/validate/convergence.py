r"""``psgdlab validate --convergence``: time to a target held-out loss, predicted and measured on this machine.

:func:`validate_convergence` runs, into ``OUT/``::

    OUT/data/fsdd.h5              the FSDD corpus with a subset of the held-out speakers' utterances
    OUT/reference/WORKLOAD/       the reference run of each workload (ssgd on 2 workers, the noise
                                  scale and the held-out curve measured as it trains)
    OUT/calibration/, platform.toml   this machine calibrated (validate's plan, at the payload of
                                  the largest workload)
    OUT/platforms/WORKLOAD-bB.toml    the calibrated platform with a workload's payload and its
                                  emulated compute at per-worker batch B
    OUT/emulated/CASE/            with ``scales="emulated"``: each case emulated once (route (b))
    OUT/measured/CASE/sS/         each case measured with seed S
    OUT/validate_convergence.json the report (:func:`psgdlab.validate.convergence_results.summarize`)

**The prediction** of a case, made before any case runs, from the reference run and the
calibrated platform alone: the convergence model fitted to the reference run (route (a),
:func:`psgdlab.core.convergence.fit.from_reference_run`: the measured noise scale as
:math:`B_\text{noise}`, the tail of its held-out curve for the floor and the curve) gives the steps
to the target at the case's total batch, learners, period and simulated staleness; the simulator
on the calibrated platform gives its step time and staleness (:func:`psgdlab.sim.predict.predict_one`);
the time to the target is their product, with the interval of both.

**The staleness, learner and period factors** (:mod:`psgdlab.core.convergence`) have scales that
no reference run can measure (one run has one staleness, one learner, one period): priors. With
``scales="emulated"`` (the default) each case's factor is measured instead on the *simulated*
platform, never on the measured runs (route (b)): the case is emulated once (``psgdlab
emulate``'s pipeline: the simulator's event times, real replicas trained as the measured runs
are), and the epochs it takes to reach the target over those of ssgd emulated at the same
workers and batch is its factor :math:`F = E(c)/E(\text{ssgd})`, which replaces the model's three
(log-sd :math:`\sqrt2` times one run's scatter at the target, the two crossings'); a case whose
emulated run does not reach the target within its budget, where ssgd's does, is predicted not to
reach it; a case the simulator cannot emulate on the platform (H-ADPSGD's nodes of 2 on the
calibrated platform's one host of 8 devices) keeps the priors, its error in the report. The
model's form is also fitted to those factors (:func:`fit_scales`, reported, not used): it cannot
go below 1, and an algorithm that changes the step (BMUF's block momentum) can.
With ``scales="prior"`` nothing is emulated and the priors stand.

**The measured runs**: each case with each seed, for 1.6 times its predicted steps and the steps of
1.5 s (a case predicted not to reach the target: of what the model without limits gives), its time to
the target read off its held-out curve (:func:`psgdlab.core.convergence.curves.time_to_target`) from the end
of its start-up (:func:`~psgdlab.validate.convergence_runs.warm_start`: the first use of each
transport, which connects it, is not training), against the predicted time of the steps that
remain after the steps the run did by then.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from psgdlab.core.convergence import ConvergenceProfile, Family, Outcome, Setting, Target, setting_of
from psgdlab.core.convergence.curves import monotone_fit, time_to_target
from psgdlab.core.convergence.fit import DEFAULT_SCALES, from_reference_run
from psgdlab.core.errors import ConfigError, SimulationError
from psgdlab.core.records.results import document
from psgdlab.core.records.trace import atomic_write_json
from psgdlab.validate.convergence_plan import Case, ConvergenceConfig, WorkloadSpec, cases
from psgdlab.validate.convergence_results import ConfigurationResult, Predicted, summarize, tie_check
from psgdlab.validate.convergence_runs import (
    calibrated_platform,
    emulate_case,
    held_out_corpus,
    read_measured,
    reference_config,
    run_train,
    train_config,
    workload_config,
)
from psgdlab.validate.machine import load_average, wait_for_quiet

__all__ = ["validate_convergence", "default_target", "fit_scales", "BUDGET", "REFERENCE_POINTS"]

#: a measured (or emulated) run lasts this many times the steps predicted to the target, plus
#: the steps of :data:`STARTUP_S`
BUDGET = 1.6
#: the start-up a measured run's budget allows for: the first use of a transport connects it, up to
#: a second on this machine, while an asynchronous run's other workers go on (a run's own start-up
#: is measured and left out of its time: :func:`~psgdlab.validate.convergence_runs.warm_start`)
STARTUP_S = 1.5
#: held-out points of a reference run
REFERENCE_POINTS = 40
#: the relative spread of an emulated factor E(c)/E(ssgd, B) (two noisy curves' crossings)
EMULATED_FACTOR_NOISE = 0.1


def default_target(summary: dict[str, Any], spec: WorkloadSpec) -> float:
    """The target of a workload whose target is not given: its reference run's held-out loss at
    ``spec.target_at`` of its epochs, on the curve's decreasing fit (:func:`monotone_fit`).

    >>> from psgdlab.validate.convergence_plan import WORKLOADS
    >>> s = {"heldout_curve": {"epoch": [0.0, 1.0, 2.0, 3.0], "loss": [3.0, 2.0, 1.5, 1.2]}}
    >>> round(default_target(s, WORKLOADS["fsdd"]), 3)    # at 1.8 of 3 epochs
    1.6
    """
    curve = summary["heldout_curve"]
    e = np.asarray(curve["epoch"], dtype=float)
    fit = monotone_fit(curve["loss"])
    return float(np.interp(spec.target_at * e.max(), e, fit))


def validate_convergence(cc: ConvergenceConfig, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the validation (module docstring) and return its report (``validate_convergence.json``)."""
    say = progress or (lambda msg: None)
    out = Path(cc.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    load: dict[str, Any] = {"start": load_average()}

    def before(label: str) -> None:
        say(label)
        load[label] = wait_for_quiet(cc, say)  # type: ignore[arg-type]  # reads min_idle_cores, max_idle_wait_s

    grid = cases(cc)
    data = held_out_corpus(cc, out) if "fsdd" in cc.workloads else None
    references = {}
    for w in cc.workloads:
        before(f"reference run of {w}")
        ref = out / "reference" / w
        references[w] = run_train(reference_config(cc, cc.spec_of(w), data=data, out=ref))
    payload = max(int(s["payload_bytes"]) for s in references.values())
    workers = tuple(sorted({c.workers for c in grid}))
    if cc.platform_file is not None:
        from psgdlab.sim.workload import load_config

        platform, calibration = load_config(path=cc.platform_file), None
    else:
        platform, calibration = calibrated_platform(
            cc, out, payload_bytes=payload, workers=workers, say=say, before_run=before
        )
    results: list[ConfigurationResult] = []
    per_workload: dict[str, Any] = {}
    plans: dict[str, Any] = {}
    for w in cc.workloads:
        mine = [c for c in grid if c.workload == w]
        found, info, rows, covariance = _workload(
            cc, cc.spec_of(w), mine, references[w], out, platform, data, say, before
        )
        results += found
        per_workload[w] = info
        plans[w] = plan_check(found, rows, covariance)
    report: dict[str, Any] = {
        **summarize(results),
        "cases": [r.to_json() for r in results],
        "by_workload": {w: summarize([r for r in results if r.case.workload == w]) for w in cc.workloads},
        "workloads": per_workload,
        "plan": plans,
        "platform": cc.platform_file or str(out / "platform.toml"),
        "calibration": calibration.describe() if calibration is not None else None,
        "config": cc.to_json(),
        "load_average": {**load, "end": load_average()},
        "wall_s": time.time() - t0,
    }
    atomic_write_json(out / "validate_convergence.json", document(report))
    return report


def _workload(
    cc: ConvergenceConfig,
    spec: WorkloadSpec,
    grid: Sequence[Case],
    reference: dict[str, Any],
    out: Path,
    platform: Any,
    data: Path | None,
    say: Callable[[str], None],
    before: Callable[[str], None],
) -> tuple[list[ConfigurationResult], dict[str, Any], dict[Case, Any], np.ndarray]:
    """One workload: its target and model, its predictions, its emulated and measured runs;
    also each case's prediction row and the model's covariance (for :func:`plan_check`)."""
    ref_dir = out / "reference" / spec.name
    if reference.get("noise_scale") is None:
        raise ConfigError(
            f"the reference run of {spec.name} ({ref_dir}) resolved no gradient noise scale "
            "(its |G|^2 estimate was not positive): run it longer (--workloads, a longer reference)"
        )
    target = cc.target_of(spec.name) or default_target(reference, spec)
    profile = from_reference_run(ref_dir, target=target, workload=spec.name)
    spe_samples = float(reference["samples_per_epoch"])
    configs = {}
    for b in sorted({c.batch for c in grid}):
        configs[b] = workload_config(
            platform, spec, batch=b, n_params=int(reference["n_params"]), itemsize=int(reference["itemsize"]),
            samples_per_epoch=spe_samples,
        )  # fmt: skip
        path = out / "platforms" / f"{spec.name}-b{b}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        configs[b].write(path)
    goal = Target(metric="loss", value=target)
    say(f"{spec.name}: target loss {target:.4g}; predict {len(grid)} cases from the reference run")
    made = {c: _predict(cc, c, configs[c.batch], profile, goal) for c in grid}
    emulated: dict[Case, dict[str, Any]] = {}
    scales_fit = None
    if cc.scales == "emulated":
        emulated = _emulate(cc, spec, grid, {c: p for c, (p, _) in made.items()}, out, spe_samples, data, target, say)

        def setting(c: Case, staleness: float) -> Setting:
            from psgdlab.sim.predict import build_algorithm

            alg = build_algorithm(
                c.algorithm, c.workers, configs[c.batch], variant=c.variant, gpus_per_node=cc.gpus_per_node
            )
            return setting_of(alg, c.batch, staleness_mean=staleness)

        scales_fit = fit_scales(emulated, setting)
        spread = math.sqrt(2.0) * profile.metric_sd / max(target - profile.floor.value, 1e-12)
        made = {c: _predict(cc, c, configs[c.batch], profile, goal, factor=_factor(emulated[c], spread)) for c in grid}
    predicted = {c: p for c, (p, _) in made.items()}
    results = []
    for c in grid:
        p = predicted[c]
        steps = _budget(p)
        every = max(0.05, steps * p.step_time_s / spec.eval_points)
        runs = []
        for k in range(cc.seeds):
            seed = cc.seed + k
            d = out / "measured" / c.name / f"s{seed}"
            cfg = train_config(
                cc, spec, c, seed=seed, steps=steps, samples_per_epoch=spe_samples, evaluate_every_s=every,
                data=data, out=d,
            )  # fmt: skip
            before(f"measure {c.name} (seed {seed}, {steps} steps)")
            run_train(cfg)
            runs.append(read_measured(d, target, seed=seed))
        results.append(ConfigurationResult(case=c, predicted=p, runs=tuple(runs), emulated=_brief(emulated.get(c))))
    info = {
        "target_loss": target,
        "target_source": "given"
        if cc.target_of(spec.name)
        else f"the reference's loss at {spec.target_at:g} of its epochs",
        "reference": {
            "run_dir": str(ref_dir),
            "noise_scale": reference.get("noise_scale"),
            "noise_scale_log_sd": reference.get("noise_scale_log_sd"),
            "noise_scale_method": reference.get("noise_scale_method"),
            "samples_per_epoch": spe_samples,
            "n_params": reference.get("n_params"),
        },
        "profile": profile.parameters(),
        "profile_fit": profile.fit.get("errors", {}).get("loo"),
        "scales": cc.scales,
        "scales_fit": scales_fit,
    }
    return results, info, {c: row for c, (_, row) in made.items()}, profile.covariance()


def _budget(p: Predicted) -> int:
    """The steps of a run of a case predicted ``p`` (:data:`BUDGET`, :data:`STARTUP_S`)."""
    startup = STARTUP_S / p.step_time_s if p.step_time_s > 0 else 0.0
    return max(20, math.ceil(BUDGET * float(p.steps_to_target or 0) + startup))


@dataclasses.dataclass(frozen=True, slots=True)
class Factor:
    """A case's emulated factor (route (b)): ``value`` with ``log_sd``, or ``reaches=False``
    with why."""

    reaches: bool
    value: float = 1.0
    log_sd: float = 0.0
    reason: str | None = None


def _factor(e: dict[str, Any], log_sd: float) -> Factor | None:
    """The factor of an emulated case and its ssgd baseline (``None``: the baseline did not reach
    the target, or the case could not be emulated on the platform, so the priors stand)."""
    base, mine = e.get("baseline"), e.get("epochs_to_target")
    if base is None or "emulation_error" in e:
        return None
    if mine is None:
        return Factor(
            reaches=False, reason=f"its emulated run (route (b)) did not reach the target in {e['steps']} steps"
        )
    return Factor(reaches=True, value=mine / base, log_sd=log_sd)


def _predict(
    cc: ConvergenceConfig,
    case: Case,
    config: Any,
    profile: ConvergenceProfile,
    goal: Target,
    *,
    factor: Factor | None = None,
) -> tuple[Predicted, Any]:
    """The prediction of ``case`` (module docstring) and its row (its ``to_target`` the time to
    ``goal``): the simulated step time and staleness; the convergence model's steps at the case's
    setting, with its staleness, learner and period factors from the profile's scales, or
    replaced by the emulated ``factor``. A case that does not reach the goal gets in
    ``steps_to_target`` the steps the model without limits or factors gives (its runs' budget)."""
    from psgdlab.core.convergence import predict_steps, target_columns
    from psgdlab.sim.predict import build_algorithm, predict_one

    row = predict_one(
        case.algorithm, case.workers, config, variant=case.variant, gpus_per_node=cc.gpus_per_node,
        stragglers=case.straggler or None, seed=cc.seed, workers_per_host=case.workers, on_failure=_policy(cc, case),
    ).row  # fmt: skip
    alg = build_algorithm(case.algorithm, case.workers, config, variant=case.variant, gpus_per_node=cc.gpus_per_node)
    setting = setting_of(alg, case.batch, staleness_mean=float(row.staleness_mean))
    bare = _bare(profile)
    if factor is None:
        outcome = predict_steps(profile, setting, goal)
    elif not factor.reaches:
        outcome = Outcome(reaches=False, reason=factor.reason, short="emulated")
    else:
        o = predict_steps(bare, setting, goal)
        assert o.epochs is not None and o.steps is not None and o.log_sd is not None
        outcome = dataclasses.replace(
            o,
            epochs=o.epochs * factor.value,
            steps=o.steps * factor.value,
            log_sd=math.hypot(o.log_sd, factor.log_sd),
            factors={**o.factors, "emulated": factor.value},
        )
    log_sd = float(row.intervals.interval.log_sd.step_time) if row.intervals is not None else 0.0
    tt = target_columns(
        outcome, goal, step_time_s=float(row.step_time_s), step_time_log_sd=log_sd, workers=case.workers
    )
    row = dataclasses.replace(row, to_target=tt)
    if not tt.reaches_target:
        unlimited = predict_steps(bare, setting, goal)
        return Predicted(
            reaches=False, reason=tt.target_reason, steps_to_target=unlimited.steps, epochs_to_target=None,
            time_to_target_s=None, low_s=None, high_s=None, step_time_s=row.step_time_s,
            staleness_mean=row.staleness_mean, factors={},
        ), row  # fmt: skip
    assert tt.steps_to_target is not None and tt.time_to_target_s is not None
    return Predicted(
        reaches=True,
        reason=None,
        steps_to_target=tt.steps_to_target,
        epochs_to_target=tt.epochs_to_target,
        time_to_target_s=tt.time_to_target_s,
        low_s=tt.time_to_target_s_low,
        high_s=tt.time_to_target_s_high,
        step_time_s=row.step_time_s,
        staleness_mean=row.staleness_mean,
        factors=dict(tt.target_factors or {}),
    ), row


def _bare(profile: ConvergenceProfile) -> ConvergenceProfile:
    """``profile`` without limits and without the staleness, learner and period factors."""
    return dataclasses.replace(
        profile,
        families=(Family(name="any", algorithms=profile.algorithms),),
        staleness_scale=None,
        learner_scale=None,
        period_scale=None,
    )


def _policy(cc: ConvergenceConfig, case: Case) -> str:
    """The failure policy the case's runs follow (it decides the protocol a node of several
    members runs, which the prediction must price the same: :func:`psgdlab.validate.run.case_policy`)."""
    from psgdlab.core.platform.failure import default_on_failure, gossip_algorithms
    from psgdlab.runtime.transports.backends import BACKENDS

    wanted = default_on_failure(case.algorithm)
    if wanted == "continue" and (
        case.algorithm not in gossip_algorithms() or not BACKENDS[cc.backend].survives_a_death
    ):
        return "stop"
    return wanted


# ----- the scales, from emulated runs ----------------------------------------------------------------
def _emulate(
    cc: ConvergenceConfig,
    spec: WorkloadSpec,
    grid: Sequence[Case],
    predicted: dict[Case, Predicted],
    out: Path,
    samples_per_epoch: float,
    data: Path | None,
    target: float,
    say: Callable[[str], None],
) -> dict[Case, dict[str, Any]]:
    """Every case emulated once (and ssgd at the workers, batch and straggler of every case where
    the grid has none), each for its predicted budget; with its epochs to the target (``None``:
    not reached) and its baseline (the ssgd case it is compared with)."""
    todo = list(grid)
    for c in grid:
        base = dataclasses.replace(c, algorithm_case="ssgd")
        if base not in todo:
            todo.append(base)
    found: dict[Case, dict[str, Any]] = {}
    for c in todo:
        p = predicted.get(c) or predicted[next(g for g in grid if dataclasses.replace(g, algorithm_case="ssgd") == c)]
        steps = _budget(p)
        say(f"emulate {c.name} ({steps} steps)")
        try:
            got = emulate_case(
                cc, spec, c, platform_file=out / "platforms" / f"{spec.name}-b{c.batch}.toml", steps=steps,
                samples_per_epoch=samples_per_epoch, data=data, out=out / "emulated" / c.name,
            )  # fmt: skip
        except (ConfigError, SimulationError) as exc:  # e.g. H-ADPSGD's nodes of 2 on the platform's one host
            say(f"  not emulated: {exc}")
            found[c] = {"epochs_to_target": None, "emulation_error": str(exc)}
            continue
        crossing = time_to_target({"time_s": got["curve"]["epoch"], "loss": got["curve"]["loss"]}, target)
        found[c] = {**got, "epochs_to_target": crossing.time_s if crossing.reached else None}
    for c, e in found.items():
        e["baseline"] = found[dataclasses.replace(c, algorithm_case="ssgd")]["epochs_to_target"]
        e["steps"] = _budget(predicted.get(c) or next(iter(predicted.values())))
    return found


def fit_scales(emulated: dict[Case, dict[str, Any]], setting: Callable[[Case, float], Setting]) -> dict[str, Any]:
    r"""The convergence model's staleness, learner and period scales fitted to the emulated factors
    (module docstring: reported, not used): each emulated case whose run and baseline both reached
    the target gives :math:`F = E/E_\text{ssgd}`, fitted by
    :math:`(1 + \bar s/s_{1/2})(1 + ((n_g - 1)/n_{1/2})^2)(1 + (\tau - 1)/\tau_{1/2})` at its setting
    (the emulated run's mean staleness) with the priors of :data:`DEFAULT_SCALES` and a spread of
    :data:`EMULATED_FACTOR_NOISE`; a scale no factor depends on keeps its prior. Returns the
    factors, the fitted values and log-sds and the fitted factors (``None`` without factors)."""
    from psgdlab.core.stats.fitting import fit_parameters

    rows = []
    for c, e in emulated.items():
        base, mine = e.get("baseline"), e.get("epochs_to_target")
        if base is not None and mine is not None and c.algorithm_case != "ssgd":
            rows.append((setting(c, float(e.get("staleness_mean") or 0.0)), mine / base, c.name))
    report: dict[str, Any] = {"factors": [{"case": n, "factor": f} for _, f, n in rows]}
    if not rows:
        return report
    names = ("staleness_scale", "learner_scale", "period_scale")
    settings = [r[0] for r in rows]

    def model(v: dict[str, float], idx: np.ndarray) -> np.ndarray:
        out = []
        for i in idx:
            st = settings[int(i)]
            f = (1 + st.staleness_mean / v["staleness_scale"]) * (1 + ((st.learners - 1) / v["learner_scale"]) ** 2)
            out.append(f * (1 + (st.period - 1) / v["period_scale"]))
        return np.asarray(out, dtype=float)

    rep = fit_parameters(
        model,
        [r[1] for r in rows],
        {k: DEFAULT_SCALES[k][0] for k in names},
        {k: DEFAULT_SCALES[k][1] for k in names},
        noise=EMULATED_FACTOR_NOISE,
    )
    report.update(
        values={k: rep.values[k] for k in names},
        log_sd={k: rep.log_sd[k] for k in names},
        fitted=[float(x) for x in rep.predictions],
    )
    return report


def _brief(e: dict[str, Any] | None) -> dict[str, Any] | None:
    if e is None:
        return None
    out = {"epochs_to_target": e.get("epochs_to_target"), "staleness_mean": e.get("staleness_mean")}
    return {**out, "emulation_error": e["emulation_error"]} if "emulation_error" in e else out


def plan_check(results: Sequence[ConfigurationResult], rows: dict[Case, Any], covariance: np.ndarray) -> dict[str, Any]:
    """What ``psgdlab plan`` recommends among the validated configurations of a workload
    (:func:`psgdlab.sim.plan.choose` on their prediction rows, objective time), per straggler,
    against the measurement: ``verdict`` is ``fastest`` (measured the fastest), ``tied`` (within
    two standard errors of the fastest) or ``slower``."""
    from psgdlab.core.records.rows import PlanRow
    from psgdlab.sim.plan import choose

    out: dict[str, Any] = {}
    for straggler in dict.fromkeys(r.case.straggler for r in results):
        group = [r for r in results if r.case.straggler == straggler]
        plan_rows = [PlanRow(config=r.case.name, prediction=rows[r.case]) for r in group]
        choice = choose(plan_rows, covariance, objective="time")
        label = straggler or "none"
        if choice.recommended is None:
            out[label] = {"recommended": None, "why": choice.why}
            continue
        by_name = {r.case.name: r for r in group}
        rec = by_name[choice.recommended.config]
        measured = [r for r in group if r.measured_mean_s is not None]
        fastest = min(measured, key=lambda r: r.measured_mean_s or math.inf) if measured else None
        out[label] = {
            "recommended": rec.case.name,
            "ties": [t.config for t in choice.ties],
            "why": choice.why,
            "measured_fastest": fastest.case.name if fastest else None,
            "verdict": tie_check(rec, fastest) if fastest else "unmeasured",
            "recommended_measured_s": rec.measured_mean_s,
            "fastest_measured_s": fastest.measured_mean_s if fastest else None,
        }
    return out
