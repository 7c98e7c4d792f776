"""Point-to-point transport through MPI: direct, or staged through host memory.

Every message travels as raw bytes (``MPI.BYTE``), so any dtype works, float16
included, and the reduction happens in the array module, never inside MPI.

* :class:`DirectTransport` hands the buffers straight to MPI: NumPy arrays, or
  CuPy arrays when the MPI library is CUDA-aware (the current stream is settled
  first: MPI does not order itself after our kernels).
* :class:`StagedTransport` copies device buffers into pinned host buffers around
  every MPI call, for MPI libraries that are not CUDA-aware. The copies follow the
  stream discipline of :mod:`algorithms.device`, which says once what waits for what.

The shared-memory transport for host buffers is in :mod:`.shared_memory`;
:func:`algorithms.runtime.transports.build_transport` picks one. ``ALLREDUCE_CUDA_AWARE=0|1``
overrides the detection of CUDA-awareness.
"""

import ctypes
import functools

import numpy as np
from mpi4py import MPI

from ...arrays import is_device
from ...device import steps
from ...settings import setting, size_text

TAG = 7  # every collective runs on a private duplicate communicator, so one tag suffices


@functools.lru_cache(maxsize=None)
def mpi_is_cuda_aware():
    """Whether MPI accepts device pointers, from ``MPIX_Query_cuda_support`` (MPICH, Open MPI)."""
    forced = setting("ALLREDUCE_CUDA_AWARE")
    if forced != "detect":
        return forced == "1"
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
    """MPI on the buffers themselves (host memory, or device memory with CUDA-aware MPI: the
    current stream settled first, and the vector handed over as bytes, whatever its dtype)."""

    def __init__(self, private, xp, workspace):
        self.comm = private.comm
        self.xp = xp
        if is_device(xp):
            settle = steps(xp).settle

            def ready(buf):
                settle()
                return [buf.view(np.uint8), MPI.BYTE]
        else:
            def ready(buf):
                return [buf, MPI.BYTE]
        self._ready = ready

    note = None  # why this transport was chosen over CUDA IPC, when it was a fallback

    def describe(self):
        return ("CUDA-aware MPI" if is_device(self.xp) else "MPI") + (f"; {self.note}" if self.note else "")

    def send(self, buf, dest):
        self.comm.Send(self._ready(buf), dest, TAG)

    def recv(self, buf, source):
        self.comm.Recv(self._ready(buf), source, TAG)

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        self.comm.Sendrecv(self._ready(sendbuf), dest, TAG, self._ready(recvbuf), source, TAG)

    def isend(self, buf, dest):
        """Start sending ``buf``; the returned request's ``Wait()`` ends it (``buf`` untouched until then)."""
        return self.comm.Isend(self._ready(buf), dest, TAG)

    def irecv(self, buf, source):
        """Start receiving into ``buf``; it holds the message once the request's ``Wait()`` returns."""
        return self.comm.Irecv(self._ready(buf), source, TAG)


class StagedTransport:
    """Each message is copied through pinned host memory: device -> host, MPI, host -> device.

    A message over ``ALLREDUCE_STAGE_BYTES`` (default 1 MiB) in a blocking call moves in
    chunks of that size through two host buffers each way, so that the copy of chunk k+1
    to the host, the transfer of chunk k and the copy of chunk k-1 to the device overlap
    (the copies run on side streams: :mod:`algorithms.device`). Sender and receiver cut a
    message alike, since a receive has the size of its send, and so do the nonblocking calls
    (one host buffer, a request per chunk): any send matches any receive of its size.

    A receive returns once its copy into device memory is queued, ahead of the kernels queued
    after it; the host waits for that copy only when it reuses the host buffer (``_reading``)."""

    note = None

    def __init__(self, private, xp, workspace):
        self.comm = private.comm
        self.xp = xp
        self.workspace = workspace
        self.steps = steps(xp)
        self._spare = []  # (host buffer, the copy in that may still read it) of finished nonblocking messages
        self._reading = {}  # workspace slot -> the copy into device memory that may still read it
        self.chunk_bytes = setting("ALLREDUCE_STAGE_BYTES")

    def describe(self):
        return ("MPI, staged through " + ("pinned host memory" if is_device(self.xp) else "host copies")
                + f" in {size_text(self.chunk_bytes)} chunks" + (f"; {self.note}" if self.note else ""))

    def _host(self, nbytes, slot):
        """Workspace host buffer ``slot``, once no copy into device memory still reads it."""
        self.steps.wait(self._reading.pop(slot, None))
        return self.workspace.host(self.xp, nbytes, slot)

    def _to_host(self, buf, slot):
        """``buf``'s bytes in host buffer ``slot``, there on return (MPI reads them next)."""
        host = self._host(buf.nbytes, slot)
        self._copy_out(buf, host)
        return host

    def _copy_out(self, buf, host):
        """``buf``'s bytes into ``host``, after the kernels queued before, there on return."""
        self.steps.wait(self.steps.copy_out(buf.view(self.xp.uint8), host))

    def _to_device(self, host, buf, slot):
        """``host``'s bytes into ``buf``, ahead of the kernels queued after this."""
        self._reading[slot] = self.steps.copy_in(host, buf.view(self.xp.uint8))

    def send(self, buf, dest):
        if buf.nbytes > self.chunk_bytes:
            self._pipeline(buf, dest, None, None)
        else:
            self.comm.Send(self._to_host(buf, "send"), dest, TAG)

    def recv(self, buf, source):
        if buf.nbytes > self.chunk_bytes:
            self._pipeline(None, None, buf, source)
            return
        host = self._host(buf.nbytes, "recv")
        self.comm.Recv(host, source, TAG)
        self._to_device(host, buf, "recv")

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        if sendbuf.nbytes > self.chunk_bytes or recvbuf.nbytes > self.chunk_bytes:
            self._pipeline(sendbuf, dest, recvbuf, source)
            return
        outgoing = self._to_host(sendbuf, "send")
        incoming = self._host(recvbuf.nbytes, "recv")
        self.comm.Sendrecv(outgoing, dest, TAG, incoming, source, TAG)
        self._to_device(incoming, recvbuf, "recv")

    def _cuts(self, buf):
        if buf is None:
            return ()
        n, step = buf.nbytes, self.chunk_bytes
        return tuple((lo, min(n, lo + step)) for lo in range(0, n, step)) if n > step else ((0, n),)

    def _pipeline(self, sendbuf, dest, recvbuf, source):
        """Send ``sendbuf`` and/or receive ``recvbuf`` chunk by chunk, double-buffered."""
        sends, recvs = self._cuts(sendbuf), self._cuts(recvbuf)
        out = sendbuf.view(self.xp.uint8) if sends else None
        into = recvbuf.view(self.xp.uint8) if recvs else None
        copies, chunk = self.steps, self.chunk_bytes
        send_host = [self._host(chunk, f"pipe-send-{b}") for b in (0, 1)] if sends else None
        recv_host = [self._host(chunk, f"pipe-recv-{b}") for b in (0, 1)] if recvs else None
        sending, receiving, to_device = [None, None], [None, None], [None, None]
        for k in range(min(2, len(recvs))):
            lo, hi = recvs[k]
            receiving[k] = self.comm.Irecv(recv_host[k][:hi - lo], source, TAG)
        if sends:
            to_host = copies.copy_out(out[sends[0][0]:sends[0][1]], send_host[0])
        for k in range(max(len(sends), len(recvs))):
            b = k % 2
            if k < len(sends):
                lo, hi = sends[k]
                copies.wait(to_host)
                sending[b] = self.comm.Isend(send_host[b][:hi - lo], dest, TAG)
                if k + 1 < len(sends):
                    if sending[1 - b] is not None:
                        sending[1 - b].Wait()  # chunk k-1 is out: its host buffer is free
                    lo, hi = sends[k + 1]
                    to_host = copies.copy_out(out[lo:hi], send_host[1 - b])
            if k < len(recvs):
                if k >= 1 and k + 1 < len(recvs):
                    copies.wait(to_device[1 - b])  # chunk k-1 is on the device: reuse its buffer
                    lo, hi = recvs[k + 1]
                    receiving[1 - b] = self.comm.Irecv(recv_host[1 - b][:hi - lo], source, TAG)
                receiving[b].Wait()
                lo, hi = recvs[k]
                to_device[b] = copies.copy_in(recv_host[b][:hi - lo], into[lo:hi])
        MPI.Request.Waitall([r for r in sending if r is not None])
        for b, event in enumerate(to_device):
            if event is not None:
                self._reading[f"pipe-recv-{b}"] = event

    def _lend(self, nbytes):
        """A host buffer of at least ``nbytes`` for one nonblocking message (reused once it ends
        and no copy reads it)."""
        host, reading = self._spare.pop() if self._spare else (None, None)
        self.steps.wait(reading)
        if host is None or host.size < nbytes:
            host = self.steps.pinned(nbytes)
        return host

    def isend(self, buf, dest):
        """Copy ``buf`` to a host buffer of its own and start sending that; ``Wait()`` ends it."""
        host = self._lend(buf.nbytes)
        self._copy_out(buf, host)
        return _Staged([self.comm.Isend(host[lo:hi], dest, TAG) for lo, hi in self._cuts(buf)], host, self._spare)

    def irecv(self, buf, source):
        """Receive into a host buffer of its own; ``Wait()`` queues its copy into ``buf``, ahead of
        the kernels queued after it."""
        host = self._lend(buf.nbytes)
        requests = [self.comm.Irecv(host[lo:hi], source, TAG) for lo, hi in self._cuts(buf)]
        return _Staged(requests, host, self._spare, lambda: self.steps.copy_in(host, buf.view(self.xp.uint8)))


class _Staged:
    """A staged nonblocking message: waits for MPI (its chunks' ``requests``), runs ``then`` (the
    copy to the device for a receive, which returns what reads the host buffer still), then
    returns its host buffer to the spares."""

    __slots__ = ("requests", "host", "spare", "then", "done")

    def __init__(self, requests, host, spare, then=None):
        self.requests, self.host, self.spare, self.then, self.done = requests, host, spare, then, False

    def Wait(self):
        if not self.done:
            MPI.Request.Waitall(self.requests)
            self._finish()

    def Test(self):
        """True once the message is complete (and, for a receive, copied into its buffer)."""
        if not self.done and MPI.Request.Testall(self.requests):
            self._finish()
        return self.done

    def _finish(self):
        self.done = True
        self.spare.append((self.host, self.then() if self.then is not None else None))
