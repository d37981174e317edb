"""psgdlab.calibration: a run read back as the prediction that simulates it as it ran."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from psgdlab.calibration import residual_cv, run_request

TRACE = np.zeros(1)  # a run's trace, as far as reading its configuration goes


def _run(train, summary=None, trace=TRACE):
    summary = {"payload_bytes": 2_000_000, **(summary or {})}
    return SimpleNamespace(
        config={"train": train}, summary=summary, meta={"n_workers": train["workers"]}, trace=trace, case=None
    )


def test_a_run_is_predicted_with_its_own_configuration():
    train = {"algorithm": "hadpsgd", "workers": 8, "hosts": 2, "gpus_per_node": 4, "batch": 1, "steps": 80}
    train |= {"seed": 3, "variant": None, "period": None, "straggler": "1:2"}
    req = run_request(_run(train, {"on_failure": "continue"}))
    assert (req.name, req.n_workers, req.hosts, req.payload_bytes, req.batch) == ("hadpsgd", 8, 2, 2_000_000, 1)
    assert req.keywords == {
        "steps": 80,
        "seed": 3,
        "variant": None,
        "period": None,
        "gpus_per_node": 4,
        "stragglers": "1:2",
        "workers_per_host": 4,
        "on_failure": "continue",
    }
    plain = {"algorithm": "adpsgd", "workers": 2, "batch": 8, "steps": 40, "variant": "random", "straggler": ""}
    req = run_request(_run(plain))
    assert req.keywords["gpus_per_node"] is None and req.keywords["stragglers"] is None
    assert req.keywords["variant"] == "random" and req.keywords["workers_per_host"] == 2 and req.hosts == 1


def test_what_cannot_be_predicted_is_left_out():
    train = {"algorithm": "ssgd", "workers": 2, "batch": 1, "steps": 40}
    assert run_request(_run(train, trace=None)) is None  # no trace to compare with
    assert run_request(SimpleNamespace(config={}, summary={}, meta={}, trace=TRACE)) is None  # not a train run
    assert residual_cv([]) is None
    assert residual_cv([(2.0, 2.0), (1.0, 1.0)]) == 0.0
