"""Array-module-agnostic buffer handling: NumPy on the host, CuPy on the device.

Nothing here imports CuPy unless a buffer that is not a NumPy array arrives.
"""

import numpy as np

try:  # the C function itself: numpy's public wrapper adds ~0.1 us of dispatch to every call
    from numpy._core._multiarray_umath import may_share_memory as _numpy_may_share_memory
except ImportError:  # NumPy 1.x
    _numpy_may_share_memory = np.may_share_memory


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
    xp = np if isinstance(buf, np.ndarray) else array_module(buf)
    if buf.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(buf.shape)}; pass buf.ravel()")
    flags = buf.flags
    if not flags.c_contiguous:
        raise ValueError(f"{name} must be contiguous; pass {name}.copy()")
    if writable and xp is np and not flags.writeable:
        raise ValueError(f"{name} is read-only")
    return xp


def data_pointer(buf):
    """Address of the first element (host or device)."""
    if isinstance(buf, np.ndarray):
        return buf.__array_interface__["data"][0]
    return buf.data.ptr


def _may_overlap(a, b):
    """Cheap first test (no pointer lookup): can the byte ranges of ``a`` and ``b`` intersect?"""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        # two arrays that each own their memory hold different memory (no call needed)
        return (a.base is not None or b.base is not None or a is b) and _numpy_may_share_memory(a, b)
    return array_module(a).may_share_memory(a, b)


def same_memory(a, b):
    """True when ``a`` and ``b`` are the same buffer (same start, size and type)."""
    return a is b or (a.nbytes == b.nbytes and _may_overlap(a, b) and data_pointer(a) == data_pointer(b))


def overlaps(a, b):
    """True when the byte ranges of ``a`` and ``b`` intersect (1-D contiguous buffers)."""
    return a.nbytes != 0 and b.nbytes != 0 and _may_overlap(a, b)
