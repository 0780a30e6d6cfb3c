"""``from synkhronos import theano``: Theano's names at their Theano paths, each checked
against Theano's documented meaning with NumPy references (one process, few graphs).

Graphs compile with the Python linker (``FAST_COMPILE``), which runs the same kernels.
"""

import importlib
import itertools
import logging
import math
from pathlib import Path

import numpy as np
import pytensor
import pytest

from synkhronos import theano

T = theano.tensor
MODE = "FAST_COMPILE"
floatX = theano.config.floatX


def function(inputs, outputs):
    return theano.function(inputs, outputs, mode=MODE)


# ------------------------------------------------------------------ NumPy references


def np_correlate(x, w, stride, pad, dilation, groups=1):
    """Cross-correlation over the trailing axes of ``x`` (N, C, *spatial) with ``w``
    (O, C / groups, *kernel); ``pad`` holds (before, after) per axis."""
    n = w.ndim - 2
    x = np.pad(x, [(0, 0), (0, 0), *pad])
    out_len = [
        (x.shape[2 + a] - dilation[a] * (w.shape[2 + a] - 1) - 1) // stride[a] + 1 for a in range(n)
    ]
    out = np.zeros((x.shape[0], w.shape[0], *out_len))
    per_group = w.shape[0] // groups
    for f in range(w.shape[0]):
        chans = slice(f // per_group * w.shape[1], (f // per_group + 1) * w.shape[1])
        for taps in itertools.product(*[range(k) for k in w.shape[2:]]):
            window = tuple(
                slice(t * d, t * d + (o - 1) * s + 1, s)
                for t, d, o, s in zip(taps, dilation, out_len, stride, strict=True)
            )
            out[:, f] += np.einsum(
                "nc...,c->n...", x[(slice(None), chans, *window)], w[(f, slice(None), *taps)]
            )
    return out


def np_pool(x, ws, stride, pad, ignore_border, mode):
    """Theano's pooling of the trailing ``len(ws)`` axes, window by window."""
    n = len(ws)
    lengths = x.shape[-n:]

    def n_out(length, w, s, p):
        if ignore_border:
            return (length + 2 * p - w) // s + 1
        return (length - 1) // s + 1 if s >= w else max(0, (length - 1 - w + s) // s) + 1

    counts = [n_out(*a) for a in zip(lengths, ws, stride, pad, strict=True)]
    out = np.zeros((*x.shape[:-n], *counts))
    for pos in itertools.product(*[range(c) for c in counts]):
        starts = [o * s - p for o, s, p in zip(pos, stride, pad, strict=True)]
        inside = tuple(
            slice(max(b, 0), min(b + w, length))
            for b, w, length in zip(starts, ws, lengths, strict=True)
        )
        region = x[(Ellipsis, *inside)]
        flat = region.reshape(*region.shape[:-n], -1)
        if mode == "max":
            value = flat.max(axis=-1)
        elif mode == "sum":
            value = flat.sum(axis=-1)
        elif mode == "average_exc_pad":
            value = flat.mean(axis=-1)
        else:  # the window clipped to the padded input
            area = math.prod(
                min(b + w, length + p) - max(b, -p)
                for b, w, length, p in zip(starts, ws, lengths, pad, strict=True)
            )
            value = flat.sum(axis=-1) / area
        out[(Ellipsis, *pos)] = value
    return out


# ------------------------------------------------------------------ paths and names


def test_theano_paths_import():
    namespace = {}
    exec(
        "\n".join(
            [
                "from synkhronos import theano",
                "from synkhronos.theano import tensor as T",
                "import synkhronos.theano.tensor as T2",
                "from synkhronos.theano.tensor.nnet import conv2d, sigmoid",
                "from synkhronos.theano.tensor.nnet.abstract_conv import AbstractConv2d_gradInputs",
                "from synkhronos.theano.tensor.signal.pool import pool_2d",
                "from synkhronos.theano.tensor.signal import pool",
                "from synkhronos.theano.tensor.shared_randomstreams import RandomStreams",
                "from synkhronos.theano.tensor.extra_ops import to_one_hot",
                "from synkhronos.theano.tensor.basic import zeros_like",
                "from synkhronos.theano.sandbox.rng_mrg import MRG_RandomStreams",
                "from synkhronos.theano.ifelse import ifelse",
                "from synkhronos.theano.printing import pprint, debugprint",
                "from synkhronos.theano.gradient import grad_clip",
                "from synkhronos.theano.compile import SharedVariable",
                "from synkhronos.theano.gof.graph import inputs",
                "from synkhronos.theano.gpuarray.dnn import dnn_present",
            ]
        ),
        namespace,
    )
    th = namespace["theano"]
    assert namespace["T"] is th.tensor is namespace["T2"]
    assert th.tensor.nnet.conv2d is namespace["conv2d"]
    assert th.tensor.signal.pool.pool_2d is namespace["pool_2d"]
    assert th.sandbox.rng_mrg.MRG_RandomStreams is namespace["MRG_RandomStreams"]
    assert th.ifelse.ifelse is namespace["ifelse"] is pytensor.ifelse
    assert th.shared is pytensor.shared  # (th.function: its own, below)
    assert th.scan is pytensor.scan and th.config is pytensor.config
    assert th.gof.Variable is th.Variable is T.Variable
    for name in (
        "matrix",
        "tensor4",
        "ivector",
        "grad",
        "mean",
        "argmax",
        "eq",
        "switch",
        "set_subtensor",
        "shape_padaxis",
        "concatenate",
        "TensorType",
    ):
        assert getattr(T, name) is getattr(pytensor.tensor, name)


# Every theano name that the original Synkhronos' programs and Lasagne's source use (read
# from their source), less Lasagne's fallbacks for Theano before 1.0 (theano.sandbox.cuda,
# theano.sandbox.gpuarray), which Theano 1.0 no longer had either.
USED_NAMES = """
Variable clone compile compile.SharedVariable config config.floatX function gof.Variable
gof.graph.inputs gpuarray gpuarray.use gpuarray.pygpu_activated gpuarray.dnn.dnn_present
grad gradient gradient.grad_clip sandbox sandbox.rng_mrg.MRG_RandomStreams scan shared tensor
tensor.TensorType tensor.TensorVariable tensor.Variable tensor.abs_ tensor.add
tensor.addbroadcast tensor.alloc tensor.any tensor.arange tensor.argmax tensor.argsort
tensor.as_tensor_variable tensor.batched_dot tensor.cast tensor.ceil tensor.clip
tensor.concatenate tensor.constant tensor.dot tensor.eq tensor.expm1 tensor.extra_ops
tensor.extra_ops.repeat tensor.extra_ops.to_one_hot tensor.eye tensor.flatten tensor.floor
tensor.ftensor4 tensor.ge tensor.imatrix tensor.inc_subtensor tensor.inv tensor.isnan
tensor.ivector tensor.log tensor.matrix tensor.max tensor.mean tensor.min tensor.minimum
tensor.mod tensor.neq tensor.nnet tensor.nnet.abstract_conv
tensor.nnet.abstract_conv.AbstractConv2d_gradInputs
tensor.nnet.abstract_conv.AbstractConv2d_gradWeights
tensor.nnet.abstract_conv.AbstractConv3d_gradInputs tensor.nnet.binary_crossentropy
tensor.nnet.categorical_crossentropy tensor.nnet.conv2d tensor.nnet.conv3d tensor.nnet.relu
tensor.nnet.sigmoid tensor.nnet.softmax tensor.nnet.softplus tensor.ones tensor.ones_like
tensor.patternbroadcast tensor.repeat tensor.reshape tensor.set_subtensor
tensor.shape_padaxis tensor.shape_padleft tensor.shape_padright tensor.signal
tensor.signal.pool tensor.signal.pool.pool_2d tensor.signal.pool.pool_3d tensor.sqr
tensor.sqrt tensor.square tensor.stack tensor.sum tensor.switch tensor.tanh tensor.tensor4
tensor.tensordot tensor.tile tensor.zeros
""".split()


def test_names_used_by_the_original_programs_and_lasagne_exist():
    missing = []
    for name in USED_NAMES:
        obj = theano
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            missing.append(name)
    assert not missing
    with pytest.raises(ImportError):  # removed in Theano 1.0, as here
        importlib.import_module("synkhronos.theano.sandbox.cuda")


def test_the_package_logs_and_never_prints():
    root = Path(theano.__file__).parent
    for path in root.rglob("*.py"):
        assert "print(" not in path.read_text(), path


def test_gpuarray_use_logs_and_does_nothing(caplog, capsys):
    with caplog.at_level(logging.INFO, logger="synkhronos.theano.gpuarray"):
        theano.gpuarray.use("cuda0")
    assert "synk.fork" in caplog.text
    assert capsys.readouterr() == ("", "")
    assert not theano.gpuarray.pygpu_activated
    assert not theano.gpuarray.dnn.dnn_present() and not theano.gpuarray.dnn.dnn_available()


def test_renamed_tensor_names(rng):
    x, v = T.matrix("x"), T.vector("v")
    t3 = T.tensor3("t3")
    row = T.addbroadcast(T.matrix("r"), 0)
    col = T.patternbroadcast(T.matrix("c"), (False, True))
    assert row.type.shape == (1, None) and col.type.shape == (None, 1)
    assert T.TensorType(floatX, (False, True))("m").type.shape == (None, 1)
    outs = [
        T.abs_(x),
        T.inv(x),
        T.stack(v, v * 2),
        T.stack([v, v * 3], axis=1),
        T.flatten(t3, outdim=2),
        T.flatten(t3),
        T.tile(v, (2,), ndim=2),
        T.tile(x, (1, 2)),
        T.extra_ops.to_one_hot(T.cast(v, "int64"), 4),
    ]
    f = function([x, v, t3], outs)
    xv, vv = rng.normal(size=(2, 3)), np.array([0.0, 3.0, 1.0])
    tv = rng.normal(size=(2, 3, 4))
    got = f(xv, vv, tv)
    want = [
        abs(xv),
        1 / xv,
        np.stack([vv, vv * 2]),
        np.stack([vv, vv * 3], axis=1),
        tv.reshape(2, 12),
        tv.ravel(),
        np.tile(vv, (1, 2)),
        np.tile(xv, (1, 2)),
        np.eye(4)[[0, 3, 1]],
    ]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_clone_and_graph_inputs():
    w = theano.shared(np.ones(2), name="w")
    x = T.vector("x")
    y = (w * x).sum()
    alias = theano.clone(w, share_inputs=False)
    assert alias is not w
    w.set_value(np.arange(2.0))
    np.testing.assert_array_equal(alias.get_value(), [0.0, 1.0])  # same storage
    z = theano.clone(y, replace={x: 2 * x})
    assert float(function([x], z)(np.ones(2))) == 2.0
    a, b, c = T.scalars("a", "b", "c")
    # Theano's order: left to right through each expression, the list's last one first.
    assert theano.gof.graph.inputs([a * b + c]) == [a, b, c]
    assert theano.gof.graph.inputs([c * b, a + b]) == [a, b, c]
    product = a * b
    assert theano.gof.graph.inputs([product + c], blockers=[product]) == [c]
    assert isinstance(y, theano.gof.Variable)
    assert theano.gof.graph.is_same_graph(y, (w * x).sum())


# ------------------------------------------------------------------ nnet


def test_activations_and_crossentropies(rng):
    x, t, p = T.matrix("x"), T.matrix("t"), T.matrix("p")
    labels = T.ivector("labels")
    outs = [
        T.nnet.sigmoid(x),
        T.nnet.relu(x),
        T.nnet.relu(x, 0.1),
        T.nnet.softplus(x),
        T.nnet.softmax(x),
        T.nnet.softmax(x[0]),
        T.nnet.categorical_crossentropy(p, t),
        T.nnet.categorical_crossentropy(p, labels),
        T.nnet.binary_crossentropy(p, t),
    ]
    f = function([x, t, p, labels], outs)
    xv = rng.normal(size=(3, 4))
    pv = rng.uniform(0.05, 0.95, size=(3, 4))
    tv = rng.uniform(size=(3, 4))
    lv = np.array([2, 0, 3], np.int32)
    e = np.exp(xv - xv.max(axis=1, keepdims=True))
    soft = e / e.sum(axis=1, keepdims=True)
    want = [
        1 / (1 + np.exp(-xv)),
        np.maximum(xv, 0),
        np.where(xv > 0, xv, 0.1 * xv),
        np.log1p(np.exp(xv)),
        soft,
        soft[:1],
        -(tv * np.log(pv)).sum(axis=1),
        -np.log(pv[np.arange(3), lv]),
        -(tv * np.log(pv) + (1 - tv) * np.log(1 - pv)),
    ]
    for g, w in zip(f(xv, tv, pv, lv), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(T.nnet.relu(xv), np.maximum(xv, 0))  # NumPy in, NumPy out
    with pytest.raises(TypeError, match="rank mismatch"):
        T.nnet.categorical_crossentropy(p, T.tensor3())


def test_conv2d_flips_filters_with_theano_border_modes(rng):
    x = T.tensor4("x")
    w = theano.shared(rng.normal(size=(4, 2, 3, 2)), name="w")  # sizes known from the value
    wv, wg = w.get_value(), rng.normal(size=(4, 1, 2, 3))
    grouped = T.constant(wg)
    cases = [  # (filters, their value, kwargs, pad, stride, dilation, flip, groups)
        (w, wv, {}, [(0, 0)] * 2, (1, 1), (1, 1), True, 1),
        (
            w,
            wv,
            {"border_mode": "full", "filter_flip": False},
            [(2, 2), (1, 1)],
            (1, 1),
            (1, 1),
            False,
            1,
        ),
        (
            w,
            wv,
            {"border_mode": "half", "subsample": (2, 1), "filter_dilation": (2, 1)},
            [(2, 2), (1, 1)],
            (2, 1),
            (2, 1),
            True,
            1,
        ),
        (
            grouped,
            wg,
            {"border_mode": (1, 0), "num_groups": 2},
            [(1, 1), (0, 0)],
            (1, 1),
            (1, 1),
            True,
            2,
        ),
        (w, wv, {"border_mode": ((1, 0), (0, 2))}, [(1, 0), (0, 2)], (1, 1), (1, 1), True, 1),
    ]
    f = function([x], [T.nnet.conv2d(x, c[0], **c[2]) for c in cases])
    xv = rng.normal(size=(2, 2, 7, 6))
    for got, (_, value, _, pad, stride, dilation, flip, groups) in zip(f(xv), cases, strict=True):
        kernel = value[..., ::-1, ::-1] if flip else value
        np.testing.assert_allclose(
            got, np_correlate(xv, kernel, stride, pad, dilation, groups), rtol=1e-9, atol=1e-12
        )
    with pytest.raises(ValueError, match="filter_shape"):
        T.nnet.conv2d(x, T.tensor4(), border_mode="half")
    with pytest.raises(NotImplementedError):
        T.nnet.conv2d(x, w, unshared=True)


def test_conv3d(rng):
    x = T.tensor5("x")
    wv = rng.normal(size=(3, 2, 2, 3, 2))
    w = T.constant(wv)
    f = function(
        [x],
        [
            T.nnet.conv3d(x, w),
            T.nnet.conv3d(x, w, border_mode="half", subsample=(1, 2, 1), filter_flip=False),
        ],
    )
    xv = rng.normal(size=(2, 2, 4, 5, 3))
    valid, half = f(xv)
    np.testing.assert_allclose(
        valid,
        np_correlate(xv, wv[..., ::-1, ::-1, ::-1], (1, 1, 1), [(0, 0)] * 3, (1, 1, 1)),
        rtol=1e-9,
    )
    np.testing.assert_allclose(
        half, np_correlate(xv, wv, (1, 2, 1), [(1, 1), (1, 1), (1, 1)], (1, 1, 1)), rtol=1e-9
    )


@pytest.mark.parametrize("n", [2, 3])
def test_abstract_conv_gradients_are_adjoints(n, rng):
    """<conv(x, w), g> = <x, gradInputs(w, g)> = <w, gradWeights(x, g)>."""
    ac = T.nnet.abstract_conv
    grad_inputs = ac.AbstractConv2d_gradInputs if n == 2 else ac.AbstractConv3d_gradInputs
    grad_weights = ac.AbstractConv2d_gradWeights if n == 2 else ac.AbstractConv3d_gradWeights
    x_shape, w_shape = (2, 3, *[5, 6, 4][:n]), (4, 3, *[3, 2, 2][:n])
    if n == 2:
        kwargs = {"border_mode": "half", "subsample": (2, 1), "filter_flip": True, "kshp": w_shape}
        pad, stride = [(1, 1), (1, 1)], (2, 1)
    else:
        kwargs = {"filter_flip": False, "kshp": w_shape}
        pad, stride = [(0, 0)] * 3, (1, 1, 1)
    xv, wv = rng.normal(size=x_shape), rng.normal(size=w_shape)
    kernel = wv[(Ellipsis, *[slice(None, None, -1)] * n)] if kwargs["filter_flip"] else wv
    yv = np_correlate(xv, kernel, stride, pad, (1,) * n)
    gv = rng.normal(size=yv.shape)
    kern, img, top = (
        T.TensorType(floatX, (False,) * (n + 2))("k"),
        T.TensorType(floatX, (False,) * (n + 2))("i"),
        T.TensorType(floatX, (False,) * (n + 2))("g"),
    )
    # Lasagne gives the input's sizes as a symbolic vector
    in_sizes = T.as_tensor_variable(np.array(x_shape[2:])) if n == 2 else x_shape[2:]
    f = function(
        [kern, img, top],
        [grad_inputs(**kwargs)(kern, top, in_sizes), grad_weights(**kwargs)(img, top, w_shape[2:])],
    )
    gi, gw = f(wv, xv, gv)
    assert gi.shape == x_shape and gw.shape == w_shape
    np.testing.assert_allclose((gi * xv).sum(), (yv * gv).sum(), rtol=1e-9)
    np.testing.assert_allclose((gw * wv).sum(), (yv * gv).sum(), rtol=1e-9)


# ------------------------------------------------------------------ pooling


def test_pool_2d_modes_and_borders(rng):
    x4, x3 = T.tensor4("x4"), T.tensor3("x3")
    pool_2d = T.signal.pool.pool_2d
    cases = [  # (input, kwargs, ws, stride, pad, ignore_border, mode)
        (x4, {"ws": (2, 3), "ignore_border": False}, (2, 3), (2, 3), (0, 0), False, "max"),
        (
            x4,
            {"ws": (2, 3), "stride": (1, 2), "ignore_border": False, "mode": "sum"},
            (2, 3),
            (1, 2),
            (0, 0),
            False,
            "sum",
        ),
        (
            x4,
            {
                "ws": (3, 3),
                "stride": (2, 2),
                "pad": (1, 1),
                "ignore_border": True,
                "mode": "average_inc_pad",
            },
            (3, 3),
            (2, 2),
            (1, 1),
            True,
            "average_inc_pad",
        ),
        (
            x4,
            {
                "ws": (3, 3),
                "stride": (2, 1),
                "pad": (1, 2),
                "ignore_border": True,
                "mode": "average_exc_pad",
            },
            (3, 3),
            (2, 1),
            (1, 2),
            True,
            "average_exc_pad",
        ),
        (
            x4,
            {"ws": (2, 2), "stride": (1, 1), "pad": (1, 1), "ignore_border": True, "mode": "sum"},
            (2, 2),
            (1, 1),
            (1, 1),
            True,
            "sum",
        ),
        (
            x3,
            {"ds": (2, 2), "st": (1, 3), "ignore_border": True, "mode": "max"},
            (2, 2),
            (1, 3),
            (0, 0),
            True,
            "max",
        ),
    ]
    f = function([x4, x3], [pool_2d(c[0], **c[1]) for c in cases])
    xv, x3v = rng.normal(size=(2, 3, 5, 7)), rng.normal(size=(3, 5, 7))
    for got, (var, _, ws, stride, pad, ib, mode) in zip(f(xv, x3v), cases, strict=True):
        want = np_pool(xv if var is x4 else x3v, ws, stride, pad, ib, mode)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    with pytest.warns(UserWarning, match="ignore_border"):
        pool_2d(x4, (2, 2))
    with pytest.raises(NotImplementedError, match="ignore_border=True"):
        pool_2d(x4, (2, 2), ignore_border=False, pad=(1, 1))
    with pytest.raises(ValueError, match="not both"):
        pool_2d(x4, (2, 2), ignore_border=True, ds=(2, 2))


def test_pool_3d(rng):
    x = T.tensor5("x")
    pool_3d = T.signal.pool.pool_3d
    f = function(
        [x],
        [
            pool_3d(x, (2, 2, 2), ignore_border=True),
            pool_3d(x, (2, 3, 2), ignore_border=False, mode="sum"),
        ],
    )
    xv = rng.normal(size=(1, 2, 4, 5, 3))
    got = f(xv)
    np.testing.assert_allclose(got[0], np_pool(xv, (2, 2, 2), (2, 2, 2), (0,) * 3, True, "max"))
    np.testing.assert_allclose(got[1], np_pool(xv, (2, 3, 2), (2, 3, 2), (0,) * 3, False, "sum"))


# ------------------------------------------------------------------ random streams


def test_mrg_random_streams_distributions():
    srng = theano.sandbox.rng_mrg.MRG_RandomStreams(seed=11)
    x = T.vector("x")
    n = 4000
    draws = [
        srng.uniform((n,), low=-1.0, high=3.0),
        srng.normal((n,), avg=1.0, std=2.0),
        srng.normal((n,), avg=1.0, std=2.0, truncate=True),
        srng.binomial(x.shape, p=0.3, dtype=floatX),
        srng.binomial((5,), n=4, p=0.5),
    ]
    f = function([x], draws)
    u, nrm, trunc, mask, counts = f(np.zeros(n))
    assert u.dtype == nrm.dtype == mask.dtype == floatX and counts.dtype == np.int64
    assert -1 <= u.min() and u.max() < 3 and abs(u.mean() - 1) < 5 * 4 / math.sqrt(12 * n)
    assert abs(nrm.mean() - 1) < 5 * 2 / math.sqrt(n) and abs(nrm.std() - 2) < 0.15
    # a normal cut at two deviations keeps 0.8796 of the deviation
    assert -3 <= trunc.min() and trunc.max() <= 5 and abs(trunc.std() - 2 * 0.8796) < 0.12
    assert set(np.unique(mask)) <= {0.0, 1.0} and abs(mask.mean() - 0.3) < 5 * math.sqrt(0.21 / n)
    assert set(np.unique(counts)) <= set(range(5))
    again = f(np.zeros(n))  # the default updates advance every generator
    assert all(
        not np.array_equal(a, b) for a, b in zip(again[:4], (u, nrm, trunc, mask), strict=True)
    )


def test_random_streams_seeds():
    def draws(srng):
        return function([], [srng.uniform((3,)), srng.normal((2,))])

    first = draws(theano.tensor.shared_randomstreams.RandomStreams(5))
    twin = draws(theano.tensor.shared_randomstreams.RandomStreams(5))
    mrg = theano.sandbox.rng_mrg.MRG_RandomStreams()
    assert mrg.default_instance_seed == 12345
    a, b = first(), twin()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)  # same seed, same draws
    srng = theano.tensor.shared_randomstreams.RandomStreams(5)
    f = draws(srng)
    f()
    srng.seed()  # back to the construction seed
    for x, y in zip(f(), a, strict=True):
        np.testing.assert_array_equal(x, y)
    assert len(srng.updates()) == 2


def test_function_compiles_a_large_graph_op_by_op_unless_a_mode_is_named(rng, monkeypatch):
    from pytensor.link.vm import VMLinker

    from synkhronos.api import mode_choice

    T = theano.tensor
    x = T.vector("x")
    w = theano.shared(rng.standard_normal(3), name="w")
    y = ((T.tanh(x * w) + 1.0) ** 2).sum()
    data = rng.standard_normal(3)
    want = float(((np.tanh(data * w.get_value()) + 1.0) ** 2).sum())
    monkeypatch.setattr(mode_choice, "LARGE_GRAPH_NODES", 4)  # this graph counts as large
    op_by_op = theano.function([x], y, updates={w: w * 0.5})
    assert isinstance(op_by_op.maker.linker, VMLinker)
    np.testing.assert_allclose(float(op_by_op(data)), want, rtol=1e-12)
    named = theano.function([x], y, mode="NUMBA")
    assert not isinstance(named.maker.linker, VMLinker)
    with pytensor.config.change_flags(mode="NUMBA"):  # named in the configuration
        assert not isinstance(theano.function([x], y).maker.linker, VMLinker)
    monkeypatch.setattr(mode_choice, "LARGE_GRAPH_NODES", 10**6)
    assert not isinstance(theano.function([x], [y]).maker.linker, VMLinker)
