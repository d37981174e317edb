"""Every docstring example in core and analysis runs (STYLE.md 2.4: no skipped examples)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import psgdlab.analysis
import psgdlab.core


def _modules(package):
    yield package.__name__
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        yield info.name


MODULES = sorted(set(_modules(psgdlab.core)) | set(_modules(psgdlab.analysis)))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
