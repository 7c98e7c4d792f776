"""``algorithm="native"``: the MPI library's own ``MPI_Allreduce``, called through our entry point.

The baseline that auto (:mod:`.auto`) weighs our algorithms against: its time includes what
our call costs before any message moves (checks, dispatch), as auto's choice of it would.
Runs on the private duplicate of the caller's communicator; ``avg`` is a sum that the caller
divides. Device buffers go to a CUDA-aware MPI as they are (the stream synchronized first), and
to any other MPI through host copies.
"""

import functools

import numpy as np
from mpi4py import MPI

from ..algorithm import Algorithm
from ..device import steps
from ..dtypes import LOW_PRECISION
from ..runtime.transports.mpi import mpi_is_cuda_aware

#: our op -> MPI's (MPI has no average: avg is a sum the caller divides); the suite's one map of them
MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


def no_mpi_type(dtype):
    """Why MPI cannot reduce ``dtype`` (text), else None: MPI 4.1 names no fp8 type, and MPICH
    defines ``MPI_BFLOAT16_T`` as ``MPI_DATATYPE_NULL`` (mpi4py's ``MPI.BFLOAT16_T`` says which)."""
    if dtype not in LOW_PRECISION:
        return None
    if dtype.name == "bfloat16" and MPI.BFLOAT16_T != MPI.DATATYPE_NULL:
        return "mpi4py passes no bfloat16 buffer to MPI_BFLOAT16_T"
    if dtype.name == "bfloat16":
        return "this MPI library has no bfloat16 (its MPI_BFLOAT16_T is MPI_DATATYPE_NULL)"
    return f"MPI has no {dtype.name} type"


def _refuse(dtype):
    problem = no_mpi_type(dtype)
    if problem is not None:
        raise TypeError(f"algorithm 'native' (MPI_Allreduce): {problem}")


def allreduce(coll, sendbuf, recvbuf):
    _refuse(sendbuf.dtype)
    op = MPI_OPS[coll.op]
    if coll.xp is np:
        coll.comm.Allreduce(MPI.IN_PLACE if recvbuf is sendbuf else sendbuf, recvbuf, op=op)
        return
    steps(coll.xp).settle()  # MPI does not order itself after our kernels
    if mpi_is_cuda_aware():
        coll.comm.Allreduce(MPI.IN_PLACE if recvbuf is sendbuf else sendbuf, recvbuf, op=op)
        return
    host = coll.xp.asnumpy(sendbuf)
    coll.comm.Allreduce(MPI.IN_PLACE, host, op=op)
    recvbuf.set(host)


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)``: ``MPI_Allreduce`` itself on host vectors, else :func:`allreduce`."""
    if coll.xp is not np:
        return functools.partial(allreduce, coll)
    _refuse(np.dtype(dtype))
    mpi_allreduce, op, in_place = coll.comm.Allreduce, MPI_OPS[coll.op], MPI.IN_PLACE

    def run(sendbuf, recvbuf):
        mpi_allreduce(in_place if recvbuf is sendbuf else sendbuf, recvbuf, op)
    return run


def describe(private, transport):
    """What carries it: the library's own collective, not our transport."""
    return "the MPI library's own collective, called through our entry point"


# MPI's own, through our entry point: run by name only (the mpi baseline is the comparison)
ALGORITHM = Algorithm("native", allreduce, bind=bind, lacks=no_mpi_type, describe=describe, in_all=False,
                      received=None)
