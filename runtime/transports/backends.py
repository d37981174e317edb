"""The transports' backends by name: what each needs and what it can do, in one registry.

:data:`BACKENDS` is the one list of backend names. ``--backend``'s choices and help, the
configuration's checks and their hints read it (and :func:`cpu_backends`, the backends that run
where there is no GPU: the probe's, the validation's); the factory that opens a backend's channels
is :mod:`psgdlab.runtime.transports.channels`. No torch and nothing else of the runtime: the
command line reads the names before any rank starts.

Examples
--------
>>> list(BACKENDS), cpu_backends()
(['gloo', 'nccl', 'mpi'], ('gloo', 'mpi'))
>>> check_backend("ncl")
Traceback (most recent call last):
...
psgdlab.core.errors.ConfigError: backend ('ncl') is not known (known: gloo, nccl, mpi); did you mean 'nccl'?
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psgdlab.core.config import listing, unknown

__all__ = ["Backend", "BACKENDS", "check_backend", "backends_that", "cpu_backends", "either"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """One backend: what it is and what a run on it can do."""

    #: one line for ``--backend``'s help
    summary: str
    #: its payloads live on GPUs (one per rank): it needs CUDA
    needs_cuda: bool
    #: its ranks can run on emulated hosts (a network namespace each, ``--hosts``)
    crosses_emulated_hosts: bool
    #: torchrun's elastic agent can start and restart its ranks (``--on-failure restart``)
    restartable: bool
    #: its ranks outlive a dead peer, so the survivors can go on (``--on-failure continue``)
    survives_a_death: bool


#: name -> backend: the one list of the transports' backends
BACKENDS: dict[str, Backend] = {
    "gloo": Backend(
        summary="torch.distributed on CPUs (shared memory between the ranks of a host)",
        needs_cuda=False,
        crosses_emulated_hosts=True,
        restartable=True,
        survives_a_death=True,
    ),
    "nccl": Backend(
        summary="torch.distributed on GPUs, one per rank",
        needs_cuda=True,
        crosses_emulated_hosts=False,
        restartable=True,
        survives_a_death=False,
    ),
    "mpi": Backend(
        summary="mpi4py, started by mpiexec (which ends every rank when one dies)",
        needs_cuda=False,
        crosses_emulated_hosts=True,
        restartable=False,
        survives_a_death=False,
    ),
}


def check_backend(name: str) -> Backend:
    """The backend ``name``; a name :data:`BACKENDS` does not hold is one line with the closest."""
    if name not in BACKENDS:
        raise unknown("backend", name, BACKENDS)
    return BACKENDS[name]


def backends_that(test: Callable[[Backend], bool]) -> tuple[str, ...]:
    """The names of the backends for which ``test`` holds, in registry order.

    >>> backends_that(lambda b: b.restartable)
    ('gloo', 'nccl')
    """
    return tuple(name for name, b in BACKENDS.items() if test(b))


def cpu_backends() -> tuple[str, ...]:
    """The backends that run without a GPU."""
    return backends_that(lambda b: not b.needs_cuda)


def either(names: tuple[str, ...]) -> str:
    """``"--backend gloo or mpi"``: the hint that names what to use instead.

    >>> either(("gloo",)), either(("gloo", "nccl", "mpi"))
    ('--backend gloo', '--backend gloo, nccl or mpi')
    """
    return f"--backend {listing(names)}"
