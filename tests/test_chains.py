"""synkhronos.api.chains without forking: which chained calls are kept for a call like
them (the chain's program goes straight on, unplanned), and which arguments match."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytensor.tensor as pt

from synkhronos.api.chains import _keep
from synkhronos.api.function_parts import FunctionParts
from synkhronos.api.planning import PLAIN, Planner, Ranks
from synkhronos.transport.nodes import World
from synkhronos.transport.shared_arrays import Data

ALONE = SimpleNamespace(alone=True, state=None)  # the session of one rank of one node


def _first(rng):
    x = pt.matrix("x", dtype="float32")
    c = pt.scalar("c", dtype="float32")
    spec = FunctionParts.parse(inputs=[x], bcast_inputs=[c], outputs=[(x.sum() * c, "sum")])
    planner = Planner(spec.spec(0, None), "f", False, False)
    return SimpleNamespace(spec=planner.spec), planner


def test_a_call_of_whole_rows_on_one_rank_is_kept(rng):
    function, planner = _first(rng)
    xv = rng.normal(size=(6, 3)).astype("float32")
    args = (xv, np.float32(2))
    plan = planner.plan(planner.in_data(args), PLAIN, Ranks(1, World(), list))
    kept, n, rows = _keep(function, ALONE, args, plan, ("program", [6]))
    assert (n, rows) == (1, [])
    assert kept.matches((rng.normal(size=(6, 3)).astype("float32"), 5.0))  # any values
    assert not kept.matches((rng.normal(size=(7, 3)).astype("float32"), 5.0))
    assert not kept.matches((xv.astype("float64"), 5.0))
    assert not kept.matches((xv,))
    xd = Data(xv)
    plan = planner.plan((xd, 2.0), PLAIN, Ranks(1, World(), list))
    kept, _, _ = _keep(function, ALONE, (xd, 2.0), plan, ("program", [6]))
    assert kept.matches((xd, 1.0)) and not kept.matches((xv, 1.0))


def test_no_call_is_kept_that_a_like_call_could_not_skip(rng):
    function, planner = _first(rng)
    xv = rng.normal(size=(6, 3)).astype("float32")
    args = (xv, np.float32(2))
    plan = planner.plan(planner.in_data(args), PLAIN, Ranks(1, World(), list))
    assert _keep(function, ALONE, args, plan, None) is None  # it ran step by step
    assert _keep(function, ALONE, args, plan, ("program", [4])) is None  # some rows only
    assert _keep(function, ALONE, args[:1], plan, ("program", [6])) is None
    sliceable = SimpleNamespace(spec=SimpleNamespace(sliceable=["s"]))
    assert _keep(sliceable, ALONE, args, plan, ("program", [6])) is None
    several = SimpleNamespace(alone=False, state=None)  # other ranks read the arguments
    assert _keep(function, several, args, plan, ("program", [6])) is None
