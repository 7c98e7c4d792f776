"""Shared-memory transport: ranks on one node pass messages through shared slots.

The ranks of a node allocate one window together (``MPI_Win_allocate_shared``).
Rank i's part of it holds, for every other rank j of the node, ``SLOTS`` slots
through which i sends to j, a counter of the pieces i has posted to j and a
counter of the pieces i has consumed from j (one writer per counter, each on its
own cache line). A message is cut into pieces of at most a slot: the sender
copies piece p into slot p mod SLOTS once the receiver has consumed piece
p - SLOTS, then bumps its posted counter; the receiver waits for that counter,
copies the piece out (or reduces straight from the slot) and bumps its consumed
counter. ``MPI_Win_sync`` orders the data and the counters (the MPI-3
shared-memory model, MPI 4.1 section 12.7). For CuPy buffers the slots are
device memory that the node's ranks map by CUDA IPC (:mod:`.cuda_ipc`), and the
stream is synchronized before a counter moves; the counters stay in the window.

That is MPICH's intranode eager protocol without MPI's matching, request objects
and handshakes, which dominate below a few hundred KiB. Host messages under
``ALLREDUCE_SHM_MIN_BYTES`` (8 KiB, where MPICH's eager path is quicker) or over
``ALLREDUCE_SHM_MAX_BYTES`` (256 KiB, one slot: beyond it MPICH's single copy, straight
from the sender's memory by CMA, beat the slots' two on an Intel Xeon VM whose cores pass
cache lines at a quarter of their copy speed), and messages to ranks on other nodes, go
through MPI, nonblocking (device messages: ``ALLREDUCE_IPC_MIN_BYTES``/``_MAX_BYTES``, by default
all of them through the slots). With ``ALLREDUCE_SHM_BY_PAGES=1``, or by default where
the THP setting is ``never``, a large message from 4 KiB pages goes through the slots as
well: the kernel's copy pins the sender's pages one at a time, at a third of its speed
from huge pages (:mod:`.pages`; where the kernel can tell, Linux 6.7+). The receiver
cannot see the sender's pages, so every large message within the node is then announced
in the mailboxes, as below; that cost the ring 2-19% on huge pages at 2-16 MiB, hence
not by default where NumPy's large arrays get huge pages.

As with MPI messages on one communicator and tag, the messages from one rank to
another arrive in the order they were sent, and a receive must name the size of
its send (ours always do; a mismatch raises). Sends are buffered: they complete
once copied into the slots. Every wait makes progress on every pending message
of this transport, so programs that are correct under MPI's rules do not deadlock.

A message of over one slot from a registered vector (:mod:`.registered`) is not
copied: its one label says where the vector lies, the receiver reads it in place,
and the send completes once the receiver has consumed it. In a blocking exchange
between two ranks that both receive into registered vectors, each writes its message
into the other's receive buffer instead (a put, offered in the label). Once a communicator has
registered vectors, a receiver cannot tell whether a large message comes from one, so
every message within the node is announced in the mailboxes: one over
``ALLREDUCE_SHM_MAX_BYTES`` from plain memory by a label saying that it follows
through MPI (single copy, as before), which the receiver then posts.
"""

import os

import numpy as np
from mpi4py import MPI
from topology.shm import ShmTooSmall

from .arrays import data_pointer, is_device, stream_synchronize
from .pages import PageProbe, thp_mode
from .registered import Registry, decode, encode
from .settings import setting, size_text
from .shared_windows import allocate_shared
from .transport import TAG


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
        self.xp, self.device = xp, None
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
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
                from .cuda_ipc import DeviceSlots

                self.device = DeviceSlots(node, slots_bytes)  # collective; raises on every rank
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
        self.xp.copyto(self.out_slots[peer][k][:end - offset], raw[offset:end])
        if self.device is not None:  # device copies and reductions are queued: finish them first
            stream_synchronize(self.xp)
        self.post_label(peer, raw.size, offset)
        return end

    def swap(self, out, out_views, buf, into, in_views):
        """Post ``buf``, a message of one slot or less, to ``out`` (:meth:`slot_free` first)
        through ``out_views`` (:meth:`typed_slots`), then wait for the next piece from ``into``,
        which must be a whole message as long as the views ``in_views``, and return its view
        (:meth:`release` hands the slot back once it is read). A blocking exchange of one-slot
        messages (each ring step of a 2-rank all-reduce from 16 to 512 KiB) in one call, no
        message viewed as bytes."""
        self.xp.copyto(out_views[self.posted[out][0] % SLOTS], buf)
        if self.device is not None:  # device copies and reductions are queued: finish them first
            stream_synchronize(self.xp)
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
        if self.device is not None:  # device copies and reductions are queued: finish them first
            stream_synchronize(self.xp)
        self.win.Sync()  # done reading before the slot is handed back
        self.consumed[peer][0] += 1

    def free(self):
        self.win.Unlock_all()
        self.win.Free()
        if self.device:
            self.device.free()


def _node_page_probe(comm):
    """A :class:`.pages.PageProbe`, ``available`` when large messages are to go by the
    sender's pages on every rank of ``comm``'s node (collective: a large message must be
    announced exactly when every rank expects it). ``ALLREDUCE_SHM_BY_PAGES``: ``auto``
    (default) where the THP setting is ``never``, so every buffer lies in 4 KiB pages;
    ``1`` always (buffers in 4 KiB pages on a machine with huge pages: PyTorch's CPU
    tensors, say); ``0`` never. The setting itself is agreed on by every rank
    (:func:`.settings.agree_settings`); whether the kernel can tell is agreed here."""
    wanted = setting("ALLREDUCE_SHM_BY_PAGES")
    on = wanted == "1" or (wanted == "auto" and thp_mode() == "never")
    probe = PageProbe() if on else PageProbe.unavailable()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        probe.available = all(node.allgather(probe.available))
    finally:
        node.Free()
    return probe


def _copier(xp, raw):
    """``deliver(piece, start, end)`` for a plain receive: bytes ``start..end`` of the message
    go into the byte vector ``raw`` at their place."""
    def copy(piece, start, end):
        xp.copyto(raw[start:end], piece)
    return copy


def _reducer(acc, out, combine):
    """``deliver(piece, start, end)`` for a receive that reduces: bytes ``start..end`` of the
    message go into ``out = combine(acc, piece)`` at their place."""
    item, dtype = acc.itemsize, acc.dtype

    def reduce(piece, start, end):
        combine(acc[start // item:end // item], piece.view(dtype), out[start // item:end // item])
    return reduce


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


def _slot(part, peer, k, slot_bytes):
    start = (peer * SLOTS + k) * slot_bytes
    return part[start:start + slot_bytes]


class _ShmMessage:
    """A message between two ranks of this node, moved piece by piece when it is the first
    in its queue (messages between two ranks keep their order)."""

    __slots__ = ("box", "peer", "size", "offset", "done", "queue")

    def __init__(self, box, peer, size, queue):
        self.box, self.peer, self.size, self.queue = box, peer, size, queue
        self.offset, self.done = 0, size == 0

    def step(self):
        """Move every piece that can move now; True if any did."""
        if self.queue[0] is not self:
            return False
        moved = False
        while self.offset < self.size and self.ready():
            self.offset, moved = self.move(), True
        if self.offset >= self.size:
            self.done = True
            self.queue.pop(0)
        return moved


class _ShmSend(_ShmMessage):
    """Copied into the peer's slots as they free up."""

    __slots__ = ("raw",)

    def __init__(self, box, peer, raw, queue):
        super().__init__(box, peer, raw.size, queue)
        self.raw = raw

    def ready(self):
        return self.box.slot_free(self.peer)

    def move(self):
        return self.box.post(self.peer, self.raw, self.offset)


class _ShmDirectSend(_ShmMessage):
    """A registered vector, posted by its label and read in place by the peer; done once
    the peer has consumed it."""

    __slots__ = ("raw", "where", "piece")

    def __init__(self, box, peer, raw, where, queue):
        super().__init__(box, peer, raw.size, queue)
        self.raw, self.where, self.piece = raw, where, None

    def step(self):
        box, moved = self.box, False
        if self.piece is None:
            if self.queue[0] is not self or not box.slot_free(self.peer):
                return False
            self.piece, moved = box.post_direct(self.peer, self.raw, self.where), True
            self.queue.pop(0)
        if box.taken(self.peer, self.piece):
            self.done = moved = True
        return moved


class _ShmViaMpiSend(_ShmMessage):
    """A large message from plain memory while vectors are registered: announced by a label,
    then sent through MPI."""

    __slots__ = ("start", "request")

    def __init__(self, box, peer, size, start, queue):
        super().__init__(box, peer, size, queue)
        self.start, self.request = start, None

    def step(self):
        moved = False
        if self.request is None:
            if self.queue[0] is not self or not self.box.slot_free(self.peer):
                return False
            self.box.post_label(self.peer, self.size, VIA_MPI)
            self.queue.pop(0)
            self.request, moved = self.start(), True
        if self.request.Test():
            self.done = moved = True
        return moved


class _ShmRecv(_ShmMessage):
    """Handed piece by piece to ``deliver(piece, start, end)`` as it arrives (a copy into the
    receive buffer, or a reduction straight from the slot). When the label says the message
    follows through MPI, ``by_mpi()`` starts receiving it and returns (request, buffer to
    deliver from once it completes, or None when it lands in place)."""

    __slots__ = ("deliver", "by_mpi", "request", "staged")

    def __init__(self, box, peer, size, deliver, queue, by_mpi):
        super().__init__(box, peer, size, queue)
        self.deliver, self.by_mpi, self.request, self.staged = deliver, by_mpi, None, None

    def ready(self):
        return self.box.arrived(self.peer)

    def move(self):
        piece = self.box.incoming(self.peer, self.size, self.offset)
        if piece is None:
            self.box.release(self.peer)
            self.request, self.staged = self.by_mpi()
            return self.size
        end = self.offset + piece.size
        self.deliver(piece, self.offset, end)
        self.box.release(self.peer)
        return end

    def step(self):
        moved = False
        if self.request is None:
            moved = super().step()
            if self.request is None:
                return moved
            self.done = False  # announced and taken from the queue; MPI still delivering
        if self.request.Test():
            if self.staged is not None:
                self.deliver(self.staged, 0, self.size)
            self.done = moved = True
        return moved


class _MpiMessage:
    """A message through MPI (another node, or too large for the slots)."""

    __slots__ = ("request", "done")

    def __init__(self, request):
        self.request, self.done = request, False

    def step(self):
        self.done = self.request.Test()
        return self.done


class _Handle:
    """What ``isend``/``irecv`` return: ``Wait()`` ends the message, ``Test()`` says if it ended."""

    __slots__ = ("transport", "message")

    def __init__(self, transport, message):
        self.transport, self.message = transport, message

    def Wait(self):
        self.transport.wait(self.message)

    def Test(self):
        if not self.message.done:
            self.transport.progress()
        return self.message.done


#: per array module: the name, and the variables of the smallest and largest
#: message through the slots; the others go through MPI
ROUTES = {"numpy": ("shared-memory", "ALLREDUCE_SHM_MIN_BYTES", "ALLREDUCE_SHM_MAX_BYTES"),
          "cupy": ("cuda-ipc", "ALLREDUCE_IPC_MIN_BYTES", "ALLREDUCE_IPC_MAX_BYTES")}


class SharedMemoryTransport:
    """Point-to-point messages through the node's shared slots (see the module docstring):
    host memory for NumPy, device memory mapped by CUDA IPC for CuPy. ``mpi`` is the
    transport class for the other messages (direct, or staged for CuPy without a
    CUDA-aware MPI). Collective when built; CuPy raises :class:`.cuda_ipc.IpcUnavailable`
    on every rank when IPC cannot be set up."""

    def __init__(self, private, xp, workspace, mpi):
        self.name, low, high = ROUTES[xp.__name__]
        self.min_bytes, self.max_bytes = setting(low), setting(high)
        self.xp, self.host = xp, not is_device(xp)
        self.mpi = mpi(private, xp, workspace)
        self.comm = private.comm
        self.workspace = workspace
        # vectors registered on this communicator (host only); built empty, without communicating
        self.registry = private.resource("registered", Registry) if self.host else None
        self.registered = self.registry.windows if self.host else {}
        self.box = private.resource(f"mailboxes-{xp.__name__}", lambda comm: Mailboxes(comm, xp, self.registry))
        # host messages over max_bytes from 4 KiB pages go through the slots, where the node's
        # ranks can all tell huge pages from small ones (so the receiver is told the route)
        probe = private.resource("page-probe", _node_page_probe) if self.host else None
        self.pages = probe if probe is not None and probe.available else None  # None: all large ones via MPI
        self.local = self.box.local
        # sizes that go through the slots in one piece whatever is registered (_one_piece)
        self.one_slot = (self.min_bytes, min(self.box.slot_bytes, self.max_bytes))
        self.outgoing = {}  # node rank -> sends not yet fully posted, in order
        self.incoming = {}  # node rank -> receives not yet complete, in order
        self.pending = []   # every message not yet complete, shared-memory or MPI

    def _largest(self):
        """The largest message announced in the mailboxes: every size once vectors are
        registered, or when large messages choose their route by the sender's pages."""
        return self.max_bytes if not self.registered and self.pages is None else 1 << 62

    def _small_pages(self, raw):
        """Whether the message ``raw`` lies in 4 KiB pages, judged by its middle page (:mod:`.pages`;
        the kernel walks every page of a range it is asked about, so one page costs least)."""
        return self.pages is not None and not self.pages.is_huge(data_pointer(raw) + raw.size // 2)

    def _node_rank(self, rank, nbytes):
        """The node rank of ``rank`` if a message of ``nbytes`` to or from it goes through
        shared memory, else None (MPI)."""
        return self.local.get(rank) if self.min_bytes <= nbytes <= self._largest() else None

    def _start_send(self, raw, dest):
        peer = self._node_rank(dest, raw.size)
        if peer is None:
            return self._started(_MpiMessage(self.mpi.isend(raw, dest)))
        queue = self._queue(self.outgoing, peer)
        where = self.registry.locate(raw) if self.registered and raw.size > self.box.slot_bytes else None
        if where is not None:
            return self._queued(_ShmDirectSend(self.box, peer, raw, where, queue), queue)
        if raw.size > self.max_bytes and not self._small_pages(raw):
            return self._queued(_ShmViaMpiSend(self.box, peer, raw.size, lambda: self.mpi.isend(raw, dest),
                                               queue), queue)
        return self._queued(_ShmSend(self.box, peer, raw, queue), queue)

    def _start_recv(self, size, source, deliver, into=None):
        """Receive ``size`` bytes from ``source`` through the mailboxes, handing them to
        ``deliver``; a message that follows through MPI lands in ``into`` (or scratch, then
        ``deliver``)."""
        peer = self._node_rank(source, size)
        queue = self._queue(self.incoming, peer)

        def by_mpi():
            if into is not None:
                return self.mpi.irecv(into, source), None
            staged = self.workspace.get(self.xp, np.uint8, size, "shm-via-mpi")
            return self.mpi.irecv(staged, source), staged
        return self._queued(_ShmRecv(self.box, peer, size, deliver, queue, by_mpi), queue)

    @staticmethod
    def _queue(queues, peer):
        queue = queues.get(peer)
        if queue is None:
            queue = queues[peer] = []
        return queue

    def _queued(self, message, queue):
        if not message.done:
            queue.append(message)
            message.step()
        return message if message.done else self._started(message)

    def _started(self, message):
        self.pending.append(message)
        return message

    def _start_recv_into(self, raw, source):
        if self._node_rank(source, raw.size) is None:
            return self._started(_MpiMessage(self.mpi.irecv(raw, source)))
        return self._start_recv(raw.size, source, _copier(self.xp, raw), raw)

    def progress(self):
        """One pass over every pending message; True if any moved."""
        moved = False
        for message in self.pending:
            if message.step():
                moved = True
        if moved:
            self.pending[:] = [m for m in self.pending if not m.done]
        return moved

    def wait(self, *messages):
        idle = 0
        while not all(m.done for m in messages):
            if self.progress():
                idle = 0
            else:
                idle += 1
                if idle >= SPINS_BEFORE_YIELD:
                    os.sched_yield()

    def _one_piece(self, send_bytes, dest, recv_bytes, source):
        """For a send and a receive with nothing else pending: ``(node rank of dest, node rank
        of source)`` when each goes through shared memory as one piece, ``True`` when both go
        through MPI (so blocking MPI calls are safe), else None."""
        if self.pending:
            return None
        peers = self._slot_peers(send_bytes, dest, recv_bytes, source)
        if peers is not None:  # the common case, decided at once
            return peers if self.box.slot_free(peers[0]) else None
        low, high, local = self.min_bytes, self._largest(), self.local
        out = local.get(dest) if low <= send_bytes <= high else None
        into = local.get(source) if low <= recv_bytes <= high else None
        if out is None and into is None:
            return True
        box = self.box
        if (out is None or into is None or send_bytes > box.slot_bytes or recv_bytes > box.slot_bytes
                or not box.slot_free(out)):
            return None
        return out, into

    def _slot_peers(self, send_bytes, dest, recv_bytes, source):
        """``(node rank of dest, node rank of source)`` when both messages fit the one-slot
        route (each within :attr:`one_slot`, both peers on this node), else None; what is
        pending and whether the slot is free are the caller's to check."""
        low, high = self.one_slot
        if low <= send_bytes <= high and low <= recv_bytes <= high:
            out, into = self.local.get(dest), self.local.get(source)
            if out is not None and into is not None:
                return out, into
        return None

    def send(self, buf, dest):
        if not self.pending and self._node_rank(dest, buf.nbytes) is None:
            self.mpi.send(buf, dest)  # nothing pending, so blocking MPI is safe
            return
        raw = buf.view(np.uint8)
        request = self._announce_via_mpi(raw, dest)
        if request is not None:
            request.Wait()
        else:
            self.wait(self._start_send(raw, dest))

    def recv(self, buf, source):
        if not self.pending and (self._node_rank(source, buf.nbytes) is None
                                 or self._take_via_mpi(buf.nbytes, source)):
            self.mpi.recv(buf, source)
        else:
            self.wait(self._start_recv_into(buf.view(np.uint8), source))

    def _announce_via_mpi(self, raw, dest):
        """With nothing pending, a large plain message whose route is MPI (:meth:`_small_pages`)
        is started at once: its label, then its ``Isend``, whose request this returns for the
        caller to wait on inside MPI. None, with nothing done, otherwise. The general path's
        queues and a poll per message cost 10-15 us per 2 MiB exchange."""
        if self.pending or self.registered or raw.size <= self.max_bytes:
            return None
        out = self._node_rank(dest, raw.size)
        if out is None or not self.box.slot_free(out) or self._small_pages(raw):
            return None
        self.box.post_label(out, raw.size, VIA_MPI)
        return self.mpi.isend(raw, dest)

    def _take_via_mpi(self, size, source):
        """With nothing pending, wait for the label of the next message from ``source`` (a
        large one within the node); True, the label taken, when the message follows through
        MPI (the caller receives it there), False when it comes otherwise (left for the
        general path) or this does not apply."""
        if self.pending or self.registered or size <= self.max_bytes:
            return False
        peer = self._node_rank(source, size)
        if peer is None:
            return False
        self.box.wait_for(peer)
        if self.box.incoming(peer, size, 0) is not None:
            return False
        self.box.release(peer)
        return True

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        send_bytes, recv_bytes = sendbuf.nbytes, recvbuf.nbytes
        if send_bytes < self.min_bytes and recv_bytes < self.min_bytes and self.host and not self.pending:
            # the latency-bound case, first and with nothing in between
            self.comm.Sendrecv([sendbuf, MPI.BYTE], dest, TAG, [recvbuf, MPI.BYTE], source, TAG)
            return
        peers = self._one_piece(send_bytes, dest, recv_bytes, source)
        if peers is True:
            self.mpi.sendrecv(sendbuf, dest, recvbuf, source)
        elif peers is not None:
            (out, into), box = peers, self.box
            self.xp.copyto(recvbuf, box.swap_whole(out, sendbuf, into, recvbuf.dtype, recvbuf.size))
            box.release(into)
        else:
            raw = recvbuf.view(np.uint8)
            deliver = _copier(self.xp, raw)
            if not (self._exchange_in_place(sendbuf, dest, recv_bytes, source, deliver, raw)
                    or self._exchange_via_mpi(sendbuf, dest, recv_bytes, source, deliver, raw)):
                self.wait(self._start_send(sendbuf.view(np.uint8), dest), self._start_recv_into(raw, source))

    def sendrecv_combine(self, sendbuf, dest, acc, source, out, combine):
        """Send ``sendbuf`` to ``dest`` while receiving a vector like ``acc`` from ``source``,
        and set ``out = combine(acc, received)``, reducing straight from the shared slots.
        ``out`` may be ``acc`` but must not overlap ``sendbuf``."""
        size, dtype = acc.nbytes, acc.dtype
        peers = self._one_piece(sendbuf.nbytes, dest, size, source)
        if peers is not None and peers is not True:
            (to, into), box = peers, self.box
            combine(acc, box.swap_whole(to, sendbuf, into, dtype, acc.size), out)
            box.release(into)
        elif self._node_rank(source, size) is None:
            incoming = self.workspace.get(self.xp, dtype, acc.size, "shm-combine")
            self.sendrecv(sendbuf, dest, incoming, source)
            combine(acc, incoming, out)
        else:
            reduce = _reducer(acc, out, combine)
            if not (self._exchange_in_place(sendbuf, dest, size, source, reduce)
                    or self._exchange_via_mpi(sendbuf, dest, size, source, reduce)):
                self.wait(self._start_send(sendbuf.view(np.uint8), dest), self._start_recv(size, source, reduce))

    def bind_exchange(self, dtype, send_count, dest, recv_count, source, combine, general):
        """``general`` (a blocking exchange of ``send_count`` elements of ``dtype`` to ``dest``
        and ``recv_count`` from ``source``: ``general(sendbuf, recvbuf)``, or with ``combine``
        ``general(sendbuf, acc, out)`` as :meth:`sendrecv_combine`) bound to that shape, like
        an MPI persistent request. Where both messages go through the slots as one piece, the
        route and the slots' views are found here, once, and each call only checks that
        nothing is pending and the slot is free (else ``general``); both under :attr:`min_bytes`
        (on the host), :meth:`_bind_small`; otherwise ``general``."""
        send_bytes, recv_bytes = send_count * dtype.itemsize, recv_count * dtype.itemsize
        if send_bytes < self.min_bytes and recv_bytes < self.min_bytes and self.host:
            return self._bind_small(dtype, dest, recv_count, source, combine, general)
        peers = self._slot_peers(send_bytes, dest, recv_bytes, source)
        if peers is None:
            return general
        (out, into), box, pending, copyto = peers, self.box, self.pending, self.xp.copyto
        swap, release, posted, taken = box.swap, box.release, box.posted[out], box.peer_consumed[out]
        out_views, in_views = box.typed_slots(True, out, dtype, send_count), box.typed_slots(False, into, dtype,
                                                                                            recv_count)
        # each call: nothing pending, and Mailboxes.slot_free(out), read from its counters here
        if combine is None:
            def exchange(sendbuf, recvbuf):
                if pending or posted[0] - taken[0] >= SLOTS:
                    return general(sendbuf, recvbuf)
                copyto(recvbuf, swap(out, out_views, sendbuf, into, in_views))
                release(into)
        else:
            def exchange(sendbuf, acc, result):
                if pending or posted[0] - taken[0] >= SLOTS:
                    return general(sendbuf, acc, result)
                combine(acc, swap(out, out_views, sendbuf, into, in_views), result)
                release(into)
        return exchange

    def _bind_small(self, dtype, dest, recv_count, source, combine, general):
        """:meth:`bind_exchange` for two host messages under :attr:`min_bytes`: one
        ``MPI_Sendrecv``, the route :meth:`sendrecv` takes for them, with nothing pending
        (else ``general``); a reducing one receives into a vector of its own, made here."""
        sendrecv, pending, byte = self.comm.Sendrecv, self.pending, MPI.BYTE
        if combine is None:
            def exchange(sendbuf, recvbuf):
                if pending:
                    return general(sendbuf, recvbuf)
                sendrecv([sendbuf, byte], dest, TAG, [recvbuf, byte], source, TAG)
            return exchange
        incoming = np.empty(recv_count, dtype)
        into = [incoming, byte]

        def exchange(sendbuf, acc, out):
            if pending:
                return general(sendbuf, acc, out)
            sendrecv([sendbuf, byte], dest, TAG, into, source, TAG)
            combine(acc, incoming, out)
        return exchange

    def recv_combine(self, acc, source, out, combine):
        """Receive a vector like ``acc`` from ``source`` and set ``out = combine(acc, received)``,
        reducing straight from the shared slots or from the sender's registered vector (no
        copy into scratch first). Every pending message makes progress meanwhile."""
        size = acc.nbytes
        unannounced = self._node_rank(source, size) is None
        if unannounced or self._take_via_mpi(size, source):  # through MPI (its label taken if announced)
            incoming = self.workspace.get(self.xp, acc.dtype, acc.size, "shm-combine")
            (self.recv if unannounced else self.mpi.recv)(incoming, source)
            combine(acc, incoming, out)
        else:
            self.wait(self._start_recv(size, source, _reducer(acc, out, combine)))

    def _exchange_in_place(self, sendbuf, dest, size, source, deliver, into=None):
        """The fast path of a blocking exchange whose send is a registered vector over one slot,
        with nothing else pending (the ring's every step): post it, take the incoming message
        at once when it is one piece, then wait until ours was read. When the incoming message
        takes several pieces or follows through MPI, the general path finishes both. False,
        with nothing done, when it does not apply.

        A plain receive (``into``) from the rank we send to, into a registered vector, offers
        that vector with our label. When both sides offer, each writes its message into the
        other's receive buffer (a put) instead of reading the other's send buffer: the data
        it writes is in its own cache, and the lines it writes are ones it read itself
        (in place), so no line moves between the two cores twice."""
        box, raw = self.box, sendbuf.view(np.uint8)
        if self.pending or not self.registered or raw.size <= box.slot_bytes:
            return False
        out, peer = self._node_rank(dest, raw.size), self._node_rank(source, size)
        where = self.registry.locate(raw) if out is not None and peer is not None else None
        if where is None or not box.slot_free(out):
            return False
        offer = self.registry.locate(into) if into is not None and dest == source else None
        piece = box.post_direct(out, raw, where, None if offer is None else (size, offer))
        self.box.wait_for(peer)
        incoming = box.incoming(peer, size, 0)
        if incoming is None or incoming.size < size:
            send = _ShmDirectSend(box, out, raw, where, None)
            send.piece = piece  # posted already
            self.wait(self._start_recv(size, source, deliver, into), self._started(send))
            return True
        target = box.offered(peer, raw.size) if offer is not None else None
        if target is not None:  # both offered: put ours into the peer's buffer
            self.xp.copyto(target, raw)
        else:
            deliver(incoming, 0, size)
        box.release(peer)
        idle = 0
        while not box.taken(out, piece):  # read, or our receive buffer filled by the peer's put
            idle += 1
            if idle >= SPINS_BEFORE_YIELD:
                os.sched_yield()
        return True

    def _exchange_via_mpi(self, sendbuf, dest, size, source, deliver, into=None):
        """A blocking exchange of two large messages within the node whose send goes through
        MPI with nothing else pending (:meth:`_announce_via_mpi`): when the incoming message
        does too, its ``Irecv`` (into ``into``, or scratch and then ``deliver``) and one
        ``Waitall`` inside MPI; when it comes through the slots, the general path receives
        it. False, with nothing done, when it does not apply."""
        if size <= self.max_bytes or self._node_rank(source, size) is None:
            return False
        send = self._announce_via_mpi(sendbuf.view(np.uint8), dest)
        if send is None:
            return False
        if not self._take_via_mpi(size, source):
            self.wait(self._started(_MpiMessage(send)), self._start_recv(size, source, deliver, into))
            return True
        target = into if into is not None else self.workspace.get(self.xp, np.uint8, size, "shm-via-mpi")
        MPI.Request.Waitall([send, self.mpi.irecv(target, source)])
        if into is None:
            deliver(target, 0, size)
        return True

    def describe(self):
        low, high = size_text(self.min_bytes), size_text(self.max_bytes)
        through = (f"under {low}" if self.min_bytes > 1 else "") + (
            f"{' and ' if self.min_bytes > 1 else ''}over {high}" if self.max_bytes < 1 << 62 else "")
        text = (f"{self.name} within a node; {self.mpi.describe()} between nodes"
                + (f" and for messages {through}" if through else ""))
        if self.pages is not None:
            text += f"; messages over {high} from 4 KiB pages through the slots"
        if self.registered:
            text += f"; {len(self.registered)} registered vector(s), read in place (every size over {low})"
        return text

    def isend(self, buf, dest):
        """Start sending ``buf``; the returned handle's ``Wait()`` ends it (``buf`` untouched until then)."""
        return _Handle(self, self._start_send(buf.view(np.uint8), dest))

    def irecv(self, buf, source):
        """Start receiving into ``buf``; it holds the message once the handle's ``Wait()`` returns."""
        return _Handle(self, self._start_recv_into(buf.view(np.uint8), source))
