"""The emulator modules' docstring examples run, and importing them loads no torch."""

from __future__ import annotations

import doctest
import subprocess
import sys

import pytest

import psgdlab.sim.emulate
import psgdlab.sim.replicas


@pytest.mark.parametrize("module", [psgdlab.sim.emulate, psgdlab.sim.replicas], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_importing_the_emulator_loads_no_torch():
    code = ("import sys, psgdlab.sim.emulate, psgdlab.sim.replicas, psgdlab.commands.emulate\n"
            "print([m for m in ('torch', 'matplotlib', 'psgdlab.runtime') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
