"""The shared-memory transport's window: the node's slots, counters and labels (:class:`Mailboxes`).

The ranks of a node allocate one window together (``MPI_Win_allocate_shared``, sized against
``/dev/shm``: :mod:`.shared_windows`). Rank i's part of it holds, for every rank j of the node,
``SLOTS`` slots through which i sends to j, a counter of the pieces i has posted to j and a
counter of the pieces i has consumed from j (one writer per counter, each on its own cache
line), and a label per slot (the message's size and the piece's offset, or where a registered
vector lies). A message is cut into pieces of at most a slot: the sender copies piece p into
slot p mod SLOTS once the receiver has consumed piece p - SLOTS, then bumps its posted counter;
the receiver waits for that counter, copies the piece out (or reduces straight from the slot)
and bumps its consumed counter. ``MPI_Win_sync`` orders the data and the counters (the MPI-3
shared-memory model, MPI 4.1 section 12.7). For CuPy buffers the slots are device memory that
the node's ranks map by CUDA IPC (:mod:`.cuda_ipc`), and the stream is synchronized before a
counter moves; the counters stay in the window.
"""

import os

import numpy as np
from mpi4py import MPI

from plumbing.shm import ShmTooSmall
from topology.machine import node_comm

from ...arrays import is_device
from ...device import steps
from ...settings import setting, size_text
from ..copies import copy_for
from .cuda_ipc import DeviceSlots
from .registered import decode, encode
from .shared_windows import allocate_shared

SLOTS = 4
LINE = 64  # bytes per counter: one cache line each
LABEL = 4  # int64 words per label: message bytes, offset or where; reply bytes, where
VIA_MPI = -(1 << 62)  # a label's offset saying "this message follows through MPI"
SPINS_BEFORE_YIELD = 64  # idle polls before a wait gives its core away (oversubscribed runs)
TYPED_VIEWS = 256  # shapes of typed slot views kept per direction (Mailboxes.typed_slots)


#: per array module: the variable that sets the slot size (:data:`.settings.WIRE`)
SLOT_SIZES = {"numpy": "ALLREDUCE_SHM_SLOT_BYTES", "cupy": "ALLREDUCE_IPC_SLOT_BYTES"}


class Mailboxes:
    """The node's shared window and this rank's views of it (see the module docstring).

    For CuPy (``xp``) the slots are device memory mapped into every rank of the node by
    CUDA IPC (:class:`.cuda_ipc.DeviceSlots`) and the window holds only the counters.
    ``registry`` (:class:`.registered.Registry`) resolves the labels of messages read in place."""

    def __init__(self, comm, xp=np, registry=None):
        variable = SLOT_SIZES[xp.__name__]
        self.registry = registry
        self.slot_bytes = setting(variable)  # a multiple of LINE (settings.WIRE)
        self.xp, self.device, self.steps = xp, None, steps(xp)
        self.copy = copy_for(xp)  # into and out of the slots (copies.py)
        node = node_comm(comm)
        members = MPI.Group.Translate_ranks(node.Get_group(), list(range(node.Get_size())),
                                            comm.Get_group())
        self.local = {rank: i for i, rank in enumerate(members)}  # comm rank -> node rank
        self.me = node.Get_rank()
        size = node.Get_size()
        header = _round_up(2 * size * LINE + LABEL * 8 * size * SLOTS, LINE)
        slots_bytes = size * SLOTS * self.slot_bytes
        what = f"the shared-memory transport ({SLOTS} slots of {size_text(self.slot_bytes)} to each rank of the node)"
        try:
            if is_device(xp):
                self.device = DeviceSlots(xp, node, slots_bytes)  # collective; raises on every rank
                try:
                    self.win = allocate_shared(comm, node, header, LINE, "the CUDA IPC transport's counters")
                except ShmTooSmall:
                    self.device.free()
                    raise
            else:
                self.win = allocate_shared(comm, node, header + slots_bytes, LINE, what)
        finally:
            node.Free()
        self.win.Lock_all(MPI.MODE_NOCHECK)
        parts = [np.frombuffer(self.win.Shared_query(r)[0], np.uint8) for r in range(size)]
        # int64 counters and labels as memoryviews: an element is read or written in a third
        # of the time of a NumPy scalar access, and every wait polls them
        counters = [memoryview(p[:header]).cast("q") for p in parts]
        slots = self.device.views if self.device else [p[header:] for p in parts]
        step = LINE // 8
        me = self.me
        # posted[j]: pieces this rank posted to node rank j; consumed[j]: pieces it took from j
        self.posted = [counters[me][step * j:step * j + 1] for j in range(size)]
        self.consumed = [counters[me][step * (size + j):step * (size + j) + 1] for j in range(size)]
        # what peer j reads and writes about us
        self.peer_posted = [counters[j][step * me:step * me + 1] for j in range(size)]
        self.peer_consumed = [counters[j][step * (size + me):step * (size + me) + 1] for j in range(size)]
        labels = 2 * step * size
        # each slot's label, written by the sender: (message bytes, offset of the piece), and
        # for a registered message (bytes, where) of the sender's registered receive buffer
        self.out_labels = [[counters[me][labels + LABEL * (j * SLOTS + k):][:LABEL] for k in range(SLOTS)]
                           for j in range(size)]
        self.in_labels = [[counters[j][labels + LABEL * (me * SLOTS + k):][:LABEL] for k in range(SLOTS)]
                          for j in range(size)]
        self.out_slots = [[_slot(slots[me], j, k, self.slot_bytes) for k in range(SLOTS)] for j in range(size)]
        self.in_slots = [[_slot(slots[j], me, k, self.slot_bytes) for k in range(SLOTS)] for j in range(size)]
        self._typed_out, self._typed_in = {}, {}  # (peer, dtype, count) -> typed views of its slots
        for j in range(size):
            self.posted[j][0] = self.consumed[j][0] = 0
        self.win.Sync()
        comm.Barrier()  # every rank's counters are zero before anyone posts

    def slot_free(self, peer):
        """Whether the next piece to ``peer`` may be posted (it consumed the one SLOTS before)."""
        return self.posted[peer][0] - self.peer_consumed[peer][0] < SLOTS

    def post(self, peer, raw, offset):
        """Copy bytes ``offset..`` of message ``raw`` into the next slot to ``peer`` and post
        them (:meth:`slot_free` first); return where the piece ends."""
        piece = self.posted[peer][0]
        k = piece % SLOTS
        end = min(raw.size, offset + self.slot_bytes)
        self.copy(self.out_slots[peer][k][:end - offset], raw[offset:end])
        if self.device is not None:  # the piece is in the slot before its counter says so (a peer process reads it)
            self.steps.settle()
        self.post_label(peer, raw.size, offset)
        return end

    def swap(self, out, out_views, buf, into, in_views):
        """Post ``buf``, a message of one slot or less, to ``out`` (:meth:`slot_free` first)
        through ``out_views`` (:meth:`typed_slots`), then wait for the next piece from ``into``,
        which must be a whole message as long as the views ``in_views``, and return its view
        (:meth:`release` hands the slot back once it is read). A blocking exchange of one-slot
        messages (each ring step of a 2-rank all-reduce from 16 to 512 KiB) in one call, no
        message viewed as bytes."""
        self.copy(out_views[self.posted[out][0] % SLOTS], buf)
        if self.device is not None:  # the piece is in the slot before its counter says so (a peer process reads it)
            self.steps.settle()
        self.post_label(out, buf.nbytes, 0)
        self.wait_for(into)
        self.win.Sync()  # the counter before the piece
        k = self.consumed[into][0] % SLOTS
        incoming, label = in_views[k], self.in_labels[into][k]
        if label[0] != incoming.nbytes or label[1] != 0:
            raise RuntimeError(f"shared-memory transport: expected a {incoming.nbytes}-byte message, "
                               f"got bytes {label[1]}.. of a {label[0]}-byte one")
        return incoming

    def swap_whole(self, out, buf, into, dtype, count):
        """:meth:`swap` with the slots' views found by shape (:meth:`typed_slots`): ``buf`` out,
        a whole message of ``count`` elements of ``dtype`` in."""
        return self.swap(out, self.typed_slots(True, out, buf.dtype, buf.size), buf,
                         into, self.typed_slots(False, into, dtype, count))

    def wait_for(self, peer):
        """Spin until the next piece from ``peer`` is posted (:meth:`arrived`)."""
        posted, consumed, idle = self.peer_posted[peer], self.consumed[peer], 0
        while posted[0] <= consumed[0]:
            idle += 1
            if idle >= SPINS_BEFORE_YIELD:
                os.sched_yield()

    def typed_slots(self, outgoing, peer, dtype, count):
        """The first ``count`` elements of ``dtype`` of each slot to (``outgoing``) or from
        ``peer``: a tuple of :data:`SLOTS` views, kept per shape (making one, a slice and a
        dtype view, costs ten dict lookups)."""
        cache = self._typed_out if outgoing else self._typed_in
        key = (peer, dtype, count)
        views = cache.get(key)
        if views is None:
            if len(cache) >= TYPED_VIEWS:
                cache.clear()
            slots = (self.out_slots if outgoing else self.in_slots)[peer]
            views = cache[key] = tuple(slot[:count * dtype.itemsize].view(dtype) for slot in slots)
        return views

    def post_direct(self, peer, raw, where, reply=None):
        """Post the whole message ``raw``, which lies at ``where`` (window index, offset) in
        registered memory, by its label alone (:meth:`slot_free` first); return its piece
        number, for :meth:`taken`. ``reply`` (bytes, where) offers ``peer`` this rank's
        registered receive buffer for its own message (:meth:`offered`)."""
        label = self.out_labels[peer][self.posted[peer][0] % SLOTS]
        label[2], label[3] = (reply[0], encode(*reply[1])) if reply is not None else (0, 0)
        return self.post_label(peer, raw.size, encode(*where))

    def post_label(self, peer, size, value):
        """Post the next label to ``peer`` (:meth:`slot_free` first): the message's ``size``
        and ``value``, the piece's offset (or where a registered vector lies, or
        :data:`VIA_MPI`); return its piece number."""
        piece = self.posted[peer][0]
        label = self.out_labels[peer][piece % SLOTS]
        label[0] = size
        label[1] = value
        self.win.Sync()  # the data and its label before the counter
        self.posted[peer][0] = piece + 1
        return piece

    def taken(self, peer, piece):
        """Whether ``peer`` has consumed piece number ``piece`` (so its memory may change)."""
        if self.peer_consumed[peer][0] > piece:
            self.win.Sync()  # the counter before any later write to the vector
            return True
        return False

    def arrived(self, peer):
        """Whether the next piece from ``peer`` is posted."""
        return self.peer_posted[peer][0] > self.consumed[peer][0]

    def incoming(self, peer, size, offset):
        """The next piece from ``peer`` (:meth:`arrived` first), which must be bytes ``offset..``
        of a ``size``-byte message (the whole of it when read in place; None when it follows
        through MPI); :meth:`release` hands its slot back once it is read."""
        self.win.Sync()  # the counter before the piece
        k = self.consumed[peer][0] % SLOTS
        label = self.in_labels[peer][k]
        if label[1] < 0 and label[0] == size and offset == 0:
            if label[1] == VIA_MPI:
                return None
            index, start = decode(int(label[1]))  # the sender's registered vector
            return self.registry.view(index, peer, start, size)
        if label[0] != size or label[1] != offset:
            raise RuntimeError(
                f"shared-memory transport: expected bytes {offset}.. of a {size}-byte message, "
                f"got bytes {label[1]}.. of a {label[0]}-byte one"
            )
        return self.in_slots[peer][k][:min(size - offset, self.slot_bytes)]

    def offered(self, peer, size):
        """The registered receive buffer that the next piece from ``peer`` (a registered
        message, after :meth:`incoming`) offers for a ``size``-byte reply, or None."""
        label = self.in_labels[peer][self.consumed[peer][0] % SLOTS]
        if not VIA_MPI < label[1] < 0 or label[2] != size or label[3] >= 0:  # not a registered message's
            return None
        index, start = decode(int(label[3]))
        return self.registry.view(index, peer, start, size)

    def release(self, peer):
        if self.device is not None:  # our kernels are done reading the slot before its counter frees it
            self.steps.settle()
        self.win.Sync()  # done reading before the slot is handed back
        self.consumed[peer][0] += 1

    def free(self):
        self.win.Unlock_all()
        self.win.Free()
        if self.device:
            self.device.free()


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


def _slot(part, peer, k, slot_bytes):
    start = (peer * SLOTS + k) * slot_bytes
    return part[start:start + slot_bytes]
