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
Where PyTorch is installed, bfloat16 vectors of :data:`TORCH_FROM` elements or more are added,
multiplied and divided by PyTorch's CPU kernels instead, which do the same arithmetic (float32,
then round to nearest even: the same bits, checked value by value in the tests) about 6 times
faster than ml_dtypes' ufuncs. What is installed decides, never what happens to be imported
(``ALLREDUCE_BF16_KERNEL``, agreed on by every rank, overrides it: :func:`bfloat16_kernel`), so
a run reduces with the same kernel whatever else it runs; :func:`kernels` names them. Nothing
here imports PyTorch at ``import algorithms``: the first bfloat16 vector long enough for it
does (about a second and 190 MiB per process, which a float32 all-reduce never pays), and
where that import fails ml_dtypes goes on (the same bits) and :func:`kernels` says so.

PyTorch's kernels run on one thread inside the collectives (the caller's
``torch.get_num_threads()`` is set to 1 around each call and put back): its intra-op pool
would otherwise spin beside the other ranks, which poll for their messages on the same cores
(a 2-rank 1 MiB ring on 2 cores: 12 ms a call with 2 threads, 0.43 ms with 1), and every
other combine here, a NumPy ufunc, runs on one thread too.
"""

import functools
import importlib.metadata
import importlib.util

import ml_dtypes
import numpy as np

from .device import steps
from .dtypes import DTYPES, LOW_PRECISION
from .settings import setting

#: Op name -> name of the element-wise ufunc that combines two partial results.
OPS = {
    "sum": "add",
    "prod": "multiply",
    "max": "maximum",
    "min": "minimum",
    "avg": "add",
}

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


#: bfloat16 vectors at least this long go to PyTorch's kernels (below, a call's 5 us overhead
#: outweighs what it saves)
TORCH_FROM = 8192
_BF16 = np.dtype(ml_dtypes.bfloat16)
#: NumPy ufunc -> the PyTorch function that computes it in bfloat16
_TORCH_FUNCTIONS = {"add": "add", "multiply": "mul", "divide": "div"}
#: why PyTorch's kernels could not be loaded in this process (None: not tried, or loaded)
_TORCH_FAILED = [None]


@functools.cache
def torch_installed():
    """Whether PyTorch is installed (found by ``importlib.util.find_spec``, not imported)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def bfloat16_kernel():
    """``"torch"`` or ``"ml_dtypes"``: which kernel adds, multiplies and divides long bfloat16
    vectors here, from ``ALLREDUCE_BF16_KERNEL`` (``auto``: PyTorch where installed)."""
    chosen = setting("ALLREDUCE_BF16_KERNEL")
    if chosen == "auto":
        chosen = "torch" if torch_installed() else "ml_dtypes"
    return chosen


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def kernels(dtypes=None):
    """Dtype name -> the kernel that reduces it on the CPU, for ``dtypes`` (names or dtypes;
    None: every one of :data:`DTYPES`), e.g. ``{"bfloat16": "PyTorch 2.13.0+cpu (sum, prod, avg
    from 8192 elements, one thread; ml_dtypes 0.7.0 below and for max, min)", "float32": "NumPy
    2.4.6"}``. Imports nothing."""
    names = [np.dtype(d).name for d in (DTYPES if dtypes is None else dtypes)]
    numpy_text, ml_text = f"NumPy {np.__version__}", f"ml_dtypes {_version('ml_dtypes')}"
    bf16 = ml_text
    try:
        chosen = bfloat16_kernel()
    except ValueError as exc:  # an invalid ALLREDUCE_BF16_KERNEL, refused where a communicator is first used
        chosen, bf16 = None, f"{ml_text} ({exc})"
    if chosen == "torch" and _TORCH_FAILED[0]:
        bf16 = f"{ml_text} (PyTorch is installed but {_TORCH_FAILED[0]})"
    elif chosen == "torch":
        bf16 = (f"PyTorch {_version('torch')} (sum, prod, avg from {TORCH_FROM} elements, one thread; "
                f"{ml_text} below and for max, min)")
    elif chosen == "ml_dtypes" and setting("ALLREDUCE_BF16_KERNEL") == "ml_dtypes":
        bf16 = f"{ml_text} (ALLREDUCE_BF16_KERNEL=ml_dtypes)"
    return {name: bf16 if name == "bfloat16" else ml_text if np.dtype(name) in LOW_PRECISION else numpy_text
            for name in names}


def kernels_text(dtypes=None):
    """:func:`kernels` in one line, the dtypes that share a kernel together:
    "bfloat16: PyTorch 2.13.0+cpu (...); float32, float64: NumPy 2.4.6"."""
    groups = {}
    for name, kernel in kernels(dtypes).items():
        groups.setdefault(kernel, []).append(name)
    return "; ".join(f"{', '.join(names)}: {kernel}" for kernel, names in groups.items())


@functools.cache
def _torch_kernel(name):
    """PyTorch's bfloat16 kernel for NumPy ufunc ``name`` (add, multiply, divide), as
    ``kernel(a, b, out)`` on NumPy vectors (``b`` a vector or a number), on one thread (module
    docstring); PyTorch imported here, on first use. None where it cannot be imported."""
    try:
        import torch
        function = getattr(torch, _TORCH_FUNCTIONS[name])
        bf16, wrap = torch.bfloat16, torch.from_numpy
    except Exception as exc:  # ImportError, or a broken install: ml_dtypes gives the same bits
        _TORCH_FAILED[0] = f"does not import ({type(exc).__name__}: {exc})"
        return None
    threads, set_threads = torch.get_num_threads, torch.set_num_threads

    def kernel(a, b, out):
        b = wrap(b.view(np.int16)).view(bf16) if type(b) is np.ndarray else b
        had = threads()
        if had == 1:
            function(wrap(a.view(np.int16)).view(bf16), b, out=wrap(out.view(np.int16)).view(bf16))
            return
        set_threads(1)
        try:
            function(wrap(a.view(np.int16)).view(bf16), b, out=wrap(out.view(np.int16)).view(bf16))
        finally:
            set_threads(had)
    return kernel


def _with_torch(plain, name):
    """``plain``, but where :func:`bfloat16_kernel` is PyTorch's, bfloat16 vectors of
    :data:`TORCH_FROM` elements or more, writable (PyTorch wraps no read-only memory), to its
    kernel for ufunc ``name``, found on the first such vector."""
    if name not in _TORCH_FUNCTIONS or bfloat16_kernel() != "torch":
        return plain
    fast = None

    def combine(a, b, out):
        nonlocal fast
        if (a.dtype == _BF16 and a.size >= TORCH_FROM and a.flags.writeable and out.flags.writeable
                and (type(b) is not np.ndarray or b.flags.writeable)):
            if fast is None:
                fast = _torch_kernel(name) or plain
            fast(a, b, out)
        else:
            plain(a, b, out)
    return combine


def combiner(xp, op):
    """``combine(a, b, out)``: ``out = a (op) b`` element-wise in array module ``xp``. For
    NumPy's add and multiply the ufunc itself, its output positional (a 2-element add: 0.34 us,
    against 0.59 us with ``out=``); otherwise the ufunc called with ``out=``. Where PyTorch is
    installed, long bfloat16 vectors are added and multiplied by its kernels (module docstring);
    on the device, bfloat16 vectors by our kernel, the same arithmetic (:mod:`.device`)."""
    if xp is not np:
        return steps(xp).combiner(OPS[op], op)
    ufunc = getattr(xp, OPS[op])
    plain = ufunc if OPS[op] in _POSITIONAL_OUT else (lambda a, b, out: ufunc(a, b, out=out))
    return _with_torch(plain, OPS[op])


def divider(xp):
    """``divide(a, n, out)``: ``out = a / n`` in array module ``xp`` (avg's last step), rounded
    once to the type (the 2-byte and 1-byte floats computed in float32, which rounds their
    quotients innocuously: 24 >= 2p + 2 bits); long bfloat16 vectors by PyTorch's kernel where it
    is installed (the same float32 division), on the device by ours."""
    if xp is not np:
        return steps(xp).divider()

    def divide(a, n, out):
        if a.itemsize <= 2:  # n as a float32: the type itself may not hold it (float8_e5m2 has no 9, float16 no 2049)
            np.divide(a, np.float32(n), out=out, casting="unsafe")
        else:
            np.divide(a, n, out=out)
    return _with_torch(divide, "divide")
