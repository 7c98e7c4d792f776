"""Correctness inside every benchmark run: inputs whose exact all-reduce is known.

Small integers stored in any dtype add, multiply and compare exactly in any
order, so the expected result is computed in closed form, not by an all-reduce.
"""

import numpy as np

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def check_fill(dtype, op, count, rank, size):
    """Fresh input whose exact all-reduce is known (small integers add exactly in any order)."""
    i = np.arange(count)
    if op in ("sum", "avg"):
        return ((rank % 4) + (i % 3)).astype(dtype)
    if op == "prod":
        return np.where(i % size == rank, 2, 1).astype(dtype)
    return ((rank % 16) * 3 + i % 7).astype(dtype)


def check_expected(dtype, op, count, size):
    i = np.arange(count)
    if op in ("sum", "avg"):
        total = (sum(r % 4 for r in range(size)) + size * (i % 3)).astype(dtype)
        return np.divide(total, size).astype(dtype) if op == "avg" else total
    if op == "prod":
        return np.full(count, 2, dtype=dtype)
    if op == "max":
        return (3 * min(size - 1, 15) + i % 7).astype(dtype)
    return (i % 7).astype(dtype)


def wrong_elements(result, expected):
    """Number of elements of ``result`` that differ bit for bit from ``expected``."""
    width = _UNSIGNED[result.dtype.itemsize]
    return int(np.count_nonzero(result.view(width) != expected.view(width)))
