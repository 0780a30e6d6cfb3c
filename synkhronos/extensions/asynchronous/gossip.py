"""Gossip SGD (GoSGD, Blot et al., arXiv 1611.09726): no centre to wait on, only peers.

Each rank ``i`` holds parameters ``x_i`` and a weight ``w_i`` (``1/n_ranks`` at first;
the weights always sum to 1). After each local step it first merges what its mailbox
received, as a weighted average::

    x_i <- (w_i * x_i + sum_s w_s * x_s) / (w_i + sum_s w_s);   w_i <- w_i + sum_s w_s

then, with probability ``p``, halves its weight and sends ``(w_i, x_i)`` to a random
peer's mailbox. A mailbox is a shared block holding the sums ``sum_s w_s`` and
``sum_s w_s * x_s`` (merging their total equals merging the messages one by one). At the
end of a phase the ranks wait for each other, merge what is left, and the centre becomes
the consensus ``sum_i w_i x_i`` (one all-reduce).
"""

from __future__ import annotations

import numpy as np

from synkhronos.rank.state import RankState

from .local import LocalStep
from .phase import Exchange, Trainer, run_phase

__all__ = ["Gossip", "gossip_phase"]

OWN_WEIGHT, WEIGHT_IN, SUM_IN = 0, 1, 2  # a mailbox's layout: SUM_IN onward, w * x summed
SEND, RECEIVE = 0, 1


class GossipExchange(Exchange):
    """Merge the mailbox after each step, then maybe send half the weight to a peer.

    Log rows: ``[SEND or RECEIVE, peer (-1 for a receive), weight sent or received, own
    weight before, parameters before, w * x sent or received, parameters after]``.
    """

    def __init__(self, *args):
        super().__init__(*args)
        (self.p,) = self.settings.hyper
        self.mailboxes = self.blocks[1:]
        self.own = self.mailboxes[self.rank]
        self.weight = float(self.own.read(self.rank, self.check)[OWN_WEIGHT])
        self.rng = np.random.default_rng([self.settings.seed, self.rank, self.settings.first_step])
        self.peers = [r for r in range(self.n_ranks) if r != self.rank]

    def after_step(self, step: int) -> None:
        if self.own.values[WEIGHT_IN] > 0:  # a hint read without the lock; merged under it
            self.receive()
        if self.peers and self.rng.random() < self.p:
            self.send(int(self.rng.choice(self.peers)))

    def receive(self) -> None:
        with self.own.locked(self.rank, self.check) as box:
            weight_in, sum_in = float(box[WEIGHT_IN]), box[SUM_IN:].copy()
            box[WEIGHT_IN:] = 0
        if weight_in > 0:
            x, total = self.step.get(), self.weight + weight_in
            merged = (self.weight * x + sum_in) / total
            self.record(RECEIVE, -1, weight_in, self.weight, x, sum_in, merged)
            self.step.set(merged)
            self.weight = total

    def send(self, peer: int) -> None:
        before, self.weight = self.weight, self.weight / 2
        x = self.step.get()
        with self.mailboxes[peer].locked(self.rank, self.check) as box:
            box[WEIGHT_IN] += self.weight
            box[SUM_IN:] += self.weight * x
        self.record(SEND, peer, self.weight, before, x, self.weight * x, x)

    def finish(self) -> list[np.ndarray]:
        comm = self.state.comm
        comm.all_reduce([np.zeros(1)], "sum")  # every rank has sent all it will send
        self.receive()
        with self.own.locked(self.rank, self.check) as box:
            box[OWN_WEIGHT] = self.weight
        x = self.step.get()
        weighted, weight = comm.all_reduce([self.weight * x, np.array([self.weight])], "sum")
        if self.rank == 0:
            with self.centre.locked(self.rank, self.check) as centre:
                centre[:] = weighted / weight[0]
        return [np.array([self.weight]), self.log_array()]


def gossip_phase(state: RankState, *args: np.ndarray) -> list[np.ndarray]:
    """(Every rank) a phase of gossip SGD."""
    return run_phase(state, GossipExchange, *args)


class Gossip(Trainer):
    """Gossip SGD: after each local step a rank sends, with probability ``p``, half of its
    weight and its parameters to a random peer, and merges what it received.

    Parameters
    ----------
    step, batch_size
        As for :class:`~synkhronos.extensions.asynchronous.phase.Trainer`.
    p : float
        Probability of a send after each local step.
    log, seed
        As for the Trainer. Each rank's replies are ``[its weight, its log]``; log rows
        are ``[0 (send) or 1 (receive), peer (-1 for a receive), weight sent or
        received, own weight before, parameters before, w * x sent or received,
        parameters after]``.

    Examples
    --------
    >>> with Gossip(step, batch_size=32, p=0.1) as trainer:           # doctest: +SKIP
    ...     result = trainer.run([x_data, y_data], n_steps=100)
    >>> sum(float(r[0][0]) for r in result.replies)                    # doctest: +SKIP
    1.0
    """

    routine = staticmethod(gossip_phase)

    def __init__(
        self, step: LocalStep, batch_size: int, p: float = 0.1, log: bool = False, seed: int = 0
    ):
        if not 0 <= p <= 1:
            raise ValueError(f"p is a probability, between 0 and 1; got {p}")
        self.p = float(p)
        super().__init__(step, batch_size, log, seed)

    def n_blocks(self) -> int:
        return self.n_ranks  # a mailbox each

    def block_size(self, n_params: int) -> int:
        return SUM_IN + n_params

    def init_blocks(self) -> None:
        for mailbox in self.blocks[1:]:
            mailbox.values[OWN_WEIGHT] = 1 / self.n_ranks

    def hyper(self) -> tuple:
        return (self.p,)
