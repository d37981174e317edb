"""One module per ``psgdlab`` subcommand.

Each module defines ``register(subparsers)`` which adds its parser and sets ``func`` to a handler
``run(args) -> int``. Modules import only the standard library at import time; the handler
imports the subpackage it needs, so ``psgdlab topology`` works without torch or simpy.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["print_json", "show_progress", "plain_text", "require_torch"]


def print_json(obj: Any) -> None:
    """Print ``obj`` as every command's ``--json`` does: one JSON document on one line.

    One line, not indented: a document per line is what a pipe reads (``json.loads`` of the
    output, ``jq``, ``| head -1``, a log of several runs), and ``jq .`` or ``python -m json.tool``
    indents it for a reader. Values JSON has no type for are written as their Python value
    (numpy scalars) or their text (paths).

    >>> from pathlib import Path
    >>> print_json({"out": Path("runs/x"), "rows": [1, 2]})
    {"out": "runs/x", "rows": [1, 2]}
    """
    print(json.dumps(obj, default=_plain))


def plain_text(text: str) -> str:
    """A docstring as plain help text: reST literals and roles become their text.

    >>> plain_text("writes ``summary.json`` (:mod:`~psgdlab.core.records.rundir`)")
    'writes summary.json (psgdlab.core.records.rundir)'
    """
    import re

    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def show_progress(args: Any) -> bool:
    """The progress rule of every command: a bar on stderr when it is a terminal and
    ``--no-progress`` was not given, none otherwise (a log file would hold the bar, and an error
    line glued to it)."""
    import sys

    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


def require_torch(command: str) -> None:
    """Refuse ``command`` in one line where torch is not installed (the prediction-only install,
    ``psgdlab[sim]``), before anything starts."""
    import importlib.util

    from psgdlab.core.errors import ConfigError

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a finder that refuses it, a half-imported module
        found = False
    if not found:
        raise ConfigError(
            f"psgdlab {command} needs torch, which this environment lacks (a prediction-only install, "
            "psgdlab[sim]): pip install 'psgdlab[runtime]' (docs/install.md)"
        )
