"""synkhronos.api.planning without forking: a call's options, its arguments checked, each
rank's rows and the plan that travels (against numpy's selection of the same rows)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.api.functions import FunctionParts
from synkhronos.api.planning import PLAIN, CallOptions, Planner, Ranks, in_order
from synkhronos.transport.callplan import CallPlan
from synkhronos.transport.nodes import World
from synkhronos.transport.partition import split_bounds
from synkhronos.transport.protocol import Arg
from synkhronos.transport.shared_arrays import Data


def _planner(downcast=False, sliceable=(), bcast=True, outputs=None):
    x = pt.matrix("x", dtype="float32")
    y = pt.vector("y", dtype="float32")
    c = pt.scalar("c", dtype="float32")
    if outputs is None:
        outputs = [(x.sum(axis=0) * c, "sum"), (y.mean(), "avg"), (y.max(), None)]
    parts = FunctionParts.parse(
        inputs=[x, y],
        bcast_inputs=[c] if bcast else [],
        outputs=outputs,
        sliceable=list(sliceable),
        function_kwargs={"allow_input_downcast": downcast},
    )
    spec = parts.spec(7, None)
    return Planner(spec, "synkhronos function 'f'", downcast, counts_rows=False)


def _ranks(n_ranks=2, lengths=None, world=None):
    world = world or World(local_ranks=[n_ranks])
    return Ranks(n_ranks, world, lambda variables: list(lengths or []))


def _rows_of(rows, n_ranks) -> list[np.ndarray]:
    """Each rank's rows as index arrays."""
    out = []
    for r in range(n_ranks):
        sel = rows.for_rank(r)
        out.append(np.arange(sel.start, sel.stop) if isinstance(sel, slice) else np.asarray(sel))
    return out


def _args(rng, n=11):
    return rng.normal(size=(n, 3)).astype("float32"), rng.normal(size=n).astype("float32"), 2.0


def test_options_split_from_inputs_by_name():
    assert CallOptions.split({}) == (PLAIN, {})
    options, rest = CallOptions.split({"x": 1, "batch": 5, "num_slices": 2})
    assert (options.batch, options.num_slices, options.batch_s, rest) == (5, 2, None, {"x": 1})
    assert PLAIN.plain and CallOptions(num_slices=np.int64(1)).plain
    assert not CallOptions(batch=0).plain
    assert not CallOptions(num_slices=True).plain  # a bool is no int: the plan refuses it
    assert not CallOptions(output_subset=[0, 1]).plain
    with pytest.raises(dataclasses.FrozenInstanceError):
        PLAIN.batch = 3  # type: ignore[misc]


@pytest.mark.parametrize("n_ranks", [1, 2, 3])
@pytest.mark.parametrize("batch", [None, 7, slice(2, 9), "indices"])
def test_rows_split_in_order_over_the_ranks(rng, n_ranks, batch):
    planner = _planner()
    x, y, c = _args(rng)
    if batch == "indices":
        batch = rng.permutation(11)[:8]
    plan = planner.plan((x, y, c), CallOptions(batch=batch), _ranks(n_ranks))
    want = np.arange(11)[slice(batch) if batch is None or isinstance(batch, int) else batch]
    got = _rows_of(plan.rows, n_ranks)
    np.testing.assert_array_equal(np.concatenate(got), want)
    assert [len(g) for g in got] == np.diff(split_bounds(len(want), n_ranks)).tolist()
    assert plan.fid == 7 and plan.num_slices == 1 and plan.subset.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(plan.scatter[0].data, x)  # numpy: in the scratch Data
    assert plan.scatter[0] is planner.scratch[0]
    assert plan.bcast_kinds.tolist() == [Arg.VALUE] and float(plan.bcast[0]) == 2.0
    back = CallPlan.decode(plan.encode())  # as a worker reads it
    assert _rows_of(back.rows, n_ranks)[-1].tolist() == got[-1].tolist()


def test_rows_of_this_node_only():
    """Under MPI a node plans its own ranks' rows: those its global ranks take."""
    planner = _planner()
    x, y, c = _args(np.random.default_rng(0), n=10)
    world = World(node=1, n_nodes=2, local_ranks=[2, 2])
    plan = planner.plan((x, y, c), PLAIN, _ranks(2, world=world))
    assert split_bounds(10, 4) == [0, 3, 6, 8, 10]  # global ranks 2 and 3: rows 6..9
    assert [r.tolist() for r in _rows_of(plan.rows, 2)] == [[6, 7], [8, 9]]


def test_scratch_is_reused_and_data_read_in_place(rng):
    planner = _planner()
    x, y, c = _args(rng)
    first = planner.plan((x, y, c), PLAIN, _ranks())
    x2 = x[:5] * 3
    second = planner.plan((x2, y[:5], c), PLAIN, _ranks())
    assert second.scatter[0] is first.scatter[0]  # the same scratch Data, refilled
    np.testing.assert_array_equal(second.scatter[0].data, x2)
    xd = Data(x, var=planner.spec.inputs[0])
    cd = Data(np.float32(1.5), var=planner.spec.bcast_inputs[0])
    plan = planner.plan((xd, y, cd), PLAIN, _ranks())
    assert plan.scatter[0] is xd and plan.bcast[0] is cd
    assert plan.bcast_kinds.tolist() == [Arg.DATA]
    assert planner.reusable(planner.in_data((xd, y, cd)))
    assert not planner.reusable((xd, y, 1.5))  # a value: its plan holds it


def test_downcast_data_is_cast_at_every_call(rng):
    """A Data of another dtype, cast by allow_input_downcast, is cast anew at each call:
    the scratch holds the call's values, not the first call's."""
    planner = _planner(downcast=True)
    x, y, c = _args(rng)
    xd = Data(x.astype("float64"))
    args = planner.in_data((xd, y, c))
    np.testing.assert_array_equal(args[0].data, x)
    xd.data[:] *= 2
    again = planner.in_data((xd, y, c))
    assert again[0] is args[0]
    np.testing.assert_array_equal(again[0].data, (x.astype("float64") * 2).astype("float32"))


@pytest.mark.parametrize(
    ("args", "options", "error", "match"),
    [
        ("short", PLAIN, TypeError, "expected 3 arguments"),
        (None, CallOptions(num_slices=True), TypeError, "num_slices must be an int"),
        (None, CallOptions(num_slices=0), ValueError, "at least 1"),
        (None, CallOptions(output_subset=[3]), ValueError, "output indices in 0..2"),
        (None, CallOptions(output_subset=[2], num_slices=2), ValueError, "cannot be combined"),
        (None, CallOptions(batch=slice(3, 3)), ValueError, "selects no rows"),
        (None, CallOptions(batch=[12]), ValueError, "batch"),
        (None, CallOptions(batch_s=slice(0, 2)), ValueError, "no sliceable_shareds"),
        ("lengths", PLAIN, ValueError, "different lengths"),
        ("float64", PLAIN, TypeError, "lose precision"),
        ("ndim", PLAIN, TypeError, "expected 2 dimensions"),
    ],
)
def test_refused_before_anything_runs(rng, args, options, error, match):
    planner = _planner()
    x, y, c = _args(rng)
    given = {
        None: (x, y, c),
        "short": (x, y),
        "lengths": (x, y[:4], c),
        "float64": (x.astype("float64"), y, c),
        "ndim": (x[0], y, c),
    }[args]
    with pytest.raises(error, match=match):
        planner.plan(given, options, _ranks())


def test_a_rank_without_rows_is_refused_where_every_rank_needs_some(rng):
    planner = _planner()
    x, y, c = _args(rng)
    with pytest.raises(ValueError, match=r"none to rank\(s\) \[2\]"):
        planner.plan((x, y, c), CallOptions(batch=2), _ranks(3), every_rank_rows=True)
    planner.plan((x, y, c), CallOptions(batch=2), _ranks(3))  # else it skips the function


def test_sliceable_rows_per_rank(rng):
    s = pytensor.shared(np.zeros((10, 3), "float32"), name="s")
    x = pt.matrix("x", dtype="float32")
    spec = FunctionParts.parse(inputs=[x], outputs=[(x.sum() + s.sum(), "sum")], sliceable=[s])
    planner = Planner(spec.spec(1, None), "f", False, False)
    xv = rng.normal(size=(6, 3)).astype("float32")
    plan = planner.plan((xv,), CallOptions(batch_s=slice(1, 8)), _ranks(2, lengths=[10, 9]))
    assert [r.tolist() for r in _rows_of(plan.s_rows, 2)] == [list(range(1, 8))] * 2
    per_rank = CallOptions(batch_s=[slice(0, 3), np.array([4, 1])])
    plan = planner.plan((xv,), per_rank, _ranks(2, lengths=[10, 9]))
    assert [r.tolist() for r in _rows_of(plan.s_rows, 2)] == [[0, 1, 2], [4, 1]]
    with pytest.raises(ValueError, match="batch_s"):
        planner.plan((xv,), CallOptions(batch_s=slice(0, 10)), _ranks(2, lengths=[10, 9]))


def test_arguments_in_order_by_name_and_default():
    positions, defaults = {"x": 0, "y": 1, "c": 2}, {2: 0.5}
    ordered, given, rest = in_order((1,), {"c": 3, "y": 2}, positions, defaults, 3)
    assert (ordered, given, rest) == ([1, 2, 3], [True] * 3, {})
    ordered, given, rest = in_order((1,), {"y": 2}, positions, defaults, 3)
    assert ordered == [1, 2, 0.5] and all(given)  # the default where none is given
    # Names that place nothing come back: unknown, or given already (by position).
    ordered, given, rest = in_order((1,), {"x": 9, "z": 4}, positions, {}, 3)
    assert ordered == [1, None, None] and given == [True, False, False]
    assert rest == {"x": 9, "z": 4}
