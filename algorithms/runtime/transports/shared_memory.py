"""The shared-memory transport: messages between ranks of a node through the node's slots
(:mod:`.shm_window`), moved as the messages of :mod:`.shm_messages`.

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
from topology.machine import node_comm

from ...arrays import data_pointer, is_device
from ...settings import setting, size_text
from ..copies import copy_for
from .mpi import TAG
from .pages import PageProbe, thp_mode
from .registered import Registry
from .shm_messages import Handle, MpiMessage, ShmDirectSend, ShmRecv, ShmSend, ShmViaMpiSend, copier, reducer
from .shm_window import SLOTS, SPINS_BEFORE_YIELD, VIA_MPI, Mailboxes

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
        self.copy = copy_for(xp)  # (copies.py)
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
            return self._started(MpiMessage(self.mpi.isend(raw, dest)))
        queue = self._queue(self.outgoing, peer)
        where = self.registry.locate(raw) if self.registered and raw.size > self.box.slot_bytes else None
        if where is not None:
            return self._queued(ShmDirectSend(self.box, peer, raw, where, queue), queue)
        if raw.size > self.max_bytes and not self._small_pages(raw):
            return self._queued(ShmViaMpiSend(self.box, peer, raw.size, lambda: self.mpi.isend(raw, dest),
                                               queue), queue)
        return self._queued(ShmSend(self.box, peer, raw, queue), queue)

    def _start_recv(self, size, source, deliver, into=None, slot="shm-via-mpi"):
        """Receive ``size`` bytes from ``source`` through the mailboxes, handing them to
        ``deliver``; a message that follows through MPI lands in ``into`` (or scratch ``slot``,
        then ``deliver``)."""
        peer = self._node_rank(source, size)
        queue = self._queue(self.incoming, peer)

        def by_mpi():
            if into is not None:
                return self.mpi.irecv(into, source), None
            staged = self.workspace.get(self.xp, np.uint8, size, slot)
            return self.mpi.irecv(staged, source), staged
        return self._queued(ShmRecv(self.box, peer, size, deliver, queue, by_mpi), queue)

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
            return self._started(MpiMessage(self.mpi.irecv(raw, source)))
        return self._start_recv(raw.size, source, copier(self.xp, raw), raw)

    def progress(self):
        """One pass over every pending message; True if any moved."""
        moved = False
        for message in self.pending:
            if message.step():
                moved = True
        if moved:
            self.pending[:] = [m for m in self.pending if not m.done]
        return moved

    def _only_mpi(self):
        """Whether every pending message goes through MPI, which moves them inside any blocking
        MPI call: then a blocking MPI call waits safely, and a wait waits inside MPI."""
        return all(type(m) is MpiMessage for m in self.pending)

    def wait(self, *messages):
        if self._only_mpi():  # nothing of ours to move: wait inside MPI, not in a poll of Test()
            for m in messages:
                if not m.done:
                    m.request.Wait()
                    m.done = True
            self.pending[:] = [m for m in self.pending if not m.done]
            return
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
        if self._node_rank(dest, buf.nbytes) is None and self._only_mpi():
            self.mpi.send(buf, dest)  # nothing of ours pending, so blocking MPI is safe
            return
        raw = buf.view(np.uint8)
        request = self._announce_via_mpi(raw, dest)
        if request is not None:
            request.Wait()
        else:
            self.wait(self._start_send(raw, dest))

    def recv(self, buf, source):
        if (self._node_rank(source, buf.nbytes) is None and self._only_mpi()) or self._take_via_mpi(buf.nbytes, source):
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
            self.copy(recvbuf, box.swap_whole(out, sendbuf, into, recvbuf.dtype, recvbuf.size))
            box.release(into)
        else:
            raw = recvbuf.view(np.uint8)
            deliver = copier(self.xp, raw)
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
            reduce = reducer(acc, out, combine)
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
        (out, into), box, pending, copyto = peers, self.box, self.pending, self.copy
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
            self.wait(self._start_recv(size, source, reducer(acc, out, combine)))

    def irecv_combine(self, acc, source, out, combine, slot):
        """Start receiving a vector like ``acc`` from ``source`` and reducing it into ``out =
        combine(acc, received)`` piece by piece, straight from the slots, as the pieces arrive
        (its handle's ``Wait()`` ends it); None, with nothing started, where the message goes
        through MPI (the caller receives it into scratch ``slot``)."""
        if self._node_rank(source, acc.nbytes) is None:
            return None
        return Handle(self, self._start_recv(acc.nbytes, source, reducer(acc, out, combine), slot=slot))

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
            send = ShmDirectSend(box, out, raw, where, None)
            send.piece = piece  # posted already
            self.wait(self._start_recv(size, source, deliver, into), self._started(send))
            return True
        target = box.offered(peer, raw.size) if offer is not None else None
        if target is not None:  # both offered: put ours into the peer's buffer
            self.copy(target, raw)
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
            self.wait(self._started(MpiMessage(send)), self._start_recv(size, source, deliver, into))
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
        return Handle(self, self._start_send(buf.view(np.uint8), dest))

    def irecv(self, buf, source):
        """Start receiving into ``buf``; it holds the message once the handle's ``Wait()`` returns."""
        return Handle(self, self._start_recv_into(buf.view(np.uint8), source))


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
    node = node_comm(comm)
    try:
        probe.available = all(node.allgather(probe.available))
    finally:
        node.Free()
    return probe
