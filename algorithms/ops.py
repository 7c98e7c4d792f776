"""Reduction operators and element types that every collective here supports.

An op is applied with the array's own module (``numpy`` or ``cupy``), as
``ufunc(a, b, out=out)``, so the same table serves CPU and GPU buffers.
``avg`` is ``sum`` followed by division by the rank count (floats only), as
NCCL's ``ncclAvg``.

The low-precision floats (``bfloat16``, ``float8_e4m3fn``, ``float8_e5m2``) are NumPy dtypes of
``ml_dtypes``; their ufuncs compute each element in float32 and round the result to the type
(round to nearest even), as NCCL's kernels do, so every reduction happens in the type's own
arithmetic. Two partial results combine the same way whichever rank combines them (IEEE
addition and multiplication commute), so every rank ends with bit-identical results.
"""

import ml_dtypes
import numpy as np

#: Op name -> name of the element-wise ufunc that combines two partial results.
OPS = {
    "sum": "add",
    "prod": "multiply",
    "max": "maximum",
    "min": "minimum",
    "avg": "add",
}

#: Supported element types, in a fixed order (the index is exchanged between ranks).
DTYPES = tuple(
    np.dtype(name)
    for name in (
        "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64",
    )
) + tuple(np.dtype(t) for t in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2))

#: The floating types NumPy does not count as floating (``kind`` is not ``"f"`` for all of them).
LOW_PRECISION = frozenset(DTYPES[-3:])
FLOATING = frozenset(dt for dt in DTYPES if dt.kind == "f") | LOW_PRECISION

DTYPE_INDEX = {dt: i for i, dt in enumerate(DTYPES)}
_OP_INDEX = {name: i for i, name in enumerate(OPS)}


def dtype_index(dtype):
    """Index of ``dtype`` in :data:`DTYPES`; ``TypeError`` naming the choices if unsupported."""
    try:  # a dtype itself, the usual case, needs no np.dtype() (a quarter of a microsecond)
        return DTYPE_INDEX[dtype]
    except (KeyError, TypeError):
        pass
    try:
        return DTYPE_INDEX[np.dtype(dtype)]
    except (KeyError, TypeError):
        choices = ", ".join(dt.name for dt in DTYPES)
        raise TypeError(f"unsupported dtype {dtype!s}; supported: {choices}") from None


def op_index(op):
    """Index of ``op`` in :data:`OPS`; ``ValueError`` naming the choices if unknown."""
    try:
        return _OP_INDEX[op]
    except (KeyError, TypeError):
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS)}") from None


def is_floating(dtype):
    """Whether ``dtype`` is one of our floating types, the low-precision ones included."""
    return np.dtype(dtype) in FLOATING


def check_op_dtype(op, dtype):
    """Reject combinations that have no exact meaning: ``avg`` needs a floating dtype."""
    if op == "avg" and not is_floating(dtype):
        raise TypeError(f"op 'avg' needs a floating dtype, got {np.dtype(dtype).name}; use 'sum'")


#: NumPy ufuncs whose output may be passed positionally (NumPy 2.4 deprecates that for
#: maximum and minimum, which take more than two inputs one day)
_POSITIONAL_OUT = {"add", "multiply"}


def combiner(xp, op):
    """``combine(a, b, out)``: ``out = a (op) b`` element-wise in array module ``xp``. For
    NumPy's add and multiply the ufunc itself, its output positional (a 2-element add: 0.34 us,
    against 0.59 us with ``out=``); otherwise the ufunc called with ``out=``, the form CuPy
    documents."""
    ufunc = getattr(xp, OPS[op])
    if xp is np and OPS[op] in _POSITIONAL_OUT:
        return ufunc
    return lambda a, b, out: ufunc(a, b, out=out)
