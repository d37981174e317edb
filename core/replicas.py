r"""What the emulator needs from a set of model replicas: the :class:`Replicas` protocol.

The emulator (:func:`psgdlab.sim.emulate.replay`) holds one flat parameter vector per virtual
worker and applies the algorithm's kernels (:mod:`psgdlab.core.kernels`) to them; everything it
needs to know about the model and the data goes through this protocol:

- the initial point and the number of parameters;
- the minibatch gradients of many ``(rank, step, params)`` entries at once (an implementation
  may batch them; the emulator defers gradients until one is needed, so it asks for all the
  pending ones together);
- array arithmetic it cannot do with operators alone, in the replicas' array type: the mean of
  a list, slicing a model into shards and joining them back (sharded pairwise exchanges), the
  consensus distance;
- the evaluation of one model.

Two implementations ship, each beside what it mirrors:
:class:`psgdlab.core.reference.LeastSquaresReplicas` (numpy, the reference executor's own
arithmetic, so a replay can equal :func:`psgdlab.core.reference.run_reference` bit for bit) and
:class:`psgdlab.models.replicas.TorchReplicas` (a torch model on a window corpus).
:class:`NumpyArrays` gives the array part for numpy replicas.

Examples
--------
>>> import numpy as np
>>> ops = NumpyArrays()
>>> ops.concat([ops.split(np.arange(5.0), 2, i) for i in range(2)])
array([0., 1., 2., 3., 4.])
>>> ops.consensus_distance([np.array([0.0, 2.0]), np.array([2.0, 0.0])])
4.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Replicas", "NumpyArrays", "consensus_distance"]

Array = Any  # the replicas' flat 1-D array type (numpy.ndarray, torch.Tensor)


@runtime_checkable
class Replicas(Protocol):
    """A set of model replicas the emulator trains (see the module docstring).

    ``n_params`` is the length of every flat parameter vector.
    """

    n_params: int

    def initial_point(self) -> Array:
        """The flat initial parameters (a new array every call)."""
        ...

    def gradients(self, entries: Sequence[tuple[int, int, Array]]) -> list[tuple[Array, float]]:
        """``(flat gradient, minibatch loss)`` of each ``(rank, step, params)`` entry, in order:
        the gradient of the loss of rank ``rank``'s minibatch of step ``step`` at ``params``."""
        ...

    def evaluate(self, params: Array) -> dict[str, float]:
        """Figures of one model: at least ``"loss"`` (others, e.g. ``"accuracy"``, optional)."""
        ...

    def mean(self, arrays: Sequence[Array]) -> Array:
        """The elementwise mean of equal-length flat arrays."""
        ...

    def split(self, x: Array, n_shards: int, shard: int) -> Array:
        """Slice ``shard`` of ``x`` cut into ``n_shards`` near-equal slices (``numpy.array_split``'s
        rule: the first ``len(x) % n_shards`` slices are one longer)."""
        ...

    def concat(self, parts: Sequence[Array]) -> Array:
        """The slices joined back into one flat array."""
        ...

    def consensus_distance(self, models: Sequence[Array]) -> float:
        r""":math:`C(\Theta) = \|\Theta - \bar\theta 1^\top\|_F^2` of the workers' models."""
        ...


def consensus_distance(models: Sequence[np.ndarray]) -> float:
    r""":math:`C(\Theta) = \|\Theta - \bar\theta 1^\top\|_F^2` of numpy models.

    >>> consensus_distance([np.zeros(3), np.ones(3)])
    1.5
    """
    X = np.stack(models)
    return float(np.sum((X - X.mean(axis=0)) ** 2))


class NumpyArrays:
    """The array operations of :class:`Replicas` for numpy float arrays (a mixin)."""

    @staticmethod
    def mean(arrays: Sequence[np.ndarray]) -> np.ndarray:
        return np.asarray(np.mean(arrays, axis=0))  # the reference executor's reduction, bit for bit

    @staticmethod
    def split(x: np.ndarray, n_shards: int, shard: int) -> np.ndarray:
        return np.array_split(x, n_shards)[shard]

    @staticmethod
    def concat(parts: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts)

    @staticmethod
    def consensus_distance(models: Sequence[np.ndarray]) -> float:
        return consensus_distance(models)
