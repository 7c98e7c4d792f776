"""The shared-memory transport on its own, under mpiexec: every byte of every message arrives,
in order, for sizes on both sides of every threshold, blocking and nonblocking, and a
receive of the wrong size raises instead of delivering garbage. One test holds every
transport to the rule that any send matches any receive of its size.

Each test builds its own transport on a fresh communicator with small slots (256 bytes,
SLOTS of them), so messages take many pieces and senders wait for free slots; messages
under 64 bytes or over 4 KiB go through MPI, mixed with the others.
"""

import contextlib
import os

import numpy as np
import pytest
from mpi4py import MPI

from algorithms import settings
from algorithms.runtime.executor import WORKSPACE, Private
from algorithms.runtime.transports.mpi import DirectTransport, StagedTransport
from algorithms.runtime.transports.shared_memory import SharedMemoryTransport
from algorithms.runtime.transports.shm_window import SLOTS

pytestmark = pytest.mark.mpi

SLOT, LOW, HIGH = 256, 64, 4096
SIZES = [0, 1, LOW - 1, LOW, SLOT - 1, SLOT, SLOT + 1, SLOTS * SLOT + 3, HIGH, HIGH + 1, 3 * HIGH + 5]


@contextlib.contextmanager
def built(comm, monkeypatch):
    """A shared-memory transport with SLOT, LOW and HIGH on a fresh communicator, freed after."""
    monkeypatch.setenv("ALLREDUCE_SHM_SLOT_BYTES", str(SLOT))
    monkeypatch.setenv("ALLREDUCE_SHM_MIN_BYTES", str(LOW))
    monkeypatch.setenv("ALLREDUCE_SHM_MAX_BYTES", str(HIGH))
    private = Private(comm.Dup())
    try:
        yield SharedMemoryTransport(private, np, WORKSPACE, DirectTransport)
    finally:
        private.free()


@pytest.fixture
def transport(comm, monkeypatch):
    with built(comm, monkeypatch) as made:
        yield made


def message(source, dest, index, nbytes):
    """The bytes ``source`` sends ``dest`` as its ``index``-th message (known to both)."""
    return ((np.arange(nbytes) * 31 + source * 7 + dest * 3 + index * 11) % 251).astype(np.uint8)


def test_nonblocking_all_pairs_every_size(comm, transport):
    """Every rank sends every size to every rank (itself excluded), all at once, receives
    posted in a shuffled order of peers; each message must arrive whole and in order."""
    rank, size = comm.rank, comm.size
    peers = [p for p in range(size) if p != rank]
    order = np.random.default_rng(rank).permutation(peers).tolist()
    received = {(p, i): np.full(n, 255, np.uint8) for p in peers for i, n in enumerate(SIZES)}
    requests = [transport.irecv(received[p, i], p) for p in order for i in range(len(SIZES))]
    requests += [transport.isend(message(rank, p, i, n), p) for p in peers for i, n in enumerate(SIZES)]
    while not all(r.Test() for r in requests):
        pass
    for r in requests:
        r.Wait()
    wrong = [(p, SIZES[i]) for (p, i), got in received.items() if not np.array_equal(got, message(p, rank, i, SIZES[i]))]
    assert wrong == []


def test_a_later_message_waits_for_an_earlier_one(comm, transport):
    """Rank 0 starts a long message, rank 1 drains the slots it filled, then rank 0 starts a
    short one while the long one is half sent (and rank 1 posts its receive while the long
    one is half received): the short one must not take the freed slots first."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    long, short = message(0, 1, 0, 10 * SLOT), message(0, 1, 1, SLOT // 2)
    if comm.rank == 0:
        first = transport.isend(long, 1)
        comm.Barrier()  # the first SLOTS pieces are posted
        comm.recv(source=1, tag=99)
        second = transport.isend(short, 1)
        first.Wait()
        second.Wait()
    elif comm.rank == 1:
        got_long, got_short = np.zeros(long.size, np.uint8), np.zeros(short.size, np.uint8)
        first = transport.irecv(got_long, 0)
        comm.Barrier()
        deadline = MPI.Wtime() + 0.05
        while MPI.Wtime() < deadline:
            first.Test()  # takes the posted pieces, frees their slots
        comm.send(None, dest=0, tag=99)
        second = transport.irecv(got_short, 0)
        first.Wait()
        second.Wait()
        assert np.array_equal(got_long, long) and np.array_equal(got_short, short)
    else:
        comm.Barrier()


@pytest.mark.parametrize("kind", ["shared-memory", "staged", "direct"])
def test_any_send_matches_any_receive(comm, monkeypatch, kind):
    """Nonblocking sends taken by blocking receives and blocking sends by nonblocking receives,
    around the ring, as the tree executor mixes them; the staged transport with 1 KiB chunks,
    so that its larger messages move in pieces (pipelined when blocking)."""
    monkeypatch.setenv("ALLREDUCE_STAGE_BYTES", "1024")
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    with contextlib.ExitStack() as stack:
        if kind == "shared-memory":
            transport = stack.enter_context(built(comm, monkeypatch))
        else:
            private = Private(comm.Dup())
            stack.callback(private.free)
            transport = (StagedTransport if kind == "staged" else DirectTransport)(private, np, WORKSPACE)
        for i, n in enumerate(SIZES + [5000]):
            got = np.full(n, 255, np.uint8)
            sending = transport.isend(message(rank, right, i, n), right)
            transport.recv(got, left)
            sending.Wait()
            assert np.array_equal(got, message(left, rank, i, n)), ("isend, recv", n)
            got[:] = 255
            receiving = transport.irecv(got, left)
            transport.send(message(rank, right, i, n), right)
            receiving.Wait()
            assert np.array_equal(got, message(left, rank, i, n)), ("send, irecv", n)


def test_blocking_ring_of_sendrecvs(comm, transport):
    """Sendrecv around the ring, then to the other direction, each size in turn."""
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    for i, n in enumerate(SIZES):
        for dest, source in ((right, left), (left, right)):
            got = np.full(n, 255, np.uint8)
            transport.sendrecv(message(rank, dest, i, n), dest, got, source)
            assert np.array_equal(got, message(source, rank, i, n)), (n, dest, source)


def test_blocking_send_recv_to_root(comm, transport):
    """Every rank sends each size to rank 0 (blocking), which receives rank by rank."""
    rank = comm.rank
    for i, n in enumerate(SIZES):
        if rank == 0:
            for source in range(1, comm.size):
                got = np.full(n, 255, np.uint8)
                transport.recv(got, source)
                assert np.array_equal(got, message(source, 0, i, n)), (n, source)
        else:
            transport.send(message(rank, 0, i, n), 0)


@pytest.mark.parametrize("count", [0, 1, 15, 16, 63, 64, 65, 1000, 1025, 5000])
def test_sendrecv_combine_against_numpy(comm, transport, count):
    """Around the ring: out = mine + what the left neighbour sent, for every route and piece size."""
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    def vector(r):
        return (np.arange(count, dtype=np.float32) % 97) * (r + 1)

    out = np.full(count, -1, np.float32)
    transport.sendrecv_combine(vector(rank), right, vector(rank) * 2, left, out, np.add)
    assert np.array_equal(out, vector(rank) * 2 + vector(left))


@pytest.mark.parametrize("count", [0, 1, 15, 16, 63, 64, 65, 1000, 1025, 5000])
def test_recv_combine_at_a_root_against_numpy(comm, transport, count):
    """Every rank sends its vector to rank 0, which adds them in rank order as they arrive."""
    rank = comm.rank
    def vector(r):
        return (np.arange(count, dtype=np.float32) % 97) * (r + 1)

    if rank:
        transport.send(vector(rank), 0)
        return
    acc, out = vector(0), np.full(count, -1, np.float32)
    for source in range(1, comm.size):
        transport.recv_combine(acc, source, out, np.add)
        acc = out
    expected = vector(0)
    for source in range(1, comm.size):
        expected = expected + vector(source)
    assert np.array_equal(out if comm.size > 1 else acc, expected)


@pytest.mark.parametrize("count", [1, 15, 16, 63, 64, 65, 1000, 1025])
def test_bound_exchanges_against_numpy(comm, transport, count):
    """An exchange bound to its shape (``bind_exchange``, as the ring's steps are) delivers what
    the left neighbour sent, plain and reduced, with nothing pending (its own route, for one-slot
    sizes and those under them) and behind a pending message of several pieces (the general path), in turn."""
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    def vector(r):
        return (np.arange(count, dtype=np.float32) % 89) * (r + 3)

    def general(sendbuf, recvbuf):
        transport.sendrecv(sendbuf, right, recvbuf, left)

    def general_combine(sendbuf, acc, out):
        transport.sendrecv_combine(sendbuf, right, acc, left, out, np.add)

    f32 = np.dtype(np.float32)
    plain = transport.bind_exchange(f32, count, right, count, left, None, general)
    reduced = transport.bind_exchange(f32, count, right, count, left, np.add, general_combine)
    # bound: through the slots in one piece, or under the slots' smallest size one MPI_Sendrecv
    bound = LOW <= 4 * count <= SLOT or 4 * count < LOW
    assert (plain is not general, reduced is not general_combine) == (bound, bound)
    for i, behind in enumerate((False, True, False, True)):
        if behind:
            early = np.full(2 * SLOT + 1, 255, np.uint8)
            requests = [transport.irecv(early, left), transport.isend(message(rank, right, i, early.size), right)]
        got, out = np.full(count, -1, np.float32), np.full(count, -1, np.float32)
        plain(vector(rank), got)
        reduced(vector(rank) * 2, vector(rank), out)
        assert np.array_equal(got, vector(left)), (count, behind)
        assert np.array_equal(out, vector(rank) + vector(left) * 2), (count, behind)
        if behind:
            for request in requests:
                request.Wait()
            assert np.array_equal(early, message(left, rank, i, early.size)), (count, behind)


def test_wrong_receive_size_raises(comm, transport):
    """A receive one byte short of its send raises on the receiver, naming both sizes."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    n = SLOT // 2
    if comm.rank == 0:
        transport.send(np.zeros(n, np.uint8), 1)
    elif comm.rank == 1:
        with pytest.raises(RuntimeError, match=f"of a {n - 1}-byte message, got bytes 0.. of a {n}-byte one"):
            transport.recv(np.zeros(n - 1, np.uint8), 0)
    comm.Barrier()


def test_slot_size_must_be_a_multiple_of_a_cache_line(comm, monkeypatch):
    """Checked on every rank when a communicator is first used (the settings' agreement)."""
    monkeypatch.setenv("ALLREDUCE_SHM_SLOT_BYTES", "1000")
    with pytest.raises(ValueError, match="ALLREDUCE_SHM_SLOT_BYTES=1000 must be a multiple of 64"):
        Private(comm.Dup())


def huge_page_vector(nbytes):
    """``nbytes`` at the start of 2 MiB of a private mapping, aligned, advised for huge pages and
    touched; None when the kernel gave it no huge page (THP off, memory fragmented)."""
    import mmap

    from bench.core.pages import huge_page_share

    huge = 2 << 20
    mapping = mmap.mmap(-1, 2 * huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(mapping, np.uint8)
    start = -whole.__array_interface__["data"][0] % huge
    mapping.madvise(mmap.MADV_HUGEPAGE, start, huge)  # a mapping of its own in smaps, all huge or not
    region = whole[start:start + huge]
    region[:] = 0
    return region[:nbytes] if huge_page_share(region) == 1.0 else None


@pytest.mark.parametrize("by_pages", ["1", "0", "auto"])
def test_a_large_message_goes_by_the_senders_pages(comm, monkeypatch, by_pages):
    """Over the largest size for the slots, with ALLREDUCE_SHM_BY_PAGES=1 (or auto where the
    THP setting is never), a message from 4 KiB pages goes through the slots (one posted
    piece per slot), one from huge pages through MPI (one posted label), when the kernel can
    tell them apart (PAGEMAP_SCAN); otherwise both go through MPI unannounced. Sent back to
    back, nonblocking, both arrive whole."""
    from algorithms.runtime.transports.pages import PageProbe, thp_mode
    from bench.core.pages import small_page_vector

    probe = PageProbe()
    expect_routed = probe.available and (by_pages == "1" or (by_pages == "auto" and thp_mode() == "never"))
    probe.free()

    if comm.size < 2:
        pytest.skip("needs two ranks")
    n = 3 * HIGH + 5
    small = small_page_vector(n, np.uint8)
    huge = huge_page_vector(n)
    if comm.allreduce(huge is None, op=MPI.LOR):
        pytest.skip("no huge page to be had here")
    monkeypatch.setenv("ALLREDUCE_SHM_BY_PAGES", by_pages)
    with built(comm, monkeypatch) as transport:
        routed, pieces, whole = transport.pages is not None, None, None
        if comm.rank == 0:
            small[:], huge[:] = message(0, 1, 0, n), message(0, 1, 1, n)
            before = transport.box.posted[1][0]
            transport.isend(small, 1).Wait()
            middle = transport.box.posted[1][0]
            transport.isend(huge, 1).Wait()
            pieces = (middle - before, transport.box.posted[1][0] - middle)
        elif comm.rank == 1:
            got = [np.full(n, 255, np.uint8) for _ in range(2)]
            requests = [transport.irecv(g, 0) for g in got]  # both posted before either arrives
            for r in requests:
                r.Wait()
            whole = [np.array_equal(g, message(0, 1, i, n)) for i, g in enumerate(got)]
        comm.Barrier()  # the checks after it: a failing rank must not leave the other waiting
    assert routed == expect_routed
    if comm.rank == 0:  # 0: through MPI, unannounced
        assert pieces == ((-(-n // SLOT), 1) if routed else (0, 0)), pieces
    elif comm.rank == 1:
        assert whole == [True, True]


def test_page_route_setting_must_be_0_or_1(comm, monkeypatch):
    """A bad ALLREDUCE_SHM_BY_PAGES on one rank raises on every rank (the route must agree)."""
    monkeypatch.setenv("ALLREDUCE_SHM_BY_PAGES", "yes" if comm.rank == comm.size - 1 else "1")
    last = f"rank {comm.size - 1}"
    with pytest.raises(ValueError, match=f"ALLREDUCE_SHM_BY_PAGES='yes' is not one of auto, 0, 1 \\(on {last}\\)"):
        with built(comm, monkeypatch):
            pass


@pytest.mark.parametrize("variable,value", [("ALLREDUCE_SHM_SLOT_BYTES", "65536"), ("ALLREDUCE_SHM_MIN_BYTES", "128"),
                                            ("ALLREDUCE_SHM_MAX_BYTES", "100"), ("ALLREDUCE_SEGMENT_BYTES", "65536"),
                                            ("ALLREDUCE_STAGE_BYTES", "4096"), ("ALLREDUCE_TRANSPORT", "direct"),
                                            ("ALLREDUCE_SHM_BY_PAGES", "0"), ("ALLREDUCE_CUDA_AWARE", "1")])
def test_a_setting_on_one_rank_alone_raises_on_every_rank(comm, monkeypatch, variable, value):
    """Every variable that changes what goes over the wire is agreed on: set on the last rank
    alone, the first use of a communicator raises the same error everywhere, naming the variable
    and the ranks (one rank: nothing to disagree with)."""
    monkeypatch.delenv(variable, raising=False)
    if comm.rank == comm.size - 1:
        monkeypatch.setenv(variable, value)
    if variable == "ALLREDUCE_SEGMENT_BYTES":  # read at import: the agreement compares the text read then
        monkeypatch.setitem(settings._READ_AT_IMPORT, variable, os.environ.get(variable))
    if comm.size == 1:
        Private(comm.Dup()).free()
        return
    others = "rank 0" if comm.size == 2 else f"ranks {', '.join(str(r) for r in range(comm.size - 1))}"
    with pytest.raises(ValueError, match=f"{variable} differs between ranks: unset \\(default [^)]*\\) on {others}; "
                                         f"'{value}' on rank {comm.size - 1}$"):
        Private(comm.Dup())


def test_pages_are_probed_from_the_kernel():
    """algorithms.runtime.transports.pages against bench.core.pages (from /proc/self/smaps): a 4 KiB-page vector holds
    no huge page, a huge-page one is all huge, sub-ranges and single pages included."""
    from algorithms.runtime.transports.pages import PageProbe
    from bench.core.pages import small_page_vector

    probe = PageProbe()
    if not probe.available:
        pytest.skip("no PAGEMAP_SCAN here (Linux 6.7+)")
    small = small_page_vector(1 << 20, np.uint8)
    small[:] = 1
    assert probe.huge_share(small.__array_interface__["data"][0], small.nbytes) == 0.0
    assert not probe.is_huge(small.__array_interface__["data"][0] + 5000)
    huge = huge_page_vector(2 << 20)
    if huge is None:
        pytest.skip("no huge page to be had here")
    address = huge.__array_interface__["data"][0]
    assert probe.huge_share(address, huge.nbytes) == 1.0
    assert probe.huge_share(address + 100, 5000) == 1.0
    assert probe.is_huge(address + (1 << 20)) and probe.is_huge(address + (1 << 20))  # asked, then remembered
    probe.free()
    assert not probe.available


def test_exchanges_whose_routes_differ(comm, monkeypatch):
    """With ALLREDUCE_SHM_BY_PAGES=1, ranks 0 and 1 exchange large messages (sendrecv, then
    sendrecv_combine against NumPy, then send and recv_combine) from every pair of page
    kinds: each side's message takes its own route (slots from 4 KiB pages, MPI from huge
    pages), and each must arrive whole whatever the other's route."""
    from bench.core.pages import small_page_vector

    if comm.size < 2:
        pytest.skip("needs two ranks")
    n = 3 * HIGH + 8
    huge = huge_page_vector(n)
    if comm.allreduce(huge is None, op=MPI.LOR):
        pytest.skip("no huge page to be had here")
    small = small_page_vector(n, np.uint8)
    monkeypatch.setenv("ALLREDUCE_SHM_BY_PAGES", "1")
    add = np.add
    wrong = []
    with built(comm, monkeypatch) as transport:
        for i, kinds in enumerate(((huge, small), (small, huge), (huge, huge), (small, small))):
            if comm.rank > 1:
                continue
            peer, mine = 1 - comm.rank, kinds[comm.rank]
            mine[:] = message(comm.rank, peer, i, n)
            got = np.full(n, 255, np.uint8)
            transport.sendrecv(mine, peer, got, peer)
            wrong += [("sendrecv", i)] if not np.array_equal(got, message(peer, comm.rank, i, n)) else []
            acc, out = np.arange(n // 4, dtype=np.float32), np.zeros(n // 4, np.float32)
            transport.sendrecv_combine(mine.view(np.float32), peer, acc, peer, out, add)
            expected = acc + message(peer, comm.rank, i, n).view(np.float32)
            wrong += [("sendrecv_combine", i)] if not np.array_equal(out, expected) else []
            if comm.rank == 0:
                transport.send(mine, 1)
            else:
                transport.recv_combine(acc, 0, out, add)
                expected = acc + message(0, 1, i, n).view(np.float32)
                wrong += [("send, recv_combine", i)] if not np.array_equal(out, expected) else []
        comm.Barrier()
    assert wrong == []
