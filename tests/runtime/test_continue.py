"""``--on-failure continue``: the survivors of a gossip run go on without a dead worker.

The distributed cases inject the failure with ``PSGDLAB_TEST_CRASH=RANK:STEP[:STOP]``
(:data:`psgdlab.runtime.loop.driver.CRASH_ENV`), which notes the wall time of the failure in
``OUT/.ranks/rank{r}.crash``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from psgdlab.core.errors import ConfigError, TransportError
from psgdlab.core.exchange import AllReduce, ExchangeKind, PairwiseAverage, wire_bytes
from psgdlab.core.graphs.membership import rebuild, survivor_exchanges
from psgdlab.core.platform.failure import node_sum_elements
from psgdlab.core.records.trace import PHASES, read_trace
from psgdlab.runtime.config import build_algorithm
from psgdlab.runtime.failures.stop import process_state
from psgdlab.runtime.failures.survive.mailbox import BEATS_PER_DEADLINE, Mailbox
from psgdlab.runtime.failures.survive.survivors import SWITCH_AFTER_WORKERS
from psgdlab.tests.runtime._runtime_helpers import leftover_segments, lsq_config


# ----- the mailbox: control messages and detection --------------------------------------------------
def _mailboxes(n: int, deadline_s: float) -> tuple[list[Mailbox], list[list[tuple[int, str]]]]:
    lost: list[list[tuple[int, str]]] = [[] for _ in range(n)]
    boxes = [
        Mailbox(r, n, host="127.0.0.1", deadline_s=deadline_s, on_lost=lambda p, why, s, r=r: lost[r].append((p, why)))
        for r in range(n)
    ]
    addresses = [b.address for b in boxes]
    threads = [threading.Thread(target=b.open, args=(addresses,), kwargs={"deadline_s": 10.0}) for b in boxes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return boxes, lost


def _until(condition, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_the_mailbox_files_requests_replies_and_done():
    boxes, lost = _mailboxes(3, deadline_s=5.0)
    try:
        assert boxes[1].send(0, ("request", 7, 0))
        assert boxes[0].requests.get(timeout=5) == (1, ("request", 7, 0))
        assert boxes[0].send(1, ("reply", 5, True, 0))
        assert boxes[1].replies[0].get(timeout=5) == ("reply", 5, True, 0)
        boxes[2].broadcast([0, 1, 2], ("done", 9))
        assert _until(lambda: 2 in boxes[0].done and 2 in boxes[1].done)
        assert boxes[0].steps == {1: 7, 2: 9} and boxes[1].steps[0] == 5  # every message says its step
        assert lost == [[], [], []]
    finally:
        for b in boxes:
            b.close()


def test_the_mailbox_set_up_has_a_deadline_and_names_the_ranks_that_did_not_connect():
    """A peer that never opens its mailbox (died or hung in set-up) does not hang the others: the
    set-up ends at its deadline with an error naming it, in both directions."""
    boxes = [Mailbox(r, 3, host="127.0.0.1", deadline_s=5.0, on_lost=lambda *a: None) for r in range(3)]
    addresses = [b.address for b in boxes]
    boxes[2]._listener.close()  # rank 2 never accepts, never connects
    errors: list[BaseException] = []

    def open_box(b: Mailbox) -> None:
        try:
            b.open(addresses, deadline_s=1.0)
        except TransportError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_box, args=(b,)) for b in boxes[:2]]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert time.monotonic() - t0 < 5 and not any(t.is_alive() for t in threads)
    assert sorted(str(e).split(":")[0] for e in errors) == ["rank 0", "rank 1"]
    for e in errors:
        assert "could not connect to ranks [2]" in str(e) and "ranks [2] never connected" in str(e)


def test_a_closed_connection_is_a_death_until_the_end_is_announced():
    boxes, lost = _mailboxes(3, deadline_s=5.0)
    try:
        boxes[2].close()  # without finish(): as a killed process's connections end
        assert _until(lambda: lost[0] and lost[1])
        assert lost[0] == [(2, "rank 2 died (its connection closed)")] and lost[1][0][0] == 2
        assert boxes[0].replies[2].get(timeout=1) == ("lost",)  # an active side waiting on it wakes
        for b in boxes[:2]:
            b.finish()
        boxes[1].close()
        time.sleep(0.3)
        assert [p for p, _ in lost[0]] == [2]  # rank 1 left after the end: not a death
    finally:
        for b in boxes:
            b.close()


def test_a_silent_peer_is_lost_at_the_deadline():
    deadline = 0.6
    boxes, lost = _mailboxes(2, deadline_s=deadline)
    try:
        boxes[1]._closed.set()  # its heartbeat stops, its connections stay open: a stopped process
        start = time.monotonic()
        assert _until(lambda: lost[0], timeout_s=5)
        assert deadline - 0.1 < time.monotonic() - start < deadline + 1.0
        assert lost[0][0][0] == 1 and "sent nothing for" in lost[0][0][1]
    finally:
        for b in boxes:
            b.close()


def test_a_held_up_dispatcher_does_not_take_its_delay_for_silence():
    """The reader of a rank stalls past the deadline (a slow disk, a busy machine): its peers'
    heartbeats wait unread in the sockets, and nobody is lost for it."""
    deadline = 0.5
    boxes, lost = _mailboxes(3, deadline_s=deadline)
    original = boxes[0]._file
    stalled = threading.Event()

    def slow_file(peer, message):
        if not stalled.is_set():
            stalled.set()
            time.sleep(3 * deadline)
        original(peer, message)

    boxes[0]._file = slow_file  # type: ignore[method-assign]
    try:
        assert _until(stalled.is_set)
        time.sleep(4 * deadline)
        assert lost[0] == [] and not boxes[0].lost
    finally:
        for b in boxes:
            b.close()


# ----- the schedule the survivors follow -----------------------------------------------------------
def test_survivors_follow_the_simulators_rebuilt_schedule(tmp_path):
    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.runtime.failures.survive.survivors import Survivors

    alg = make_algorithm("adpsgd", n_workers=6)
    members = [
        Survivors(alg, rank=r, run_dir=tmp_path, deadline_s=5, host="127.0.0.1", origin=time.time()) for r in (0, 3)
    ]
    try:
        assert members[0].exchanges(4) == alg.exchanges(4, 0)  # everyone alive: the original schedule
        members[1].remove(2, "test")
        rebuilt = rebuild(alg.membership_topology(), (0, 1, 3, 4, 5))
        for step in range(12):
            for m in members:
                assert m.exchanges(step) == survivor_exchanges(rebuilt, alg.exchanges(step, m.rank), m.rank, step)
        (change,) = members[0].history()
        assert change["removed"] == [2] and change["by"] == 3 and change["epoch"] == 1
    finally:
        for m in members:
            m.close()


def test_a_blocking_gossip_drops_the_dead_until_the_switch_step(tmp_path):
    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.core.errors import TransportError
    from psgdlab.core.graphs.membership import without_peers
    from psgdlab.runtime.failures.survive.survivors import Survivors

    alg = make_algorithm("dpsgd", n_workers=5)  # a ring
    a, b = (
        Survivors(alg, rank=r, run_dir=tmp_path, deadline_s=5, host="127.0.0.1", origin=time.time()) for r in (0, 4)
    )
    try:
        a.exchanges(10)
        a.remove(1, "test")  # proposed at step 10: the ring of 4 from step 10 + 2 * 5 + 2
        switch = 10 + SWITCH_AFTER_WORKERS * 5 + 2
        assert a.agreement.current.switch_step == switch
        rebuilt = rebuild(alg.membership_topology(), (0, 2, 3, 4))
        for member in (a, b):
            r = member.rank
            before = member.exchanges(switch - 1)
            assert before == tuple(without_peers(ex, {1}) for ex in alg.exchanges(switch - 1, r))
            after = member.exchanges(switch)
            assert after == survivor_exchanges(rebuilt, alg.exchanges(switch, r), r, switch)
        assert a.exchanges(switch - 1)[0].peers == (4,) and a.exchanges(switch)[0].peers == (2, 4)
        a.remove(3, "test")  # a member that reads an epoch after its switch step stops
        late = Survivors(alg, rank=2, run_dir=tmp_path, deadline_s=5, host="127.0.0.1", origin=time.time())
        with pytest.raises(TransportError, match="after its switch step"):
            late.exchanges(switch + SWITCH_AFTER_WORKERS * 5 + 3)
        late.close()
    finally:
        a.close()
        b.close()


def test_the_work_a_dead_rank_lost_runs_from_its_last_exchange_to_its_last_word():
    from psgdlab.runtime.failures.survive.survivors import work_lost

    changes = [{"removed": [2]}, {"removed": [3]}]
    reports = [
        {"heard": {2: 40, 3: 12}, "shared": {2: 35}},  # rank 3 never exchanged with this survivor
        {"heard": {2: 38, 3: 15}, "shared": {2: 37, 3: 9}},
    ]
    work_lost(changes, reports)
    assert changes[0]["steps_lost"] == {2: 40 - 37 + 1} and changes[1]["steps_lost"] == {3: 15 - 9 + 1}
    alone = [{"removed": [1]}]
    work_lost(alone, [{"heard": {1: 4}, "shared": {}}])
    assert alone[0]["steps_lost"] == {1: 5}  # never shared: every step it did


def test_the_survivors_throughput_is_their_pace_before_and_after():
    from psgdlab.core.records.trace import TraceBuilder
    from psgdlab.runtime.failures.survive.survivors import survivor_throughput

    tb = TraceBuilder()
    for rank in (0, 1, 3):  # 10 steps/s each until 5 s, then 5 steps/s; rank 3 goes on alone
        t = 0.0
        step = 0
        while t < (10 if rank != 3 else 14):
            if t >= 10:  # alone after the others finished: outside the window
                tb.add(rank=rank, step=step, phase="compute", start_s=t, end_s=t + 0.05, staleness=0, loss=1.0)
                t += 0.05
                step += 1
                continue
            dt = 0.1 if t < 5 else 0.2
            tb.add(rank=rank, step=step, phase="compute", start_s=t, end_s=t + dt, staleness=0, loss=1.0)
            t += dt
            step += 1
    change = {"time_s": 6.0, "detection_s": 1.0, "removed": [2]}
    out = survivor_throughput(tb.array(), [change], samples_per_step=4)
    assert out["throughput_before"] == pytest.approx(3 * 10 * 4, rel=0.05)
    assert out["throughput_after"] == pytest.approx(3 * 5 * 4, rel=0.05)
    assert out["throughput_after_ratio"] == pytest.approx(0.5, rel=0.07)


# ----- what continue refuses -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(algorithm="adpsgd", backend="mpi"), "needs --backend gloo"),
        (dict(algorithm="dpsgd", hosts=2), "for dpsgd runs on one host"),
        (dict(algorithm="ssgd"), "needs a gossip algorithm"),
    ],
)
def test_continue_refuses_what_it_cannot_do(tmp_path, kw, message):
    from psgdlab.runtime.config import TrainConfig

    base = dict(workers=4, steps=10, on_failure="continue", out=str(tmp_path))
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{**base, **kw})
    del base["on_failure"]  # not asked for: gossip goes on where it can, and otherwise stops
    if kw["algorithm"] != "ssgd":
        assert TrainConfig(**{**base, "algorithm": kw["algorithm"]}).failure_policy == "continue"
    assert TrainConfig(**{**base, **kw}).failure_policy == "stop"


def test_the_default_policy_is_continue_for_gossip_with_a_run_directory(tmp_path):
    from psgdlab.runtime.config import TrainConfig

    assert TrainConfig(algorithm="adpsgd", workers=4, steps=10, out=str(tmp_path)).failure_policy == "continue"
    assert TrainConfig(algorithm="adpsgd", workers=4, steps=10).failure_policy == "stop"  # no membership directory
    asked = TrainConfig(algorithm="dpsgd", workers=4, steps=10, out=str(tmp_path), on_failure="stop")
    assert asked.failure_policy == "stop" and asked.replace(backend="mpi").failure_policy == "stop"
    assert TrainConfig(algorithm="bmuf", workers=4, steps=10, out=str(tmp_path)).failure_policy == "stop"
    nodes = TrainConfig(algorithm="hadpsgd", workers=4, gpus_per_node=2, steps=10, out=str(tmp_path))
    assert nodes.failure_policy == "continue"  # nodes of several GPUs too


# ----- runs that lose a worker -----------------------------------------------------------------------
def _continue_run(
    tmp_path,
    crash: str,
    *,
    steps: int,
    deadline_s: float = 10.0,
    algorithm: str = "adpsgd",
    on_failure: str = "continue",
    workers: int = 4,
    **kw,
):
    from psgdlab.runtime.launcher.launch import launch

    config = lsq_config(
        tmp_path, algorithm, workers, steps=steps, compute_time="0.01", on_failure=on_failure, **kw
    ).replace(timeout_s=deadline_s, record_params=False)
    summary = launch(config, quiet=True, timeout_s=90, extra_env={"PSGDLAB_TEST_CRASH": crash})
    out = Path(config.out)
    injected = float((out / ".ranks" / f"rank{crash.split(':')[0].split(',')[0]}.crash").read_text().split()[0])
    return config, summary, injected


def _check_survivors_finished(config, figures, dead: int, steps: int, died_at: int | None = None) -> None:
    out = Path(config.out)
    survivors = [r for r in range(4) if r != dead]
    assert figures["survivors"] == survivors
    (change,) = figures["membership_changes"]
    assert change["removed"] == [dead] and change["epoch"] == 1
    lost = change["steps_lost"][str(dead)]  # its steps since its last exchange, the one in flight included
    assert 1 <= lost <= (died_at + 1 if died_at is not None else steps)
    assert change["samples_lost"] == lost * config.batch
    trace, _ = read_trace(out / "trace.npz")
    compute = trace[trace["phase"] == 0]
    for r in survivors:  # each survivor did every step: no work of theirs lost
        assert np.count_nonzero(compute["rank"] == r) == steps
    curve = figures["loss_curve"]["loss"]
    assert np.mean(curve[-5:]) < 0.5 * np.mean(curve[:5])  # the loss still falls
    windows = {k: figures[k] for k in ("throughput_before", "throughput_after")}  # None: a window held no step
    first = {int(r): float(compute["end_s"][compute["rank"] == r].min()) for r in survivors}
    assert (figures["throughput_after_ratio"] or 0) > 0.5, (windows, change, first)
    assert (out / "membership" / "epoch00000001.json").is_file()
    _, meta = read_trace(out / "trace.npz")  # the trace records the change too, and the timeline marks it
    assert meta["membership_changes"] == figures["membership_changes"] and meta["survivors"] == survivors
    timeline = json.loads((out / "timeline.json").read_text())["traceEvents"]
    assert [e["name"] for e in timeline if e["ph"] == "i"] == [f"membership: removed [{dead}]"]
    assert not leftover_segments(out)
    assert not list(out.rglob(".*.tmp*"))
    pid = int((out / ".ranks" / f"rank{dead}.pid").read_text())
    assert process_state(pid) is None  # the dead (or stopped) worker's process is gone


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_survivors_go_on_without_a_killed_worker(tmp_path):
    # the others are still training when it dies (an AD-PSGD worker may lag far behind on a busy machine)
    config, figures, _ = _continue_run(tmp_path, "2:100", steps=300, on_failure="")  # adpsgd's default
    assert figures["on_failure"] == "continue"
    _check_survivors_finished(config, figures, dead=2, steps=300, died_at=100)
    # seen at once (its connection ended, or its exchange failed), not at the 10 s deadline: at most the
    # time since its last heartbeat
    assert figures["membership_changes"][0]["detection_s"] < 10.0 / BEATS_PER_DEADLINE + 0.5


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_a_run_does_not_read_the_membership_an_earlier_run_left_in_its_directory(tmp_path):
    """The directory of a ``--resume`` holds the last segment's epochs, results and summary: read
    as this run's, an epoch would fence a live rank and the summary would end the survivors before
    they train. Rank 0 clears them at set-up: all four ranks train and write a new summary."""
    from psgdlab.runtime.launcher.launch import launch

    config = lsq_config(tmp_path, "hadpsgd", 4, steps=8)  # one GPU per node: continue by default
    assert config.failure_policy == "continue"
    out = Path(config.out)
    (out / "membership").mkdir(parents=True)
    stale = {"epoch": 1, "alive": [0, 1, 3], "removed": [2], "by": 0, "step": 3, "time_s": 0.1}
    (out / "membership" / "epoch00000001.json").write_text(json.dumps(stale))
    (out / "results").mkdir()
    (out / "results" / "rank2.pt").write_bytes(b"an earlier segment's")
    (out / "summary.json").write_text(json.dumps({"steps_per_worker": 4}))
    summary = launch(config, quiet=True, timeout_s=90)
    assert summary["steps_per_worker"] == 8 and summary["survivors"] == [0, 1, 2, 3]
    assert summary["membership_changes"] == [] and summary["steps"] == 4 * 8
    assert not (out / "membership" / "epoch00000001.json").exists()


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_a_stopped_rank_0_is_given_up_at_the_deadline(tmp_path):
    """Rank 0 holds gloo's rendezvous store and writes the summary in a run that loses nobody."""
    deadline = 2.0
    # long enough that the survivors still train together after the deadline (the ratio's window)
    config, figures, injected = _continue_run(tmp_path, "0:30:STOP", steps=300, deadline_s=deadline)
    _check_survivors_finished(config, figures, dead=0, steps=300, died_at=30)
    (change,) = figures["membership_changes"]
    assert deadline - 0.1 < change["detection_s"] < deadline + 1.5
    written = json.loads((Path(config.out) / "membership" / "epoch00000001.json").read_text())["time_s"]
    # silent for the deadline since its last heartbeat, which came up to a beat's period before the stop
    assert deadline * (1 - 1 / BEATS_PER_DEADLINE) - 0.1 < written - injected < deadline + 3


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_dpsgd_survivors_switch_to_the_rebuilt_ring_at_one_step(tmp_path):
    """A blocking gossip: the members drop the dead at once and switch to the rebuilt ring at the
    epoch's switch step."""
    config, figures, _ = _continue_run(tmp_path, "1:30", steps=120, algorithm="dpsgd")
    _check_survivors_finished(config, figures, dead=1, steps=120, died_at=30)
    epoch = json.loads((Path(config.out) / "membership" / "epoch00000001.json").read_text())
    assert epoch["switch_step"] == epoch["step"] + SWITCH_AFTER_WORKERS * 4 + 2


def _netns_reason() -> str | None:
    from psgdlab.runtime.launcher.netns import unavailable_reason

    return unavailable_reason()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_a_host_cut_off_is_given_up_and_one_side_goes_on(tmp_path):
    """Two emulated hosts of two workers; host 1's link goes down mid-run. Each side hears nothing
    from the other and proposes, rank by rank, to remove it: the epochs form one chain, so the run
    finishes with ranks of one host only (which ones is a race: a side may also lose a rank of its
    own to the other side's proposal before it is fenced) and never two memberships."""
    import subprocess
    import threading as th

    reason = _netns_reason()
    if reason is not None:
        pytest.skip(reason)
    from psgdlab.runtime.launcher.launch import launch

    config = lsq_config(
        tmp_path, "adpsgd", 4, steps=600, compute_time="0.01", on_failure="continue", hosts=2, checkpoint_every=50
    ).replace(timeout_s=2.0, record_params=False)
    out = Path(config.out)
    result: dict = {}
    runner = th.Thread(target=lambda: result.update(summary=launch(config, quiet=True, timeout_s=120)))
    runner.start()
    assert _until(lambda: (out / "checkpoints" / "step00000050").is_dir(), timeout_s=90), "the run did not start"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    (host1,) = [n for n in listed if n.startswith(f"psgd-{os.getpid()}-") and n.endswith("-h1")]
    subprocess.run(["ip", "-n", host1, "link", "set", "nic0", "down"], check=True)
    runner.join(timeout=120)
    figures = result["summary"]
    assert figures["survivors"] and (set(figures["survivors"]) <= {0, 1} or set(figures["survivors"]) <= {2, 3})
    removed = sorted(r for c in figures["membership_changes"] for r in c["removed"])
    assert removed == sorted({0, 1, 2, 3} - set(figures["survivors"]))
    assert all(2.0 - 0.3 < c["detection_s"] < 2.0 + 2.0 for c in figures["membership_changes"])
    trace, _ = read_trace(out / "trace.npz")
    compute = trace[trace["phase"] == 0]
    for r in figures["survivors"]:  # the side that went on did every step
        assert np.count_nonzero(compute["rank"] == r) == 600
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(f"psgd-{os.getpid()}-")]  # fmt: skip


# ----- H-ADPSGD nodes of several GPUs ----------------------------------------------------------------
def test_survivors_form_a_group_alone_and_a_member_that_never_joins_fails_it_at_the_deadline(tmp_path):
    """A group of survivors needs no rank of the world but its own members: two of them sum over
    it through a rendezvous file; a member that never comes fails the forming at the timeout."""
    import torch

    from psgdlab.runtime.failures.survive.regroup import SurvivorGroups

    root = tmp_path / "groups"
    groups = {r: SurvivorGroups(root, rank=r, timeout_s=5.0) for r in (0, 2)}
    sums: dict[int, object] = {}

    def reduce(r: int) -> None:
        t = torch.full((3,), float(r + 1), dtype=torch.float64)
        groups[r].allreduce_sum(t, (0, 2))
        sums[r] = t.tolist()

    threads = [threading.Thread(target=reduce, args=(r,)) for r in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sums == {0: [4.0, 4.0, 4.0], 2: [4.0, 4.0, 4.0]}
    alone = SurvivorGroups(root, rank=0, timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        alone.allreduce_sum(torch.ones(2), (0, 3))  # rank 3 never joins
    assert time.monotonic() - start < 10
    for g in [*groups.values(), alone]:
        g.close()
    alone.remove()
    assert not root.exists()


def _check_nodes_went_on(config, figures, dead: list[int], steps: int) -> np.ndarray:
    """Every survivor did every step, one membership change removed ``dead``, the loss fell, the
    replicas of each node stayed identical; returns the survivors' final models (rank order)."""
    out = Path(config.out)
    survivors = [r for r in range(config.workers) if r not in dead]
    assert figures["survivors"] == survivors
    removed = sorted(r for change in figures["membership_changes"] for r in change["removed"])
    assert removed == dead
    for change in figures["membership_changes"]:
        assert set(change) >= {"time_s", "step", "removed", "detection_s"}
        assert change["detection_s"] < config.timeout_s  # a killed rank: seen at once, not at the deadline
    trace, _ = read_trace(out / "trace.npz")
    compute = trace[trace["phase"] == 0]
    for r in survivors:  # no survivor lost a step
        assert np.count_nonzero(compute["rank"] == r) == steps
    curve = figures["loss_curve"]["loss"]
    assert np.mean(curve[-5:]) < 0.5 * np.mean(curve[:5])
    finals = np.load(out / "final_params.npz")["params"]
    by_rank = dict(zip(survivors, finals))
    m = config.gpus_per_node
    for node in {r // m for r in survivors}:  # a node's survivors apply the same sums: identical replicas
        members = [r for r in survivors if r // m == node]
        for r in members[1:]:
            assert np.array_equal(by_rank[r], by_rank[members[0]]), (node, members)
    assert not leftover_segments(out)
    assert not list(out.rglob(".*.tmp*"))
    return finals


def _spread(finals: np.ndarray) -> float:
    """How far the survivors' models are from their mean, relative to the mean's norm."""
    mean = finals.mean(axis=0)
    return float(np.max(np.linalg.norm(finals - mean, axis=1)) / np.linalg.norm(mean))


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_a_node_that_lost_a_gpu_goes_on_with_the_rest_of_it(tmp_path):
    """Two nodes of two GPUs; rank 0 dies -- the rendezvous store's host and the first member of
    node 0, so nothing the survivors need was in it. Rank 1 goes on alone for node 0 -- its
    allreduce dropped, both slices of every average with node 1 its own, weighted 2:1 -- and still
    mixes with node 1. (A member other than a node's first dies in the tests of nodes of three.)
    Continue is the default here, and a node's exchange counts one merge on each member, as under
    stop and in the simulator, not one per slice."""
    config, figures, _ = _continue_run(tmp_path, "0:30", steps=120, algorithm="hadpsgd", gpus_per_node=2, on_failure="")
    assert figures["on_failure"] == "continue"
    finals = _check_nodes_went_on(config, figures, dead=[0], steps=120)
    trace, _ = read_trace(Path(config.out) / "trace.npz")
    whole = trace[(trace["phase"] == PHASES["compute"]) & (trace["step"] < 25)]
    assert 0.5 < whole["staleness"].mean() < 1.5  # one own exchange a step (2 when slices were counted)
    summed = trace[(trace["kind"] == ExchangeKind.ALLREDUCE) & (trace["step"] < 25)]
    node_sum = AllReduce(group=(0, 1), payload="grad")  # the sum the simulator prices under continue
    elements = node_sum_elements(figures["n_params"])
    assert set(summed["nbytes"].tolist()) == {wire_bytes(node_sum, elements, figures["itemsize"])[0]}
    assert _spread(finals) < 0.05  # rank 1 ends averaged with node 1, not on its own
    (change,) = figures["membership_changes"]
    assert change["steps_lost"]["0"] >= 1


def _pairwise_peers_after(config, step: int) -> dict[int, set[int]]:
    """Each survivor's pairwise peers (either side) in its steps from ``step`` on, from the trace."""
    trace, _ = read_trace(Path(config.out) / "trace.npz")
    pair = trace[(trace["kind"] == ExchangeKind.PAIRWISE) & (trace["phase"] == PHASES["overlap"])]
    late = pair[pair["step"] >= step]
    return {int(r): set(late["peer"][late["rank"] == r].tolist()) for r in np.unique(late["rank"])}


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_nodes_of_different_sizes_average_slices_over_a_group_the_survivors_form(tmp_path):
    """Two nodes of three GPUs; rank 1 stops. At the deadline node 0's survivors (0, 2) leave the
    allreduce they were blocked in, form a group of their own (the start-up group needs rank 1)
    and sum the step again; with node 1 they average three slices, weighted 2:3, as
    ``core.membership.survivor_exchanges`` gives them: rank 0 slices 0 and 2 (with ranks 3 and 5),
    rank 2 slice 1 (with rank 4)."""
    deadline = 2.0
    config, figures, _ = _continue_run(
        tmp_path, "1:30:STOP", steps=150, deadline_s=deadline, algorithm="hadpsgd", workers=6, gpus_per_node=3
    )
    out = Path(config.out)
    survivors = [0, 2, 3, 4, 5]
    (change,) = figures["membership_changes"]
    assert change["removed"] == [1] and deadline - 0.1 < change["detection_s"] < deadline + 1.5
    trace, _ = read_trace(out / "trace.npz")
    compute = trace[trace["phase"] == 0]
    for r in survivors:
        assert np.count_nonzero(compute["rank"] == r) == 150
    finals = np.load(out / "final_params.npz")["params"]
    assert np.array_equal(finals[0], finals[1])  # ranks 0 and 2: one node, identical replicas
    assert np.array_equal(finals[2], finals[3]) and np.array_equal(finals[2], finals[4])
    assert _spread(finals) < 0.05
    curve = figures["loss_curve"]["loss"]
    assert np.mean(curve[-5:]) < 0.5 * np.mean(curve[:5])
    h = build_algorithm(config)
    rebuilt = rebuild(h.membership_topology(), alive=survivors)
    expected = {
        r: {e.peer for e in survivor_exchanges(rebuilt, h.exchanges(149, r), r, 149) if isinstance(e, PairwiseAverage)}
        for r in survivors
    }
    assert expected[0] == {3, 5} and expected[2] == {4}
    seen = _pairwise_peers_after(config, change["step"] + 20)
    assert seen[0] == {3, 5} and seen[2] == {4}
    assert seen[3] == {0} and seen[4] == {2} and seen[5] == {0}
    reduce = trace[(trace["kind"] == ExchangeKind.ALLREDUCE) & (trace["rank"] == 0)]
    assert reduce.size == 150  # every step summed, the one rank 1 was lost in again over (0, 2)
    early, late = reduce["nbytes"][reduce["step"] < 25], reduce["nbytes"][reduce["step"] > change["step"] + 20]
    assert np.all(late == late[0]) and late[0] / early[0] == pytest.approx(0.75, abs=0.01)  # a ring of 2, not 3
    assert not (out / "membership" / "groups").exists()  # the survivors' rendezvous files are gone
    assert not leftover_segments(out)
    pid = int((out / ".ranks" / "rank1.pid").read_text())
    assert process_state(pid) is None  # the stopped worker's process is gone


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_a_node_that_lost_all_its_gpus_leaves_the_super_ring(tmp_path):
    """Four nodes of two GPUs; both of node 1's die at once. The three nodes left go on, one
    sitting out each round, and nobody waits for node 1."""
    config, figures, _ = _continue_run(tmp_path, "2,3:30", steps=120, algorithm="hadpsgd", workers=8, gpus_per_node=2)
    finals = _check_nodes_went_on(config, figures, dead=[2, 3], steps=120)
    assert _spread(finals) < 0.05
    last = max(change["step"] for change in figures["membership_changes"])
    seen = _pairwise_peers_after(config, last + 10)
    assert all(peers and not peers & {2, 3} for peers in seen.values())  # the others still mix
    assert set(seen) == {0, 1, 4, 5, 6, 7}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_node_across_emulated_hosts_regroups_over_the_network(tmp_path):
    """Nodes of three GPUs on three emulated hosts of two: node 0 spans hosts 0 and 1. Rank 1 dies;
    its node's survivors, ranks 0 and 2 on two hosts, form their group through the run directory
    and go on with node 1."""
    reason = _netns_reason()
    if reason is not None:
        pytest.skip(reason)
    config, figures, _ = _continue_run(
        tmp_path, "1:30", steps=120, algorithm="hadpsgd", workers=6, gpus_per_node=3, hosts=3
    )
    finals = _check_nodes_went_on(config, figures, dead=[1], steps=120)
    assert _spread(finals) < 0.05
    assert figures["placement"] == [0, 0, 1, 1, 2, 2]  # node 0 on hosts 0 and 1
