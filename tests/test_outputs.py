"""Rank 0 putting a call's results together from its own share and the workers' replies:
uneven shares of 11 rows give the whole batch's results (no fork: replies as a worker
sends them, fake specs and states)."""

import types

import numpy as np
import pytensor.tensor as pt
import pytest

from synkhronos.rank import outputs

ROWS = 11


def _spec(ops):
    return types.SimpleNamespace(output_ops=ops)


def _shares(rng, k):
    """Per-row values of two outputs, and their uneven shares on ``k`` ranks."""
    per_row = rng.standard_normal((ROWS, 3))
    parts = np.array_split(np.arange(ROWS), k)
    return per_row, parts


@pytest.mark.parametrize("k", [2, 3])
def test_shares_combine_to_the_whole_batchs_results(rng, k):
    per_row, parts = _shares(rng, k)
    ops = ["avg", "sum", "max", "gather", None, "per_rank"]

    def share(p):
        v = per_row[p]
        return [v.mean(0), v.sum(0), v.max(0), v, np.float64(len(p)), v[0]]

    shares = [share(p) for p in parts]
    # a worker replies its weight, then its host outputs, without those of op None
    replies = [
        [np.array([len(p)]), *[o for o, op in zip(s, ops, strict=True) if op is not None]]
        for p, s in zip(parts[1:], shares[1:], strict=True)
    ]
    got = outputs.collect_outputs(
        replies, _spec(ops), range(len(ops)), len(parts[0]), shares[0], {}, False
    )
    np.testing.assert_allclose(got[0], per_row.mean(0), rtol=1e-12)
    np.testing.assert_allclose(got[1], per_row.sum(0), rtol=1e-12)
    np.testing.assert_array_equal(got[2], per_row.max(0))
    np.testing.assert_array_equal(got[3], per_row)
    assert got[4] == len(parts[0])  # rank 0's own
    assert [r.tolist() for r in got[5]] == [per_row[p[0]].tolist() for p in parts]


def test_a_rank_without_rows_is_left_out_and_a_subset_is_returned(rng):
    per_row = rng.standard_normal((ROWS, 2))
    ops = ["gather", "avg"]
    mine = per_row[:7]
    replies = [[np.array([0])], [np.array([4]), per_row[7:].mean(0), per_row[7:]]]
    got = outputs.collect_outputs(replies, _spec(ops), [1, 0], 7, [mine.mean(0), mine], {}, False)
    np.testing.assert_allclose(got[0], per_row.mean(0), rtol=1e-12)
    np.testing.assert_array_equal(got[1], per_row)
    single = outputs.collect_outputs(
        [[np.array([0])], [np.array([4]), per_row[7:]]], _spec(ops), [0], 7, [mine], {}, True
    )
    np.testing.assert_array_equal(single, per_row)


def test_results_reduced_on_the_devices_are_taken_as_they_are(rng):
    value = rng.standard_normal(4)
    got = outputs.collect_outputs([[np.array([5])]], _spec(["sum"]), [0], 6, [], {0: value}, True)
    np.testing.assert_array_equal(got, value)
    assert got is not value and got.flags.writeable


def test_shapes_that_differ_between_ranks_are_refused_naming_the_output():
    replies = [[np.array([3]), np.ones(4)]]
    with pytest.raises(ValueError, match=r"output 2 has shapes rank 0: \(3,\), rank 1: \(4,\)"):
        outputs.collect_outputs(replies, _spec([None, None, "sum"]), [2], 3, [np.ones(3)], {}, True)


def test_own_outputs_alone(rng):
    v = rng.standard_normal((5, 2))
    got = outputs.own_outputs(_spec(["avg", "per_rank", None]), [0, 1, 2], [v, v, v], 5, False)
    np.testing.assert_array_equal(got[0], v)
    assert len(got[1]) == 1 and np.array_equal(got[1][0], v)
    np.testing.assert_array_equal(got[2], v)


def test_host_path_on_one_rank_and_what_workers_send(monkeypatch):
    x = pt.vector("x")
    fn = types.SimpleNamespace(
        spec=types.SimpleNamespace(outputs=[x.sum(), x], output_ops=["sum", None]),
        on_device=[True, True],
        rank_0_only={1},
    )
    outs = [np.float64(2.0), np.arange(3.0)]
    state = types.SimpleNamespace(n_ranks=1, rank=0, host_bytes=0)
    host, reduced = outputs.share_outputs(state, fn, [0, 1], 3, outs)
    assert reduced == {} and len(host) == 2
    worker = types.SimpleNamespace(n_ranks=2, rank=1)
    assert outputs.host_outputs(worker, fn, [0, 1], outs) == [2.0]  # op None: rank 0's
    assert outputs.host_outputs(worker, fn, [0, 1], []) == []
    monkeypatch.setenv(outputs.HOST_BYTES_VAR, "17")
    assert outputs.host_reduce_bytes() == 17
    monkeypatch.delenv(outputs.HOST_BYTES_VAR)
    assert outputs.host_reduce_bytes() == outputs.HOST_BYTES


class _Comm:
    """Two ranks' communicator, seen from rank 0: the other rank's part is given."""

    def __init__(self, theirs_gathered, theirs_sent):
        self.theirs_gathered, self.theirs_sent, self.ops = theirs_gathered, theirs_sent, []

    def all_gather(self, arrays):
        return [arrays, [self.theirs_gathered]]

    def reduce(self, values, op):
        self.ops.append(op)
        return [v + t for v, t in zip(values, self.theirs_sent, strict=True)]


def _device_fn(ops):
    x = pt.matrix("x")
    return types.SimpleNamespace(
        spec=types.SimpleNamespace(outputs=[x.sum(0)] * len(ops), output_ops=ops),
        on_device=[True] * len(ops),
        rank_0_only=set(),
    )


def test_device_path_scales_averages_by_rows(rng):
    per_row = rng.standard_normal((ROWS, 3))
    mine, theirs = per_row[:7], per_row[7:]
    comm = _Comm(np.array([4, 1, 3]), [theirs.mean(0) * 4 / ROWS])
    state = types.SimpleNamespace(
        n_ranks=2,
        rank=0,
        host_bytes=0,
        comm=comm,
        backend=types.SimpleNamespace(to_comm=np.asarray),
    )
    host, reduced = outputs.share_outputs(state, _device_fn(["avg"]), [0], 7, [mine.mean(0)])
    assert host == [] and comm.ops == ["sum"]
    np.testing.assert_allclose(reduced[0], per_row.mean(0), rtol=1e-12)


def test_device_path_refuses_shapes_that_differ(rng):
    comm = _Comm(np.array([4, 1, 5]), None)
    state = types.SimpleNamespace(n_ranks=2, rank=0, host_bytes=0, comm=comm)
    with pytest.raises(ValueError, match=r"outputs \[0\] have shapes \[\(3,\)\] on rank 0"):
        outputs.share_outputs(state, _device_fn(["sum"]), [0], 7, [np.ones(3)])
