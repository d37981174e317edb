"""Every docstring example of psgdlab runs (STYLE.md 2.4: no skipped examples)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import psgdlab
import psgdlab.analysis
import psgdlab.core
import psgdlab.models
import psgdlab.runtime
import psgdlab.sim


def _modules(package):
    yield package.__name__
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        yield info.name


#: psgdlab.tests holds the test helpers, and a __main__ runs when imported
#: (the layers are walked one by one: an editable install maps them from their own folders)
MODULES = sorted(
    {
        name
        for package in (psgdlab, psgdlab.core, psgdlab.sim, psgdlab.models, psgdlab.runtime, psgdlab.analysis)
        for name in _modules(package)
        if not name.startswith("psgdlab.tests") and not name.endswith(".__main__")
    }
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
