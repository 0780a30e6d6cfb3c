"""Lasagne's ``lasagne.layers.corrmm`` name: :class:`Conv2DMMLayer` is
:class:`~.dnn.Conv2DDNNLayer` (a 2-D convolution defaulting to ``flip_filters=False``).

Examples
--------
>>> from synkhronos.extensions.lasagne.layers import InputLayer
>>> Conv2DMMLayer(InputLayer((None, 3, 8, 8)), 4, 3).output_shape
(None, 4, 6, 6)
"""

from synkhronos.extensions.lasagne.layers.dnn import Conv2DDNNLayer

__all__ = ["Conv2DMMLayer"]

Conv2DMMLayer = Conv2DDNNLayer
