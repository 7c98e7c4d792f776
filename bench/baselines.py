"""What the driver can time: our algorithms and native ``MPI_Allreduce`` (``mpi``).

Each entry is ``make(comm, op, topology) -> run(sendbuf, recvbuf, check=False)``;
in place when ``recvbuf is sendbuf``. Tree algorithms build their tree once,
from ``topology`` (a bandwidth matrix file) when given.
"""

from mpi4py import MPI

import algorithms
from algorithms.plans import tree_for

_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


def needs_topology(name):
    """True for algorithms that cannot run without a bandwidth matrix (bamtree, kmtree)."""
    method = getattr(algorithms.ALGORITHMS.get(name), "tree_method", None)
    return method not in (None, "binomial")


def ours(name):
    def make(comm, op, topology=None):
        method = getattr(algorithms.ALGORITHMS[name], "tree_method", None)
        tree = tree_for(method, comm.size, bandwidth=topology, name=name) if method else None

        def run(sendbuf, recvbuf, check=False):
            algorithms.allreduce(sendbuf, recvbuf, op=op, algorithm=name, comm=comm, check=check,
                                 tree=tree)
        return run
    return make


def native_mpi(comm, op, topology=None):
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
