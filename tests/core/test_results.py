"""Typed results: each written and read by one function, a round trip through JSON text that gives
the result back (property-based), the mapping view equal to the JSON object, the schema version
checked, and run directories' summaries of every shape through one writer and reader."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.records.results import SCHEMA_VERSION, document, schema_version_of
from psgdlab.core.records.rows import (
    Extrapolation,
    IntervalInfo,
    IntervalLogSd,
    PlanRow,
    PredictionRow,
    RowIntervals,
    TargetColumns,
    TargetLogSd,
)
from psgdlab.core.records.rundir import Summary, commit_run, read_run_summary, read_summary, write_summary
from psgdlab.core.records.summaries import NotReaching, PlanAnswer, PlanBrief, PlanSummary, SweepSummary, kind_of

# ----- strategies of every part of a row ---------------------------------------------------------
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
positive = st.floats(min_value=1e-9, max_value=1e9, allow_nan=False)
fraction = st.floats(0.0, 1.0)
count = st.integers(0, 10**6)
names = st.text("abxy -=.\u00e9", max_size=6)
maybe = st.none


def _of(cls, **given_):
    """A strategy of ``cls`` (a dataclass) with every field drawn from ``given_``."""
    return st.builds(cls, **given_)


log_sds = _of(IntervalLogSd, **{f.name: positive for f in fields(IntervalLogSd)})
infos = _of(
    IntervalInfo,
    level=fraction,
    method=names,
    parameters=st.lists(names, max_size=3).map(tuple),
    parameters_exact=st.booleans(),
    directions=st.integers(0, 6),
    unpinned=st.lists(names, max_size=3).map(tuple),
    noise_cv=fraction,
    noise_processes_per_core=maybe() | positive,
    log_sd=log_sds,
    sensitivity_window_steps=count,
    simulation_batches=count,
)
intervals = _of(
    RowIntervals,
    **{f.name: positive for f in fields(RowIntervals) if f.name.endswith(("_low", "_high"))},
    interval=infos,
    has_unpinned_parameters=st.booleans(),
    noise_extrapolated=st.booleans(),
)
reaching = _of(
    TargetColumns,
    target=names,
    reaches_target=st.just(True),
    target_reason=st.none(),
    **dict.fromkeys(("steps_to_target", "epochs_to_target", "time_to_target_s", "gpu_hours_to_target"), positive),
    **{f"{k}_{s}": positive for k in ("time_to_target_s", "gpu_hours_to_target") for s in ("low", "high")},
    target_log_sd=_of(
        TargetLogSd,
        convergence=positive,
        throughput=positive,
        total=positive,
        gradient=st.lists(finite, max_size=6).map(tuple),
        scatter=positive,
    ),
    target_factors=st.dictionaries(names, positive, max_size=4),
)
missing = _of(
    TargetColumns, target=names, reaches_target=st.just(False), target_reason=names, target_short_reason=names
)


def _rows(to_target):
    return _of(
        PredictionRow,
        algorithm=names,
        ran_as=names,
        workers=st.integers(1, 4096),
        node_shape=names,
        gpus_per_node=maybe() | st.integers(1, 16),
        sockets=maybe() | names,
        processes_per_core=maybe() | positive,
        **dict.fromkeys(
            (
                "step_time_s",
                "step_time_median_s",
                "step_time_p95_s",
                "samples_per_s",
                "speedup",
                "epoch_time_s",
                "time_to_train_s",
            ),
            positive,
        ),
        steps_to_train=count,
        **dict.fromkeys(("comm_fraction", "idle_fraction", "compute_fraction", "overlap_comm_fraction"), fraction),
        staleness_mean=positive,
        staleness_max=count,
        staleness_hist=st.dictionaries(st.integers(0, 50).map(str), count, max_size=5),
        extrapolation=_of(
            Extrapolation,
            window_steps_per_worker=st.integers(2, 10**5),
            warmup_steps=st.integers(1, 10**4),
            steady=st.booleans(),
            half_window_throughput_difference=fraction,
        ),
        params=st.dictionaries(names, finite | names | st.booleans() | st.none(), max_size=4),
        stragglers=names,
        batch_per_worker=st.integers(1, 4096),
        sim_events=count,
        intervals=maybe() | intervals,
        to_target=to_target,
        failures=maybe() | st.dictionaries(names, finite, max_size=3),
    )


rows = _rows(maybe() | reaching | missing)
#: a plan's simulated rows all have a time to target (or why not)
plan_rows = st.builds(PlanRow, config=names, prediction=_rows(reaching | missing)) | st.builds(
    PlanRow, config=names, target_reason=names, target_short_reason=names
)


def _through_text(obj):
    """``obj`` as JSON text and back, as a writer and a reader see it."""
    return json.loads(json.dumps(obj))


@given(rows)
def test_a_row_is_read_back_from_its_json(row):
    assert PredictionRow.from_json(_through_text(row.to_json())) == row


@given(rows)
def test_a_row_as_a_mapping_is_its_json_object(row):
    obj = row.to_json()
    assert dict(row) == obj and list(row) == list(obj) and len(row) == len(obj)
    assert row["speedup"] == row.speedup and ("speedup_low" in row) == (row.intervals is not None)
    assert ("reaches_target" in row) == (row.to_target is not None) and ("failures" in row) == (
        row.failures is not None
    )
    if row.to_target is not None:  # only a row that reaches the target has the spread behind its time
        assert ("target_log_sd" in row) is row.to_target.reaches_target
        assert ("target_short_reason" in row) is not row.to_target.reaches_target
        assert row["time_to_target_s"] is row.to_target.time_to_target_s


@given(plan_rows)
def test_a_plan_row_is_read_back_and_its_brief_keeps_its_figures(row):
    obj = row.to_json()
    assert PlanRow.from_json(_through_text(obj)) == row
    assert obj["simulated"] is row.simulated and obj["config"] == row.config
    brief = PlanBrief.of(row)
    assert PlanBrief.from_json(_through_text(brief.to_json())) == brief
    assert brief.reaches_target is row.reaches_target and brief.time_to_target_s == obj.get("time_to_target_s")


@given(st.lists(rows, max_size=3), st.booleans(), st.booleans())
def test_a_sweep_summary_is_read_back(some, unpinned, extrapolated):
    s = SweepSummary(
        platform="p",
        workload="w",
        payload_bytes=8,
        batch_per_worker=4,
        sample_unit="samples",
        samples_per_epoch=100.0,
        epochs=2.0,
        has_unpinned_parameters=unpinned,
        noise_extrapolated=extrapolated,
        rows=tuple(some),
    )
    obj = _through_text(s.to_json())
    assert SweepSummary.from_json(obj) == s
    assert (obj["schema_version"], obj["kind"], obj["source"]) == (SCHEMA_VERSION, "sweep", "simulator")
    answer = s.answer(run_dir="runs/x", wall_s=1.5)
    assert next(iter(answer)) == "schema_version" and answer["rows"] == obj["rows"]


@given(st.lists(plan_rows, min_size=1, max_size=3), st.booleans())
def test_a_plan_answer_and_summary_are_read_back(some, recommend):
    answer = PlanAnswer(
        candidates=len(some),
        pareto=tuple(some),
        recommended=some[0] if recommend else None,
        ties=tuple(some[1:]),
        why="because",
        target="wer=7.8",
        objective="time",
        simulated=1,
        reaching=1,
        within_limits=1,
        not_reaching={"ssgd: batch>4096": NotReaching(count=2, example="total batch 8192 ...")},
        parallelism="1 process",
        steps=20,
        platform="p",
        workload="w",
        wall_s=0.5,
        run_dir="runs/plan",
    )
    assert PlanAnswer.from_json(_through_text(answer.to_json())) == answer
    summary = PlanSummary(answer=answer, rows=tuple(PlanBrief.of(r) for r in some))
    back = PlanSummary.from_json(_through_text(summary.to_json()))
    assert back == replace(summary, answer=replace(answer, run_dir=None))  # the directory is where it lies
    assert "run_dir" not in summary.to_json() and answer.to_json()["run_dir"] == "runs/plan"


def test_target_columns_keep_the_keys_of_a_row_that_reaches_and_one_that_does_not():
    """The keys the team's checks read (issue 42): a reason only where the target is not reached,
    the spread behind the interval only where it is."""
    common = {
        "target",
        "reaches_target",
        "target_reason",
        "steps_to_target",
        "epochs_to_target",
        "time_to_target_s",
        "time_to_target_s_low",
        "time_to_target_s_high",
        "gpu_hours_to_target",
        "gpu_hours_to_target_low",
        "gpu_hours_to_target_high",
    }
    no = TargetColumns(target="wer=7.8", reaches_target=False, target_reason="r", target_short_reason="s")
    assert set(no.to_json()) == common | {"target_short_reason"}
    log_sd = TargetLogSd(convergence=0.1, throughput=0.1, total=0.14, gradient=(1.0,), scatter=0.0)
    yes = TargetColumns(target="wer=7.8", reaches_target=True, target_log_sd=log_sd, target_factors={"batch": 1.0})
    assert set(yes.to_json()) == common | {"target_log_sd", "target_factors"}


def test_schema_version_is_read_back_or_refused_in_one_line():
    assert schema_version_of(document({}), where="x") == SCHEMA_VERSION
    assert schema_version_of({}, where="x") == 0  # written before the version existed
    for bad, message in (
        (SCHEMA_VERSION + 1, r"x: schema_version \(2\) is newer than this psgdlab reads \(1\)"),
        ("1", r"x: schema_version \('1'\) must be a whole number >= 0"),
        (True, r"must be a whole number"),
    ):
        with pytest.raises(ConfigError, match=message):
            schema_version_of({"schema_version": bad}, where="x")
    with pytest.raises(ConfigError, match=r"summary kind \('trace'\) must be one of case, sweep, plan"):
        kind_of({"kind": "trace"}, where="s")


def test_every_summary_shape_goes_through_one_writer_and_one_reader(tmp_path):
    """A case, a sweep and a plan written by write_summary come back from read_run_summary as they
    were once committed (and not before); read_summary reads a case and names the shape of
    anything else."""
    case = Summary(source="simulator", algorithm="ssgd", algorithm_params={"momentum": 0.0}, workers=2)
    sweep = SweepSummary(
        platform="p",
        workload="w",
        payload_bytes=8,
        batch_per_worker=4,
        sample_unit="samples",
        samples_per_epoch=100.0,
        epochs=2.0,
        has_unpinned_parameters=False,
        noise_extrapolated=False,
        rows=(),
    )
    answer = PlanAnswer(
        candidates=0,
        pareto=(),
        recommended=None,
        ties=(),
        why="no configuration reaches the target within the limits",
        target="wer=7.8",
        objective="time",
        simulated=0,
        reaching=0,
        within_limits=0,
        not_reaching={},
        parallelism="1 process",
        steps=20,
        platform="p",
        workload="w",
        wall_s=0.1,
    )
    plan = PlanSummary(answer=answer)
    for name, summary in (("case", case), ("sweep", sweep), ("plan", plan)):
        write_summary(tmp_path / name, summary)
        obj = json.loads((tmp_path / name / "summary.json").read_text())
        assert (obj["schema_version"], obj["kind"]) == (SCHEMA_VERSION, name)
        with pytest.raises(ConfigError, match=r"is incomplete: it has no complete.json"):
            read_run_summary(tmp_path / name)
        commit_run(tmp_path / name, command="test")
        assert read_run_summary(tmp_path / name) == summary
    assert read_summary(tmp_path / "case") == case
    with pytest.raises(ConfigError, match=r"summary.json is a sweep's, not one case's"):
        read_summary(tmp_path / "sweep")


def test_a_summary_written_before_the_header_is_read_as_it_was(tmp_path):
    """Summaries without schema_version and kind (written before them) keep being read in a
    committed directory: their shape told from their keys."""
    old_case = {"source": "runtime", "algorithm": "ssgd", "algorithm_params": {}, "workers": 2, "case": None}
    old_sweep = {"source": "simulator", "platform": "p", "workload": "w", "rows": []}
    old_plan = {"candidates": 0, "rows": []}
    assert kind_of(old_case, where="a") == "case" and kind_of(old_sweep, where="b") == "sweep"
    assert kind_of(old_plan, where="c") == "plan"
    (tmp_path / "summary.json").write_text(json.dumps({**old_case, "samples_per_s": 3.0}))
    commit_run(tmp_path, command="test")
    case = read_summary(tmp_path)
    assert case.figures == {"samples_per_s": 3.0} and case.to_json()["kind"] == "case"


def test_figures_may_not_take_a_header_key():
    with pytest.raises(ConfigError, match=r"summary figures \['kind'\] clash with the header and case keys"):
        Summary(source="runtime", algorithm="ssgd", algorithm_params={}, workers=1, figures={"kind": "x"})
