"""Checking that every rank holds the same state: :func:`verify` and :class:`RanksDisagree`.

Data-parallel training keeps one copy of the parameters (and optimizer state) per rank,
and every rank must hold the same bits; a rank that drifts (another compile of an update,
a reduction left inside one node) gives no error by itself. :func:`verify` asks every rank
for a digest of each shared variable's value (the digests :func:`synkhronos.save` compares,
:func:`synkhronos.rank.checkpoint_part.report`), over every node under MPI, and raises
:class:`RanksDisagree` where they differ. ``synk.fork(verify_every=N)`` runs it after
every ``N``-th function call or chain.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from synkhronos.api import routines
from synkhronos.api.checkpoints import handed_over, per_rank_results
from synkhronos.api.collectives import registered, send_changes, travels
from synkhronos.rank import checkpoint_part
from synkhronos.rank.checkpoint_part import kept_per_rank
from synkhronos.session import launch
from synkhronos.session.session import set_periodic_check
from synkhronos.transport.nodes import current as current_nodes

__all__ = ["Disagreement", "RanksDisagree", "verify"]


@dataclass(frozen=True)
class Disagreement:
    """One shared variable whose value differs between ranks.

    Attributes
    ----------
    name : str
        The variable's name and type.
    ranks : list of int
        The global ranks whose value differs from global rank 0's.
    largest : float or None
        The largest absolute element-wise difference from rank 0's value, over those ranks
        (NaN where one side is NaN and the other not); None where a shape or dtype differs.
    shapes : list of tuple
        Every global rank's shape of the value.
    """

    name: str
    ranks: list[int]
    largest: float | None
    shapes: list[tuple[int, ...]]

    def describe(self) -> str:
        """One line: the variable, the ranks, the largest difference (or the shapes)."""
        differs = (
            f"largest |difference| {self.largest:.6g}"
            if self.largest is not None
            else f"shapes or dtypes differ: {self.shapes}"
        )
        return f"{self.name} differs from rank 0 on rank(s) {self.ranks}; {differs}"


class RanksDisagree(RuntimeError):
    """Ranks hold different values of shared variables that should be equal everywhere.

    Attributes
    ----------
    disagreements : list of Disagreement
        One per variable, in registry order.
    """

    def __init__(self, disagreements: list[Disagreement]):
        self.disagreements = disagreements
        lines = "\n  ".join(d.describe() for d in disagreements)
        super().__init__(
            f"the ranks disagree on {len(disagreements)} shared variable(s):\n  {lines}"
        )


def _largest(reference: np.ndarray, other: np.ndarray) -> float | None:
    """The largest absolute difference of two values, None if their layout differs."""
    if reference.shape != other.shape or reference.dtype != other.dtype:
        return None
    if reference.size == 0:
        return 0.0
    wide = np.complex128 if reference.dtype.kind == "c" else np.float64
    a, b = np.atleast_1d(reference.astype(wide)), np.atleast_1d(other.astype(wide))
    gaps = np.abs(a - b)
    # Equal bits are no difference, NaN against NaN included; NaN against a number is NaN.
    gaps[(a == b) | (np.isnan(a) & np.isnan(b))] = 0.0
    return float(np.max(gaps)) if not np.isnan(gaps).any() else float("nan")


def _everyone(local: list, world) -> list:
    """Every global rank's items, rank order: this node's ``local`` (one per local rank),
    joined with the other nodes' under MPI."""
    if world.n_nodes == 1:
        return local
    return [item for node in world.mpi.allgather(local) for item in node]


def verify(per_rank: Iterable = ()) -> None:
    """Raise :class:`RanksDisagree` unless every rank of every node holds the same value of
    every shared variable of the session's functions.

    Every function built so far is distributed first, and the changes the program made to
    rank 0's values since synkhronos last left them (a ``set_value`` after the last call)
    are broadcast, as the next call would broadcast them: a change pending is no
    disagreement. Each rank digests its values (no
    values travel unless some differ; then those are fetched to name the largest
    difference). Not compared: sliceable shared variables (each rank holds its own rows),
    random generators (each rank draws its own numbers), shared variables with a
    ``default_update`` (each rank updates them from its own rows, as batch-norm averages),
    those in ``per_rank`` (the same ones :func:`synkhronos.save` writes per rank), and
    what a training function hands from one phase to the next within a call (every call
    writes it before it is read; :func:`synkhronos.save` leaves it out).

    Parameters
    ----------
    per_rank : iterable of shared variables or names, optional
        Variables the program keeps different on each rank on purpose.

    Raises
    ------
    RanksDisagree
        Naming each variable that differs, the global ranks that differ from rank 0, and
        the largest absolute difference (or every rank's shape where the shapes differ).

    Examples
    --------
    >>> synk.verify()                                    # doctest: +SKIP
    """
    session = launch.current()
    session.distribute()  # every function built so far: its variables get their index
    variables = session.state.registry.variables
    skipped = {i for i, var in enumerate(variables) if id(var) in session.sliceable_ids}
    skipped |= {i for i, var in enumerate(variables) if kept_per_rank(var)}
    skipped |= set(handed_over(session))
    if per_rank:
        skipped |= set(registered(session, list(per_rank))[1].tolist())
    send_changes(session, [v for i, v in enumerate(variables) if i not in skipped and travels(v)])
    world = current_nodes()
    reports = routines.run(checkpoint_part.report, np.array(sorted(skipped), np.int64))
    digests = np.stack(_everyone([digests for digests, _ in reports], world))
    differing = np.flatnonzero((digests != digests[0]).any(axis=0)).tolist()
    if not differing:
        return
    values = _everyone(per_rank_results(session, checkpoint_part.local_values, differing), world)
    disagreements = []
    for k, index in enumerate(differing):
        held = [np.asarray(rank_values[k]) for rank_values in values]
        ranks = [r for r in range(len(held)) if digests[r, index] != digests[0, index]]
        gaps = [_largest(held[0], held[r]) for r in ranks]
        sized = [g for g in gaps if g is not None]
        largest = max(sized, key=lambda g: (np.isnan(g), g)) if len(sized) == len(gaps) else None
        name = f"{variables[index].name or 'unnamed'} ({variables[index].type})"
        disagreements.append(Disagreement(name, ranks, largest, [v.shape for v in held]))
    raise RanksDisagree(disagreements)


set_periodic_check(verify)
