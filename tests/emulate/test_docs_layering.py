"""The emulator modules' docstring examples run, and importing them (or any of psgdlab.sim) loads
no torch, no matplotlib and nothing of psgdlab.runtime."""

from __future__ import annotations

import doctest
import subprocess
import sys

import pytest

import psgdlab.core.replicas
import psgdlab.sim.emulate


@pytest.mark.parametrize("module", [psgdlab.sim.emulate, psgdlab.core.replicas], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_importing_the_emulator_loads_no_torch():
    code = (
        "import sys, psgdlab.sim.emulate, psgdlab.core.replicas, psgdlab.emulate, psgdlab.commands.emulate\n"
        "print([m for m in ('torch', 'matplotlib', 'psgdlab.runtime') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_module_of_sim_loads_torch_runtime_or_matplotlib():
    code = (
        "import importlib, pkgutil, sys, psgdlab.sim\n"
        "for m in pkgutil.iter_modules(psgdlab.sim.__path__):\n"
        "    importlib.import_module('psgdlab.sim.' + m.name)\n"
        "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'matplotlib')"
        " or m.startswith('psgdlab.runtime')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
