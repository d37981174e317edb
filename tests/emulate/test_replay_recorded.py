"""The replay equals what the emulator computed before its refactor into an indexer and an applier
(values recorded at commit 68aad98, see data/replay_recorded.json).

Bit for bit on the CPU that recorded them; OpenBLAS picks its dot-product kernel by CPU (DYNAMIC_ARCH),
and another kernel rounds the last bit of a sum differently, so the floats are compared to 1e-12
relative. The staleness, an integer, is compared exactly. The traces are simulated on the V100 preset
as it was when the values were recorded (data/interspeech2019-v100-recorded.toml), so a later change
of the shipped preset's hardware model does not move them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from psgdlab.core.algorithms import make_algorithm
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.core.reference import LeastSquaresProblem, LeastSquaresReplicas
from psgdlab.sim.emulate import EventKind, index_trace, replay

engine = pytest.importorskip("psgdlab.sim.engine")

RECORDED = json.loads((Path(__file__).parent / "data" / "replay_recorded.json").read_text())["cases"]
N = 8


def _trace(alg):
    from psgdlab.sim.workload import load_config

    cfg = load_config(path=Path(__file__).parent / "data" / "interspeech2019-v100-recorded.toml")
    res = engine.simulate(
        alg,
        cfg.platform,
        cfg.workload,
        steps=20,
        seed=1,
        stragglers=StragglerModel.parse("random:0.2:4", n_workers=N),
        until="all",
        gpus_per_node=getattr(alg, "gpus_per_node", None),
    )
    return res.trace, res.meta


def _floats(hexes):
    return np.array([float.fromhex(x) for x in hexes])


@pytest.mark.parametrize("case", sorted(RECORDED))
def test_replay_equals_the_recorded_values(case):
    rec = RECORDED[case]
    alg = make_algorithm(rec["algorithm"], n_workers=N, **rec["params"])
    trace, meta = _trace(alg)
    problem = LeastSquaresProblem(n_samples=256, dim=6, n_shards=N, batch=8, seed=3)
    emu = replay(alg, trace, LeastSquaresReplicas(problem), lr=0.05, meta=meta, eval_points=7)
    params = np.stack(emu.params).ravel()
    np.testing.assert_allclose(params, _floats(rec["final_params"]), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(emu.evals["loss"], _floats(rec["eval_loss"]), rtol=1e-12, atol=1e-15)
    assert int(emu.staleness.sum()) == rec["staleness_sum"]


def test_index_has_one_read_and_one_apply_per_step_in_time_order():
    alg = make_algorithm("adpsgd", n_workers=N, variant="random")
    trace, meta = _trace(alg)
    index = index_trace(alg, trace, meta)
    kinds = [e.kind for e in index.events]
    assert kinds.count(EventKind.READ) == kinds.count(EventKind.APPLY) == N * index.n_steps
    times = [e.time_s for e in index.events]
    assert times == sorted(times)
    assert {e.kind for e in index.events} == {
        EventKind.READ,
        EventKind.APPLY,
        EventKind.PAIR_SEND,
        EventKind.PAIR_MERGE,
    }
