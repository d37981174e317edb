"""Comparison of run directories and calibration fits, on run directories written here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from psgdlab.analysis import compare_dirs, fit_compute_time, fit_link, load_cases, total_variation
from psgdlab.analysis.compare import RANK_SE, TIE_REL, ranking, ranking_counts
from psgdlab.analysis.report import write_report
from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.core.exchange import ExchangeKind
from psgdlab.core.records.rundir import RunDir, Summary, commit_run, write_summary
from psgdlab.core.records.trace import TraceBuilder, summarize, write_trace


def write_case(
    path, *, algorithm, workers, step_s, comm_s=0.0, staleness=0, steps=20, jitter=0.0, seed=0, samples_per_step=None
):
    rng = np.random.default_rng(seed)
    tb = TraceBuilder()
    for r in range(workers):
        t = 0.0
        for s in range(steps):
            c = step_s - comm_s + jitter * rng.standard_normal()
            tb.add(rank=r, step=s, phase="compute", start_s=t, end_s=t + c, staleness=staleness, loss=1.0 / (s + 1))
            tb.add(
                rank=r,
                step=s,
                phase="comm",
                start_s=t + c,
                end_s=t + c + comm_s,
                kind=ExchangeKind.ALLREDUCE,
                nbytes=1000,
            )
            t += c + comm_s
    trace = tb.array()
    rd = RunDir(path)
    meta = {"source": "test"} if samples_per_step is None else {"source": "test", "samples_per_step": samples_per_step}
    write_trace(rd / "trace.npz", trace, meta)
    figures = summarize(trace, samples_per_step=32)
    del figures["workers"]
    write_summary(
        rd,
        Summary(
            source="runtime",
            algorithm=algorithm,
            algorithm_params={"algorithm": algorithm},
            workers=workers,
            figures=figures,
        ),
    )
    rd.write_json("config.resolved.json", {"algorithm": {"algorithm": algorithm, "n_workers": workers}})
    commit_run(path, command="test")
    return path


@pytest.fixture
def dirs(tmp_path):
    pred, meas = tmp_path / "pred", tmp_path / "meas"
    for alg, st, stale in (("ssgd", 0.10, 0), ("adpsgd", 0.08, 1)):
        write_case(pred / "runs" / f"{alg}-w4", algorithm=alg, workers=4, step_s=st, comm_s=0.02, staleness=stale)
        write_case(meas / "runs" / f"{alg}-w4", algorithm=alg, workers=4, step_s=st * 1.1, comm_s=0.02, staleness=stale)
    commit_run(pred, command="test")
    commit_run(meas, command="test")
    return pred, meas


def test_compare_reports_relative_errors(dirs):
    result = compare_dirs(*dirs)
    assert [c["algorithm"] for c in result["cases"]] == ["adpsgd", "ssgd"]
    for c in result["cases"]:
        assert c["step_time_error"] == pytest.approx(1 / 1.1 - 1, rel=1e-9)
        assert c["staleness_tv"] == 0.0
    assert result["median_abs_step_time_error"] == pytest.approx(1 - 1 / 1.1, rel=1e-9)
    assert result["ranking_identical"] is True


def test_ranking_difference_is_detected(tmp_path):
    pred, meas = tmp_path / "p", tmp_path / "m"
    write_case(pred / "runs" / "a", algorithm="ssgd", workers=2, step_s=0.1)
    write_case(pred / "runs" / "b", algorithm="adpsgd", workers=2, step_s=0.2)
    write_case(meas / "runs" / "a", algorithm="ssgd", workers=2, step_s=0.2)
    write_case(meas / "runs" / "b", algorithm="adpsgd", workers=2, step_s=0.1)
    commit_run(pred, command="test")
    commit_run(meas, command="test")
    assert compare_dirs(pred, meas)["ranking_identical"] is False


def _cases(pred, meas, workers=2, se=None):
    se = se or [None] * len(pred)
    return [
        {"algorithm": a, "workers": workers, "samples_per_s": {"predicted": p, "measured": m, "measured_se": s}}
        for a, p, m, s in zip("abcdefgh", pred, meas, se)
    ]


def test_ranking_treats_only_exact_predicted_ties_as_one_class():
    # a and b predicted equal (bit-identical, or within float rounding): either measured order is fine
    for meas in ([300.0, 301.0, 250.0], [301.0, 300.0, 250.0]):
        r = ranking(_cases([300.5, 300.5 * (1 + 1e-12), 250.0], meas))[2]
        assert r["identical"] and r["predicted"] == [["a", "b"], ["c"]] and r["swaps"] == []
        assert (r["ranked"], r["tied"], r["misordered"]) == (3, 0, 0)
    # without standard errors every measured difference ranks a pair: a predicted 0.1 % above b
    # and measured the other way round is misordered
    r = ranking(_cases([300.3, 300.0, 250.0], [300.0, 300.2, 250.0]))[2]
    assert not r["identical"] and r["misordered"] == 1
    (swap,) = r["swaps"]
    assert swap[:2] == ["a", "b"] and swap[2] == pytest.approx(0.001) and swap[3] == pytest.approx(-0.2 / 300.2)
    # ... and with them, the same measurement is a tie (0.2 apart, 2 standard errors of 0.1 each)
    r = ranking(_cases([300.3, 300.0, 250.0], [300.0, 300.2, 250.0], se=[0.1, 0.1, 0.1]))[2]
    assert r["identical"] and (r["ranked"], r["tied"], r["misordered"]) == (2, 1, 0)
    assert r["ties"][0][:2] == ["b", "a"] and r["ties"][0][3] == pytest.approx(0.2 / np.hypot(0.1, 0.1))
    # an equal measurement is a tie, whatever the prediction
    assert ranking(_cases([2.0, 1.0], [1.0, 1.0]))[2]["tied"] == 1
    # a tie class is compared with every case below it
    r = ranking(_cases([3.0, 3.0, 1.0], [2.0, 0.5, 1.0]))[2]
    assert r["swaps"] == [["b", "c", 2.0, -0.5]]


_value = hst.floats(1.0, 1000.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    hst.lists(hst.tuples(_value, _value, hst.floats(0.0, 5.0)), min_size=2, max_size=7, unique_by=lambda t: t[0]),
    hst.integers(2, 3),
)
def test_ranking_counts_every_pair_once(values, groups):
    """Per group, ranked + tied is n(n-1)/2; a pair within two combined standard errors is a tie
    whatever the predicted order; a pair outside them that the prediction orders the other way
    is misordered, and only then."""
    pred, meas, se = (list(x) for x in zip(*values))
    cases = [c for g in range(2, 2 + groups) for c in _cases(pred, meas, workers=g, se=se)]
    result = ranking(cases)
    n = len(values)
    for r in result.values():
        assert r["ranked"] + r["tied"] == n * (n - 1) // 2
        assert r["misordered"] == len(r["swaps"]) <= r["ranked"] and r["identical"] == (r["misordered"] == 0)
    assert ranking_counts(result.values())["ranked"] == groups * result[2]["ranked"]
    by = {a: (p, m, s) for a, (p, m, s) in zip("abcdefgh", values)}
    swapped = {tuple(sorted(s[:2])) for s in result[2]["swaps"]}
    tied = {tuple(sorted(t[:2])) for t in result[2]["ties"]}
    for i, a in enumerate(sorted(by)):
        for b in sorted(by)[i + 1 :]:
            (pa, ma, sa), (pb, mb, sb) = by[a], by[b]
            inside = abs(ma - mb) <= RANK_SE * np.hypot(sa, sb)
            assert ((a, b) in tied) == inside
            apart = not math.isclose(pa, pb, rel_tol=TIE_REL)
            assert ((a, b) in swapped) == (not inside and apart and (pa - pb) * (ma - mb) < 0)


def test_samples_per_s_se_is_the_spread_of_batch_means():
    """Steady steps have no spread; steps that alternate in blocks give batch estimates whose
    standard error is that of the batch means; too few steps give none."""
    from psgdlab.analysis.compare import samples_per_s_se

    def trace(gaps):
        tb = TraceBuilder()
        for r in range(2):
            t = 0.0
            for s, g in enumerate(gaps):
                tb.add(rank=r, step=s, phase="compute", start_s=t, end_s=t + g / 2)
                t += g
        return tb.array()

    assert samples_per_s_se(trace([0.1] * 41), samples_per_step=1) == pytest.approx(0.0, abs=1e-9)
    gaps = [0.1] * 41
    for k in range(4, 41, 10):  # one batch of 5 (steps 4..8 after a warm-up of 4) in every other batch slow
        gaps[k : k + 5] = [0.2] * 5
    se = samples_per_s_se(trace(gaps), samples_per_step=1)
    assert se is not None and se > 0
    assert samples_per_s_se(trace([0.1] * 8), samples_per_step=1) is None


def test_report_and_cli(dirs, tmp_path, capsys):
    pred, meas = dirs
    out = write_report(compare_dirs(pred, meas), tmp_path / "report")
    assert (out / "report.md").read_text().startswith("# Prediction against measurement")
    assert (out / "ssgd-w4-timeline.png").stat().st_size > 1000
    assert main(["compare", str(pred), str(meas), "--json", "--no-figures", "--out", str(tmp_path / "r2")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["max_abs_step_time_error"] == pytest.approx(1 - 1 / 1.1, rel=1e-9)


def test_compare_errors(tmp_path, dirs, capsys):
    with pytest.raises(ConfigError, match="does not exist"):
        load_cases(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"has no summary\.json"):
        load_cases(tmp_path / "empty")
    other = write_case(tmp_path / "other", algorithm="bmuf", workers=8, step_s=0.1)
    with pytest.raises(ConfigError, match=r"no \(algorithm, workers\) case is in both"):
        compare_dirs(dirs[0], other)
    assert main(["compare", str(dirs[0]), str(other)]) == 2
    assert "no (algorithm, workers) case" in capsys.readouterr().err


def test_total_variation():
    assert total_variation({"0": 1}, {"0": 3}) == 0.0
    assert total_variation({"0": 1}, {"1": 1}) == 1.0
    assert total_variation({}, {}) == 0.0


def test_fit_compute_time_recovers_lognormal(tmp_path):
    rng = np.random.default_rng(0)
    tb = TraceBuilder()
    for s in range(400):
        d = rng.lognormal(np.log(0.05) - 0.5 * np.log1p(0.04), np.sqrt(np.log1p(0.04)))
        tb.add(rank=0, step=s, phase="compute", start_s=s, end_s=s + d)
    fit = fit_compute_time(tb.array())
    assert fit["mean_s"] == pytest.approx(0.05, rel=0.03) and fit["cv"] == pytest.approx(0.2, rel=0.15)
    assert fit["ks_distance"] < 0.08
    # a shared machine: one step in a hundred lasts 20 times longer; the fit keeps to the steps
    d = np.full(400, 0.05) * rng.lognormal(0, 0.01, 400)
    d[::100] = 1.0
    tb = TraceBuilder()
    for s, x in enumerate(d):
        tb.add(rank=0, step=s, phase="compute", start_s=s, end_s=s + x)
    fit = fit_compute_time(tb.array())
    assert fit["mean_s"] == pytest.approx(0.05, rel=0.01) and fit["cv"] < 0.02
    assert fit["sample_mean_s"] > 0.055  # the moment fit would say cv 1.4


def test_fit_refuses_to_guess():
    tb = TraceBuilder()
    tb.add(rank=0, step=5, phase="compute", start_s=0, end_s=1)
    with pytest.raises(ConfigError, match="too little data to fit compute time"):
        fit_compute_time(tb.array())
    with pytest.raises(ConfigError, match="single payload size"):
        fit_link(np.ones(10), np.full(10, 1e6))
    with pytest.raises(ConfigError, match="too little data to fit a link"):
        fit_link(np.ones(3), np.arange(3.0))
    # one point that summarizes many exchanges of one size: the size is what is missing, not data
    with pytest.raises(ConfigError, match=r"single payload size \(148 exchanges, all of 400000 bytes\)"):
        fit_link(np.ones(1), np.full(1, 4e5), records=148)


def test_fit_link_allreduce_model():
    n = np.array([2, 4, 8] * 4)
    S = np.repeat([1e5, 1e6, 4e6, 1.6e7], 3)
    t = np.where(n <= 2, 1.0, 2 * (n - 1)) * 30e-6 + np.where(n <= 2, S, 2 * (n - 1) / n * S) / 1e9
    fit = fit_link(t, S, group_sizes=n)
    assert fit["latency_s"] == pytest.approx(30e-6, rel=1e-6)
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(1e9, rel=1e-6)


def test_compare_says_where_the_step_goes(tmp_path):
    """Two runs of one step time, one blocked longer after its compute: the path after the
    compute tells them apart (the workers here restart together after their exchange)."""
    pred, meas = tmp_path / "p", tmp_path / "m"
    for root, comm_s in ((pred, 0.01), (meas, 0.03)):
        write_case(
            root / "runs" / "ssgd-w4", algorithm="ssgd", workers=4, step_s=0.1, comm_s=comm_s, samples_per_step=32
        )
        commit_run(root, command="test")
    result = compare_dirs(pred, meas)
    path = result["cases"][0]["path"]
    assert path["after_compute_s"]["predicted"] == pytest.approx(0.01)
    assert path["after_compute_s"]["measured"] == pytest.approx(0.03)
    assert path["restart_spread_s"]["measured"] == pytest.approx(0.0, abs=1e-12)
    assert path["worker_step_max_s"]["rel_error"] == pytest.approx(0.0, abs=1e-9)
    report = (write_report(result, tmp_path / "report", figures=False) / "report.md").read_text()
    assert "Where the step goes" in report and "| ssgd | 4 | 10 / 30 |" in report
