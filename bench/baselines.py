"""What the driver can time: our algorithms and native ``MPI_Allreduce`` (``mpi``).

Each entry is ``make(comm, op) -> run(sendbuf, recvbuf)``; in place when
``recvbuf is sendbuf``.
"""

import algorithms
from mpi4py import MPI

_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


def ours(name):
    def make(comm, op):
        def run(sendbuf, recvbuf, check=False):
            algorithms.allreduce(sendbuf, recvbuf, op=op, algorithm=name, comm=comm, check=check)
        return run
    return make


def native_mpi(comm, op):
    """The MPI library's own MPI_Allreduce; avg is SUM then a division, as in our algorithms."""
    mpi_op = _MPI_OPS[op]

    def run(sendbuf, recvbuf, check=False):
        if recvbuf is sendbuf:
            comm.Allreduce(MPI.IN_PLACE, recvbuf, op=mpi_op)
        else:
            comm.Allreduce(sendbuf, recvbuf, op=mpi_op)
        if op == "avg" and comm.size > 1:
            recvbuf /= comm.size
    return run


RUNNERS = {name: ours(name) for name in algorithms.ALGORITHMS}
RUNNERS["mpi"] = native_mpi
