"""Every collective on 3 CPU ranks (uneven splits), checked element by element; and on 2 and 3
ranks, collectives of more shared variables than one message carries."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.transport.channel import MAX_ARRAYS
from tests.graphs import x

on_3_ranks = pytest.mark.parametrize("ranks", [3], indirect=True)
on_2_and_3_ranks = pytest.mark.parametrize("ranks", [2, 3], indirect=True)

a = pytensor.shared(np.zeros((4, 3)), name="a")
b = pytensor.shared(np.zeros(5, dtype="int32"), name="b")
c = pytensor.shared(np.float32(0), name="c")


@pytest.fixture(scope="module")
def shipped(ranks):
    f = synk.function([x], x.sum() + a.sum() + b.sum() + c)
    synk.distribute()
    return f


def per_rank(rng, n):
    return [rng.normal(size=(4, 3)) for _ in range(n)], [
        rng.integers(-9, 9, size=5).astype("int32") for _ in range(n)
    ]


def set_each(values_a, values_b):
    for r, (va, vb) in enumerate(zip(values_a, values_b, strict=True)):
        synk.set_value(r, [a, b], [va, vb])


@on_3_ranks
def test_set_get_value(shipped, ranks, rng):
    va, vb = per_rank(rng, ranks)
    set_each(va, vb)
    for r in range(ranks):
        got_a, got_b = synk.get_value(r, [a, b])
        np.testing.assert_array_equal(got_a, va[r])
        np.testing.assert_array_equal(got_b, vb[r])
    np.testing.assert_array_equal(a.get_value(), va[0])  # rank 0's is the user's variable


@on_3_ranks
def test_broadcast(shipped, ranks, rng):
    va, vb = per_rank(rng, ranks)
    set_each(va, vb)
    synk.broadcast([a, b])
    np.testing.assert_array_equal(synk.gather(a, nd_up=1), np.stack([va[0]] * ranks))
    new = rng.normal(size=(4, 3))
    synk.broadcast(a, new)
    np.testing.assert_array_equal(synk.gather(a, nd_up=1), np.stack([new] * ranks))


@on_3_ranks
def test_scatter_uneven_and_gather(shipped, ranks, rng):
    whole = rng.normal(size=(8, 3))
    synk.scatter(a, whole)
    assert synk.get_lengths(a).tolist() == [3, 3, 2]
    assert synk.get_shapes([a])[0] == [(3, 3), (3, 3), (2, 3)]
    np.testing.assert_array_equal(synk.gather(a, nd_up=0), whole)
    np.testing.assert_array_equal(synk.get_value(2, a), whole[6:])
    synk.all_gather(a)
    np.testing.assert_array_equal(synk.gather(a, nd_up=1), np.stack([whole] * ranks))


@on_3_ranks
@pytest.mark.parametrize("op", ["avg", "sum", "prod", "max", "min"])
def test_reduce_and_all_reduce(shipped, ranks, rng, op):
    va, vb = per_rank(rng, ranks)
    want = {"avg": np.mean, "sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    set_each(va, vb)
    got_a, got_b = synk.reduce([a, b], op=op)
    np.testing.assert_allclose(got_a, want(np.stack(va), axis=0), rtol=1e-12)
    np.testing.assert_array_equal(got_b, want(np.stack(vb), axis=0).astype("int32"))
    np.testing.assert_allclose(a.get_value(), got_a)
    np.testing.assert_array_equal(synk.get_value(1, a), va[1])  # only rank 0 receives
    set_each(va, vb)
    synk.all_reduce([a, b], op=op)
    gathered = synk.gather([a, b], nd_up=1)
    for r in range(ranks):
        np.testing.assert_array_equal(gathered[0][r], got_a)  # bitwise equal on every rank
        np.testing.assert_array_equal(gathered[1][r], got_b)


@on_3_ranks
def test_scalar_variable(shipped, ranks):
    for r in range(ranks):
        synk.set_value(r, c, np.float32(r + 1))
    assert synk.gather(c).tolist() == [1, 2, 3]
    synk.all_reduce(c, op="sum")
    assert synk.gather(c).tolist() == [6, 6, 6]


@on_3_ranks
def test_all_reduce_large_vector(shipped, ranks, rng):
    big = pytensor.shared(np.zeros(1_000_003, dtype="float32"), name="big")
    synk.function([], big.sum())
    values = [rng.normal(size=1_000_003).astype("float32") for _ in range(ranks)]
    for r, v in enumerate(values):
        synk.set_value(r, big, v)
    synk.all_reduce(big, op="avg")
    want = (values[0] + values[1] + values[2]) * np.float32(1 / 3)
    np.testing.assert_allclose(big.get_value(), want, rtol=1e-6)
    np.testing.assert_array_equal(synk.get_value(2, big), big.get_value())


@on_3_ranks
def test_mismatched_shapes_raise_on_every_rank(shipped, ranks):
    synk.scatter(a, np.ones((7, 3)))  # 3, 2, 2 rows
    with pytest.raises((ValueError, synk.RemoteError), match="equal shapes"):
        synk.all_reduce(a)
    synk.broadcast(a, np.ones((4, 3)))  # the session is still usable
    np.testing.assert_array_equal(synk.reduce(a, op="sum"), np.full((4, 3), 3.0))


@on_3_ranks
def test_bad_values(shipped, ranks):
    with pytest.raises(ValueError, match="2 values for 1"):
        synk.broadcast([a], [np.ones((4, 3)), np.ones(2)])
    with pytest.raises(TypeError, match="shared variable b"):
        synk.broadcast(b, np.ones(5))  # float64 into int32
    with pytest.raises(ValueError, match="rank"):
        synk.get_value(3, a)


N_MANY = MAX_ARRAYS + 88  # two commands' worth, more than one message carries


@pytest.fixture(scope="module")
def many(ranks):
    """N_MANY small shared variables of a shipped function: float64 and int32, 2 to 4 rows."""
    variables = [
        pytensor.shared(
            np.zeros((2 + k % 3, 2), "int32" if k % 7 == 0 else "float64"), name=f"many{k}"
        )
        for k in range(N_MANY)
    ]
    synk.function([], pt.stack([v.sum() for v in variables]).sum(), mode="FAST_COMPILE")
    synk.distribute()
    return variables


def random_values(rng, variables: list) -> list:
    return [
        rng.integers(-9, 9, v.get_value().shape).astype(v.dtype)
        if v.dtype == "int32"
        else rng.normal(size=v.get_value().shape)
        for v in variables
    ]


def set_on_every_rank(rng, variables: list, ranks: int) -> list[list]:
    """Per rank, the random values set there (each rank's one set_value of them all)."""
    values = [random_values(rng, variables) for _ in range(ranks)]
    for r in range(ranks):
        synk.set_value(r, variables, values[r])
    return values


@on_2_and_3_ranks
def test_many_variables_set_get_gather_shapes(many, ranks, rng):
    values = set_on_every_rank(rng, many, ranks)
    for r in range(ranks):
        for got, want in zip(synk.get_value(r, many), values[r], strict=True):
            np.testing.assert_array_equal(got, want)
    gathered = synk.gather(many, nd_up=1)
    assert len(gathered) == N_MANY
    for k, got in enumerate(gathered):
        np.testing.assert_array_equal(got, np.stack([values[r][k] for r in range(ranks)]))
    assert list(synk.get_shapes(many)) == [[v.get_value().shape] * ranks for v in many]
    lengths = synk.get_lengths(many)
    assert [x.tolist() for x in lengths] == [[2 + k % 3] * ranks for k in range(N_MANY)]


@on_2_and_3_ranks
def test_many_variables_broadcast(many, ranks, rng):
    values = set_on_every_rank(rng, many, ranks)
    synk.broadcast(many)
    for k, got in enumerate(synk.gather(many, nd_up=1)):
        np.testing.assert_array_equal(got, np.stack([values[0][k]] * ranks))
    new = random_values(rng, many)
    synk.broadcast(many, new)
    for k, got in enumerate(synk.gather(many, nd_up=1)):
        np.testing.assert_array_equal(got, np.stack([new[k]] * ranks))


@on_2_and_3_ranks
def test_many_variables_reduce_and_all_reduce(many, ranks, rng):
    values = set_on_every_rank(rng, many, ranks)
    want = [np.sum([values[r][k] for r in range(ranks)], axis=0) for k in range(N_MANY)]
    got = synk.reduce(many, op="sum", in_place=False)
    for k in range(N_MANY):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12)
        np.testing.assert_array_equal(many[k].get_value(), values[0][k])  # not in place
    synk.all_reduce(many, op="max")
    for k, gathered in enumerate(synk.gather(many, nd_up=1)):
        top = np.max([values[r][k] for r in range(ranks)], axis=0)
        np.testing.assert_array_equal(gathered, np.stack([top] * ranks))


@on_2_and_3_ranks
def test_many_variables_all_gather(many, ranks, rng):
    values = set_on_every_rank(rng, many, ranks)
    got = synk.all_gather(many)
    for k in range(N_MANY):
        whole = np.concatenate([values[r][k] for r in range(ranks)])
        np.testing.assert_array_equal(got[k], whole)
        np.testing.assert_array_equal(synk.get_value(ranks - 1, many[k]), whole)


@on_2_and_3_ranks
def test_scatter_and_gather_past_a_message(many, ranks, rng):
    """A scatter's root sends each rank its part of every variable: past MAX_ARRAYS // ranks
    variables it takes more than one message."""
    chosen = [v for v in many if v.dtype == "float64"][: MAX_ARRAYS // ranks + 5]
    shapes = [v.get_value().shape for v in chosen]
    whole = [rng.normal(size=(11, 2)) for _ in chosen]
    synk.scatter(chosen, whole)
    split = [6, 5] if ranks == 2 else [4, 4, 3]
    assert all(x.tolist() == split for x in synk.get_lengths(chosen))
    for got, want in zip(synk.gather(chosen, nd_up=0), whole, strict=True):
        np.testing.assert_array_equal(got, want)
    rows = synk.get_value(ranks - 1, chosen)
    for got, want in zip(rows, whole, strict=True):
        np.testing.assert_array_equal(got, want[11 - split[-1] :])
    synk.broadcast(chosen, [np.zeros(shape) for shape in shapes])  # as the other tests made them


@on_2_and_3_ranks
def test_many_variables_in_a_chain(many, ranks, rng):
    values = set_on_every_rank(rng, many, ranks)
    step = synk.chain(("all_reduce", many, "sum"), ("broadcast", many[::-1]))
    assert step() == []
    for k, gathered in enumerate(synk.gather(many, nd_up=1)):
        total = np.sum([values[r][k] for r in range(ranks)], axis=0)
        np.testing.assert_allclose(gathered[0], total, rtol=1e-12)
        np.testing.assert_array_equal(gathered, np.stack([gathered[0]] * ranks))


@on_2_and_3_ranks
def test_a_later_command_failing_names_its_variables(many, ranks, rng):
    """Unequal shapes in the second command's variables: the first command's variables are
    reduced, the second's and later ones untouched, and the note says which is which."""
    values = set_on_every_rank(rng, many, ranks)
    odd = many[MAX_ARRAYS + 3]
    synk.set_value(ranks - 1, odd, np.zeros((7, 2), odd.dtype))
    with pytest.raises((ValueError, synk.RemoteError), match="equal shapes") as caught:
        synk.all_reduce(many, op="sum")
    note = "\n".join(getattr(caught.value, "__notes__", []))
    assert f"in the command of many{MAX_ARRAYS} to many{N_MANY - 1}" in note, note
    assert f"the {MAX_ARRAYS} variables before them" in note, note
    gathered = synk.gather(many[:MAX_ARRAYS], nd_up=1)
    for k, got in enumerate(gathered):
        total = np.sum([values[r][k] for r in range(ranks)], axis=0)
        np.testing.assert_allclose(got, np.stack([total] * ranks), rtol=1e-12)
    for k in range(MAX_ARRAYS, N_MANY):
        if many[k] is not odd:
            np.testing.assert_array_equal(synk.get_value(1, many[k]), values[1][k])
    synk.broadcast(many)  # the session goes on
