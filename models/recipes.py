"""How each model is trained when the flags do not say: its :class:`Recipe`.

Each model carries a :class:`Recipe` (:data:`MODEL_RECIPES`): the learning rate, schedule,
momentum and total batch a run of it uses for every flag not given
(:meth:`psgdlab.runtime.config.TrainConfig.from_args`, and ``psgdlab emulate``). No torch: the
emulator's and the trainer's commands read the recipes before either builds a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from psgdlab.core.config import unknown
from psgdlab.core.errors import require

__all__ = ["LSQ_MODEL", "DEFAULT_MODEL", "Recipe", "MODEL_RECIPES", "recipe_of", "lsq_stable_lr"]

#: built-in model name: the reference executor's least-squares problem (float64)
LSQ_MODEL = "least-squares"
#: the model of ``psgdlab train`` and ``psgdlab emulate`` given no ``--model``
DEFAULT_MODEL = "tiny-blstm"


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """How a model is trained when the flags do not say: the defaults of ``--lr``,
    ``--lr-schedule``, ``--momentum`` and ``--batch``.

    ``total_batch`` is the batch of one step over all workers (``--batch`` is per worker:
    ``total_batch // workers``, at least 1), so a recipe keeps its effective batch at any number
    of workers. ``momentum`` goes to the algorithms that take it; ``lr=None`` means the stable
    rate of least squares (:func:`lsq_stable_lr`). ``source`` says where the recipe comes from.
    """

    lr: float | None
    lr_schedule: str
    total_batch: int
    momentum: float | None = None
    source: str = ""

    def resolve(
        self, *, workers: int, batch: int | None, lr: float | None, lr_schedule: str | None, lsq_dim: int
    ) -> tuple[int, float, str]:
        """``(batch per worker, lr, lr_schedule)``: the given values, the recipe's for those ``None``.

        >>> recipe_of("blstm-small").resolve(workers=4, batch=None, lr=None, lr_schedule="const", lsq_dim=16)
        (8, 0.2, 'const')
        """
        require(isinstance(workers, int) and workers >= 1, "workers", workers, "must be an integer >= 1")
        batch = batch if batch is not None else max(1, self.total_batch // workers)
        if lr is None:
            lr = self.lr if self.lr is not None else lsq_stable_lr(lsq_dim, batch)
        return batch, lr, lr_schedule or self.lr_schedule

    def describe(self) -> str:
        """One line for ``--help``: ``lr 0.2, exp, momentum 0.9, total batch 32``."""
        lr = "stable rate" if self.lr is None else f"lr {self.lr:g}"
        momentum = f", momentum {self.momentum:g}" if self.momentum else ""
        return f"{lr}, {self.lr_schedule}{momentum}, total batch {self.total_batch}"


_UNTUNED = "not tuned for this model: the testbed's generic defaults"
#: model name -> its recipe (every preset of :data:`psgdlab.models.networks.MODEL_PRESETS`, and least squares)
MODEL_RECIPES: dict[str, Recipe] = {
    "blstm": Recipe(
        lr=0.1,
        lr_schedule="ibm",
        total_batch=256,
        source="the IBM baseline: batch 256, lr 0.1 (ALGORITHMS.md, S000 3 and 6.2)",
    ),
    "blstm-small": Recipe(
        lr=0.2,
        lr_schedule="exp",
        total_batch=32,
        momentum=0.9,
        source="FSDD, 5 epochs: 14.7 % held-out WER (docs/fsdd/README.md)",
    ),
    "tiny-blstm": Recipe(lr=0.05, lr_schedule="const", total_batch=64, source=_UNTUNED),
    "dnn": Recipe(lr=0.05, lr_schedule="const", total_batch=64, source=_UNTUNED),
    "dnn-small": Recipe(lr=0.05, lr_schedule="const", total_batch=64, source=_UNTUNED),
    "cldnn": Recipe(lr=0.05, lr_schedule="const", total_batch=64, source=_UNTUNED),
    LSQ_MODEL: Recipe(
        lr=None, lr_schedule="const", total_batch=64, source="the minibatch's stable rate (lsq_stable_lr)"
    ),
}


def recipe_of(model: str) -> Recipe:
    """The recipe of ``model`` (:data:`MODEL_RECIPES`); an unknown model is an error.

    >>> recipe_of("blstm-small").describe()
    'lr 0.2, exp, momentum 0.9, total batch 32'
    """
    if model not in MODEL_RECIPES:
        raise unknown("model", model, MODEL_RECIPES)
    return MODEL_RECIPES[model]


def lsq_stable_lr(dim: int, batch: int) -> float:
    r"""A rate at which minibatch SGD on least squares with Gaussian rows stays stable.

    The Hessian of a minibatch of :math:`B` standard normal rows in :math:`d` columns,
    :math:`A_B^\top A_B / B`, has its largest eigenvalue near :math:`(\sqrt d + \sqrt B)^2 / B`
    (Marchenko-Pastur edge); gradient descent diverges above :math:`2/\lambda_{max}`. This
    returns a quarter of that bound, :math:`0.5\,B / (\sqrt d + \sqrt B)^2`.

    >>> round(lsq_stable_lr(16, 32), 4)
    0.1716
    >>> lsq_stable_lr(50_000, 32) < 2e-3
    True
    """
    require(dim >= 1 and batch >= 1, "lsq-dim/batch", (dim, batch), "must be >= 1")
    return 0.5 * batch / (math.sqrt(dim) + math.sqrt(batch)) ** 2
