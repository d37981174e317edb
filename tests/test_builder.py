"""One platform-aware algorithm builder (:func:`psgdlab.core.algorithms.algorithm_from_flags`):
``predict``, ``emulate`` and ``train`` build the same algorithm from the same flags on the same
platform, and ``predict`` and ``emulate`` say so in their summaries."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.cli import main
from psgdlab.core.algorithms import ALGORITHMS, PlatformFacts, algorithm_from_flags
from psgdlab.core.errors import TestbedError
from psgdlab.core.platform.profile import Profile
from psgdlab.emulate import EmulateConfig
from psgdlab.emulate import build_algorithm as emulated
from psgdlab.models.recipes import LSQ_MODEL
from psgdlab.sim.predict import build_algorithm as predicted
from psgdlab.sim.workload import DEFAULT_PRESET, load_config

BASE = load_config(preset=DEFAULT_PRESET)
VARIANTS = tuple(sorted({v for cls in ALGORITHMS.values() for v in cls.variants}))


def platform(devices_per_host: int, period: int | None) -> Profile:
    """The default preset with ``devices_per_host`` devices a host (one socket) and a
    ``[defaults] period`` of ``period``."""
    return dataclasses.replace(
        BASE,
        platform=dataclasses.replace(BASE.platform, devices_per_host=devices_per_host, sockets_per_host=1),
        defaults=dataclasses.replace(BASE.defaults, period=period),
    )


def outcome(build: Any) -> Any:
    """The algorithm ``build()`` makes, or the error it raises (its type and its one line)."""
    try:
        return build()
    except TestbedError as exc:
        return type(exc).__name__, str(exc)


flags = st.fixed_dictionaries(
    {
        "name": st.sampled_from(tuple(ALGORITHMS)),
        "workers": st.integers(2, 24),
        "period": st.none() | st.integers(1, 12),
        "variant": st.none() | st.sampled_from(VARIANTS),
        "gpus_per_node": st.none() | st.integers(1, 8),
        "seed": st.integers(0, 3),
    }
)


# period 1 is legal but pointless for some (a TestbedWarning): the flags are drawn, not chosen
@pytest.mark.filterwarnings("ignore::psgdlab.core.errors.TestbedWarning")
@settings(max_examples=400, deadline=None)
@given(f=flags, devices=st.integers(1, 8), default_period=st.none() | st.integers(1, 12))
def test_predict_and_emulate_build_the_same_algorithm_from_the_same_flags(f, devices, default_period):
    config = platform(devices, default_period)
    name, n = f["name"], f["workers"]
    keys = {k: f[k] for k in ("period", "variant", "gpus_per_node")}
    by_predict = outcome(lambda: predicted(name, n, config, seed=f["seed"], **keys))
    by_emulate = outcome(
        lambda: emulated(EmulateConfig(algorithm=name, workers=n, seed=f["seed"], model=LSQ_MODEL, **keys), config)
    )
    assert by_predict == by_emulate
    if isinstance(by_predict, tuple):
        return
    params = by_predict.params()
    if "gpus_per_node" in params:  # H-ADPSGD's node: the flag, else the host's devices (at most the workers)
        assert params["gpus_per_node"] == (f["gpus_per_node"] or min(devices, n))
    if "period" in params:  # the flag, else the platform's default period, else the algorithm's
        own = dataclasses.fields(ALGORITHMS[name])
        default = next(x.default for x in own if x.name == "period")
        assert params["period"] == (f["period"] or default_period or default)


@pytest.mark.filterwarnings("ignore::psgdlab.core.errors.TestbedWarning")
@settings(max_examples=150, deadline=None)
@given(f=flags, hosts=st.integers(1, 4), per_host=st.integers(1, 6))
def test_train_builds_what_predict_builds_on_a_platform_of_its_hosts(f, hosts, per_host):
    """``psgdlab train --hosts H`` runs on ``H`` hosts of ``workers / H`` ranks each: it builds
    the algorithm ``predict`` builds on a platform of hosts that size (one machine: hosts of one
    device) that names no default period."""
    from psgdlab.runtime.config import TrainConfig, build_algorithm

    n = hosts * per_host
    keys = {k: f[k] for k in ("period", "variant", "gpus_per_node")}
    config = platform(per_host if hosts > 1 else 1, None)
    by_predict = outcome(lambda: predicted(f["name"], n, config, seed=f["seed"], **keys))

    def train() -> Any:
        cfg = TrainConfig(algorithm=f["name"], workers=n, hosts=hosts, seed=f["seed"], steps=1, model=LSQ_MODEL, **keys)
        return build_algorithm(cfg)

    by_train = outcome(train)
    if n == 1:  # a sweep's one-worker point is the speedup baseline: sgd, whatever the name
        assert isinstance(by_predict, tuple) or by_predict.name == "sgd"
        return
    assert by_train == by_predict


def test_what_the_platform_says_fills_only_the_flags_left_out():
    facts = PlatformFacts(devices_per_host=4, period=9)
    assert algorithm_from_flags("hadpsgd", 8, platform=facts).gpus_per_node == 4
    assert algorithm_from_flags("hadpsgd", 8, platform=facts, gpus_per_node=2).gpus_per_node == 2
    assert algorithm_from_flags("hadpsgd", 2, platform=facts).gpus_per_node == 2  # at most the workers
    assert algorithm_from_flags("bmuf", 8, platform=facts).period == 9
    assert algorithm_from_flags("bmuf", 8, platform=facts, period=3).period == 3
    assert algorithm_from_flags("ssgd", 8, platform=facts) == algorithm_from_flags("ssgd", 8)  # nothing it takes
    with pytest.raises(TestbedError, match=r"--period \(3\) does not apply to ssgd"):
        algorithm_from_flags("ssgd", 8, platform=facts, period=3)


def _summaries(capsys, tmp_path, where: list[str], flags: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The algorithm parameters ``predict`` and ``emulate`` report for the same flags: predict's
    JSON row and its case's summary.json, emulate's summary.json."""
    p_out, e_out = tmp_path / "predict", tmp_path / "emulate"
    argv = ["predict", *where, *flags, "--steps", "20", "--jobs", "1", "--out", str(p_out), "--json"]
    assert main(argv) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    case = json.loads((p_out / "runs" / f"{row['algorithm']}-w{row['workers']}" / "summary.json").read_text())
    assert row["params"] == case["algorithm_params"]
    model = ["--model", LSQ_MODEL, "--lsq-dim", "4", "--lsq-samples", "8", "--batch", "2", "--steps", "4"]
    assert main(["emulate", *where, *flags, *model, "--out", str(e_out), "--json"]) == 0
    capsys.readouterr()
    emulation = json.loads((e_out / "summary.json").read_text())
    return case["algorithm_params"], emulation["algorithm_params"]


def test_predict_and_emulate_report_the_node_the_platform_gives(capsys, tmp_path):
    """H-ADPSGD on 4 workers of the default preset (8 GPUs a host): both take a node of 4."""
    flags = ["--algorithm", "hadpsgd", "--workers", "4"]
    by_predict, by_emulate = _summaries(capsys, tmp_path, ["--preset", DEFAULT_PRESET], flags)
    assert by_predict == by_emulate and by_emulate["gpus_per_node"] == 4


def test_predict_and_emulate_report_the_period_the_platform_gives(capsys, tmp_path):
    """BMUF on a platform file whose ``[defaults] period`` is 7: both run period 7."""
    path = tmp_path / "platform.toml"
    base = load_config(preset="librispeech-gtx1080")
    dataclasses.replace(base, defaults=dataclasses.replace(base.defaults, period=7)).write(path)
    flags = ["--algorithm", "bmuf", "--workers", "2"]
    by_predict, by_emulate = _summaries(capsys, tmp_path, ["--platform", str(path)], flags)
    assert by_predict == by_emulate and by_emulate["period"] == 7
