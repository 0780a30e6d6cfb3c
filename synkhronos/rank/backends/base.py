"""The backend interface, and CPU ranks' implementation of it (host numpy values)."""

from __future__ import annotations

import numpy as np


class Backend:
    """CPU ranks: values are numpy arrays in host memory.

    Parameters
    ----------
    name : str
        "cpu" or "jax-cpu".
    mode : str or None
        PyTensor compile mode (None: PyTensor's default).
    device_outputs : bool
        Whether function outputs stay in the backend's arrays and are reduced through the
        communicator, rather than sent to rank 0 as host arrays (see
        :mod:`synkhronos.rank.outputs`).
    """

    def __init__(self, name: str, mode: str | None, device_outputs: bool = False):
        self.name, self.mode, self.device_outputs = name, mode, device_outputs

    @property
    def writes_in_place(self) -> bool:
        """Whether collectives may write into a shared variable's storage. Not in JAX mode:
        JAX takes an aligned NumPy array without a copy and computes after the call
        returns, so an array it may still be reading must never change."""
        return self.mode != "JAX"

    def to_comm(self, array):
        """``array`` as the communicator takes it (here: numpy, without a copy if possible)."""
        return np.asarray(array)

    def value(self, var):
        """A shared variable's value as the communicator takes it (here: numpy, a view of
        the variable's storage where possible)."""
        return self.to_comm(var.get_value(borrow=True))

    def close(self, variables) -> None:
        """(Rank 0, at the session's close) Leave the shared ``variables`` and this process
        as a later fork expects them; CPU ranks changed nothing."""

    def set_value(self, var, value, owned: bool = False) -> None:
        """Set a shared variable's value from what a communicator returned.

        The value is copied unless ``owned`` says that nothing else holds it (a fresh
        result), in which case the variable takes it as it is where the dtype matches.
        """
        current = var.get_value(borrow=True)
        if (
            self.writes_in_place
            and isinstance(current, np.ndarray)
            and current.flags.writeable
            and current.shape == np.shape(value)
            and current.dtype == value.dtype
        ):
            np.copyto(current, value)  # in place: keeps the storage the function uses
            return
        # Replace the storage (JAX mode's is read-only, or must stay unchanged). borrow=True,
        # as the array is this variable's alone (PyTensor would copy it once more).
        fresh = owned and isinstance(value, np.ndarray) and value.dtype == var.dtype
        new = value if fresh else np.array(value, dtype=var.dtype)
        if not self.writes_in_place:
            new.flags.writeable = False  # nothing writes into it while JAX may read it
        var.set_value(new, borrow=True)
