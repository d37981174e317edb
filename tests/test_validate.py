"""psgdlab validate: configuration checks, and one tiny end-to-end loop (real processes)."""

from __future__ import annotations

import json

import pytest

from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.validate import ValidateConfig


def test_validate_config_checks(tmp_path):
    with pytest.raises(ConfigError, match="algorithms"):
        ValidateConfig(out=str(tmp_path), algorithms=("nope",))
    with pytest.raises(ConfigError, match="workers"):
        ValidateConfig(out=str(tmp_path), workers=(1,))
    with pytest.raises(ConfigError, match="calibration_dims"):
        ValidateConfig(out=str(tmp_path), calibration_dims=(10, 10))
    with pytest.raises(ConfigError, match=r"dim \(50000\) must differ from the calibration sizes"):
        ValidateConfig(out=str(tmp_path), dim=50_000, calibration_dims=(50_000, 500_000))
    assert ValidateConfig(out=str(tmp_path), dim=250_000).calibration_dims == (125_000, 375_000)
    assert ValidateConfig(out=str(tmp_path), dim=2_000).calibration_dims == (50_000, 500_000)  # latency-bound
    with pytest.raises(ConfigError, match="min_idle_cores"):
        ValidateConfig(out=str(tmp_path), min_idle_cores=-1)
    assert main(["validate", "--algorithms", "nope", "--out", str(tmp_path)]) == 2


def test_stalled_runs_are_recognised(tmp_path):
    from psgdlab.core.trace import TraceBuilder, write_trace
    from psgdlab.validate import _stall

    for pause, stalled in ((0.5, False), (3.0, True)):
        tb = TraceBuilder()
        for r in range(2):
            t = 0.0
            for s in range(20):
                tb.add(rank=r, step=s, phase="compute", start_s=t, end_s=t + 0.05)
                t += 0.05 + (pause if (r, s) == (1, 7) else 0.0)
        write_trace(tmp_path / "trace.npz", tb.array(), {})
        assert (_stall(tmp_path) is not None) is stalled


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_tiny_validate_end_to_end(tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["validate", "--algorithms", "ssgd", "--workers", "2", "--steps", "15", "--dim", "2000",
                 "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"cases", "median_abs_step_time_error", "max_abs_step_time_error"} <= set(result)
    (case,) = result["cases"]
    for key in ("algorithm", "workers", "predicted_step_time_s", "measured_step_time_s", "step_time_error",
                "staleness_mean_predicted", "staleness_mean_measured"):
        assert key in case
    assert case["algorithm"] == "ssgd" and case["workers"] == 2
    assert case["measured_step_time_s"] > 0.04  # emulated 0.05 s compute per step
    assert case["staleness_mean_measured"] == 0.0
    assert (out / "platform.toml").is_file() and (out / "compare" / "report.md").is_file()
    assert set(result["load_average"]) >= {"start", "end", "ssgd-w2"}
    assert result["ranking"]["none"]["2"]["predicted"] == [["ssgd"]]
    # the calibration runs are not the validated case
    assert not any("ssgd-w2" == p.name for p in (out / "calibration").iterdir())
