"""The communicator interface shared by the CPU (shared-memory) and GPU (XLA) backends."""

from __future__ import annotations

from abc import ABC, abstractmethod


class Communicator(ABC):
    """Collectives over lists of arrays, called by every rank with matching arguments.

    Arrays are host ``numpy`` arrays for CPU communicators and device arrays for GPU ones.
    ``op`` is one of "avg", "sum", "prod", "max", "min".
    """

    rank: int
    n_ranks: int

    @abstractmethod
    def broadcast(self, arrays: list | None, root: int = 0) -> list:
        """Return ``root``'s arrays on every rank (non-roots pass None)."""

    @abstractmethod
    def scatter(self, parts: list[list] | None, root: int = 0) -> list:
        """Return ``parts[rank]`` from ``root`` on every rank (non-roots pass None)."""

    @abstractmethod
    def gather(self, arrays: list, root: int = 0) -> list[list] | None:
        """Return every rank's arrays, in rank order, on ``root``; None elsewhere."""

    @abstractmethod
    def all_gather(self, arrays: list) -> list[list]:
        """Return every rank's arrays, in rank order, on every rank."""

    @abstractmethod
    def reduce(self, arrays: list, op: str, root: int = 0) -> list | None:
        """Return the element-wise reduction of every rank's arrays on ``root``."""

    @abstractmethod
    def all_reduce(self, arrays: list, op: str, out: list | None = None) -> list:
        """Element-wise reduction of every rank's arrays, on every rank.

        With ``out``, results are written into those arrays (which may be ``arrays``);
        without, they are new arrays that nothing else holds.
        """

    @abstractmethod
    def reset(self) -> None:
        """(Rank 0, every rank idle) Forget what a collective that was aborted left."""

    def start(self) -> None:  # noqa: B027 - most communicators need nothing here
        """Join the other ranks, once every rank's process runs (rank 0: after starting the
        workers)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the communicator holds."""
