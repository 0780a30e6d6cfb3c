"""Ops that merge a tensor's leading axes into one and split them back, with sizes taken
from arrays (the 1-D and 3-D Ops and the Lasagne port's recurrent and embedding layers
fold batches with them)."""

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.tensor.type import TensorType


class FoldLeading(Op):
    """Merges the first ``k`` axes of a tensor into one, row-major.

    A ``Reshape`` does this with a target computed from the input's shape, which JAX
    cannot trace when a folded size (the batch's) is unknown as the graph is built.
    This Op, its inverse :class:`UnfoldLeading` and their gradients (each other) take
    their sizes from arrays instead, which are concrete when JAX traces.  Neither
    infers its output's shape, for the same reason: a later Op that needs it (a
    gradient's zeros, a reshape back) reads it from the output array.

    Parameters
    ----------
    k
        Number of leading axes to merge (at least 1).
    """

    __props__ = ("k",)
    # The output is a view of the input: declared, so no later in-place Op writes into the
    # caller's array through it.
    view_map = {0: [0]}

    def __init__(self, k: int):
        self.k = int(k)
        if self.k < 1:
            raise ValueError("k must be positive")

    def make_node(self, x) -> Apply:
        x = pt.as_tensor_variable(x)
        if x.type.ndim < self.k:
            raise ValueError(f"cannot fold {self.k} axes of a {x.type.ndim}-d tensor")
        lead = x.type.shape[: self.k]
        size = None if None in lead else int(np.prod(lead))
        out = TensorType(x.type.dtype, shape=(size, *x.type.shape[self.k :]))()
        return Apply(self, [x], [out])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        output_storage[0][0] = x.reshape((int(np.prod(x.shape[: self.k])), *x.shape[self.k :]))

    def pullback(self, inputs, outputs, output_grads):
        return [UnfoldLeading(self.k)(output_grads[0], inputs[0])]


class UnfoldLeading(Op):
    """Splits axis 0 of ``x`` into the first ``k`` axes of ``like``: the inverse of
    :class:`FoldLeading`. ``like`` only provides those sizes.

    Parameters
    ----------
    k
        Number of axes axis 0 splits into (at least 1).
    """

    __props__ = ("k",)
    view_map = {0: [0]}  # a view of ``x``, as FoldLeading's

    def __init__(self, k: int):
        self.k = int(k)
        if self.k < 1:
            raise ValueError("k must be positive")

    def make_node(self, x, like) -> Apply:
        x, like = pt.as_tensor_variable(x), pt.as_tensor_variable(like)
        out = TensorType(x.type.dtype, shape=(*like.type.shape[: self.k], *x.type.shape[1:]))()
        return Apply(self, [x, like], [out])

    def perform(self, node, inputs, output_storage):
        x, like = inputs
        output_storage[0][0] = x.reshape((*like.shape[: self.k], *x.shape[1:]))

    def connection_pattern(self, node):
        return [[True], [False]]

    def pullback(self, inputs, outputs, output_grads):
        return [FoldLeading(self.k)(output_grads[0]), DisconnectedType()()]
