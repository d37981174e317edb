"""One module per ``psgdlab`` subcommand.

Each module defines ``register(subparsers)`` which adds its parser and sets ``func`` to a handler
``run(args) -> int``. Modules import only the standard library at import time; the handler
imports the subpackage it needs, so ``psgdlab topology`` works without torch or simpy.
"""
