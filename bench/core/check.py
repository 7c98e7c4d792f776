"""Correctness inside every benchmark run: inputs whose exact all-reduce is known.

Small integers stored in any dtype add, multiply and compare exactly in any
order, so the expected result is computed in closed form, not by an all-reduce.
"""

import numpy as np

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def periodic(values, count, dtype):
    """``values`` (small integers, computed as int64, then cast to ``dtype`` as ``astype`` casts)
    repeated over ``count`` elements. The vector is built by doubling copies, so no temporary
    larger than the pattern is made (a fill through ``np.arange`` takes 8 bytes per element,
    8 times an int8 vector)."""
    pattern = np.asarray(values, dtype=np.int64)
    pattern = pattern.astype(dtype) if pattern.dtype != np.dtype(dtype) else pattern
    return _repeated(pattern, count)


def _repeated(pattern, count):
    out = np.empty(count, pattern.dtype)
    filled = min(len(pattern), count)
    out[:filled] = pattern[:filled]
    while filled < count:  # out[:filled] holds whole periods: copy it after itself
        step = min(filled, count - filled)
        out[filled:filled + step] = out[:step]
        filled += step
    return out


def check_fill(dtype, op, count, rank, size):
    """Fresh input whose exact all-reduce is known (small integers add exactly in any order):
    element i is ``rank % 4 + i % 3`` (sum, avg), 2 where ``i % size == rank`` else 1 (prod),
    ``3 (rank % 16) + i % 7`` (max, min)."""
    if op in ("sum", "avg"):
        return periodic([rank % 4 + k for k in range(3)], count, dtype)
    if op == "prod":
        return periodic([2 if k == rank else 1 for k in range(size)], count, dtype)
    return periodic([(rank % 16) * 3 + k for k in range(7)], count, dtype)


def check_expected(dtype, op, count, size):
    """The exact all-reduce of :func:`check_fill` over ``size`` ranks."""
    if op in ("sum", "avg"):
        base = sum(r % 4 for r in range(size))
        total = np.array([base + size * k for k in range(3)], dtype=np.int64)
        if op == "avg":
            return _repeated(np.divide(total, size).astype(dtype), count)
        return periodic(total, count, dtype)
    if op == "prod":
        return np.full(count, 2, dtype=dtype)
    if op == "max":
        return periodic([3 * min(size - 1, 15) + k for k in range(7)], count, dtype)
    return periodic(list(range(7)), count, dtype)


def wrong_elements(result, expected):
    """Number of elements of ``result`` that differ bit for bit from ``expected``."""
    width = _UNSIGNED[result.dtype.itemsize]
    return int(np.count_nonzero(result.view(width) != expected.view(width)))
