"""Every algorithm of ALGORITHMS.md §A, defined once, in one registry.

>>> sorted(ALGORITHMS)
['adpsgd', 'asgd', 'bmuf', 'bsp', 'dpsgd', 'easgd', 'hadpsgd', 'sgd', 'ssgd']
>>> make_algorithm("bmuf", n_workers=4, period=20).block_momentum
0.75
>>> algorithm_from_flags("bmuf", 4, period=5, variant=None).period
5
>>> algorithm_from_flags("ssgd", 4, period=5)
Traceback (most recent call last):
...
psgdlab.core.errors.ConfigError: --period (5) does not apply to ssgd (its parameters: momentum)
"""

from __future__ import annotations

import dataclasses
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
from psgdlab.core.config import unknown
from psgdlab.core.errors import ConfigError

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "WorkerState",
    "ServerState",
    "is_sync_step",
    "make_algorithm",
    "algorithm_from_flags",
    "check_flags",
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
            raise unknown(f"parameter of {name}", key, known)
    return cls(**{k: v for k, v in params.items() if v is not None})


#: keyword parameters every algorithm takes that are not user flags
_BOUND = ("n_workers", "seed")
#: facts of the platform that an algorithm takes only where its schedule uses them
_PLACEMENT = ("gpus_per_node",)


def algorithm_from_flags(name: str, n_workers: int, *, seed: int = 0, **flags: Any) -> Algorithm:
    """The algorithm ``name`` for ``n_workers`` from command-line flags: the one builder every
    executor and command uses.

    Flags that are ``None`` were not given and fall through to the algorithm's defaults. A given
    flag that is not a parameter of ``name`` raises :class:`ConfigError` naming the flag and the
    parameters ``name`` has. ``gpus_per_node`` is a fact of the platform, not an algorithm flag:
    it goes to the algorithms whose schedule uses it (H-ADPSGD's nodes) and is ignored by the
    rest.

    Parameters
    ----------
    name : str
        A registry name (:data:`ALGORITHMS`).
    n_workers : int
        Number of workers.
    seed : int
        Seed of the algorithm's random schedule (randomized rings).
    **flags
        Hyperparameters by name (``period``, ``variant``, ``momentum``, ...), ``None`` for
        "not given".

    Raises
    ------
    ConfigError
        Unknown ``name``, a flag that does not apply, or a value the algorithm refuses.
    """
    known = check_flags(name, **flags)
    params: dict[str, Any] = {"n_workers": n_workers, "seed": seed}
    params.update({k: v for k, v in flags.items() if v is not None and k in known})
    return make_algorithm(name, **params)


def check_flags(name: str, **flags: Any) -> tuple[str, ...]:
    """Check that every given (not ``None``) flag applies to ``name``, as
    :func:`algorithm_from_flags` does, without building it; returns ``name``'s parameters.

    >>> check_flags("adpsgd", variant="random", period=None)[:2]
    ('n_workers', 'momentum')
    """
    known = algorithm_parameters(name)
    for key, value in flags.items():
        if value is None or key in _PLACEMENT:
            continue
        if key not in known or key in _BOUND:
            own = ", ".join(k for k in known if k not in _BOUND + _PLACEMENT) or "none"
            raise ConfigError(f"--{key.replace('_', '-')} ({value!r}) does not apply to {name} (its parameters: {own})")
    return known


def _lookup(name: str) -> type[Algorithm]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise unknown("algorithm", name, ALGORITHMS) from None
