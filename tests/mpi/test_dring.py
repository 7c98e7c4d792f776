"""dring under mpiexec in the ranks' own order (the correctness suite runs it in the order of a
random matrix): every dtype and op, uneven counts, in and out of place, against NumPy's
reduction; random floats with the same bits on every rank."""

import numpy as np
import pytest
from conftest import LARGE_COUNT, counts_for, numpy_reference, rank_input, wrong_elements

import algorithms
from algorithms.ops import is_floating

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("dtype", [dt.name for dt in algorithms.DTYPES])
def test_every_dtype_and_op_in_the_ranks_order(comm, dtype):
    size, rank, failures = comm.Get_size(), comm.Get_rank(), []
    counts = counts_for(size, large=dtype == "float32") + [2 * size + 1, 6 * size - 1]
    for op in (op for op in algorithms.OPS if op != "avg" or is_floating(dtype)):
        for count in counts:
            x = rank_input(dtype, op, count, rank, size)
            expected = numpy_reference(dtype, op, count, size)
            out = algorithms.allreduce(x, np.empty_like(x), op=op, algorithm="dring", comm=comm)
            inplace = algorithms.allreduce(x.copy(), op=op, algorithm="dring", comm=comm)
            for way, result in (("out of place", out), ("in place", inplace)):
                if wrong_elements(result, expected):
                    failures.append(f"{op} n={count} {way}")
    assert not failures, f"rank {rank}: " + "; ".join(failures)


def test_the_same_bits_on_every_rank(comm):
    """Random float32 over several segments: each chunk is summed along one chain, so every
    rank holds the same bits, each within float32 rounding of the float64 sum."""
    size, rank = comm.Get_size(), comm.Get_rank()
    inputs = [np.random.default_rng(r).normal(0, 1e3, LARGE_COUNT).astype(np.float32) for r in range(size)]
    out = algorithms.allreduce(inputs[rank], np.empty(LARGE_COUNT, np.float32), algorithm="dring", comm=comm)
    every = comm.allgather(out.tobytes())
    assert all(bits == every[0] for bits in every)
    exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    bound = (size - 1) * np.finfo(np.float32).eps * np.sum([np.abs(x.astype(np.float64)) for x in inputs], axis=0)
    assert np.all(np.abs(out - exact) <= bound + 1e-30)

