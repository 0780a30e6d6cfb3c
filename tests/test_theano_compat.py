"""``from synkhronos import theano``: Theano's names at their Theano paths, each checked
against Theano's documented meaning with NumPy references (one process, few graphs). The
nnet, pooling and random-stream modules have their own files (test_nnet.py, test_pool.py,
test_random_streams.py).

Graphs compile with the Python linker (``FAST_COMPILE``), which runs the same kernels.
"""

import importlib
import logging
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


# ------------------------------------------------------------------ random streams


def test_mrg_random_streams_are_the_streams_with_theanos_default_seed():
    """The streams themselves: test_random_streams.py."""
    mrg = theano.sandbox.rng_mrg.MRG_RandomStreams()
    assert mrg.default_instance_seed == 12345
    assert isinstance(mrg, theano.tensor.shared_randomstreams.RandomStreams)


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
