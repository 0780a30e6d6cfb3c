"""Theano's names on PyTensor: a Theano-era script ports by ``import theano`` →
``from synkhronos import theano``.

PyTensor is Theano's continuation; most of Theano's names live on in it and are
re-exported here at their Theano paths. The names PyTensor dropped or moved are mapped
to their PyTensor or synkhronos equivalents with Theano's argument order and defaults:
``theano.tensor.nnet`` (activations, cross-entropies, ``conv2d`` with Theano's filter
flip), ``theano.tensor.signal.pool``, ``theano.sandbox.rng_mrg.MRG_RandomStreams``,
``theano.tensor.shared_randomstreams``, ``theano.gpuarray`` (GPUs come from
:func:`synkhronos.fork`), ``theano.gof``, ``theano.misc.pkl_utils``. ``docs/porting.rst``
lists every name.

Submodules are real modules, so ``from synkhronos.theano import tensor as T`` and
``from synkhronos.theano.tensor.nnet import conv2d`` work as their Theano forms did;
``printing``, ``ifelse``, ``gradient``, ``compile`` and ``scalar`` are PyTensor's own
modules under their Theano names.

>>> from synkhronos import theano
>>> T = theano.tensor
>>> x = T.matrix("x")
>>> f = theano.function([x], T.nnet.relu(x).sum())
>>> float(f([[-1.0, 2.0]]))
2.0
"""

import importlib
import sys

import pytensor
from pytensor import (
    Lop,
    Mode,
    OpFromGraph,
    Out,
    Rop,
    compile,
    config,
    dprint,
    get_mode,
    grad,
    gradient,
    printing,
    scalar,
    scan,
    shared,
)
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.op import Op
from pytensor.graph.replace import clone_replace
from pytensor.graph.type import Type

# pytensor.ifelse, the attribute, is the function; Theano's theano.ifelse is the module.
ifelse = importlib.import_module("pytensor.ifelse")

# Theano paths whose module PyTensor keeps under the same name: importable from here.
for _name, _module in {
    "compile": compile,
    "gradient": gradient,
    "ifelse": ifelse,
    "printing": printing,
    "scalar": scalar,
}.items():
    sys.modules[f"{__name__}.{_name}"] = _module

from synkhronos.api import mode_choice  # noqa: E402 - after the aliases
from synkhronos.api.builders import In, WithDefaults  # noqa: E402 - after the aliases
from synkhronos.theano import gof, gpuarray, misc, sandbox, tensor  # noqa: E402 - after the aliases


def function(inputs, outputs=None, mode=None, updates=None, *args, **kwargs):
    """Theano's ``theano.function``: ``pytensor.function`` with the same arguments, except
    that with no mode named (in the call or in PyTensor's configuration) a large graph
    compiles op by op, as Theano compiled it, rather than in PyTensor's default mode
    (Numba), which compiles a whole graph at once: for ResNet-50's training step, more than
    10 minutes. The rule is :func:`synk.function <synkhronos.function>`'s
    (:mod:`synkhronos.api.mode_choice`).

    Examples
    --------
    >>> x = tensor.matrix("x")
    >>> f = function([x], (x**2).sum())
    >>> float(f([[1.0, 2.0]]))
    5.0
    """
    if mode is None:
        if isinstance(updates, dict):
            values = list(updates.values())
        else:
            values = [value for _, value in updates or []]
        if isinstance(outputs, dict):
            wanted = list(outputs.values())
        else:
            wanted = outputs if isinstance(outputs, list | tuple) else [outputs]
        roots = [getattr(o, "variable", o) for o in wanted if o is not None] + values
        mode = mode_choice.choose(None, None, [], roots, "theano.function's graph")
    compiled = pytensor.function(inputs, outputs, mode, updates, *args, **kwargs)
    if any(getattr(e, "default", None) is not None for e in inputs):
        return WithDefaults(compiled, list(inputs))  # Theano's In(var, value=...)
    return compiled


def clone(output, replace=None, strict: bool = True, share_inputs: bool = True):
    """Theano's ``theano.clone``: a copy of ``output``'s graph, with ``replace`` applied.

    Parameters
    ----------
    output : Variable or list of Variable
    replace : dict, optional
        Variables to substitute (old → new).
    strict : bool
        New variables must have the old ones' types.
    share_inputs : bool
        Keep the graph's inputs and shared variables; with False they are cloned too (a
        cloned shared variable is a new variable on the same storage, as in Theano).

    Examples
    --------
    >>> import numpy as np
    >>> w = shared(np.ones(2))
    >>> w2 = clone(w, share_inputs=False)
    >>> w.set_value(np.zeros(2))
    >>> w2 is w, w2.get_value().tolist()
    (False, [0.0, 0.0])
    """
    return clone_replace(output, replace, rebuild_strict=strict, copy_inputs_over=share_inputs)


__version__ = pytensor.__version__

__all__ = [
    "Apply",
    "Constant",
    "FunctionGraph",
    "In",
    "Lop",
    "Mode",
    "Op",
    "OpFromGraph",
    "Out",
    "Rop",
    "Type",
    "Variable",
    "clone",
    "compile",
    "config",
    "dprint",
    "function",
    "get_mode",
    "gof",
    "gpuarray",
    "grad",
    "gradient",
    "ifelse",
    "misc",
    "printing",
    "sandbox",
    "scalar",
    "scan",
    "shared",
    "tensor",
]
