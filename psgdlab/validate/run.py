"""Running a validation's cases with the runtime: the training configuration of a case, a
measured run (once more when another process stalled it), and more runs of a swapped pair; or,
with ``--measured DIR``, the runs of an earlier validate in ``DIR`` (``earlier_*``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psgdlab.core.errors import ConfigError
from psgdlab.core.records.rundir import require_complete
from psgdlab.validate.machine import wait_for_quiet
from psgdlab.validate.plan import ALGORITHM_CASES, ValidateConfig, case_name

__all__ = [
    "train_config",
    "launch_fresh",
    "name_case",
    "measure",
    "remeasure",
    "repeat_name",
    "earlier_validate",
    "earlier_run",
    "earlier_repeats",
    "stall_reason",
    "STALL_FACTOR",
    "STALL_MIN_S",
]


def train_config(
    vc: ValidateConfig,
    *,
    algorithm: str,
    variant: str | None,
    workers: int,
    dim: int,
    straggler: str,
    steps: int,
    out: Path,
    hosts: int = 1,
    nic_bandwidth: str | None = None,
) -> Any:
    """The runtime's configuration of one run of a validation; on ``hosts`` emulated hosts
    (shaped to ``nic_bandwidth``) H-ADPSGD's nodes are the hosts."""
    from psgdlab.models.recipes import LSQ_MODEL
    from psgdlab.runtime.config import TrainConfig

    return TrainConfig(
        algorithm=algorithm,
        variant=variant,
        workers=workers,
        gpus_per_node=vc.gpus_per_node if hosts == 1 else None,  # None: a host (platform_facts)
        hosts=hosts,
        nic_bandwidth=nic_bandwidth,
        backend=vc.backend,
        model=LSQ_MODEL,
        lsq_dim=dim,
        lsq_samples_per_worker=vc.batch,
        batch=vc.batch,
        steps=steps,
        lr=0.5 / dim,
        compute_time=vc.compute_time,
        straggler=straggler,
        seed=vc.seed,
        out=str(out),
        evaluate=False,
        noise_scale_every=0,  # the figures are times: nothing but the training in the steps
        timeout_s=300.0,
    )


def case_policy(
    vc: ValidateConfig, name: str, workers: int, d: Path, hosts: int = 1, nic_bandwidth: str | None = None
) -> str:
    """The failure policy case ``name``'s run follows -- it decides the protocol a node of several
    members runs, so its prediction prices the same (:func:`psgdlab.core.platform.failure.sums_node_slices`):
    with ``--measured`` the earlier run's in ``d``, else the runtime's default (a fresh validate
    into a directory used before measures anew, whatever policy the run there followed)."""
    summary = d / "summary.json"
    if vc.measured and summary.is_file():
        recorded = json.loads(summary.read_text()).get("on_failure")
        if recorded:
            return str(recorded)
    algorithm, variant = ALGORITHM_CASES[name]
    cfg = train_config(
        vc, algorithm=algorithm, variant=variant, workers=workers, dim=vc.dim, straggler="", steps=vc.steps, out=d,
        hosts=hosts, nic_bandwidth=nic_bandwidth,
    )  # fmt: skip
    return str(cfg.failure_policy)


def launch_fresh(cfg: Any) -> dict[str, Any]:
    """Run ``cfg`` with the runtime into an emptied ``cfg.out``; its summary."""
    from psgdlab.runtime.launcher.launch import launch

    out = Path(cfg.out)
    if out.exists():
        shutil.rmtree(out)
    return launch(cfg, quiet=True, timeout_s=600.0)


def name_case(run_dir: Path, name: str) -> None:
    """Name the case by its validation name (``adpsgd-random``) so the two adpsgd cases differ."""
    from dataclasses import replace

    from psgdlab.core.records.rundir import read_summary, write_summary

    write_summary(run_dir, replace(read_summary(run_dir), case=name))


def measure(
    vc: ValidateConfig,
    name: str,
    workers: int,
    straggler: str,
    d: Path,
    label: str,
    load: dict[str, Any],
    say: Callable[[str], None],
    hosts: int = 1,
    nic_bandwidth: str | None = None,
) -> None:
    """One measured run of case ``name`` with ``workers`` (on ``hosts`` emulated hosts) into
    ``d``, named by the case (measured once more if another process stalled it); ``load[label]``
    records the machine's load."""
    algorithm, variant = ALGORITHM_CASES[name]
    cfg = train_config(
        vc,
        algorithm=algorithm,
        variant=variant,
        workers=workers,
        dim=vc.dim,
        straggler=straggler,
        steps=vc.steps,
        out=d,
        hosts=hosts,
        nic_bandwidth=nic_bandwidth,
    )
    load[label] = wait_for_quiet(vc, say)
    launch_fresh(cfg)
    stall = stall_reason(d)
    if stall is not None:  # another process stopped the machine: measure the case once more
        say(f"  {label} was stalled ({stall}); measuring it again")
        load[label] = {**wait_for_quiet(vc, say), "repeated_after": stall, "first": load[label]}
        launch_fresh(cfg)
    name_case(d, name)


def remeasure(
    vc: ValidateConfig,
    result: dict[str, Any],
    pred_root: Path,
    rep_root: Path,
    straggler: str,
    load: dict[str, Any],
    say: Callable[[str], None],
    hosts: int = 1,
    nic_bandwidth: str | None = None,
) -> dict[tuple[str, int], list[tuple[float, float | None]]]:
    """Measure each case of a misordered pair of ``result["ranking"]`` ``vc.remeasure`` more times
    (interleaved, into ``rep_root``); returns the samples/s of every run of every case with its
    within-run standard error, first run first, for
    :func:`~psgdlab.validate.stats.pooled_ranking` to rank again on their means.

    One run's standard error holds only the noise within it; what moves between runs (launch
    offsets, the machine's other load) shows in repeated runs, and more runs shrink the standard
    error of the mean (as one over the root of the runs) without changing the rule.
    """
    from psgdlab.analysis.load import load_cases

    involved = sorted(
        {(name, int(n)) for n, r in result["ranking"].items() for a, b, *_ in r["swaps"] for name in (a, b)}
    )
    preds = load_cases(pred_root)
    runs = _first_runs(result)
    for i in range(vc.remeasure):
        for name, n in involved:
            d = rep_root / repeat_name(name, n, i + 1)
            label = f"{case_name(name, n, straggler, hosts, nic_bandwidth)} run {i + 2}"
            say(f"measure {label} (a pair came out of the predicted order)")
            measure(vc, name, n, straggler, d, label, load, say, hosts, nic_bandwidth)
            _add_run(runs, (name, n), preds[(name, n)], d)
    return runs


def repeat_name(name: str, workers: int, i: int) -> str:
    """The directory of the ``i``-th repeat (from 1) of a case, under its ``-repeats`` root."""
    return f"{name}-w{workers}-r{i}"


def _first_runs(result: dict[str, Any]) -> dict[tuple[str, int], list[tuple[float, float | None]]]:
    """Each case's own run: its samples/s and their standard error."""
    return {
        (c["algorithm"], c["workers"]): [(c["samples_per_s"]["measured"], c["samples_per_s"].get("measured_se"))]
        for c in result["cases"]
    }


def _add_run(
    runs: dict[tuple[str, int], list[tuple[float, float | None]]], key: tuple[str, int], predicted: Any, d: Path
) -> None:
    """Add the samples/s of the measured run ``d`` of case ``key`` (predicted as ``predicted``)."""
    from psgdlab.analysis.compare import compare_cases
    from psgdlab.analysis.load import load_run

    got = compare_cases(predicted, load_run(d))["samples_per_s"]
    runs[key].append((got["measured"], got["measured_se"]))


# ----- an earlier validate's runs, predicted and compared again (``--measured DIR``) -------------
def earlier_validate(source: Path, out: Path) -> dict[str, Any]:
    """The ``validate.json`` of the earlier validate in ``source``; refuses a directory that is
    not one, or ``out`` in it (the new predictions would overwrite what it compared)."""
    path = source / "validate.json"
    if not path.is_file():
        raise ConfigError(f"measured ({source}) has no validate.json: it is not the directory of a psgdlab validate")
    if out.resolve() == source.resolve():
        raise ConfigError(f"out ({out}) must differ from measured ({source}): the earlier comparison is kept")
    require_complete(source)
    earlier: dict[str, Any] = json.loads(path.read_text())
    return earlier


def earlier_run(source: Path, d: Path) -> Path:
    """``d``, a run of the earlier validate in ``source``, which must exist."""
    if not d.is_dir():
        raise ConfigError(
            f"measured ({source}) has no run {d.relative_to(source)}, which the grid's calibration plan needs: "
            "a validate of another grid, or of an earlier plan"
        )
    return d


def earlier_repeats(
    result: dict[str, Any], pred_root: Path, rep_root: Path
) -> dict[tuple[str, int], list[tuple[float, float | None]]]:
    """The runs of every case of ``result`` for :func:`~psgdlab.validate.stats.pooled_ranking`: its
    own and the repeats the earlier validate measured in ``rep_root`` (those of the pairs its
    prediction misordered; :func:`remeasure`)."""
    from psgdlab.analysis.load import load_cases

    preds = load_cases(pred_root)
    runs = _first_runs(result)
    for name, n in runs:
        i = 1
        while (rep_root / repeat_name(name, n, i)).is_dir():
            _add_run(runs, (name, n), preds[(name, n)], rep_root / repeat_name(name, n, i))
            i += 1
    return runs


#: a step of any worker this much longer than the run's median step, and longer than a second,
#: is the machine stopping the run (another process), not the algorithm
STALL_FACTOR, STALL_MIN_S = 10.0, 1.0


def stall_reason(run_dir: Path) -> str | None:
    """Why a measured run looks stalled (a step of some worker longer than :data:`STALL_FACTOR`
    times the median step and than :data:`STALL_MIN_S`), or ``None``."""
    import numpy as np

    from psgdlab.core.records.trace import PHASES, read_trace

    trace, _ = read_trace(run_dir / "trace.npz")
    comp = trace[trace["phase"] == PHASES["compute"]]
    per_rank = [np.diff(np.sort(comp["start_s"][comp["rank"] == r])) for r in np.unique(comp["rank"])]
    steps = np.concatenate(per_rank) if per_rank else np.array([])
    if steps.size == 0:
        return None
    longest, median = float(steps.max()), float(np.median(steps))
    if longest > max(STALL_FACTOR * median, STALL_MIN_S):
        return f"a step of {longest:.2f} s against a median of {median:.3f} s"
    return None
