"""Functions whose givens select their minibatch from shared data by broadcast inputs
(:mod:`synkhronos.api.given_rows`, the Theano tutorials' ``train_set_x[index * B:(index +
1) * B]``), where the minibatch is computed whole on every rank rather than split: a
:class:`SelectedWhole` function (nothing trains, or the split cannot be exact), and a
training function's :class:`GivenMinibatch` for a call of fewer rows than ranks. Every
rank then computes one device's call, so its random generators must draw alike:
:func:`shipped_apart` tells which of them an earlier function shipped for each rank to
draw its own numbers from.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.random.type import RandomType

from synkhronos.api.functions import BaseFunction, Function, FunctionParts
from synkhronos.api.given_rows import GivenRows
from synkhronos.api.planning import CallOptions, check_num_slices
from synkhronos.transport.callplan import CallPlan

# The random generators some function listed to draw with rank 0's state on every rank
# (FunctionParts.same_on_every_rank): shipped with it, or with an earlier function that
# listed them too, they stay alike.
_LISTED_ALIKE: weakref.WeakSet = weakref.WeakSet()


def shipped_apart(session, generators: Sequence) -> list:
    """Of ``generators``, those an earlier function shipped for each rank to draw its
    own numbers from (reseeded per rank); then lists them all as alike."""
    apart = [
        g
        for g in generators
        if session.state.registry.index(g) is not None and g not in _LISTED_ALIKE
    ]
    _LISTED_ALIKE.update(generators)
    return apart


def random_generators(parts: FunctionParts) -> list:
    """The random generators the graph of ``parts`` draws from."""
    roots = [*parts.outputs, *(u for _, u in parts.updates), *(g for _, g in parts.givens)]
    return [
        v
        for v in graph_inputs(roots)
        if isinstance(v, SharedVariable) and isinstance(v.type, RandomType)
    ]


@dataclass
class GivenMinibatch:
    """A training function's minibatch that its givens select from shared data
    (:mod:`synkhronos.api.given_rows`), and the function's parts with the selected rows
    a first broadcast input: a call whose minibatch has fewer rows than ranks runs them
    whole on every rank (as one device; the ranks draw alike), for a rank without rows
    cannot take part in the split."""

    rows: GivenRows
    whole: FunctionParts
    function: Function | None = None

    def run_whole(self, session, rows, args: tuple, options: CallOptions):
        """The call of the parts as written, every rank computing it whole, with the
        call's ``output_subset``; rank 0's outputs (every rank's are the same). Its
        ``num_slices`` is checked as any call's, and slices nothing: the selected rows
        travel as a broadcast input, so that no rank has rows to slice (each computes
        the minibatch, of fewer rows than ranks, in one piece)."""
        check_num_slices(options.num_slices)
        if self.function is None:
            generators = random_generators(self.whole)
            # Explicit: a rank keeps the default update the training function shipped,
            # which reads that function's own copy of the inputs.
            written = {id(v) for v, _ in self.whole.updates}
            drawn = [
                (g, g.default_update)
                for g in generators
                if getattr(g, "default_update", None) is not None and id(g) not in written
            ]
            shipped_apart(session, generators)  # the training function's: alike
            parts = replace(
                self.whole,
                ops=[None] * len(self.whole.outputs),
                updates=[*self.whole.updates, *drawn],
                update_ops=[*self.whole.update_ops, *(["avg"] * len(drawn))],
                same_on_every_rank=generators,
            )
            self.function = Function(session, parts)
        return self.function(rows, *args, output_subset=options.output_subset)


def refuse_row_options(what: str, options: CallOptions) -> None:
    """``ValueError`` where a call whose givens select its minibatch names rows."""
    if options.batch is not None or options.batch_s is not None:
        raise ValueError(f"{what}: its givens select the minibatch; batch and batch_s do not apply")


class SelectedWhole(BaseFunction):
    """A function whose givens select its minibatch from shared data, computed whole on
    every rank (no update needs a split, or the split could not be exact): its
    :class:`~synkhronos.Function` takes the selected rows' numbers, computed on rank 0
    for each call, as a first broadcast input (:mod:`synkhronos.api.given_rows`)."""

    def __init__(self, session, parts: FunctionParts, whole: FunctionParts, rows: GivenRows):
        self.function = Function(session, whole)
        super().__init__(session, parts, parts.spec(-1, self.function.mode))
        self._rows = rows

    def __repr__(self) -> str:
        return f"<synkhronos.Function {self.name or ''}>".replace(" >", ">")

    @property
    def mode(self):
        """The compile mode (its Function's)."""
        return self.function.mode

    def get_shared(self) -> list:
        """The shared variables the function uses."""
        return self.function.get_shared()

    def __call__(self, *args, **kwargs):
        """Run on every rank, as :meth:`synkhronos.Function.__call__` (no ``batch`` or
        ``batch_s``: the givens select the rows)."""
        self._check_session()
        args, options = self._arguments(args, kwargs)
        refuse_row_options(self._what, options)
        return self.function(
            self._rows.rows(args),
            *args,
            num_slices=options.num_slices,
            output_subset=options.output_subset,
        )

    def chain_entries(self) -> list:
        return [self.function]

    def plan(
        self, session, args, options: CallOptions, every_rank_rows=False, selected=None
    ) -> CallPlan:
        refuse_row_options(self._what, options)
        rows = self._rows.rows(args) if selected is None else selected
        return self.function.plan(session, (rows, *args), options)

    def outputs_from(self, results: list, output_subset: Sequence[int] | None):
        return results[0]


__all__ = [
    "GivenMinibatch",
    "SelectedWhole",
    "random_generators",
    "refuse_row_options",
    "shipped_apart",
]
