"""The convergence model: its invariants (hypothesis), the published profile's points and its
leave-one-out figures, and the routes from measurement on run directories built here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.convergence import (
    ConvergenceProfile,
    Estimate,
    Family,
    Limit,
    Limits,
    Outcome,
    Setting,
    Target,
    predict_steps,
    target_columns,
)
from psgdlab.core.convergence.fit import from_emulated_runs, from_published, from_reference_run
from psgdlab.core.convergence.published import BILSTM_TABLE, convergence_profile
from psgdlab.core.errors import ConfigError
from psgdlab.core.records.rundir import commit_run

positive = st.floats(min_value=1e-2, max_value=1e4, allow_nan=False, allow_infinity=False)


def _profile(floor: float, curve: float, noise: float, *, max_batch: float | None = None, max_learners=None):
    return ConvergenceProfile(
        workload="toy",
        metric="loss",
        target=floor * 2,
        samples_per_epoch=1e5,
        floor=Estimate(value=floor, log_sd=0.1, source="test"),
        curve=Estimate(value=curve, log_sd=0.2, source="test"),
        noise_scale=Estimate(value=noise, log_sd=0.3, source="test"),
        staleness_scale=Estimate(value=8.0, log_sd=0.5, source="test"),
        learner_scale=Estimate(value=16.0, log_sd=0.5, source="test"),
        period_scale=Estimate(value=40.0, log_sd=0.5, source="test"),
        families=(
            Family(
                name="all",
                algorithms=("ssgd", "adpsgd", "bmuf"),
                limits=Limits(
                    max_batch=Limit(value=max_batch, source="test") if max_batch else None,
                    max_learners=Limit(value=max_learners, source="test") if max_learners else None,
                ),
            ),
        ),
    )


@given(floor=positive, curve=positive, noise=positive, b1=positive, b2=positive, excess=positive)
def test_steps_fall_with_the_batch_to_s_min_and_epochs_rise(floor, curve, noise, b1, b2, excess):
    p = _profile(floor, curve, noise)
    t = Target(metric="loss", value=floor + excess)
    lo, hi = sorted((b1, b2))
    a = predict_steps(p, Setting(algorithm="ssgd", total_batch=lo), t)
    b = predict_steps(p, Setting(algorithm="ssgd", total_batch=hi), t)
    assert a.reaches and b.reaches
    assert b.steps <= a.steps * (1 + 1e-12)  # steps fall with the batch
    assert b.epochs >= a.epochs * (1 - 1e-12)  # epochs rise with it
    s_min = curve / excess * p.samples_per_epoch / noise  # the steps of an infinite batch
    assert b.steps >= s_min * (1 - 1e-12)
    np.testing.assert_allclose(a.steps / s_min, 1 + noise / lo, rtol=1e-9)  # S = S_min (1 + B_noise / B)


@given(
    batch=st.floats(min_value=1, max_value=1e5),
    more=st.floats(min_value=0, max_value=1e5),
    learners=st.integers(1, 200),
    extra=st.integers(0, 200),
)
def test_the_region_that_does_not_converge_is_monotone(batch, more, learners, extra):
    p = _profile(0.1, 1.0, 100.0, max_batch=5000.0, max_learners=16)
    t = Target(metric="loss", value=0.5)
    small = predict_steps(p, Setting(algorithm="adpsgd", total_batch=batch, learners=learners), t)
    big = predict_steps(p, Setting(algorithm="adpsgd", total_batch=batch + more, learners=learners + extra), t)
    assert small.reaches or not big.reaches  # beyond a limit, more batch or learners stays beyond
    assert small.reaches == (batch <= 5000 and learners <= 16)


@given(
    steps=positive,
    log_sd=st.floats(0, 2),
    step_time=positive,
    step_sd=st.floats(0, 2),
    workers=st.integers(1, 1024),
)
def test_intervals_contain_the_point(steps, log_sd, step_time, step_sd, workers):
    o = Outcome(reaches=True, epochs=1.0, steps=steps, log_sd=log_sd)
    c = target_columns(
        o, Target(metric="wer", value=5), step_time_s=step_time, step_time_log_sd=step_sd, workers=workers
    )
    for key in ("time_to_target_s", "gpu_hours_to_target"):
        assert c[f"{key}_low"] <= c[key] <= c[f"{key}_high"]
    np.testing.assert_allclose(c["gpu_hours_to_target"], c["time_to_target_s"] * workers / 3600, rtol=1e-12)
    no = target_columns(
        Outcome(reaches=False, reason="r", short="s"),
        Target(metric="wer", value=5),
        step_time_s=1,
        step_time_log_sd=0,
        workers=2,
    )
    assert no["reaches_target"] is False and no["target_reason"] == "r" and no["time_to_target_s"] is None


def test_staleness_learners_and_period_cost_epochs():
    p = _profile(0.1, 1.0, 100.0)
    t = Target(metric="loss", value=0.5)
    base = predict_steps(p, Setting(algorithm="adpsgd", total_batch=100), t).epochs
    for change, factor in (
        (dict(staleness_mean=8.0), 2.0),
        (dict(learners=17), 2.0),
        (dict(period=41), 2.0),
    ):
        e = predict_steps(p, Setting(algorithm="bmuf", total_batch=100, **change), t).epochs
        np.testing.assert_allclose(e / base, factor, rtol=1e-12)  # each scale doubles the epochs


@pytest.mark.parametrize("text", ["wer", "wer=", "wer=abc", "acc=3", "loss=-1", "loss=0", "loss=nan", "wer=7=8", ""])
def test_a_bad_target_is_one_line(text):
    with pytest.raises(ConfigError, match="target") as err:
        Target.parse(text)
    assert "\n" not in str(err.value)


def test_a_target_of_another_metric_is_refused():
    with pytest.raises(ConfigError, match="predicts wer"):
        predict_steps(
            convergence_profile("bilstm-43m"),
            Setting(algorithm="ssgd", total_batch=256),
            Target(metric="loss", value=1.0),
        )


# ----- the published profile --------------------------------------------------------------------
def test_the_published_profile_reproduces_the_table():
    p = convergence_profile("bilstm-43m")
    pts = p.fit["errors"]["points"]
    assert len(pts) == 6  # the converged cells of Table 1
    for pt in pts:
        assert abs(pt["fitted"] - pt["metric"]) <= 0.15, pt
    t = p.own_target()
    assert str(t) == "wer=7.6"
    for cell in BILSTM_TABLE:
        learners = 8 if cell.algorithm == "hadpsgd" else 1
        o = predict_steps(p, Setting(algorithm=cell.algorithm, total_batch=cell.total_batch, learners=learners), t)
        assert o.reaches == (cell.metric is not None), cell
    # the cases the brief names: SSGD at 64 x 128, AD-PSGD on more than 16 learners, H-ADPSGD 8 x 8
    assert predict_steps(p, Setting(algorithm="ssgd", total_batch=8192), t).short == "batch>4096"
    assert predict_steps(p, Setting(algorithm="adpsgd", total_batch=8192, learners=64), t).short == "learners>16"
    assert predict_steps(p, Setting(algorithm="adpsgd", total_batch=4096, learners=32), t).short == "learners>16"
    h = predict_steps(p, Setting(algorithm="hadpsgd", total_batch=8192, learners=8, staleness_mean=1.0), t)
    assert h.reaches
    lo, hi = h.epochs * math.exp(-1.645 * h.log_sd), h.epochs * math.exp(1.645 * h.log_sd)
    assert lo <= 16 <= hi  # the study trained it 16 epochs to that WER


def test_the_leave_one_out_figures_match_refits_without_the_cell():
    p = convergence_profile("bilstm-43m")
    errors = p.fit["errors"]
    assert errors["loo"]["median_abs"] < 0.1 and errors["loo"]["max_abs"] < 0.25  # WER points
    converged = [c for c in BILSTM_TABLE if c.metric is not None]
    for i, pt in enumerate(errors["points"]):
        rest = [c for c in BILSTM_TABLE if c is not converged[i]]
        q = from_published(
            rest,
            workload="bilstm-43m",
            metric="wer",
            target=7.6,
            target_source="test",
            samples_per_epoch=p.samples_per_epoch,
            floor=Estimate(value=7.0, log_sd=0.05, source="test"),
            metric_sd=0.06,
            families={"sync": ("sgd", "ssgd"), "gossip": ("adpsgd", "hadpsgd")},
        )
        b = pt["total_batch"]
        refit = q.floor.value + q.curve.value * (1 + b / q.noise_scale.value) / 16.0
        assert abs(refit - pt["metric"] * (1 + pt["loo"])) < 0.03, (pt, refit)


# ----- routes from measurement ------------------------------------------------------------------
def _curve(floor, curve, noise, batch, epochs, rng, sd=0.002):
    return floor + curve * (1 + batch / noise) / epochs + rng.normal(0, sd, epochs.size)


def test_a_reference_run_gives_the_curve_and_its_noise_scale(tmp_path, rng):
    epochs = np.linspace(0.2, 8.0, 40)
    loss = _curve(0.3, 0.5, 400.0, 64, epochs, rng)
    (tmp_path / "summary.json").write_text(
        json.dumps(
            {
                "source": "runtime",
                "algorithm": "ssgd",
                "algorithm_params": {},
                "workers": 2,
                "batch_per_worker": 32,
                "samples_per_epoch": 5000.0,
                "noise_scale": 400.0,
                "noise_scale_log_sd": 0.2,
                "heldout_curve": {"epoch": epochs.tolist(), "loss": loss.tolist()},
            }
        )
    )
    commit_run(tmp_path, command="test")
    p = from_reference_run(tmp_path, target=0.45)
    np.testing.assert_allclose(p.floor.value, 0.3, rtol=0.05)
    np.testing.assert_allclose(p.curve.value, 0.5, rtol=0.1)
    assert p.fit["errors"]["loo"]["max_rel"] < 0.02
    o = predict_steps(p, Setting(algorithm="ssgd", total_batch=64), Target(metric="loss", value=0.45))
    np.testing.assert_allclose(o.epochs, 0.5 * (1 + 64 / 400) / 0.15 * 1.0, rtol=0.1)


def test_a_reference_run_without_the_keys_says_which(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"source": "runtime", "workers": 1, "noise_scale": 3.0}))
    commit_run(tmp_path, command="test")
    with pytest.raises(ConfigError, match="lacks heldout_curve, samples_per_epoch, batch_per_worker"):
        from_reference_run(tmp_path)


def _emulated(path, *, algorithm, workers, batch, epochs, loss, staleness=0.0):
    path.mkdir()
    params = {"algorithm": algorithm, "n_workers": workers, "momentum": 0.0, "seed": 0}
    (path / "summary.json").write_text(
        json.dumps(
            {
                "source": "emulator",
                "algorithm": algorithm,
                "algorithm_params": params,
                "workers": workers,
                "staleness_mean": staleness,
            }
        )
    )
    (path / "config.resolved.json").write_text(
        json.dumps({"batch": batch, "steps_per_epoch": 12800 / (workers * batch)})
    )
    np.savez(path / "curves.npz", eval_epoch=epochs, eval_loss=loss)
    commit_run(path, command="test")
    return path


def test_emulated_runs_give_the_noise_scale_and_a_failed_run_a_limit(tmp_path, rng):
    epochs = np.linspace(0.1, 6.0, 30)
    runs = [
        _emulated(
            tmp_path / f"b{b}",
            algorithm="ssgd",
            workers=4,
            batch=b,
            epochs=epochs,
            loss=_curve(0.2, 0.4, 256.0, 4 * b, epochs, rng, sd=0.001),
        )
        for b in (8, 32, 128)
    ]
    runs.append(
        _emulated(
            tmp_path / "diverged",
            algorithm="ssgd",
            workers=4,
            batch=512,
            epochs=epochs,
            loss=np.concatenate([np.linspace(2.0, 3.0, 29), [np.nan]]),
        )
    )
    p = from_emulated_runs(runs, target=0.5)
    np.testing.assert_allclose(p.noise_scale.value, 256.0, rtol=0.25)
    assert p.families[0].limits.max_batch.value == 512  # 4 x 128 converged, 4 x 512 did not
    assert not predict_steps(p, Setting(algorithm="ssgd", total_batch=2048), Target(metric="loss", value=0.5)).reaches
    assert p.fit["errors"]["logo"]["median_rel"] is not None


def _reference(tmp_path, epochs, loss, *, noise_scale=400.0):
    (tmp_path / "summary.json").write_text(
        json.dumps(
            {
                "source": "runtime",
                "algorithm": "ssgd",
                "algorithm_params": {},
                "workers": 2,
                "batch_per_worker": 32,
                "samples_per_epoch": 5000.0,
                "noise_scale": noise_scale,
                "noise_scale_log_sd": 0.4,
                "heldout_curve": {"epoch": list(map(float, epochs)), "loss": list(map(float, loss))},
            }
        )
    )
    commit_run(tmp_path, command="train")  # a reference run is read once committed


def test_a_reference_run_is_anchored_where_it_reached_the_target(tmp_path, rng):
    # an exponential descent (least squares'), which the law K/(m - m_inf) does not follow
    epochs = np.linspace(0.0, 2.0, 41)
    loss = (0.05 + 10.0 * np.exp(-4.0 * epochs)) * np.exp(rng.normal(0, 0.01, epochs.size))
    _reference(tmp_path, epochs, loss)
    target = 0.3
    crossing = float(np.log(10.0 / 0.25) / 4.0)  # where the noiseless curve reaches 0.3
    p = from_reference_run(tmp_path, target=target)
    assert "anchored" in p.curve.source
    o = predict_steps(p, Setting(algorithm="ssgd", total_batch=64), Target(metric="loss", value=target))
    assert o.epochs == pytest.approx(crossing, rel=0.05)
    # at the reference's own batch and target only the crossing's and one run's scatter remain
    assert o.log_sd < 0.1
    # at another batch the noise scale's uncertainty comes back in
    far = predict_steps(p, Setting(algorithm="ssgd", total_batch=4096), Target(metric="loss", value=target))
    assert far.log_sd > o.log_sd and far.epochs > o.epochs


def test_a_target_the_reference_never_reached_is_not_anchored(tmp_path, rng):
    epochs = np.linspace(0.2, 8.0, 40)
    loss = _curve(0.3, 0.5, 400.0, 64, epochs, rng)
    _reference(tmp_path, epochs, loss)
    p = from_reference_run(tmp_path, target=0.31)
    assert "anchored" not in p.curve.source
