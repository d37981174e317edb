"""Failures in the simulator and the predictor: closed forms, accounting, seeded draws, errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.cli import main
from psgdlab.core.algorithms import make_algorithm
from psgdlab.core.errors import ConfigError
from psgdlab.core.graphs.membership import rebuild
from psgdlab.core.platform.failure import Failure, check_failures, check_on_failure, default_on_failure, draw_failures
from psgdlab.core.records.trace import PHASES
from psgdlab.sim.engine import FailureSpec, simulate
from psgdlab.sim.failures import FailureRequest, failure_window
from psgdlab.sim.platform import Link, Platform
from psgdlab.sim.predict import predict_one
from psgdlab.sim.workload import SimConfig, Workload

COMPUTE_S = 0.1
BATCH = 32


def flat(*, failure_detection_s: float = 600.0, restart_s: float = 20.0) -> Platform:
    """One host of 8 devices on unshared links; the averages (about 10 ms) hide under the
    compute (0.1 s), so every step of a gossip worker takes exactly the compute time."""
    nvlink = Link(latency_s=1e-5, bandwidth_bytes_per_s=1e9)
    return Platform(
        name="flat",
        hosts=1,
        devices_per_host=8,
        nvlink=nvlink,
        failure_detection_s=failure_detection_s,
        restart_s=restart_s,
    )


def work():
    return Workload(
        n_params=2_500_000, compute=str(COMPUTE_S), batch_per_worker=BATCH, reference_batch=BATCH, epochs=10.0
    )


def mid_step(algorithm, rank, step):
    """The middle of ``rank``'s compute of ``step`` in the run without failures."""
    trace = simulate(algorithm, flat(), work(), steps=step + 5).trace
    row = trace[(trace["phase"] == PHASES["compute"]) & (trace["rank"] == rank) & (trace["step"] == step)][0]
    return 0.5 * (float(row["start_s"]) + float(row["end_s"]))


# ----- closed forms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [2, 3])  # passive and active on the fixed ring
def test_adpsgd_after_a_death_runs_at_n_minus_1_over_n(rank):
    """Every survivor still does one step per compute time (the idle survivor of a round just
    computes), so the throughput after is exactly 7/8 of 8 b / c; over a measured span L each
    survivor's count of steps is off by at most one at either end: relative tolerance 2c/L."""
    a = make_algorithm("adpsgd", n_workers=8)
    config = SimConfig(platform=flat(failure_detection_s=1.0), workload=work())
    e = failure_window(a, config, dead=(), rank=rank, window=120, step_time_s=COMPUTE_S, seed=0)
    expected = 7 * BATCH / COMPUTE_S
    assert e.rate_after == pytest.approx(expected, rel=2 * COMPUTE_S / e.measured_s)
    assert e.survivors == tuple(r for r in range(8) if r != rank)


@pytest.mark.parametrize("rank, waiting", [(2, 2), (3, 0)])
def test_adpsgd_stall_is_the_detection_time_of_the_neighbours_that_must_start_an_average(rank, waiting):
    """On the fixed ring odd ranks start the averages. A dead passive rank leaves its two active
    neighbours waiting the whole detection time D while the other survivors go on: the stall, in
    seconds of the survivors' throughput, is 2 D / (n - 1). A dead active rank blocks nobody: its
    passive neighbours only answer.

    Bounds: a waiting neighbour starts to wait at its first round with the dead rank (half a step
    to a step and a half after the death, c = compute time) and its compute of that step overlaps
    the wait, so it loses between D - 2.5 c and D - c. The throughput after, X1, is counted over
    L seconds, each survivor's steps off by at most one at either end: relative error 2c/L, which
    moves the stall by at most (t_a - t_f) 2c/L, with t_a - t_f = D + L/4 (the settling time is a
    fifth of the time after the detection, L the other four fifths)."""
    a = make_algorithm("adpsgd", n_workers=8)
    c, D = COMPUTE_S, 5.0
    config = SimConfig(platform=flat(failure_detection_s=D), workload=work())
    e = failure_window(a, config, dead=(), rank=rank, window=300, step_time_s=c, seed=0)
    slack = (D + e.measured_s / 4) * 2 * c / e.measured_s
    assert waiting * (D - 2.5 * c) / 7 - slack <= e.stall_s <= waiting * (D - c) / 7 + slack


def test_dpsgd_survivors_stall_for_the_detection_and_lose_nothing_else():
    """D-PSGD blocks on its neighbours: the dead one's neighbours wait for the whole detection
    time, the others as soon as they need those; the stall is at most the detection time plus a step."""
    a = make_algorithm("dpsgd", n_workers=8)
    D = 2.0
    config = SimConfig(platform=flat(failure_detection_s=D), workload=work())
    e = failure_window(a, config, dead=(), rank=5, window=90, step_time_s=0.11, seed=0)
    assert D - 0.2 <= e.stall_s <= D + 0.2


def test_a_detection_longer_than_the_window_is_priced_at_the_waiting_throughput():
    """D-PSGD waits out the whole detection: the part beyond the simulated window (9.9 s of 60 s)
    is priced at the throughput while waiting (none), so the stall is the detection time again."""
    a = make_algorithm("dpsgd", n_workers=8)
    config = SimConfig(platform=flat(failure_detection_s=60.0), workload=work())
    e = failure_window(a, config, dead=(), rank=5, window=90, step_time_s=0.11, seed=0)
    assert 60.0 - 0.2 <= e.stall_s <= 60.0 + 0.2


def test_gossip_loses_only_the_dead_workers_unshared_steps():
    """Lost = the step in flight + applied steps no exchange carried out before the death. AD-PSGD's
    active side averages at the start of each step the model holding every earlier step: dying in
    mid-step loses only the step in flight. D-PSGD sends the model before applying the step's
    gradient: the last applied step is lost as well."""
    for name, rank, unshared in (("adpsgd", 3, 0), ("dpsgd", 3, 1)):
        a = make_algorithm(name, n_workers=8)
        t = mid_step(a, rank, 30)
        res = simulate(a, flat(), work(), steps=80, failures=FailureSpec(failures=(Failure(rank, t),), detection_s=0.5))
        f = res.extras["failures"]
        assert f["steps_in_flight"][rank] == 1
        assert f["steps_lost"][rank] == 1 + unshared, name
        assert f["steps_applied"][rank] == 30
        assert sum(f["steps_lost"]) == f["steps_lost"][rank]  # survivors lose nothing
        (change,) = f["membership_changes"]
        assert change["removed"] == [rank] and change["time_s"] == pytest.approx(t + 0.5)


def test_ssgd_stop_ends_at_detection_and_keeps_the_last_checkpoint():
    """The run ends ``detection_s`` after the death; the steps since the last complete checkpoint
    (every 7 steps) are lost on every worker, the step in flight included."""
    a = make_algorithm("ssgd", n_workers=4)
    step = simulate(a, flat(), work(), steps=10).meta["window_end_s"] / 10
    t, D = 23.5 * step, 0.7
    res = simulate(
        a,
        flat(),
        work(),
        steps=200,
        failures=FailureSpec(failures=(Failure(1, t),), policy="stop", detection_s=D, checkpoint_every=7),
    )
    f = res.extras["failures"]
    assert f["stopped_at_s"] == pytest.approx(t + D) and res.meta["window_end_s"] == pytest.approx(t + D)
    assert f["checkpoint_step"] == 21  # 23 steps done when rank 1 died
    assert f["steps_kept"] == [21] * 4
    assert f["steps_lost"] == [s - 21 for s in f["steps_started"]]
    assert f["steps_started"][1] == 24  # it died in step 23


def _row(name, n=4, **failures):
    config = SimConfig(platform=flat(failure_detection_s=5.0, restart_s=40.0), workload=work())
    return config, predict_one(name, n, config, steps=30, intervals=False, failures=FailureRequest(**failures)).row


def test_restart_costs_detection_relaunch_reload_and_the_steps_since_the_checkpoint():
    config, row = _row("ssgd", failures=(Failure(2, 1000.0),), policy="restart", checkpoint_every=50)
    f = row["failures"]
    ckpt_s = config.workload.payload_bytes / config.platform.checkpoint_bytes_per_s
    step = row["step_time_s"] + ckpt_s / 50
    reached = 1000.0 / step
    c = (int(reached) // 50) * 50
    (change,) = f["membership_changes"]
    assert change["resumed_from_step"] == c and change["steps_lost"] == math.ceil(reached) - c
    assert change["time_to_first_step_s"] == pytest.approx(5.0 + 40.0 + ckpt_s + step)
    assert f["steps_lost"] == 4 * (math.ceil(reached) - c)
    cost = 5.0 + 40.0 + ckpt_s + (reached - c) * step
    assert f["time_to_train_s"] - f["time_to_train_without_failures_s"] == pytest.approx(cost, rel=1e-9)
    assert f["throughput_after_ratio"] == 1.0 and f["survivors"] == [0, 1, 2, 3]


def test_stop_prediction_says_the_run_ends():
    _, row = _row("bmuf", failures=(Failure(0, 100.0), Failure(1, 200.0)), checkpoint_every=10)
    f = row["failures"]
    assert f["policy"] == "stop" and f["time_to_train_s"] is None
    assert f["stopped_at_s"] == pytest.approx(105.0)
    assert len(f["membership_changes"]) == 1  # the run is over after the first


def test_failure_after_the_end_of_training_costs_nothing():
    _, row = _row("adpsgd", failures=(Failure(1, 1e9),))
    f = row["failures"]
    assert f["membership_changes"] == [] and f["time_to_train_s"] == pytest.approx(row["time_to_train_s"])


# ----- random failures -----------------------------------------------------------------------------
def test_failure_draws_are_seeded_and_follow_the_rate():
    a = draw_failures(0.5, 16, horizon_s=1e5, seed=3)
    assert a == draw_failures(0.5, 16, horizon_s=1e5, seed=3)
    assert a != draw_failures(0.5, 16, horizon_s=1e5, seed=4)
    assert a != draw_failures(0.5, 16, horizon_s=1e5, seed=3, draw=1)
    assert sorted(f.rank for f in a) == list(range(16))  # each worker once (no restart)
    # a longer horizon adds failures and keeps the earlier ones
    short = draw_failures(0.5, 16, horizon_s=3600.0, seed=3)
    assert set(short) <= set(a) and all(f.time_s < 3600.0 for f in short)
    # restart: each rank a Poisson process of rate 0.5 per hour: 16 x 0.5 x 200 h = 1600 expected
    many = draw_failures(0.5, 16, horizon_s=200 * 3600.0, seed=0, restart=True)
    assert abs(len(many) - 1600) < 4 * math.sqrt(1600)
    assert draw_failures(0.0, 4, horizon_s=1e9, seed=0) == ()


def test_random_failure_prediction_is_deterministic():
    kw = dict(rate_per_worker_hour=2.0, draws=4, policy="restart", checkpoint_every=100)
    _, one = _row("ssgd", **kw)
    _, two = _row("ssgd", **kw)
    assert one["failures"]["random"] == two["failures"]["random"]
    rnd = one["failures"]["random"]
    assert rnd["finished_fraction"] == 1.0
    assert rnd["time_to_train_mean_s"] > one["failures"]["time_to_train_without_failures_s"]


def test_restarts_that_never_catch_up_do_not_finish():
    """Without checkpoints every restart begins again; failures every 18 s on average against a
    run of more than ten minutes: no draw finishes, and the prediction says so (and ends)."""
    _, row = _row("ssgd", rate_per_worker_hour=50.0, draws=2, policy="restart")
    rnd = row["failures"]["random"]
    assert rnd["finished_fraction"] == 0.0 and rnd["time_to_train_mean_s"] is None


# ----- any sequence of failures ----------------------------------------------------------------------
CASES = [
    ("adpsgd", 6, {}),
    ("adpsgd", 8, {"variant": "random"}),
    ("dpsgd", 5, {}),
    ("hadpsgd", 8, {"gpus_per_node": 2}),
]


@given(
    case=st.sampled_from(CASES),
    data=st.data(),
    detection_s=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_any_failures_leave_consistent_survivors_and_account_for_every_step(case, data, detection_s):
    name, n, kw = case
    ranks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n - 1, unique=True), label="ranks")
    times = data.draw(st.lists(st.floats(0.0, 2.0), min_size=len(ranks), max_size=len(ranks)), label="times")
    a = make_algorithm(name, n_workers=n, **kw)
    failures = tuple(Failure(r, t) for r, t in zip(ranks, times, strict=True))
    spec = FailureSpec(failures=failures, detection_s=detection_s)
    res = simulate(a, flat(), work(), steps=30, gpus_per_node=8, failures=spec)
    f = res.extras["failures"]
    survivors = sorted(set(range(n)) - set(ranks))
    assert f["survivors"] == survivors and sorted(f["dead"]) == sorted(ranks)
    topology = a.membership_topology()
    assert topology is not None and rebuild(topology, survivors).members == tuple(survivors)
    for r in range(n):
        in_progress = f["steps_started"][r] - f["steps_applied"][r] if r in survivors else 0
        assert f["steps_kept"][r] + f["steps_lost"][r] + in_progress == f["steps_started"][r]
        assert f["steps_kept"][r] >= 0 and f["steps_lost"][r] >= (0 if r in survivors else f["steps_in_flight"][r])
        assert r not in survivors or f["steps_lost"][r] == 0
    # after the last detection nobody exchanges with the dead
    last = max(c["time_s"] for c in f["membership_changes"])
    late = res.trace[(res.trace["start_s"] > last + 1e-9) & (res.trace["peer"] >= 0)]
    assert set(late["peer"].tolist()) <= set(survivors) and set(late["rank"].tolist()) <= set(survivors)


def test_gossip_flag_and_membership_topology_agree():
    """core.failure's policy check reads ``gossip``; the simulator rebuilds ``membership_topology``."""
    from psgdlab.core.algorithms import ALGORITHMS

    for name, cls in ALGORITHMS.items():
        n = 1 if name == "sgd" else 4
        a = make_algorithm(name, n_workers=n, **({"gpus_per_node": 2} if name == "hadpsgd" else {}))
        assert cls.gossip == (a.membership_topology() is not None), name


@given(case=st.sampled_from(CASES), data=st.data(), step=st.integers(0, 50))
def test_survivor_exchanges_pair_survivors_only_and_mix_by_columns(case, data, step):
    """Every peer is a survivor; a gossip column sums to 1; singleton pairs are mutual with
    exactly one active side (nodes of unequal size pair member l with l mod m')."""
    from psgdlab.core.exchange import Gossip, PairwiseAverage
    from psgdlab.core.graphs.membership import survivor_exchanges

    name, n, kw = case
    a = make_algorithm(name, n_workers=n, **kw)
    dead = data.draw(st.sets(st.integers(0, n - 1), max_size=n - 1), label="dead")
    alive = [r for r in range(n) if r not in dead]
    topology = a.membership_topology()
    assert topology is not None
    rb = rebuild(topology, alive)
    ex = {r: survivor_exchanges(rb, a.exchanges(step, r), r, step) for r in alive}
    pairs = {}
    for r, exs in ex.items():
        for e in exs:
            peers = e.peers if isinstance(e, Gossip) else (e.peer,) if isinstance(e, PairwiseAverage) else e.group
            assert set(peers) <= set(alive)
            if isinstance(e, Gossip):
                assert e.self_weight + sum(e.weights) == pytest.approx(1.0, abs=1e-12)
            if isinstance(e, PairwiseAverage):
                pairs[r] = e
    if all(len(node) == 1 for node in rb.nodes):
        for r, e in pairs.items():
            assert pairs[e.peer].peer == r and pairs[e.peer].active != e.active


# ----- checks and errors ----------------------------------------------------------------------------
def test_policy_and_failure_checks():
    assert default_on_failure("hadpsgd") == "continue" and default_on_failure("bmuf") == "stop"
    with pytest.raises(ConfigError, match=r"needs a gossip algorithm .*, not ssgd"):
        check_on_failure("ssgd", "continue")
    with pytest.raises(ConfigError, match=r"names no worker of 4"):
        check_failures([Failure(4, 1.0)], 4, policy="stop")
    with pytest.raises(ConfigError, match="names a rank twice"):
        check_failures([Failure(1, 1.0), Failure(1, 2.0)], 4, policy="continue")
    with pytest.raises(ConfigError, match="one must survive"):
        check_failures([Failure(r, 1.0) for r in range(4)], 4, policy="continue")
    assert len(check_failures([Failure(1, 1.0), Failure(1, 2.0)], 4, policy="restart")) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--fail", "9@10"], "fail ('9@10') names no worker of 8"),
        (["--fail", "1@-5"], "needs a finite time >= 0 seconds"),
        (["--fail", "1@soon"], "must be RANK@SECONDS"),
        (["--algorithm", "ssgd", "--fail", "1@5", "--on-failure", "continue"], "not ssgd; use stop or restart"),
        (["--algorithm", "ssgd", "--on-failure", "continue"], "not ssgd; use stop or restart"),
        (["--failure-draws", "3"], "needs --fail or --failure-rate"),
        (["--failure-rate", "-1"], "failure-rate (-1.0) must be"),
        (["--fail", "1@5", "--checkpoint-every", "-3"], "checkpoint-every (-3) must be"),
    ],
)
def test_bad_failure_flags_exit_2_with_one_line(tmp_path, capsys, argv, message):
    base = ["predict", "--out", str(tmp_path / "x"), "--workers", "8", "--steps", "20"]
    assert main([*base, *(["--algorithm", "adpsgd"] if "--algorithm" not in argv else []), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_predict_prices_the_protocol_of_the_policy_without_a_failure(tmp_path, capsys):
    """``--on-failure continue`` alone prices a run that loses nobody under the survivors'
    protocol: H-ADPSGD's nodes sum their slices with the gradient (twice the model's bytes in
    the node's allreduce); stop, the default without a failure, allgathers them."""
    argv = [
        "predict",
        "--algorithm",
        "hadpsgd",
        "--workers",
        "16",
        "--workers-per-node",
        "8",
        "--steps",
        "20",
        "--json",
    ]
    rows = {}
    for policy in ("stop", "continue"):
        assert main([*argv, "--on-failure", policy, "--out", str(tmp_path / policy)]) == 0
        (rows[policy],) = json.loads(capsys.readouterr().out)["rows"]
    assert "failures" not in rows["continue"]
    assert rows["continue"]["step_time_s"] != rows["stop"]["step_time_s"]


def test_predict_json_and_text_carry_the_failure_keys(tmp_path, capsys):
    argv = ["predict", "--algorithm", "adpsgd,ssgd", "--workers", "1,4", "--steps", "20", "--fail", "2@600"]
    assert main([*argv, "--json", "--out", str(tmp_path / "j")]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert "failures" not in rows[0]  # one worker: the speedup baseline
    f = next(r for r in rows if r["algorithm"] == "adpsgd" and r["workers"] == 4)["failures"]
    for key in (
        "membership_changes",
        "survivors",
        "steps_lost",
        "samples_lost",
        "throughput_before_samples_per_s",
        "throughput_after_samples_per_s",
        "throughput_after_ratio",
        "time_to_train_s",
    ):
        assert key in f
    assert f["survivors"] == [0, 1, 3] and f["membership_changes"][0]["removed"] == [2]
    change = f["membership_changes"][0]
    assert {"time_s", "step", "removed", "detection_s", "stall_s"} <= set(change)
    assert change["steps_lost"] == change["steps_in_flight"] + change["steps_unshared"] == f["steps_lost"]
    s = next(r for r in rows if r["algorithm"] == "ssgd" and r["workers"] == 4)["failures"]
    assert s["policy"] == "stop" and s["time_to_train_s"] is None
    assert main([*argv, "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "adpsgd x4: on failure continue" in out and "the run stops at" in out
    assert np.isfinite(f["throughput_after_ratio"])
