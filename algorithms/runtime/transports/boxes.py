"""The node's window of posted boxes, on which ``oneshot`` and ``twoshot`` run their rounds.

Each rank of the node has two boxes in a window the node's ranks share
(``MPI_Win_allocate_shared``, sized against ``/dev/shm``: :mod:`.shared_windows`); a box is a
header of a few int64 words, the first the rank's round counter, and a buffer of
``capacity`` bytes after it. A rank posts into its own box and raises its counter; the others
poll it (:func:`wait`) and then read the box. Rounds use the two boxes in turn (round c the box
c mod 2), so a rank may post round c+1 while a slower one still reads round c: the box it
writes held round c-1, which every rank finished reading before it posted round c, and the
writer waited for those posts (each algorithm's docstring argues its own counter values).

``MPI_Win_sync`` orders the data and the counters (MPI 4.1 section 12.7), except on x86-64,
whose stores reach other cores in program order and whose loads are not reordered with older
loads (total store order; Intel SDM vol. 3A, 9.2.2), where they are left out (:data:`NEEDS_SYNC`,
``Boxes.sync`` None; a one-shot round's two syncs took 0.3 us).

Where the communicator spans nodes there is no window (``usable`` False, ``note`` None); where
``/dev/shm`` cannot back it, neither, and ``note`` says what runs instead and why (once on stderr too).
"""

import os
import platform

import numpy as np
from mpi4py import MPI

from plumbing.shm import ShmTooSmall
from topology.machine import node_comm

from ...settings import setting
from .shared_windows import allocate_shared, warn_once
from .shm_window import LINE, SPINS_BEFORE_YIELD

ROUNDS_KEPT = 256  # rounds (with their views of the buffers) kept, one per shape
#: whether stores and loads may be seen out of order by the other cores (not on x86-64: TSO)
NEEDS_SYNC = platform.machine().lower() not in ("x86_64", "amd64")


class Boxes:
    """The node's boxes for algorithm ``name`` on a communicator (collective to build): per rank
    two boxes, each ``words`` int64 (the counter first, then what the algorithm keeps there) and,
    ``offset`` bytes from the box's start, a buffer of the setting ``variable``'s bytes (a multiple
    of :data:`LINE`); the box rounded up to whole lines. ``fallback`` names what runs where
    ``/dev/shm`` cannot back the window (``note``). ``headers[which][rank]`` and
    ``buffers[rank][which]`` view every rank's boxes; ``mine``/``others`` this rank's and the
    other ranks' headers, by box; ``calls`` the rounds so far; ``sync`` ``win.Sync`` or None."""

    def __init__(self, comm, name, variable, fallback, words=1, offset=8):
        self.capacity = setting(variable)
        box = -(-(offset + self.capacity) // LINE) * LINE
        node = node_comm(comm)
        self.size, self.me = comm.Get_size(), comm.Get_rank()
        self.note = None  # why it runs its fallback on one node
        self.detail = None  # what else it does otherwise than its docstring's first way here, and why
        self.rounds = {}  # shape -> the algorithm's round for pieces of that shape (kept)
        try:
            self.usable = node.Get_size() == self.size  # the same answer on every rank
            self.win = allocate_shared(comm, node, 2 * box, LINE, f"{name}'s window") if self.usable else None
        except ShmTooSmall as exc:  # raised on every rank alike
            self.usable, self.win = False, None
            self.note = f"{fallback}: no shared memory for its window ({exc.short})"
            warn_once(comm, f"{name} runs {self.note}")
        finally:
            node.Free()
        if self.win is None:
            return
        self.win.Lock_all(MPI.MODE_NOCHECK)
        # one node, split with key 0: node rank r is communicator rank r
        parts = [np.frombuffer(self.win.Shared_query(r)[0], np.uint8) for r in range(self.size)]
        # headers as memoryviews: quickest to poll; by box, then rank
        self.headers = [[memoryview(p[which * box:which * box + 8 * words]).cast("q") for p in parts]
                        for which in (0, 1)]
        self.buffers = [tuple(p[which * box + offset:which * box + offset + self.capacity] for which in (0, 1))
                        for p in parts]
        self.mine = tuple(self.headers[which][self.me] for which in (0, 1))
        self.others = tuple(tuple(h for r, h in enumerate(self.headers[which]) if r != self.me) for which in (0, 1))
        self.calls = [0]  # rounds so far, shared by the rounds of every shape
        self.sync = self.win.Sync if NEEDS_SYNC else None
        for header in self.mine:
            header[0] = 0
        self.win.Sync()
        comm.Barrier()  # every counter is zero before anyone posts

    def kept(self, shape, make):
        """``make()``, the round for pieces of ``shape``, made once and kept (at most :data:`ROUNDS_KEPT`)."""
        found = self.rounds.get(shape)
        if found is None:
            if len(self.rounds) >= ROUNDS_KEPT:
                self.rounds.clear()
            found = self.rounds[shape] = make()
        return found

    def typed(self, dtype, count):
        """The first ``count`` elements of ``dtype`` of every rank's buffers: ``views[which][rank]``."""
        nbytes = count * dtype.itemsize
        return tuple(tuple(b[which][:nbytes].view(dtype) for b in self.buffers) for which in (0, 1))

    def free(self):
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
            self.win = None


def wait(counter, value):
    """Spin until ``counter`` reaches ``value``, giving the core away after a while (oversubscribed runs)."""
    idle = 0
    while counter[0] < value:
        idle += 1
        if idle >= SPINS_BEFORE_YIELD:
            os.sched_yield()


def wait_all(headers, value):
    """:func:`wait` for every counter of ``headers`` to reach ``value``."""
    for header in headers:
        if header[0] < value:
            wait(header, value)
