"""Point-to-point transport for the collectives: direct or staged through host memory.

Every message travels as raw bytes (``MPI.BYTE``), so any dtype works, float16
included, and the reduction happens in the array module, never inside MPI.

* :class:`DirectTransport` hands the buffers straight to MPI: NumPy arrays, or
  CuPy arrays when the MPI library is CUDA-aware (the stream is synchronized
  first, as in mpi4py's CUDA-aware demo).
* :class:`StagedTransport` copies device buffers into host buffers (pinned
  for CuPy) around every MPI call, for MPI libraries that are not CUDA-aware.

``ALLREDUCE_TRANSPORT=direct|staged`` overrides the choice, and
``ALLREDUCE_CUDA_AWARE=0|1`` overrides the detection of CUDA-awareness.
"""

import ctypes
import functools
import os

import numpy as np
from mpi4py import MPI

from .arrays import is_device, stream_synchronize

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


def _bytes(buf):
    return [buf, MPI.BYTE]


class DirectTransport:
    """MPI on the buffers themselves (host memory, or device memory with CUDA-aware MPI)."""

    def __init__(self, comm, xp, workspace):
        self.comm = comm
        self.xp = xp
        self.name = "cuda-aware" if is_device(xp) else "host"

    def send(self, buf, dest):
        stream_synchronize(self.xp)
        self.comm.Send(_bytes(buf), dest, TAG)

    def recv(self, buf, source):
        stream_synchronize(self.xp)
        self.comm.Recv(_bytes(buf), source, TAG)

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        stream_synchronize(self.xp)
        self.comm.Sendrecv(_bytes(sendbuf), dest, TAG, _bytes(recvbuf), source, TAG)


class StagedTransport:
    """Each message is copied through a host buffer: device -> host, MPI, host -> device."""

    name = "staged"

    def __init__(self, comm, xp, workspace):
        self.comm = comm
        self.xp = xp
        self.workspace = workspace

    def _host(self, nbytes, slot):
        return self.workspace.host(self.xp, nbytes, slot)

    def _to_host(self, buf, slot):
        host = self._host(buf.nbytes, slot)
        raw = buf.view(self.xp.uint8)
        if is_device(self.xp):
            raw.get(out=host)
        else:
            np.copyto(host, raw)
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


TRANSPORTS = {"direct": DirectTransport, "staged": StagedTransport}


def choose_transport(xp):
    """The transport class for buffers of module ``xp`` (see the module docstring)."""
    forced = os.environ.get("ALLREDUCE_TRANSPORT", "auto").strip().lower()
    if forced in TRANSPORTS:
        return TRANSPORTS[forced]
    if forced != "auto":
        raise ValueError(
            f"ALLREDUCE_TRANSPORT={forced!r} is not one of auto, {', '.join(TRANSPORTS)}"
        )
    if is_device(xp) and not mpi_is_cuda_aware():
        return StagedTransport
    return DirectTransport
