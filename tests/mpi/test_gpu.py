"""Every algorithm on CuPy device buffers, under mpiexec (skipped without CuPy and a GPU):
each transport that can run here (CUDA IPC within the node, staged through pinned host
memory, CUDA-aware MPI when the library is), against NumPy's reduction, bit for bit."""

import os

import numpy as np
import pytest
from conftest import counts_for, numpy_reference, options, rank_input, wrong_elements

import algorithms

cupy = pytest.importorskip("cupy")
try:
    GPUS = cupy.cuda.runtime.getDeviceCount()
except Exception:  # CUDA driver missing
    GPUS = 0
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(GPUS == 0, reason="no CUDA GPU visible to CuPy")]

KINDS = ["shm", "staged"] + (["direct"] if algorithms.mpi_is_cuda_aware() else [])


@pytest.fixture(params=KINDS)
def device_comm(request, comm):
    """A fresh communicator whose device transport is ``request.param`` (read on first use)."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    cupy.cuda.Device(local.Get_rank() % GPUS).use()
    local.Free()
    old = os.environ.get("ALLREDUCE_TRANSPORT")
    os.environ["ALLREDUCE_TRANSPORT"] = request.param
    fresh = comm.Dup()
    try:
        algorithms.transport_in_use(cupy, fresh)
        yield fresh
    finally:
        fresh.Free()
        if old is None:
            os.environ.pop("ALLREDUCE_TRANSPORT")
        else:
            os.environ["ALLREDUCE_TRANSPORT"] = old


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "float64"])
@pytest.mark.parametrize("algorithm", sorted(algorithms.ALGORITHMS))
def test_allreduce_on_device_buffers(device_comm, algorithm, dtype):
    comm = device_comm
    failures = []
    for op in [op for op in algorithms.OPS if not (op == "avg" and np.dtype(dtype).kind != "f")]:
        for count in counts_for(comm.size):
            x = rank_input(dtype, op, count, comm.rank, comm.size)
            expected = numpy_reference(dtype, op, count, comm.size)
            for in_place in (False, True):
                send = cupy.asarray(x)
                recv = send if in_place else cupy.full_like(send, 99)
                algorithms.allreduce(send, None if in_place else recv, op=op, algorithm=algorithm, comm=comm,
                                     **options(algorithm, comm.size))
                bad = wrong_elements(recv.get(), expected)
                if bad:
                    failures.append((op, count, in_place, bad))
    assert failures == []


def test_reduce_scatter_and_all_gather_on_device_buffers(device_comm):
    comm = device_comm
    n, rank = comm.size, comm.rank
    count = 1_000_003
    x = rank_input("float32", "sum", count, rank, n)
    expected = numpy_reference("float32", "sum", count, n)
    offsets = algorithms.chunk_offsets(count, n)
    mine = algorithms.reduce_scatter(cupy.asarray(x), cupy.empty(offsets[rank + 1] - offsets[rank], cupy.float32),
                                     comm=comm)
    assert wrong_elements(mine.get(), expected[offsets[rank]:offsets[rank + 1]]) == 0
    whole = algorithms.all_gather(mine, cupy.empty(count, cupy.float32), comm=comm)
    assert wrong_elements(whole.get(), expected) == 0
