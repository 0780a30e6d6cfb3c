"""What a synkhronos function is built from: :func:`synkhronos.function`'s arguments,
checked and sorted (:class:`FunctionParts`), and the shared variables a call of it reads
and writes (:func:`shared_reads_writes`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import graph_inputs

from synkhronos.api.collectives import travels
from synkhronos.api.planning import label
from synkhronos.rank.graphs import (
    FAST_MATH,
    GraphSpec,
    compile_settings,
    not_updated,
    with_default_updates,
)
from synkhronos.transport.reduction import check_output_op, check_update_op


def pairs_of(mapping, what: str) -> list[tuple]:
    if mapping is None:
        return []
    items = mapping.items() if hasattr(mapping, "items") else mapping
    pairs = [tuple(p) for p in items]
    if any(len(p) != 2 for p in pairs):
        raise TypeError(f"{what} must be a dict or a list of (variable, value) pairs")
    return pairs


def update_pairs(updates) -> tuple[list[tuple], list]:
    """``updates`` (a dict, or pairs and ``(var, update, op)`` triples) as pairs and the op
    combining each over slices ("avg" for pairs)."""
    if updates is None:
        return [], []
    items = updates.items() if hasattr(updates, "items") else updates
    pairs, ops = [], []
    for i, item in enumerate(items):
        item = tuple(item)
        if len(item) not in (2, 3):
            raise TypeError(
                "updates must be a dict or a list of (variable, update) pairs or "
                "(variable, update, op) triples"
            )
        op = item[2] if len(item) == 3 else "avg"
        check_update_op(op, f"update {i} ({item[0]})")
        pairs.append(item[:2])
        ops.append(op)
    return pairs, ops


def parse_outputs(outputs) -> tuple[list, list, list, bool]:
    """Split ``outputs`` into variables, reduce ops and whether each op was given; also
    say whether ``outputs`` was a single one."""

    def is_pair(o):
        return (
            isinstance(o, tuple)
            and len(o) == 2
            and isinstance(o[0], Variable)
            and not isinstance(o[1], Variable)
        )

    if outputs is None:
        return [], [], [], False
    single = isinstance(outputs, Variable) or is_pair(outputs)
    entries = [outputs] if single else list(outputs)
    variables, ops, explicit = [], [], []
    for i, entry in enumerate(entries):
        var, op = entry if is_pair(entry) else (entry, "avg")
        if not isinstance(var, Variable):
            raise TypeError(f"output {i} is not a PyTensor variable: {var!r}")
        check_output_op(op, f"output {i} ({var})")
        variables.append(var)
        ops.append(op)
        explicit.append(is_pair(entry))
    return variables, ops, explicit, single


def shared_reads_writes(parts: FunctionParts, sliceable_ids: set[int]) -> tuple[list, list]:
    """The shared variables a call of ``parts`` reads that rank 0 broadcasts when the
    program changed them (tensors, less the sliceable ones, each rank's own rows, and what
    the call hands over between its phases), and those a call writes (its updates' and
    the default updates' targets)."""
    roots = [*parts.outputs, *(u for _, u in parts.updates), *(g for _, g in parts.givens)]
    applied = with_default_updates(roots, not_updated(parts.updates))
    shared = [v for v in graph_inputs(applied) if isinstance(v, SharedVariable)]
    own = sliceable_ids | {id(v) for v in [*parts.sliceable, *parts.handover]}
    reads = [v for v in shared if id(v) not in own and travels(v)]
    writes = [v for v, _ in parts.updates]
    writes += [v for v in shared if getattr(v, "default_update", None) is not None]
    return reads, writes


@dataclass(kw_only=True)
class FunctionParts:
    """What a :class:`~synkhronos.api.functions.Function` is made of:
    :func:`synkhronos.function`'s arguments, checked and sorted (:meth:`parse`), or a
    training function's phase."""

    inputs: list = field(default_factory=list)
    bcast_inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    explicit: list = field(default_factory=list)  # per output: its reduce op was given
    single: bool = False
    updates: list = field(default_factory=list)  # (variable, value) pairs
    update_ops: list = field(default_factory=list)  # per update: its op over num_slices
    givens: list = field(default_factory=list)
    sliceable: list = field(default_factory=list)
    name: str | None = None
    mode: Any = None
    function_kwargs: dict = field(default_factory=dict)
    # The last broadcast input is the call's whole row count, which the plan writes
    # (a training function's row phase: PhaseSplit.rows).
    counts_rows: bool = False
    # Shared variables that each call writes before a later step of the call reads them
    # (a training function's, from one phase to the next): never saved, loaded or
    # compared between ranks.
    handover: list = field(default_factory=list)
    # Random generators every rank draws from with rank 0's state (GraphSpec's).
    same_on_every_rank: list = field(default_factory=list)
    # Compiled with PyTensor's fast-math flags, as pytensor.function compiles: only where
    # rank 0 runs it alone (plain_graph), since fresh and cached code then differ by an ulp.
    fast_math: bool = False

    @classmethod
    def parse(
        cls,
        *,
        inputs=(),
        outputs=None,
        bcast_inputs=None,
        updates=None,
        givens=None,
        sliceable=None,
        **rest,
    ) -> FunctionParts:
        """The parts of :func:`synkhronos.function`'s arguments, as it takes them
        (``sliceable``: its ``sliceable_shareds``; ``rest``: ``name``, ``mode``,
        ``function_kwargs``); ``TypeError`` for an input that cannot be one."""
        inputs, bcast_inputs = list(inputs), list(bcast_inputs or ())
        for i, var in enumerate(inputs + bcast_inputs):
            if not isinstance(var, Variable) or var.owner is not None:
                raise TypeError(f"input {i} must be a free PyTensor variable, got {var!r}")
            if isinstance(var, SharedVariable):
                raise TypeError(
                    f"input {i} is a shared variable; shared variables are used "
                    f"implicitly (see sliceable_shareds)"
                )
        for i, var in enumerate(inputs):
            if var.ndim < 1:
                raise TypeError(
                    f"{label(var, i, 'input')} is scattered along axis 0, so it "
                    f"needs at least one dimension; pass scalars in bcast_inputs"
                )
        sliceable = list(sliceable or ())
        for i, var in enumerate(sliceable):
            # getattr: a shared random generator has no dimensions to give
            if not isinstance(var, SharedVariable) or getattr(var.type, "ndim", 0) < 1:
                raise TypeError(
                    f"sliceable_shareds[{i}] must be a shared variable with at least one dimension"
                )
        variables, ops, explicit, single = parse_outputs(outputs)
        pairs, update_ops = update_pairs(updates)
        return cls(
            inputs=inputs,
            bcast_inputs=bcast_inputs,
            outputs=variables,
            ops=ops,
            explicit=explicit,
            single=single,
            updates=pairs,
            update_ops=update_ops,
            givens=pairs_of(givens, "givens"),
            sliceable=sliceable,
            **rest,
        )

    @property
    def what(self) -> str:
        return f"synkhronos function {self.name!r}" if self.name else "synkhronos function"

    def spec(self, fid: int, mode) -> GraphSpec:
        """The graph every rank compiles, numbered ``fid``, in ``mode``."""
        return GraphSpec(
            fid,
            self.name,
            list(self.inputs),
            list(self.bcast_inputs),
            list(self.outputs),
            list(self.ops),
            list(self.updates),
            list(self.givens),
            list(self.sliceable),
            mode,
            list(self.update_ops),
            dict(self.function_kwargs),
            same_on_every_rank=list(self.same_on_every_rank),
            handover=list(self.handover),
            settings=(*compile_settings(), *(FAST_MATH if self.fast_math else ())),
        )
