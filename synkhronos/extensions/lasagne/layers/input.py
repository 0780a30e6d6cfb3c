"""The input layer (``lasagne.layers.input``)."""

from collections.abc import Iterable

import pytensor
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import Layer, Shape

__all__ = ["InputLayer"]


class InputLayer(Layer):
    """Holds the symbolic input of a network.

    It has no ``input_layer``: the helpers' walk through a network ends here.

    Parameters
    ----------
    shape
        Input shape (any iterable); None marks sizes known only at run time (usually
        the batch).
    input_var
        Symbolic variable to use; by default a new ``floatX`` tensor named ``"input"``
        (``"<name>.input"`` for a named layer) whose type has the known sizes of
        ``shape``.
    name
        Optional name.
    **kwargs
        Accepted and ignored, as Lasagne does.

    Raises
    ------
    ValueError
        If a size is not positive, or ``input_var`` has another number of dimensions.

    Examples
    --------
    >>> InputLayer((None, 1)).input_var.broadcastable
    (False, True)
    """

    def __init__(
        self,
        shape: Iterable[int | None],
        input_var: TensorVariable | None = None,
        name: str | None = None,
        **kwargs,
    ):
        self.shape: Shape = tuple(shape)
        if any(d is not None and d <= 0 for d in self.shape):
            raise ValueError(
                f"Cannot create InputLayer with a non-positive shape dimension. "
                f"shape={self.shape!r}, self.name={name!r}"
            )
        if input_var is None:
            # Known sizes go into the type: PyTensor (and JAX) infer every later shape
            # from them; size-1 axes broadcast, as in Lasagne.
            var_name = "input" if name is None else f"{name}.input"
            input_var = pt.tensor(name=var_name, dtype=pytensor.config.floatX, shape=self.shape)
        elif input_var.ndim != len(self.shape):
            raise ValueError(
                f"shape has {len(self.shape)} dimensions, but variable has {input_var.ndim}"
            )
        self.input_var = input_var
        self.name = name
        self.params = {}

    @property
    def output_shape(self) -> Shape:
        """The input shape."""
        return self.shape
