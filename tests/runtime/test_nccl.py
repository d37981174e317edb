"""NCCL (``--backend nccl``): the transport and the driver on GPUs, one rank per GPU.

Marked ``gpu``; every test skips without CUDA, and the multi-rank ones without two GPUs (NCCL
needs one GPU per rank). Payloads travel on NCCL, the control headers and any-source receives
on gloo, the workload's tensors live on the rank's GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psgdlab.runtime.launcher.launch import free_port  # noqa: E402
from psgdlab.tests.runtime._runtime_helpers import (  # noqa: E402
    TRAJECTORY_ATOL,
    initial_full_loss,
    lsq_config,
    needs_topology,
    reference_for,
    trajectory,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.distributed,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
two_gpus = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL: one rank per GPU)"
)

CHECK = r"""
import torch
from psgdlab.runtime.loop.flat import flat_gradients
from psgdlab.runtime.loop.overlap import OverlappedAllreduce
from psgdlab.runtime.transports.channels import open_channels
from psgdlab.runtime.transports.env import launch_env
from psgdlab.runtime.transports.transport import Tags
env = launch_env()
r = env.rank
ch = open_channels("nccl", env=env, groups=[], timeout_s=60)
main, comm, resp = ch["main"], ch["comm"], ch["responder"]
dev = main.device
assert dev.type == "cuda" and dev.index == r, dev
t = torch.full((5,), float(r + 1), device=dev); main.allreduce_sum(t, (0, 1)); assert torch.all(t == 3), t
t = torch.full((5,), float(r + 1), device=dev); main.allreduce_mean(t, (0, 1)); assert torch.all(t == 1.5), t
ts = [torch.full((3,), float(r + k), device=dev) for k in range(3)]
for h in [main.allreduce_sum_async(x, (0, 1)) for x in ts]:
    h.wait()
assert [x[0].item() for x in ts] == [1.0, 3.0, 5.0], ts
g = resp.allgather(torch.full((2 + r,), float(r), device=dev), [2, 3], (0, 1))
assert g.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0], g
b = torch.tensor([float(r)], device=dev); main.broadcast(b, 1, (0, 1)); assert b.item() == 1.0
mine, theirs = torch.full((1000,), float(r), device=dev), torch.empty(1000, device=dev)
comm.sendrecv(mine, theirs, 1 - r, Tags.PAIR_PAYLOAD); assert torch.all(theirs == 1 - r)
if r == 1:  # a control header: CPU tensor, gloo, received from any source
    comm.send(torch.tensor([1, 7]), 0, Tags.PAIR_HEADER)
else:
    h = torch.zeros(2, dtype=torch.int64)
    assert resp.recv(h, None, Tags.PAIR_HEADER) == 1 and int(h[1]) == 7
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double().to(dev)
flat = flat_gradients(net)
red = OverlappedAllreduce(main, (0, 1), list(net.parameters()), flat, first_bucket_bytes=8, bucket_bytes=100)
x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(r)).to(dev)
flat.zero_(); red.arm(); net(x).square().sum().backward(); got = red.finish().clone(); red.remove()
flat.zero_(); net(x).square().sum().backward(); want = flat.clone(); main.allreduce_sum(want, (0, 1))
assert torch.allclose(got, want, rtol=1e-13, atol=1e-13), (got - want).abs().max()
main.barrier()
objs = main.gather_object(r, root=0)
assert r != 0 or objs == [0, 1], objs
print("ok", r)
"""


@two_gpus
def test_transport_operations_on_nccl():
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHECK],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=150) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}: {err[-2000:]}"
        assert out.strip() == f"ok {r}"


def _launch(config):
    from psgdlab.runtime.launcher.launch import launch

    return launch(config, quiet=True, timeout_s=150)


def test_one_rank_on_one_gpu_follows_the_reference(tmp_path):
    config = lsq_config(tmp_path, "sgd", 1, backend="nccl")
    _launch(config)
    np.testing.assert_allclose(trajectory(config), reference_for(config), rtol=0, atol=TRAJECTORY_ATOL)


@two_gpus
@pytest.mark.parametrize(("algorithm", "params"), [("ssgd", {}), ("bmuf", {"period": 3})])
def test_synchronous_algorithms_follow_the_reference_on_nccl(tmp_path, algorithm, params):
    config = lsq_config(tmp_path, algorithm, 2, backend="nccl", **params)
    _launch(config)
    np.testing.assert_allclose(trajectory(config), reference_for(config), rtol=0, atol=TRAJECTORY_ATOL)


@two_gpus
@needs_topology
def test_adpsgd_trains_on_nccl(tmp_path):
    config = lsq_config(tmp_path, "adpsgd", 2, backend="nccl", steps=30, compute_time="0.002", variant="fixed")
    summary = _launch(config)
    assert summary["mean_model_full_loss"] < 0.5 * initial_full_loss(config)
    assert summary["staleness_max"] > 0


@two_gpus
def test_ssgd_of_a_module_overlaps_its_allreduce_on_nccl(tmp_path):
    from psgdlab.core.exchange import ExchangeKind
    from psgdlab.core.records.trace import PHASES, read_trace
    from psgdlab.runtime.config import TrainConfig

    config = TrainConfig(
        algorithm="ssgd",
        workers=2,
        backend="nccl",
        model="tiny-blstm",
        steps=4,
        batch=8,
        out=str(tmp_path / "run"),
        evaluate=False,
        timeout_s=120.0,
    )
    _launch(config)
    trace, _ = read_trace(tmp_path / "run" / "trace.npz")
    overlapped = trace[(trace["kind"] == ExchangeKind.ALLREDUCE) & (trace["phase"] == PHASES["overlap"])]
    assert overlapped.size == 2 * 4 and np.all(overlapped["nbytes"] > 0)
