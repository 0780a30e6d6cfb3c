"""The split on small graphs, in one process: its structure (what the row phase computes,
the frontier, the rounds), and its phases evaluated on two uneven parts of a batch, as
two ranks would, reassembled into the one-process function's results."""

import re
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.builders import OpFromGraph
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import graph_inputs
from pytensor.raise_op import Assert
from pytensor.tensor.math import Min

from synkhronos.api.split.phases import split_phases
from synkhronos.api.split.walk import owner_inputs, walk_up

MODE = "FAST_COMPILE"
ROWS, FIRST = 11, 7  # two parts: 7 and 4 rows
FLOAT = pytensor.config.floatX
#: A round's all-reduce, on the two parts' results.
REDUCE = {"sum": sum, "max": np.maximum.reduce, "min": np.minimum.reduce}


def evaluate(outputs, values):
    """``outputs`` computed from ``values`` (a phase reading anything else fails here)."""
    if not outputs:
        return []
    free = [
        v
        for v in graph_inputs(outputs)
        if v.owner is None and not isinstance(v, SharedVariable | Constant)
    ]
    missing = [v for v in free if v not in values]
    assert not missing, f"the phase reads {missing}"
    function = pytensor.function(free, outputs, mode=MODE, no_default_updates=True,
                                 on_unused_input="ignore")  # fmt: skip
    return function(*(values[v] for v in free))


def run_split(split, sources, arrays):
    """The phases on two parts of the rows; the function's outputs and update values."""
    parts = [slice(0, FIRST), slice(FIRST, ROWS)]
    whole = np.zeros(ROWS, np.int8)
    known = []
    for part in parts:
        values = {s: a[part] for s, a in zip(sources, arrays, strict=True)}
        values[split.rows] = whole
        if split.positions is not None:
            values[split.positions] = np.arange(ROWS)[part]
        known.append(values)
    for stage in split.rounds:
        results = [evaluate(stage.statistics + stage.kept, values) for values in known]
        n = len(stage.statistics)
        sums = [
            REDUCE[op]([r[k] for r in results])
            for k, op in zip(range(n), stage.reductions, strict=True)
        ]
        for values, result in zip(known, results, strict=True):
            values.update(zip(stage.statistic_placeholders, sums, strict=True))
            values.update(zip(stage.kept_placeholders, result[n:], strict=True))
    frontier = [evaluate(split.frontier, values) for values in known]
    reduced = []
    for k, (weighted, op) in enumerate(zip(split.weighted, split.reductions, strict=True)):
        terms = [
            f[k] * ((p.stop - p.start) / ROWS if weighted else 1)
            for f, p in zip(frontier, parts, strict=True)
        ]
        reduced.append(REDUCE[op](terms))
    targets = evaluate(
        split.targets, {**dict(zip(split.placeholders, reduced, strict=True)), split.rows: whole}
    )
    row_outputs = [evaluate(split.row_outputs, values) for values in known]
    kept = [np.concatenate(pieces) for pieces in zip(*row_outputs, strict=True)]
    return targets, kept


def assert_one_process(sources, outputs, updates, arrays, split):
    """The reassembled phases give the one-process function's outputs and updates."""
    reference = evaluate(
        list(outputs) + [u for _, u in updates], dict(zip(sources, arrays, strict=True))
    )
    targets, kept = run_split(split, sources, arrays)
    moved = [reference[k] for k in split.outputs]
    left = [reference[k] for k in range(len(outputs)) if k not in split.outputs]
    got = targets[: len(moved)] + kept + targets[len(moved) :]
    want = moved + left + reference[len(outputs) :]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10 if FLOAT == "float64" else 1e-5)


def ops_of(variables):
    """The names of the ops (scalar ops of elemwise ones) that compute ``variables``."""
    walked = walk_up(variables, owner_inputs)
    return {type(getattr(v.owner.op, "scalar_op", v.owner.op)).__name__ for v in walked if v.owner}


def regression(loss_of, x_shape=(3,)):
    rng = np.random.default_rng(0)
    x, y = pt.tensor("x", shape=(None, *x_shape), dtype=FLOAT), pt.vector("y", dtype=FLOAT)
    w = pytensor.shared(rng.normal(size=int(np.prod(x_shape))).astype(FLOAT), name="w")
    loss = loss_of(x, y, w)
    updates = [(w, w - 0.1 * pt.grad(loss, w))]
    arrays = [rng.normal(size=(ROWS, *x_shape)).astype(FLOAT), rng.normal(size=ROWS).astype(FLOAT)]
    return [x, y], [loss], updates, arrays


def split_of(sources, outputs, updates, movable=None):
    movable = movable or [True] * len(outputs)
    return split_phases(sources, outputs, movable, updates, True, True, len(updates))


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_mean_and_sum(reduce):
    sources, outputs, updates, arrays = regression(
        lambda x, y, w: getattr((pt.dot(x, w) - y) ** 2, reduce)()
    )
    split = split_of(sources, outputs, updates)
    assert split.outputs == [0] and not split.rounds and split.positions is None
    assert not split.inexact and not any(split.weighted)
    assert "Dot" in ops_of(split.frontier)  # the gradient's x.T @ delta, in the row phase
    assert "Dot" not in ops_of(split.targets)  # the reduced phase: the update's arithmetic
    assert_one_process(sources, outputs, updates, arrays, split)


def test_masked_mean():
    rng = np.random.default_rng(1)
    mask = pt.vector("mask", dtype=FLOAT)

    def loss_of(x, y, w):
        return pt.sum(mask * (pt.dot(x, w) - y) ** 2) / pt.sum(mask)

    sources, outputs, updates, arrays = regression(loss_of)
    arrays.append((rng.random(ROWS) > 0.3).astype(FLOAT))
    split = split_of(sources + [mask], outputs, updates)
    # The gradient divides each row's term by the mask's sum: a statistic the rows read,
    # summed over the ranks in a round before them.
    assert not split.inexact and len(split.rounds) == 1
    assert len(split.rounds[0].statistics) == 1
    assert mask in graph_inputs(split.rounds[0].statistics)
    assert_one_process(sources + [mask], outputs, updates, arrays, split)


def test_batch_norm_takes_rounds():
    rng = np.random.default_rng(2)
    x, y = pt.matrix("x", dtype=FLOAT), pt.vector("y", dtype=FLOAT)
    W = pytensor.shared(rng.normal(size=(3, 4)).astype(FLOAT), name="W")
    v = pytensor.shared(rng.normal(size=4).astype(FLOAT), name="v")
    h = pt.dot(x, W)
    mu = h.mean(axis=0)
    var = ((h - mu) ** 2).mean(axis=0)
    loss = pt.mean((pt.dot((h - mu) / pt.sqrt(var + 1e-3), v) - y) ** 2)
    updates = [(p, p - 0.1 * g) for p, g in zip([W, v], pt.grad(loss, [W, v]), strict=True)]
    split = split_of([x, y], [loss], updates)
    assert not split.inexact
    assert len(split.rounds) >= 2  # the mean, then the variance (which reads the mean)
    assert split.rounds[0].statistics and x in graph_inputs(split.rounds[0].kept)
    arrays = [rng.normal(size=(ROWS, 3)).astype(FLOAT), rng.normal(size=ROWS).astype(FLOAT)]
    assert_one_process([x, y], [loss], updates, arrays, split)
    each_own = split_phases([x, y], [loss], [True], updates, True, False, 2)
    assert "statistic(s) of the rows" in each_own.inexact[0] and not each_own.rounds


def test_dropout_draws_for_the_whole_batch():
    generator = pytensor.shared(np.random.default_rng(3), name="generator")

    def loss_of(x, y, w):
        mask = pt.random.bernoulli(0.5, size=x.shape, rng=generator)
        return pt.mean((pt.dot(x * mask, w) - y) ** 2)

    sources, outputs, updates, arrays = regression(loss_of)
    split = split_of(sources, outputs, updates)
    assert split.positions is not None and not split.inexact
    assert [g for g, _ in split.generators] == [generator]
    assert_one_process(sources, outputs, updates, arrays, split)


def test_max_over_rows_is_exact():
    """The gradient reads the maximum (which row it is): a round's statistic, all-reduced
    with "max"."""
    sources, outputs, updates, arrays = regression(lambda x, y, w: pt.max(pt.dot(x, w) - y))
    split = split_of(sources, outputs, updates)
    assert not split.inexact and split.rounds and split.rounds[0].reductions == ["max"]
    assert_one_process(sources, outputs, updates, arrays, split)


def test_extrema_only_the_update_and_outputs_read_are_exact():
    """A maximum and a minimum over the rows that only the update reads (a step scaled by
    the batch's largest and smallest gradient contributions), and an output ``x.max()``:
    each crosses to the reduced phase by its own all-reduce, "max" or "min"."""

    def step_of(x, y, w):
        contributions = x * (pt.dot(x, w) - y)[:, None]
        return pt.max(pt.abs(contributions)) - Min(axis=None)(contributions)

    sources, outputs, updates, arrays = regression(lambda x, y, w: pt.mean((pt.dot(x, w) - y) ** 2))
    (w, value), (x, y) = updates[0], sources
    updates = [(w, value / step_of(x, y, w))]
    outputs = [*outputs, x.max(), pt.min(y)]
    split = split_of(sources, outputs, updates)
    assert not split.inexact and not split.rounds and split.outputs == [0, 1, 2]
    assert sorted(split.reductions) == ["max", "max", "max", "min", "sum", "sum"]
    assert_one_process(sources, outputs, updates, arrays, split)


#: Minima over the rows that the rows read back: PyTensor's ``min`` (the negated maximum
#: of the negated values, as its gradient is), and the Min op itself (a min-max scaling of
#: the inputs: no gradient runs through it), all-reduced with "min".
MINIMA = {
    "pt_min": lambda x, y, w: pt.min((pt.dot(x, w) - y) ** 2) + pt.mean(pt.dot(x, w) - y),
    "min_op": lambda x, y, w: pt.mean(
        (pt.dot((x - Min(axis=0)(x)) / (pt.max(x, axis=0) - Min(axis=0)(x)), w) - y) ** 2
    ),
}


@pytest.mark.parametrize("name, ops", [("pt_min", {"max"}), ("min_op", {"min", "max"})])
def test_min_over_rows_is_exact(name, ops):
    sources, outputs, updates, arrays = regression(MINIMA[name])
    split = split_of(sources, outputs, updates)
    assert not split.inexact and split.rounds
    assert {op for stage in split.rounds for op in stage.reductions} == ops
    assert_one_process(sources, outputs, updates, arrays, split)


def test_product_over_rows_is_said():
    sources, outputs, updates, _ = regression(lambda x, y, w: pt.prod(pt.dot(x, w) - y))
    split = split_of(sources, outputs, updates)
    # The gradient reads the product: each rank's own rows' product.
    assert "which is not a sum" in split.inexact[0] and "Prod" in split.inexact[0]
    assert "each rank computes it from its own rows" in split.inexact[0]


def test_flatten():
    sources, outputs, updates, arrays = regression(
        lambda x, y, w: pt.mean((pt.dot(x.flatten(2), w) - y) ** 2), x_shape=(2, 3)
    )
    split = split_of(sources, outputs, updates)
    assert not split.inexact and not split.rounds
    assert_one_process(sources, outputs, updates, arrays, split)


def test_row_outputs_stay_with_the_rows():
    sources, outputs, updates, arrays = regression(lambda x, y, w: pt.mean((pt.dot(x, w) - y) ** 2))
    errors = pt.dot(sources[0], updates[0][0]) - sources[1]
    split = split_of(sources, [outputs[0], errors], updates)
    assert split.outputs == [0]  # the loss is reduced; the errors per row stay
    assert_one_process(sources, [outputs[0], errors], updates, arrays, split)


def test_integer_inputs_only():
    """An embedding read by indices alone: the update depends on the rows (the indices')."""
    rng = np.random.default_rng(4)
    idx = pt.ivector("idx")
    W = pytensor.shared(rng.normal(size=(10, 4)).astype(FLOAT), name="W")
    loss = pt.mean(W[idx].sum(axis=1) ** 2)
    updates = [(W, W - 0.1 * pt.grad(loss, W))]
    split = split_of([idx], [loss], updates)
    assert split is not None and not split.inexact
    assert "AdvancedIncSubtensor" in ops_of(split.frontier)  # the rows' gradient, summed
    arrays = [rng.integers(0, 10, ROWS).astype("int32")]
    assert_one_process([idx], [loss], updates, arrays, split)


def test_lengths_only_a_row_input_knows():
    """A mean over targets whose second axis only they know: the reduced phase reads
    that length from the frontier (a U-Net's per-pixel loss, issue #48)."""
    rng = np.random.default_rng(5)
    x, t = pt.matrix("x", dtype=FLOAT), pt.matrix("t", dtype=FLOAT)
    w = pytensor.shared(rng.normal(size=(3, 1)).astype(FLOAT), name="w", shape=(3, 1))
    loss = pt.mean((pt.dot(x, w) - t) ** 2)  # (n, 1) against (n, m): the mean counts n * m
    updates = [(w, w - 0.1 * pt.grad(loss, w))]
    split = split_of([x, t], [loss], updates)
    reduced_reads = set(graph_inputs(split.targets))
    assert x not in reduced_reads and t not in reduced_reads
    arrays = [rng.normal(size=(ROWS, 3)).astype(FLOAT), rng.normal(size=(ROWS, 5)).astype(FLOAT)]
    assert_one_process([x, t], [loss], updates, arrays, split)


#: Losses that name the rows' count: a sum divided by it (or an expression of it), each
#: row's term divided by it before the sum (was silently each rank's own count).
NAMED_COUNTS = {
    "n": lambda x, y, w: ((pt.dot(x, w) - y) ** 2).sum() / x.shape[0],
    "sqrt_n": lambda x, y, w: ((pt.dot(x, w) - y) ** 2).sum() / pt.sqrt(x.shape[0]),
    "per_row": lambda x, y, w: (((pt.dot(x, w) - y) ** 2) / x.shape[0]).sum(),
    "log_n": lambda x, y, w: ((pt.dot(x, w) - y) ** 2).sum() * pt.log(y.shape[0] - 1),
}


@pytest.mark.parametrize("loss_of", NAMED_COUNTS.values(), ids=NAMED_COUNTS.keys())
def test_row_count_named_by_the_loss(loss_of):
    """A row count the graph names is the whole call's in the rows' phase, as
    ``mean``'s."""
    sources, outputs, updates, arrays = regression(loss_of)
    split = split_of(sources, outputs, updates)
    assert not split.inexact and not split.rounds
    assert_one_process(sources, outputs, updates, arrays, split)


def clip_loss(x, y, w):
    """A contrastive loss over the batch: every row scored against every row."""
    z1, z2 = pt.outer(pt.dot(x, w), y), pt.outer(y, pt.dot(x, w))
    return -pt.diagonal(pt.special.log_softmax(z1 @ z2.T, axis=1)).mean()


@pytest.mark.parametrize(
    "loss_of, said",
    [
        (clip_loss, r"matrix product \(Dot\) of two values of the rows.*pairs rows with rows"),
        (
            lambda x, y, w: (pt.cumsum(pt.dot(x, w)) * y).sum(),
            r"cumulative add over axis 0 \(the rows\): each rank would accumulate its own rows",
        ),
        (
            lambda x, y, w: (pt.sort(pt.dot(x, w)) * y).sum(),
            r"sort over axis 0 \(the rows\): each rank would sort its own rows",
        ),
        (
            lambda x, y, w: (pt.dot(x, w)[pt.argsort(y)] * y).sum(),
            r"argsort over axis 0 \(the rows\): each rank would sort its own rows",
        ),
        (
            lambda x, y, w: (pt.dot(x, w)[::-1] * y).sum(),
            r"indexing axis 0 \(the rows\) by position .*: each rank would index its own rows",
        ),
        (
            lambda x, y, w: ((pt.dot(x, w)[1:] - pt.dot(x, w)[:-1]) ** 2).mean(),
            r"indexing axis 0 \(the rows\) by position \(Subtensor\{start:\}\)",
        ),
        (
            lambda x, y, w: ((pt.dot(x, w)[:, None] - y[None, :]) ** 2).mean(),
            r"Sub pairs rows with rows \(rows on axes \[0, 1\] of its result\): each rank would "
            r"pair its own rows only",
        ),
        (
            lambda x, y, w: (pt.concatenate([pt.dot(x, w), y]) * pt.arange(2 * x.shape[0])).sum(),
            r"Join along axis 0 \(the rows\): each rank would join or split its own rows",
        ),
        (
            lambda x, y, w: ((pt.dot(x, w) - y) ** 2).mean() * pt.unique(pt.round(y)).sum(),
            r"Unique.* \(not known to keep the rows apart\): each rank would compute it from "
            r"its own rows only",
        ),
    ],
    ids=[
        "clip",
        "cumsum",
        "sort",
        "argsort",
        "reversed",
        "difference",
        "pairwise",
        "join",
        "unknown_op",
    ],  # fmt: skip
)
def test_rows_mixed_are_said(loss_of, said):
    """An op whose result mixes rows other than by a sum, or an op not known to keep them
    apart: each rank would see its own rows only (and the phases differ from one
    process: the words are needed)."""
    sources, outputs, updates, arrays = regression(loss_of)
    split = split_of(sources, outputs, updates)
    assert any(re.search(said, line) for line in split.inexact), split.inexact
    with pytest.raises(AssertionError):
        assert_one_process(sources, outputs, updates, arrays, split)


def test_inner_graphs_are_judged_by_their_ops():
    """An op of an inner graph (OpFromGraph) is judged by the ops of its graph: one that
    keeps the rows apart says nothing, one with a cumulative sum over them is said."""
    a = pt.vector("a", dtype=FLOAT)
    keeps = OpFromGraph([a], [pt.tanh(a) * a])
    mixes = OpFromGraph([a], [pt.cumsum(a)])
    sources, outputs, updates, arrays = regression(
        lambda x, y, w: ((keeps(pt.dot(x, w)) - y) ** 2).mean()
    )
    split = split_of(sources, outputs, updates)
    assert not split.inexact, split.inexact
    assert_one_process(sources, outputs, updates, arrays, split)
    sources, outputs, updates, arrays = regression(lambda x, y, w: (mixes(pt.dot(x, w)) * y).sum())
    (said,) = split_of(sources, outputs, updates).inexact
    assert re.search(r"OpFromGraph.*'s graph: a cumulative add over axis 0 \(the rows\)", said)


#: Listwise losses: a softmax over the batch (its maximum and sum over the rows in rounds).
OVER_THE_BATCH = {
    "log_softmax": lambda x, y, w: -(pt.special.log_softmax(pt.dot(x, w), axis=0) * y).sum(),
    "softmax": lambda x, y, w: ((pt.special.softmax(pt.dot(x, w), axis=0) - y) ** 2).sum(),
}


@pytest.mark.parametrize("loss_of", OVER_THE_BATCH.values(), ids=OVER_THE_BATCH.keys())
def test_softmax_over_the_batch_is_exact(loss_of):
    sources, outputs, updates, arrays = regression(loss_of)
    split = split_of(sources, outputs, updates)
    assert not split.inexact and "max" in split.rounds[0].reductions
    assert_one_process(sources, outputs, updates, arrays, split)


def _mlp(x, y, w):
    rng = np.random.default_rng(6)
    W = pytensor.shared(rng.normal(size=(3, 5)).astype(FLOAT), name="W")
    h = pt.tanh(pt.dot(x, W)) + w[None, :].sum()
    return pt.mean((h.sum(axis=1) - y) ** 2)


def _classifier(x, y, w):
    rng = np.random.default_rng(7)
    W = pytensor.shared(rng.normal(size=(3, 4)).astype(FLOAT), name="W")
    p = pt.special.softmax(pt.dot(x * w, W), axis=-1)
    labels = pt.cast(pt.abs(y * 10), "int64") % 4
    return -pt.mean(pt.log(p[pt.arange(x.shape[0]), labels])) + pt.mean(
        pt.special.log_softmax(pt.dot(x, W), axis=1)
    )


def _recurrent(x, y, w):
    """An LSTM-like recurrence over a sequence axis (the rows ride along)."""
    rng = np.random.default_rng(8)
    U = pytensor.shared(rng.normal(size=(3, 3)).astype(FLOAT) / 3, name="U")
    steps = x.dimshuffle(1, 0, 2)  # (time, rows, features)

    def step(x_t, h, c):
        gate = pt.sigmoid(pt.dot(h, U) + x_t * w[:3])
        c = gate * c + (1 - gate) * pt.tanh(x_t)
        return pt.tanh(c) * gate, c

    start = pt.zeros((x.shape[0], 3), dtype=FLOAT)
    hs, _ = pytensor.scan(step, sequences=steps, outputs_info=[start, start], return_updates=False)
    return pt.mean((hs[-1].sum(axis=1) - y) ** 2)


def _transformer(x, y, w):
    """A spatial transformer's grid: each row's image read at points its own affine
    transform moves (the gradient runs through the sampling's weights)."""
    from synkhronos.extensions.lasagne import layers as L

    image = L.InputLayer((None, 1, 4, 4), x)
    identity = pt.as_tensor(np.array([1, 0, 0, 0, 1, 0], FLOAT))
    theta = identity + 0.1 * pt.tanh(pt.dot(x.flatten(2), w))[:, None]
    warped = L.TransformerLayer(image, L.InputLayer((None, 6), theta)).get_output_for([x, theta])
    return pt.mean((pt.dot(warped.flatten(2), w) - y) ** 2)


class _Checked(Assert):
    """A subclass of PyTensor's checks, as PyMC's parameter checks are."""


def _checked(x, y, w):
    """A check of a parameter on a value of the rows (PyMC's ``Check{sigma > 0}``): its value
    is its input's."""
    h = _Checked("finite w")(pt.dot(x, w[:3]), pt.all(pt.isfinite(w)))
    return pt.mean((h - y) ** 2)


#: Exact models that draw no warning: (loss, the shape of a row of x).
EXACT = {
    "mlp": (_mlp, (3,)),
    "checked": (_checked, (3,)),
    "softmax_classifier": (_classifier, (3,)),
    "lstm_like": (_recurrent, (4, 3)),
    "spatial_transformer": (_transformer, (1, 4, 4)),
}


@pytest.mark.parametrize("loss_of, x_shape", EXACT.values(), ids=EXACT.keys())
def test_exact_graphs_say_nothing(loss_of, x_shape):
    sources, outputs, updates, arrays = regression(loss_of, x_shape)
    with warnings.catch_warnings():  # the split says nothing (nor does PyTensor to it)
        warnings.simplefilter("error")
        split = split_of(sources, outputs, updates)
    assert split is not None and not split.inexact, split.inexact
    assert_one_process(sources, outputs, updates, arrays, split)


def test_too_many_rounds_are_said(monkeypatch):
    """Past MAX_ROUNDS, each rank's statistics are its own rows', as the words say."""
    monkeypatch.setattr("synkhronos.api.split.phases.MAX_ROUNDS", 1)
    rng = np.random.default_rng(2)
    x, y = pt.matrix("x", dtype=FLOAT), pt.vector("y", dtype=FLOAT)
    v = pytensor.shared(rng.normal(size=3).astype(FLOAT), name="v")
    mu = x.mean(axis=0)
    var = ((x - mu) ** 2).mean(axis=0)  # reads the mean: two rounds
    loss = pt.mean((pt.dot((x - mu) / pt.sqrt(var + 1e-3), v) - y) ** 2)
    split = split_of([x, y], [loss], [(v, v - 0.1 * pt.grad(loss, v))])
    assert not split.rounds
    assert "each rank computes them from its own rows" in split.inexact[0]
    assert "would take 2 rounds, over MAX_ROUNDS (1;" in split.inexact[0]


def _op_classes(cls: type) -> set[str]:
    """The names of ``cls`` and its subclasses, imported or not yet."""
    return {cls.__name__}.union(*(_op_classes(sub) for sub in cls.__subclasses__()))


@pytest.mark.parametrize(
    "table",
    ["analysis._ROW_SUMS", "keeping._OVER_THE_BATCH", "keeping._SAME", "keeping._FOLDS"]
    + ["keeping._ALONG_AXIS", "keeping._BY_NAME"],
)
def test_every_op_name_of_the_analysis_is_an_op_class(table):
    """The analysis knows ops by their class names (the ops whose result is a sum of a
    term per row, those that keep rows apart): each must name an Op of PyTensor's or of
    synkhronos.ops, for a name of no class would never match, silently."""
    import pytensor.scan.op
    import pytensor.tensor.blas  # noqa: F401 - Dot22's module
    from pytensor.graph.op import Op

    import synkhronos.ops.conv  # noqa: F401 - the convolutions' Ops
    from synkhronos.api.split import analysis, keeping

    module, name = table.split(".")
    names = set(getattr({"analysis": analysis, "keeping": keeping}[module], name))
    if not hasattr(pytensor.tensor.subtensor, "AdvancedIncSubtensor1"):
        names.discard("AdvancedIncSubtensor1")  # PyTensor 3.0's op: 3.3 dropped it
    assert names <= _op_classes(Op), names - _op_classes(Op)
