"""twoshot under mpiexec, beyond what test_correctness.py checks of every algorithm: vectors over
one box (4 KiB boxes) both ways, in one round of kernel copies a box at a time and in many
pieces through the boxes (ALLREDUCE_KERNEL_COPY=0), registered on some ranks and plain on
others, read in place where registered, the sum of rounded floats in rank order on every rank,
and ranks that run calls apart in time (the two boxes in turn); its reduce-scatter and all-gather
among its all-reduces on one communicator."""

import time

import numpy as np
import pytest
from conftest import numpy_reference, rank_input, wrong_elements

import algorithms
from algorithms.runtime.executor import private_comm

pytestmark = pytest.mark.mpi

BOX = 4096  # bytes: a float32 vector of 5000 elements goes in 5 pieces


@pytest.fixture(params=["auto", "0"], ids=["kernel", "boxes"])
def dup(comm, monkeypatch, request):
    """A communicator whose twoshot window has 4 KiB boxes, vectors over one box through the
    kernel where it allows that, or through the boxes (the settings are read when it is built)."""
    monkeypatch.setenv("ALLREDUCE_TWOSHOT_BYTES", str(BOX))
    monkeypatch.setenv("ALLREDUCE_KERNEL_COPY", request.param)
    dup = comm.Dup()
    try:
        yield dup
    finally:
        dup.Free()  # and our duplicate of it, with its windows


def one_node(comm):
    return private_comm(comm).resource("twoshot", algorithms.catalog.twoshot.TwoShotWindow).usable


@pytest.mark.parametrize("count", [0, 1, 1009, 5000, 20011])
def test_registered_on_some_ranks_and_plain_on_others(dup, count):
    """Each rank's send and receive vectors registered or not by its own choice (every rank's
    both, which runs all but a box in one round; every rank's send; and mixes), in place and
    out of place, in pieces: bit for bit NumPy's reduction."""
    rank, size = dup.Get_rank(), dup.Get_size()
    expected = numpy_reference("float32", "sum", count, size)
    patterns = [(True, True), (True, False), (rank % 2 == 0, rank % 3 == 0), (rank % 2 == 1, rank % 2 == 0)]
    failures = []
    for pattern, (send_registered, recv_registered) in enumerate(patterns):
        send = algorithms.alloc_registered(count, "float32", dup)  # collective: every rank allocates
        recv = algorithms.alloc_registered(count, "float32", dup)
        try:
            x = send if send_registered else np.empty(count, np.float32)
            out = recv if recv_registered else np.empty(count, np.float32)
            for in_place in (False, True):
                x[:] = rank_input("float32", "sum", count, rank, size)
                result = algorithms.allreduce(x, None if in_place else out, algorithm="twoshot", comm=dup)
                if wrong_elements(result, expected):
                    failures.append(f"pattern {pattern} ({send_registered=}, {recv_registered=}) {in_place=}")
        finally:
            algorithms.free_registered(recv, dup)
            algorithms.free_registered(send, dup)
    assert not failures, f"rank {rank}: " + "; ".join(failures)


def test_registered_vectors_are_read_in_place(dup):
    """A round from registered vectors leaves this rank's box as it was: the others read the
    vector where it lies, and its reduced slice where its result lies."""
    if dup.Get_size() < 2 or not one_node(dup):
        pytest.skip("needs two ranks on one node")
    rank, size, count = dup.Get_rank(), dup.Get_size(), BOX // 4
    boxes = private_comm(dup).resources["twoshot"]
    send = algorithms.alloc_registered(count, "float32", dup)
    recv = algorithms.alloc_registered(count, "float32", dup)
    try:
        send[:] = rank_input("float32", "sum", count, rank, size)
        for buffer in boxes.buffers[rank]:
            buffer[:] = 77
        algorithms.allreduce(send, recv, algorithm="twoshot", comm=dup)
        assert wrong_elements(recv, numpy_reference("float32", "sum", count, size)) == 0
        assert all((buffer == 77).all() for buffer in boxes.buffers[rank])
    finally:
        algorithms.free_registered(recv, dup)
        algorithms.free_registered(send, dup)


def test_long_plain_vectors_go_through_the_kernel(dup):
    """Where the kernel allows copies between the ranks (and the setting is not 0), a plain
    vector over one box leaves every box as it was: it went from memory to memory, in chunks of
    a box; in place and out of place, bit for bit NumPy's reduction. Elsewhere ``describe`` says
    the boxes carry it, and why."""
    if dup.Get_size() < 2 or not one_node(dup):
        pytest.skip("needs two ranks on one node")
    rank, size, count = dup.Get_rank(), dup.Get_size(), 5 * BOX // 4 + 3
    boxes = private_comm(dup).resources["twoshot"]
    if boxes.pids is None:
        assert "copies vectors over one box through its boxes" in algorithms.catalog.twoshot.ALGORITHM.describe(private_comm(dup), "shm")
        pytest.skip(boxes.detail)
    expected = numpy_reference("float32", "sum", count, size)
    for in_place in (False, True):
        for buffer in boxes.buffers[rank]:
            buffer[:] = 77
        x = rank_input("float32", "sum", count, rank, size)
        out = algorithms.allreduce(x, None if in_place else np.empty(count, np.float32), algorithm="twoshot", comm=dup)
        assert wrong_elements(out, expected) == 0
        assert all((buffer == 77).all() for buffer in boxes.buffers[rank]), f"{in_place=}"


def test_rounded_sums_are_rank_order_sums_on_every_rank(dup):
    """Random float32 over several pieces: every element is ((x0 + x1) + x2) + ... in float32, as
    one rank reduced it, and every rank holds those bits."""
    rank, size, count = dup.Get_rank(), dup.Get_size(), 3 * BOX // 4 + 7
    inputs = [np.random.default_rng(r).normal(0, 1e3, count).astype(np.float32) for r in range(size)]
    expected = inputs[0].copy()
    for x in inputs[1:]:
        expected += x
    out = algorithms.allreduce(inputs[rank], np.empty(count, np.float32), algorithm="twoshot", comm=dup)
    assert wrong_elements(out, expected) == 0
    every = dup.allgather(out.tobytes())
    assert all(bits == every[0] for bits in every)


def test_ranks_apart_in_time(dup):
    """Calls in a row, one rank late in each (a sleep before it), of one piece and of several,
    plain and registered: the late rank reads the box its peers posted while it slept, and
    they do not overwrite what it still reads."""
    rank, size = dup.Get_rank(), dup.Get_size()
    send = algorithms.alloc_registered(5000, "int32", dup)
    recv = algorithms.alloc_registered(5000, "int32", dup)
    failures = []
    try:
        for call in range(32):
            count = (1000, 5000, 3001)[call % 3]
            x = send[:count] if call % 4 < 2 else np.empty(count, np.int32)
            out = recv[:count] if call % 8 in (1, 2, 5) else np.empty_like(x)
            x[:] = rank_input("int32", "sum", count, rank, size, salt=call)
            if call % size == rank:
                time.sleep(0.003)
            algorithms.allreduce(x, out, algorithm="twoshot", comm=dup)
            out = out.copy()
            send[:], recv[:] = -7, -7  # the caller's again once the call returns: what a late rank reads must not be
            if wrong_elements(out, numpy_reference("int32", "sum", count, size, salt=call)):
                failures.append(f"call {call} (n={count})")
    finally:
        algorithms.free_registered(recv, dup)
        algorithms.free_registered(send, dup)
    assert not failures, f"rank {rank}: " + "; ".join(failures)


KINDS = ("allreduce", "reduce_scatter", "all_gather")


def rank_order_sums(count, size, call):
    """Every rank's random float32 input of call ``call``, and their sum in rank order in
    float32, ((x0 + x1) + x2) + ..., as NumPy adds them."""
    inputs = [np.random.default_rng((call, r)).normal(0, 1e3, count).astype(np.float32) for r in range(size)]
    total = inputs[0].copy()
    for x in inputs[1:]:
        total += x
    return inputs, total


def one_call(kind, comm, x, mine, total, own, in_place):
    """``kind`` on ``x`` (a vector as long as the whole, which the call may use in place):
    ``(result, expected)``. The all-reduce and the reduce-scatter start from ``mine``, the
    all-gather from this rank's chunk of ``total``."""
    if kind == "allreduce":
        x[:] = mine
        out = None if in_place else np.empty_like(x)
        return algorithms.allreduce(x, out, algorithm="twoshot", comm=comm), total
    if kind == "reduce_scatter":
        x[:] = mine
        out = None if in_place else np.empty(own.stop - own.start, np.float32)
        return algorithms.reduce_scatter(x, out, algorithm="twoshot", comm=comm), total[own]
    if in_place:
        x[:] = 0
        x[own] = total[own]
        return algorithms.all_gather(x, algorithm="twoshot", comm=comm), total
    return algorithms.all_gather(total[own].copy(), x, algorithm="twoshot", comm=comm), total


def mixed_calls(comm, counts, calls, registered=None, late=False):
    """``calls`` calls in a row on ``comm``, every (kind, count of ``counts``, in place or not) at
    least once where there are that many calls, in one fixed shuffle (the same on every rank),
    from a registered vector (``registered``, as long as the longest count) on every other call,
    one rank late (a sleep) in each where ``late``: the wrong results against NumPy's rank-order
    sums, as strings. After each call the vectors are the caller's again: they are overwritten
    at once."""
    rank, size = comm.Get_rank(), comm.Get_size()
    cases = [(kind, count, in_place) for kind in KINDS for count in counts for in_place in (False, True)]
    order = np.random.default_rng(0).permutation(calls) % len(cases)
    failures = []
    for call, case in enumerate(order):
        kind, count, in_place = cases[case]
        inputs, total = rank_order_sums(count, size, call)
        offsets = algorithms.chunk_offsets(count, size)
        own = slice(offsets[rank], offsets[rank + 1])
        plain = registered is None or call % 2 == 0
        x = np.empty(count, np.float32) if plain else registered[:count]
        if late and call % size == rank:
            time.sleep(0.003)
        result, expected = one_call(kind, comm, x, inputs[rank], total, own, in_place)
        result = result.copy()
        x[:] = -7
        if wrong_elements(result, expected):
            failures.append(f"call {call}: {kind} n={count} {in_place=} registered={not plain}")
    return failures


def test_mixed_collectives_keep_the_rounds_in_step(dup):
    """All-reduces, reduce-scatters and all-gathers interleaved on one communicator, of one
    box or less and of several (4 KiB boxes), in and out of place, plain and registered, one
    rank late in each: every result NumPy's rank-order sum (or this rank's chunk of it), bit for
    bit; the rounds of every kind share the boxes and their counters."""
    count = 20011
    registered = algorithms.alloc_registered(count, "float32", dup)
    try:
        failures = mixed_calls(dup, [0, 1, 1009, 5000, count], 60, registered, late=True)
    finally:
        algorithms.free_registered(registered, dup)
    assert not failures, f"rank {dup.Get_rank()}: " + "; ".join(failures)


@pytest.mark.parametrize("kernel", ["auto", "0"], ids=["kernel", "boxes"])
def test_mixed_collectives_over_one_box_of_the_default_size(comm, monkeypatch, kernel):
    """The same mix at the default box size (1 MiB): vectors over it (1.2 MB) and under it."""
    monkeypatch.delenv("ALLREDUCE_TWOSHOT_BYTES", raising=False)
    monkeypatch.setenv("ALLREDUCE_KERNEL_COPY", kernel)
    dup = comm.Dup()
    try:
        failures = mixed_calls(dup, [1009, 300_007], 18)
    finally:
        dup.Free()
    assert not failures, f"rank {comm.Get_rank()}: " + "; ".join(failures)
