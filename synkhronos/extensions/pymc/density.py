"""A PyMC model's log-density and its gradient, with the rows' terms split over the ranks.

:func:`logp_dlogp_function` builds what PyMC's ``model.logp_dlogp_function(ravel_inputs=True)``
builds (a function of the free variables' values on the unconstrained space, raveled into
one vector, returning the log-density and its gradient), and is called as that is, so that
PyMC's gradient-based step methods take it in its place. Inside, one
:func:`synkhronos.function` computes the terms of the rows (:mod:`.terms`): every rank
sums its share of the rows' terms and their gradient, and the ranks' sums are summed
("sum"); rank 0 adds the terms computed once (the priors, the Jacobians) from a plain
PyTensor function. The rows stay in shared memory (:func:`synkhronos.data`), each rank
reading the same rows at every call; ``pm.set_data`` gives a ``pm.Data`` container a new
value, which the next call copies there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.rewriting.basic import in2out
from pytensor.graph.rewriting.utils import rewrite_graph

import synkhronos as synk
from synkhronos.extensions.pymc.terms import ModelTerms, split_terms
from synkhronos.session import launch


def with_checks_rewritten(model: Any, outputs: list) -> list:
    """``outputs`` with PyMC's parameter checks made as its own compiled functions make
    them: a log-density of -inf where a check fails (or no check, where the model says
    ``check_bounds=False``)."""
    from pymc.logprob.utils import (
        local_check_parameter_to_ninf_switch,
        local_remove_check_parameter,
    )

    rewrite = local_check_parameter_to_ninf_switch if model.check_bounds else None
    rewrite = rewrite or local_remove_check_parameter
    return list(rewrite_graph(outputs, include=(), custom_rewrite=in2out(rewrite), clone=True))


def _cost_and_grads(model: Any, terms: list, grad_vars: list) -> list:
    cost = pt.add(*[t.sum() for t in terms]) if terms else pt.constant(0.0, dtype="float64")
    grads = pytensor.grad(cost, grad_vars, disconnected_inputs="ignore")
    return with_checks_rewritten(model, [cost, *grads])


class SplitDensity:
    """The split log-density and its gradient, called as PyMC's ``ValueGradFunction`` of
    raveled inputs is (its step methods read the attributes it has).

    Build it with :func:`logp_dlogp_function`. ``f(q)`` (``q`` the free variables' values
    raveled, in ``grad_vars``' order) returns ``(logp, dlogp)``.
    """

    _raveled_inputs = True  # PyMC's integrator calls _pytensor_function(q) then

    def __init__(
        self,
        model: Any,
        grad_vars: list,
        extra_vars: list,
        initial_point: dict,
        dtype: str,
        **compile_kwargs,
    ):
        self.dtype = dtype
        # A model that cannot be split is refused first: that needs no session.
        self.terms: ModelTerms = split_terms(model)
        self.session = launch.current()  # the function runs in this session only
        self._grad_vars = grad_vars
        self._shapes = [np.shape(initial_point[v.name]) for v in grad_vars]
        self._bounds = np.cumsum([0] + [int(np.prod(s)) for s in self._shapes])
        self._extra_vars_shared = {
            v.name: pytensor.shared(initial_point[v.name], v.name + "_shared__") for v in extra_vars
        }
        values = grad_vars + extra_vars
        self._extra_are_set = True
        row_outputs = _cost_and_grads(model, self.terms.row_terms, grad_vars)
        once_outputs = _cost_and_grads(model, self.terms.once_terms, grad_vars)
        self._rows = synk.function(
            inputs=[r.input for r in self.terms.rows],
            outputs=[(o, "sum") for o in row_outputs],
            bcast_inputs=values + [stand_in for _, stand_in in self.terms.others],
            on_unused_input="ignore",
            **compile_kwargs,
        )
        self._once = pytensor.function(
            values, once_outputs, on_unused_input="ignore", **compile_kwargs
        )
        self._seen = [r.value() for r in self.terms.rows]
        self._data = [synk.data(v) for v in self._seen]

    def _push_new_data(self) -> None:
        """Copy to shared memory the ``pm.Data`` rows that ``pm.set_data`` replaced."""
        for k, source in enumerate(self.terms.rows):
            value = source.value()
            if value is not self._seen[k]:
                self._data[k].set_value(value)
                self._seen[k] = value

    def _pytensor_function(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values = [
            np.asarray(q[a:b], dtype=v.dtype).reshape(shape)
            for v, a, b, shape in zip(
                self._grad_vars, self._bounds[:-1], self._bounds[1:], self._shapes, strict=True
            )
        ]
        values += [s.get_value(borrow=True) for s in self._extra_vars_shared.values()]
        self._push_new_data()
        others = [shared.get_value(borrow=True) for shared, _ in self.terms.others]
        rows = self._rows(*self._data, *values, *others)
        once = self._once(*values)
        logp = np.asarray(rows[0] + once[0], dtype=self.dtype)
        grads = [np.ravel(r + o) for r, o in zip(rows[1:], once[1:], strict=True)]
        return logp, np.concatenate(grads).astype(self.dtype, copy=False)

    def set_extra_values(self, extra_vars: dict) -> None:
        """Set the values of the variables the gradient is not taken of (a point's)."""
        for name, shared in self._extra_vars_shared.items():
            shared.set_value(extra_vars[name], borrow=True)

    def get_extra_values(self) -> dict:
        """The values of the variables the gradient is not taken of."""
        return {name: s.get_value() for name, s in self._extra_vars_shared.items()}

    def __call__(self, grad_vars, *, extra_vars: dict | None = None):
        """``(logp, dlogp)`` at ``grad_vars``: the raveled values (an array, a
        ``RaveledVars`` or a one-element list of either), as PyMC's function takes them."""
        if extra_vars:
            self.set_extra_values(extra_vars)
        if isinstance(grad_vars, list | tuple):
            (grad_vars,) = grad_vars
        return self._pytensor_function(np.asarray(getattr(grad_vars, "data", grad_vars)))


def logp_dlogp_function(
    model: Any = None,
    grad_vars: list | None = None,
    *,
    initial_point: dict | None = None,
    dtype: str | None = None,
    **compile_kwargs,
) -> SplitDensity:
    """The log-density of ``model`` and its gradient, the rows' terms split over the ranks.

    Call :func:`synkhronos.fork` first. The result is called as PyMC's
    ``model.logp_dlogp_function(ravel_inputs=True)`` is, with the same values.

    Parameters
    ----------
    model : pymc.Model, optional
        Default: the model of the ``with`` block.
    grad_vars : list, optional
        The variables (or their values) the gradient is taken of, in the order of the
        raveled vector; default: every continuous free variable, as PyMC's.
    initial_point : dict, optional
        The other variables' values, and the shapes to unravel by; default: the model's
        initial point.
    dtype : str, optional
        Of the returned values; default: ``pytensor.config.floatX``.
    **compile_kwargs
        Passed to :func:`synkhronos.function` and :func:`pytensor.function`.

    Returns
    -------
    SplitDensity

    Raises
    ------
    synkhronos.extensions.pymc.terms.RowsNotSplittable
        If a term of the rows does not factor over them, naming the term.
    """
    import pymc as pm
    from pymc.util import get_value_vars_from_user_vars

    model = pm.modelcontext(model)
    if grad_vars is None:
        grad_vars = model.continuous_value_vars
    else:
        grad_vars = get_value_vars_from_user_vars(grad_vars, model)
    if initial_point is None:
        initial_point = model.initial_point(0)
    extra_vars = [v for v in model.value_vars if v not in grad_vars]
    return SplitDensity(
        model,
        list(grad_vars),
        extra_vars,
        initial_point,
        dtype or pytensor.config.floatX,
        **compile_kwargs,
    )


__all__ = ["SplitDensity", "logp_dlogp_function", "with_checks_rewritten"]
