"""Array-module-agnostic buffer handling: NumPy on the host, CuPy on the device.

Nothing here imports CuPy unless a buffer that is not a NumPy array arrives.
"""

import numpy as np


def array_module(buf):
    """``numpy`` or ``cupy``, whichever owns ``buf``; ``TypeError`` for anything else."""
    if isinstance(buf, np.ndarray):
        return np
    if type(buf).__module__.split(".")[0] == "cupy":
        import cupy

        if isinstance(buf, cupy.ndarray):
            return cupy
    raise TypeError(
        f"buffers must be 1-D contiguous NumPy or CuPy arrays, got {type(buf).__name__}"
    )


def is_device(xp):
    """True when ``xp`` is CuPy (device memory)."""
    return xp.__name__ == "cupy"


def check_vector(buf, name, writable=False):
    """Check that ``buf`` is a 1-D C-contiguous array; return its module."""
    xp = array_module(buf)
    if buf.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(buf.shape)}; pass buf.ravel()")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name} must be contiguous; pass {name}.copy()")
    if writable and xp is np and not buf.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return xp


def data_pointer(buf):
    """Address of the first element (host or device)."""
    if isinstance(buf, np.ndarray):
        return buf.__array_interface__["data"][0]
    return buf.data.ptr


def same_memory(a, b):
    """True when ``a`` and ``b`` are the same buffer (same start, size and type)."""
    return (
        a is b
        or (type(a) is type(b) and a.nbytes == b.nbytes and data_pointer(a) == data_pointer(b))
    )


def overlaps(a, b):
    """True when the byte ranges of ``a`` and ``b`` intersect."""
    if type(a) is not type(b) or a.nbytes == 0 or b.nbytes == 0:
        return False
    pa, pb = data_pointer(a), data_pointer(b)
    return pa < pb + b.nbytes and pb < pa + a.nbytes


def stream_synchronize(xp):
    """Wait for queued device work before MPI touches device memory (no-op for NumPy)."""
    if is_device(xp):
        xp.cuda.get_current_stream().synchronize()


def copy_into(dst, src):
    """Element copy ``dst[...] = src`` with the owning module."""
    array_module(dst).copyto(dst, src)
