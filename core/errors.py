"""Exception and warning hierarchy shared by every part of psgdlab.

Every error a user can trigger with bad input derives from :class:`TestbedError` and from the
builtin it resembles, so callers who only know ``ValueError`` still catch it. The CLI maps
``ValueError``-like errors (bad input) to exit status 2 and ``RuntimeError``-like ones (a run
that failed) to exit status 1; a run a signal stopped (:class:`RunInterrupted`) exits with the
shell's status for the signal, ``128 + signal`` (130 for SIGINT).

Message format (one line): what was checked, the name and value, the rule broken, then a hint,
for example ``"workers (7) must be even for matching-based schemes; use ring or torus for odd
counts"``.
"""

from __future__ import annotations

__all__ = [
    "TestbedError",
    "ConfigError",
    "InvalidMixingMatrixError",
    "TopologyError",
    "SimulationError",
    "TransportError",
    "RunInterrupted",
    "TestbedWarning",
    "require",
]


class TestbedError(Exception):
    """Root of every psgdlab error."""

    __test__ = False  # not a pytest test class


class ConfigError(TestbedError, ValueError):
    """A configuration value, CLI argument or config file breaks a documented rule."""


class InvalidMixingMatrixError(TestbedError, ValueError):
    """A mixing matrix is not square, negative, not (doubly) stochastic or not symmetric."""


class TopologyError(TestbedError, ValueError):
    """A topology cannot be built for the requested size or is disconnected."""


class SimulationError(TestbedError, RuntimeError):
    """A simulation or emulation failed while running."""


class TransportError(TestbedError, RuntimeError):
    """A real distributed run failed (a rank died, a peer timed out, a backend is missing)."""


class RunInterrupted(TestbedError, RuntimeError):
    """A run stopped by a signal (SIGINT: Ctrl-C; SIGTERM) at a step its ranks agreed on.

    >>> RunInterrupted("run interrupted", signal_number=2).exit_status
    130
    """

    def __init__(self, message: str, *, signal_number: int) -> None:
        super().__init__(message)
        self.signal_number = signal_number

    @property
    def exit_status(self) -> int:
        """The shell's status of a process a signal ended: ``128 + signal``."""
        return 128 + self.signal_number


class TestbedWarning(UserWarning):
    """A legal but pointless or costly setting (for example BMUF with period 1)."""

    __test__ = False


def require(
    ok: bool, name: str, value: object, rule: str, *, hint: str = "", error: type[TestbedError] = ConfigError
) -> None:
    """Raise ``error`` with the house message ``"name (value) rule[; hint]"`` unless ``ok``.

    Examples
    --------
    >>> require(3 > 0, "period", 3, "must be >= 1")
    >>> require(0 > 1, "period", 0, "must be >= 1")
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: period (0) must be >= 1
    """
    if not ok:
        message = f"{name} ({value!r}) {rule}"
        if hint:
            message += f"; {hint}"
        raise error(message)
