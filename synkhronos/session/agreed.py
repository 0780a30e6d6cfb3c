"""Rank 0's values of shared variables as synkhronos last left them, to find those the
program changed since.

A program changes rank 0's value of a shared variable between calls: ``set_value`` (a
learning-rate schedule), a plain ``pytensor.function`` that updates it, a write through
``get_value(borrow=True)``. The workers' copies do not change. Rank 0 keeps a record of
each variable's value as synkhronos left it (shipped, written by a call, a collective or
a routine); before a call, the variables it reads whose value no longer matches their
record are broadcast from rank 0 (:func:`synkhronos.api.collectives.send_changes`).

A record is cheap to keep and to compare, never a copy of a large value:

- a NumPy value of at most :data:`WHOLE_BYTES` bytes: its shape, dtype and bytes, compared
  whole (a change in place is seen);
- a larger NumPy value: the array itself (weakly), its shape, and :data:`SAMPLES` of its
  elements evenly spaced: a new array is seen, a change in place only where it alters a
  sampled element;
- any other value (a JAX array, immutable): the object itself (weakly).

Examples
--------
>>> import numpy as np, pytensor
>>> lr = pytensor.shared(np.float64(0.1))
>>> agreed = AgreedValues()
>>> agreed.agree([lr])
>>> lr.get_value(borrow=True)[...] = 0.05     # in place, through the borrowed buffer
>>> agreed.changed([lr]) == [lr]
True
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SAMPLES", "WHOLE_BYTES", "AgreedValues"]

WHOLE_BYTES = 1 << 16
"""NumPy values up to this size are compared byte for byte (a learning rate, a bias)."""
SAMPLES = 256
"""Elements of a larger NumPy value compared, evenly spaced, first and last included."""


@functools.lru_cache(maxsize=256)
def _positions(size: int) -> np.ndarray:
    """The sampled elements' positions in an array of ``size`` elements, in C order."""
    return np.unique(np.linspace(0, size - 1, min(SAMPLES, size)).round().astype(np.intp))


def _samples(value: np.ndarray) -> bytes:
    positions = _positions(value.size)
    if value.flags.c_contiguous:
        return value.take(positions).tobytes()  # twice as fast as by index tuples
    return value[np.unravel_index(positions, value.shape)].tobytes()  # without a copy


def _weak(value) -> Callable[[], object]:
    try:
        return weakref.ref(value)
    except TypeError:  # a NumPy or Python scalar: small and immutable, held
        return lambda: value


@dataclass(frozen=True)
class _Record:
    held: Callable[[], object] | None  # the value itself, weakly (None: compared whole)
    shape: tuple | None
    dtype: np.dtype | None
    probe: bytes | None  # every byte, or the sampled elements' bytes

    @classmethod
    def of(cls, value) -> _Record:
        if not isinstance(value, np.ndarray):
            return cls(_weak(value), None, None, None)
        if value.nbytes <= WHOLE_BYTES:
            return cls(None, value.shape, value.dtype, value.tobytes())
        return cls(_weak(value), value.shape, value.dtype, _samples(value))

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is the value recorded."""
        if self.held is None:
            return (
                isinstance(value, np.ndarray)
                and value.shape == self.shape
                and value.dtype == self.dtype
                and value.tobytes() == self.probe
            )
        same = self.held() is value
        return same and (
            self.probe is None or (value.shape == self.shape and _samples(value) == self.probe)
        )


class AgreedValues:
    """Per shared variable, a record of rank 0's value as synkhronos last left it."""

    def __init__(self) -> None:
        self._records: dict[int, _Record] = {}  # by id(): registered variables live on

    def agree(self, variables: Iterable) -> None:
        """Record rank 0's present value of each of ``variables``."""
        for var in variables:
            self._records[id(var)] = _Record.of(var.container.storage[0])

    def changed(self, variables: Iterable) -> list:
        """Those of ``variables`` whose rank-0 value is not the one recorded (a variable
        never recorded: unchanged)."""
        records = self._records
        return [
            var
            for var in variables
            if (record := records.get(id(var))) is not None
            and not record.holds(var.container.storage[0])
        ]
