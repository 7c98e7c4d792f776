"""The machinery every algorithm shares: private communicator, workspace, transport, reduction.

An algorithm is a function ``run(coll, sendbuf, recvbuf)`` that leaves the
reduced vector in ``recvbuf`` (``recvbuf is sendbuf`` when in place); it talks
only through ``coll.send``/``recv``/``sendrecv``/``isend``/``irecv`` and reduces only
through ``coll.combine``, so it works unchanged on NumPy and CuPy buffers.
"""

from mpi4py import MPI

from .arrays import host_buffer, same_memory
from .ops import combiner
from .transport import choose_transport


class Workspace:
    """Scratch buffers reused across calls, one per (module, dtype, slot), grown on demand.

    Repeated calls of the same size allocate nothing after the first.
    """

    def __init__(self):
        self._buffers = {}

    def get(self, xp, dtype, count, slot):
        key = (xp.__name__, dtype, slot)
        buf = self._buffers.get(key)
        if buf is None or buf.size < count:
            buf = self._buffers[key] = xp.empty(count, dtype)
        return buf[:count]

    def host(self, xp, nbytes, slot):
        """A host byte buffer for staging (page-locked when ``xp`` is CuPy)."""
        key = ("host", xp.__name__, slot)
        buf = self._buffers.get(key)
        if buf is None or buf.size < nbytes:
            buf = self._buffers[key] = host_buffer(xp, nbytes)
        return buf[:nbytes]

    def clear(self):
        self._buffers.clear()


WORKSPACE = Workspace()

_PRIVATE_KEYVAL = None


class Private:
    """The private duplicate of a user's communicator, and the :class:`Collective` contexts
    built on it (one per array module and op), reused by every later call."""

    __slots__ = ("comm", "contexts")

    def __init__(self, comm):
        self.comm = comm
        self.contexts = {}

    def collective(self, xp, op):
        """The context for module ``xp`` and ``op``; its transport is chosen (and the
        ``ALLREDUCE_TRANSPORT`` variable read) when it is first needed on this communicator."""
        key = (xp.__name__, op)
        context = self.contexts.get(key)
        if context is None:
            context = self.contexts[key] = Collective(self.comm, xp, op, choose_transport(xp))
        return context


def _free_private(comm, keyval, private):
    if not MPI.Is_finalized():
        private.comm.Free()


def private_comm(comm):
    """A :class:`Private` holding a duplicate of ``comm``, cached on ``comm`` as an attribute,
    so our messages never match the caller's. Collective on the first call for each communicator."""
    global _PRIVATE_KEYVAL
    if _PRIVATE_KEYVAL is None:
        _PRIVATE_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_free_private)
    private = comm.Get_attr(_PRIVATE_KEYVAL)
    if private is None:
        private = Private(comm.Dup())
        comm.Set_attr(_PRIVATE_KEYVAL, private)
    return private


class Collective:
    """Context of a collective: who we are, how to move bytes, how to reduce. Holds no
    per-call state, so one context serves every call with the same module and op."""

    def __init__(self, comm, xp, op, transport):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.xp = xp
        self.op = op
        self._ufunc = combiner(xp, op) if op is not None else None
        self.transport = transport(comm, xp, WORKSPACE)
        self.send = self.transport.send
        self.recv = self.transport.recv
        self.sendrecv = self.transport.sendrecv
        self.isend = self.transport.isend
        self.irecv = self.transport.irecv

    def scratch(self, dtype, count, slot="scratch"):
        """A reusable workspace vector of ``count`` elements."""
        return WORKSPACE.get(self.xp, dtype, count, slot)

    def combine(self, acc, incoming, out=None):
        """``out = acc (op) incoming`` element-wise; ``out`` defaults to ``acc``."""
        self._ufunc(acc, incoming, out=acc if out is None else out)

    def start_in(self, sendbuf, recvbuf):
        """Copy the input into the result buffer unless the call is in place."""
        if not same_memory(sendbuf, recvbuf):
            self.xp.copyto(recvbuf, sendbuf)

    def finish(self, result):
        """Apply what the op needs after the reduction (``avg``: divide by the rank count)."""
        if self.op == "avg" and self.size > 1:
            self.xp.divide(result, self.size, out=result)
