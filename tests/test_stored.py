"""Phase splits kept on disk: analysed once, loaded onto a later graph of the same key,
analysed again when the file is damaged (no fork; the store is a temporary folder)."""

import logging

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.traversal import graph_inputs

from synkhronos.api.split import stored


def _regression():
    """A fresh graph of the same key at each call: a least-squares step."""
    x, y = pt.matrix("x"), pt.vector("y")
    w = pytensor.shared(np.linspace(-1.0, 1.0, 3), name="w")
    loss = pt.mean((pt.dot(x, w) - y) ** 2)
    return [x, y], [loss], [(w, w - 0.1 * pt.grad(loss, w))]


def _split(sources, outputs, updates):
    return stored.split_phases_stored(sources, outputs, [True], updates, True, True, 1)


@pytest.fixture
def store(monkeypatch, tmp_path):
    """The store in ``tmp_path``; counts the analyses."""
    analyses = []
    analyse = stored.split_phases

    def counted(*args):
        analyses.append(args)
        return analyse(*args)

    monkeypatch.setattr(stored, "split_phases", counted)
    monkeypatch.setattr(stored, "stored_path", lambda key, material, suffix: tmp_path / "s.split")
    return tmp_path / "s.split", analyses


def test_analysed_once_then_loaded_onto_the_new_graph(store):
    path, analyses = store
    first = _split(*_regression())
    assert len(analyses) == 1 and path.exists()
    sources, outputs, updates = _regression()
    again = _split(sources, outputs, updates)
    assert len(analyses) == 1  # loaded, not analysed
    assert again.outputs == first.outputs and len(again.frontier) == len(first.frontier)
    assert again.weighted == first.weighted and len(again.rounds) == len(first.rounds)
    roots = set(graph_inputs([*again.frontier, *again.targets]))
    w = updates[0][0]
    assert sources[0] in roots and w in roots  # this graph's own inputs and variables
    assert roots.isdisjoint(graph_inputs([*first.frontier, *first.targets]))


def test_a_damaged_file_is_analysed_and_stored_again(store, caplog):
    path, analyses = store
    _split(*_regression())
    path.write_bytes(b"not a split")
    with caplog.at_level(logging.WARNING, "synkhronos"):
        split = _split(*_regression())
    assert "unreadable" in caplog.text and len(analyses) == 2
    assert split is not None and path.read_bytes() != b"not a split"
    _split(*_regression())
    assert len(analyses) == 2


def test_a_split_not_stored_is_still_returned(store, monkeypatch, caplog):
    _, analyses = store

    def refuse(path, data):
        raise OSError("read-only")

    monkeypatch.setattr(stored, "write_whole", refuse)
    with caplog.at_level(logging.WARNING, "synkhronos"):
        split = _split(*_regression())
    assert split is not None and split.outputs == [0]
    assert "not stored (read-only)" in caplog.text
