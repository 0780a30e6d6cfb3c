"""Bad arguments are refused in rank 0 before any rank runs; worker failures surface."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.raise_op import Assert

import synkhronos as synk
from tests.graphs import x, y

w = pytensor.shared(np.zeros(3), name="w_err")


@pytest.fixture(scope="module")
def f(ranks):
    return synk.function([x, y], [x.mean(), (y, "gather")], updates={w: w + 1}, name="upd")


def unchanged(check):
    """Run ``check`` (which must raise) and assert no rank's ``w`` moved."""
    before = synk.gather(w, nd_up=1)
    check()
    np.testing.assert_array_equal(synk.gather(w, nd_up=1), before)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((np.ones((4, 3)),), {}, TypeError, "expected 2 arguments"),
        ((np.ones((4, 3)), np.ones(4), 1), {}, TypeError, "expected 2 arguments"),
        ((np.ones((4, 3), "float32") + 0.5, np.ones(4)), {"batch": "x"}, TypeError, "batch"),
        ((np.ones(4), np.ones(4)), {}, TypeError, "input 0 \\('x'\\).*dimensions"),
        ((np.ones((4, 3)), np.ones(5)), {}, ValueError, "different lengths"),
        ((np.ones((4, 3)).astype("complex128"), np.ones(4)), {}, TypeError, "'x'.*complex128"),
        ((np.ones((4, 3)), np.ones(4)), {"batch": 5}, ValueError, "batch=5"),
        ((np.ones((4, 3)), np.ones(4)), {"batch": [0, 4]}, ValueError, "out of range"),
        ((np.ones((4, 3)), np.ones(4)), {"batch": [-1]}, ValueError, "negative"),
        ((np.ones((4, 3)), np.ones(4)), {"batch": slice(0, 9)}, ValueError, "outside"),
        ((np.ones((4, 3)), np.ones(4)), {"batch": []}, ValueError, "no rows"),
        ((np.ones((4, 3)), np.ones(4)), {"batch": [[0, 1]]}, TypeError, "1-D"),
        ((np.ones((4, 3)), np.ones(4)), {"num_slices": 0}, ValueError, "num_slices"),
        ((np.ones((4, 3)), np.ones(4)), {"num_slices": 1.5}, TypeError, "num_slices"),
        ((np.ones((4, 3)), np.ones(4)), {"batch_s": slice(0, 1)}, ValueError, "sliceable"),
        ((np.ones((4, 3)), np.ones(4)), {"output_subset": [2]}, ValueError, "output_subset"),
    ],
)
def test_bad_call_raises_before_anything_runs(f, args, kwargs, error, match):
    def check():
        with pytest.raises(error, match=match):
            f(*args, **kwargs)

    unchanged(check)


def test_data_with_wrong_dtype_names_the_input(f):
    xd = synk.data(np.ones((4, 3), "float32"))
    with pytest.raises(TypeError, match="input 0 \\('x'\\).*float32"):
        f(xd, np.ones(4))


def test_unknown_reduce_op_at_build(ranks):
    with pytest.raises(ValueError, match="unknown reduce op 'mean'"):
        synk.function([x], (x.sum(), "mean"))
    with pytest.raises(ValueError, match="unknown reduce op"):
        synk.all_reduce(w, op="median")
    with pytest.raises(TypeError, match="list the scalars after them"):
        synk.function([pt.scalar("a"), x], x.sum())
    generator = pytensor.shared(np.random.default_rng(0))  # a shared variable without ndim
    with pytest.raises(TypeError, match=r"sliceable_shareds\[0\] must be a shared variable"):
        synk.function([x], x.sum(), sliceable_shareds=[generator])


def test_row_dependent_output_shapes_name_the_ranks(ranks):
    per_row = synk.function([x], (x[:, 0] * 2, "sum"))
    with pytest.raises(
        ValueError,
        match=r"output 0 has shapes rank 0: \(3,\), rank 1: "
        r"\(2,\).*same shape on every rank",
    ):
        per_row(np.ones((5, 3)))
    np.testing.assert_array_equal(per_row(np.ones((4, 3))), [4.0, 4.0])  # still usable


def test_worker_exception_is_raised_with_rank_and_traceback(ranks):
    checked = Assert("row sum too large")(x.sum(axis=1), pt.all(x.sum(axis=1) < 100))
    g = synk.function([x], (checked, "gather"), name="assert")
    xv = np.zeros((4, 3))
    np.testing.assert_array_equal(g(xv), np.zeros(4))
    xv[3] = 1000.0  # only the last rank's rows fail
    with pytest.raises(synk.RemoteError, match=f"rank {ranks - 1} failed") as info:
        g(xv)
    assert "row sum too large" in str(info.value) and "Traceback" in str(info.value)
    np.testing.assert_array_equal(g(np.zeros((5, 3))), np.zeros(5))  # still usable


def test_fork_twice_and_backend(ranks):
    with pytest.raises(RuntimeError, match="already forked"):
        synk.fork(2)
    assert synk.backend() == "cpu"


def test_unknown_shared_variable(ranks):
    lonely = pytensor.shared(np.zeros(2), name="lonely")
    with pytest.raises(ValueError, match="not used by any synkhronos function"):
        synk.broadcast(lonely)
    with pytest.raises(TypeError, match="shared variables"):
        synk.broadcast([np.zeros(2)])
