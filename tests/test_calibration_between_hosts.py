"""The latency per round between hosts fitted through the simulator
(:func:`psgdlab.calibration.pin_latency_between_hosts`), with the simulator replaced by a known
law so that the estimator itself is checked: it finds the truth within its reported spread,
puts a latency the runs do not need at its bound 0, and changes nothing it has no runs for."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import psgdlab.analysis.load as load
import psgdlab.calibration as calibration
from psgdlab.analysis.calibration_report import Calibration, CalibrationNoise
from psgdlab.calibration import RunRequest, pin_latency_between_hosts
from psgdlab.core.platform.profile import Link, Platform, Profile, Workload

ALPHA0, BETA0, PRIOR_SD, NOISE = 2.5e-4, 6.5e7, 2.0, 0.007
SIZES = (1e6, 3e6, 1e6, 3e6)  # two runs of each size, 4 hosts of one rank: 6 rounds
ROUNDS, SENT = 6, 1.5  # a ring of 4 sends 2 (n - 1) / n of the payload


def _calibration(slope: float = 0.0) -> Calibration:
    span = {
        "latency_s": ALPHA0,
        "bandwidth_bytes_per_s": BETA0,
        "latency_log_sd": PRIOR_SD,
        "bandwidth_log_sd": 0.02,
        "bandwidth_latency_slope": slope,
        "latency_given": True,
        "unpinned": ["latency_s"],
    }
    return Calibration(
        compute={},
        link={},
        nic={"latency_s": ALPHA0, "collective": span},
        between_hosts_busy=tuple(f"run{i}" for i in range(len(SIZES))),
        noise=CalibrationNoise(step_cv_used=NOISE),
    )


def _profile() -> Profile:
    link = Link(latency_s=ALPHA0, bandwidth_bytes_per_s=BETA0)
    return Profile(platform=Platform(hosts=2, devices_per_host=1, collective_between_hosts=link), workload=Workload())


def _law(compute: float):
    """The step of a run of payload S: ``compute`` plus the allreduce of 6 rounds."""

    def step(platform, size):
        link = platform.collective_between_hosts
        return compute + ROUNDS * link.latency_s + SENT * size / link.bandwidth_bytes_per_s

    return step


@pytest.fixture
def runs(monkeypatch):
    """Stand-in runs whose measured mean step ``measure(size)`` is set by each test."""
    state = {}

    def fake_load(path):
        i = int(str(path)[3:])
        return SimpleNamespace(path=path, trace=i)

    monkeypatch.setattr(load, "load_run", fake_load)
    monkeypatch.setattr(calibration, "run_request", lambda run: RunRequest("ssgd", 4, 4, int(SIZES[run.trace]), 1, {}))
    monkeypatch.setattr(calibration, "_step_time_s", lambda trace, batch: state["measure"](SIZES[trace], trace))
    return state


def _predict(step):
    return lambda prof, run, req: step(prof.platform, req.payload_bytes)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ratio=st.floats(0.3, 3.0), noise=st.lists(st.floats(-1.0, 1.0), min_size=4, max_size=4))
def test_the_fit_finds_the_latency_per_round_within_its_reported_spread(runs, ratio, noise):
    """Runs measured at a latency per round ``ratio`` times the messages' (each mean step off by
    up to one run-to-run noise) give that latency within three reported standard deviations,
    pinned, its allreduce no longer at the messages' latency, and the rest of the fit kept."""
    truth, step = ALPHA0 * ratio, _law(0.05)
    measured = Platform(collective_between_hosts=Link(latency_s=truth, bandwidth_bytes_per_s=BETA0))
    runs["measure"] = lambda size, i: step(measured, size) * math.exp(NOISE * noise[i])
    out, report = pin_latency_between_hosts(_calibration(), _profile(), predict=_predict(step))
    span = out["nic"]["collective"]
    assert report["pinned"] and span["unpinned"] == [] and not span["latency_given"]
    assert abs(math.log(span["latency_s"] / truth)) <= 3 * span["latency_log_sd"]
    assert span["latency_log_sd"] < PRIOR_SD and span["bandwidth_bytes_per_s"] == BETA0  # slope 0: unmoved
    assert out["nic"]["latency_s"] == ALPHA0  # the messages' own latency is not this fit's
    assert "fitted through the simulator from 4 runs" in span["latency_source"]


def test_the_bandwidth_moves_with_the_latency_as_its_fit_given_the_latency_does(runs):
    """With a slope, the allreduce's bandwidth at the fitted latency is the one its fit would
    give there, 1/beta = (1 + s (1 - alpha/alpha0)) / beta0, and the two spreads correlate."""
    slope, step = 0.3, _law(0.05)
    runs["measure"] = lambda size, i: step(_profile().platform, size) * 1.02
    out, _ = pin_latency_between_hosts(_calibration(slope), _profile(), predict=_predict(step))
    span = out["nic"]["collective"]
    alpha = span["latency_s"]
    assert span["bandwidth_bytes_per_s"] == pytest.approx(BETA0 / (1 + slope * (1 - alpha / ALPHA0)))
    assert span["log_correlation"] > 0 and span["bandwidth_log_sd"] > 0.02


def test_runs_that_need_no_latency_give_one_far_below_the_messages_or_none(runs):
    """Runs whose allreduces take their bytes' time alone: under the log-normal prior the latency
    per round lands far below the messages' latency; where the runs are all latency (the bytes'
    time next to nothing) even that is too much, and it is at its bound 0, with no spread (as a
    fitted latency at 0 has none)."""
    step = _law(0.05)
    bare = Platform(collective_between_hosts=Link(latency_s=0.0, bandwidth_bytes_per_s=BETA0))
    runs["measure"] = lambda size, i: step(bare, size)
    out, report = pin_latency_between_hosts(_calibration(), _profile(), predict=_predict(step))
    assert out["nic"]["collective"]["latency_s"] < ALPHA0 / 4 and report["pinned"]
    fast = 1e15  # the bytes take no time: the step is the compute and the latency rounds
    runs["measure"] = lambda size, i: _law(1e-4)(
        Platform(collective_between_hosts=Link(bandwidth_bytes_per_s=fast)), size
    )
    link = Link(latency_s=ALPHA0, bandwidth_bytes_per_s=fast)
    profile = Profile(platform=Platform(hosts=2, collective_between_hosts=link), workload=Workload())
    calib = _calibration()
    calib.nic["collective"]["bandwidth_bytes_per_s"] = fast
    out, report = pin_latency_between_hosts(calib, profile, predict=_predict(_law(1e-4)))
    span = out["nic"]["collective"]
    assert span["latency_s"] == 0.0 and span["latency_log_sd"] is None and report["pinned"]
    assert "at its bound 0" in span["latency_source"]


def test_nothing_to_fit_changes_nothing(runs):
    """No runs beyond the cores, a latency the link fit pinned, or runs that want more latency
    than the grid holds: the calibration comes back as it was."""
    step = _law(0.05)
    runs["measure"] = lambda size, i: step(_profile().platform, size)
    idle = dataclasses.replace(_calibration(), between_hosts_busy=())
    assert pin_latency_between_hosts(idle, _profile(), predict=_predict(step)) == (idle, None)
    pinned = _calibration()
    pinned.nic["collective"] = {**pinned.nic["collective"], "latency_given": False, "unpinned": []}
    assert pin_latency_between_hosts(pinned, _profile(), predict=_predict(step)) == (pinned, None)
    far = Platform(collective_between_hosts=Link(latency_s=ALPHA0 * 100, bandwidth_bytes_per_s=BETA0))
    runs["measure"] = lambda size, i: step(far, size)
    out, report = pin_latency_between_hosts(_calibration(), _profile(), predict=_predict(step))
    assert out.nic == _calibration().nic and not report.pinned
