"""Point-to-point transport through MPI: direct, or staged through host memory.

Every message travels as raw bytes (``MPI.BYTE``), so any dtype works, float16
included, and the reduction happens in the array module, never inside MPI.

* :class:`DirectTransport` hands the buffers straight to MPI: NumPy arrays, or
  CuPy arrays when the MPI library is CUDA-aware (the stream is synchronized
  first, as in mpi4py's CUDA-aware demo).
* :class:`StagedTransport` copies device buffers into host buffers (pinned
  for CuPy) around every MPI call, for MPI libraries that are not CUDA-aware.

The shared-memory transport for host buffers is in :mod:`.shared_memory`;
:func:`executor.choose_transport` picks one. ``ALLREDUCE_CUDA_AWARE=0|1``
overrides the detection of CUDA-awareness.
"""

import ctypes
import functools
import os

import numpy as np
from mpi4py import MPI

from .arrays import host_buffer, is_device, stream_synchronize

TAG = 7  # every collective runs on a private duplicate communicator, so one tag suffices


@functools.lru_cache(maxsize=None)
def mpi_is_cuda_aware():
    """Whether MPI accepts device pointers, from ``MPIX_Query_cuda_support`` (MPICH, Open MPI)."""
    forced = os.environ.get("ALLREDUCE_CUDA_AWARE")
    if forced is not None:
        return forced.strip().lower() in ("1", "yes", "true", "on")
    libraries = {None}
    with open("/proc/self/maps") as maps:
        libraries.update(line.split()[-1] for line in maps if "libmpi" in line)
    for library in libraries:
        try:
            query = ctypes.CDLL(library).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        return bool(query())
    return False


class DirectTransport:
    """MPI on the buffers themselves (host memory, or device memory with CUDA-aware MPI)."""

    def __init__(self, private, xp, workspace):
        self.comm = private.comm
        self.xp = xp
        self.name = "cuda-aware" if is_device(xp) else "host"
        self._settle = (lambda: stream_synchronize(xp)) if is_device(xp) else (lambda: None)

    def send(self, buf, dest):
        self._settle()
        self.comm.Send([buf, MPI.BYTE], dest, TAG)

    def recv(self, buf, source):
        self._settle()
        self.comm.Recv([buf, MPI.BYTE], source, TAG)

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        self._settle()
        self.comm.Sendrecv([sendbuf, MPI.BYTE], dest, TAG, [recvbuf, MPI.BYTE], source, TAG)

    def isend(self, buf, dest):
        """Start sending ``buf``; the returned request's ``Wait()`` ends it (``buf`` untouched until then)."""
        self._settle()
        return self.comm.Isend([buf, MPI.BYTE], dest, TAG)

    def irecv(self, buf, source):
        """Start receiving into ``buf``; it holds the message once the request's ``Wait()`` returns."""
        self._settle()
        return self.comm.Irecv([buf, MPI.BYTE], source, TAG)


class StagedTransport:
    """Each message is copied through a host buffer: device -> host, MPI, host -> device."""

    name = "staged"

    def __init__(self, private, xp, workspace):
        self.comm = private.comm
        self.xp = xp
        self.workspace = workspace
        self._spare = []  # host buffers of finished nonblocking messages, reused by the next ones

    def _host(self, nbytes, slot):
        return self.workspace.host(self.xp, nbytes, slot)

    def _to_host(self, buf, slot):
        host = self._host(buf.nbytes, slot)
        self._copy_out(buf, host)
        return host

    def _to_device(self, host, buf):
        raw = buf.view(self.xp.uint8)
        if is_device(self.xp):
            raw.set(host)
            stream_synchronize(self.xp)  # the host buffer is reused by the next message
        else:
            np.copyto(raw, host)

    def send(self, buf, dest):
        self.comm.Send(self._to_host(buf, "send"), dest, TAG)

    def recv(self, buf, source):
        host = self._host(buf.nbytes, "recv")
        self.comm.Recv(host, source, TAG)
        self._to_device(host, buf)

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        outgoing = self._to_host(sendbuf, "send")
        incoming = self._host(recvbuf.nbytes, "recv")
        self.comm.Sendrecv(outgoing, dest, TAG, incoming, source, TAG)
        self._to_device(incoming, recvbuf)

    def _lend(self, nbytes):
        """A host buffer of at least ``nbytes`` for one nonblocking message (reused once it ends)."""
        host = self._spare.pop() if self._spare else None
        if host is None or host.size < nbytes:
            host = host_buffer(self.xp, nbytes)
        return host

    def isend(self, buf, dest):
        """Copy ``buf`` to a host buffer of its own and start sending that; ``Wait()`` ends it."""
        host = self._lend(buf.nbytes)
        self._copy_out(buf, host)
        return _Staged(self.comm.Isend(host[:buf.nbytes], dest, TAG), host, self._spare)

    def irecv(self, buf, source):
        """Receive into a host buffer of its own; ``Wait()`` copies it into ``buf``."""
        host = self._lend(buf.nbytes)
        request = self.comm.Irecv(host[:buf.nbytes], source, TAG)
        return _Staged(request, host, self._spare, lambda: self._to_device(host[:buf.nbytes], buf))

    def _copy_out(self, buf, host):
        raw = buf.view(self.xp.uint8)
        if is_device(self.xp):
            raw.get(out=host[:buf.nbytes])
        else:
            np.copyto(host[:buf.nbytes], raw)


class _Staged:
    """A staged nonblocking message: waits for MPI, runs ``then`` (the copy to the device for
    a receive), then returns its host buffer to the spares."""

    __slots__ = ("request", "host", "spare", "then", "done")

    def __init__(self, request, host, spare, then=None):
        self.request, self.host, self.spare, self.then, self.done = request, host, spare, then, False

    def Wait(self):
        if not self.done:
            self.request.Wait()
            self._finish()

    def Test(self):
        """True once the message is complete (and, for a receive, copied into its buffer)."""
        if not self.done and self.request.Test():
            self._finish()
        return self.done

    def _finish(self):
        self.done = True
        if self.then is not None:
            self.then()
        self.spare.append(self.host)
