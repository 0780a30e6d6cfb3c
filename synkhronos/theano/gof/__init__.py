"""Theano's ``theano.gof`` (the graph classes), now PyTensor's ``pytensor.graph``; the
:mod:`~synkhronos.theano.gof.graph` module holds Theano's graph functions."""

from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.op import Op
from pytensor.graph.type import Type

from synkhronos.theano.gof import graph

__all__ = ["Apply", "Constant", "FunctionGraph", "Op", "Type", "Variable", "graph"]
