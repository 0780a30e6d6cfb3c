"""A phase of local training on every rank, and the rank-0 trainer that starts phases.

Rank 0 calls :meth:`Trainer.run`; that sends ONE routine command
(:func:`synkhronos.api.routines.run`), and every rank, rank 0 included, runs
:func:`run_phase`: ``n_steps`` local steps on minibatches cycling through its own
contiguous share of the data rows (or of given row indices), calling its algorithm's
:class:`Exchange` after each step. Rank 0 gets every rank's losses (and, when asked,
its log of exchanges) and reads the centre from shared memory.

The centre is a :class:`~synkhronos.extensions.asynchronous.shared_block.SharedBlock`
created by the trainer from rank 0's parameters. At the start of the trainer's first
phase every rank sets its parameters to it, so that all ranks start alike; later phases
continue from each rank's own parameters.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from synkhronos.api import routines
from synkhronos.rank import routine_part
from synkhronos.rank.state import RankState
from synkhronos.session import launch
from synkhronos.transport.channel import Aborted
from synkhronos.transport.shared_arrays import Data

from .local import LocalStep, RankStep, minibatch, rank_rows
from .shared_block import SharedBlock

__all__ = ["Settings", "Exchange", "every", "run_phase", "PhaseResult", "Trainer"]

_block_count = itertools.count()


class Settings(NamedTuple):
    """What one phase runs, sent as one float64 vector."""

    n_steps: int
    batch_size: int
    first_step: int  #: steps the trainer ran before this phase (minibatches continue)
    reset: bool  #: set every rank's parameters to the centre first
    log: bool  #: return each rank's log of exchanges
    seed: int
    hyper: tuple  #: the algorithm's own parameters

    def encode(self) -> np.ndarray:
        return np.array(
            [
                self.n_steps,
                self.batch_size,
                self.first_step,
                self.reset,
                self.log,
                self.seed,
                *self.hyper,
            ],
            np.float64,
        )

    @classmethod
    def decode(cls, words: np.ndarray) -> Settings:
        n, b, first, reset, log, seed = (int(w) for w in words[:6])
        return cls(n, b, first, bool(reset), bool(log), seed, tuple(words[6:].tolist()))


class Exchange:
    """What an algorithm does between local steps on one rank (subclasses say what).

    Parameters
    ----------
    state : RankState
        The rank's state.
    step : RankStep
        Its local step and parameters.
    settings : Settings
        The phase.
    blocks : list of SharedBlock
        The shared blocks, the centre first.
    """

    def __init__(
        self, state: RankState, step: RankStep, settings: Settings, blocks: list[SharedBlock]
    ):
        self.state, self.step, self.settings = state, step, settings
        self.rank, self.n_ranks = state.rank, state.n_ranks
        self.centre = blocks[0]
        self.blocks = blocks
        self.check = self._check_rank_0 if self.rank == 0 else self.check_abort
        self.log: list[np.ndarray] = []
        if settings.reset:
            self.step.set(self.centre.read(self.rank, self.check))

    def check_abort(self) -> None:
        """Raise if another rank failed (polled between steps and while a lock is busy)."""
        if self.state.comm.control.aborted:
            raise Aborted("phase abandoned: another rank failed")

    def _check_rank_0(self) -> None:
        # Rank 0 also polls the workers while it waits for a lock, so a stopped holder
        # raises WorkerHung instead of blocking; a dead holder releases the lock anyway.
        self.check_abort()
        launch.current().check_alive()

    def record(self, *parts) -> None:
        """Append one row to the log (when the phase logs)."""
        if self.settings.log:
            self.log.append(np.concatenate([np.ravel(np.asarray(p, np.float64)) for p in parts]))

    def after_step(self, step: int) -> None:
        """Called after local step ``step`` (counted over the trainer's phases)."""

    def finish(self) -> list[np.ndarray]:
        """End the phase; return extra reply arrays (the log by default)."""
        return [self.log_array()]

    def log_array(self) -> np.ndarray:
        return np.array(self.log) if self.log else np.zeros((0, 0))


def every(name: str, steps: int) -> int:
    """``steps`` as a count of local steps between exchanges: an int of at least 1."""
    if int(steps) != steps or steps < 1:
        raise ValueError(f"{name} must be a whole number of steps, at least 1; got {steps}")
    return int(steps)


def run_phase(
    state: RankState,
    exchange: type[Exchange],
    config: np.ndarray,
    fids: np.ndarray,
    param_indices: np.ndarray,
    names: np.ndarray,
    indices: np.ndarray,
    *data: np.ndarray,
) -> list[np.ndarray]:
    """(Every rank) run one phase; return ``[losses, *exchange.finish()]``.

    Called by each algorithm's routine with its :class:`Exchange` class. ``indices``: the
    rows to share out (empty: all rows of ``data``).
    """
    settings = Settings.decode(config)
    step = RankStep(state, fids, param_indices)
    blocks = [
        SharedBlock(name, 0, step.dtype, create=False)
        for name in routine_part.from_text(names).split(",")
    ]
    try:
        algorithm = exchange(state, step, settings, blocks)
        n_rows = len(indices) if len(indices) else len(data[0])
        share = rank_rows(n_rows, state.rank, state.n_ranks)
        losses = np.empty(settings.n_steps)
        for k in range(settings.n_steps):
            algorithm.check_abort()  # another rank failed: stop now, not after the phase
            g = settings.first_step + k
            rows = minibatch(share, settings.batch_size, g)
            losses[k] = step(data, indices[rows] if len(indices) else rows)
            algorithm.after_step(g)
        return [losses, *algorithm.finish()]
    finally:
        for block in blocks:
            block.close()


class PhaseResult(NamedTuple):
    """What rank 0 gets back from a phase."""

    losses: np.ndarray  #: (n_ranks, n_steps): each rank's loss at each local step
    centre: list[np.ndarray]  #: the centre after the phase, shaped like the parameters
    samples: int  #: rows trained on in the phase, over all ranks
    replies: list[list[np.ndarray]]  #: per rank, the exchange's extra arrays (logs)


class Trainer:
    """Starts phases of an algorithm on every rank (base of the algorithms' trainers).

    Parameters
    ----------
    step : LocalStep
        The local step.
    batch_size : int
        Rows per local step on each rank.
    log : bool
        Each rank logs its exchanges (for tests: costs a copy of the centre per exchange).
    seed : int
        Seed of the ranks' random choices (gossip).
    """

    routine = None  #: the algorithm's module-level per-rank function (subclasses set it)

    def __init__(self, step: LocalStep, batch_size: int, log: bool = False, seed: int = 0):
        session = launch.current()
        session.distribute()
        self.step, self.batch_size, self.log, self.seed = step, int(batch_size), log, seed
        self.n_ranks = session.n_ranks
        self.fids, self.param_indices = step.ids(session.state)
        flat = step.flat_params()
        base = f"{session.name}_async{next(_block_count)}"
        self.blocks = [SharedBlock(f"{base}_centre", flat.size, flat.dtype, create=True)]
        self.blocks += [
            SharedBlock(f"{base}_{i}", self.block_size(flat.size), flat.dtype, create=True)
            for i in range(self.n_blocks())
        ]
        self.blocks[0].values[:] = flat
        self.init_blocks()
        self.steps_done = 0

    def n_blocks(self) -> int:
        """Shared blocks besides the centre."""
        return 0

    def block_size(self, n_params: int) -> int:
        """Values in each block besides the centre."""
        return n_params

    def init_blocks(self) -> None:
        """Fill the blocks besides the centre (they start as zeros)."""

    def hyper(self) -> tuple:
        """The algorithm's parameters, sent with each phase."""
        return ()

    def run(
        self, data: Sequence[Data | np.ndarray], n_steps: int, rows: np.ndarray | None = None
    ) -> PhaseResult:
        """Run ``n_steps`` local steps on every rank, exchanging as the algorithm says.

        Parameters
        ----------
        data : list of synkhronos.Data or numpy.ndarray
            One array per input of the step, all with the same rows; each rank trains on
            its contiguous share of the rows. ``Data`` arrays are read in place; numpy
            arrays are copied to the ranks with the command.
        n_steps : int
            Local steps per rank.
        rows : array of int, optional
            Train on these rows of ``data`` only (each rank on its contiguous share of
            them, in this order), e.g. a shuffled subset; default all rows.

        Returns
        -------
        PhaseResult
        """
        settings = Settings(
            int(n_steps),
            self.batch_size,
            self.steps_done,
            self.steps_done == 0,
            self.log,
            self.seed,
            self.hyper(),
        )
        names = routine_part.text(",".join(b.name for b in self.blocks))
        indices = np.zeros(0, np.int64) if rows is None else np.asarray(rows, np.int64)
        replies = routines.run(
            self.routine, settings.encode(), self.fids, self.param_indices, names, indices, *data
        )
        self.steps_done += int(n_steps)
        n_rows = len(data[0]) if rows is None else len(indices)
        batches = [
            minibatch(rank_rows(n_rows, r, self.n_ranks), self.batch_size, 0)
            for r in range(self.n_ranks)
        ]
        samples = int(n_steps) * sum(b.stop - b.start for b in batches)
        return PhaseResult(
            np.array([r[0] for r in replies]), self.centre(), samples, [r[1:] for r in replies]
        )

    def centre(self) -> list[np.ndarray]:
        """The centre, shaped like the parameters."""
        flat = self.blocks[0].read(0, launch.current().check_alive)
        shapes = [np.shape(p.get_value(borrow=True)) for p in self.step.params]
        cuts = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
        return [part.reshape(s) for part, s in zip(np.split(flat, cuts), shapes, strict=True)]

    def set_params_to_centre(self) -> None:
        """Set rank 0's parameters to the centre (e.g. to evaluate the centre)."""
        for param, value in zip(self.step.params, self.centre(), strict=True):
            param.set_value(value)

    def close(self) -> None:
        """Remove the shared blocks (the session's close removes them anyway)."""
        for block in self.blocks:
            block.unlink()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
