"""The compile mode chosen for a function that names none, from its graph's size."""

import logging

import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.api import mode_choice


def _graph(nodes):
    x = pt.vector("x")
    y = x
    for _ in range(nodes):
        y = pt.exp(y)
    return [x], [y]


@pytest.fixture(scope="module")
def large():
    """A graph of :data:`LARGE_GRAPH_NODES` nodes (built once: a second per build)."""
    return _graph(mode_choice.LARGE_GRAPH_NODES)


@pytest.fixture
def unconfigured(monkeypatch):
    if not pytensor.config.cxx:
        pytest.skip("no C compiler: the default mode is kept")
    monkeypatch.setattr(mode_choice, "configured", lambda: False)


def test_large_graph_compiles_op_by_op(unconfigured, large, caplog):
    inputs, roots = large
    with caplog.at_level(logging.INFO, "synkhronos"):
        assert mode_choice.choose(None, None, inputs, roots, "f") == mode_choice.LARGE_GRAPH_MODE
    assert f"f has {mode_choice.LARGE_GRAPH_NODES} nodes" in caplog.text
    inputs, roots = large
    one_less = [roots[0].owner.inputs[0]]
    assert mode_choice.choose(None, None, inputs, one_less, "f") is None


def test_a_named_mode_is_kept(unconfigured, large):
    inputs, roots = large
    assert mode_choice.choose("FAST_COMPILE", None, inputs, roots, "f") == "FAST_COMPILE"
    assert mode_choice.choose(None, "JAX", inputs, roots, "f") is None  # the backend's


def test_configured_mode_or_linker(large):
    with pytensor.config.change_flags(mode="FAST_RUN", linker="auto"):
        assert mode_choice.configured()
    with pytensor.config.change_flags(mode="Mode", linker="cvm"):
        assert mode_choice.configured()
    with pytensor.config.change_flags(mode="Mode", linker="auto"):
        assert not mode_choice.configured()
        inputs, roots = large
        expected = mode_choice.LARGE_GRAPH_MODE if pytensor.config.cxx else None
        assert mode_choice.choose(None, None, inputs, roots, "f") == expected
