"""Correctness inside every benchmark run: inputs whose exact all-reduce is known.

Small integers stored in any dtype add, multiply and compare exactly in any
order, so the expected result is computed in closed form, not by an all-reduce.
A floating type holds every integer up to 2^(p+1) (p its mantissa bits: 8 for float8_e5m2,
16 for float8_e4m3fn, 256 for bfloat16, 2048 for float16); where a sum of the usual inputs
could pass that, the sum's inputs are 0 and 1 with at most that many ones per element.

``avg`` is the exact sum divided by the rank count in the type's own arithmetic, one rounding;
an implementation may round twice (NCCL scales every input by 1/N before summing), so ``avg``
on a floating type counts a result within one unit in the last place of that as right
(relative difference at most the type's epsilon). Every other result must match bit for bit.
"""

import numpy as np

from algorithms.ops import is_floating

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


def _most_ones(dtype, size):
    """None where the usual sum inputs (at most 5 a rank) add exactly in ``dtype`` in any order;
    else k, the most ones an element's sum may hold: min(size, 2^(p+1)), p the type's mantissa
    bits."""
    if not is_floating(dtype):
        return None  # integers wrap exactly
    exact = 2 ** (_finfo(dtype).nmant + 1)
    return None if 5 * size <= exact else min(size, exact)


def _ones(rank, size, k):
    """The 0/1 inputs of rank ``rank`` over one period: element i is 1 on the i % (k + 1) ranks
    from rank i on (cyclically), so its sum is i % (k + 1) and which ranks add moves with i."""
    period = np.lcm(size, k + 1)
    i = np.arange(period, dtype=np.int64)
    return ((rank - i) % size < i % (k + 1)).astype(np.int64)


def _finfo(dtype):
    import ml_dtypes

    return ml_dtypes.finfo(dtype)


def check_fill(dtype, op, count, rank, size):
    """Fresh input whose exact all-reduce is known (small integers add exactly in any order):
    element i is ``rank % 4 + i % 3`` (sum, avg; in the low-precision floats, where such sums
    could pass the integers the type holds, 0 or 1 as :func:`_ones`), 2 where ``i % size == rank`` else 1 (prod), ``3 (rank % 16) + i % 7``
    (max, min)."""
    if op in ("sum", "avg"):
        k = _most_ones(dtype, size)
        if k is not None:
            return periodic(_ones(rank, size, k), count, dtype)
        return periodic([rank % 4 + k for k in range(3)], count, dtype)
    if op == "prod":
        return periodic([2 if k == rank else 1 for k in range(size)], count, dtype)
    return periodic([(rank % 16) * 3 + k for k in range(7)], count, dtype)


def check_expected(dtype, op, count, size):
    """The exact all-reduce of :func:`check_fill` over ``size`` ranks."""
    if op in ("sum", "avg"):
        k = _most_ones(dtype, size)
        if k is not None:
            total = np.arange(k + 1, dtype=np.int64)
        else:
            base = sum(r % 4 for r in range(size))
            total = np.array([base + size * k for k in range(3)], dtype=np.int64)
        if op == "avg":  # the exact quotient rounded once to the type (float64 rounds it innocuously)
            return _repeated((total.astype(dtype).astype(np.float64) / size).astype(dtype), count)
        return periodic(total, count, dtype)
    if op == "prod":
        return np.full(count, 2, dtype=dtype)
    if op == "max":
        return periodic([3 * min(size - 1, 15) + k for k in range(7)], count, dtype)
    return periodic(list(range(7)), count, dtype)


def wrong_elements(result, expected, op=None):
    """Number of elements of ``result`` that differ bit for bit from ``expected``; for ``avg`` on
    a floating type, that differ by more than the type's epsilon relative to ``expected``
    (module docstring)."""
    width = _UNSIGNED[result.dtype.itemsize]
    differ = result.view(width) != expected.view(width)
    if op == "avg" and is_floating(result.dtype) and differ.any():
        near = np.abs(result[differ].astype(np.float64) - expected[differ].astype(np.float64))
        differ[differ] = ~(near <= np.abs(expected[differ].astype(np.float64)) * float(_finfo(result.dtype).eps))
    return int(np.count_nonzero(differ))
