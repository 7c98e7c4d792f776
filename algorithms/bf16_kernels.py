"""bfloat16 reductions on the GPU, bit for bit those of the host (ml_dtypes' ufuncs, PyTorch's
CPU kernels).

CuPy 14 holds bfloat16 arrays but promises nothing about its arithmetic on them, so device
bfloat16 vectors are combined by kernels of our own on their 16-bit words: each element widened
to float32, combined in float32, rounded back to nearest even. The arithmetic and the kernels are
``kernels/bfloat16.h``, the same text that tests/test_bf16_kernel.py compiles with the host's C
compiler and checks against ml_dtypes and PyTorch. CuPy is imported inside the functions only:
importing this module needs no CuPy, and nothing here runs without CuPy and a GPU.
"""

import functools
from pathlib import Path

import numpy as np

HEADER = Path(__file__).resolve().parent / "kernels" / "bfloat16.h"
#: NVRTC options. No -ftz=false: CuPy appends -ftz=true to every module's options and the last
#: one wins (cupy/cupy#9576), so the header's float32 arithmetic is PTX that keeps subnormals
#: whatever the flag; these two keep any plain float expression IEEE (no contraction to FMA,
#: division correctly rounded).
OPTIONS = ("-fmad=false", "-prec-div=true")
THREADS = 256
MAX_BLOCKS = 4096  # grid-stride beyond 1 Mi elements
_KERNELS = {"sum": "bf16_add_kernel", "prod": "bf16_mul_kernel", "max": "bf16_max_kernel",
            "min": "bf16_min_kernel", "avg": "bf16_add_kernel"}


@functools.cache
def _module():
    import cupy

    return cupy.RawModule(code=HEADER.read_text(), options=OPTIONS)


@functools.cache
def _kernel(name):
    """The header's kernel ``name``: compiled on first use, once a process and device (CuPy
    caches the module and each kernel's function per device)."""
    return _module().get_function(name)


def _check(*vectors):
    n = vectors[-1].size
    for v in vectors:
        if v.itemsize != 2 or v.size != n or not v.flags.c_contiguous:
            raise ValueError(f"bfloat16 kernels take contiguous vectors of 2-byte elements and one length; "
                             f"got {v.dtype} shape {v.shape} (out: {n} elements)")
    return n


def _launch(kernel, n, args):
    import cupy

    if n:
        blocks = min(-(-n // THREADS), MAX_BLOCKS)
        kernel((blocks,), (THREADS,), args, stream=cupy.cuda.get_current_stream())


def combiner(op):
    """``combine(a, b, out)``: ``out = a (op) b`` element-wise on CuPy vectors of bfloat16 (or
    their uint16 words), on CuPy's current stream; ``out`` may be ``a`` or ``b``. ``avg``
    combines as ``sum``."""
    name = _KERNELS[op]

    def combine(a, b, out):
        n = _check(a, b, out)
        _launch(_kernel(name), n, (a.view(np.uint16), b.view(np.uint16), out.view(np.uint16), np.int64(n)))
    return combine


def divider():
    """``divide(a, n, out)``: ``out = a / n`` element-wise (avg's last step), ``n`` the rank
    count, divided by as the float32 ``n`` (exact to 2^24), as the host's avg divides
    (:func:`algorithms.ops.divider`, and PyTorch's kernel), not by ``n`` rounded to bfloat16,
    which holds no 257."""
    def divide(a, n, out):
        size = _check(a, out)
        _launch(_kernel("bf16_div_kernel"), size, (a.view(np.uint16), np.float32(n), out.view(np.uint16),
                                                   np.int64(size)))
    return divide
