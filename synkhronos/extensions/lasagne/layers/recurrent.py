"""Recurrent layers (``lasagne.layers.recurrent``) on ``pytensor.scan``.

Every layer takes input of shape ``(batch, time, features...)`` and returns the hidden
state at each step, ``(batch, time, units...)``, or only the last one
(``only_return_final=True``).  An optional mask input of shape ``(batch, time)`` marks
the valid steps of each sequence: where it is 0 the state is carried over unchanged,
so a right-padded batch of variable-length sequences gives each sequence's own final
state at the last step.
"""

from collections.abc import Callable, Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.gradient import GradClip
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers import helper
from synkhronos.extensions.lasagne.layers.base import (
    Layer,
    MergeLayer,
    ParamSpec,
    Shape,
    as_nonlinearity,
)
from synkhronos.extensions.lasagne.layers.dense import DenseLayer
from synkhronos.extensions.lasagne.layers.input import InputLayer
from synkhronos.extensions.lasagne.utils import unroll_scan
from synkhronos.ops.conv import FoldLeading, UnfoldLeading

__all__ = ["CustomRecurrentLayer", "GRULayer", "Gate", "LSTMLayer", "RecurrentLayer"]

# An initial state: an initializer/array/shared variable (a parameter of the layer,
# learnt when ``learn_init``) or a layer giving a ``(batch, units...)`` value.
StateSpec = ParamSpec | Layer


class _BoundedGradClip(GradClip):
    """PyTensor's gradient clip with its bounds part of its identity.

    PyTensor's own compares equal whatever its bounds, and PyTensor 3.3 interns a scan's
    inner graph by its ops' equality: two layers clipping at different bounds in one
    graph then both took the first one's bounds (a wrong gradient, silently).
    """

    __props__ = ("clip_lower_bound", "clip_upper_bound")


class Gate:
    """Parameters of one gate of an :class:`LSTMLayer` or :class:`GRULayer`.

    Parameters
    ----------
    W_in
        Initializer of the input-to-gate weights ``(num_inputs, num_units)``.
    W_hid
        Initializer of the hidden-to-gate weights ``(num_units, num_units)``.
    W_cell
        Initializer of the cell-to-gate (peephole) weights ``(num_units,)``; None for
        gates without one (then the attribute is not set, as in Lasagne).
    b
        Initializer of the biases ``(num_units,)``.
    nonlinearity
        Activation of the gate; None means the identity.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne import nonlinearities
    >>> gate = Gate(W_cell=None, nonlinearity=nonlinearities.tanh)
    >>> hasattr(gate, "W_cell"), gate.nonlinearity is nonlinearities.tanh
    (False, True)
    """

    def __init__(
        self,
        W_in: ParamSpec = init.Normal(0.1),  # noqa: B008 (initializers are stateless)
        W_hid: ParamSpec = init.Normal(0.1),  # noqa: B008
        W_cell: ParamSpec | None = init.Normal(0.1),  # noqa: B008
        b: ParamSpec = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.sigmoid,
    ):
        self.W_in = W_in
        self.W_hid = W_hid
        if W_cell is not None:
            self.W_cell = W_cell
        self.b = b
        self.nonlinearity = as_nonlinearity(nonlinearity)


class _RecurrentBase(MergeLayer):
    """What the recurrent layers share: the optional mask and initial-state inputs,
    the loop (``scan``, or unrolled), masking, gradient clipping and the output layout.

    Subclasses set ``_unit_shape`` (the state's shape after the batch axis) and build
    a step function ``step(input_n, *previous_states, *non_sequences) -> new states``
    (a list, the hidden state last)."""

    _unit_shape: Shape

    def __init__(
        self,
        incoming: Layer | Shape,
        mask_input: Layer | Shape | None,
        initial_states: dict[str, StateSpec],
        backwards: bool,
        learn_init: bool,
        gradient_steps: int,
        grad_clipping: float,
        unroll_scan: bool,
        precompute_input: bool,
        only_return_final: bool,
        **kwargs,
    ):
        # Lasagne's layout: the input, then the mask, then the initial-state layers,
        # recorded by index (-1 when absent) so get_output_for can pick them out.
        incomings = [incoming]
        self.mask_incoming_index = -1
        if mask_input is not None:
            incomings.append(mask_input)
            self.mask_incoming_index = len(incomings) - 1
        for state, spec in initial_states.items():
            index = -1
            if isinstance(spec, Layer):
                incomings.append(spec)
                index = len(incomings) - 1
            setattr(self, f"{state}_incoming_index", index)
        super().__init__(incomings, **kwargs)
        self.backwards = backwards
        self.learn_init = learn_init
        self.gradient_steps = gradient_steps
        self.grad_clipping = grad_clipping
        self.unroll_scan = unroll_scan
        self.precompute_input = precompute_input
        self.only_return_final = only_return_final
        if unroll_scan and gradient_steps != -1:
            raise ValueError("gradient_steps must be -1 when unroll_scan is True")
        if unroll_scan and self.input_shapes[0][1] is None:
            raise ValueError("unroll_scan needs a known sequence length (input_shape[1])")

    def _add_initial_state(self, spec: StateSpec, shape: Shape, name: str):
        """The layer giving the initial state, or a parameter holding it (batch size 1)."""
        if isinstance(spec, Layer):
            return spec
        return self.add_param(
            spec, shape, name=name, trainable=self.learn_init, regularizable=False
        )

    def _initial_value(self, inputs: list[TensorVariable], state: str, num_batch) -> TensorVariable:
        """The initial ``state`` for a batch: its input layer's value, or the parameter
        repeated over the batch."""
        index = getattr(self, f"{state}_incoming_index")
        if index > 0:
            # A layer's (1, units) broadcasts over the batch: the scan's state type must
            # match its step's output, whose batch size the type may now know.
            value = inputs[index]
            return pt.broadcast_to(
                value, (num_batch, *(value.shape[a] for a in range(1, value.ndim)))
            )
        param = getattr(self, state)
        return pt.broadcast_to(param, (num_batch, *param.type.shape[1:]))

    def _clip(self, x: TensorVariable) -> TensorVariable:
        """``x``, its gradient clipped to ``±grad_clipping`` when that is set."""
        if not self.grad_clipping:
            return x
        return _BoundedGradClip(-self.grad_clipping, self.grad_clipping)(x)

    def _run(
        self,
        step: Callable,
        inputs: list[TensorVariable],
        sequence: TensorVariable,
        states: Sequence[str],
        non_sequences: list[TensorVariable],
    ) -> TensorVariable:
        """Run ``step`` over the time-major ``sequence`` from the initial values of
        ``states`` (attribute names; the hidden state last); the layer's output."""
        initial = [self._initial_value(inputs, s, sequence.shape[1]) for s in states]
        sequences = [sequence]
        fn = step
        if self.mask_incoming_index > 0:
            sequences.append(inputs[self.mask_incoming_index].T)
            n_states = len(initial)

            def fn(input_n, mask_n, *rest):
                previous = rest[:n_states]
                new = step(input_n, *rest)
                return [
                    pt.switch(pt.shape_padright(mask_n, new_s.ndim - 1), new_s, old_s)
                    for new_s, old_s in zip(new, previous, strict=True)
                ]

        if self.unroll_scan:
            over_time = unroll_scan(
                fn,
                sequences,
                initial,
                non_sequences,
                n_steps=self.input_shapes[0][1],
                go_backwards=self.backwards,
            )
        else:
            over_time = pytensor.scan(
                fn,
                sequences=sequences,
                outputs_info=initial,
                non_sequences=non_sequences,
                go_backwards=self.backwards,
                truncate_gradient=self.gradient_steps,
                strict=True,
                return_list=True,
                return_updates=False,
            )
        return self._layout(over_time[-1])

    def _layout(self, hid_out: TensorVariable) -> TensorVariable:
        """Time-major states as the layer's output: batch-major in time order, or the
        state after the last step run."""
        if self.only_return_final:
            return hid_out[-1]
        hid_out = hid_out.dimshuffle(1, 0, *range(2, hid_out.ndim))
        return hid_out[:, ::-1] if self.backwards else hid_out

    def get_output_shape_for(self, input_shapes: list[Shape]) -> Shape:
        """``(batch, time, units...)``, or ``(batch, units...)`` with ``only_return_final``.

        Parameters
        ----------
        input_shapes
            Shapes of the inputs; the first is the sequence's.

        Returns
        -------
        tuple
            Shape of the output.
        """
        batch, steps = input_shapes[0][:2]
        leading = (batch,) if self.only_return_final else (batch, steps)
        return (*leading, *self._unit_shape)


class CustomRecurrentLayer(_RecurrentBase):
    """A recurrence built from two sub-networks:
    ``h_t = nonlinearity(input_to_hidden(x_t) + hidden_to_hidden(h_{t-1}))``.

    Parameters
    ----------
    incoming
        Layer (or shape) giving the sequences, ``(batch, time, features...)``.
    input_to_hidden
        Network (output layer) with one :class:`InputLayer` taking ``(n, features...)``,
        applied to every step's input.
    hidden_to_hidden
        Network with one :class:`InputLayer` taking the state ``(n, units...)`` and
        returning the same shape.
    nonlinearity
        Activation of the state; None means the identity.
    hid_init
        Initial state: initializer/array/shared variable of shape ``(1, units...)``, or
        a layer giving ``(batch, units...)``.
    backwards
        Run from the last step to the first (the output stays in time order).
    learn_init
        Make ``hid_init`` a trainable parameter (when it is not a layer).
    gradient_steps
        Back-propagate through at most this many steps; -1 for all.
    grad_clipping
        If nonzero, clip the gradient reaching the state's pre-activation to
        ``±grad_clipping`` at every step (the forward value is unchanged).
    unroll_scan
        Write the loop out step by step instead of using ``scan`` (needs a known
        sequence length and ``gradient_steps=-1``).
    precompute_input
        Apply ``input_to_hidden`` to all steps at once before the loop.
    mask_input
        Layer giving a ``(batch, time)`` mask; where 0 the previous state is kept.
    only_return_final
        Return only the state after the last step run, ``(batch, units...)``.
    **kwargs
        ``name``.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers.dense import DenseLayer
    >>> l_in = InputLayer((None, 5, 4))
    >>> in_to_hid = DenseLayer(InputLayer((None, 4)), 6, nonlinearity=None)
    >>> hid_to_hid = DenseLayer(InputLayer((None, 6)), 6, nonlinearity=None)
    >>> CustomRecurrentLayer(l_in, in_to_hid, hid_to_hid).output_shape
    (None, 5, 6)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        input_to_hidden: Layer,
        hidden_to_hidden: Layer,
        nonlinearity: Callable | None = nonlinearities.rectify,
        hid_init: StateSpec = init.Constant(0.0),  # noqa: B008
        backwards: bool = False,
        learn_init: bool = False,
        gradient_steps: int = -1,
        grad_clipping: float = 0,
        unroll_scan: bool = False,
        precompute_input: bool = True,
        mask_input: Layer | Shape | None = None,
        only_return_final: bool = False,
        **kwargs,
    ):
        super().__init__(
            incoming,
            mask_input,
            {"hid_init": hid_init},
            backwards,
            learn_init,
            gradient_steps,
            grad_clipping,
            unroll_scan,
            precompute_input,
            only_return_final,
            **kwargs,
        )
        hid_to_hid_input = _only_input_layer(hidden_to_hidden, "hidden_to_hidden")
        _only_input_layer(input_to_hidden, "input_to_hidden")
        self.input_to_hidden = input_to_hidden
        self.hidden_to_hidden = hidden_to_hidden
        self.nonlinearity = as_nonlinearity(nonlinearity)
        in_out = input_to_hidden.output_shape
        hid_out = hidden_to_hidden.output_shape
        batch, steps = self.input_shapes[0][:2]
        if precompute_input:
            rows = None if batch is None or steps is None else batch * steps
            _check_sizes([in_out[0]], [rows], "input_to_hidden's output batch (precompute_input)")
        else:
            _check_sizes([in_out[0]], [hid_out[0]], "the batch of both sub-networks' outputs")
        _check_sizes(in_out[1:], hid_out[1:], "input_to_hidden's and hidden_to_hidden's outputs")
        _check_sizes(
            in_out[1:], hid_to_hid_input.output_shape[1:], "hidden_to_hidden's input and output"
        )
        self._unit_shape = tuple(hid_out[1:])
        self.hid_init = self._add_initial_state(hid_init, (1, *self._unit_shape), "hid_init")

    def get_params(self, **tags: bool) -> list[SharedVariable]:
        """This layer's parameters and those of its two sub-networks.

        Parameters
        ----------
        **tags
            Filters, as in :meth:`Layer.get_params`.

        Returns
        -------
        list of SharedVariable
            The parameters.
        """
        return (
            super().get_params(**tags)
            + helper.get_all_params(self.input_to_hidden, **tags)
            + helper.get_all_params(self.hidden_to_hidden, **tags)
        )

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """The states over time (see the class description).

        Parameters
        ----------
        inputs
            The sequences, then the mask and ``hid_init`` values when those are layers.
        **kwargs
            Passed to the sub-networks' ``get_output``.

        Returns
        -------
        TensorVariable
            ``(batch, time, units...)`` or ``(batch, units...)``.
        """
        sequence = inputs[0].dimshuffle(1, 0, *range(2, inputs[0].ndim))
        if self.precompute_input:
            # input_to_hidden takes every step of every sequence as one batch.
            flat = FoldLeading(2)(sequence)
            projected = helper.get_output(self.input_to_hidden, flat, **kwargs)
            sequence = UnfoldLeading(2)(projected, sequence)
        non_sequences = helper.get_all_params(self.hidden_to_hidden)
        if not self.precompute_input:
            non_sequences += helper.get_all_params(self.input_to_hidden)

        def step(input_n, hid_previous, *_):
            if not self.precompute_input:
                input_n = helper.get_output(self.input_to_hidden, input_n, **kwargs)
            hid_pre = helper.get_output(self.hidden_to_hidden, hid_previous, **kwargs) + input_n
            return [self.nonlinearity(self._clip(hid_pre))]

        return self._run(step, inputs, sequence, ["hid_init"], non_sequences)


def _only_input_layer(network: Layer, what: str) -> InputLayer:
    """The one :class:`InputLayer` of ``network``."""
    found = [lay for lay in helper.get_all_layers(network) if isinstance(lay, InputLayer)]
    if len(found) != 1:
        raise ValueError(f"`{what}` must have exactly one InputLayer, but it has {len(found)}")
    return found[0]


def _check_sizes(got: Sequence, expected: Sequence, what: str) -> None:
    """Raise unless the sizes agree wherever both are known."""
    if not all(a is None or b is None or a == b for a, b in zip(got, expected, strict=False)):
        raise ValueError(f"sizes of {what} differ: {tuple(got)} vs {tuple(expected)}")


class RecurrentLayer(CustomRecurrentLayer):
    """A fully connected recurrence
    ``h_t = nonlinearity(x_t W_in_to_hid + h_{t-1} W_hid_to_hid + b)``.

    Parameters
    ----------
    incoming
        Layer (or shape) giving the sequences, ``(batch, time, features...)``.
    num_units
        Number of hidden units.
    W_in_to_hid
        Initializer of the ``(num_inputs, num_units)`` input weights.
    W_hid_to_hid
        Initializer of the ``(num_units, num_units)`` recurrent weights.
    b
        Initializer of the ``(num_units,)`` biases, or None for none.
    nonlinearity, hid_init, backwards, learn_init, gradient_steps, grad_clipping, \
unroll_scan, precompute_input, mask_input, only_return_final
        As for :class:`CustomRecurrentLayer`.
    **kwargs
        ``name`` (the two inner dense layers are named ``<name>.input_to_hidden`` and
        ``<name>.hidden_to_hidden``).

    Examples
    --------
    >>> l_in = InputLayer((None, 5, 4))
    >>> l_rnn = RecurrentLayer(l_in, 6, only_return_final=True)
    >>> l_rnn.output_shape, l_rnn.W_hid_to_hid.get_value().shape
    ((None, 6), (6, 6))
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_units: int,
        W_in_to_hid: ParamSpec = init.Uniform(),  # noqa: B008
        W_hid_to_hid: ParamSpec = init.Uniform(),  # noqa: B008
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        hid_init: StateSpec = init.Constant(0.0),  # noqa: B008
        backwards: bool = False,
        learn_init: bool = False,
        gradient_steps: int = -1,
        grad_clipping: float = 0,
        unroll_scan: bool = False,
        precompute_input: bool = True,
        mask_input: Layer | Shape | None = None,
        only_return_final: bool = False,
        **kwargs,
    ):
        input_shape = incoming if isinstance(incoming, tuple) else incoming.output_shape
        prefix = f"{kwargs['name']}." if kwargs.get("name") else ""
        in_to_hid = DenseLayer(
            InputLayer((None, *input_shape[2:])),
            num_units,
            W=W_in_to_hid,
            b=b,
            nonlinearity=None,
            name=f"{prefix}input_to_hidden",
        )
        hid_to_hid = DenseLayer(
            InputLayer((None, num_units)),
            num_units,
            W=W_hid_to_hid,
            b=None,
            nonlinearity=None,
            name=f"{prefix}hidden_to_hidden",
        )
        self.W_in_to_hid = in_to_hid.W
        self.W_hid_to_hid = hid_to_hid.W
        self.b = in_to_hid.b
        super().__init__(
            incoming,
            in_to_hid,
            hid_to_hid,
            nonlinearity=nonlinearity,
            hid_init=hid_init,
            backwards=backwards,
            learn_init=learn_init,
            gradient_steps=gradient_steps,
            grad_clipping=grad_clipping,
            unroll_scan=unroll_scan,
            precompute_input=precompute_input,
            mask_input=mask_input,
            only_return_final=only_return_final,
            **kwargs,
        )


class _GatedBase(_RecurrentBase):
    """What LSTM and GRU share: gate parameters from :class:`Gate` objects, stacked so
    that one product per step computes all the gates' inputs."""

    def __init__(self, incoming, num_units: int, mask_input, initial_states, **options):
        super().__init__(incoming, mask_input, initial_states, **options)
        self.num_units = num_units
        self._unit_shape = (num_units,)
        self._num_inputs = int(np.prod(self.input_shapes[0][2:]))

    def _add_gate(self, gate: Gate, name: str):
        """Create the input, hidden and bias parameters of gate ``name``."""
        n = self.num_units
        return (
            self.add_param(gate.W_in, (self._num_inputs, n), name=f"W_in_to_{name}"),
            self.add_param(gate.W_hid, (n, n), name=f"W_hid_to_{name}"),
            self.add_param(gate.b, (n,), name=f"b_{name}", regularizable=False),
            gate.nonlinearity,
        )

    def _slice(self, x: TensorVariable, k: int) -> TensorVariable:
        """Gate ``k``'s block of the stacked pre-activations ``x``."""
        return x[:, k * self.num_units : (k + 1) * self.num_units]

    def _stack_gates(self, input: TensorVariable, gates: Sequence[str]):
        """The gates' weights and biases stacked side by side (one product per step
        computes every gate), and the input as ``(time, batch, features)``, already
        projected onto them when ``precompute_input``."""
        W_in = pt.concatenate([getattr(self, f"W_in_to_{g}") for g in gates], axis=1)
        W_hid = pt.concatenate([getattr(self, f"W_hid_to_{g}") for g in gates], axis=1)
        b = pt.concatenate([getattr(self, f"b_{g}") for g in gates])
        if input.ndim > 3:
            input = pt.flatten(input, 3)
        input = input.dimshuffle(1, 0, 2)
        sequence = pt.matmul(input, W_in) + b if self.precompute_input else input
        return sequence, W_in, W_hid, b


class LSTMLayer(_GatedBase):
    """Long short-term memory, with optional peephole connections.

    Per step, with ``σ`` the gates' nonlinearities (sigmoid by default) and ``∘`` the
    elementwise product::

        i_t = σ(x_t W_xi + h_{t-1} W_hi + c_{t-1} ∘ w_ci + b_i)
        f_t = σ(x_t W_xf + h_{t-1} W_hf + c_{t-1} ∘ w_cf + b_f)
        c_t = f_t ∘ c_{t-1} + i_t ∘ tanh(x_t W_xc + h_{t-1} W_hc + b_c)
        o_t = σ(x_t W_xo + h_{t-1} W_ho + c_t ∘ w_co + b_o)
        h_t = o_t ∘ nonlinearity(c_t)

    (the ``w_c*`` terms only with ``peepholes``); the output is ``h``.

    Parameters
    ----------
    incoming
        Layer (or shape) giving the sequences, ``(batch, time, features...)``.
    num_units
        Number of hidden units.
    ingate, forgetgate, cell, outgate
        :class:`Gate` objects with the parameters of each gate (``cell`` is the cell
        input, whose ``W_cell`` is not used).
    nonlinearity
        Applied to the cell before the output gate; None means the identity.
    cell_init, hid_init
        Initial cell and hidden states: initializer/array/shared variable of shape
        ``(1, num_units)``, or a layer giving ``(batch, num_units)``.
    backwards, learn_init, gradient_steps, unroll_scan, precompute_input, mask_input, \
only_return_final
        As for :class:`CustomRecurrentLayer` (``learn_init`` applies to both states).
    peepholes
        Add the cell-to-gate connections ``w_ci``, ``w_cf``, ``w_co``.
    grad_clipping
        If nonzero, clip the gradient reaching the gates' pre-activations.
    **kwargs
        ``name``.

    Examples
    --------
    >>> l_in = InputLayer((None, 5, 4))
    >>> l_mask = InputLayer((None, 5))
    >>> LSTMLayer(l_in, 6, mask_input=l_mask).output_shape
    (None, 5, 6)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_units: int,
        ingate: Gate = Gate(),  # noqa: B008 (a Gate only holds initializers)
        forgetgate: Gate = Gate(),  # noqa: B008
        cell: Gate = Gate(W_cell=None, nonlinearity=nonlinearities.tanh),  # noqa: B008
        outgate: Gate = Gate(),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.tanh,
        cell_init: StateSpec = init.Constant(0.0),  # noqa: B008
        hid_init: StateSpec = init.Constant(0.0),  # noqa: B008
        backwards: bool = False,
        learn_init: bool = False,
        peepholes: bool = True,
        gradient_steps: int = -1,
        grad_clipping: float = 0,
        unroll_scan: bool = False,
        precompute_input: bool = True,
        mask_input: Layer | Shape | None = None,
        only_return_final: bool = False,
        **kwargs,
    ):
        super().__init__(
            incoming,
            num_units,
            mask_input,
            {"hid_init": hid_init, "cell_init": cell_init},
            backwards=backwards,
            learn_init=learn_init,
            gradient_steps=gradient_steps,
            grad_clipping=grad_clipping,
            unroll_scan=unroll_scan,
            precompute_input=precompute_input,
            only_return_final=only_return_final,
            **kwargs,
        )
        self.nonlinearity = as_nonlinearity(nonlinearity)
        self.peepholes = peepholes
        (self.W_in_to_ingate, self.W_hid_to_ingate, self.b_ingate, self.nonlinearity_ingate) = (
            self._add_gate(ingate, "ingate")
        )
        (
            self.W_in_to_forgetgate,
            self.W_hid_to_forgetgate,
            self.b_forgetgate,
            self.nonlinearity_forgetgate,
        ) = self._add_gate(forgetgate, "forgetgate")
        (self.W_in_to_cell, self.W_hid_to_cell, self.b_cell, self.nonlinearity_cell) = (
            self._add_gate(cell, "cell")
        )
        (
            self.W_in_to_outgate,
            self.W_hid_to_outgate,
            self.b_outgate,
            self.nonlinearity_outgate,
        ) = self._add_gate(outgate, "outgate")
        if peepholes:
            for gate, name in (
                (ingate, "ingate"),
                (forgetgate, "forgetgate"),
                (outgate, "outgate"),
            ):
                if not hasattr(gate, "W_cell"):
                    raise ValueError(f"peepholes=True needs a W_cell in {name}")
                weight = self.add_param(gate.W_cell, (num_units,), name=f"W_cell_to_{name}")
                setattr(self, f"W_cell_to_{name}", weight)
        self.cell_init = self._add_initial_state(cell_init, (1, num_units), "cell_init")
        self.hid_init = self._add_initial_state(hid_init, (1, num_units), "hid_init")

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """The hidden states over time (see the class description).

        Parameters
        ----------
        inputs
            The sequences, then the mask, ``hid_init`` and ``cell_init`` values when
            those are layers.
        **kwargs
            Unused.

        Returns
        -------
        TensorVariable
            ``(batch, time, num_units)`` or ``(batch, num_units)``.
        """
        sequence, W_in, W_hid, b = self._stack_gates(
            inputs[0], ("ingate", "forgetgate", "cell", "outgate")
        )
        peep = (
            [self.W_cell_to_ingate, self.W_cell_to_forgetgate, self.W_cell_to_outgate]
            if self.peepholes
            else []
        )
        non_sequences = [W_hid, *peep]
        if not self.precompute_input:
            non_sequences += [W_in, b]

        def step(input_n, cell_previous, hid_previous, *_):
            if not self.precompute_input:
                input_n = pt.dot(input_n, W_in) + b
            gates = self._clip(input_n + pt.dot(hid_previous, W_hid))
            ingate, forgetgate, cell_input, outgate = (self._slice(gates, k) for k in range(4))
            if self.peepholes:
                ingate = ingate + cell_previous * peep[0]
                forgetgate = forgetgate + cell_previous * peep[1]
            ingate = self.nonlinearity_ingate(ingate)
            forgetgate = self.nonlinearity_forgetgate(forgetgate)
            cell = forgetgate * cell_previous + ingate * self.nonlinearity_cell(cell_input)
            if self.peepholes:
                outgate = outgate + cell * peep[2]
            hid = self.nonlinearity_outgate(outgate) * self.nonlinearity(cell)
            return [cell, hid]

        return self._run(step, inputs, sequence, ["cell_init", "hid_init"], non_sequences)


class GRULayer(_GatedBase):
    """Gated recurrent unit (Cho et al., 2014).

    Per step, with ``σ`` the gates' nonlinearities (sigmoid by default)::

        r_t = σ(x_t W_xr + h_{t-1} W_hr + b_r)
        u_t = σ(x_t W_xu + h_{t-1} W_hu + b_u)
        c_t = tanh(x_t W_xc + b_c + r_t ∘ (h_{t-1} W_hc))
        h_t = (1 - u_t) ∘ h_{t-1} + u_t ∘ c_t

    Parameters
    ----------
    incoming
        Layer (or shape) giving the sequences, ``(batch, time, features...)``.
    num_units
        Number of hidden units.
    resetgate, updategate, hidden_update
        :class:`Gate` objects with the parameters of ``r``, ``u`` and ``c`` (their
        ``W_cell`` is not used).
    hid_init, backwards, learn_init, gradient_steps, unroll_scan, precompute_input, \
mask_input, only_return_final
        As for :class:`CustomRecurrentLayer`.
    grad_clipping
        If nonzero, clip the gradient reaching the step's input and hidden products
        and the hidden update's pre-activation.
    **kwargs
        ``name``.

    Examples
    --------
    >>> l_in = InputLayer((None, 5, 4))
    >>> GRULayer(l_in, 6, backwards=True, only_return_final=True).output_shape
    (None, 6)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_units: int,
        resetgate: Gate = Gate(W_cell=None),  # noqa: B008 (a Gate only holds initializers)
        updategate: Gate = Gate(W_cell=None),  # noqa: B008
        hidden_update: Gate = Gate(W_cell=None, nonlinearity=nonlinearities.tanh),  # noqa: B008
        hid_init: StateSpec = init.Constant(0.0),  # noqa: B008
        backwards: bool = False,
        learn_init: bool = False,
        gradient_steps: int = -1,
        grad_clipping: float = 0,
        unroll_scan: bool = False,
        precompute_input: bool = True,
        mask_input: Layer | Shape | None = None,
        only_return_final: bool = False,
        **kwargs,
    ):
        super().__init__(
            incoming,
            num_units,
            mask_input,
            {"hid_init": hid_init},
            backwards=backwards,
            learn_init=learn_init,
            gradient_steps=gradient_steps,
            grad_clipping=grad_clipping,
            unroll_scan=unroll_scan,
            precompute_input=precompute_input,
            only_return_final=only_return_final,
            **kwargs,
        )
        # Lasagne's creation order (update gate first), so parameter lists match.
        (
            self.W_in_to_updategate,
            self.W_hid_to_updategate,
            self.b_updategate,
            self.nonlinearity_updategate,
        ) = self._add_gate(updategate, "updategate")
        (
            self.W_in_to_resetgate,
            self.W_hid_to_resetgate,
            self.b_resetgate,
            self.nonlinearity_resetgate,
        ) = self._add_gate(resetgate, "resetgate")
        (
            self.W_in_to_hidden_update,
            self.W_hid_to_hidden_update,
            self.b_hidden_update,
            self.nonlinearity_hid,
        ) = self._add_gate(hidden_update, "hidden_update")
        self.hid_init = self._add_initial_state(hid_init, (1, num_units), "hid_init")

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """The hidden states over time (see the class description).

        Parameters
        ----------
        inputs
            The sequences, then the mask and ``hid_init`` values when those are layers.
        **kwargs
            Unused.

        Returns
        -------
        TensorVariable
            ``(batch, time, num_units)`` or ``(batch, num_units)``.
        """
        sequence, W_in, W_hid, b = self._stack_gates(
            inputs[0], ("resetgate", "updategate", "hidden_update")
        )
        non_sequences = [W_hid] if self.precompute_input else [W_hid, W_in, b]

        def step(input_n, hid_previous, *_):
            hid_input = self._clip(pt.dot(hid_previous, W_hid))
            input_n = self._clip(input_n)
            if not self.precompute_input:
                input_n = pt.dot(input_n, W_in) + b
            resetgate = self.nonlinearity_resetgate(
                self._slice(hid_input, 0) + self._slice(input_n, 0)
            )
            updategate = self.nonlinearity_updategate(
                self._slice(hid_input, 1) + self._slice(input_n, 1)
            )
            hidden_update = self._slice(input_n, 2) + resetgate * self._slice(hid_input, 2)
            hidden_update = self.nonlinearity_hid(self._clip(hidden_update))
            return [(1 - updategate) * hid_previous + updategate * hidden_update]

        return self._run(step, inputs, sequence, ["hid_init"], non_sequences)
