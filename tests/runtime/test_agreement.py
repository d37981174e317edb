"""The membership agreement of :mod:`psgdlab.runtime.failures.survive.agreement`: one chain of epochs, each written
once and whole, that every rank reads alike, however proposals interleave or race."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.runtime.failures.survive.agreement import Agreement, Removed


def _check_chain(agreements: list[Agreement], n: int) -> list:
    """The chain is whole: each epoch is the previous without its (non-empty) removed ranks."""
    history = agreements[0].history()
    alive = set(range(n))
    for k, e in enumerate(history, start=1):
        assert e.epoch == k and e.removed and set(e.removed) <= alive
        alive -= set(e.removed)
        assert set(e.alive) == alive and e.by not in e.removed
    return history


def test_a_removal_is_one_epoch_and_agreeing_again_changes_nothing(tmp_path):
    a, b = Agreement(tmp_path, 4, 0), Agreement(tmp_path, 4, 1)
    first = a.remove({2}, step=7, detection_s=1.5)
    assert (first.epoch, first.alive, first.removed, first.by, first.step) == (1, (0, 1, 3), (2,), 0, 7)
    assert b.remove({2}) == first  # b found the same death: it reads a's epoch, writes none
    assert b.refresh().epoch == 1 and len(a.history()) == 1
    assert not list((tmp_path / "membership").glob(".*"))  # no temporary file left


def test_a_full_disk_fails_the_proposal_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import errno
    import os

    a = Agreement(tmp_path, 4, 0)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        a.remove({2}, step=3)
    assert not list((tmp_path / "membership").iterdir())  # neither the epoch nor its temporary file


def test_a_rank_given_up_for_dead_learns_it_and_stops(tmp_path):
    Agreement(tmp_path, 3, 0).remove({1}, step=4)
    with pytest.raises(Removed, match=r"rank 1 was given up for dead by rank 0 at epoch 1 \(step 4\)"):
        Agreement(tmp_path, 3, 1).refresh()


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_interleaved_proposals_from_stale_views_make_one_chain(tmp_path_factory, data):
    n = data.draw(st.integers(3, 8))
    root = tmp_path_factory.mktemp("chain")
    agreements = [Agreement(root, n, r) for r in range(n)]
    proposed: set[int] = set()
    for _ in range(data.draw(st.integers(1, 6))):
        by = data.draw(st.integers(0, n - 1))
        dead = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1)) - {by}
        if not dead:
            continue
        try:
            agreed = agreements[by].remove(dead)
        except Removed:
            continue  # the proposer itself was given up for dead meanwhile: it stops
        assert dead.isdisjoint(agreed.alive) and by in agreed.alive
        proposed |= dead
    history = _check_chain(agreements, n)
    survivors = [a for a in agreements if a.rank not in proposed]
    newest = history[-1] if history else agreements[0].current
    assert all(a.refresh() == newest for a in survivors)


def _race(root: str, n: int, rank: int, dead: list[int], start: float, out: mp.Queue) -> None:
    time.sleep(max(0.0, start - time.time()))
    try:
        out.put((rank, Agreement(root, n, rank).remove(dead).epoch))
    except Removed:
        out.put((rank, None))


def test_racing_survivors_agree_on_every_death(tmp_path):
    """Six processes propose at the same instant: one chain holds every death once."""
    n, proposals = 10, {0: [9], 1: [8], 2: [9, 8], 3: [7], 4: [6], 5: [7, 6]}
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start = time.time() + 0.5
    procs = [ctx.Process(target=_race, args=(str(tmp_path), n, r, d, start, out)) for r, d in proposals.items()]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    results = dict(out.get(timeout=5) for _ in procs)
    history = _check_chain([Agreement(tmp_path, n, 0)], n)
    assert set().union(*(e.removed for e in history)) == {6, 7, 8, 9}
    assert all(results[r] is not None for r in proposals)
    assert not list((tmp_path / "membership").glob(".*"))
