"""A training function's plain graph, for a session of one rank.

On one rank a :class:`~synkhronos.api.training.TrainingFunction`'s split into phases
(row phase, all-reduce, reduced phase) buys nothing: the one-device answer is the
function's line itself. :class:`PlainGraph` runs it as a :class:`~synkhronos.Function`
of the user's graph, as ``pytensor.function`` compiles the line (with Numba's fast-math
flags, which the ranks' functions go without: there is no other rank's code to agree
with, and without them the MLP tutorial's step took 1.4x as long): the same outputs,
updates and givens on the same shared variables (the random generators among them
advance as the phases' would), with the Function's own handling of ``batch``,
``batch_s``, ``output_subset``, timelines and checks. Where the givens select the
minibatch from shared data (:mod:`synkhronos.api.given_rows`), the graph keeps the
user's givens, so that it selects the rows itself.

It is used where the session is one rank of one node, compiled in a mode other than
JAX's (JAX slices by static bounds only: the givens' selection by an index input is
the phases' there), and the call asks ``num_slices=1`` (slices combine an update's
values; the phases compute the whole batch's).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from synkhronos.api.calls import OneRankCall, exact_kind
from synkhronos.api.collectives import checked_value
from synkhronos.api.functions import Function, FunctionParts
from synkhronos.api.planning import CallOptions, label
from synkhronos.api.selected import GivenMinibatch
from synkhronos.rank.compiled import is_jax
from synkhronos.transport.shared_arrays import Data


class PlainGraph:
    """A training function's line as one :class:`~synkhronos.Function`, built with the
    training function where it runs (a session of one rank of one node, a mode other
    than JAX's), so that the session's functions come in the same order at every run
    (checkpoints match them by it).

    Parameters
    ----------
    session : Session
        The session the training function is built in.
    parts : FunctionParts
        The line's parts (:func:`line_parts`): its inputs, outputs (with the training
        function's reduce ops), updates and givens, as the user wrote them (the givens
        may be made in the graphs already: the same graph).
    mode
        The compile mode the training function's phases took.
    """

    def __init__(self, session, parts: FunctionParts, mode) -> None:
        self._function: Function | None = None
        compiler = mode if mode is not None else session.backend.mode  # None: the backend's
        if session.alone and not is_jax(compiler):
            alone = replace(parts, mode=mode, counts_rows=False, handover=[], fast_math=True)
            self._function = Function(session, replace(alone, same_on_every_rank=[]))
        # Per broadcast scalar (the tutorials' index): its position, its variable, and the
        # Data each call's value is written into. The same Data at every call make a call
        # like the last one a kept call (a value would be planned anew at every call).
        self._held = [
            (i, var, Data(np.zeros((), var.dtype), var=var, name=str(var)))
            for i, var in enumerate(parts.bcast_inputs)
            if var.type.ndim == 0 and self._function is not None
        ]
        self._n, self._count = len(parts.inputs), len(parts.inputs) + len(parts.bcast_inputs)
        self._what = parts.what
        self._downcast = parts.function_kwargs.get("allow_input_downcast") or None

    def runs(self, options: CallOptions) -> bool:
        """Whether a call with ``options`` runs the plain graph."""
        return self._function is not None and options.num_slices == 1

    def __call__(self, args: tuple, options: CallOptions):
        """The call of the line on rank 0 alone, with ``args`` in the training function's
        order and its options; its outputs as the training function returns them."""
        assert self._function is not None  # runs() said so
        if self._held and len(args) == self._count:  # (a wrong count: the call's error)
            args = self._in_held(args)
        if options.plain:
            return self._function(*args)
        return self._function(
            *args,
            batch=options.batch,
            batch_s=options.batch_s,
            num_slices=options.num_slices,  # 1, or an equal value its checks refuse
            output_subset=options.output_subset,
        )

    def fast(self, args: tuple) -> OneRankCall | None:
        """The fast path of calls like one just run with ``args`` and no option: the
        plain Function's (:attr:`Function.fast <synkhronos.Function>`), each broadcast
        scalar written into its held Data first; None where there is none, or a scalar
        was given as a value of a kind it cannot take (:func:`~synkhronos.api.calls.exact_kind`)."""
        function = self._function
        if function is None or function.fast is None or len(args) != self._count:
            return None
        scalars = []
        for i, var, data in self._held:
            k = self._n + i
            if isinstance(args[k], Data):  # the kept call matches it itself
                continue
            kind = exact_kind(var, args[k])
            if kind is None:
                return None
            scalars.append((k, data, kind))
        return function.fast.with_scalars(scalars)

    def _in_held(self, args: tuple) -> tuple:
        """``args`` with each broadcast scalar's value checked as a call checks it and
        written into its held Data."""
        values = list(args)
        for i, var, data in self._held:
            k = self._n + i
            if not isinstance(values[k], Data):
                what = f"{self._what}, {label(var, i, 'broadcast input')}"
                data.data[...] = checked_value(var, values[k], what, self._downcast)
                values[k] = data
        return tuple(values)


def line_parts(parts: FunctionParts, given: GivenMinibatch | None) -> FunctionParts:
    """The line's parts for :class:`PlainGraph`: a training function's ``parts``, or
    where its givens select the minibatch (``given``), the parts as written (the givens
    select the rows by the broadcast inputs), with ``parts``' reduce ops."""
    if given is None:
        return parts
    whole = given.whole  # its first broadcast input: the selected rows
    return replace(
        whole, bcast_inputs=whole.bcast_inputs[1:], givens=given.rows.givens, ops=list(parts.ops)
    )


__all__ = ["PlainGraph", "line_parts"]
