"""The shared-memory transport's messages: each a small state machine moved piece by piece.

As with MPI messages on one communicator and tag, the messages from one rank to another arrive
in the order they were sent (each pair of ranks has a queue per direction, and only the first
message of a queue moves), and a receive must name the size of its send (ours always do; a
mismatch raises). Sends are buffered: they complete once copied into the slots. ``step()``
moves what can move now and says whether anything did; the transport's every wait steps every
pending message, so programs that are correct under MPI's rules do not deadlock.
"""

from ..copies import copy_for
from .shm_window import VIA_MPI


def copier(xp, raw):
    """``deliver(piece, start, end)`` for a plain receive: bytes ``start..end`` of the message
    go into the byte vector ``raw`` at their place."""
    copy = copy_for(xp)

    def deliver(piece, start, end):
        copy(raw[start:end], piece)
    return deliver


def reducer(acc, out, combine):
    """``deliver(piece, start, end)`` for a receive that reduces: bytes ``start..end`` of the
    message go into ``out = combine(acc, piece)`` at their place."""
    item, dtype = acc.itemsize, acc.dtype

    def reduce(piece, start, end):
        combine(acc[start // item:end // item], piece.view(dtype), out[start // item:end // item])
    return reduce


class ShmMessage:
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


class ShmSend(ShmMessage):
    """Copied into the peer's slots as they free up."""

    __slots__ = ("raw",)

    def __init__(self, box, peer, raw, queue):
        super().__init__(box, peer, raw.size, queue)
        self.raw = raw

    def ready(self):
        return self.box.slot_free(self.peer)

    def move(self):
        return self.box.post(self.peer, self.raw, self.offset)


class ShmDirectSend(ShmMessage):
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


class ShmViaMpiSend(ShmMessage):
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


class ShmRecv(ShmMessage):
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


class MpiMessage:
    """A message through MPI (another node, or too large for the slots)."""

    __slots__ = ("request", "done")

    def __init__(self, request):
        self.request, self.done = request, False

    def step(self):
        self.done = self.request.Test()
        return self.done


class Handle:
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
