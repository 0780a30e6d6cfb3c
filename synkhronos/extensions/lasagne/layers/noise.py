"""Dropout (``lasagne.layers.DropoutLayer``)."""

from collections.abc import Sequence

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init
from synkhronos.extensions.lasagne.layers.base import Layer, Shape, add_default_update

__all__ = ["DropoutLayer"]


class DropoutLayer(Layer):
    """Zero each input element with probability ``p`` during training.

    Each output expression draws from its own shared random generator with a default
    update, so each call of a compiled training function draws a new mask.  Seeds come
    from a per-layer generator seeded by :func:`synkhronos.extensions.lasagne.init.get_rng`.

    Parameters
    ----------
    incoming
        Input layer or shape.
    p
        Probability of dropping an element.
    rescale
        Divide the kept elements by ``1 - p`` so the expected output equals the input.
    shared_axes
        Axes along which one mask value is shared (e.g. ``(2, 3)`` drops whole
        feature maps).
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        p: float = 0.5,
        rescale: bool = True,
        shared_axes: Sequence[int] = (),
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        if not 0 <= p < 1:
            raise ValueError(f"p must be in [0, 1), got {p}")
        self.p, self.rescale = p, rescale
        self.shared_axes = tuple(a % len(self.input_shape) for a in shared_axes)
        self._seeds = np.random.default_rng(init.get_rng().integers(2**63))

    def get_output_for(
        self, input: TensorVariable, deterministic: bool = False, **kwargs
    ) -> TensorVariable:
        """The input with random elements zeroed (unchanged if ``deterministic``).

        Parameters
        ----------
        input
            The input expression.
        deterministic
            If True, return the input unchanged (inference).
        **kwargs
            Ignored.

        Returns
        -------
        TensorVariable
            The masked (and rescaled) input.
        """
        if deterministic or self.p == 0:
            return input
        keep = 1 - self.p
        shape = [1 if a in self.shared_axes else input.shape[a] for a in range(input.ndim)]
        rng = pt.random.shared_rng(seed=int(self._seeds.integers(2**63)))
        # Bernoulli rather than binomial: PyTensor's JAX backend samples only the former.
        next_rng, mask = rng.bernoulli(keep, size=shape)
        add_default_update(rng, next_rng)
        if self.shared_axes:
            mask = pt.specify_broadcastable(mask, *self.shared_axes)
        if self.rescale:
            input = input / pt.cast(keep, input.dtype)
        return input * pt.cast(mask, input.dtype)
