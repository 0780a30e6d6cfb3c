"""The state every rank keeps: shared variables, compiled functions, communicator."""

from __future__ import annotations

from .backends import Backend
from .comm import Communicator
from .compiled import RankFunction
from .distribute import GraphSpec, SharedRegistry


class RankState:
    """What one rank holds between commands.

    Parameters
    ----------
    rank, n_ranks : int
        This rank and the number of ranks.
    comm : Communicator
        The collectives of this rank.
    backend : Backend
        How this rank compiles and moves values.
    """

    def __init__(self, rank: int, n_ranks: int, comm: Communicator, backend: Backend):
        self.rank, self.n_ranks = rank, n_ranks
        self.comm, self.backend = comm, backend
        self.registry = SharedRegistry()
        self.functions: dict[int, RankFunction] = {}

    def add_functions(self, specs: list[GraphSpec]) -> None:
        """Compile and keep ``specs`` (their shared variables are registered already)."""
        for spec in specs:
            function = RankFunction(spec, self.backend.mode, self.backend.device_outputs)
            function.compile()
            self.functions[spec.fid] = function

    def shared(self, indices) -> list:
        """The shared variables with these registry indices."""
        return [self.registry[int(i)] for i in indices]
