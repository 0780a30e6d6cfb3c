"""The layer base classes (``lasagne.layers.base``)."""

from collections.abc import Callable, Iterable, Sequence

import numpy as np
from pytensor.graph.basic import Variable
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import nonlinearities
from synkhronos.extensions.lasagne.utils import collect_shared_vars, create_param

__all__ = ["Layer", "MergeLayer"]

Shape = tuple[int | None, ...]
ParamSpec = Variable | np.ndarray | float | Callable[[Sequence[int]], np.ndarray | Variable]


def as_nonlinearity(nonlinearity: Callable | None) -> Callable:
    """``nonlinearity``, with None meaning the identity (as in Lasagne)."""
    return nonlinearities.linear if nonlinearity is None else nonlinearity


def _checked_shape(layer: "Layer", shape: Shape) -> Shape:
    """``shape``, refused if ``get_output_shape_for`` computed it symbolically."""
    if any(isinstance(s, Variable) for s in shape):
        raise ValueError(
            f"{type(layer).__name__} returned a symbolic output shape from its "
            f"get_output_shape_for() method: {shape!r}. Shapes must be tuples of ints "
            "for known sizes and None for sizes known only at run time."
        )
    return shape


class Layer:
    """Base class of layers with one input.

    A layer takes part in a network through the attributes of Lasagne's layer protocol:
    ``input_layer`` (or ``input_layers``), ``input_shape``, ``output_shape``, ``params``,
    ``get_output_kwargs``, :meth:`get_output_shape_for` and :meth:`get_output_for`.
    The helpers of :mod:`~synkhronos.extensions.lasagne.layers.helper` use nothing
    else, so a user's class providing them works as well as a subclass.

    Parameters
    ----------
    incoming
        The layer feeding this one, or the shape of its input (then the layer can only
        be used with an explicit input in :func:`~synkhronos.extensions.lasagne.layers.get_output`).
    name
        Optional name, also used as a prefix for parameter names.
    """

    def __init__(self, incoming: "Layer | Shape", name: str | None = None):
        if isinstance(incoming, tuple):
            self.input_shape, self.input_layer = incoming, None
        else:
            self.input_shape, self.input_layer = incoming.output_shape, incoming
        self.name = name
        self.params: dict[Variable, set[str]] = {}
        # names of get_output() keywords this layer reads beyond its get_output_for's own
        self.get_output_kwargs: list[str] = []
        if any(d is not None and d <= 0 for d in self.input_shape):
            raise ValueError(
                f"Cannot create Layer with a non-positive input_shape dimension. "
                f"input_shape={self.input_shape!r}, self.name={name!r}"
            )

    @property
    def output_shape(self) -> Shape:
        """Shape of this layer's output (None for sizes unknown before run time)."""
        return _checked_shape(self, self.get_output_shape_for(self.input_shape))

    def get_params(self, unwrap_shared: bool = True, **tags: bool) -> list[Variable]:
        """This layer's parameters, filtered by tags.

        Parameters
        ----------
        unwrap_shared
            For parameters given as expressions: return the shared variables they
            depend on (True) or the expressions themselves (False).
        **tags
            ``tag=True`` keeps only parameters with the tag, ``tag=False`` only those
            without it (e.g. ``trainable=True``, ``regularizable=False``). An
            expression's tags apply to every variable in it.

        Returns
        -------
        list of Variable
            Parameters in the order they were added.
        """
        params = [
            p
            for p, p_tags in self.params.items()
            if all((t in p_tags) == bool(v) for t, v in tags.items())
        ]
        return collect_shared_vars(params) if unwrap_shared else params

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """Output shape for a given input shape; the identity unless overridden.

        Parameters
        ----------
        input_shape
            Shape of the input.

        Returns
        -------
        tuple
            Shape of the output.
        """
        return input_shape

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """Symbolic output for a symbolic input; subclasses define it.

        Parameters
        ----------
        input
            The input expression.
        **kwargs
            Keywords given to ``get_output`` (e.g. ``deterministic``).

        Returns
        -------
        TensorVariable
            The output expression.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define get_output_for")

    def add_param(
        self, spec: ParamSpec, shape: Iterable[int], name: str | None = None, **tags: bool
    ) -> Variable:
        """Create a parameter (see :func:`~synkhronos.extensions.lasagne.utils.create_param`)
        and register it with tags.

        Parameters
        ----------
        spec
            Initializer, number, array, shared variable or expression.
        shape
            Shape of the parameter.
        name
            Parameter name; prefixed with ``"<layer name>."`` when the layer has a name.
        **tags
            Tags; ``trainable`` and ``regularizable`` default to True.

        Returns
        -------
        Variable
            The parameter (a shared variable, or the expression given).
        """
        if name is not None and self.name is not None:
            name = f"{self.name}.{name}"
        param = create_param(spec, shape, name)
        tags = {"trainable": True, "regularizable": True} | tags
        self.params[param] = {t for t, on in tags.items() if on}
        return param


class MergeLayer(Layer):
    """Base class of layers with several inputs.

    Parameters
    ----------
    incomings
        The layers (or input shapes) feeding this one: any iterable.
    name
        Optional name.
    """

    def __init__(self, incomings: Iterable["Layer | Shape"], name: str | None = None):
        incomings = list(incomings)
        self.input_shapes = [i if isinstance(i, tuple) else i.output_shape for i in incomings]
        self.input_layers = [None if isinstance(i, tuple) else i for i in incomings]
        self.name = name
        self.params = {}
        self.get_output_kwargs = []

    @property
    def output_shape(self) -> Shape:
        """Shape of this layer's output (None for sizes unknown before run time).

        A class that does not define ``get_output_shape_for`` has no output shape: the
        attribute is missing (AttributeError), so that ``hasattr`` and
        ``unittest.mock``'s specs, which read every attribute, see an abstract layer.
        """
        if type(self).get_output_shape_for is MergeLayer.get_output_shape_for:
            raise AttributeError(
                f"{type(self).__name__} has no output_shape: it does not define "
                "get_output_shape_for"
            )
        return _checked_shape(self, self.get_output_shape_for(self.input_shapes))

    def get_output_shape_for(self, input_shapes: list[Shape]) -> Shape:
        """Output shape for the given input shapes; subclasses define it.

        Parameters
        ----------
        input_shapes
            Shapes of the inputs.

        Returns
        -------
        tuple
            Shape of the output.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define get_output_shape_for")

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """Symbolic output for the symbolic inputs; subclasses define it.

        Parameters
        ----------
        inputs
            The input expressions, in the order of ``input_layers``.
        **kwargs
            Keywords given to ``get_output``.

        Returns
        -------
        TensorVariable
            The output expression.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define get_output_for")
