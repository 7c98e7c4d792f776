"""Registered vectors (``alloc_registered``) under mpiexec: messages from them are read in
place by the receiver, every byte arrives, a send from one completes only once it was read,
every algorithm gives the exact reduction on them, and bad calls raise on every rank.

The transport tests use small slots (256 bytes) so that vectors of a few KiB are read in
place and messages beside them take many pieces, and send every large plain message through
MPI (``ALLREDUCE_SHM_BY_PAGES=0``; test_transport.py tests the route by pages); the
algorithm tests use the defaults.
"""

import time
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import counts_for, numpy_reference, options, rank_input, wrong_elements
from mpi4py import MPI

import algorithms
from algorithms.runtime.executor import WORKSPACE, Private
from algorithms.runtime.transports.mpi import DirectTransport
from algorithms.runtime.transports.registered import Registry
from algorithms.runtime.transports.shared_memory import SharedMemoryTransport
from algorithms.runtime.transports.shm_window import VIA_MPI

pytestmark = pytest.mark.mpi

SLOT = 256
SIZES = [1, SLOT, SLOT + 1, 3 * SLOT + 5, 5000, 40000]


@pytest.fixture
def private(comm, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_SHM_SLOT_BYTES", str(SLOT))
    monkeypatch.setenv("ALLREDUCE_SHM_MIN_BYTES", "64")
    monkeypatch.setenv("ALLREDUCE_SHM_MAX_BYTES", "4096")
    monkeypatch.setenv("ALLREDUCE_SHM_BY_PAGES", "0")  # plain ones over 4096 B via MPI, whatever their pages
    private = Private(comm.Dup())
    try:
        yield private
    finally:
        private.free()


def counting_direct_posts(transport):
    """Count the messages posted by label alone (read in place by the receiver)."""
    box, posts = transport.box, []
    plain = box.post_direct

    def post_direct(peer, raw, where, reply=None):
        posts.append(raw.size)
        return plain(peer, raw, where, reply)
    box.post_direct = post_direct
    return posts


def counting_via_mpi(transport):
    """Count the messages announced as following through MPI (plain, over the largest slot message)."""
    box, announced = transport.box, []
    plain = box.post_label

    def post_label(peer, size, value):
        if value == VIA_MPI:
            announced.append(size)
        return plain(peer, size, value)
    box.post_label = post_label
    return announced


def message(source, dest, index, nbytes):
    return ((np.arange(nbytes) * 31 + source * 7 + dest * 3 + index * 11) % 251).astype(np.uint8)


def test_all_pairs_from_registered_and_plain_vectors(comm, private):
    """Every rank sends every size to every other rank at once, half of them from one
    registered vector, half from plain arrays; receives go half into a registered vector.
    Registered messages over one slot must be read in place, plain ones over 4 KiB announced
    and sent through MPI, and every byte must arrive."""
    rank, size = comm.rank, comm.size
    transport = SharedMemoryTransport(private, np, WORKSPACE, DirectTransport)
    registry = private.resource("registered", Registry)
    assert registry is transport.registry
    peers = [p for p in range(size) if p != rank]
    total = sum(SIZES) * max(len(peers), 1)
    outbox, inbox = registry.alloc(total), registry.alloc(total)
    posts, announced = counting_direct_posts(transport), counting_via_mpi(transport)
    sends, receives, expected, at_out, at_in = [], [], {}, 0, 0
    for p in np.random.default_rng(rank).permutation(peers).tolist():
        for i, n in enumerate(SIZES):
            got = inbox[at_in:at_in + n] if i % 2 else np.full(n, 255, np.uint8)
            at_in += n
            expected[p, i] = got
            receives.append(transport.irecv(got, p))
    for p in peers:
        for i, n in enumerate(SIZES):
            if i % 2 == 0:
                buf = outbox[at_out:at_out + n]
                at_out += n
                buf[:] = message(rank, p, i, n)
            else:
                buf = message(rank, p, i, n)
            sends.append(transport.isend(buf, p))
    for r in receives + sends:
        r.Wait()
    wrong = [(p, SIZES[i]) for (p, i), got in expected.items() if not np.array_equal(got, message(p, rank, i, SIZES[i]))]
    assert wrong == []
    in_place = sorted(n for i, n in enumerate(SIZES) if i % 2 == 0 and n > SLOT) * len(peers)
    assert sorted(posts) == sorted(in_place)
    assert sorted(announced) == sorted([n for i, n in enumerate(SIZES) if i % 2 and n > 4096] * len(peers))
    assert "2 registered vector(s), read in place" in transport.describe()


def test_a_send_from_a_registered_vector_ends_only_once_read(comm, private):
    """The rendezvous: rank 0's send stays pending while rank 1 has not received, and what
    rank 1 gets is the vector as it was sent, although rank 0 overwrites it right after."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    transport = SharedMemoryTransport(private, np, WORKSPACE, DirectTransport)
    vector = private.resource("registered", Registry).alloc(10 * SLOT)
    original = message(0, 1, 0, vector.size)
    if comm.rank == 0:
        vector[:] = original
        handle = transport.isend(vector, 1)
        deadline = MPI.Wtime() + 0.05
        pending_throughout = True
        while MPI.Wtime() < deadline:
            pending_throughout &= not handle.Test()
        comm.send(pending_throughout, dest=1, tag=98)
        handle.Wait()
        vector[:] = 0
        comm.Barrier()
    elif comm.rank == 1:
        assert comm.recv(source=0, tag=98) is True
        got = np.zeros(vector.size, np.uint8)
        transport.recv(got, 0)
        comm.Barrier()
        assert np.array_equal(got, original)
    else:
        comm.Barrier()


@pytest.mark.parametrize("combine", [False, True])
def test_blocking_exchanges_between_registered_and_plain_senders(comm, private, combine):
    """Around the ring, even ranks send from a registered vector and odd ranks from plain
    arrays, so a registered sender meets one-piece, many-piece and through-MPI messages
    (sizes under one slot, over it, and over 4 KiB); blocking sendrecv, and sendrecv_combine.
    The registered vector is refilled right after each call: a send returns only once read."""
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    transport = SharedMemoryTransport(private, np, WORKSPACE, DirectTransport)
    vector = private.resource("registered", Registry).alloc(40000).view(np.float32)

    def values(r, i, count):
        return ((np.arange(count) % 97) + r * 3 + i).astype(np.float32)
    for i, nbytes in enumerate([128, 260, 3000, 5000, 40000]):
        count = nbytes // 4
        data = values(rank, i, count)
        if rank % 2 == 0:
            vector[:count] = data
            data = vector[:count]
        if combine:
            out = np.full(count, -1, np.float32)
            transport.sendrecv_combine(data, right, np.ones(count, np.float32), left, out, np.add)
            assert np.array_equal(out, values(left, i, count) + 1), nbytes
        else:
            got = np.full(count, -1, np.float32)
            transport.sendrecv(data, right, got, left)
            assert np.array_equal(got, values(left, i, count)), nbytes


@pytest.mark.parametrize("offers", [(True, True), (True, False), (False, True)])
def test_a_pairwise_exchange_puts_into_registered_receive_buffers(comm, private, offers):
    """Partners (0-1, 2-3, ...; a last odd rank with itself) exchange registered vectors by
    blocking sendrecv. When both receive into registered vectors, each writes its message into
    the other's (a put); when only one does, both read in place. Either way every byte is
    there when the call returns, although the higher rank of a pair copies 20 ms late, and the
    receive buffer may lie in the send buffer's vector (the ring's all-gather in place)."""
    rank, size = comm.rank, comm.size
    partner = rank ^ 1 if rank ^ 1 < size else rank
    offering = offers[0] if rank <= partner else offers[1]
    transport = SharedMemoryTransport(private, np, WORKSPACE, DirectTransport)
    registry = private.resource("registered", Registry)
    sizes = [SLOT + 1, 3 * SLOT + 5, 5000, 40000]
    whole = registry.alloc(2 * max(sizes))
    puts, offered = [], transport.box.offered

    def counted(peer, nbytes):
        target = offered(peer, nbytes)
        puts.append(target is not None)
        return target
    transport.box.offered = counted
    if rank > partner:  # a slow writer: its partner must wait for the put to land
        transport.xp = SimpleNamespace(copyto=lambda dst, src: (time.sleep(0.02), np.copyto(dst, src)))
    for i, n in enumerate(sizes):
        # the send at the front of the vector, the receive right behind it (or plain memory)
        send, recv = whole[:n], (whole[n:2 * n] if offering else np.empty(n, np.uint8))
        send[:] = message(rank, partner, i, n)
        recv[:] = 0
        transport.sendrecv(send, partner, recv, partner)
        assert np.array_equal(recv, message(partner, rank, i, n)), n
        assert np.array_equal(send, message(rank, partner, i, n)), n  # not written by the partner
        comm.Barrier()  # the partner has checked its receive before ours is overwritten
    both = offers == (True, True) or partner == rank
    assert puts == ([both] * len(sizes) if offering else [])


@pytest.mark.parametrize("count", [100, 1000, 5000])
def test_sendrecv_combine_reads_the_registered_vector(comm, private, count):
    """Around the ring: out = mine + the left neighbour's registered vector, reduced in place."""
    rank, size = comm.rank, comm.size
    transport = SharedMemoryTransport(private, np, WORKSPACE, DirectTransport)
    mine = private.resource("registered", Registry).alloc(4 * count).view(np.float32)
    posts = counting_direct_posts(transport)

    def vector(r):
        return (np.arange(count, dtype=np.float32) % 97) * (r + 1)
    mine[:] = vector(rank)
    out = np.full(count, -1, np.float32)
    transport.sendrecv_combine(mine, (rank + 1) % size, vector(rank) * 2, (rank - 1) % size, out, np.add)
    assert np.array_equal(out, vector(rank) * 2 + vector((rank - 1) % size))
    assert posts == [mine.nbytes]  # to itself too, on one rank


@pytest.mark.parametrize("count", [16, 100, 1000, 10000])
def test_recv_combine_reduces_straight_from_registered_vectors(comm, private, count):
    """Odd ranks send rank 0 a registered vector, even ranks a plain one (in slots, or through
    MPI when over 4 KiB); rank 0 adds them in rank order, reading the registered ones in place."""
    rank, size = comm.rank, comm.size
    transport = SharedMemoryTransport(private, np, WORKSPACE, DirectTransport)
    registry = private.resource("registered", Registry)
    mine = registry.alloc(4 * count).view(np.float32)
    reads, view = [], registry.view

    def counted_view(index, node_rank, offset, nbytes):
        reads.append(nbytes)
        return view(index, node_rank, offset, nbytes)
    registry.view = counted_view

    def vector(r):
        return (np.arange(count, dtype=np.float32) % 97) * (r + 1)
    mine[:] = vector(rank)
    if rank:
        transport.isend(mine if rank % 2 else vector(rank), 0).Wait()
    else:
        out, operands = vector(0), []

        def add(a, b, out):
            operands.append(b)
            np.add(a, b, out=out)
        for source in range(1, size):
            transport.recv_combine(out, source, out, add)
        assert np.array_equal(out, sum((vector(r) for r in range(1, size)), vector(0)))
        registered_senders = list(range(1, size, 2)) if 4 * count > SLOT else []
        assert reads == [4 * count] * len(registered_senders)
        parts = registry.windows[registry.locate(mine.view(np.uint8))[0]][1]
        for sender in registered_senders:  # reduced from the sender's memory, not from a copy
            assert any(np.shares_memory(b, parts[sender]) for b in operands), sender


ALGOS = ["ring", "tree", "bamtree", "ps", "rd", "twoshot"]


@pytest.mark.parametrize("algorithm", ALGOS)
@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_allreduce_on_registered_vectors_is_exact(comm, algorithm, dtype):
    """Out of place, in place, and registered beside plain, at sizes from 0 to past several
    2 MiB segments: bit for bit NumPy's reduction of small integers."""
    size = comm.size
    for count in counts_for(size):
        expected = numpy_reference(dtype, "sum", count, size)
        send = algorithms.alloc_registered(count, dtype)
        recv = algorithms.alloc_registered(count, dtype)
        try:
            for target in (recv, None, np.empty(count, dtype)):
                send[:] = rank_input(dtype, "sum", count, comm.rank, size)
                result = algorithms.allreduce(send, target, algorithm=algorithm, **options(algorithm, size))
                assert wrong_elements(result, expected) == 0, (count, "in place" if target is None else target is recv)
        finally:
            algorithms.free_registered(recv)
            algorithms.free_registered(send)


def test_reduce_scatter_and_all_gather_on_registered_vectors(comm):
    rank, size = comm.rank, comm.size
    count = 700_001
    send = algorithms.alloc_registered(count, "int32")
    whole = algorithms.alloc_registered(count, "int32")
    try:
        send[:] = rank_input("int32", "sum", count, rank, size)
        offsets = algorithms.chunk_offsets(count, size)
        mine = whole[offsets[rank]:offsets[rank + 1]]
        algorithms.reduce_scatter(send, mine)
        expected = numpy_reference("int32", "sum", count, size)
        assert wrong_elements(mine, expected[offsets[rank]:offsets[rank + 1]]) == 0
        algorithms.all_gather(whole)
        assert wrong_elements(whole, expected) == 0
    finally:
        algorithms.free_registered(whole)
        algorithms.free_registered(send)


def test_bad_registration_calls_raise_on_every_rank(comm):
    with pytest.raises(ValueError, match="alloc_registered: count must be a non-negative integer"):
        algorithms.alloc_registered(-1 if comm.rank == comm.size - 1 else 10)
    with pytest.raises(TypeError, match="unsupported dtype complex128"):
        algorithms.alloc_registered(10, "complex128")
    with pytest.raises(ValueError, match="not a vector from alloc_registered"):
        algorithms.free_registered(np.zeros(3, np.float32))
    a, b = algorithms.alloc_registered(10), algorithms.alloc_registered(10)
    if comm.size > 1:
        with pytest.raises(ValueError, match="ranks disagree"):
            algorithms.free_registered(a if comm.rank == 0 else b)
    algorithms.free_registered(a)
    with pytest.raises(ValueError, match="freed already"):
        algorithms.free_registered(a)
    algorithms.free_registered(b)


def test_the_bench_drivers_R_places_buffers_in_registered_vectors(comm):
    """``python -m bench -R 1`` runs on registered copies of its inputs, freed afterwards."""
    from algorithms.runtime.executor import private_comm
    from bench.core.sweep import placed

    registry = private_comm(comm).resource("registered", Registry)
    send, recv = np.arange(1000, dtype=np.int32), np.zeros(7, np.float64)
    for offset in (0, 3):  # -u 3: three elements into each registered vector
        flags = SimpleNamespace(local_register=1, unalign=offset)
        with placed(comm, flags, send, recv) as (send_here, recv_here):
            where = [registry.locate(v.view(np.uint8)) for v in (send_here, recv_here)]
            assert where == [(where[0][0], 4 * offset), (where[1][0], 8 * offset)]  # inside its registered vector
            indexes = [index for index, _ in where]
            assert len(set(indexes)) == 2
            assert np.array_equal(send_here, send) and send_here.dtype == send.dtype
            assert np.array_equal(recv_here, recv) and recv_here.dtype == recv.dtype
        assert not any(index in registry.windows for index in indexes)
    with placed(comm, SimpleNamespace(local_register=0, unalign=0), send, recv) as same:
        assert same[0] is send and same[1] is recv
