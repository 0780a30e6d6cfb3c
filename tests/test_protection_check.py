"""The fast check of protected variables (:mod:`synkhronos.rank.protection_check`):
PyTensor's answers, and the graph PyTensor's rewriting makes."""

from __future__ import annotations

import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.aliasing import Supervisor
from pytensor.compile.mode import Mode, get_mode
from pytensor.graph.destroyhandler import DestroyHandler
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.basic import MergeOptimizer
from pytensor.graph.utils import InconsistencyError
from pytensor.scalar import add
from pytensor.tensor.elemwise import Elemwise

from synkhronos.rank import protection_check
from tests.rewrite_steps import lstm_step, mlp_step, rewritten_graph, same_graph

_add_in_place = Elemwise(add, inplace_pattern={0: 0})  # overwrites its first input


def _graph(case: str):
    """A graph of inputs ``x`` (protected) and ``y`` (not), and whether a node of it
    overwrites a protected variable."""
    x, y = pt.vector("x"), pt.vector("y")
    doubled = x * 2
    outputs, refused = {
        "nothing overwritten": ([doubled + y], False),
        "a value computed": ([_add_in_place(doubled, y)], False),
        "an unprotected input": ([_add_in_place(y, x)], False),
        "a protected input": ([_add_in_place(x, y)], True),
        "a view of a protected input": ([_add_in_place(x[1:], y[1:])], True),
        "an output": ([doubled, _add_in_place(doubled, y)], True),
    }[case]
    fgraph = FunctionGraph([x, y], outputs, features=[DestroyHandler()], clone=False)
    supervisor = Supervisor([x])
    fgraph.attach_feature(supervisor)
    return fgraph, supervisor, refused


def _answer(check, supervisor, fgraph) -> str | None:
    try:
        check(supervisor, fgraph)
    except InconsistencyError as error:
        return str(error)
    return None


@pytest.mark.parametrize(
    "case",
    [
        "nothing overwritten",
        "a value computed",
        "an unprotected input",
        "a protected input",
        "a view of a protected input",
        "an output",
    ],
)
def test_the_check_answers_as_pytensors(case):
    fgraph, supervisor, refused = _graph(case)
    fast = _answer(protection_check.check_protected, supervisor, fgraph)
    assert fast == _answer(Supervisor.on_validate, supervisor, fgraph)
    assert (fast is not None) == refused


def test_with_fast_cycle_detection_pytensors_check_runs(monkeypatch):
    fgraph, supervisor, _ = _graph("a protected input")
    calls = []
    monkeypatch.setattr(Supervisor, "on_validate", lambda *args: calls.append(args))
    with pytensor.config.change_flags(cycle_detection="fast"):
        protection_check.check_protected(supervisor, fgraph)
    assert calls == [(supervisor, fgraph)]


@pytest.mark.parametrize("model", [mlp_step, lstm_step])
def test_rewriting_with_the_fast_check_makes_pytensors_graph(rng, model):
    inputs, outputs, steps = model(rng)
    mode = protection_check.with_fast_protection_check(get_mode("CVM"))
    fast = rewritten_graph(mode, inputs, outputs, steps)
    assert fast._supervisor.on_validate.func is protection_check.check_protected
    assert same_graph(fast, rewritten_graph(get_mode("CVM"), inputs, outputs, steps))


def test_a_mode_whose_passes_are_not_a_query_is_left_as_it_is():
    mode = Mode(linker="py", optimizer=MergeOptimizer())
    assert protection_check.with_fast_protection_check(mode) is mode
