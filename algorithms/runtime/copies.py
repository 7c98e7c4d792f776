"""The one copy every transport and algorithm makes between its vectors and the shared boxes.

NumPy's ``copyto`` is glibc's ``memcpy``, which from about 2 KiB to a few hundred KiB is
``rep movsb``; some x86 cores (AMD EPYC among them) run that up to 16 times slower when the
target lies 1 to 63 bytes past the source modulo 4096, which is where two vectors allocated one
after the other lie (malloc's 16-byte header), and where a vector at such an offset lies from a
page-aligned shared box. The compiled engine's ``copy`` copies those backwards instead
(``copy_bytes`` in ``compiled_engine.c``): 2.8 us for 64 KiB against glibc's 33. Where the
extension is not built, or for arrays it does not take (CuPy's, other types, strided views), the
copy is the array module's ``copyto``.
"""

import numpy as np

try:
    from ._compiled_engine import copy as _copy_bytes
except ImportError:  # built without a C compiler
    _copy_bytes = None


def copy(target, source):
    """``numpy.copyto(target, source)`` for NumPy arrays, by the compiled copy where it applies
    (two C-contiguous arrays of one dtype and shape)."""
    if _copy_bytes is not None and target.dtype == source.dtype:
        try:
            _copy_bytes(target, source)
            return
        except (BufferError, ValueError, TypeError):
            pass
    np.copyto(target, source)


def copy_for(xp):
    """The copy for arrays of module ``xp``: :func:`copy` for NumPy, ``xp.copyto`` otherwise."""
    return copy if xp is np else xp.copyto
