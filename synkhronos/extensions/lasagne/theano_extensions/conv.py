"""Lasagne's alternative 1-D convolutions (``lasagne.theano_extensions.conv``).

Lasagne wrote six ways of computing one 1-D convolution on Theano, for speed; here all
six compute it with :func:`synkhronos.ops.nnet.conv_nd` (Theano's
convention, on :func:`synkhronos.ops.conv.conv1d`, whose kernels are the 2-D
convolution's), each keeping the arguments and restrictions of Lasagne's function:
``conv1d_sc``, ``conv1d_unstrided``, ``conv1d_sd`` and ``conv1d_md`` take only valid
convolutions, and the last three need a filter length that is a multiple of the stride.
Like Theano's ``conv2d``, they convolve (flip the filters) unless ``filter_flip=False``.
"""

import numpy as np
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.utils import int_types
from synkhronos.ops.nnet import conv_nd
from synkhronos.theano import tensor as T  # noqa: N812 - Lasagne's name, in its star set

__all__ = [
    "T",
    "conv1d_mc0",
    "conv1d_mc1",
    "conv1d_md",
    "conv1d_sc",
    "conv1d_sd",
    "conv1d_unstrided",
    "int_types",
    "np",
]


def _valid_only(name: str, border_mode) -> None:
    if border_mode not in ("valid", 0, (0,)):
        raise RuntimeError(f"Unsupported border_mode for {name}: {border_mode}")


def _valid_strided(
    name: str, input, filters, filter_shape, border_mode, subsample, filter_flip: bool
) -> TensorVariable:
    """A valid convolution whose filter length the stride divides, as Lasagne's
    strided variants require."""
    filter_length, stride = filter_shape[2], subsample[0]
    if filter_length % stride:
        raise RuntimeError(
            f"Filter length ({filter_length}) is not a multiple of the stride ({stride})"
        )
    _valid_only(name, border_mode)
    return conv_nd(input, filters, 1, None, 0, subsample, filter_flip)


def conv1d_sc(
    input,
    filters,
    image_shape=None,
    filter_shape=None,
    border_mode="valid",
    subsample=(1,),
    filter_flip=True,
) -> TensorVariable:
    """Valid 1-D convolution of ``input`` (b, c, length) with ``filters`` (f, c, k).

    Parameters
    ----------
    input, filters
        Tensors of 3 dimensions.
    image_shape, filter_shape
        Their shapes, if known (accepted; the graph infers them).
    border_mode
        ``"valid"`` (or 0) only.
    subsample
        ``(stride,)``.
    filter_flip
        Convolve (True) or cross-correlate (False).

    Returns
    -------
    TensorVariable
        ``(b, f, output length)``.
    """
    _valid_only("conv1d_sc", border_mode)
    return conv_nd(input, filters, 1, None, 0, subsample, filter_flip)


def conv1d_mc0(
    input,
    filters,
    image_shape=None,
    filter_shape=None,
    border_mode="valid",
    subsample=(1,),
    filter_flip=True,
    num_groups=1,
) -> TensorVariable:
    """1-D convolution with any of Theano's border modes and channel groups.

    Parameters
    ----------
    input, filters
        ``(b, c, length)`` and ``(f, c / num_groups, k)``.
    image_shape, filter_shape
        Their shapes, if known (``"full"`` and ``"half"`` need the filter length, from
        ``filter_shape`` or the filters' static shape).
    border_mode
        ``"valid"``, ``"full"``, ``"half"``, an int or ``(int,)`` (padding per side).
    subsample
        ``(stride,)``.
    filter_flip
        Convolve (True) or cross-correlate (False).
    num_groups
        Number of channel groups.

    Returns
    -------
    TensorVariable
        ``(b, f, output length)``.
    """
    return conv_nd(
        input, filters, 1, filter_shape, border_mode, subsample, filter_flip, num_groups=num_groups
    )


# Lasagne's two multi-channel variants differed in the image axis they computed along; the
# convolution they compute is the same, and here it is one function.
conv1d_mc1 = conv1d_mc0


def conv1d_unstrided(
    input,
    filters,
    image_shape,
    filter_shape,
    border_mode="valid",
    subsample=(1,),
    filter_flip=True,
    implementation=conv1d_sc,
) -> TensorVariable:
    """Valid strided 1-D convolution whose filter length is a multiple of the stride.

    Parameters
    ----------
    input, filters
        ``(b, c, length)`` and ``(f, c, k)``.
    image_shape, filter_shape
        Their shapes (``filter_shape`` is checked against the stride).
    border_mode
        ``"valid"`` (or 0) only.
    subsample
        ``(stride,)``, dividing the filter length.
    filter_flip
        Convolve (True) or cross-correlate (False).
    implementation
        Accepted for Lasagne's signature (the convolution is computed as above).

    Returns
    -------
    TensorVariable
        ``(b, f, output length)``.
    """
    return _valid_strided(
        "conv1d_unstrided", input, filters, filter_shape, border_mode, subsample, filter_flip
    )


def conv1d_sd(
    input, filters, image_shape, filter_shape, border_mode="valid", subsample=(1,), filter_flip=True
) -> TensorVariable:
    """Valid strided 1-D convolution (Lasagne's "single dot product" variant).

    Parameters
    ----------
    input, filters, image_shape, filter_shape, border_mode, subsample, filter_flip
        As for :func:`conv1d_unstrided`.

    Returns
    -------
    TensorVariable
        ``(b, f, output length)``.
    """
    return _valid_strided(
        "conv1d_sd", input, filters, filter_shape, border_mode, subsample, filter_flip
    )


def conv1d_md(
    input, filters, image_shape, filter_shape, border_mode="valid", subsample=(1,), filter_flip=True
) -> TensorVariable:
    """:func:`conv1d_sd` under the name of Lasagne's "multiple dot products" variant
    (same parameters and result)."""
    return _valid_strided(
        "conv1d_md", input, filters, filter_shape, border_mode, subsample, filter_flip
    )
