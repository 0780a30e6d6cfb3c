"""synkhronos.rank.state without forking: each rank's share of a plan, run in slices, and
the outputs of every rank collected in rank 0 (synkhronos.rank.outputs), against numpy on
the whole batch. One process plays every rank in turn; the collectives are never reached
(CPU ranks send every output as a host array)."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.api.function_parts import FunctionParts
from synkhronos.api.planning import CallOptions, Planner, Ranks
from synkhronos.rank.backends.base import Backend
from synkhronos.rank.first_calls import FirstCalls
from synkhronos.rank.outputs import collect_outputs, own_outputs
from synkhronos.rank.state import RankState, bare_plan, run_share, share_of, step_plans
from synkhronos.transport.callplan import CallPlan
from synkhronos.transport.nodes import World


def _setup(n_ranks: int):
    x = pt.matrix("x", dtype="float64")
    c = pt.scalar("c", dtype="float64")
    w = pytensor.shared(np.zeros(3), name="w")
    parts = FunctionParts.parse(
        inputs=[x],
        bcast_inputs=[c],
        outputs=[(x.sum(axis=0) * c, "sum"), (x.mean(), "avg"), ((x**2).max(), "max")],
        updates=[(w, w + x.sum(axis=0), "sum")],  # w is 0: the chunks add up
        mode="FAST_COMPILE",
    )
    spec = parts.spec(0, "FAST_COMPILE")
    state = RankState(0, n_ranks, None, Backend("cpu", None), FirstCalls(None, lambda: None))
    state.add_function(spec)
    return spec, state, Planner(spec, "f", False, False), w


@pytest.mark.parametrize("n_ranks", [1, 2, 3])
@pytest.mark.parametrize("num_slices", [1, 2, 4])
def test_every_ranks_share_in_slices_gives_the_whole_batchs_outputs(rng, n_ranks, num_slices):
    spec, state, planner, w = _setup(n_ranks)
    xv = rng.normal(size=(13, 3))
    batch = np.sort(rng.permutation(13)[:11])
    options = CallOptions(batch=batch, num_slices=num_slices)
    ranks = Ranks(n_ranks, World(local_ranks=[n_ranks]), list)
    plan = planner.plan((xv, 0.5), options, ranks)
    per_rank, updates, taken = [], [], []
    for rank in range(n_ranks):
        state.rank = rank
        fn, share = share_of(state, plan, lambda d: d.data)
        taken.append(np.asarray(share["rows"]))
        pending: list = []
        per_rank.append(run_share(state, fn, share, pending))
        updates.append(pending[0][1])
        np.testing.assert_allclose(pending[0][1], xv[share["rows"]].sum(axis=0))  # its own
    np.testing.assert_array_equal(np.concatenate(taken), batch)  # in order, each row once
    weight, host, reduced = per_rank[0]
    replies = [[np.array([w_]), *h] for w_, h, _ in per_rank[1:]]
    got = collect_outputs(replies, spec, plan.subset, weight, host, reduced, False)
    whole = xv[batch]
    np.testing.assert_allclose(got[0], whole.sum(axis=0) * 0.5, rtol=1e-12)
    np.testing.assert_allclose(got[1], whole.mean(), rtol=1e-12)
    np.testing.assert_allclose(got[2], (whole**2).max(), rtol=1e-12)
    assert sum(p[0] for p in per_rank) == 11
    np.testing.assert_allclose(np.sum(updates, axis=0), whole.sum(axis=0), rtol=1e-12)
    assert w.get_value().tolist() == [0.0, 0.0, 0.0]  # pending: nothing applied


def test_one_ranks_own_outputs_equal_their_collection(rng):
    spec, state, planner, _ = _setup(1)
    xv = rng.normal(size=(7, 3))
    plan = planner.plan((xv, 2.0), CallOptions(output_subset=[2, 0]), Ranks(1, World(), list))
    fn, share = share_of(state, plan, lambda d: d.data)
    weight, host, reduced = run_share(state, fn, share, [])
    collected = collect_outputs([], spec, plan.subset, weight, host, reduced, False)
    own = own_outputs(spec, plan.subset, host, weight, False)
    for a, b, want in zip(collected, own, [(xv**2).max(), xv.sum(axis=0) * 2], strict=True):
        np.testing.assert_allclose(a, want, rtol=1e-12)
        np.testing.assert_array_equal(a, b)


def test_a_chains_steps_plans():
    _, state, _, _ = _setup(1)
    plan = bare_plan(state, 0)
    assert plan.subset.tolist() == [0, 1, 2] and plan.rows is None and plan.num_slices == 1
    steps = [0, "a collective", 0]
    first = CallPlan(0, 2, plan.subset, [], plan.by_position, None, [], plan.bcast_kinds, None)
    got = step_plans(state, steps, first)
    assert got[0] is first and got[1].num_slices == 1 and len(got) == 2
    assert [p.num_slices for p in step_plans(state, steps, None)] == [1, 1]
