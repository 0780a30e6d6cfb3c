"""synkhronos.api.functions: synk.function on 2 CPU ranks, every result checked against
pytensor.function; and, without forking, a call's arguments as a Function takes them."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import synkhronos as synk
from tests.graphs import check_ops, ops_function, random_xy, s, x, y


@pytest.fixture(scope="module")
def fns(ranks):
    return ops_function()


@pytest.mark.parametrize("n", [1, 2, 7, 10])
def test_every_reduce_op_uneven(fns, rng, n):
    f, ref = fns
    xv, yv = random_xy(rng, n)
    got = f(xv, yv, 1.5)
    check_ops(got, ref(xv, yv, 1.5), rows_per_rank=[(n + 1) // 2, n // 2])


def test_data_inputs_and_bcast_data(fns, rng):
    f, ref = fns
    xv, yv = random_xy(rng, 9)
    xd, yd, sd = f.build_inputs(xv, yv, 2.0)
    check_ops(f(xd, yd, sd), ref(xv, yv, 2.0))
    # Workers pick up a reallocation (bigger value) without being told.
    xv2, yv2 = random_xy(rng, 301)
    xd.set_value(xv2)
    yd.set_value(yv2)
    check_ops(f(xd, yd, 0.5), ref(xv2, yv2, 0.5))
    xd.set_length(5)
    yd.set_length(5)
    check_ops(f(xd, yd, 0.5), ref(xv2[:5], yv2[:5], 0.5))


def test_a_call_like_the_last_reuses_its_checks_and_plan(fns, rng):
    """A call of the same Data, of the same layouts, reuses the last call's plan; a new
    value in place changes the result, a new length or a freed Data is checked again, and
    the kept call keeps no Data alive."""
    import gc

    from tests.conftest import shm_entries

    f, ref = fns
    xv, yv = random_xy(rng, 9)
    xd, yd, sd = f.build_inputs(xv, yv, 2.0)
    check_ops(f(xd, yd, sd), ref(xv, yv, 2.0))
    kept = f._kept
    xv2, yv2 = random_xy(rng, 9)
    xd.set_value(xv2)  # new values, the same layouts
    yd.set_value(yv2)
    sd.set_value(-1.0)
    check_ops(f(xd, yd, sd), ref(xv2, yv2, -1.0))
    assert f._kept is kept  # reused
    yd.set_length(4)  # checked again: the lengths now differ
    with pytest.raises(ValueError, match="different lengths"):
        f(xd, yd, sd)
    xd.set_length(4)
    check_ops(f(xd, yd, sd), ref(xv2[:4], yv2[:4], -1.0), rows_per_rank=[2, 2])
    assert f._kept is not kept
    xd.free_memory()
    with pytest.raises(ValueError):
        f(xd, yd, sd)
    xd.set_value(xv[:4])  # a new segment
    check_ops(f(xd, yd, sd), ref(xv[:4], yv2[:4], -1.0))
    check_ops(f(xd, yd, 3.0), ref(xv[:4], yv2[:4], 3.0))  # a plain value: not kept
    check_ops(f(xd, yd, sd), ref(xv[:4], yv2[:4], -1.0))
    name = yd._segment.segment.name
    del xd, yd, sd
    gc.collect()
    assert name not in shm_entries()


def _worker_maps(name: str) -> bool:
    """Whether worker rank 1 maps the shared-memory segment ``name``."""
    from synkhronos.session import launch

    pid = launch.current().processes[0].pid
    with open(f"/proc/{pid}/maps") as maps:
        return any(f"/dev/shm/{name}" in line for line in maps)


def test_workers_unmap_released_data(fns, rng):
    import gc

    f, ref = fns
    xv, yv = random_xy(rng, 6)
    xd, yd = synk.data(xv), synk.data(yv)
    check_ops(f(xd, yd, 1.0), ref(xv, yv, 1.0))
    names = [d._segment.segment.name for d in (xd, yd)]
    assert all(_worker_maps(n) for n in names)
    xd.free_memory()  # released explicitly
    del yd  # released by the garbage collector
    gc.collect()
    check_ops(f(xv, yv, 1.0), ref(xv, yv, 1.0))  # the next command tells the workers
    assert not any(_worker_maps(n) for n in names)
    xd.set_value(xv[:3])  # a freed Data can be used again
    check_ops(f(xd, yv[:3], 1.0), ref(xv[:3], yv[:3], 1.0))


@pytest.mark.parametrize(
    "batch", [4, slice(2, 9), slice(1, None, 3), [8, 0, 3, 3, 5], np.array([True, False] * 5)]
)
def test_batch(fns, rng, batch):
    f, ref = fns
    xv, yv = random_xy(rng, 10)
    idx = np.arange(10)[batch] if not isinstance(batch, int) else np.arange(batch)
    check_ops(f(xv, yv, 1.0, batch=batch), ref(xv[idx], yv[idx], 1.0))


def test_minibatch_data_is_read_by_position(fns, rng):
    """Row k of minibatch data pairs with the k-th selected row of the full data."""
    f, ref = fns
    xv, yv = random_xy(rng, 40)
    ymb = synk.data(yv[:8], minibatch=True)
    idx = np.array([22, 17, 24, 19])
    check_ops(f(xv, ymb, 1.0, batch=idx), ref(xv[idx], yv[:4], 1.0))
    check_ops(f(xv, ymb, 1.0, batch=slice(17, 23)), ref(xv[17:23], yv[:6], 1.0))
    with pytest.raises(ValueError, match="by position"):
        f(xv, ymb, 1.0, batch=slice(0, 9))


@pytest.mark.parametrize("num_slices", [2, 3, 6])
def test_num_slices_equal_unsliced(fns, rng, num_slices):
    f, ref = fns
    xv, yv = random_xy(rng, 11)
    got = f(xv, yv, 0.7, num_slices=num_slices, output_subset=[0, 1, 2, 3, 4, 5])
    check_ops(got + [[6, 5]], ref(xv, yv, 0.7)[:6] + [11])
    with pytest.raises(ValueError, match="None"):
        f(xv, yv, 0.7, num_slices=2)


def test_output_subset(fns, rng):
    f, ref = fns
    xv, yv = random_xy(rng, 6)
    want = ref(xv, yv, 1.0)
    got = f(xv, yv, 1.0, output_subset=[5, 0])
    np.testing.assert_allclose(got[0], want[5])
    np.testing.assert_allclose(got[1], want[0])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 40),
    num_slices=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    use_batch=st.booleans(),
)
def test_random_lengths_slices_and_batches(fns, n, num_slices, seed, use_batch):
    f, ref = fns
    rng = np.random.default_rng(seed)
    xv, yv = random_xy(rng, n)
    batch = rng.permutation(n)[: max(1, n // 2)] if use_batch else None
    idx = np.arange(n) if batch is None else batch
    got = f(xv, yv, 1.25, batch=batch, num_slices=num_slices, output_subset=range(6))
    check_ops(got + [[len(idx)]], ref(xv[idx], yv[idx], 1.25)[:6] + [len(idx)])


def test_updates_act_on_each_ranks_copy(ranks, rng):
    w = pytensor.shared(np.zeros(3), name="w_upd")
    f = synk.function([x], (x.sum(), "sum"), updates={w: w + x.sum(axis=0)})
    xv = rng.normal(size=(5, 3))
    total = f(xv)
    np.testing.assert_allclose(total, xv.sum())
    per_rank = synk.gather(w, nd_up=1)
    np.testing.assert_allclose(per_rank[0], xv[:3].sum(axis=0))
    np.testing.assert_allclose(per_rank[1], xv[3:].sum(axis=0))
    np.testing.assert_allclose(w.get_value(), xv[:3].sum(axis=0))  # rank 0 is the user's


def test_as_pytensor_and_introspection(fns, rng):
    f, ref = fns
    xv, yv = random_xy(rng, 4)
    for got, want in zip(f.as_theano(xv, yv, 1.0), ref(xv, yv, 1.0), strict=True):
        np.testing.assert_allclose(got, want)
    assert f.name == "ops" and f.inputs == [x, y, s]
    assert f.output_modes == ["avg", "sum", "prod", "max", "min", "gather", "per_rank"]


@pytest.fixture(scope="module")
def sliced(ranks):
    data = pytensor.shared(np.zeros((1, 3)), name="data_s")
    f = synk.function(
        [],
        [((data**2).mean(), "avg"), (data.sum(axis=1), "gather")],
        bcast_inputs=[s],
        sliceable_shareds=[data],
        name="sliced",
    )
    return data, f


class TestSliceableShareds:
    def test_batch_s_single_and_per_rank(self, sliced, rng):
        data, f = sliced
        full = rng.normal(size=(13, 3))
        synk.scatter(data, full)  # rank 0 gets rows 0..6, rank 1 rows 7..12
        parts = [full[:7], full[7:]]
        got = f(0.0)
        np.testing.assert_allclose(got[0], (full**2).mean())
        np.testing.assert_allclose(got[1], full.sum(axis=1))
        got = f(0.0, batch_s=slice(1, 4))
        both = np.concatenate([p[1:4] for p in parts])
        np.testing.assert_allclose(got[0], (both**2).mean())
        np.testing.assert_allclose(got[1], both.sum(axis=1))
        got = f(0.0, batch_s=[[4, 0, 2], slice(5, 6)])
        both = np.concatenate([parts[0][[4, 0, 2]], parts[1][5:6]])
        np.testing.assert_allclose(got[0], (both**2).mean())
        np.testing.assert_allclose(got[1], both.sum(axis=1))
        got = f(0.0, batch_s=[1, 5, 0], num_slices=2)
        both = np.concatenate([p[[1, 5, 0]] for p in parts])
        np.testing.assert_allclose(got[0], (both**2).mean())
        np.testing.assert_allclose(got[1], both.sum(axis=1))

    def test_batch_s_out_of_range_raises_before_running(self, sliced):
        data, f = sliced
        synk.scatter(data, np.ones((9, 3)))  # 5 rows on rank 0, 4 on rank 1
        with pytest.raises(ValueError, match="rank 1"):
            f(0.0, batch_s=slice(0, 5))
        with pytest.raises(ValueError, match="batch_s"):
            f(0.0, batch_s=[[0], [7]])
        f(0.0, batch_s=slice(0, 4))


def test_function_without_scattered_inputs(ranks):
    v = pt.vector("v", dtype="float64")
    f = synk.function([], [(v.sum(), "sum"), (v.sum(), "avg")], bcast_inputs=[v])
    got = f(np.arange(4.0))
    assert float(got[0]) == 6.0 * ranks and float(got[1]) == 6.0


def test_givens_onto_sliceable_shareds(ranks, rng):
    """The paper's GPU-data pattern: inputs replaced by sliceable shared variables."""
    x_all = pytensor.shared(np.zeros((1, 3)), name="x_all")
    y_all = pytensor.shared(np.zeros(1), name="y_all")
    f = synk.function(
        [],
        [((x.sum(axis=1) * y) ** 2).mean(), (y, "gather")],
        givens=[(x, x_all), (y, y_all)],
        sliceable_shareds=[x_all, y_all],
    )
    xv, yv = rng.normal(size=(8, 3)), rng.normal(size=8)
    synk.scatter([x_all, y_all], [xv, yv])
    got = f(batch_s=slice(1, 3))
    idx = [1, 2, 5, 6]
    np.testing.assert_allclose(got[0], ((xv[idx].sum(axis=1) * yv[idx]) ** 2).mean())
    np.testing.assert_allclose(got[1], yv[idx])


def test_random_generators_differ_between_ranks(ranks):
    rng_var = pytensor.shared(np.random.default_rng(7), name="rng")
    next_rng, draw = pt.random.normal(size=(4,), rng=rng_var, return_next_rng=True)
    f = synk.function([], (draw, "per_rank"), updates={rng_var: next_rng})
    first, second = f()
    assert not np.allclose(first, second)
    again = f()
    assert not np.allclose(again[0], first)  # each rank's generator advances


def test_deep_graph_ships(ranks, rng):
    """Graphs deeper than plain pickling can recurse through (ResNet-50's gradient, whose
    batch-norm averages have default updates that reach back through the whole net)."""
    from pytensor.graph.replace import clone_replace

    from synkhronos.ops.random_streams import add_default_update

    v = pt.vector("v")
    scale = pytensor.shared(np.ones(7), name="deep_scale")
    out = v * scale  # used first; its default update below depends on everything after
    for i in range(700):
        out = pt.tanh(out) * 0.5 + v * 1e-3 if i % 2 else out + 1.0
    add_default_update(scale, 1.0 + 0.01 * out)
    f = synk.function([], (out, "per_rank"), bcast_inputs=[v], mode="FAST_COMPILE")
    scale_value = pt.vector("scale_value")
    ref = pytensor.function(
        [v, scale_value], clone_replace(out, {scale: scale_value}), mode="FAST_COMPILE"
    )
    vv = rng.normal(size=7)
    for _ in range(2):  # the second call sees the first's default update
        want = ref(vv, scale.get_value())
        for got in f(vv):
            np.testing.assert_allclose(got, want)
        np.testing.assert_allclose(synk.gather(scale, nd_up=1), [1.0 + 0.01 * want] * 2)


# ---- without forking: a call's arguments as a Function takes them --------------------------
def _named(defaults=None):
    """What BaseFunction.ordered_arguments reads of a function: inputs x, y and c, c's default."""
    from types import SimpleNamespace

    inputs = [pt.matrix("x"), pt.vector("y"), pt.scalar("c")]
    return SimpleNamespace(
        inputs=inputs,
        _positions={v.name: i for i, v in enumerate(inputs)},
        _defaults={2: 0.5} if defaults is None else defaults,
        _what="synkhronos function 'f'",
    )


def test_arguments_by_name_and_defaults_take_their_places():
    from synkhronos.api.functions import BaseFunction

    f = _named()
    assert BaseFunction.ordered_arguments(f, (1,), {"y": 2}) == (1, 2, 0.5)
    assert BaseFunction.ordered_arguments(f, (), {"c": 3, "x": 1, "y": 2}) == (1, 2, 3)
    with pytest.raises(TypeError, match="input 'x' given twice"):
        BaseFunction.ordered_arguments(f, (1,), {"x": 1, "y": 2})
    with pytest.raises(TypeError, match="has no input named 'z'"):
        BaseFunction.ordered_arguments(f, (1, 2), {"z": 1})
    with pytest.raises(TypeError, match=r"missing input 1 \('y'\)$"):
        BaseFunction.ordered_arguments(_named({}), (1,), {"c": 3})


def test_a_kept_calls_views_take_numpy_arrays_as_they_are():
    from synkhronos.api.functions import _views
    from synkhronos.transport.shared_arrays import Data

    a, d, b = np.ones((3, 2)), Data(np.zeros((4, 2))), Data(np.float64(2.0))
    scattered, bcast = _views((a, d, b), 2)
    assert scattered[0] is a and np.shares_memory(scattered[1], d.data)
    assert len(bcast) == 1 and float(bcast[0]) == 2.0
