"""The gloo transport's shared-memory data plane (runtime/transports/shm/shm.py), with 4 ranks on one host."""

from __future__ import annotations

import subprocess
import sys

import pytest

from psgdlab.core.errors import ConfigError
from psgdlab.runtime.launcher.launch import free_port
from psgdlab.runtime.transports.shm.shm import DEFAULT_CAPACITY_BYTES, shm_settings
from psgdlab.tests.runtime.test_transport import _env

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

CAPACITY_BYTES = 65536

CHECK = r"""
import glob, os, random, threading, time
import torch, torch.distributed as dist
from psgdlab.runtime.transports.shm.shm import segment_prefix
from psgdlab.runtime.transports.shm.shm_transport import SharedMemoryTransport
from psgdlab.runtime.transports.channels import open_channels
from psgdlab.runtime.transports.env import launch_env
from psgdlab.runtime.transports.transport import Tags
torch.set_num_threads(1)
env = launch_env(); r, n = env.rank, env.world_size
world, pair = (0, 1, 2, 3), ((0, 1) if r < 2 else (2, 3))
ch = open_channels("gloo", env=env, groups=[(0, 1), (2, 3), world], timeout_s=60)
main, comm, resp = ch["main"], ch["comm"], ch["responder"]
assert all(isinstance(c, SharedMemoryTransport) for c in ch.values())
assert main.plane.local == frozenset(world) and main.plane.capacity_bytes == {cap}
assert set(main.plane.groups) == {{(0, 1), (2, 3), world}}
if os.environ["PSGDLAB_SHM"] == "copy":
    assert not main.plane.single_copy
# unlinked at setup: nothing of this run is in /dev/shm while it runs
assert not glob.glob(f"/dev/shm/{{segment_prefix(os.getpid())}}*")
ref = dist.new_group(list(world), backend="gloo")  # plain gloo, for comparison
g = torch.Generator().manual_seed(r)
# float64 elements: below the data region, and above it (one copy: three pieces of an allreduce)
small, large = 1000, 3 * {cap} // 8 + 1
big = main.plane.single_copy  # one copy moves any size; two copies only what fits the region

def shm_ops():
    return sum(c.shm_ops for c in ch.values())

# allreduce: integer-valued floats sum exactly (equal to gloo); random ones to rounding, and
# bit-identical on every rank
for dtype in (torch.float64, torch.float32, torch.int64):
    x = torch.randint(-1000, 1000, (small,), generator=g).to(dtype)
    a, b = x.clone(), x.clone()
    before = shm_ops(); main.allreduce_sum(a, world); assert shm_ops() == before + 1
    dist.all_reduce(b, group=ref); assert torch.equal(a, b), dtype
x = torch.randn(small, generator=g, dtype=torch.float64)
a, b = x.clone(), x.clone()
main.allreduce_sum(a, world); dist.all_reduce(b, group=ref)
torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)
m = x.clone(); main.allreduce_mean(m, world); assert torch.equal(m, a / 4)
everyone = main.gather_object(a, root=0)
if r == 0:
    assert all(torch.equal(e, everyone[0]) for e in everyone)
# sub-groups on another channel; a non-contiguous tensor
t = torch.full((2, 6), float(r))[:, ::2]
comm.allreduce_mean(t, pair); assert torch.all(t == sum(pair) / 2), t
# above the data region: in pieces (one copy) or over gloo (two copies), the same result
x = torch.randint(0, 9, (large,), generator=g).double(); a, b = x.clone(), x.clone()
before = shm_ops(); main.allreduce_sum(a, world); assert shm_ops() == before + big
dist.all_reduce(b, group=ref); assert torch.equal(a, b)
m = x.clone(); main.allreduce_mean(m, world); assert torch.equal(m, a / 4)

# pairwise: active (even) comm thread <-> passive (odd) responder, as the driver pairs them;
# gossip around the ring on the comm channel -- sizes below and above the data region
peer = r ^ 1
side = comm if r % 2 == 0 else resp
for size in (small, large):
    mine = torch.arange(size, dtype=torch.float64) + 1e6 * r; theirs = torch.empty(size, dtype=torch.float64)
    before = side.shm_ops; side.sendrecv(mine, theirs, peer, Tags.PAIR_PAYLOAD)
    assert torch.equal(theirs, torch.arange(size, dtype=torch.float64) + 1e6 * peer)
    assert side.shm_ops == before + (size == small or big)
peers = [(r - 1) % n, (r + 1) % n]
bufs = [torch.empty(small) for _ in peers]
comm.multi_exchange(torch.full((small,), float(r)), bufs, peers, Tags.GOSSIP)
assert [int(b[0]) for b in bufs] == peers and all(torch.all(b == b[0]) for b in bufs)

# no deadlock under random delays: pairwise exchanges on comm/responder and world allreduces on
# main run at once, sizes straddling the data region, random sleeps before every operation
rng = random.Random(r)
errors = []
def pairwise():
    try:
        for k in range(40):
            time.sleep(rng.uniform(0, 0.004))
            size = (small, large)[k % 3 == 0]
            mine = torch.full((size,), float(100 * r + k)); theirs = torch.empty(size)
            side.sendrecv(mine, theirs, peer, Tags.PAIR_PAYLOAD)
            assert torch.all(theirs == 100 * peer + k), (k, theirs[:3])
    except BaseException as exc:
        errors.append(exc)
thread = threading.Thread(target=pairwise); thread.start()
for k in range(40):
    time.sleep(rng.uniform(0, 0.004))
    t = torch.full((small,), float(r + k)); main.allreduce_sum(t, world)
    assert torch.all(t == 6 + 4 * k), (k, t[:3])
thread.join(timeout=60); assert not thread.is_alive() and not errors, errors
main.barrier()
print("ok", r, flush=True)
os._exit(0)  # as the per-rank entry leaves: without the teardown that gloo's threads can abort
"""


def _run_ranks(code: str, extra: dict[str, str]) -> list[tuple[int, str, str]]:
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=dict(_env(), RANK=str(r), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(4)
    ]
    try:
        outs = [p.communicate(timeout=100) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


@pytest.mark.parametrize("mode", ["1", "copy"], ids=["one-copy", "two-copies"])
def test_shared_memory_matches_gloo_at_every_size_and_never_deadlocks(mode):
    results = _run_ranks(
        CHECK.format(cap=CAPACITY_BYTES), {"PSGDLAB_SHM_BYTES": str(CAPACITY_BYTES), "PSGDLAB_SHM": mode}
    )
    for r, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {r}: {err[-3000:]}"
        assert out.strip() == f"ok {r}"


DEATH = r"""
import os, signal, threading, time
import torch
from psgdlab.core.errors import TransportError
from psgdlab.runtime.transports.channels import open_channels
from psgdlab.runtime.transports.env import launch_env
from psgdlab.runtime.transports.transport import Tags
env = launch_env(); r = env.rank
ch = open_channels("gloo", env=env, groups=[], timeout_s=60)
if r == 1:
    os.kill(os.getpid(), signal.SIGKILL)
errors = []
def pairwise():
    try:
        ch["comm"].sendrecv(torch.ones(10), torch.empty(10), 1, Tags.PAIR_PAYLOAD)
    except TransportError as exc:
        errors.append(str(exc))
thread = threading.Thread(target=pairwise); thread.start()
start = time.monotonic()
try:
    ch["main"].allreduce_sum(torch.ones(10), (0, 1))
except TransportError as exc:
    errors.append(str(exc))
thread.join(10)
print(round(time.monotonic() - start), sorted(errors), flush=True)
os._exit(0)
"""


def test_a_dead_peer_fails_a_waiting_rank_naming_it():
    """Without a launcher that stops the run, a rank waiting on a dead peer's words gives up
    within about a second (liveness is checked every 0.5 s), naming the peer."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DEATH],
            env=dict(_env(), RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    out, err = procs[0].communicate(timeout=60)
    procs[1].wait(timeout=60)
    assert procs[0].returncode == 0, err[-2000:]
    seconds, errors = out.split(" ", 1)
    assert int(seconds) <= 5
    assert errors.strip() == str(
        sorted(
            [
                "rank 0: rank 1 died during a shared-memory allreduce",
                "rank 0: rank 1 died during a shared-memory exchange",
            ]
        )
    )


def test_settings_come_from_the_environment():
    assert shm_settings({}) == ("auto", DEFAULT_CAPACITY_BYTES)
    assert shm_settings({"PSGDLAB_SHM": "0", "PSGDLAB_SHM_BYTES": "4096"}) == ("off", 4096)
    with pytest.raises(ConfigError, match=r"PSGDLAB_SHM \('yes'\) must be 0, 1 or copy"):
        shm_settings({"PSGDLAB_SHM": "yes"})
    with pytest.raises(ConfigError, match=r"PSGDLAB_SHM_BYTES \('-5'\) must be a positive number of bytes"):
        shm_settings({"PSGDLAB_SHM_BYTES": "-5"})


def test_the_segments_of_dead_processes_are_removed_and_no_others():
    import os

    from psgdlab.runtime.transports.shm.shm_sys import SHM_DIR, remove_segments
    from psgdlab.runtime.transports.shm.shm_sys import segment_prefix as prefix

    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    gone, mine = SHM_DIR / f"{prefix(dead.pid)}test", SHM_DIR / f"{prefix(os.getpid())}test"
    try:
        gone.touch()
        mine.touch()
        assert remove_segments([dead.pid, os.getpid()]) == [gone.name]
        assert not gone.exists() and mine.exists()
    finally:
        for path in (gone, mine):
            path.unlink(missing_ok=True)
