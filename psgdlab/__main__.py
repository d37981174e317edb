"""``python -m psgdlab`` is the same as the ``psgdlab`` command.

The guard matters under ``python -m mpi4py.futures -m psgdlab ...``: the pool's worker ranks
import the main module to unpickle tasks, and must not run the command themselves.
"""

from psgdlab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
