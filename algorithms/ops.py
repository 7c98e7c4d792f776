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
Where PyTorch is already imported (a training program; nothing here imports it), bfloat16
vectors of :data:`TORCH_FROM` elements or more are added, multiplied and divided by PyTorch's
CPU kernels instead, which do the same arithmetic (float32, then round to nearest even: the same
bits, checked value by value in the tests) about 6 times faster than ml_dtypes' ufuncs.
"""

import sys

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


#: bfloat16 vectors at least this long go to PyTorch's kernels where PyTorch is imported
TORCH_FROM = 8192
_BF16 = np.dtype(ml_dtypes.bfloat16)


def _torch_kernel(name):
    """PyTorch's bfloat16 kernel for NumPy ufunc ``name`` (add, multiply, divide), as
    ``kernel(a, b, out)`` on NumPy vectors (``b`` a vector or a number), where PyTorch is already
    imported; else None."""
    torch = sys.modules.get("torch")
    function = {"add": "add", "multiply": "mul", "divide": "div"}.get(name)
    if torch is None or function is None or not hasattr(torch, "bfloat16"):
        return None
    function, bf16, wrap = getattr(torch, function), torch.bfloat16, torch.from_numpy

    def kernel(a, b, out):
        function(wrap(a.view(np.int16)).view(bf16), wrap(b.view(np.int16)).view(bf16) if type(b) is np.ndarray else b,
                 out=wrap(out.view(np.int16)).view(bf16))
    return kernel


def _with_torch(plain, fast):
    """``plain``, but bfloat16 vectors of :data:`TORCH_FROM` elements or more, writable (PyTorch
    wraps no read-only memory), to ``fast``."""
    if fast is None:
        return plain

    def combine(a, b, out):
        if (a.dtype == _BF16 and a.size >= TORCH_FROM and a.flags.writeable and out.flags.writeable
                and (type(b) is not np.ndarray or b.flags.writeable)):
            fast(a, b, out)
        else:
            plain(a, b, out)
    return combine


def combiner(xp, op):
    """``combine(a, b, out)``: ``out = a (op) b`` element-wise in array module ``xp``. For
    NumPy's add and multiply the ufunc itself, its output positional (a 2-element add: 0.34 us,
    against 0.59 us with ``out=``); otherwise the ufunc called with ``out=``, the form CuPy
    documents. Where PyTorch is imported, long bfloat16 vectors are added and multiplied by
    its kernels (module docstring)."""
    ufunc = getattr(xp, OPS[op])
    plain = ufunc if xp is np and OPS[op] in _POSITIONAL_OUT else (lambda a, b, out: ufunc(a, b, out=out))
    return _with_torch(plain, _torch_kernel(OPS[op]) if xp is np else None)


def divider(xp):
    """``divide(a, n, out)``: ``out = a / n`` in array module ``xp`` (avg's last step), long
    bfloat16 vectors by PyTorch's kernel where PyTorch is imported."""
    return _with_torch(lambda a, n, out: xp.divide(a, n, out=out), _torch_kernel("divide") if xp is np else None)
