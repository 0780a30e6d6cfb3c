"""The original's ``collect_modes`` / ``reduce_ops`` keywords of ``synk.function``, on 2 CPU
ranks with 7 rows (4 on rank 0, 3 on rank 1), against plain ``pytensor.function``."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk

x = pt.matrix("x", dtype="float64")
ROWS_0 = 4  # rank 0's share of 7 rows


def test_collect_modes_list_of_the_docs_example(ranks, rng):
    # the original's docs: synk.function([...], loss, updates=..., collect_modes=[None])
    xv = rng.normal(size=(7, 3))
    f = synk.function([x], [x.sum()], collect_modes=[None])
    assert f.output_modes == [None]
    np.testing.assert_allclose(f(xv)[0], xv[:ROWS_0].sum())  # rank 0's own result


def test_reduce_with_the_originals_op_names(ranks, rng):
    exprs = [x.sum(), x.max(), x.sum(axis=1), x.mean()]
    f = synk.function(
        [x],
        exprs,
        collect_modes=["reduce", "reduce", "gather", "reduce"],
        reduce_ops=["+", "maximum", None, "average"],
    )
    assert f.output_modes == ["sum", "max", "gather", "avg"]
    xv = rng.normal(size=(7, 3))
    for got, want in zip(f(xv), pytensor.function([x], exprs)(xv), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_defaults_and_a_single_output(ranks, rng):
    xv = rng.normal(size=(7, 3))
    summed = synk.function([x], x.sum(), reduce_ops="sum")  # collect_modes "reduce"
    assert summed.output_modes == ["sum"]
    np.testing.assert_allclose(summed(xv), xv.sum())
    averaged = synk.function([x], [x.mean(), x.min()], collect_modes="reduce")
    assert averaged.output_modes == ["avg", "avg"]


def test_wrong_lengths_and_paired_outputs_are_refused(ranks):
    with pytest.raises(ValueError, match="collect_modes has 1 entries for 2 outputs"):
        synk.function([x], [x.sum(), x.max()], collect_modes=["sum"])
    with pytest.raises(TypeError, match="plain-variable outputs only"):
        synk.function([x], [(x.sum(), "sum")], collect_modes="max")
