"""psgdlab calibrate on synthetic run directories with known latency, bandwidth and compute."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from psgdlab.analysis.calibrate import Calibration, calibrate_runs, platform_profile
from psgdlab.cli import main
from psgdlab.core.algorithms import make_algorithm
from psgdlab.core.errors import ConfigError
from psgdlab.core.exchange import ExchangeKind, trainer_merges
from psgdlab.core.platform.cost import allreduce_messages, allreduce_rounds
from psgdlab.core.records.rundir import RunDir, Summary, commit_run, write_summary
from psgdlab.core.records.trace import TraceBuilder, summarize, write_trace
from psgdlab.sim.workload import load_config

ALPHA, BETA, MEAN, CV = 2e-4, 1e9, 0.05, 0.1
AR_ALPHA, AR_BETA = 5e-5, 3e9  # the allreduce's own link (an implementation's collective is not its send/recv)
GAP = 4e-4  # host work per step between the exchanges and the next compute
W_MSG, W_BYTE, CORES = 3e-4, 4e-9, 2  # CPU work of communication on a 2-core machine


def ring_s(n, S, schedule="ring"):
    return allreduce_rounds(n, schedule) * AR_ALPHA + 2 * (n - 1) / n * S / AR_BETA


def write_run(
    path,
    *,
    n_params,
    workers=2,
    steps=30,
    pairwise=False,
    server=False,
    seed=0,
    itemsize=8,
    mem_bw=None,
    algorithm="ssgd",
    fold=(0.0, 0.0),
    schedule=None,
    merge=(0.0, 0.0),
    resolved=None,
    spread=0.0,
):
    """A runtime-like run directory on a machine of CORES cores: compute records drawn from a
    lognormal law, exchanges of the exact cost model (allreduces over more workers than cores
    stretched by the CPU model) plus non-negative waiting (what the fit must see through).
    ``resolved``: the algorithm's parameters, written to config.resolved.json as the runtime
    does; then only the steps whose training thread folds an average back pay ``merge``.
    ``spread``: each allreduce's cost times a factor uniform in ``[1 - spread, 1 + spread]``."""
    alg = (
        make_algorithm(resolved["algorithm"], **{k: v for k, v in resolved.items() if k != "algorithm"})
        if resolved
        else None
    )
    rng = np.random.default_rng(seed)
    S = n_params * itemsize
    sigma = np.sqrt(np.log1p(CV**2))
    tb = TraceBuilder()

    def compute(r, s, t):
        c = float(rng.lognormal(np.log(MEAN) - sigma**2 / 2, sigma))
        tb.add(rank=r, step=s, phase="compute", start_s=t, end_s=t + c, staleness=0, loss=1.0)
        return c

    if pairwise or server:
        for r in range(workers):
            t = 0.0
            for s in range(steps):
                c = compute(r, s, t)
                t += c
                if pairwise:
                    d = ALPHA + S / BETA + (0.0 if rng.random() < 0.5 else float(rng.exponential(0.01)))
                    tb.add(
                        rank=r,
                        step=s,
                        phase="overlap",
                        start_s=t - c,
                        end_s=t - c + d,
                        kind=ExchangeKind.PAIRWISE,
                        peer=1 - r,
                        nbytes=S,
                    )
                else:
                    d = ALPHA + S / BETA + 1e-3 + (3 * S / mem_bw if mem_bw else 0.0)
                    d += float(rng.exponential(2e-3)) if rng.random() < 0.3 else 0.0
                    tb.add(
                        rank=r,
                        step=s,
                        phase="comm",
                        start_s=t,
                        end_s=t + d,
                        kind=ExchangeKind.SERVER,
                        peer=-2,
                        nbytes=S,
                    )
                    t += d
                merges = pairwise and (alg is None or trainer_merges(alg.exchanges(s, r)))
                t += GAP + (merge[0] + merge[1] * S if merges else 0.0)  # folding the average back
    else:  # allreduce: every member leaves when the last has arrived plus the exchange's cost
        d = ring_s(workers, S, schedule or "ring") + max(0, workers / CORES - 1) * (
            allreduce_messages(workers, schedule or "ring") * W_MSG + 2 * (workers - 1) / workers * S * W_BYTE
        )
        d += fold[0] + fold[1] * S  # a model average's record also holds folding the mean back
        t = np.zeros(workers)
        for s in range(steps):
            arrive = t + [compute(r, s, t[r]) for r in range(workers)]
            end = arrive.max() + d * (1.0 + spread * float(rng.uniform(-1.0, 1.0)) if spread else 1.0)
            for r in range(workers):
                tb.add(
                    rank=r,
                    step=s,
                    phase="comm",
                    start_s=arrive[r],
                    end_s=end,
                    kind=ExchangeKind.ALLREDUCE,
                    nbytes=2 * (workers - 1) * S // workers,
                )
            t = np.full(workers, end + GAP)
    trace = tb.array()
    meta = {
        "source": "runtime",
        "n_workers": workers,
        "samples_per_step": 8,
        "n_params": n_params,
        "itemsize": itemsize,
        "payload_bytes": S,
        **({"allreduce_algorithm": schedule} if schedule else {}),
    }
    rd = RunDir(path)
    write_trace(rd / "trace.npz", trace, meta)
    figures = {**summarize(trace, samples_per_step=8), **meta}
    del figures["workers"], figures["source"]
    write_summary(
        rd,
        Summary(
            source="runtime",
            algorithm=algorithm,
            algorithm_params={"algorithm": algorithm},
            workers=workers,
            figures=figures,
        ),
    )
    rd.write_json("env.json", {"cpu_count": CORES})
    if resolved:
        rd.write_json("config.resolved.json", {"algorithm": resolved, "world_size": workers})
    commit_run(path, command="test")
    return path


@pytest.fixture
def runs(tmp_path):
    return [
        write_run(tmp_path / "a", n_params=10_000, seed=1),
        write_run(tmp_path / "b", n_params=200_000, seed=2),
        write_run(tmp_path / "c", n_params=10_000, pairwise=True, seed=3),
        write_run(tmp_path / "d", n_params=200_000, pairwise=True, seed=4),
        write_run(tmp_path / "e", n_params=50_000, server=True, seed=5),
    ]


def test_calibrate_recovers_known_platform(runs):
    fit = calibrate_runs(runs)
    assert fit["link"]["latency_s"] == pytest.approx(ALPHA, rel=1e-6)
    assert fit["link"]["bandwidth_bytes_per_s"] == pytest.approx(BETA, rel=1e-6)
    assert fit["collective"]["latency_s"] == pytest.approx(AR_ALPHA, rel=1e-6)  # fitted apart
    assert fit["collective"]["bandwidth_bytes_per_s"] == pytest.approx(AR_BETA, rel=1e-6)
    assert fit["compute"]["mean_s"] == pytest.approx(MEAN, rel=0.02)
    assert fit["compute"]["cv"] == pytest.approx(CV, rel=0.15)
    assert fit["server"]["service_overhead_s"] == pytest.approx(1e-3, abs=5e-4)
    assert fit["server"]["memory_bandwidth_bytes_per_s"] is None  # one size: no update cost fitted
    assert fit["payload_bytes"] == [80_000, 1_600_000, 80_000, 1_600_000, 400_000]
    assert fit["compute"]["step_overhead_s"] == pytest.approx(GAP, rel=1e-6)
    assert fit["host_cpu"] is None and fit["cores"] == CORES  # no run had more workers than cores


def test_calibrate_recovers_the_cpu_work_of_oversubscribed_runs(runs, tmp_path):
    busy = [
        write_run(tmp_path / "w4a", n_params=10_000, workers=4, seed=7),
        write_run(tmp_path / "w4b", n_params=200_000, workers=4, seed=8),
    ]
    fit = calibrate_runs(runs + busy)
    assert fit["link"]["latency_s"] == pytest.approx(ALPHA, rel=1e-6)  # the busy runs stay out of the link
    cpu = fit["host_cpu"]
    assert cpu["cores_per_host"] == CORES
    assert cpu["work_per_message_s"] == pytest.approx(W_MSG, rel=1e-6)
    assert cpu["work_per_byte_s"] == pytest.approx(W_BYTE, rel=1e-6)
    cfg_text = platform_profile(fit, n_params=50_000, devices=8).to_toml()
    assert "[platform.host_cpu]" in cfg_text
    with pytest.raises(ConfigError, match="more workers than the 1 cores"):
        calibrate_runs(runs, cores=1)
    with pytest.raises(ConfigError, match="single payload size"):
        calibrate_runs(runs + busy[:1])


def test_calibrate_separates_the_merge_of_pairwise_averages(runs, tmp_path):
    """Runs with pairwise averages spend longer between steps (merging the average back): that
    excess over the other runs' overhead line is the platform's mix merge, and the base step
    overhead stays that of the runs without."""
    merge = (3e-4, 2e-10)
    mixing = [
        write_run(tmp_path / f"m{i}", n_params=n, pairwise=True, seed=20 + i, merge=merge)
        for i, n in enumerate((10_000, 200_000))
    ]
    fit = calibrate_runs(runs[:2] + mixing + runs[4:])
    assert fit["compute"]["step_overhead_s"] == pytest.approx(GAP, rel=1e-6)
    assert fit["mix_merge"]["fixed_s"] == pytest.approx(merge[0], rel=1e-6)
    assert fit["mix_merge"]["s_per_byte"] == pytest.approx(merge[1], rel=1e-6)
    cfg = load_config(data=__import__("tomllib").loads(platform_profile(fit, n_params=50_000).to_toml()))
    assert cfg.platform.mix_merge_s == pytest.approx(merge[0], rel=1e-6)
    assert calibrate_runs(runs)["mix_merge"]["fixed_s"] == pytest.approx(0.0, abs=1e-12)  # no merge measured
    only_pairwise = calibrate_runs(mixing)  # no run without pairwise averages: no base to measure it against
    assert only_pairwise["mix_merge"] is None


@pytest.mark.parametrize("variant", ["fixed", "random"])
def test_the_merge_is_fitted_from_the_steps_whose_training_thread_folds_the_average(runs, tmp_path, variant):
    """With the run's resolved algorithm, only the active sides' steps measure the merge (a
    passive AD-PSGD side merges in its responder): averaging them with the passive steps would
    halve it. The passive steps' own excess is reported (0 here)."""
    merge = (3e-4, 2e-10)
    resolved = {"algorithm": "adpsgd", "n_workers": 4, "variant": variant, "seed": 3}
    mixing = [
        write_run(tmp_path / f"m{i}", n_params=n, workers=4, pairwise=True, seed=20 + i, merge=merge, resolved=resolved)
        for i, n in enumerate((10_000, 200_000))
    ]
    fit = calibrate_runs(runs[:2] + mixing + runs[4:], cores=4)
    assert (fit["mix_merge"]["fixed_s"], fit["mix_merge"]["s_per_byte"]) == pytest.approx(merge, rel=1e-6)
    assert fit["mix_merge"]["passive_excess_s"] == pytest.approx([0.0, 0.0], abs=1e-9)
    assert "passive sides' own excess" in platform_profile(fit, n_params=50_000).to_toml()


@pytest.mark.parametrize("schedule", ["direct", "halving-doubling"])
def test_calibrate_fits_the_allreduce_schedule_the_runs_recorded(tmp_path, schedule):
    """Runs of a transport whose allreduce latency does not grow as a ring's (the shared-memory
    plane: two rounds whatever n) give back the same link and CPU work, and the schedule goes
    into the platform; fitted as a ring, the 4-worker runs' excess would be misread."""
    mk = [
        dict(n_params=10_000, seed=1),
        dict(n_params=200_000, seed=2),
        dict(n_params=10_000, pairwise=True, seed=3),
        dict(n_params=200_000, pairwise=True, seed=4),
        dict(n_params=10_000, workers=4, seed=7),
        dict(n_params=200_000, workers=4, seed=8),
    ]
    runs = [write_run(tmp_path / f"r{i}", schedule=schedule, **kw) for i, kw in enumerate(mk)]
    fit = calibrate_runs(runs)
    assert fit["allreduce_algorithm"] == schedule
    assert fit["collective"]["latency_s"] == pytest.approx(AR_ALPHA, rel=1e-6)
    assert fit["host_cpu"]["work_per_message_s"] == pytest.approx(W_MSG, rel=1e-6)
    assert fit["host_cpu"]["work_per_byte_s"] == pytest.approx(W_BYTE, rel=1e-6)
    cfg = load_config(data=__import__("tomllib").loads(platform_profile(fit, n_params=50_000).to_toml()))
    assert cfg.platform.allreduce == schedule
    as_ring = [write_run(tmp_path / f"q{i}", **kw) for i, kw in enumerate(mk)]  # the same runs, schedule unsaid
    wrong = calibrate_runs([*runs[:4], *as_ring[4:]])  # 2-worker runs agree; the 4-worker ones are read as a ring
    assert wrong["allreduce_algorithm"] == schedule
    assert wrong["host_cpu"]["work_per_message_s"] != pytest.approx(W_MSG, rel=1e-3)


def test_calibrate_refuses_runs_of_two_allreduce_schedules(runs, tmp_path):
    other = write_run(tmp_path / "x", n_params=10_000, seed=11, schedule="direct")
    ring = write_run(tmp_path / "y", n_params=200_000, seed=12, schedule="ring")
    with pytest.raises(ConfigError, match="different allreduce schedules"):
        calibrate_runs(runs + [other, ring])
    fake = write_run(tmp_path / "z", n_params=10_000, seed=13, pairwise=True, schedule="tree")
    with pytest.raises(ConfigError, match="allreduce_algorithm 'tree'"):
        calibrate_runs(runs + [fake])


def test_server_update_cost_is_fitted_from_two_sizes(runs, tmp_path):
    srv = [
        write_run(tmp_path / f"s{i}", n_params=n, server=True, seed=9 + i, mem_bw=2e9)
        for i, n in enumerate((50_000, 500_000))
    ]
    fit = calibrate_runs(runs[:4] + srv)
    assert fit["server"]["memory_bandwidth_bytes_per_s"] == pytest.approx(2e9, rel=0.1)
    cfg = load_config(data=__import__("tomllib").loads(platform_profile(fit, n_params=50_000).to_toml()))
    assert cfg.platform.server.apply_on_host is True
    assert cfg.platform.host_memory_bandwidth_bytes_per_s == pytest.approx(2e9, rel=0.1)


def test_calibrate_measures_how_single_averages_scatter_around_the_law(runs, tmp_path):
    """Half the synthetic averages take the law exactly, half wait besides (an exponential): the
    scatter's quantiles up to the median are 1, above it they grow past 1; the profile carries
    them on the link inside a host, and its TOML reads them back."""
    from psgdlab.analysis.samples import SCATTER_QUANTILES

    q = np.array(calibrate_runs(runs)["link"]["scatter"])
    levels = np.array(SCATTER_QUANTILES)
    assert q.shape == levels.shape
    np.testing.assert_allclose(q[levels < 0.45], 1.0, rtol=1e-9)
    assert np.all(q[levels > 0.55] > 1.0) and np.all(np.diff(q) >= 0)
    profile = platform_profile(calibrate_runs(runs), n_params=50_000)
    assert profile.platform.pcie.scatter == tuple(q)
    out = profile.write(tmp_path / "p.toml")
    assert load_config(path=out).platform.pcie.scatter == tuple(q)
    no_pairwise = calibrate_runs(runs[:2])
    assert no_pairwise["link"]["scatter"] == ()  # nothing measured: every average takes the law
    assert platform_profile(no_pairwise, n_params=50_000).platform.pcie.scatter == ()


def test_calibrate_measures_how_single_allreduces_scatter_around_the_law(tmp_path):
    """Allreduces of 2 workers whose cost is the law times a factor uniform in [0.8, 1.2]: the
    collective's scatter is their quantiles over the median (about 0.8 / 1.0 ... 1.2 / 1.0 at
    its ends, 1 at its middle); the profile carries it on ``platform.collective`` and its TOML
    reads it back. Runs of 4 workers on 2 cores (oversubscribed) do not count; allreduces of
    the law alone scatter by nothing."""
    from psgdlab.analysis.load import load_run
    from psgdlab.analysis.samples import SCATTER_QUANTILES, allreduce_scatter

    spread = [
        write_run(tmp_path / f"a{i}", n_params=n, seed=i, spread=0.2, steps=200)
        for i, n in enumerate((10_000, 200_000))
    ]
    pairs = [
        write_run(tmp_path / f"p{i}", n_params=n, pairwise=True, seed=5 + i) for i, n in enumerate((10_000, 200_000))
    ]
    fit = calibrate_runs(spread + pairs)
    q = np.array(fit["collective"]["scatter"])
    assert q.shape == (len(SCATTER_QUANTILES),) and np.all(np.diff(q) >= 0)
    assert q[0] == pytest.approx(0.8 + 0.4 * SCATTER_QUANTILES[0], abs=0.04)
    assert q[-1] == pytest.approx(0.8 + 0.4 * SCATTER_QUANTILES[-1], abs=0.04)
    assert q[len(q) // 2] == pytest.approx(1.0, abs=0.01)
    profile = platform_profile(fit, n_params=50_000)
    assert profile.platform.collective.scatter == tuple(q)
    out = profile.write(tmp_path / "p.toml")
    assert load_config(path=out).platform.collective.scatter == tuple(q)
    four = write_run(tmp_path / "w4", n_params=10_000, workers=4, seed=9, spread=0.5)
    assert allreduce_scatter([load_run(four)]) == ()
    exact = [load_run(write_run(tmp_path / "e", n_params=10_000, seed=3))]
    np.testing.assert_allclose(allreduce_scatter(exact), 1.0, rtol=1e-9)


def test_calibrate_cli_writes_loadable_toml(runs, tmp_path, capsys):
    out = tmp_path / "platform.toml"
    assert main(["calibrate", *map(str, runs), "--out", str(out), "--n-params", "50000"]) == 0
    printed = capsys.readouterr().out
    assert "latency" in printed and "allreduce schedule: ring" in printed and "step overhead" in printed
    assert "merge of an average by the training thread" in printed
    text = out.read_text()
    assert "# Residuals of the fit:" in text and "Kolmogorov-Smirnov" in text
    cfg = load_config(path=out)
    assert cfg.platform.hosts == 1 and cfg.platform.sockets_per_host == cfg.platform.devices_per_host
    assert cfg.platform.pcie.latency_s == pytest.approx(ALPHA, rel=1e-6)
    assert cfg.platform.nic.bandwidth_bytes_per_s == pytest.approx(BETA, rel=1e-6)
    assert cfg.platform.collective.latency_s == pytest.approx(AR_ALPHA, rel=1e-6)
    assert cfg.platform.collective.bandwidth_bytes_per_s == pytest.approx(AR_BETA, rel=1e-6)
    assert cfg.workload.n_params == 50_000 and cfg.workload.itemsize == 8
    assert cfg.workload.compute_time.mean_s == pytest.approx(MEAN + GAP, rel=0.02)
    assert cfg.workload.batch_per_worker == 8
    assert not list(tmp_path.glob(".platform.toml.tmp*"))


def test_single_payload_size_keeps_the_bandwidth_prior_and_marks_it_unpinned(tmp_path, capsys):
    """One payload size cannot separate latency from bandwidth: the bandwidth keeps its prior
    (core.priors.LOOPBACK_BANDWIDTH) and the profile marks it unpinned with the prior's spread,
    instead of refusing (the issue's "a single run stops") or inventing a value."""
    from psgdlab.core.platform.profile import Profile
    from psgdlab.core.stats.priors import LOOPBACK_BANDWIDTH, LOOPBACK_LATENCY

    runs = [write_run(tmp_path / "a", n_params=10_000), write_run(tmp_path / "b", n_params=10_000, seed=1)]
    fit = calibrate_runs(runs)
    assert fit["link"]["unpinned"] == ["bandwidth_bytes_per_s"]
    bw = fit["link"]["bandwidth_bytes_per_s"]
    assert LOOPBACK_BANDWIDTH.low() < bw < LOOPBACK_BANDWIDTH.high()
    assert fit["link"]["bandwidth_log_sd"] == pytest.approx(LOOPBACK_BANDWIDTH.log_sd, rel=0.1)
    assert main(["calibrate", *map(str, runs), "--out", str(tmp_path / "p.toml")]) == 0
    assert "unpinned" in capsys.readouterr().out
    unc = Profile.read(tmp_path / "p.toml").uncertainty
    assert unc is not None and "platform.pcie.bandwidth_bytes_per_s" in unc.unpinned
    assert all(sd <= max(LOOPBACK_BANDWIDTH.log_sd, LOOPBACK_LATENCY.log_sd) for sd in unc.log_sd)


def test_too_few_steps_is_refused(tmp_path):
    runs = [write_run(tmp_path / "a", n_params=10_000, steps=3), write_run(tmp_path / "b", n_params=99, steps=3)]
    with pytest.raises(ConfigError, match="too little data to fit compute time"):
        calibrate_runs(runs)


def test_no_runs_and_no_payload_are_refused(runs, tmp_path):
    with pytest.raises(ConfigError, match="at least one run directory"):
        calibrate_runs([])
    fit = dataclasses.replace(calibrate_runs(runs), payload_bytes=())
    with pytest.raises(ConfigError, match="give n_params"):
        platform_profile(fit).to_toml()


def test_one_kind_of_exchange_gives_one_link_and_no_collective(runs):
    """Allreduces alone (or pairwise exchanges alone) cannot be told apart from the link: one fit."""
    fit = calibrate_runs(runs[:2])
    assert fit["collective"] is None
    assert fit["link"]["latency_s"] == pytest.approx(AR_ALPHA, rel=1e-6)
    assert fit["link"]["bandwidth_bytes_per_s"] == pytest.approx(AR_BETA, rel=1e-6)
    assert "[platform.collective]" not in platform_profile(fit, n_params=50_000).to_toml()


def test_step_overhead_grows_with_the_model_and_is_taken_at_the_workload_size():
    from psgdlab.analysis.fits import fit_overhead_per_byte

    a, b = 3e-4, 1e-9
    pts = [(S, a + b * S + e) for S in (4e5, 4e6) for e in (-1e-5, 0.0, 2e-4)]  # medians on the line
    assert fit_overhead_per_byte(pts) == pytest.approx((a, b), rel=1e-6)
    assert fit_overhead_per_byte([(4e5, 1e-3), (4e5, 2e-3), (4e5, 4e-3)]) == (2e-3, 0.0)  # one size
    assert fit_overhead_per_byte([(4e5, 2e-3), (4e6, 1e-3)]) == (1.5e-3, 0.0)  # falling: no per-byte term
    assert fit_overhead_per_byte([]) == (0.0, 0.0)
    comp = {
        "mean_s": MEAN,
        "cv": CV,
        "p50_s": MEAN,
        "p95_s": MEAN,
        "samples": 9,
        "ks_distance": 0.0,
        "spec": f"lognormal:{MEAN}:{CV}",
        "step_overhead_fixed_s": a,
        "step_overhead_s_per_byte": b,
        "step_overhead_s": a + b * 4e6,
    }
    fit = Calibration.from_json(
        {
            "compute": comp,
            "link": {
                "latency_s": 0.0,
                "bandwidth_bytes_per_s": 1e9,
                "samples": 9,
                "points": 2,
                "rms_residual_s": 0.0,
                "max_rel_residual": 0.0,
                "allreduce_samples": 0,
                "pairwise_samples": 9,
                "payload_sizes_bytes": [1, 2],
            },
            "server": None,
            "runs": [],
            "max_workers": 2,
            "payload_bytes": [4_000_000],
        }
    )
    cfg = load_config(data=__import__("tomllib").loads(platform_profile(fit, n_params=250_000, itemsize=8).to_toml()))
    # the overhead is host work of the platform beside the compute law (a straggler does not scale it)
    assert cfg.workload.compute_time.mean_s == pytest.approx(MEAN, rel=1e-5)
    assert (cfg.platform.step_overhead_s, cfg.platform.step_overhead_s_per_byte) == pytest.approx((a, b), rel=1e-9)


def test_model_averaging_runs_fit_the_fold_and_stay_out_of_the_links(runs, tmp_path):
    fold = (6e-4, 1.5e-9)
    avg = [
        write_run(tmp_path / f"bmuf{i}", n_params=n, seed=20 + i, algorithm="bmuf", fold=fold)
        for i, n in enumerate((10_000, 200_000))
    ]
    fit = calibrate_runs(runs + avg)
    assert fit["collective"]["latency_s"] == pytest.approx(AR_ALPHA, rel=1e-6)  # not moved by the bmuf runs
    assert fit["collective"]["bandwidth_bytes_per_s"] == pytest.approx(AR_BETA, rel=1e-6)
    assert (fit["model_average"]["fixed_s"], fit["model_average"]["s_per_byte"]) == pytest.approx(fold, rel=1e-6)
    cfg = load_config(data=__import__("tomllib").loads(platform_profile(fit, n_params=50_000).to_toml()))
    assert cfg.platform.model_average_s == pytest.approx(fold[0], rel=1e-6)
    assert cfg.platform.model_average_s_per_byte == pytest.approx(fold[1], rel=1e-6)
    assert calibrate_runs(runs)["model_average"] is None
    with pytest.raises(ConfigError, match="without model averaging"):
        calibrate_runs(avg)


@pytest.mark.parametrize("variant, averages", [("sync", True), ("async", False)])
def test_model_averaging_is_asked_of_the_schedule_not_the_name(runs, tmp_path, variant, averages):
    """Synchronous EASGD allreduces the model (core.exchange.folds_model of its schedule) and is
    priced like BMUF; a run whose algorithm never allreduces the model is not, whatever its name."""
    fold = (6e-4, 1.5e-9)
    easgd = [
        write_run(
            tmp_path / f"easgd{i}",
            n_params=n,
            seed=40 + i,
            algorithm="easgd",
            fold=fold,
            resolved={"algorithm": "easgd", "n_workers": 2, "variant": variant, "period": 1},
        )
        for i, n in enumerate((10_000, 200_000))
    ]
    fit = calibrate_runs(runs + easgd)
    if averages:
        assert (fit["model_average"]["fixed_s"], fit["model_average"]["s_per_byte"]) == pytest.approx(fold, rel=1e-6)
        assert fit["collective"]["latency_s"] == pytest.approx(AR_ALPHA, rel=1e-6)
    else:
        assert fit["model_average"] is None


def test_calibrate_writes_a_profile_that_reads_back(runs, tmp_path):
    from psgdlab.analysis.calibrate import platform_profile
    from psgdlab.core.platform.profile import Profile

    profile = platform_profile(calibrate_runs(runs), n_params=50_000, workers=(1, 2))
    back = Profile.read(profile.write(tmp_path / "p.toml"))
    assert back == profile and back.notes[0].startswith("Platform profile fitted by `psgdlab calibrate`")
    assert back.defaults.workers == (1, 2) and back.platform.pcie == back.platform.nic


def _between_hosts(path, rate):
    """Mark a run directory as one of 2 emulated hosts with one rank each, shaped to ``rate``."""
    from dataclasses import replace

    from psgdlab.core.records.rundir import read_summary

    write_summary(path, replace(read_summary(path), hosts=2, placement=(0, 1)))
    RunDir(path).write_json("hosts.json", {"hosts": 2, "placement": [0, 1], "nic_bandwidth_bytes_per_s": rate})
    return path


def test_calibrate_fits_the_link_between_hosts_apart(runs, tmp_path, monkeypatch):
    """Runs with one rank per emulated host give the link between hosts (their own latency and
    bandwidth, fitted apart from the runs of one host, which keep theirs); the platform then has
    the hosts, the NIC at the fitted latency and bandwidth with the ranks as its endpoints (a
    message between hosts costs what the runs measured), and the schedule of an allreduce
    across hosts. Runs with two ranks on a host, or of two rates, are
    refused."""
    nic_alpha, nic_beta = 3e-3, 1.2e7
    monkeypatch.setitem(write_run.__globals__, "ALPHA", nic_alpha)  # the law write_run draws from
    monkeypatch.setitem(write_run.__globals__, "BETA", nic_beta)
    crossing = [
        _between_hosts(write_run(tmp_path / f"x{i}", n_params=n, pairwise=True, seed=40 + i), 1.25e7)
        for i, n in enumerate((10_000, 200_000))
    ]
    monkeypatch.undo()
    fit = calibrate_runs(runs + crossing)
    assert fit["link"]["latency_s"] == pytest.approx(ALPHA, rel=1e-6)  # the hosts' own link is untouched
    nic = fit["nic"]
    assert nic["latency_s"] == pytest.approx(nic_alpha, rel=1e-6)
    assert nic["bandwidth_bytes_per_s"] == pytest.approx(nic_beta, rel=1e-6)
    assert nic["rate_bytes_per_s"] == 1.25e7 and nic["hosts"] == 2
    platform = platform_profile(fit, n_params=50_000, devices=2, hosts=4).platform
    assert (platform.hosts, platform.devices_per_host) == (4, 2)
    assert platform.nic.bandwidth_bytes_per_s == pytest.approx(nic_beta, rel=1e-6)
    assert platform.nic.latency_s == pytest.approx(nic_alpha, rel=1e-6)
    assert platform.endpoints == "process"
    assert platform.allreduce_between_hosts == "ring"
    from psgdlab.sim.network import Network
    from psgdlab.sim.platform import Placement

    net = Network(platform, Placement.pack(platform, 4))
    for S in (1e4, 1e6):  # the end-to-end law the runs between hosts were fitted to
        _, cap, after = net.wire(0, 2, S, 100.0 * S)  # alone on the NICs: the whole of them
        assert after + S / cap == pytest.approx(nic_alpha + S / nic_beta, rel=1e-9)
    assert (
        calibrate_runs(runs)["nic"] is None and platform_profile(calibrate_runs(runs), n_params=10).platform.hosts == 1
    )
    other = _between_hosts(write_run(tmp_path / "y", n_params=10_000, pairwise=True, seed=50), 2.5e7)
    with pytest.raises(ConfigError, match="different NIC rates"):
        calibrate_runs(runs + crossing + [other])
    from dataclasses import replace

    from psgdlab.core.records.rundir import read_summary

    write_summary(other, replace(read_summary(other), hosts=2, placement=(0, 0, 1, 1), workers=4))
    with pytest.raises(ConfigError, match="several ranks on one host"):
        calibrate_runs(runs + [other])
    with pytest.raises(ConfigError, match="on one host"):
        calibrate_runs(crossing)


def test_the_allreduce_between_hosts_is_fitted_apart_from_their_messages(runs, tmp_path, monkeypatch):
    """Runs between hosts with both kinds of exchange at two sizes each fit the pairwise link (a
    message between hosts: the NIC) and, apart, the bandwidth of the allreduce across hosts, as
    a collective is fitted apart inside a host; with one group size its rounds take the
    messages' latency. The simulator prices each with its own law, and the spread of both
    reaches the intervals."""
    nic_alpha, nic_beta, span_beta = 3e-3, 1.0e7, 1.4e7
    span_alpha = nic_alpha
    monkeypatch.setitem(write_run.__globals__, "ALPHA", nic_alpha)
    monkeypatch.setitem(write_run.__globals__, "BETA", nic_beta)
    monkeypatch.setitem(write_run.__globals__, "AR_ALPHA", span_alpha)
    monkeypatch.setitem(write_run.__globals__, "AR_BETA", span_beta)
    crossing = [
        _between_hosts(write_run(tmp_path / f"{kind}{i}", n_params=n, pairwise=kind == "pair", seed=60 + i), 1.25e7)
        for kind in ("pair", "ring")
        for i, n in enumerate((10_000, 200_000))
    ]
    monkeypatch.undo()
    fit = calibrate_runs(runs + crossing)
    nic, span = fit["nic"], fit["nic"]["collective"]
    assert (nic["latency_s"], nic["bandwidth_bytes_per_s"]) == pytest.approx((nic_alpha, nic_beta), rel=1e-6)
    assert (span["latency_s"], span["bandwidth_bytes_per_s"]) == pytest.approx((span_alpha, span_beta), rel=1e-6)
    assert span["latency_s"] == nic["latency_s"]  # groups of one size: the rounds take a message's latency
    profile = platform_profile(fit, n_params=50_000, devices=2, hosts=2)
    platform = profile.platform
    assert platform.collective_between_hosts is not None
    assert platform.collective_between_hosts.bandwidth_bytes_per_s == pytest.approx(span_beta, rel=1e-6)
    assert "allreduce between hosts (fitted apart" in "\n".join(profile.notes)
    from psgdlab.core.platform.profile import Profile
    from psgdlab.sim.network import Network
    from psgdlab.sim.platform import Placement

    assert Profile.read(profile.write(tmp_path / "p.toml")) == profile
    net = Network(platform, Placement.pack(platform, 4))
    S = 1e6
    _, cap, after = net.wire(0, 2, S, 0.0)
    assert after + S / cap == pytest.approx(nic_alpha + S / nic_beta, rel=1e-9)  # a message: the NIC
    assert net.allreduce_s((0, 2), S, 10.0) == pytest.approx(2 * span_alpha + S / span_beta, rel=1e-9)
    u = profile.uncertainty
    assert "platform.collective_between_hosts.bandwidth_bytes_per_s" in u.parameters
    i, j = (u.parameters.index(f"platform.{t}.latency_s") for t in ("nic", "collective_between_hosts"))
    assert u.log_sd[i] == u.log_sd[j] and u.correlation[i][j] == pytest.approx(1.0)  # one latency, one spread
    assert [row[i] for row in u.correlation] == pytest.approx([row[j] for row in u.correlation])
    k = u.parameters.index("platform.collective_between_hosts.bandwidth_bytes_per_s")
    assert u.correlation[k][j] > 0  # a longer latency leaves the measured allreduces' bytes less time
    from psgdlab.core.records.intervals import directions

    for d in directions(u):  # the two move together in every direction of the intervals
        assert d.get(u.parameters[i], 0.0) == pytest.approx(d.get(u.parameters[j], 0.0), abs=1e-9)
    # one kind only: one fit prices both, as before
    assert calibrate_runs(runs + crossing[:2])["nic"]["collective"] is None


def write_probe(path, *, hosts, w_msg, w_byte, rate=6.25e7, latency=1e-3, seed=0):
    """A probe directory as ``calibrate --probe`` writes it (group 2, ring): every member's CPU
    time the exact law ``w_msg`` per message plus ``w_byte`` per byte it sends, the wall time
    a latency plus the bytes at ``rate``."""
    from psgdlab.runtime.launcher.probe import KINDS, PROBE_DTYPE

    rng = np.random.default_rng(seed)
    rows = []
    for kind, code in KINDS.items():
        messages = 1 if kind == "pairwise" else allreduce_messages(2, "ring")  # each sends S: 2(n-1)/n S at n = 2
        for size in (1 << 16, 1 << 20, 1 << 22):
            for rep in range(6):
                for rank in range(2):
                    wall = latency + size / rate * (1 + 0.01 * rng.standard_normal())
                    cpu = messages * w_msg + size * w_byte
                    rows.append((code, 2, size, rep, rank, wall, cpu, rep == 0))
    path.mkdir(parents=True)
    np.savez(path / "probe.npz", records=np.array(rows, dtype=PROBE_DTYPE))
    env = {"hosts": hosts, "world_size": 2, "cpu_count": CORES, "allreduce_algorithm": "ring"}
    env["nic_bandwidth_bytes_per_s"] = rate if hosts > 1 else None
    RunDir(path).write_json("env.json", env)
    commit_run(path, command="test")
    return path


def test_a_probe_between_hosts_gives_the_cpu_work_of_a_message_between_hosts(tmp_path):
    """Runs of one host with more workers than cores fit the CPU work inside a host; a probe
    with one rank per emulated host measures it between hosts (a socket through the network
    stack), and the platform charges each where it applies. One probe of each kind is taken;
    two between hosts are refused."""
    busy = [
        write_run(tmp_path / "w4a", n_params=10_000, workers=4, seed=7),
        write_run(tmp_path / "w4b", n_params=200_000, workers=4, seed=8),
    ]
    runs = [write_run(tmp_path / "a", n_params=10_000, seed=1), write_run(tmp_path / "b", n_params=200_000, seed=2)]
    across = write_probe(tmp_path / "probe-h2", hosts=2, w_msg=2e-4, w_byte=1e-9)
    fit = calibrate_runs(runs + busy + [across])
    assert fit["host_cpu"]["work_per_byte_s"] == pytest.approx(W_BYTE, rel=1e-6)  # the busy runs' own
    between = fit["host_cpu_between_hosts"]
    assert between["work_per_message_s"] == pytest.approx(2e-4, rel=1e-6)
    assert between["work_per_byte_s"] == pytest.approx(1e-9, rel=1e-6)
    profile = platform_profile(fit, n_params=50_000, devices=2)
    cpu = profile.platform.host_cpu
    assert profile.platform.hosts == 2 and cpu.hosts_per_machine == 2
    assert cpu.work_per_byte_between_hosts_s == pytest.approx(1e-9, rel=1e-6)
    assert cpu.work_s(1, 1e6, between_hosts=True) == pytest.approx(2e-4 + 1e-3, rel=1e-6)
    assert "platform.host_cpu.work_per_byte_between_hosts_s" in profile.uncertainty.parameters
    assert "work_per_byte_between_hosts_s" in profile.to_toml()
    nic = fit["nic"]  # the probe's allreduce of 2 apart, at its messages' latency (one group size)
    assert nic["collective"]["latency_s"] == nic["latency_s"] and nic["collective"]["latency_given"]
    assert profile.platform.collective_between_hosts is not None
    inside = write_probe(tmp_path / "probe-h1", hosts=1, w_msg=1e-4, w_byte=2e-10)
    assert calibrate_runs(runs + [inside, across])["host_cpu"]["work_per_byte_s"] == pytest.approx(2e-10, rel=1e-6)
    assert calibrate_runs(runs + busy)["host_cpu_between_hosts"] is None
    with pytest.raises(ConfigError, match="at most one probe directory between hosts"):
        calibrate_runs(runs + [across, write_probe(tmp_path / "probe-h2b", hosts=2, w_msg=1e-4, w_byte=1e-9)])
