"""Theano's ``theano.gof.graph``: graph classes and traversals, on ``pytensor.graph``.

The traversals keep Theano's order (a left-recursive depth-first search: an expression's
inputs in the order it uses them), where PyTensor's ``graph_inputs`` walks right to left;
Lasagne's ``get_all_params`` lists parameters in Theano's order.

>>> import pytensor.tensor as pt
>>> x, y, z = pt.scalar("x"), pt.scalar("y"), pt.scalar("z")
>>> [v.name for v in inputs([x * y + z])]
['x', 'y', 'z']
"""

from collections.abc import Iterable

from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.rewriting.utils import is_same_graph
from pytensor.graph.traversal import walk


def ancestors(
    variable_list: Iterable[Variable], blockers: Iterable[Variable] | None = None
) -> list[Variable]:
    """The variables of the graphs of ``variable_list`` (not beyond ``blockers``), in
    the order of a left-recursive depth-first search; as in Theano, the search starts
    from the list's last variable (Lasagne passes its expressions reversed)."""
    blockers = set(blockers or ())

    def expand(var):
        if var.owner is not None and var not in blockers:
            return reversed(var.owner.inputs)
        return None

    return list(walk(variable_list, expand, bfs=False))


def inputs(
    variable_list: Iterable[Variable], blockers: Iterable[Variable] | None = None
) -> list[Variable]:
    """The inputs of the graphs of ``variable_list`` (their variables without an owner,
    the search going no further than ``blockers``), in :func:`ancestors`' order."""
    return [v for v in ancestors(variable_list, blockers) if v.owner is None]


__all__ = ["Apply", "Constant", "Variable", "ancestors", "inputs", "is_same_graph"]
