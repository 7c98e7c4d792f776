"""One-shot all-reduce through the node's shared memory: the small-message all-reduce of
TensorRT-LLM's and vLLM's custom all-reduce ("one-shot") and of MSCCL++.

Every rank copies its vector into its own buffer of a window the node's ranks share
(``MPI_Win_allocate_shared``), raises its call counter, waits until every other rank's counter
has reached the call, then reduces all N buffers itself, in rank order, straight into its result:
one synchronisation instead of log2 N (recursive doubling) or 2(N-1) (ring) message steps, and
no MPI call at all, so T ~ alpha_sync + (N-1) M / beta_mem. Every rank computes the same
combinations in the same order, so all get bit-identical results.

Each rank has two buffers, each with its call counter just before it, and uses them in turn,
call by call, so a rank may post call k+1 while a slower one still reads call k: the buffer it
overwrites held call k-1, which every rank had finished reading before it posted call k, and
this rank waited for those posts.
``MPI_Win_sync`` orders the data and the counters (MPI 4.1 section 12.7), except on x86-64, whose
stores reach other cores in program order and whose loads are not reordered with older loads
(total store order; Intel SDM vol. 3A, 9.2.2), where both syncs of a call, 0.3 us, are left out. A vector over one
buffer (``ALLREDUCE_ONESHOT_BYTES``, 64 KiB) goes in pieces, each piece a round. Every rank
reads every other rank's buffer, (N-1) M per rank, so it pays only for small vectors; where the
ranks span nodes, or for CuPy buffers, it is recursive doubling (:mod:`.recursive_doubling`).
"""

import functools
import math
import os
import platform

import numpy as np
from mpi4py import MPI

from topology.shm import ShmTooSmall

from . import recursive_doubling
from .settings import setting
from .transports.shared_windows import allocate_shared, warn_once
from .transports.shm_window import LINE, SPINS_BEFORE_YIELD

VIEWS = 256  # rounds (with their views of the buffers) kept, one per shape
#: whether stores and loads may be seen out of order by the other cores (not on x86-64: TSO)
NEEDS_SYNC = platform.machine().lower() not in ("x86_64", "amd64")


class OneShotWindow:
    """The node's window for one-shot all-reduce on a communicator (collective to build): per
    rank two boxes, each a call counter followed at once by a buffer of ``ALLREDUCE_ONESHOT_BYTES``,
    so a vector of up to 56 bytes travels with its counter in one cache line. ``usable`` is False,
    with no window, where the communicator spans nodes, or where ``/dev/shm`` cannot back the
    window (``note`` says so)."""

    def __init__(self, comm):
        self.capacity = setting("ALLREDUCE_ONESHOT_BYTES")  # a multiple of LINE
        box = self.capacity + LINE  # counter, buffer, and the rest of the last line
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.size, self.me = comm.Get_size(), comm.Get_rank()
        self.note = None  # why it runs recursive doubling on one node
        self.rounds = {}  # (dtype, count) -> round(piece, out, combine) for pieces of that shape
        try:
            self.usable = node.Get_size() == self.size  # the same answer on every rank
            self.win = allocate_shared(comm, node, 2 * box, LINE, "oneshot's window") if self.usable else None
        except ShmTooSmall as exc:  # raised on every rank alike
            self.usable, self.win = False, None
            self.note = f"recursive doubling: no shared memory for its window ({exc.short})"
            warn_once(comm, f"oneshot runs {self.note}")
        finally:
            node.Free()
        if self.win is None:
            return
        self.win.Lock_all(MPI.MODE_NOCHECK)
        # one node, split with key 0: node rank r is communicator rank r
        parts = [np.frombuffer(self.win.Shared_query(r)[0], np.uint8) for r in range(self.size)]
        # counters as memoryviews: quickest to poll; by box, then rank
        counters = [[memoryview(p[which * box:which * box + 8]).cast("q") for p in parts] for which in (0, 1)]
        self.buffers = [tuple(p[which * box + 8:which * box + 8 + self.capacity] for which in (0, 1)) for p in parts]
        self.mine = tuple(counters[which][self.me] for which in (0, 1))
        self.others = tuple(tuple(c for r, c in enumerate(counters[which]) if r != self.me) for which in (0, 1))
        self.calls = [0]  # calls so far, shared by the rounds of every shape
        for counter in self.mine:
            counter[0] = 0
        self.win.Sync()
        comm.Barrier()  # every counter is zero before anyone posts

    def round_for(self, dtype, count):
        """``round(piece, out, combine)`` for pieces of ``count`` elements of ``dtype``: post the piece,
        wait for every rank's, reduce them all, in rank order, into ``out`` (which may be the piece).
        Made once per shape (at most :data:`VIEWS`), its buffers' views found here."""
        found = self.rounds.get((dtype, count))
        if found is not None:
            return found
        if len(self.rounds) >= VIEWS:
            self.rounds.clear()
        nbytes = count * dtype.itemsize
        views = tuple(tuple(b[which][:nbytes].view(dtype) for b in self.buffers) for which in (0, 1))
        rest = tuple(v[2:] for v in views)
        me, mine, others, calls_made, copyto = self.me, self.mine, self.others, self.calls, np.copyto
        sync = self.win.Sync if NEEDS_SYNC else None

        def one_round(piece, out, combine):
            calls = calls_made[0] = calls_made[0] + 1
            which = calls & 1
            buffers = views[which]
            copyto(buffers[me], piece)
            if sync is not None:
                sync()  # the data before the counter
            mine[which][0] = calls
            for counter in others[which]:
                if counter[0] < calls:
                    _wait(counter, calls)
            if sync is not None:
                sync()  # the counters before the data
            combine(buffers[0], buffers[1], out)
            for view in rest[which]:
                combine(out, view, out)

        self.rounds[(dtype, count)] = one_round
        return one_round

    def free(self):
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
            self.win = None


def _wait(counter, calls):
    """Spin until ``counter`` reaches ``calls``, giving the core away after a while (oversubscribed runs)."""
    idle = 0
    while counter[0] < calls:
        idle += 1
        if idle >= SPINS_BEFORE_YIELD:
            os.sched_yield()


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype``: where they fit
    one buffer of the node's window, its round itself; otherwise :func:`allreduce`."""
    window = coll.private.resources.get("oneshot")  # made by the first call (collective)
    if (window is None or not window.usable or coll.xp is not np or coll.size == 1
            or count * dtype.itemsize > window.capacity):
        return functools.partial(allreduce, coll)
    one_round, combine = window.round_for(dtype, count), coll.combine

    def run(sendbuf, recvbuf):
        one_round(sendbuf, recvbuf, combine)
    return run


def allreduce(coll, sendbuf, recvbuf):
    window = coll.private.resources.get("oneshot")
    if window is not None and coll.xp is np:  # the common case first: a vector of one piece, seen before
        run = window.rounds.get((sendbuf.dtype, sendbuf.size))
        if run is not None:
            run(sendbuf, recvbuf, coll.combine)
            return
    if coll.size == 1:
        coll.start_in(sendbuf, recvbuf)
        return
    window = window or coll.private.resource("oneshot", OneShotWindow)
    if not window.usable or coll.xp is not np:
        recursive_doubling.allreduce(coll, sendbuf, recvbuf)
        return
    step = window.capacity // sendbuf.itemsize
    if sendbuf.size <= step:
        window.round_for(sendbuf.dtype, sendbuf.size)(sendbuf, recvbuf, coll.combine)
        return
    for lo in range(0, sendbuf.size, step):
        piece = sendbuf[lo:lo + step]
        window.round_for(piece.dtype, piece.size)(piece, recvbuf[lo:lo + step], coll.combine)


def describe(private, transport):
    """``transport``, and why oneshot runs recursive doubling where ``/dev/shm`` could not back
    its window (made here, collective, as the first call would)."""
    note = private.resource("oneshot", OneShotWindow).note if private.comm.Get_size() > 1 else None
    return f"{transport}; oneshot runs {note}" if note else transport


#: a round's start-up in messages: one counter written and polled in shared memory, no message
#: (bench perf, 8 B on 2 ranks: oneshot 2.06 us, rd's one message 3.57 us)
ROUND_MESSAGES = 0.5


def schedule(model, m):
    """On one node, ceil(M/C) rounds (C the one-shot buffer), in each every rank reading every
    other's piece at once, a round starting in half a message's time (a counter in shared
    memory, no message): ceil(M/C)(alpha/2 + C/beta) where the reads share nothing but their
    links, (N-1) M/beta where each rank's memory takes its reads one after another; across
    nodes, recursive doubling."""
    if len(model.network.node_ranks()) > 1:
        return recursive_doubling.schedule(model, m)
    rounds = max(1, math.ceil(m / setting("ALLREDUCE_ONESHOT_BYTES")))
    src, dst = (a.ravel() for a in np.meshgrid(np.arange(model.n), np.arange(model.n), indexing="ij"))
    phase = model.phase(("oneshot",), lambda: (src[src != dst], dst[src != dst]))
    return [(rounds, "round", phase.time(m / rounds, ROUND_MESSAGES))]


allreduce.bind = bind
allreduce.describe = describe
allreduce.one_node_only = True  # across nodes it runs recursive doubling
allreduce.schedule = schedule
