"""Noise layers (``lasagne.layers.noise``): dropout and Gaussian noise.

As in Lasagne, each layer draws from its own random streams (``_srng``, Theano's
``RandomStreams``: :mod:`synkhronos.ops.random_streams`), seeded from
:func:`synkhronos.extensions.lasagne.random.get_rng` when the layer is built; each draw's
generator advances by a default update, so each call of a compiled training function
draws new noise.
"""

from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import Layer, Shape
from synkhronos.extensions.lasagne.random import get_rng
from synkhronos.ops.random_streams import RandomStreams

__all__ = [
    "DropoutLayer",
    "GaussianNoiseLayer",
    "dropout",
    "dropout_channels",
    "dropout_locations",
    "spatial_dropout",
]


def layer_streams() -> RandomStreams:
    """A layer's own random streams, seeded from ``lasagne.random.get_rng()`` when the layer
    is built, as Lasagne seeds its layers' ``_srng``.

    Returns
    -------
    RandomStreams
        Theano's random streams (:class:`synkhronos.ops.random_streams.RandomStreams`).
    """
    return RandomStreams(int(get_rng().randint(1, 2147462579)))


class DropoutLayer(Layer):
    """Zero each input element with probability ``p`` during training.

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

    Examples
    --------
    >>> import numpy as np
    >>> layer = DropoutLayer((2, 3), p=0.5)
    >>> layer.get_output_for(pt.ones((2, 3)), deterministic=True).eval()
    array([[1., 1., 1.],
           [1., 1., 1.]])
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
        self._srng = layer_streams()

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
        mask = self._srng.binomial(shape, p=keep, dtype=input.dtype)
        if self.shared_axes:
            mask = pt.specify_broadcastable(mask, *self.shared_axes)
        if self.rescale:
            input = input / pt.cast(keep, input.dtype)
        return input * mask


dropout = DropoutLayer


def dropout_channels(incoming: Layer | Shape, *args, **kwargs) -> DropoutLayer:
    """Dropout of whole channels: one mask value per (batch, channel), shared over axes 2+.

    Parameters
    ----------
    incoming
        Input layer or shape, at least 3-d.
    *args, **kwargs
        Passed to :class:`DropoutLayer` (``shared_axes`` is set here).

    Returns
    -------
    DropoutLayer
        The layer.

    Examples
    --------
    >>> dropout_channels((None, 4, 5, 5)).shared_axes
    (2, 3)
    """
    ndim = len(incoming if isinstance(incoming, tuple) else incoming.output_shape)
    kwargs["shared_axes"] = tuple(range(2, ndim))
    return DropoutLayer(incoming, *args, **kwargs)


spatial_dropout = dropout_channels


def dropout_locations(incoming: Layer | Shape, *args, **kwargs) -> DropoutLayer:
    """Dropout of whole locations: one mask value per (batch, position), shared over channels.

    Parameters
    ----------
    incoming
        Input layer or shape, at least 3-d.
    *args, **kwargs
        Passed to :class:`DropoutLayer` (``shared_axes`` is set here).

    Returns
    -------
    DropoutLayer
        The layer.

    Examples
    --------
    >>> dropout_locations((None, 4, 5, 5)).shared_axes
    (1,)
    """
    kwargs["shared_axes"] = (1,)
    return DropoutLayer(incoming, *args, **kwargs)


class GaussianNoiseLayer(Layer):
    """Add zero-mean Gaussian noise of standard deviation ``sigma`` during training.

    Parameters
    ----------
    incoming
        Input layer or shape.
    sigma
        Standard deviation of the noise.
    **kwargs
        ``name``.

    Examples
    --------
    >>> GaussianNoiseLayer((2, 3)).get_output_for(pt.ones((2, 3)), deterministic=True).eval()
    array([[1., 1., 1.],
           [1., 1., 1.]])
    """

    def __init__(self, incoming: Layer | Shape, sigma: float = 0.1, **kwargs):
        super().__init__(incoming, **kwargs)
        self.sigma = sigma
        self._srng = layer_streams()

    def get_output_for(
        self, input: TensorVariable, deterministic: bool = False, **kwargs
    ) -> TensorVariable:
        """``input + noise`` (the input itself if ``deterministic`` or ``sigma == 0``).

        Parameters
        ----------
        input
            The input expression.
        deterministic
            If True, return the input unchanged.
        **kwargs
            Ignored.

        Returns
        -------
        TensorVariable
            The noisy input.
        """
        if deterministic or self.sigma == 0:
            return input
        return input + self._srng.normal(input.shape, avg=0.0, std=self.sigma, dtype=input.dtype)
