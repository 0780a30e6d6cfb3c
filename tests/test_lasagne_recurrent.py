"""Tests of synkhronos.extensions.lasagne.layers.recurrent against NumPy float64 loops.

Each layer's output is compared with a step-by-step NumPy recurrence written here from
the equations (not from the layer's code), with variable-length masks, backwards runs,
initial states given as layers, and the unrolled loop against ``scan``.  Gradients are
compared with central finite differences.  Graphs compile with ``FAST_COMPILE`` (the
Python linker): PyTensor's default Numba mode takes 30-60 s per scan graph.
"""

import numpy as np
import pytensor
import pytest

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.dense import DenseLayer
from synkhronos.extensions.lasagne.layers.helper import get_all_layers, get_output
from synkhronos.extensions.lasagne.layers.input import InputLayer
from synkhronos.extensions.lasagne.layers.merge import ElemwiseSumLayer
from synkhronos.extensions.lasagne.layers.recurrent import (
    CustomRecurrentLayer,
    Gate,
    GRULayer,
    LSTMLayer,
    RecurrentLayer,
)

MODE = "FAST_COMPILE"
BATCH, STEPS, FEATURES, UNITS = 3, 5, 4, 6
LENGTHS = [5, 3, 1]  # one full sequence, two padded ones
KINDS = ["rnn", "lstm", "gru"]


@pytest.fixture(autouse=True)
def float64():
    with pytensor.config.change_flags(floatX="float64"):
        yield


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def make_layer(kind, l_in, seed=0, units=UNITS, **options):
    """A layer of ``kind`` with large random parameters (so that every term matters),
    and a NumPy step ``cell(x_t, states) -> states`` reading the same parameter values."""
    init.set_rng(seed)
    big = init.Normal(0.5)
    if kind == "rnn":
        layer = RecurrentLayer(
            l_in,
            units,
            W_in_to_hid=big,
            W_hid_to_hid=big,
            b=big,
            nonlinearity=nonlinearities.tanh,
            hid_init=options.pop("hid_init", big),
            **options,
        )

        def cell(x, states):
            (h,) = states
            v = values(layer, "W_in_to_hid", "W_hid_to_hid", "b")
            return (np.tanh(x @ v[0] + h @ v[1] + v[2]),)

        return layer, cell
    gate = Gate(W_in=big, W_hid=big, W_cell=big, b=big)
    tanh_gate = Gate(W_in=big, W_hid=big, W_cell=None, b=big, nonlinearity=nonlinearities.tanh)
    states = ("cell_init", "hid_init") if kind == "lstm" else ("hid_init",)
    inits = {name: options.pop(name, big) for name in states}
    if kind == "lstm":
        layer = LSTMLayer(
            l_in,
            units,
            ingate=gate,
            forgetgate=gate,
            cell=tanh_gate,
            outgate=gate,
            **inits,
            **options,
        )

        def cell(x, states):
            c, h = states

            def pre(g):
                w_in, w_hid, b = values(layer, f"W_in_to_{g}", f"W_hid_to_{g}", f"b_{g}")
                return x @ w_in + h @ w_hid + b

            peep = layer.peepholes
            wci, wcf, wco = (
                values(layer, "W_cell_to_ingate", "W_cell_to_forgetgate", "W_cell_to_outgate")
                if peep
                else (0, 0, 0)
            )
            i = sigmoid(pre("ingate") + c * wci)
            f = sigmoid(pre("forgetgate") + c * wcf)
            c_new = f * c + i * np.tanh(pre("cell"))
            o = sigmoid(pre("outgate") + c_new * wco)
            return c_new, o * np.tanh(c_new)

        return layer, cell
    layer = GRULayer(
        l_in, units, resetgate=gate, updategate=gate, hidden_update=tanh_gate, **inits, **options
    )

    def cell(x, states):
        (h,) = states
        xr, hr, br, xu, hu, bu, xc, hc, bc = values(
            layer,
            *(
                f"{w}_{g}"
                for g in ("resetgate", "updategate", "hidden_update")
                for w in ("W_in_to", "W_hid_to", "b")
            ),
        )
        r = sigmoid(x @ xr + h @ hr + br)
        u = sigmoid(x @ xu + h @ hu + bu)
        c = np.tanh(x @ xc + bc + r * (h @ hc))
        return ((1 - u) * h + u * c,)

    return layer, cell


def values(layer, *names):
    return [getattr(layer, n).get_value() for n in names]


def initial_states(layer, batch, given=None):
    """The reference's initial states: given arrays, else the layer's parameters tiled."""
    names = ["cell_init", "hid_init"] if isinstance(layer, LSTMLayer) else ["hid_init"]
    given = given or {}
    return tuple(
        given[n] if n in given else np.repeat(getattr(layer, n).get_value(), batch, axis=0)
        for n in names
    )


def reference(cell, x, mask, states, backwards=False):
    """NumPy recurrence: hidden states in time order, and the state after the last step
    run.  Masked steps keep the previous states."""
    out = np.zeros((x.shape[0], x.shape[1], states[-1].shape[1]))
    order = range(x.shape[1] - 1, -1, -1) if backwards else range(x.shape[1])
    for t in order:
        new = cell(x[:, t].reshape(x.shape[0], -1), states)
        keep = mask[:, t, None] > 0
        states = tuple(np.where(keep, n, s) for n, s in zip(new, states, strict=True))
        out[:, t] = states[-1]
    return out, states[-1]


def evaluate(outputs, feed):
    """Values of ``outputs`` (a list) for ``feed``, a dict of InputLayer -> array."""
    layers = list(feed)
    fn = pytensor.function([lay.input_var for lay in layers], outputs, mode=MODE)
    return fn(*(feed[lay] for lay in layers))


def padded_mask(lengths=LENGTHS, steps=STEPS):
    return (np.arange(steps)[None, :] < np.array(lengths)[:, None]).astype("float64")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"masked": True, "backwards": True},
        {"masked": True, "only_return_final": True},
        {"precompute_input": False, "backwards": True, "only_return_final": True},
    ],
    ids=["plain", "mask-backwards", "mask-final", "no-precompute-backwards-final"],
)
def test_forward_matches_numpy_loop(kind, options, rng):
    options = dict(options)
    l_in = InputLayer((None, STEPS, FEATURES))
    x = rng.normal(size=(BATCH, STEPS, FEATURES))
    feed = {l_in: x}
    mask = np.ones((BATCH, STEPS))
    if options.pop("masked", False):
        l_mask = InputLayer((None, STEPS))
        options["mask_input"] = l_mask
        mask = feed[l_mask] = padded_mask()
    layer, cell = make_layer(kind, l_in, **options)
    (got,) = evaluate([get_output(layer)], feed)
    seq, final = reference(cell, x, mask, initial_states(layer, BATCH), layer.backwards)
    expected = final if layer.only_return_final else seq
    assert got.shape == expected.shape
    assert layer.output_shape == (None, *expected.shape[1:])
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_mask_gives_each_sequence_its_own_final_state(rng):
    """A padded sequence ends in the state its unpadded self reaches."""
    l_in, l_mask = InputLayer((None, STEPS, FEATURES)), InputLayer((None, STEPS))
    layer, _ = make_layer("lstm", l_in, mask_input=l_mask, only_return_final=True)
    x = rng.normal(size=(BATCH, STEPS, FEATURES))
    (padded,) = evaluate([get_output(layer)], {l_in: x, l_mask: padded_mask()})
    for row, length in enumerate(LENGTHS):
        short_in = InputLayer((None, length, FEATURES))
        short = LSTMLayer(short_in, UNITS, only_return_final=True, **shared_lstm_params(layer))
        (alone,) = evaluate([get_output(short)], {short_in: x[row : row + 1, :length]})
        np.testing.assert_allclose(padded[row], alone[0], rtol=1e-10)


def shared_lstm_params(layer):
    """Keyword arguments making a new LSTMLayer use ``layer``'s parameters."""
    gates = {}
    for g in ("ingate", "forgetgate", "cell", "outgate"):
        parts = dict(
            W_in=getattr(layer, f"W_in_to_{g}"),
            W_hid=getattr(layer, f"W_hid_to_{g}"),
            b=getattr(layer, f"b_{g}"),
            W_cell=getattr(layer, f"W_cell_to_{g}", None),
        )
        if g == "cell":
            parts["nonlinearity"] = nonlinearities.tanh
        gates[g] = Gate(**parts)
    return {**gates, "hid_init": layer.hid_init, "cell_init": layer.cell_init}


def test_lstm_without_peepholes_and_4d_input(rng):
    l_in = InputLayer((None, STEPS, 2, 2))
    layer, cell = make_layer("lstm", l_in, peepholes=False)
    assert not hasattr(layer, "W_cell_to_ingate")
    x = rng.normal(size=(BATCH, STEPS, 2, 2))
    (got,) = evaluate([get_output(layer)], {l_in: x})
    expected, _ = reference(cell, x, np.ones((BATCH, STEPS)), initial_states(layer, BATCH))
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_initial_states_from_layers(kind, rng):
    l_in = InputLayer((None, STEPS, FEATURES))
    state_layers = {"hid_init": InputLayer((None, UNITS))}
    if kind == "lstm":
        state_layers["cell_init"] = InputLayer((None, UNITS))
    layer, cell = make_layer(kind, l_in, **state_layers)
    assert all(getattr(layer, n) is lay for n, lay in state_layers.items())
    assert {p.name for p in layer.get_params()}.isdisjoint({"hid_init", "cell_init"})
    assert set(state_layers.values()) <= set(get_all_layers(layer))
    x = rng.normal(size=(BATCH, STEPS, FEATURES))
    given = {n: rng.normal(size=(BATCH, UNITS)) for n in state_layers}
    (got,) = evaluate(
        [get_output(layer)], {l_in: x, **{state_layers[n]: v for n, v in given.items()}}
    )
    expected, _ = reference(cell, x, np.ones((BATCH, STEPS)), initial_states(layer, BATCH, given))
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_unroll_scan_equals_scan(kind, rng):
    l_in, l_mask = InputLayer((None, STEPS, FEATURES)), InputLayer((None, STEPS))
    common = {"mask_input": l_mask, "backwards": True, "learn_init": True}
    scanned, _ = make_layer(kind, l_in, seed=1, **common)
    unrolled, _ = make_layer(kind, l_in, seed=1, unroll_scan=True, **common)
    outs = [get_output(scanned), get_output(unrolled)]
    costs = [(o * np.linspace(-1, 1, UNITS)).sum() for o in outs]
    grads = [
        pytensor.grad(c, lay.get_params(trainable=True))
        for c, lay in zip(costs, (scanned, unrolled), strict=True)
    ]
    n = len(grads[0])
    got = evaluate(
        outs + grads[0] + grads[1],
        {l_in: rng.normal(size=(BATCH, STEPS, FEATURES)), l_mask: padded_mask()},
    )
    np.testing.assert_allclose(got[0], got[1], rtol=1e-10)
    for g_scan, g_unrolled in zip(got[2 : 2 + n], got[2 + n :], strict=True):
        np.testing.assert_allclose(g_scan, g_unrolled, rtol=1e-8, atol=1e-12)


def test_learn_init_and_parameter_lists():
    l_in = InputLayer((None, STEPS, FEATURES))
    learnt = LSTMLayer(l_in, UNITS, learn_init=True)
    fixed = LSTMLayer(l_in, UNITS)
    trainable = learnt.get_params(trainable=True)
    assert learnt.hid_init in trainable and learnt.cell_init in trainable
    assert fixed.hid_init not in fixed.get_params(trainable=True)
    assert fixed.hid_init in fixed.get_params()
    assert learnt.hid_init not in learnt.get_params(regularizable=True)
    assert len(learnt.get_params()) == 4 * 3 + 3 + 2  # gates, peepholes, initial states
    gru = GRULayer(l_in, UNITS, learn_init=True)
    assert [p.name for p in gru.get_params()][:3] == [
        "W_in_to_updategate",
        "W_hid_to_updategate",
        "b_updategate",
    ]
    assert gru.hid_init in gru.get_params(trainable=True)
    rnn = RecurrentLayer(l_in, UNITS, learn_init=True, name="rnn")
    assert [p.name for p in rnn.get_params(trainable=True)] == [
        "rnn.hid_init",
        "rnn.input_to_hidden.W",
        "rnn.input_to_hidden.b",
        "rnn.hidden_to_hidden.W",
    ]
    assert rnn.W_in_to_hid.get_value().shape == (FEATURES, UNITS)
    assert rnn.get_params(regularizable=True) == [rnn.W_in_to_hid, rnn.W_hid_to_hid]


@pytest.mark.parametrize("precompute_input", [True, False])
def test_custom_recurrent_layer(precompute_input, rng):
    """Arbitrary sub-networks: ``h_t = relu(x_t W + b + tanh(h_{t-1} U))``."""
    l_in = InputLayer((None, STEPS, FEATURES))
    in_to_hid = DenseLayer(
        InputLayer((None, FEATURES)),
        UNITS,
        W=init.Normal(0.5),
        b=init.Normal(0.5),
        nonlinearity=None,
    )
    hid_to_hid = DenseLayer(
        InputLayer((None, UNITS)),
        UNITS,
        W=init.Normal(0.5),
        b=None,
        nonlinearity=nonlinearities.tanh,
    )
    layer = CustomRecurrentLayer(l_in, in_to_hid, hid_to_hid, precompute_input=precompute_input)
    assert layer.get_params() == [layer.hid_init, in_to_hid.W, in_to_hid.b, hid_to_hid.W]
    x = rng.normal(size=(BATCH, STEPS, FEATURES))
    (got,) = evaluate([get_output(layer)], {l_in: x})
    W, b, U = in_to_hid.W.get_value(), in_to_hid.b.get_value(), hid_to_hid.W.get_value()

    def cell(x_t, states):
        return (np.maximum(x_t @ W + b + np.tanh(states[0] @ U), 0),)

    expected, _ = reference(cell, x, np.ones((BATCH, STEPS)), (np.zeros((BATCH, UNITS)),))
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_finite_differences(kind, rng):
    l_in, l_mask = InputLayer((None, 3, 2)), InputLayer((None, 3))
    layer, _ = make_layer(kind, l_in, units=3, mask_input=l_mask, learn_init=True)
    params = layer.get_params(trainable=True)
    out = get_output(layer)
    weights = rng.normal(size=(2, 3, 3))
    cost = (out * weights).sum()
    fn = pytensor.function(
        [l_in.input_var, l_mask.input_var], [cost, *pytensor.grad(cost, params)], mode=MODE
    )
    x, mask = rng.normal(size=(2, 3, 2)), padded_mask([3, 2], steps=3)
    _, *grads = fn(x, mask)
    eps = 1e-6
    for param, grad in zip(params, grads, strict=True):
        value = param.get_value()
        for index in np.ndindex(value.shape):
            shifted = []
            for sign in (1, -1):
                moved = value.copy()
                moved[index] += sign * eps
                param.set_value(moved)
                shifted.append(fn(x, mask)[0])
            param.set_value(value)
            numeric = (shifted[0] - shifted[1]) / (2 * eps)
            assert grad[index] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (param.name, index)


@pytest.mark.parametrize("kind", KINDS)
def test_grad_clipping_changes_only_the_gradient(kind, rng):
    """A small bound changes the gradient, a huge one does not; the output never changes."""
    l_in = InputLayer((None, STEPS, FEATURES))
    layers = [make_layer(kind, l_in, grad_clipping=c)[0] for c in (0, 1e-3, 1e6)]
    outs = [get_output(lay) for lay in layers]
    weights = rng.normal(size=(BATCH, STEPS, UNITS))
    grads = [
        pytensor.grad((o * weights).sum(), lay.get_params(trainable=True))
        for o, lay in zip(outs, layers, strict=True)
    ]
    n = len(grads[0])
    got = evaluate(outs + [g for gs in grads for g in gs], {l_in: rng.normal(size=(3, 5, 4))})
    (plain, clipped, loose), (g_plain, g_clipped, g_loose) = (
        got[:3],
        [got[3 + k * n : 3 + (k + 1) * n] for k in range(3)],
    )
    np.testing.assert_allclose(clipped, plain, rtol=1e-12)
    np.testing.assert_allclose(loose, plain, rtol=1e-12)
    for a, b in zip(g_plain, g_loose, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    differ = [not np.allclose(a, b) for a, b in zip(g_plain, g_clipped, strict=True)]
    assert all(differ)


def test_gradient_steps_truncates_backpropagation(rng):
    """With ``gradient_steps=1`` the final state's gradient sees only the last step:
    ``d sum(w * h_T) / dU = h_{T-1}^T (w * (1 - h_T**2))``, for
    ``h_T = tanh(x_T W + h_{T-1} U + b)``."""
    l_in = InputLayer((None, STEPS, FEATURES))
    full, _ = make_layer("rnn", l_in)
    truncated, _ = make_layer("rnn", l_in, gradient_steps=1)
    outs = [get_output(full), get_output(truncated)]
    w = rng.normal(size=(BATCH, UNITS))
    grads = [
        pytensor.grad((o[:, -1] * w).sum(), lay.W_hid_to_hid)
        for o, lay in zip(outs, (full, truncated), strict=True)
    ]
    hid, _, g_full, g_truncated = evaluate(outs + grads, {l_in: rng.normal(size=(3, 5, 4))})
    expected = hid[:, -2].T @ (w * (1 - hid[:, -1] ** 2))
    np.testing.assert_allclose(g_truncated, expected, rtol=1e-10)
    assert not np.allclose(g_full, expected)


def test_invalid_configurations():
    l_in = InputLayer((None, STEPS, FEATURES))
    with pytest.raises(ValueError, match="gradient_steps"):
        GRULayer(l_in, UNITS, unroll_scan=True, gradient_steps=2)
    with pytest.raises(ValueError, match="sequence length"):
        LSTMLayer(InputLayer((None, None, FEATURES)), UNITS, unroll_scan=True)
    with pytest.raises(ValueError, match="W_cell"):
        LSTMLayer(l_in, UNITS, ingate=Gate(W_cell=None))
    in_to_hid = DenseLayer(InputLayer((None, FEATURES)), UNITS)
    with pytest.raises(ValueError, match="differ"):
        CustomRecurrentLayer(l_in, in_to_hid, DenseLayer(InputLayer((None, UNITS)), UNITS + 1))
    with pytest.raises(ValueError, match="exactly one InputLayer"):
        two_inputs = ElemwiseSumLayer([in_to_hid, InputLayer((None, UNITS))])
        CustomRecurrentLayer(l_in, two_inputs, DenseLayer(InputLayer((None, UNITS)), UNITS))


def test_one_unit_and_a_static_batch(rng):
    """A single unit (gate slices of width 1) with every input size known in advance."""
    l_in = InputLayer((BATCH, STEPS, FEATURES))
    made = [make_layer(kind, l_in, units=1) for kind in KINDS]
    x = rng.normal(size=(BATCH, STEPS, FEATURES))
    got = evaluate([get_output(layer) for layer, _ in made], {l_in: x})
    for (layer, cell), value in zip(made, got, strict=True):
        expected, _ = reference(cell, x, np.ones((BATCH, STEPS)), initial_states(layer, BATCH))
        assert layer.output_shape == (BATCH, STEPS, 1)
        np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-12)
