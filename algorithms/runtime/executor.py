"""The machinery every algorithm shares: private communicator, workspace, transport, reduction.

An algorithm is a function ``run(coll, sendbuf, recvbuf)`` that leaves the
reduced vector in ``recvbuf`` (``recvbuf is sendbuf`` when in place); it talks
only through ``coll.send``/``recv``/``sendrecv``/``isend``/``irecv`` and reduces only
through ``coll.combine`` (or ``coll.sendrecv_combine``, both at once), so it works unchanged on
NumPy and CuPy buffers. An algorithm written as a plan hands its steps to the engine
(:mod:`.engine`), which binds them to this context once per shape (its exchanges through
``coll.exchange``) and keeps them in ``coll.engines``.
"""

import atexit
import functools
import sys

from mpi4py import MPI

from ..arrays import same_memory
from ..device import steps
from ..ops import combiner, divider
from ..settings import agree_settings
from .copies import copy_for
from .transports import build_transport


class Workspace:
    """Scratch buffers reused across calls, one per (module, dtype, slot), grown on demand.

    Repeated calls of the same size allocate nothing after the first: the views handed out
    are kept too (a slice costs a fifth of a microsecond, a dict lookup a tenth), and
    dropped with their buffer when it grows.
    """

    VIEWS_PER_BUFFER = 64  # distinct lengths kept per buffer before its views are dropped

    def __init__(self):
        self._buffers = {}
        self._views = {}

    def get(self, xp, dtype, count, slot):
        key = (xp, dtype, slot, count)
        view = self._views.get(key)
        if view is not None:
            return view
        buffer_key = key[:3]
        buf = self._buffers.get(buffer_key)
        if buf is None or buf.size < count:
            self._views = {k: v for k, v in self._views.items() if k[:3] != buffer_key}
            buf = self._buffers[buffer_key] = xp.empty(count, dtype)
        elif len(self._views) >= self.VIEWS_PER_BUFFER * len(self._buffers):
            self._views.clear()
        view = self._views[key] = buf[:count]
        return view

    def host(self, xp, nbytes, slot):
        """A host byte buffer for staging (page-locked when ``xp`` is CuPy)."""
        key = ("host", xp.__name__, slot)
        buf = self._buffers.get(key)
        if buf is None or buf.size < nbytes:
            buf = self._buffers[key] = steps(xp).pinned(nbytes)
        return buf[:nbytes]

    def clear(self):
        self._buffers.clear()
        self._views.clear()


WORKSPACE = Workspace()

_PRIVATE_KEYVAL = None


class Private:
    """The private duplicate of a user's communicator, and what is built on it once and
    reused by every later call: one transport per array module, one :class:`Collective`
    context per module and op, and shared resources such as the node's shared window."""

    __slots__ = ("comm", "rank", "size", "contexts", "transports", "resources", "runners", "engine")

    def __init__(self, comm):
        try:
            agree_settings(comm)  # the ALLREDUCE_* variables: valid and alike on every rank
        except ValueError:
            comm.Free()
            raise
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.contexts = {}
        self.transports = {}
        self.resources = {}
        self.runners = {}  # the entry point's bound calls by shape (collectives.allreduce)
        self.engine = None  # the engine its plans run on, where a tool pins one (compiled.pin), else the setting's
        _LIVE.append(self)

    def collective(self, xp, op):
        """The context for module ``xp`` and ``op``; the transport is chosen (and the
        ``ALLREDUCE_TRANSPORT`` variable read) when ``xp`` is first used on this communicator.
        Called by every rank at once (it may build a shared window: collective)."""
        key = (xp, op)
        context = self.contexts.get(key)
        if context is None:
            context = self.contexts[key] = Collective(self.comm, xp, op, self.transport(xp), self)
        return context

    def transport(self, xp):
        """The transport for module ``xp`` on this communicator, built on first use (collective)."""
        transport = self.transports.get(xp.__name__)
        if transport is None:
            transport = self.transports[xp.__name__] = build_transport(self, xp, WORKSPACE)
        return transport

    def resource(self, name, build):
        """``build(comm)``, made once per communicator (collective) and freed with it."""
        value = self.resources.get(name)
        if value is None:
            value = self.resources[name] = build(self.comm)
        return value

    def free_resources(self):
        """Free the shared windows and device slots (collective; again is a no-op)."""
        for value in reversed(list(self.resources.values())):
            value.free()
        self.resources.clear()
        self.transports.clear()
        self.contexts.clear()
        self.runners.clear()
        LAST_CALL[0] = NO_CALL  # it may hold one of these runners

    def free(self):
        self.free_resources()
        self.comm.Free()
        _LIVE.remove(self)


_LIVE = []  # every Private not yet freed, in creation order (the same on every rank)


@atexit.register  # registered after mpi4py's own, so it runs before MPI_Finalize
def _free_before_finalize():
    """Windows still allocated at MPI_Finalize make MPICH's OFI netmod fail to close
    (fabricclose: resource busy), so free them first, newest first, on every rank. Not
    when the program leaves by an uncaught exception (``sys.last_value``): freeing is
    collective, the other ranks may be waiting in a collective of their own, and the way
    out then is an abort (mpi4py's runner, ``python -m mpi4py``, makes its finalization one)."""
    if getattr(sys, "last_value", None) is not None:
        return
    if MPI.Is_initialized() and not MPI.Is_finalized():
        for private in reversed(_LIVE):
            private.free_resources()


LAST_USED = [None, None]  # (user communicator, its Private): most calls reuse the last one
#: the last all-reduce that ran a kept runner on two vectors small enough to be referenced here
#: (collectives.allreduce): (sendbuf, recvbuf, algorithm, op, comm as passed, matches, run_if_same
#: (compiled.repeat_checks), runner, the Private of comm, agreement fields); NO_CALL
#: matches no call
NO_CALL = (object(),) * 10
LAST_CALL = [NO_CALL]


def _free_private(comm, keyval, private):
    LAST_USED[:] = [None, None]
    if not MPI.Is_finalized():
        private.free()


def private_comm(comm):
    """A :class:`Private` holding a duplicate of ``comm``, cached on ``comm`` as an attribute,
    so our messages never match the caller's. Collective on the first call for each communicator."""
    global _PRIVATE_KEYVAL
    if comm is LAST_USED[0]:
        return LAST_USED[1]
    if _PRIVATE_KEYVAL is None:
        _PRIVATE_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_free_private)
    private = comm.Get_attr(_PRIVATE_KEYVAL)
    if private is None:
        private = Private(comm.Dup())
        comm.Set_attr(_PRIVATE_KEYVAL, private)
    LAST_USED[:] = [comm, private]
    return private


class Collective:
    """Context of a collective: who we are, how to move bytes, how to reduce. Holds no
    per-call state, so one context serves every call with the same module and op."""

    def __init__(self, comm, xp, op, transport, private=None):
        self.comm = comm
        self.private = private  # the Private it belongs to: its resource() builds once per communicator
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.xp = xp
        self.copy = copy_for(xp)  # (copies.py)
        self.op = op
        # combine(acc, incoming, out): out = acc (op) incoming, element-wise (ops.combiner)
        self.combine = combiner(xp, op) if op is not None else None
        self.divide = divider(xp)
        self.transport = transport
        self.send = self.transport.send
        self.recv = self.transport.recv
        self.sendrecv = self.transport.sendrecv
        self.isend = self.transport.isend
        self.irecv = self.transport.irecv
        # recv_combine(acc, source, out): receive a vector like acc from source and set
        # out = acc (op) received; sendrecv_combine(sendbuf, dest, acc, source, out): the same
        # while sending sendbuf to dest (out must not overlap sendbuf). A shared-memory
        # transport reduces straight from the message, others receive into scratch first.
        # Partials of the transport's methods: no Python frame between.
        self.recv_combine = functools.partial(
            getattr(transport, "recv_combine", None) or self._recv_combine_from_scratch, combine=self.combine)
        self.sendrecv_combine = functools.partial(
            getattr(transport, "sendrecv_combine", None) or self._combine_from_scratch, combine=self.combine)
        self._exchanges = {}  # exchange(): bound exchanges by shape and peers
        self.engines = {}  # engine.bound(): plans bound to this context, by builder, shape and tree

    def exchange(self, dtype, send_count, dest, recv_count, source, reducing=False):
        """A blocking exchange of ``send_count`` elements of ``dtype`` to ``dest`` and
        ``recv_count`` from ``source``, bound to that shape and those peers, like an MPI
        persistent request: ``exchange(sendbuf, recvbuf)`` as :meth:`sendrecv`, or when
        ``reducing`` ``exchange(sendbuf, acc, out)`` as :meth:`sendrecv_combine`. A transport
        with ``bind_exchange`` finds the route and its buffers once (2.5 us less per 2-rank
        ring call at 32 KiB); made once per shape and kept (at most 1024)."""
        key = (dtype, send_count, dest, recv_count, source, reducing)
        bound = self._exchanges.get(key)
        if bound is None:
            if reducing:
                def general(sendbuf, acc, out):
                    self.sendrecv_combine(sendbuf, dest, acc, source, out)
            else:
                def general(sendbuf, recvbuf):
                    self.sendrecv(sendbuf, dest, recvbuf, source)
            bind = getattr(self.transport, "bind_exchange", None)
            combine = self.combine if reducing else None
            bound = general if bind is None else bind(dtype, send_count, dest, recv_count, source, combine, general)
            if len(self._exchanges) >= 1024:
                self._exchanges.clear()
            self._exchanges[key] = bound
        return bound

    def runner(self, algorithm, count, dtype, plan=None):
        """``runner(sendbuf, recvbuf)``: ``algorithm`` (an :class:`.algorithm.Algorithm`) on vectors
        of ``count`` elements of ``dtype`` in this context (and on ``plan``, what its ``prepare`` or
        tree method made), with what every such call repeats done once: its ``bind(self, count,
        dtype)`` where it has one, else its ``allreduce`` itself; ``avg``'s division included. What a
        bind needs built collectively it finds built by an earlier call, or leaves to the first call."""
        if plan is not None:
            run = algorithm.allreduce

            def bound(sendbuf, recvbuf):
                run(self, sendbuf, recvbuf, plan)
        else:
            bound = self.bound(algorithm, count, dtype)
        if self.op != "avg" or self.size == 1:
            return bound
        finish = self.finish

        def averaged(sendbuf, recvbuf):
            bound(sendbuf, recvbuf)
            finish(recvbuf)
        return averaged

    def bound(self, algorithm, count, dtype):
        """``run(sendbuf, recvbuf)`` in this context for vectors of ``count`` elements of
        ``dtype``: ``algorithm.bind(self, count, dtype)`` where it has one, else its ``allreduce``
        itself (no ``avg`` division: :meth:`runner` adds it)."""
        if algorithm.bind is None:
            return functools.partial(algorithm.allreduce, self)
        return algorithm.bind(self, count, dtype)

    def irecv_combine(self, acc, source, out, slot):
        """Start receiving a vector like ``acc`` from ``source``; once the returned handle's
        ``Wait()`` returns, ``out = acc (op) received``. A shared-memory transport reduces each
        piece straight from its slot as it arrives (one pass over the piece: on a GPU, one kernel
        reads the peer's slot); otherwise the message lands in scratch ``slot`` (one per receive
        in flight) and is reduced at ``Wait()``. ``out`` must not overlap what this rank sends
        meanwhile."""
        start = getattr(self.transport, "irecv_combine", None)
        handle = start(acc, source, out, self.combine, slot) if start is not None else None
        if handle is not None:
            return handle
        incoming = self.scratch(acc.dtype, acc.size, slot)
        return _ReducedOnWait(self.irecv(incoming, source), lambda: self.combine(acc, incoming, out))

    def _recv_combine_from_scratch(self, acc, source, out, combine):
        incoming = self.scratch(acc.dtype, acc.size, "combine-in")
        self.recv(incoming, source)
        combine(acc, incoming, out)

    def _combine_from_scratch(self, sendbuf, dest, acc, source, out, combine):
        incoming = self.scratch(acc.dtype, acc.size, "combine-in")
        self.sendrecv(sendbuf, dest, incoming, source)
        combine(acc, incoming, out)

    def scratch(self, dtype, count, slot="scratch"):
        """A reusable workspace vector of ``count`` elements."""
        return WORKSPACE.get(self.xp, dtype, count, slot)

    def start_in(self, sendbuf, recvbuf):
        """Copy the input into the result buffer unless the call is in place."""
        if not same_memory(sendbuf, recvbuf):
            self.copy(recvbuf, sendbuf)

    def finish(self, result):
        """Apply what the op needs after the reduction (``avg``: divide by the rank count)."""
        if self.op == "avg" and self.size > 1:
            self.divide(result, self.size, result)


class _ReducedOnWait:
    """A receive into scratch whose ``Wait()`` then reduces it (:meth:`Collective.irecv_combine`)."""

    __slots__ = ("request", "reduce", "done")

    def __init__(self, request, reduce):
        self.request, self.reduce, self.done = request, reduce, False

    def Wait(self):
        if not self.done:
            self.request.Wait()
            self.reduce()
            self.done = True
