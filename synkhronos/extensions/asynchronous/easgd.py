"""Elastic averaging SGD (EASGD, Zhang, Choromanska and LeCun, arXiv 1412.6651).

Each rank ``i`` trains its own parameters ``x_i`` with local steps; every ``tau`` steps
the ranks and the centre ``c`` are pulled toward each other by the elastic force
``alpha * (x_i - c)``:

- synchronous (:class:`EASGD`, the paper's eq. 5-6): all ranks at once, with one
  all-reduce of the differences ``d_i = x_i - c``::

      x_i <- x_i - alpha * d_i
      c   <- c + beta * mean_i(d_i)        # beta = n_ranks * alpha by default

  (with ``beta = p * alpha`` this is ``c <- c + alpha * sum_i d_i``, the paper's
  symmetric force);
- asynchronous (:class:`AsyncEASGD`, the paper's Algorithm 1): each rank alone, under
  the centre's lock, without waiting for the others::

      d = alpha * (x_i - c);  x_i <- x_i - d;  c <- c + d
"""

from __future__ import annotations

import numpy as np

from synkhronos.rank.state import RankState

from .local import LocalStep
from .phase import Exchange, Trainer, every, run_phase

__all__ = ["EASGD", "AsyncEASGD", "easgd_phase", "async_easgd_phase"]


class SyncExchange(Exchange):
    """Every ``tau`` steps: one all-reduce of ``x_i - c``; ranks and centre move."""

    def __init__(self, *args):
        super().__init__(*args)
        self.tau, self.alpha, self.beta = self.settings.hyper
        self.tau = int(self.tau)
        self.centre_value = self.centre.read(self.rank, self.check)

    def after_step(self, step: int) -> None:
        if (step + 1) % self.tau:
            return
        x = self.step.get()
        d = x - self.centre_value
        total = self.state.comm.all_reduce([d], "sum")[0]
        self.step.set(x - self.alpha * d)
        self.centre_value = self.centre_value + (self.beta / self.n_ranks) * total

    def finish(self) -> list[np.ndarray]:
        if self.rank == 0:  # every rank holds the same centre: rank 0 stores it
            with self.centre.locked(self.rank, self.check) as centre:
                centre[:] = self.centre_value
        return super().finish()


class AsyncExchange(Exchange):
    """Every ``tau`` steps, alone under the lock: rank and centre move toward each other.

    Log rows: ``[sequence, the rank's parameters before, centre before, what was added
    to the centre]``.
    """

    def __init__(self, *args):
        super().__init__(*args)
        tau, self.alpha = self.settings.hyper
        self.tau = int(tau)

    def after_step(self, step: int) -> None:
        if (step + 1) % self.tau:
            return
        x = self.step.get()
        with self.centre.locked(self.rank, self.check) as centre:
            d = self.alpha * (x - centre)
            self.record(self.centre.sequence, x, centre, d)
            centre += d
        self.step.set(x - d)


def easgd_phase(state: RankState, *args: np.ndarray) -> list[np.ndarray]:
    """(Every rank) a phase of synchronous EASGD."""
    return run_phase(state, SyncExchange, *args)


def async_easgd_phase(state: RankState, *args: np.ndarray) -> list[np.ndarray]:
    """(Every rank) a phase of asynchronous EASGD."""
    return run_phase(state, AsyncExchange, *args)


class EASGD(Trainer):
    """Synchronous EASGD: every ``tau`` local steps, one all-reduce of the elastic differences.

    Parameters
    ----------
    step, batch_size
        As for :class:`~synkhronos.extensions.asynchronous.phase.Trainer`.
    tau : int
        Local steps between exchanges.
    alpha : float
        The elastic force on the ranks (the paper's ``alpha = eta * rho``).
    beta : float, optional
        The centre's moving rate; default ``n_ranks * alpha`` (the paper's symmetric
        choice).
    log, seed
        As for the Trainer.

    Examples
    --------
    >>> step = LocalStep(loss, params, [x, y], lasagne.updates.sgd,    # doctest: +SKIP
    ...                  learning_rate=0.1)
    >>> with EASGD(step, batch_size=32, tau=4, alpha=0.2) as trainer:  # doctest: +SKIP
    ...     result = trainer.run([x_data, y_data], n_steps=100)
    >>> result.losses.shape, len(result.centre)                        # doctest: +SKIP
    ((2, 100), 2)
    """

    routine = staticmethod(easgd_phase)

    def __init__(
        self,
        step: LocalStep,
        batch_size: int,
        tau: int = 10,
        alpha: float = 0.1,
        beta: float | None = None,
        log: bool = False,
        seed: int = 0,
    ):
        self.tau, self.alpha = every("tau", tau), float(alpha)
        super().__init__(step, batch_size, log, seed)
        self.beta = self.n_ranks * self.alpha if beta is None else float(beta)

    def hyper(self) -> tuple:
        return (self.tau, self.alpha, self.beta)


class AsyncEASGD(Trainer):
    """Asynchronous EASGD: every ``tau`` local steps, each rank alone moves toward the
    centre and the centre toward it, under the centre's lock.

    Parameters
    ----------
    step, batch_size
        As for :class:`~synkhronos.extensions.asynchronous.phase.Trainer`.
    tau : int
        Local steps between a rank's exchanges.
    alpha : float
        The elastic force (on the rank and on the centre alike).
    log, seed
        As for the Trainer; the log rows are ``[sequence, the rank's parameters before,
        centre before, what was added to the centre]``.

    Examples
    --------
    >>> with AsyncEASGD(step, batch_size=32, tau=4, alpha=0.1) as trainer:  # doctest: +SKIP
    ...     result = trainer.run([x_data, y_data], n_steps=100)
    """

    routine = staticmethod(async_easgd_phase)

    def __init__(
        self,
        step: LocalStep,
        batch_size: int,
        tau: int = 10,
        alpha: float = 0.1,
        log: bool = False,
        seed: int = 0,
    ):
        self.tau, self.alpha = every("tau", tau), float(alpha)
        super().__init__(step, batch_size, log, seed)

    def hyper(self) -> tuple:
        return (self.tau, self.alpha)
