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

from pytensor.graph.basic import Apply, Constant, Variable, equal_computations
from pytensor.graph.replace import clone_replace
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


def is_same_graph(var1: Variable, var2: Variable, givens=None) -> bool:
    """Whether ``var1`` and ``var2`` compute the same thing, once the substitutions
    ``givens`` (a dict or pairs, as :func:`pytensor.function` takes) are made in both.

    Written here: PyTensor 3.3 no longer has its own (``pytensor.graph.rewriting.utils``).

    >>> import pytensor.tensor as pt
    >>> x, y = pt.scalar("x"), pt.scalar("y")
    >>> is_same_graph(x + 1, x + 1), is_same_graph(x + 1, y + 1)
    (True, False)
    >>> is_same_graph(x + 1, y + 1, givens={x: y})
    True
    """
    if givens:
        pairs = givens.items() if hasattr(givens, "items") else givens
        var1, var2 = clone_replace([var1, var2], replace=dict(pairs))
    return equal_computations([var1], [var2])


__all__ = ["Apply", "Constant", "Variable", "ancestors", "inputs", "is_same_graph"]
