"""``Data``: numpy arrays in OS shared memory that every rank reads without copying.

Rank 0 owns each segment. A call describes every ``Data`` argument to the workers by
(id, generation, dtype, shape); a worker maps a segment the first time it sees it and maps
again only when the generation changes, so reallocations need nothing from the user.
When a ``Data`` is freed or collected, rank 0 unlinks its segment and the next command
tells the workers to unmap it.
"""

from __future__ import annotations

import itertools
import math
import weakref

import numpy as np

from synkhronos.transport.names import process_prefix
from synkhronos.transport.shm import DTYPES, GrowingSegment, dtype_code

_ids = itertools.count()
# Ids of Data whose memory was released: the next command tells the workers to unmap them
# (an unlinked segment's memory is only returned once every process has unmapped it).
released_ids: list[int] = []


def _release(segment: GrowingSegment, data_id: int) -> None:
    segment.unlink()
    released_ids.append(data_id)


def check_oversize(oversize) -> float:
    """``oversize`` as a float; ``ValueError`` outside [1, 2] (the original's range)."""
    if not 1.0 <= float(oversize) <= 2.0:
        raise ValueError(f"oversize must be in [1, 2], got {oversize}")
    return float(oversize)


def _cast(value: np.ndarray, dtype: np.dtype, force_cast: bool, what: object) -> np.ndarray:
    """``value`` as ``dtype``: safe casts silently, others only with ``force_cast``
    (``what``: named in the error, formatted only then)."""
    if value.dtype == dtype:
        return value
    if force_cast or np.can_cast(value.dtype, dtype, "safe"):
        return value.astype(dtype)
    raise TypeError(
        f"{what}: cannot cast {value.dtype} to {dtype} safely; pass force_cast=True to cast anyway"
    )


class Data:
    """A numpy-like array in shared memory, readable by every rank.

    Create it with :func:`synkhronos.data`. Indexing, ``len`` and ``numpy.asarray`` act on
    the current contents; :meth:`set_value` replaces them, reallocating only when the new
    value does not fit the allocation. Like a PyTensor variable it has a fixed dtype and,
    once known (from ``var``, ``ndim``, ``value`` or ``shape``), a fixed number of
    dimensions.

    Examples
    --------
    >>> import numpy as np, synkhronos as synk
    >>> d = synk.data(np.arange(6.0).reshape(3, 2))
    >>> d.shape, float(d[1, 1])
    ((3, 2), 3.0)
    >>> d.set_length(5); d.shape
    (5, 2)
    """

    def __init__(
        self,
        value=None,
        var=None,
        dtype=None,
        ndim: int | None = None,
        shape=None,
        minibatch: bool = False,
        force_cast: bool = False,
        oversize: float = 1.0,
        name: str | None = None,
    ):
        import pytensor

        check_oversize(oversize)
        if var is not None:
            dtype, ndim = var.dtype, var.ndim
        self.name = name
        self.minibatch = bool(minibatch)
        self._id = next(_ids)
        self._segment = GrowingSegment(f"{process_prefix()}_data{self._id}")
        weakref.finalize(self, _release, self._segment, self._id)
        if value is not None:
            value = np.asarray(value)
            dtype = value.dtype if dtype is None else np.dtype(dtype)
        self._dtype = np.dtype(pytensor.config.floatX if dtype is None else dtype)
        dtype_code(self._dtype)
        self._ndim = None if ndim is None else int(ndim)
        self._shape: tuple[int, ...] = (0,) * (self._ndim or 1)
        self._view: np.ndarray | None = None
        if value is not None:
            self.set_value(value, force_cast=force_cast, oversize=oversize)
        elif shape is not None:
            self.set_shape(shape, oversize)
            self.data[...] = 0

    # ---- description ---------------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._shape))

    @property
    def layout(self) -> tuple:
        """What a call's checks and its workers' views of this array depend on: the shape,
        the minibatch flag and the shared-memory segment (a reallocation makes a new one).
        A call of the same Data of the same layout passes the same checks."""
        return self._shape, self.minibatch, self._segment.generation

    @property
    def alloc_size(self) -> int:
        """Elements allocated in shared memory (at least :attr:`size`)."""
        return self._segment.size // self._dtype.itemsize

    @property
    def data(self) -> np.ndarray:
        """A numpy view of the shared memory, in the current shape."""
        if self._view is None:
            if self._segment.segment is None:
                self._resize(self._shape, 1.0, keep=False)
            self._view = self._segment.attached.array(self._dtype, self._shape)
        return self._view

    def __len__(self) -> int:
        return self._shape[0]

    def __getitem__(self, key):
        return self.data[key]

    def __setitem__(self, key, value) -> None:
        self.data[key] = value

    def __array__(self, dtype=None, copy=None):
        return self.data if dtype is None else self.data.astype(dtype)

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<synkhronos.Data{label} shape={self._shape} dtype={self._dtype}>"

    # ---- changing contents ---------------------------------------------------------------
    def _fix_ndim(self, ndim: int, what: str) -> None:
        if self._ndim is None:
            self._ndim = ndim
        elif ndim != self._ndim:
            raise TypeError(
                f"{self!r}: {what} has {ndim} dimensions, but this Data has {self._ndim}"
            )

    def _resize(self, shape: tuple[int, ...], oversize: float, keep: bool) -> None:
        nbytes = math.prod(shape) * self._dtype.itemsize
        old = self.data.reshape(-1) if keep and self._segment.segment is not None else None
        if self._segment.segment is None or nbytes > self._segment.size:
            generation = self._segment.generation
            old_copy = None if old is None else old.copy()
            self._segment.reserve(nbytes, check_oversize(oversize))
            if old_copy is not None and generation >= 0:
                n = min(old_copy.size, math.prod(shape))
                self._segment.attached.array(self._dtype, (n,))[...] = old_copy[:n]
            self._view = None
        if shape != self._shape:
            self._shape = shape
            self._view = None  # a value of the same shape in the same segment keeps the view

    def condition_data(self, value, force_cast: bool = False) -> np.ndarray:
        """``value`` as :meth:`set_value` would store it: cast to :attr:`dtype` (unsafe casts
        only with ``force_cast``), with the number of dimensions checked.

        Examples
        --------
        >>> import numpy as np, synkhronos as synk
        >>> synk.data(ndim=1, dtype="float32").condition_data(np.int8([1, 2])).dtype
        dtype('float32')
        """
        value = _cast(np.asarray(value), self._dtype, force_cast, self)
        self._fix_ndim(value.ndim, "the value")
        return value

    def set_value(self, value, force_cast: bool = False, oversize: float = 1.0) -> None:
        """Replace the contents (shape and values) with ``value``.

        Parameters
        ----------
        value : array_like
            New contents; its dtype must cast safely to :attr:`dtype` unless ``force_cast``,
            and its number of dimensions match :attr:`ndim` once that is fixed.
        force_cast : bool
            Allow unsafe casts (e.g. float64 to float32).
        oversize : float
            In [1, 2]: when a reallocation is needed, allocate this multiple of the needed
            size so that later, larger values fit without another one.
        """
        check_oversize(oversize)
        value = self.condition_data(value, force_cast)
        self._resize(value.shape, oversize, keep=False)
        self.data[...] = value

    def set_length(self, length: int, oversize: float = 1.0) -> None:
        """Change the number of rows, keeping the leading rows' contents."""
        check_oversize(oversize)
        self._resize((int(length),) + self._shape[1:], oversize, keep=True)

    def set_shape(self, shape, oversize: float = 1.0) -> None:
        """Change the shape, keeping the leading elements' contents (in C order)."""
        check_oversize(oversize)
        shape = tuple(int(s) for s in np.atleast_1d(shape))
        self._fix_ndim(len(shape), "the shape")
        self._resize(shape, oversize, keep=True)

    def free_memory(self) -> None:
        """Release the shared memory; the array becomes empty (length 0)."""
        self._segment.release()
        released_ids.append(self._id)
        self._shape = (0,) + self._shape[1:]
        self._view = None

    def descriptor(self) -> np.ndarray:
        """int64 words telling a worker where and what this array is."""
        self.data  # noqa: B018 - make sure the segment exists
        return np.array(
            [self._id, self._segment.generation, dtype_code(self._dtype), *self._shape],
            dtype=np.int64,
        )


class DataViews:
    """(Worker) maps ``Data`` segments on first sight and re-maps on reallocation."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.segments: dict[int, GrowingSegment] = {}

    def forget(self, data_ids) -> None:
        """Unmap the segments of these released ``Data`` (once no view of them is left)."""
        for data_id in data_ids:
            self.segments.pop(int(data_id), None)

    def view(self, descriptor) -> np.ndarray:
        """The array a :meth:`Data.descriptor` (as int64 words or a list) describes."""
        data_id, generation, code = (int(x) for x in descriptor[:3])
        segment = self.segments.get(data_id)
        if segment is None:
            segment = self.segments[data_id] = GrowingSegment(f"{self.prefix}_data{data_id}")
        segment.follow(generation)
        return segment.attached.array(DTYPES[code], tuple(int(s) for s in descriptor[3:]))
