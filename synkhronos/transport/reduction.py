"""Reduce operations: combining per-slice and per-rank results of a function's outputs,
and element-wise reductions of equally shaped arrays for the collectives.
"""

from __future__ import annotations

import numpy as np

COLLECTIVE_OPS = ("avg", "sum", "prod", "max", "min")
# "c_*" (the original's names) force the host path: same result, reduced by the replies
# rather than the communicator. "per_rank" is the list of every rank's result.
HOST_OPS = tuple(f"c_{op}" for op in (*COLLECTIVE_OPS, "gather"))
OUTPUT_OPS = (*COLLECTIVE_OPS, "gather", None, "per_rank", *HOST_OPS)
UPDATE_OPS = (*COLLECTIVE_OPS, *HOST_OPS[:-1])
_UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def check_output_op(op, what: str = "output") -> None:
    """``ValueError`` unless ``op`` is a known output reduce op."""
    if op not in OUTPUT_OPS:
        raise ValueError(f"unknown reduce op {op!r} for {what}; use one of {OUTPUT_OPS}")


def check_update_op(op, what: str = "update") -> None:
    """``ValueError`` unless ``op`` can combine an update's values over slices."""
    if op not in UPDATE_OPS:
        raise ValueError(f"unknown reduce op {op!r} for {what}; use one of {UPDATE_OPS}")


def bare_op(op):
    """The reduction an op names, without the host-forcing ``c_`` prefix.

    Examples
    --------
    >>> bare_op("c_avg"), bare_op("avg"), bare_op(None)
    ('avg', 'avg', None)
    """
    return op[2:] if isinstance(op, str) and op.startswith("c_") else op


def check_collective_op(op) -> None:
    """``ValueError`` unless ``op`` is a known collective reduce op."""
    if op not in COLLECTIVE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; use one of {COLLECTIVE_OPS}")


def join_rows(values: list, new_axis: bool = False) -> np.ndarray:
    """``values`` in order along axis 0: concatenated, or stacked along a new first axis
    (``new_axis``, and always for scalars).

    Examples
    --------
    >>> join_rows([np.zeros((1, 2)), np.ones((2, 2))]).shape
    (3, 2)
    >>> join_rows([np.zeros(2), np.ones(2)], new_axis=True).shape
    (2, 2)
    >>> join_rows([1.0, 2.0]).tolist()
    [1.0, 2.0]
    """
    values = [np.asarray(v) for v in values]
    if new_axis or values[0].ndim == 0:
        return np.stack(values)
    return np.concatenate(values, axis=0)


def _one(op: str, value: np.ndarray) -> np.ndarray:
    """``value``, the only one with rows, as :func:`combine` gives it: the caller's own
    (a copy), an integer "avg" as float64, a scalar "gather" as one row."""
    if op == "avg" and value.dtype.kind not in "fc":
        return value.astype(np.float64)
    return value[None].copy() if op == "gather" and value.ndim == 0 else value.copy()


def combine(op, values: list, weights: list[int]):
    """Combine the results of one output from several pieces of data.

    Parameters
    ----------
    op : str
        "avg" (weighted by ``weights``, the rows behind each value), "sum", "prod", "max",
        "min", "gather" (concatenate along axis 0; scalars are stacked), "per_rank" (the
        list), or one of these with the ``c_`` prefix.
    values : list of array_like
        One result per piece, in data order; pieces with zero weight are skipped.
    weights : list of int
        Rows of data behind each value.

    Examples
    --------
    >>> float(combine("avg", [1.0, 4.0], [1, 2]))
    3.0
    """
    op = bare_op(op)
    if op == "per_rank":
        return list(values)
    if len(values) == 1:  # one rank's, or one chunk's (a call on one rank: the usual case)
        return _one(op, np.asarray(values[0])) if weights[0] > 0 else None
    kept = [(np.asarray(v), w) for v, w in zip(values, weights, strict=True) if w > 0]
    if not kept:
        return None
    if len(kept) == 1:
        return _one(op, kept[0][0])
    if op == "gather":
        return join_rows([v for v, _ in kept])
    if op == "avg":
        total = sum(w for _, w in kept)
        dtype = kept[0][0].dtype
        acc = sum(v.astype(np.float64) * (w / total) for v, w in kept)
        return np.asarray(acc, dtype=dtype if dtype.kind in "fc" else np.float64)
    ufunc, acc = _UFUNCS[op], kept[0][0]
    for v, _ in kept[1:]:  # pairwise: no stacked copy, and cheap for the usual scalars
        acc = ufunc(acc, v)
    return np.asarray(acc)


# The dtypes GPU ranks reduce on the devices (comm/xla.py; all of them NCCL's too).
IN_PLACE_DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
)


def reduces_in_place(op, dtype) -> bool:
    """Whether outputs of ``op`` and ``dtype`` can be reduced where they were computed
    (on the device): element-wise ops on :data:`IN_PLACE_DTYPES`, "avg" only of floating
    point values ("avg" of integers gives float64, as :func:`combine` does on the host)."""
    dtype = np.dtype(dtype)
    return (
        op in COLLECTIVE_OPS
        and dtype.name in IN_PLACE_DTYPES
        and (op != "avg" or dtype.kind == "f")
    )


def accumulate(op: str, values: list, weights: list[int]):
    """Combine equally shaped arrays of any array library (numpy, JAX) in that library.

    Like :func:`combine` for the ops of :data:`COLLECTIVE_OPS`, but the values stay where
    they are (a GPU's memory, say) and keep their dtype.

    Examples
    --------
    >>> float(accumulate("avg", [np.float64(1.0), np.float64(4.0)], [1, 2]))
    3.0
    """
    op = bare_op(op)
    if op == "avg":
        total = sum(weights)
        values = [v * (w / total) for v, w in zip(values, weights, strict=True)]
    if op in ("avg", "sum", "prod"):
        step = (lambda a, b: a * b) if op == "prod" else (lambda a, b: a + b)
    else:
        xp = getattr(values[0], "__array_namespace__", lambda: np)()
        step = xp.maximum if op == "max" else xp.minimum
    acc = values[0]
    for v in values[1:]:
        acc = step(acc, v)
    return acc


BLOCK = 1 << 15  # elements reduced at a time, so each block's passes stay in cache


ALIGN_BYTES = 64


def empty_aligned(shape, dtype) -> np.ndarray:
    """An uninitialised C-ordered array whose data starts on a 64-byte boundary.

    The collectives' results are made this way: JAX takes such an array from NumPy
    without a copy (on CPU, ``jax.device_put`` aliases it), where NumPy's own 16-byte
    alignment costs a copy at every call of a JAX-mode function that reads it.

    Examples
    --------
    >>> a = empty_aligned((3, 5), np.float32)
    >>> a.shape, a.dtype, a.ctypes.data % 64, a.flags.c_contiguous
    ((3, 5), dtype('float32'), 0, True)
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN_BYTES, np.uint8)
    start = -raw.ctypes.data % ALIGN_BYTES
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def reduce_into(
    op: str, inputs: list[np.ndarray], out: np.ndarray, copies: tuple[np.ndarray, ...] = ()
) -> None:
    """Element-wise reduction of equally shaped 1-D ``inputs`` into ``out`` ("avg" = mean).

    Works block by block so that the passes over a block (adding each input, scaling for
    "avg", copying into each of ``copies``) read memory once. Integer "avg" divides in
    floating point and truncates toward zero when cast back.
    """
    ufunc = _UFUNCS[op]
    scale = 1.0 / len(inputs)
    for start in range(0, len(out), BLOCK):
        block = slice(start, start + BLOCK)
        dst = out[block]
        if len(inputs) == 1:
            np.copyto(dst, inputs[0][block])
        else:
            ufunc(inputs[0][block], inputs[1][block], out=dst)
            for x in inputs[2:]:
                ufunc(dst, x[block], out=dst)
        if op == "avg":
            if dst.dtype.kind in "fc":
                dst *= dst.dtype.type(scale)
            else:
                # Divide, not multiply by 1/n: 49 * (1/49) is just below 1.
                np.copyto(dst, dst / len(inputs), casting="unsafe")
        for copy in copies:
            copy[block] = dst
