"""``synkhronos.api.selected``'s pieces without a session: the random generators a
graph draws from, which of them an earlier function shipped apart, the refusal of
``batch``/``batch_s`` where the givens select the minibatch, and the checks of a whole
minibatch's ``num_slices`` (made before anything is built or run)."""

from types import SimpleNamespace

import pytensor.tensor as pt
import pytest

from synkhronos.api.function_parts import FunctionParts
from synkhronos.api.planning import CallOptions
from synkhronos.api.selected import (
    GivenMinibatch,
    random_generators,
    refuse_row_options,
    shipped_apart,
)
from synkhronos.ops.random_streams import RandomStreams


def _drawing_parts():
    x = pt.matrix("x")
    streams = RandomStreams(seed=1)
    mask = streams.binomial(size=x.shape, n=1, p=0.5, dtype=x.dtype)
    return FunctionParts.parse(inputs=[x], outputs=(mask * x).sum())


def test_random_generators_of_outputs_updates_and_givens():
    parts = _drawing_parts()
    (generator,) = random_generators(parts)
    assert generator.default_update is not None
    x = pt.matrix("x")
    assert random_generators(FunctionParts.parse(inputs=[x], outputs=x.sum())) == []


def test_shipped_apart_once_then_alike():
    """A generator a function shipped (registered), not listed alike before, is apart;
    once listed it is alike; one never shipped is not apart."""
    (shipped,) = random_generators(_drawing_parts())
    (fresh,) = random_generators(_drawing_parts())
    registry = SimpleNamespace(index=lambda g: 0 if g is shipped else None)
    session = SimpleNamespace(state=SimpleNamespace(registry=registry))
    assert shipped_apart(session, [shipped, fresh]) == [shipped]
    assert shipped_apart(session, [shipped, fresh]) == []


def test_row_options_refused():
    refuse_row_options("f", CallOptions(num_slices=2, output_subset=[0]))
    for options in (CallOptions(batch=3), CallOptions(batch_s=slice(0, 2))):
        with pytest.raises(ValueError, match="f: its givens select the minibatch"):
            refuse_row_options("f", options)


@pytest.mark.parametrize(
    ("num_slices", "error"), [(0, ValueError), (True, TypeError), (2.0, TypeError)]
)
def test_whole_minibatch_checks_num_slices(num_slices, error):
    """Checked before the whole minibatch's function is built (none is here)."""
    whole = GivenMinibatch(rows=None, whole=None)  # type: ignore[arg-type]
    with pytest.raises(error, match="num_slices"):
        whole.run_whole(None, None, (), CallOptions(num_slices=num_slices))
    assert whole.function is None
