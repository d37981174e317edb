"""Every docstring example of psgdlab runs (STYLE.md 2.4: no skipped examples)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import psgdlab


def _modules(package):
    yield package.__name__
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        yield info.name


#: psgdlab.tests holds the test helpers, and a __main__ runs when imported
MODULES = sorted(
    name for name in _modules(psgdlab) if not name.startswith("psgdlab.tests") and not name.endswith(".__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
