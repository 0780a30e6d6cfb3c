"""Training beyond the synchronous step: EASGD, ASGD/Downpour and gossip SGD.

Rank 0 starts a *phase* with one command; every rank then runs local steps on its own
rows (:mod:`~.local`) and exchanges with the others as its algorithm says, through a
centre in host shared memory (:mod:`~.shared_block`) or an all-reduce; rank 0 gets the
losses and the centre back (:mod:`~.phase`). One module per family:
:mod:`~.easgd` (synchronous and asynchronous), :mod:`~.downpour`, :mod:`~.gossip`.
"""

from .downpour import Downpour
from .easgd import EASGD, AsyncEASGD
from .gossip import Gossip
from .local import LocalStep
from .phase import PhaseResult, Trainer
from .shared_block import HolderDied

__all__ = [
    "AsyncEASGD",
    "Downpour",
    "EASGD",
    "Gossip",
    "HolderDied",
    "LocalStep",
    "PhaseResult",
    "Trainer",
]
