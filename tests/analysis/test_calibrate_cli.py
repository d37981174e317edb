"""psgdlab calibrate on synthetic run directories with known latency, bandwidth and compute."""

from __future__ import annotations

import numpy as np
import pytest

from psgdlab.analysis.calibrate import calibrate_runs, platform_toml
from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.core.rundir import RunDir
from psgdlab.core.trace import TraceBuilder, summarize, write_trace
from psgdlab.sim.workload import load_config

ALPHA, BETA, MEAN, CV = 2e-4, 1e9, 0.05, 0.1


def write_run(path, *, n_params, workers=2, steps=30, pairwise=False, server=False, seed=0, itemsize=8):
    """A runtime-like run directory: compute records drawn from a lognormal law, exchange records
    of the exact cost model plus non-negative waiting (what the fit must see through)."""
    rng = np.random.default_rng(seed)
    S = n_params * itemsize
    sigma = np.sqrt(np.log1p(CV ** 2))
    tb = TraceBuilder()
    for r in range(workers):
        t = 0.0
        for s in range(steps):
            c = float(rng.lognormal(np.log(MEAN) - sigma ** 2 / 2, sigma))
            tb.add(rank=r, step=s, phase="compute", start_s=t, end_s=t + c, staleness=0, loss=1.0)
            t += c
            if pairwise:
                d = ALPHA + S / BETA + (0.0 if rng.random() < 0.5 else float(rng.exponential(0.01)))
                tb.add(rank=r, step=s, phase="overlap", start_s=t - c, end_s=t - c + d, kind=2, peer=1 - r, nbytes=S)
            elif server:
                d = ALPHA + S / BETA + 1e-3 + (float(rng.exponential(2e-3)) if rng.random() < 0.3 else 0.0)
                tb.add(rank=r, step=s, phase="comm", start_s=t, end_s=t + d, kind=4, peer=-2, nbytes=S)
                t += d
            else:  # allreduce: rank 0 arrives on time, the others wait for it
                d = 2 * (workers - 1) * ALPHA + 2 * (workers - 1) / workers * S / BETA
                wait = 0.0 if r == 0 else float(rng.exponential(0.005))
                tb.add(rank=r, step=s, phase="comm", start_s=t, end_s=t + d + wait, kind=1,
                       nbytes=2 * (workers - 1) * S // workers)
                t += d + wait
    trace = tb.array()
    meta = {"source": "runtime", "n_workers": workers, "samples_per_step": 8, "n_params": n_params,
            "itemsize": itemsize, "payload_bytes": S}
    rd = RunDir(path)
    write_trace(rd / "trace.npz", trace, meta)
    rd.write_json("summary.json", {**summarize(trace, samples_per_step=8), "algorithm": {"algorithm": "ssgd"},
                                   **meta})
    return path


@pytest.fixture
def runs(tmp_path):
    return [write_run(tmp_path / "a", n_params=10_000, seed=1), write_run(tmp_path / "b", n_params=200_000, seed=2),
            write_run(tmp_path / "c", n_params=10_000, pairwise=True, seed=3),
            write_run(tmp_path / "d", n_params=200_000, pairwise=True, seed=4),
            write_run(tmp_path / "e", n_params=50_000, server=True, seed=5)]


def test_calibrate_recovers_known_platform(runs):
    fit = calibrate_runs(runs)
    assert fit["link"]["latency_s"] == pytest.approx(ALPHA, rel=1e-6)
    assert fit["link"]["bandwidth_bytes_per_s"] == pytest.approx(BETA, rel=1e-6)
    assert fit["compute"]["mean_s"] == pytest.approx(MEAN, rel=0.02)
    assert fit["compute"]["cv"] == pytest.approx(CV, rel=0.15)
    assert fit["server"]["service_overhead_s"] == pytest.approx(1e-3, abs=5e-4)
    assert fit["payload_bytes"] == [80_000, 1_600_000, 80_000, 1_600_000, 400_000]


def test_calibrate_cli_writes_loadable_toml(runs, tmp_path, capsys):
    out = tmp_path / "platform.toml"
    assert main(["calibrate", *map(str, runs), "--out", str(out), "--n-params", "50000"]) == 0
    assert "latency" in capsys.readouterr().out
    text = out.read_text()
    assert "# Residuals of the fit:" in text and "Kolmogorov-Smirnov" in text
    cfg = load_config(path=out)
    assert cfg.platform.pcie.latency_s == pytest.approx(ALPHA, rel=1e-6)
    assert cfg.platform.nic.bandwidth_bytes_per_s == pytest.approx(BETA, rel=1e-6)
    assert cfg.workload.n_params == 50_000 and cfg.workload.itemsize == 8
    assert cfg.workload.compute_time.mean_s == pytest.approx(MEAN, rel=0.02)
    assert cfg.workload.batch_per_worker == 8
    assert not list(tmp_path.glob(".platform.toml.tmp*"))


def test_single_payload_size_is_refused(tmp_path, capsys):
    runs = [write_run(tmp_path / "a", n_params=10_000), write_run(tmp_path / "b", n_params=10_000, seed=1)]
    with pytest.raises(ConfigError, match="single payload size"):
        calibrate_runs(runs)
    assert main(["calibrate", *map(str, runs), "--out", str(tmp_path / "p.toml")]) == 2
    assert "at least two sizes" in capsys.readouterr().err
    assert not (tmp_path / "p.toml").exists()


def test_too_few_steps_is_refused(tmp_path):
    runs = [write_run(tmp_path / "a", n_params=10_000, steps=3), write_run(tmp_path / "b", n_params=99, steps=3)]
    with pytest.raises(ConfigError, match="too little data to fit compute time"):
        calibrate_runs(runs)


def test_no_runs_and_no_payload_are_refused(runs, tmp_path):
    with pytest.raises(ConfigError, match="at least one run directory"):
        calibrate_runs([])
    fit = calibrate_runs(runs)
    fit["payload_bytes"] = []
    with pytest.raises(ConfigError, match="give n_params"):
        platform_toml(fit)
