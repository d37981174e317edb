"""Names are looked up in one way: one "did you mean" helper (:func:`psgdlab.core.config.closest`),
one shape of error for a name no registry holds (:func:`psgdlab.core.config.unknown`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.config import closest, unknown
from psgdlab.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("core", "sim", "runtime", "models", "analysis", "psgdlab")

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(known=st.lists(_names, min_size=1, max_size=8, unique=True), data=st.data())
def test_a_known_name_is_its_own_closest_and_every_suggestion_is_known(known, data):
    name = data.draw(st.sampled_from(known))
    n = data.draw(st.integers(1, 3))
    assert closest(name, known, n=n).startswith(f"; did you mean {name!r}")
    typo = data.draw(_names)
    hint = closest(typo, known, n=n)
    suggested = re.findall(r"'([^']*)'", hint)
    assert set(suggested) <= set(known) and len(suggested) <= n
    assert (hint == "") == (not suggested)


@settings(max_examples=100, deadline=None)
@given(known=st.lists(_names, min_size=1, max_size=8, unique=True), name=_names)
def test_an_unknown_name_is_one_line_that_names_it_and_every_known_name(known, name):
    err = unknown("thing", name, known)
    assert isinstance(err, ConfigError)
    text = str(err)
    assert "\n" not in text
    assert text.startswith(f"thing ({name!r}) is not known (known: {', '.join(known)})")
    assert text.endswith(closest(name, known))


def test_no_module_but_the_helper_matches_names_itself():
    """``difflib`` is imported by :mod:`psgdlab.core.config` only: every other place that
    suggests a name goes through :func:`~psgdlab.core.config.closest`."""
    users = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if "difflib" in names:
                    users.append(str(path.relative_to(ROOT)))
    assert users == ["core/config.py"]


def _lookups():
    from psgdlab.core.algorithms import make_algorithm
    from psgdlab.core.graphs.topology import build_topology
    from psgdlab.core.platform.workloads import workload
    from psgdlab.core.schedules import lr_schedule
    from psgdlab.models.recipes import recipe_of
    from psgdlab.runtime.transports.backends import check_backend
    from psgdlab.sim.workload import preset_path

    return [
        ("algorithm", "adpsdg", "adpsgd", lambda name: make_algorithm(name, n_workers=4)),
        ("parameter of bmuf", "peroid", "period", lambda name: make_algorithm("bmuf", n_workers=4, **{name: 5})),
        ("topology kind", "rnig", "ring", lambda name: build_topology(name, 8)),
        ("preset", "h100-sxm", "h100-sxm-ndr", preset_path),
        ("workload", "conformer", "conformer-120m", workload),
        ("model", "blstm-smal", "blstm-small", recipe_of),
        ("lr-schedule", "expo", "exp", lambda name: lr_schedule(name, lr=0.1, total_batch=1, steps_per_epoch=1)),
        ("backend", "ncl", "nccl", check_backend),
    ]


@pytest.mark.parametrize("what, typo, meant, lookup", _lookups(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_registry_refuses_a_mistyped_name_in_the_one_shape(what, typo, meant, lookup):
    with pytest.raises(ConfigError) as info:
        lookup(typo)
    text = str(info.value)
    head = rf"^{re.escape(what)} \({re.escape(repr(typo))}\) is not known"
    assert re.match(head + r" \(known: [^)]*\); did you mean ", text)
    assert f"{meant!r}" in text.split("did you mean", 1)[1]
