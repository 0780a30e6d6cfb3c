"""synkhronos.api.function_parts without forking: synk.function's arguments sorted and
checked, and the shared variables a call reads and writes."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.api.function_parts import FunctionParts, shared_reads_writes


def test_outputs_updates_and_their_ops():
    x = pt.vector("x")
    w = pytensor.shared(np.zeros(3), name="w")
    parts = FunctionParts.parse(
        inputs=[x], outputs=[x.sum(), (x.max(), "max")], updates=[(w, w + 1, "sum")]
    )
    assert parts.ops == ["avg", "max"] and parts.explicit == [False, True]
    assert not parts.single and parts.update_ops == ["sum"]
    single = FunctionParts.parse(inputs=[x], outputs=(x.sum(), "sum"), updates={w: w * 2})
    assert single.single and single.ops == ["sum"] and single.update_ops == ["avg"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"inputs": [pt.vector("x") * 2]}, TypeError, "free PyTensor variable"),
        ({"inputs": [pt.scalar("s")]}, TypeError, "at least one dimension"),
        ({"outputs": [np.float64(1)]}, TypeError, "not a PyTensor variable"),
        ({"outputs": [(pt.scalar("s"), "median")]}, ValueError, "median"),
        ({"updates": [(1, 2, 3, 4)]}, TypeError, "pairs or"),
        ({"givens": [(1, 2, 3)]}, TypeError, "givens must be"),
        ({"sliceable": [pytensor.shared(1.0)]}, TypeError, "sliceable_shareds"),
    ],
)
def test_what_cannot_be_a_function_is_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        FunctionParts.parse(**kwargs)


def test_what_a_call_reads_and_writes():
    x = pt.vector("x")
    w = pytensor.shared(np.ones(3), name="w")
    s = pytensor.shared(np.ones((5, 3)), name="s")
    c = pytensor.shared(np.float64(2.0), name="c")
    counted = pytensor.shared(np.int64(0), name="counted")
    parts = FunctionParts.parse(
        inputs=[x],
        outputs=[(x * w * c).sum() + s.sum()],
        updates=[(counted, counted + 1)],
        sliceable=[s],
    )
    reads, writes = shared_reads_writes(parts, set())
    assert {v.name for v in reads} == {"w", "c", "counted"}  # s: each rank's own rows
    assert [v.name for v in writes] == ["counted"]
    reads, _ = shared_reads_writes(parts, {id(w)})  # another function's sliceable
    assert {v.name for v in reads} == {"c", "counted"}
