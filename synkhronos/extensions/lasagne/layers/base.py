"""Layer base classes and the input layer (``lasagne.layers.base`` / ``input``)."""

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import nonlinearities

__all__ = ["InputLayer", "Layer", "MergeLayer", "add_default_update", "create_param"]

Shape = tuple[int | None, ...]
ParamSpec = SharedVariable | np.ndarray | Callable[[Sequence[int]], np.ndarray]


def create_param(spec: ParamSpec, shape: Sequence[int], name: str | None = None) -> SharedVariable:
    """Make a shared variable from an initializer, an array or an existing shared variable.

    Parameters
    ----------
    spec
        A shared variable (used as is), a NumPy array (copied), or a callable such as an
        :class:`~synkhronos.extensions.lasagne.init.Initializer` called with ``shape``.
    shape
        Required shape of the parameter.
    name
        Name of the created shared variable.

    Returns
    -------
    SharedVariable
        The parameter.
    """
    shape = tuple(shape)
    if any(d is None or d <= 0 for d in shape):
        raise ValueError(f"parameter {name} needs a fully known positive shape, got {shape}")
    if isinstance(spec, SharedVariable):
        if spec.ndim != len(shape):
            raise ValueError(f"shared variable for {name} has {spec.ndim} dims, expected {shape}")
        return spec
    value = np.asarray(spec if isinstance(spec, np.ndarray) else spec(shape))
    if value.shape != shape:
        raise ValueError(f"initial value for {name} has shape {value.shape}, expected {shape}")
    # A static shape lets PyTensor infer the shapes of everything computed from it.
    return pytensor.shared(np.array(value, dtype=pytensor.config.floatX), name=name, shape=shape)


def add_default_update(variable: SharedVariable, update: Variable) -> None:
    """Make every compiled function whose graph contains ``variable`` apply ``update``.

    This is how Lasagne attaches batch-norm average and random-stream updates to an
    output expression.  PyTensor 3 deprecates setting ``default_update`` (its own
    ``RandomStream`` still does it), so the warning is silenced here, in one place.

    Parameters
    ----------
    variable
        Shared variable to update, typically a clone sharing another's storage.
    update
        New value of ``variable`` after each call.
    """
    if isinstance(variable.type, TensorType) and update.type != variable.type:
        # PyTensor wants the two types equal: slicing to the variable's symbolic sizes
        # drops static sizes that the update knows and the variable's type leaves open.
        sizes = (variable.shape[axis] for axis in range(variable.ndim))
        update = pt.cast(update, variable.dtype)[tuple(slice(0, n) for n in sizes)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        variable.default_update = update


def as_nonlinearity(nonlinearity: Callable | None) -> Callable:
    """``nonlinearity``, with None meaning the identity (as in Lasagne)."""
    return nonlinearities.linear if nonlinearity is None else nonlinearity


class Layer:
    """Base class of layers with one input.

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
        self.params: dict[SharedVariable, set[str]] = {}
        if any(d is not None and d <= 0 for d in self.input_shape):
            raise ValueError(f"layer {name} got an input shape with a non-positive size")

    @property
    def output_shape(self) -> Shape:
        """Shape of this layer's output (None for sizes unknown before run time)."""
        return self.get_output_shape_for(self.input_shape)

    def get_params(self, **tags: bool) -> list[SharedVariable]:
        """This layer's parameters, filtered by tags.

        Parameters
        ----------
        **tags
            ``tag=True`` keeps only parameters with the tag, ``tag=False`` only those
            without it (e.g. ``trainable=True``, ``regularizable=False``).

        Returns
        -------
        list of SharedVariable
            Parameters in creation order.
        """
        return [
            p
            for p, p_tags in self.params.items()
            if all((t in p_tags) == v for t, v in tags.items())
        ]

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
            Options such as ``deterministic``, passed to every layer by ``get_output``.

        Returns
        -------
        TensorVariable
            The output expression.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define get_output_for")

    def add_param(
        self, spec: ParamSpec, shape: Sequence[int], name: str | None = None, **tags: bool
    ) -> SharedVariable:
        """Create a parameter (see :func:`create_param`) and register it with tags.

        Parameters
        ----------
        spec
            Initializer, array or shared variable.
        shape
            Shape of the parameter.
        name
            Parameter name; prefixed with ``"<layer name>."`` when the layer has a name.
        **tags
            Tags; ``trainable`` and ``regularizable`` default to True.

        Returns
        -------
        SharedVariable
            The parameter.
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
        The layers (or input shapes) feeding this one.
    name
        Optional name.
    """

    def __init__(self, incomings: Sequence["Layer | Shape"], name: str | None = None):
        self.input_shapes = [i if isinstance(i, tuple) else i.output_shape for i in incomings]
        self.input_layers = [None if isinstance(i, tuple) else i for i in incomings]
        self.name = name
        self.params = {}

    @property
    def output_shape(self) -> Shape:
        """Shape of this layer's output (None for sizes unknown before run time)."""
        return self.get_output_shape_for(self.input_shapes)

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


class InputLayer(Layer):
    """Holds the symbolic input of a network.

    Parameters
    ----------
    shape
        Input shape; None marks sizes known only at run time (usually the batch).
    input_var
        Symbolic variable to use; by default a new ``floatX`` tensor of this shape.
    name
        Optional name, also used for the created variable.
    **kwargs
        Accepted and ignored, as Lasagne does.
    """

    def __init__(
        self,
        shape: Sequence[int | None],
        input_var: TensorVariable | None = None,
        name: str | None = None,
        **kwargs,
    ):
        self.shape = tuple(None if d is None else int(d) for d in shape)
        if any(d is not None and d <= 0 for d in self.shape):
            raise ValueError(f"input shape must be positive or None, got {self.shape}")
        if input_var is None:
            input_var = pt.tensor(name=name, dtype=pytensor.config.floatX, shape=self.shape)
        elif input_var.ndim != len(self.shape):
            raise ValueError(f"input_var has {input_var.ndim} dims, shape has {len(self.shape)}")
        self.input_var = input_var
        self.input_shape, self.input_layer = self.shape, None
        self.name = name
        self.params = {}

    @property
    def output_shape(self) -> Shape:
        """The input shape."""
        return self.shape
