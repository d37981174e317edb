"""Every algorithm of ALGORITHMS.md §A, defined once, in one registry.

Examples
--------
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

What the platform says fills what the flags leave out (:class:`PlatformFacts`): the GPUs of a
host form H-ADPSGD's node, a platform file's default period goes to the algorithms that have one.

>>> v100 = PlatformFacts(devices_per_host=8, period=20)
>>> algorithm_from_flags("hadpsgd", 32, platform=v100).gpus_per_node
8
>>> [algorithm_from_flags("bmuf", 32, period=p, platform=v100).period for p in (None, 5)]
[20, 5]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
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
from psgdlab.core.platform.placement import workers_per_host

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "WorkerState",
    "ServerState",
    "is_sync_step",
    "make_algorithm",
    "algorithm_from_flags",
    "PlatformFacts",
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


@dataclass(frozen=True, slots=True, kw_only=True)
class PlatformFacts:
    """What a platform says that an algorithm takes where no flag gives it.

    Parameters
    ----------
    devices_per_host : int or None
        Devices (GPUs, or worker processes) a host has: H-ADPSGD's super-learner size is the
        workers a host holds (:func:`psgdlab.core.platform.placement.workers_per_host`). ``None``: the
        platform does not say (the algorithm's default, a node of one).
    period : int or None
        The synchronisation period of the algorithms that have one (a platform file's
        ``[defaults] period``). ``None``: each algorithm's own default.
    """

    devices_per_host: int | None = None
    period: int | None = None

    def fill(self, name: str, n_workers: int, flags: dict[str, Any]) -> dict[str, Any]:
        """``flags`` with what this platform says for the parameters of ``name`` they leave out."""
        known = algorithm_parameters(name)
        out = dict(flags)
        if out.get("period") is None and "period" in known:
            out["period"] = self.period
        if out.get("gpus_per_node") is None and "gpus_per_node" in known and self.devices_per_host is not None:
            out["gpus_per_node"] = workers_per_host(self.devices_per_host, n_workers)
        return out


def algorithm_from_flags(
    name: str, n_workers: int, *, seed: int = 0, platform: PlatformFacts | None = None, **flags: Any
) -> Algorithm:
    """The algorithm ``name`` for ``n_workers`` from command-line flags and what the platform
    says: the one builder of ``predict``, ``plan``, ``emulate``, ``train`` and ``validate``, so
    that the same flags on the same platform build the same algorithm in every command.

    Flags that are ``None`` were not given: ``platform`` fills them where it says something
    (:meth:`PlatformFacts.fill`), and what is still ``None`` falls through to the algorithm's
    defaults. A given flag that is not a parameter of ``name`` raises :class:`ConfigError`
    naming the flag and the parameters ``name`` has. ``gpus_per_node`` is a fact of the
    placement, not an algorithm flag: it goes to the algorithms whose schedule uses it
    (H-ADPSGD's nodes) and is ignored by the rest.

    Parameters
    ----------
    name : str
        A registry name (:data:`ALGORITHMS`).
    n_workers : int
        Number of workers.
    seed : int
        Seed of the algorithm's random schedule (randomized rings).
    platform : PlatformFacts, optional
        What the platform says (default: nothing).
    **flags
        Hyperparameters by name (``period``, ``variant``, ``momentum``, ...), ``None`` for
        "not given".

    Raises
    ------
    ConfigError
        Unknown ``name``, a flag that does not apply, or a value the algorithm refuses.
    """
    known = check_flags(name, **flags)
    if platform is not None:
        flags = platform.fill(name, n_workers, flags)
    params: dict[str, Any] = {"n_workers": n_workers, "seed": seed}
    params.update({k: v for k, v in flags.items() if v is not None and k in known})
    return make_algorithm(name, **params)


def check_flags(name: str, **flags: Any) -> tuple[str, ...]:
    """Check that every given (not ``None``) flag applies to ``name``, as
    :func:`algorithm_from_flags` does, without building it; returns ``name``'s parameters. The
    error names every flag that does not apply, in the order of their names (whatever order the
    caller passed them in).

    >>> check_flags("adpsgd", variant="random", period=None)[:2]
    ('n_workers', 'momentum')
    >>> check_flags("sgd", variant="fixed", period=4)
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: --period (4), --variant ('fixed') do not apply to sgd (its parameters: momentum)
    """
    known = algorithm_parameters(name)
    bad = [
        f"--{key.replace('_', '-')} ({flags[key]!r})"
        for key in sorted(flags)
        if flags[key] is not None and key not in _PLACEMENT and (key not in known or key in _BOUND)
    ]
    if bad:
        own = ", ".join(k for k in known if k not in _BOUND + _PLACEMENT) or "none"
        verb = "does not apply" if len(bad) == 1 else "do not apply"
        raise ConfigError(f"{', '.join(bad)} {verb} to {name} (its parameters: {own})")
    return known


def _lookup(name: str) -> type[Algorithm]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise unknown("algorithm", name, ALGORITHMS) from None
