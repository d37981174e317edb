"""One module per ``psgdlab`` subcommand.

Each module defines ``register(subparsers)`` which adds its parser and sets ``func`` to a handler
``run(args) -> int``. Modules import only the standard library at import time; the handler
imports the subpackage it needs, so ``psgdlab topology`` works without torch or simpy.
"""


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
