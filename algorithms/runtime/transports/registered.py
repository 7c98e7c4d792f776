"""Registered buffers: vectors in node-shared memory that the transport reads in place.

:func:`alloc_registered` (collective) puts a vector in an ``MPI_Win_allocate_shared``
window of the node's ranks, as NCCL's registered buffers do for GPUs
(``ncclMemAlloc`` + ``ncclCommRegister``, nccl-tests ``-R``). A message over one
shared slot sent from such a vector to a rank of the same node is not copied
into the slots: the sender posts where it lies (window, offset) and the
receiver reduces or copies straight from it; the send completes once the
receiver has read it (a rendezvous, like MPICH's single-copy XPMEM path). Per
rank, the ring all-reduce then reads and writes the vector about once, like a
copy, instead of also copying every piece through a slot. Only the memory is
special: any NumPy view of a registered vector can be passed to the collectives,
and unregistered buffers still work beside registered ones.
"""

import numpy as np
from mpi4py import MPI

from plumbing.shm import SHM_FIX, mib
from topology.machine import node_comm

from .shared_windows import allocate_shared

OFFSET_BITS = 40  # a direct message's label packs (window index, byte offset < 1 TiB)
REGISTERED_FIX = SHM_FIX + ", or use plain vectors (the benchmark's -R 0)"


def _address(raw):
    return raw.__array_interface__["data"][0]


class Registry:
    """The registered windows of one communicator, by index (the same on every rank, since
    allocating and freeing are collective). Built empty, without communicating."""

    def __init__(self, comm):
        self.comm = comm
        self.windows = {}  # index -> (window, views of every node rank's part, by node rank)
        self.spans = []    # (start address, end address, index) of this rank's parts
        self.next_index = 0

    def alloc(self, nbytes):
        """A ``nbytes`` uint8 vector that the node's ranks can read (collective); raises
        :class:`.shared_windows.ShmTooSmall` on every rank where ``/dev/shm`` cannot back it."""
        node = node_comm(self.comm)
        try:
            info = MPI.Info.Create()
            info.Set("alloc_shared_noncontig", "true")  # each part page-aligned, on its own pages
            try:
                win = allocate_shared(self.comm, node, max(nbytes, 1), 1, f"a registered vector of {mib(nbytes)}",
                                      REGISTERED_FIX, info)
            finally:
                info.Free()
            parts = [np.frombuffer(win.Shared_query(r)[0], np.uint8) for r in range(node.Get_size())]
            mine = parts[node.Get_rank()][:nbytes]
        finally:
            node.Free()
        index = self.next_index
        self.next_index += 1
        self.windows[index] = (win, parts)
        start = _address(mine)
        self.spans.append((start, start + nbytes, index))
        return mine

    def locate(self, raw):
        """``(index, offset)`` of the uint8 vector ``raw`` if it lies in one registered part of
        this rank, else None."""
        start = _address(raw)
        end = start + raw.size
        for low, high, index in self.spans:
            if low <= start and end <= high:
                return index, start - low
        return None

    def view(self, index, node_rank, offset, nbytes):
        """Bytes ``offset..offset+nbytes`` of node rank ``node_rank``'s part of window ``index``."""
        return self.windows[index][1][node_rank][offset:offset + nbytes]

    def index_of(self, vector):
        """The window index of a vector from :meth:`alloc` (the whole of it, any dtype)."""
        if not isinstance(vector, np.ndarray) or not vector.flags.c_contiguous:
            raise TypeError(f"expected a NumPy vector from alloc_registered, got {type(vector).__name__}")
        found = self.locate(vector.reshape(-1).view(np.uint8))
        if found is None or found[1] != 0:
            raise ValueError("not a vector from alloc_registered on this communicator (or freed already)")
        return found[0]

    def unregister(self, index):
        """Free window ``index`` (collective)."""
        self.spans = [span for span in self.spans if span[2] != index]
        self.windows.pop(index)[0].Free()

    def free(self):
        for index in sorted(self.windows, reverse=True):
            self.windows.pop(index)[0].Free()
        self.spans.clear()


def encode(index, offset):
    """A direct message's label: negative, so it cannot be a slot piece's offset."""
    return -1 - ((index << OFFSET_BITS) | offset)


def decode(label):
    value = -1 - label
    return value >> OFFSET_BITS, value & ((1 << OFFSET_BITS) - 1)
