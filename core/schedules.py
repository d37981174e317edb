r"""Learning-rate recipes (ALGORITHMS.md §C).

- :func:`ibm_lr` -- linear scaling to the total batch, linear warm-up over 10 epochs, then a
  :math:`1/\sqrt2` anneal per epoch (Zhang et al., Interspeech 2019 §3):
  :math:`\alpha_\text{peak} = 0.1 \cdot B / 256`; variant "A" starts at the baseline 0.1 and steps
  linearly to the peak at epoch 10 (matches the paper's B = 2560 example), "B" uses
  :math:`\alpha_\text{peak} e/10`.
- :class:`Newbob` -- Kaldi's schedule: keep the rate while the held-out loss improves by at
  least 1 % per epoch, then halve it every epoch, stop below 0.1 % improvement; an epoch whose
  held-out loss got worse is rejected.
- :func:`exp_lr` -- Kaldi nnet3's schedule: exponential decay from the initial to the final rate
  over the whole run, :math:`\alpha_k = \alpha_0 (\alpha_\text{final} / \alpha_0)^{k / (K - 1)}`
  for steps :math:`k = 0 \dots K - 1` (nnet3's ``initial-effective-lrate`` /
  ``final-effective-lrate``, a factor 10 by default). A pure function of the step, so every worker
  of an asynchronous run agrees on it without communicating.
- :func:`constant_lr`.

:data:`LR_SCHEDULES` names them (the one list: ``--lr-schedule``'s choices and help and every
check read it), and :func:`lr_schedule` turns a name into the step -> rate function every executor
uses.

Epochs are 1-based in the tables: ``ibm_lr(epoch=e)`` is the rate used during epoch ``e``;
fractional epochs interpolate the warm-up per step when ``per_step=True``.

Examples
--------
>>> [round(ibm_lr(e, total_batch=2560), 3) for e in (1, 2, 10, 11, 12)]
[0.1, 0.2, 1.0, 0.707, 0.5]
>>> round(ibm_lr(10, total_batch=8192), 3)
3.2
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from psgdlab.core.config import unknown
from psgdlab.core.errors import ConfigError, require

__all__ = [
    "ibm_lr",
    "exp_lr",
    "constant_lr",
    "Newbob",
    "lr_schedule",
    "check_lr_schedule",
    "Schedule",
    "LR_SCHEDULES",
    "LR_SCHEDULE_NAMES",
]


@dataclass(frozen=True, slots=True)
class Schedule:
    """What a learning-rate schedule is, as the flags' help and the checks say it."""

    #: one line for ``--lr-schedule``'s help
    summary: str
    #: True when the rate follows the held-out loss of every epoch (the executor feeds it one)
    follows_heldout: bool = False


#: name -> schedule: the one list of learning-rate schedules
LR_SCHEDULES: dict[str, Schedule] = {
    "const": Schedule("one rate throughout"),
    "ibm": Schedule("the IBM papers' warm-up and decay; the rate given is that of a 256-sample batch"),
    "newbob": Schedule("halve on held-out plateaus", follows_heldout=True),
    "exp": Schedule("exponential decay from the rate to the final rate"),
}
LR_SCHEDULE_NAMES = tuple(LR_SCHEDULES)


def check_lr_schedule(name: str) -> None:
    """Refuse a name that is not in :data:`LR_SCHEDULES` (one line, with the closest name).

    >>> check_lr_schedule("expo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: lr-schedule ('expo') is not known (known: const, ...); did you mean 'exp'?
    """
    if name not in LR_SCHEDULES:
        raise unknown("lr-schedule", name, LR_SCHEDULES)


def ibm_lr(
    epoch: float,
    *,
    total_batch: int,
    base_lr: float = 0.1,
    base_batch: int = 256,
    warmup_epochs: int = 10,
    anneal: float = 1.0 / math.sqrt(2.0),
    variant: str = "A",
    per_step: bool = False,
) -> float:
    """The IBM recipe's rate during (1-based) ``epoch`` (see the module docstring)."""
    require(epoch > 0, "epoch", epoch, "must be > 0 (epochs are 1-based)")
    require(total_batch >= 1, "total_batch", total_batch, "must be >= 1")
    require(variant in ("A", "B"), "variant", variant, "must be 'A' or 'B'")
    peak = base_lr * total_batch / base_batch
    e = epoch if per_step else math.ceil(epoch)
    if e <= warmup_epochs:
        if variant == "B":
            return peak * e / warmup_epochs
        if warmup_epochs == 1:
            return peak
        return base_lr + (peak - base_lr) * (e - 1) / (warmup_epochs - 1)
    return peak * anneal ** (math.ceil(e) - warmup_epochs)


def exp_lr(step: int, *, lr: float, lr_final: float, total_steps: int) -> float:
    """Rate of (0-based) ``step`` decaying exponentially from ``lr`` to ``lr_final`` at the last step.

    >>> [round(exp_lr(k, lr=0.1, lr_final=0.01, total_steps=3), 4) for k in range(3)]
    [0.1, 0.0316, 0.01]
    """
    require(lr > 0, "lr", lr, "must be > 0")
    require(0 < lr_final <= lr, "lr-final", lr_final, f"must be in (0, lr = {lr}]")
    require(total_steps >= 1, "total_steps", total_steps, "must be >= 1")
    return float(lr * (lr_final / lr) ** (min(max(step, 0), total_steps - 1) / max(total_steps - 1, 1)))


def constant_lr(epoch: float, *, lr: float) -> float:
    return lr


@dataclass(slots=True, kw_only=True)
class Newbob:
    """Kaldi's newbob schedule (state: current rate, whether halving started, best loss).

    >>> nb = Newbob(lr=0.008)
    >>> nb.update(1.00), nb.update(0.95), nb.update(0.945), nb.lr
    (True, True, True, 0.004)
    """

    lr: float = 0.008
    start_halving_impr: float = 0.01
    end_halving_impr: float = 0.001
    halving_factor: float = 0.5
    halving: bool = False
    stopped: bool = False
    best_loss: float = field(default=math.inf)

    def __call__(self, step: int) -> float:
        """The current rate (a schedule's interface: the rate does not depend on the step)."""
        return self.lr

    def update(self, cv_loss: float) -> bool:
        """Feed one epoch's held-out loss; returns whether the epoch is accepted."""
        if not math.isfinite(self.best_loss):
            self.best_loss = cv_loss
            return True
        accepted = cv_loss < self.best_loss
        impr = (self.best_loss - cv_loss) / self.best_loss
        if accepted:
            self.best_loss = cv_loss
        if self.halving and impr < self.end_halving_impr:
            self.stopped = True
        if impr < self.start_halving_impr:
            self.halving = True
        if self.halving:
            self.lr *= self.halving_factor
        return accepted


def lr_schedule(
    name: str,
    *,
    lr: float,
    total_batch: int,
    steps_per_epoch: int,
    total_steps: int | None = None,
    lr_final: float | None = None,
    warmup_epochs: int = 10,
) -> Callable[[int], float]:
    """The step -> rate function of schedule ``name`` (one of :data:`LR_SCHEDULE_NAMES`).

    Parameters
    ----------
    name : str
        A name of :data:`LR_SCHEDULES`.
    lr : float
        The rate (``ibm``: the base rate of a 256-sample batch; ``exp``, ``newbob``: the
        initial rate).
    total_batch : int
        Samples per step over all workers (``ibm`` scales its peak with it).
    steps_per_epoch : int
        Local steps per worker in one epoch (``ibm``'s epochs are of these steps).
    total_steps : int or None
        ``exp`` only (required): the steps of the whole run.
    lr_final : float or None
        ``exp`` only: the rate at the last step (default ``lr / 10``).
    warmup_epochs : int
        ``ibm`` only: epochs of linear warm-up (10 in the papers).

    Returns
    -------
    callable
        ``rate(step)``. For ``newbob`` a :class:`Newbob` (callable, the current rate whatever
        the step): the executor feeds it each epoch's held-out loss with ``update``.

    Examples
    --------
    >>> f = lr_schedule("ibm", lr=0.1, total_batch=2560, steps_per_epoch=10, warmup_epochs=2)
    >>> [round(f(s), 3) for s in (0, 10, 20)]
    [0.1, 1.0, 0.707]
    >>> nb = lr_schedule("newbob", lr=0.1, total_batch=1, steps_per_epoch=1)
    >>> nb(0), isinstance(nb, Newbob)
    (0.1, True)
    """
    check_lr_schedule(name)
    require(steps_per_epoch >= 1, "steps_per_epoch", steps_per_epoch, "must be >= 1")
    require(
        isinstance(warmup_epochs, int) and warmup_epochs >= 1, "warmup_epochs", warmup_epochs, "must be an integer >= 1"
    )
    if name == "ibm":
        return lambda step: ibm_lr(
            step / steps_per_epoch + 1e-12, total_batch=total_batch, base_lr=lr, warmup_epochs=warmup_epochs
        )
    if name == "exp":
        if total_steps is None:
            raise ConfigError("total_steps (None) must be given (>= 1) for the exp schedule")
        steps: int = total_steps
        final = lr / 10 if lr_final is None else lr_final
        exp_lr(0, lr=lr, lr_final=final, total_steps=steps)  # validates
        return lambda step: exp_lr(step, lr=lr, lr_final=final, total_steps=steps)
    if name == "newbob":
        return Newbob(lr=lr)
    return lambda step: lr
