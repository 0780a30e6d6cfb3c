"""Theano's ``theano.gof.graph``: graph classes and traversals, on ``pytensor.graph``.

>>> import pytensor.tensor as pt
>>> x, y = pt.scalar("x"), pt.scalar("y")
>>> [v.name for v in inputs([x * y + x])]
['x', 'y']
"""

from collections.abc import Iterable

from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.traversal import ancestors, graph_inputs


def inputs(variables: Iterable[Variable], blockers: Iterable[Variable] | None = None
           ) -> list[Variable]:
    """The inputs of the graphs of ``variables`` (variables without an owner, or in
    ``blockers``), in the order a depth-first walk meets them."""
    return list(graph_inputs(variables, blockers))


__all__ = ["Apply", "Constant", "Variable", "ancestors", "inputs"]
