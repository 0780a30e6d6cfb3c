"""ASGD / Downpour (Dean et al. 2012): ranks push accumulated updates to the centre and
pull fresh parameters, each on its own schedule, without waiting for the others.

Each rank runs local steps with its rule. Every ``n_push`` steps it adds to the centre,
under the lock, what its local steps changed since its last push (with plain SGD that is
``-learning_rate`` times its accumulated gradients: the centre takes an SGD step with
them); every ``n_pull`` steps it replaces its parameters by the centre, keeping the
change it has not pushed yet for its next push. At the end of a phase each rank pushes
what is left.
"""

from __future__ import annotations

import numpy as np

from synkhronos.rank.state import RankState

from .local import LocalStep
from .phase import Exchange, Trainer, every, run_phase

__all__ = ["Downpour", "downpour_phase"]

PUSH, PULL = 0, 1


class DownpourExchange(Exchange):
    """Push every ``n_push`` steps, pull every ``n_pull``.

    ``x - base`` is always the change not pushed yet. Log rows: ``[sequence, PUSH or
    PULL, centre before, what was added to the centre]``.
    """

    def __init__(self, *args):
        super().__init__(*args)
        self.n_push, self.n_pull = (int(n) for n in self.settings.hyper)
        self.base = self.step.get()

    def after_step(self, step: int) -> None:
        done = step + 1
        if done % self.n_push == 0:
            self.push()
        if done % self.n_pull == 0:
            self.pull()

    def push(self) -> None:
        x = self.step.get()
        delta = x - self.base
        with self.centre.locked(self.rank, self.check) as centre:
            self.record(self.centre.sequence, PUSH, centre, delta)
            centre += delta
        self.base = x

    def pull(self) -> None:
        unpushed = self.step.get() - self.base
        with self.centre.locked(self.rank, self.check) as centre:
            self.record(self.centre.sequence, PULL, centre, np.zeros_like(centre))
            fresh = centre.copy()
        self.step.set(fresh)
        self.base = fresh - unpushed

    def finish(self) -> list[np.ndarray]:
        self.push()
        return super().finish()


def downpour_phase(state: RankState, *args: np.ndarray) -> list[np.ndarray]:
    """(Every rank) a phase of Downpour."""
    return run_phase(state, DownpourExchange, *args)


class Downpour(Trainer):
    """ASGD / Downpour: asynchronous pushes of accumulated updates and pulls of the centre.

    Parameters
    ----------
    step, batch_size
        As for :class:`~synkhronos.extensions.asynchronous.phase.Trainer`.
    n_push, n_pull : int
        Local steps between a rank's pushes, and between its pulls.
    log, seed
        As for the Trainer; the log rows are ``[sequence, 0 (push) or 1 (pull),
        centre before, what was added]``.

    Examples
    --------
    >>> with Downpour(step, batch_size=32, n_push=2, n_pull=4) as trainer:  # doctest: +SKIP
    ...     result = trainer.run([x_data, y_data], n_steps=100)
    """

    routine = staticmethod(downpour_phase)

    def __init__(
        self,
        step: LocalStep,
        batch_size: int,
        n_push: int = 1,
        n_pull: int = 1,
        log: bool = False,
        seed: int = 0,
    ):
        self.n_push, self.n_pull = every("n_push", n_push), every("n_pull", n_pull)
        super().__init__(step, batch_size, log, seed)

    def hyper(self) -> tuple:
        return (self.n_push, self.n_pull)
