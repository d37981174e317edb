"""The emulator: exact replay of the reference executor, staleness from the platform model,
batched gradients, and the ``psgdlab emulate`` command."""

from __future__ import annotations

import numpy as np
import pytest

from psgdlab.core.algorithms import make_algorithm
from psgdlab.core.errors import SimulationError
from psgdlab.core.platform.stragglers import StragglerModel
from psgdlab.core.reference import LeastSquaresProblem, LeastSquaresReplicas, run_reference
from psgdlab.sim.emulate import replay

N = 8
EXACT_CASES = [
    ("ssgd", {}),
    ("bsp", {"period": 3}),
    ("bmuf", {"period": 3}),
    ("bmuf", {"period": 2, "variant": "nesterov", "momentum": 0.5}),
    ("dpsgd", {"topology": "ring"}),
    ("adpsgd", {}),
    ("adpsgd", {"variant": "random"}),
    ("adpsgd", {"variant": "delay", "delay": 2}),
    ("hadpsgd", {"gpus_per_node": 2}),
    ("hadpsgd", {"gpus_per_node": 4, "variant": "random"}),
    ("asgd", {"period": 2}),
    ("easgd", {"period": 2}),
    ("easgd", {"period": 2, "variant": "sync"}),
]


def _problem(seed: int = 3) -> LeastSquaresProblem:
    return LeastSquaresProblem(n_samples=256, dim=6, n_shards=N, batch=8, seed=seed)


@pytest.mark.parametrize(("name", "params"), EXACT_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(EXACT_CASES)])
def test_replay_of_reference_trace_equals_reference_exactly(name, params):
    alg = make_algorithm(name, n_workers=N, **params)
    problem = _problem()

    def lr(s):
        return 0.05 / (1.0 + 0.02 * s)

    ref = run_reference(alg, problem, steps=24, lr=lr)
    emu = replay(alg, ref.trace, LeastSquaresReplicas(problem), lr=lr, meta={"source": "reference"})
    assert np.array_equal(np.stack(emu.params), ref.params[-1])  # bit for bit
    assert np.array_equal(emu.staleness.T, ref.staleness)
    assert emu.evals["loss"][-1] == ref.losses[-1]
    # one batched gradient call per round: every worker's gradient at once
    assert emu.gradient_batches == [N] * 24


def test_replay_detects_a_trace_that_does_not_fit_the_schedule():
    alg = make_algorithm("ssgd", n_workers=N)
    ref = run_reference(alg, _problem(), steps=3, lr=0.05)
    other = make_algorithm("adpsgd", n_workers=N)
    with pytest.raises(SimulationError, match="allreduce at rank 0 step 0"):
        replay(other, ref.trace, LeastSquaresReplicas(_problem()), lr=0.05, meta={"source": "reference"})
    with pytest.raises(SimulationError, match="do not fit"):
        replay(make_algorithm("ssgd", n_workers=4), ref.trace, LeastSquaresReplicas(_problem()), lr=0.05)


# ----- replays of simulator traces --------------------------------------------------------------
sim_engine = pytest.importorskip("psgdlab.sim.engine")


def _simulate(alg, steps=20, straggler="", n=N, seed=1):
    from psgdlab.sim.workload import load_config

    cfg = load_config(preset="interspeech2019-v100")
    stragglers = StragglerModel.parse(straggler, n_workers=n) if straggler else None
    return sim_engine.simulate(
        alg,
        cfg.platform,
        cfg.workload,
        steps=steps,
        seed=seed,
        stragglers=stragglers,
        until="all",
        gpus_per_node=getattr(alg, "gpus_per_node", None),
    )


def _trace_staleness(trace, n, steps):
    comp = trace[trace["phase"] == 0]
    out = np.full((n, steps), -1)
    out[comp["rank"], comp["step"]] = comp["staleness"]
    return out


@pytest.mark.parametrize("straggler", ["", "1:3", "random:0.2:4"])
@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("ssgd", {}),
        ("bmuf", {"period": 3}),
        ("dpsgd", {}),
        ("adpsgd", {}),
        ("adpsgd", {"variant": "random"}),
        ("adpsgd", {"variant": "delay"}),
        ("hadpsgd", {"gpus_per_node": 4}),
        ("asgd", {}),
        ("easgd", {"period": 2}),
    ],
)
def test_staleness_seen_by_gradients_equals_the_trace_column(name, params, straggler):
    alg = make_algorithm(name, n_workers=N, **params)
    res = _simulate(alg, straggler=straggler)
    emu = replay(alg, res.trace, LeastSquaresReplicas(_problem()), lr=0.05, meta=res.meta)
    assert np.array_equal(emu.staleness, _trace_staleness(res.trace, N, 20))
    assert np.isfinite(emu.evals["loss"][-1])
    out = emu.trace[emu.trace["phase"] == 0]
    assert np.array_equal(out["staleness"], res.trace[res.trace["phase"] == 0]["staleness"])
    assert np.isfinite(out["loss"]).all()


def test_a_straggler_increases_the_staleness_its_gradients_see():
    alg = make_algorithm("asgd", n_workers=N)
    base = replay(alg, _simulate(alg).trace, LeastSquaresReplicas(_problem()), lr=0.05)
    slow = replay(alg, _simulate(alg, straggler="1:4").trace, LeastSquaresReplicas(_problem()), lr=0.05)
    # while the others still run, 4x slower means about 4 x (n - 1) foreign updates per pull
    assert base.staleness[1, 2:].max() == N - 1
    assert slow.staleness[1, 1:4].min() >= 3 * (N - 1)
    others = np.delete(slow.staleness[:, 2:], 1, axis=0)
    assert slow.staleness[1].max() > others.max()


def test_synchronous_replay_ignores_timing():
    """SSGD replayed on a simulated trace (latency, a straggler) still equals the reference."""
    alg = make_algorithm("ssgd", n_workers=N)
    problem = _problem()
    ref = run_reference(alg, problem, steps=20, lr=0.05)
    emu = replay(alg, _simulate(alg, straggler="2:3").trace, LeastSquaresReplicas(problem), lr=0.05)
    assert np.array_equal(np.stack(emu.params), ref.params[-1])


def test_gossip_replay_keeps_the_mean_dynamics():
    """ADPSGD on a simulated trace: the workers' mean moves by the mean applied gradient."""
    alg = make_algorithm("adpsgd", n_workers=N, variant="random")
    emu = replay(alg, _simulate(alg, steps=30).trace, LeastSquaresReplicas(_problem()), lr=0.05)
    assert emu.evals["loss"][-1] < 0.5 * LeastSquaresReplicas(_problem()).evaluate(np.zeros(6))["loss"]
    assert emu.rounds["consensus_distance"].shape == (30,)
    assert np.all(np.diff(emu.rounds["time_s"]) >= 0)
