"""sim.fit: figures tables, the simulator as the fit's model, and the shipped GTX1080 preset as the
fit's output (ALGORITHMS.md §D.3, Tables 4 and 5)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.profile import Link, Platform, Profile, Workload
from psgdlab.sim.fit import (
    GTX1080_PARAMETERS,
    fit_profile,
    gtx1080_paths,
    read_figures,
    simulate_figures,
)
from psgdlab.sim.workload import load_config


def test_read_figures_and_its_errors(tmp_path):
    figs = read_figures("# a comment\nalgorithm,workers,batch,period,speedup\nbmuf,4,256,5,1.85\nssgd,2,32,,1.9\n")
    assert [(f.algorithm, f.workers, f.batch, f.period, f.metric, f.value) for f in figs] == [
        ("bmuf", 4, 256, 5, "speedup", 1.85),
        ("ssgd", 2, 32, None, "speedup", 1.9),
    ]
    with pytest.raises(ConfigError, match="exactly one of the columns speedup, step_time_s"):
        read_figures("algorithm,workers,batch,period\nbmuf,4,256,5\n")
    with pytest.raises(ConfigError, match="missing period"):
        read_figures("algorithm,workers,batch,speedup\nbmuf,4,256,5\n")
    with pytest.raises(ConfigError, match=r"row 2 .* not a number"):
        read_figures("algorithm,workers,batch,period,speedup\nbmuf,four,256,5,2\n")
    with pytest.raises(ConfigError, match=r"speedup \(-2.0\) must be a positive number"):
        read_figures("algorithm,workers,batch,period,speedup\nbmuf,4,256,5,-2\n")
    with pytest.raises(ConfigError, match="does not exist"):
        read_figures(str(tmp_path / "missing.csv"))


def _small() -> Profile:
    return Profile(
        platform=Platform(
            devices_per_host=4,
            device_flops_per_s=1e12,
            compute_efficiency=0.5,
            pcie=Link(latency_s=1e-5, bandwidth_bytes_per_s=1e9, efficiency=0.5),
        ),
        workload=Workload(
            n_params=2_000_000,
            flops_per_sample=1e7,
            compute="lognormal:0.1:0.02",
            reference_batch=32,
            batch_per_worker=32,
        ),
    )


def test_a_known_link_efficiency_is_recovered_with_its_spread():
    """Figures simulated at a PCIe efficiency of 0.3 are fitted back from a prior of 0.6."""
    truth = _small().with_values({"platform.pcie.efficiency": 0.3})
    text = "algorithm,workers,batch,period,step_time_s\n" + "".join(
        f"{a},{n},32,{p},1\n" for a, n, p in (("ssgd", 2, ""), ("ssgd", 4, ""), ("bmuf", 4, 2))
    )
    figs = read_figures(text)
    values = simulate_figures(truth, figs)
    figs = [dataclasses.replace(f, value=float(v)) for f, v in zip(figs, values)]
    fitted, report = fit_profile(
        _small().with_values({"platform.pcie.efficiency": 0.6}),
        figs,
        {"platform.pcie.efficiency": 0.7},
        loo=True,
        groupings=("workers",),
        noise=0.005,
    )
    eff = fitted.platform.pcie.efficiency
    assert abs(np.log(eff / 0.3)) < max(3 * report.log_sd["platform.pcie.efficiency"], 0.02)
    assert report.unpinned == () and report.in_sample_error < 0.01
    u = fitted.uncertainty
    assert u is not None and u.parameters == ("platform.pcie.efficiency",) and u.loo_error is not None
    assert set(report.logo["workers"]) == {"2", "4"}
    assert Profile.from_toml(fitted.to_toml()) == fitted


def test_fit_refuses_a_path_that_is_not_a_positive_value():
    figs = read_figures("algorithm,workers,batch,period,speedup\nssgd,2,32,,1.9\n")
    with pytest.raises(ConfigError, match="names no value"):
        fit_profile(_small(), figs, {"platform.pcie.efficency": 0.7})
    with pytest.raises(ConfigError, match="must name a positive number"):
        fit_profile(_small(), figs, {"platform.nvlink": 0.7})


def test_shipped_preset_is_the_base_with_the_fitted_values():
    base_path, _, _ = gtx1080_paths()
    base, shipped = load_config(path=base_path), load_config(preset="librispeech-gtx1080")
    u = shipped.uncertainty
    assert u is not None and set(u.parameters) == set(GTX1080_PARAMETERS)
    again = base.with_values({p: shipped.get(p) for p in u.parameters}).resolved()
    assert again.platform == shipped.platform and again.workload == shipped.workload
    assert u.loo_error is not None and u.logo_error is not None and u.in_sample_error is not None


def test_shipped_preset_reproduces_its_in_sample_error():
    """Re-simulating the calibration table with the shipped preset gives the in-sample error its
    [uncertainty] table records (the simulator is seeded: same figures, same error)."""
    _, figures_path, _ = gtx1080_paths()
    shipped = load_config(preset="librispeech-gtx1080")
    figs = read_figures(figures_path)
    errors = simulate_figures(shipped, figs) / np.array([f.value for f in figs]) - 1.0
    assert float(np.median(np.abs(errors))) == pytest.approx(shipped.uncertainty.in_sample_error, abs=2e-3)


def test_fit_command_writes_a_profile_with_its_uncertainty(tmp_path, capsys):
    import json

    from psgdlab.cli import main

    base = tmp_path / "base.toml"
    _small().write(base)
    figures = tmp_path / "figures.csv"
    figures.write_text("algorithm,workers,batch,period,step_time_s\nssgd,2,32,,0.12\nssgd,4,32,,0.15\n")
    out = tmp_path / "fitted.toml"
    args = ["fit", str(figures), "--platform", str(base), "--fit", "platform.pcie.efficiency:0.5", "--out", str(out)]
    assert main([*args, "--json", "--no-loo"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["out"] == str(out) and report["loo_error"] is None and report["logo_error"] is not None
    assert [f["given"] for f in report["figures"]] == [0.12, 0.15]
    fitted = load_config(path=out)
    assert fitted.uncertainty.parameters == ("platform.pcie.efficiency",)
    assert fitted.platform.pcie.efficiency == pytest.approx(report["values"]["platform.pcie.efficiency"], rel=1e-5)
    # one description of the fit: the profile's notes are the head and what the printed JSON describes
    from psgdlab.core.platform.profile import Profile
    from psgdlab.sim.fit import FitResult

    assert report["schema_version"] == 1
    result = FitResult.from_json(report)
    assert Profile.read(out).notes == (f"Fitted by `psgdlab fit {figures}`.", *result.describe())
    assert main([*args[:-4], "--fit", "platform.pcie.efficiency:wide", "--out", str(out)]) == 2
    assert "must look like PATH or PATH:SD" in capsys.readouterr().err


_values = st.dictionaries(st.sampled_from(["platform.pcie.efficiency", "workload.compute_jitter_s"]),
                          st.floats(1e-3, 10.0), min_size=1)  # fmt: skip


@given(
    values=_values,
    noise=st.floats(0.0, 1.0),
    loo=st.booleans(),
    logo=st.dictionaries(st.sampled_from(["workers", "batch"]), st.tuples(st.floats(0, 1), st.floats(0, 1))),
    figures=st.lists(st.tuples(st.floats(0.01, 100.0), st.floats(-0.5, 0.5)), min_size=1, max_size=4),
)
def test_a_fit_result_is_read_back_from_its_json_and_describes_what_it_holds(values, noise, loo, logo, figures):
    import json

    from psgdlab.sim.fit import FigureFit, FitResult

    result = FitResult(
        values=values,
        log_sd=dict.fromkeys(values, 0.1),
        prior=dict.fromkeys(values, 1.0),
        prior_log_sd=dict.fromkeys(values, 0.7),
        unpinned=tuple(sorted(values))[:1],
        flat_directions=(dict.fromkeys(values, 0.5),),
        noise=noise,
        in_sample_error=0.01,
        loo_error=0.02 if loo else None,
        logo_error=0.03 if logo else None,
        logo_by_grouping={g: {"median": min(m), "max": max(m)} for g, m in logo.items()},
        figures=tuple(
            FigureFit(
                label=f"ssgd x{i + 2}", given=v, fitted=v * (1 + e), in_sample_error=e, loo_error=e if loo else None
            )
            for i, (v, e) in enumerate(figures)
        ),
        out="fitted.toml",
    )
    assert FitResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    text = "\n".join(result.describe())
    assert all(f"  {k} = " in text for k in values) and (", leave-one-out " in text) == loo
    assert all(f"leave one {g} out" in text for g in logo)
    assert sum(line.startswith("  ssgd x") for line in result.describe()) == len(figures)
