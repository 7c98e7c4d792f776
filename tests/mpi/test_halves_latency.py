"""Rabenseifner's reduce-scatter and all-gather with a radix k > 2 (``ALLREDUCE_RADIX``, read when a
communicator's plans are made, so each case runs on a fresh duplicate of COMM_WORLD): rank r gets
chunk r of chunk_offsets as NumPy reduces it, and every rank the whole vector as MPI_Allgatherv
gathers it, bit for bit, out of place and in place, at the small counts (0, 1, N-1, N, N+1, a
prime). Every dtype, op and the long vector's segments, and Bruck's all-gather (rd), run in
tests/mpi/test_correctness.py."""

import numpy as np
import pytest
from conftest import counts_for, numpy_reference, rank_input, wrong_elements

import algorithms

pytestmark = pytest.mark.mpi

@pytest.fixture(params=[3, 4, 64], ids=lambda k: f"radix{k}")
def radix_comm(request, comm, monkeypatch):
    """A duplicate of COMM_WORLD on which ``ALLREDUCE_RADIX`` is k (64: above N, one step)."""
    monkeypatch.setenv("ALLREDUCE_RADIX", str(request.param))
    dup = comm.Dup()
    yield dup
    dup.Free()


@pytest.mark.parametrize("dtype", ["int32", "bfloat16"])
def test_reduce_scatter_with_a_radix(radix_comm, dtype):
    comm, failures = radix_comm, []
    for op in ("sum", "max"):
        for count in counts_for(comm.size, large=False):
            x = rank_input(dtype, op, count, comm.rank, comm.size)
            offsets = algorithms.chunk_offsets(count, comm.size)
            own = numpy_reference(dtype, op, count, comm.size)[offsets[comm.rank]:offsets[comm.rank + 1]]
            out = np.full(own.size, 99, dtype=x.dtype)
            algorithms.reduce_scatter(x, out, op=op, algorithm="rabenseifner", comm=comm)
            if wrong_elements(out, own):
                failures.append(f"{op} n={count} out-of-place")
            if wrong_elements(x, rank_input(dtype, op, count, comm.rank, comm.size)):
                failures.append(f"{op} n={count}: sendbuf was modified")
            view = algorithms.reduce_scatter(x.copy(), op=op, algorithm="rabenseifner", comm=comm)
            if wrong_elements(view, own):
                failures.append(f"{op} n={count} in-place")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


@pytest.mark.parametrize("dtype", ["float64"])
def test_all_gather_with_a_radix(radix_comm, dtype):
    comm, failures = radix_comm, []
    for count in counts_for(comm.size, large=False):
        offsets = algorithms.chunk_offsets(count, comm.size)
        whole = rank_input(dtype, "max", count, 0, 1, salt=3)
        chunk = whole[offsets[comm.rank]:offsets[comm.rank + 1]].copy()
        native = np.empty_like(whole)
        comm.Allgatherv(chunk, [native, (np.diff(offsets).tolist(), offsets[:-1])])
        assert wrong_elements(native, whole) == 0
        out = algorithms.all_gather(chunk, np.zeros_like(whole), algorithm="rabenseifner", comm=comm)
        if wrong_elements(out, native):
            failures.append(f"n={count} out-of-place")
        inplace = np.zeros_like(whole)
        inplace[offsets[comm.rank]:offsets[comm.rank + 1]] = chunk
        algorithms.all_gather(inplace, algorithm="rabenseifner", comm=comm)
        if wrong_elements(inplace, native):
            failures.append(f"n={count} in-place")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)
