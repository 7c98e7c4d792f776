"""Every algorithm on CuPy device buffers, under mpiexec (skipped without CuPy and a GPU): each
transport that can run here (CUDA IPC within the node, staged through pinned host memory,
CUDA-aware MPI when the library is), against NumPy's reduction, bit for bit; and the defects that
only a GPU can show, each test saying why no CPU test sees it: the staged transport's copies
ordered after the current stream's kernels, CUDA IPC memory freed only after every peer closed
its mapping, peer mappings said to be on this rank's device, device buffers settled before a
CUDA-aware MPI touches them."""

import os
import time

import numpy as np
import pytest
from conftest import counts_for, numpy_reference, options, rank_input, wrong_elements
from mpi4py import MPI

import algorithms
from algorithms.device import lacks
from algorithms.runtime.executor import private_comm
from algorithms.ops import is_floating

cupy = pytest.importorskip("cupy")
try:
    GPUS = cupy.cuda.runtime.getDeviceCount()
except Exception:  # CUDA driver missing
    GPUS = 0
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(GPUS == 0, reason="no CUDA GPU visible to CuPy")]

KINDS = ["shm", "staged"] + (["direct"] if algorithms.mpi_is_cuda_aware() else [])
#: a kernel that waits about ``cycles`` clock ticks, then copies ``src`` into ``dst``: a reader (or
#: writer) still queued on the current stream when the host moves on
LATE_COPY = r"""
extern "C" __global__ void late_copy(const float *src, float *dst, long long n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""
SLOW = 200_000_000  # clock ticks: about 0.1 s on a 2 GHz GPU, far longer than a staged copy


def late_copy(src, dst):
    kernel = cupy.RawKernel(LATE_COPY, "late_copy")
    kernel((64,), (256,), (src, dst, np.int64(src.size), np.int64(SLOW)))


def use_local_gpu(comm):
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    cupy.cuda.Device(local.Get_rank() % GPUS).use()
    local.Free()


@pytest.fixture(params=KINDS)
def device_comm(request, comm):
    """A fresh communicator whose device transport is ``request.param`` (read on first use)."""
    use_local_gpu(comm)
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


def staged_comm(comm):
    os.environ["ALLREDUCE_TRANSPORT"] = "staged"
    try:
        fresh = comm.Dup()
        algorithms.transport_in_use(cupy, fresh)
        return fresh
    finally:
        os.environ.pop("ALLREDUCE_TRANSPORT")


DEVICE_DTYPES = ["float32", "float16", "int32", "float64"] + (["bfloat16"] if lacks("bfloat16") is None else [])


@pytest.mark.parametrize("dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("algorithm", sorted(set(algorithms.ALGORITHMS) - {"native"}))
def test_allreduce_on_device_buffers(device_comm, algorithm, dtype):
    comm = device_comm
    failures = []
    for op in [op for op in algorithms.OPS if not (op == "avg" and not is_floating(dtype))]:
        for count in counts_for(comm.size):
            x = rank_input(dtype, op, count, comm.rank, comm.size)
            expected = numpy_reference(dtype, op, count, comm.size)
            for in_place in (False, True):
                send = cupy.asarray(x)
                recv = send if in_place else cupy.zeros_like(send)
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


def test_a_staged_receive_waits_for_the_kernels_still_reading_its_buffer(comm):
    """Rank 0 queues a slow kernel that reads ``buf``, then receives a message into ``buf``
    through the staged transport: the copy into ``buf`` (a side stream) must wait for that
    kernel, which therefore copies the old ones, and kernels queued after the receive see the
    message. Before the fix the side stream ran the copy at once. No CPU test sees it: on host
    memory a copy is done when it returns."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    use_local_gpu(comm)
    staged = staged_comm(comm)
    coll = private_comm(staged).collective(cupy, "sum")
    try:
        for n in (1 << 18, 3 << 18):  # one staged chunk (1 MiB), then three: the pipelined path
            if comm.rank == 1:
                coll.send(cupy.full(n, 7, cupy.float32), 0)
            elif comm.rank == 0:
                buf, seen = cupy.ones(n, cupy.float32), cupy.zeros(n, cupy.float32)
                late_copy(buf, seen)  # still queued when the receive's copy is issued
                coll.recv(buf, 1)
                after = buf * 1  # queued after the receive
                assert float(seen.max()) == 1.0 and float(seen.min()) == 1.0  # the slow kernel read the old buf
                assert float(after.min()) == 7.0 and float(after.max()) == 7.0
    finally:
        staged.Free()


def test_a_staged_send_sends_what_the_kernels_queued_before_it_write(comm):
    """Rank 1 queues a slow kernel that writes ``buf``, then sends ``buf`` through the staged
    transport (nonblocking and blocking): the copy to the host must wait for that kernel. No CPU
    test sees it, as above."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    use_local_gpu(comm)
    staged = staged_comm(comm)
    coll = private_comm(staged).collective(cupy, "sum")
    n = 3 << 20  # three staged chunks: the pipelined path
    try:
        if comm.rank == 1:
            for send in (coll.send, lambda buf, dest: coll.isend(buf, dest).Wait()):
                buf = cupy.zeros(n, cupy.float32)
                late_copy(cupy.full(n, 5, cupy.float32), buf)
                send(buf, 0)
        elif comm.rank == 0:
            for _ in range(2):
                got = cupy.zeros(n, cupy.float32)
                coll.recv(got, 1)
                assert float(got.min()) == 5.0 and float(got.max()) == 5.0
    finally:
        staged.Free()


def test_ipc_memory_is_freed_only_after_every_peer_closed_its_mapping(comm):
    """Rank 1 starts freeing half a second after rank 0: rank 0's free must not return before
    rank 1 began (and closed its mapping of rank 0's memory); CUDA makes freeing an exported
    allocation while a peer maps it undefined. Before the fix each rank freed at once. No CPU test
    sees it: host slots are an MPI window, freed collectively by MPI."""
    from algorithms.runtime.transports.cuda_ipc import DeviceSlots

    if comm.size < 2:
        pytest.skip("needs two ranks")
    use_local_gpu(comm)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        slots = DeviceSlots(cupy, node, 1 << 20)
        comm.Barrier()
        if node.Get_rank() == 1:
            time.sleep(0.5)
        began = time.monotonic()  # CLOCK_MONOTONIC: one clock for the processes of a node
        slots.free()
        returned = time.monotonic()
        times = node.allgather((began, returned))
    finally:
        node.Free()
    assert times[0][1] >= times[1][0], times


def test_peer_mappings_are_on_this_ranks_device(comm):
    """Every view of the node's slots, peers' included, says it is on this rank's device, so CuPy
    checks no peer access on the kernels that read it. Asked, CUDA names the peer's device for a
    peer mapping: with one GPU per rank, before the fix, CuPy refused or checked. No CPU test sees
    it: host slots are NumPy arrays."""
    from algorithms.runtime.transports.cuda_ipc import DeviceSlots

    use_local_gpu(comm)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        slots = DeviceSlots(cupy, node, 1 << 16)
        assert all(view.data.mem.device_id == cupy.cuda.Device().id for view in slots.views)
        assert all(float(view.sum()) >= 0 for view in slots.views)  # a kernel on each, peers' included
        slots.free()
    finally:
        node.Free()


@pytest.mark.skipif(not algorithms.mpi_is_cuda_aware(), reason="needs a CUDA-aware MPI (device buffers go to MPI itself)")
def test_device_buffers_reach_mpi_settled(comm):
    """The mpi4py baseline hands device buffers to a CUDA-aware MPI, which does not order itself
    after CuPy's stream: a slow kernel still writing the input must finish first. No CPU test sees
    it: no stream on the host."""
    from bench.baselines.mpi4py import Mpi4pyBaseline
    from bench.core.collectives import AllReduce

    use_local_gpu(comm)
    run = Mpi4pyBaseline().runner(AllReduce, "mpi4py", comm, "sum")
    send, recv = cupy.zeros(1 << 20, cupy.float32), cupy.empty(1 << 20, cupy.float32)
    late_copy(cupy.full(1 << 20, comm.rank + 1, cupy.float32), send)
    run(send, recv)
    assert float(recv.min()) == float(recv.max()) == comm.size * (comm.size + 1) / 2
