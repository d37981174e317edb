"""Every algorithm of ALGORITHMS.md §A, defined once, in one registry.

>>> sorted(ALGORITHMS)
['adpsgd', 'asgd', 'bmuf', 'bsp', 'dpsgd', 'easgd', 'hadpsgd', 'sgd', 'ssgd']
>>> make_algorithm("bmuf", n_workers=4, period=20).block_momentum
0.75
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from psgdlab.core.algorithms.adpsgd import ADPSGD
from psgdlab.core.algorithms.asgd import ASGD
from psgdlab.core.algorithms.base import Algorithm, ServerState, WorkerState, is_sync_step
from psgdlab.core.algorithms.bmuf import BMUF
from psgdlab.core.algorithms.bsp import BSP
from psgdlab.core.algorithms.dpsgd import DPSGD
from psgdlab.core.algorithms.easgd import EASGD
from psgdlab.core.algorithms.hadpsgd import HADPSGD
from psgdlab.core.algorithms.sgd import SGD
from psgdlab.core.algorithms.ssgd import SSGD
from psgdlab.core.errors import ConfigError

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "WorkerState",
    "ServerState",
    "is_sync_step",
    "make_algorithm",
    "algorithm_parameters",
    "SGD",
    "SSGD",
    "ASGD",
    "BSP",
    "BMUF",
    "EASGD",
    "DPSGD",
    "ADPSGD",
    "HADPSGD",
]

#: name -> algorithm class (the one registry; executors look names up here)
ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (SGD, SSGD, ASGD, BSP, BMUF, EASGD, DPSGD, ADPSGD, HADPSGD)
}


def algorithm_parameters(name: str) -> tuple[str, ...]:
    """Names of the keyword parameters ``make_algorithm(name, ...)`` accepts."""
    return tuple(f.name for f in dataclasses.fields(_lookup(name)))


def make_algorithm(name: str, **params: Any) -> Algorithm:
    """Build the algorithm ``name`` with ``params`` (validated).

    Unknown names and parameters raise :class:`ConfigError` naming the closest valid one.
    Parameters that are ``None`` are dropped, so CLI defaults fall through to the algorithm's.
    """
    cls = _lookup(name)
    known = algorithm_parameters(name)
    for key in params:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"parameter {key!r} is not known to {name} (known: {', '.join(known)}){hint}")
    return cls(**{k: v for k, v in params.items() if v is not None})


def _lookup(name: str) -> type[Algorithm]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(ALGORITHMS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"algorithm {name!r} is not known (known: {', '.join(ALGORITHMS)}){hint}") from None
