"""What the driver measures, one small spec per collective (as nccl-tests has one file each).

A spec says how a size in bytes becomes element counts, the bus-bandwidth
factor (nccl-tests' PERFORMANCE.md), how to fill inputs whose exact result is
known, where a result lands, and how each algorithm runs it in and out of place
(the MPI library's own call: through mpi4py, ``run_mpi``; from C, its count and
result, ``mpi_count`` and ``mpi_result``).
"""

import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.catalog.native import MPI_OPS

from .check import check_expected, check_fill



class _Spec:
    @staticmethod
    def in_place_buffer(xp, send, recv, rank, n):
        """The buffer an in-place call works on: by default the input itself."""
        return send

    @staticmethod
    def result(send, recv, n):
        """Where an MPI call's result lands: by default the output (in place, the one buffer)."""
        return recv

    @classmethod
    def mpi_result(cls, send, recv, op, n):
        """An MPI call's result, ``avg`` (a sum: MPI has no average) divided by the rank count."""
        return _average(cls.result(send, recv, n), op, n)


class AllReduce(_Spec):
    name = "allreduce"
    has_op = True
    ours = tuple(algorithms.ALGORITHMS)
    half = "allreduce"

    @staticmethod
    def factor(n):
        return 2.0 * (n - 1) / n if n > 1 else 0.0

    @staticmethod
    def counts(nbytes, itemsize, n):
        """(elements in the whole vector, the count column nccl-tests prints): the size rounded
        down to whole elements, as nccl-tests rounds it."""
        total = nbytes // itemsize
        return total, total

    @staticmethod
    def inputs(xp, dtype, op, total, rank, n):
        send = xp.asarray(check_fill(dtype, op, total, rank, n))
        return send, xp.empty_like(send)

    @staticmethod
    def expected(dtype, op, total, rank, n):
        return check_expected(dtype, op, total, n)

    @staticmethod
    def run_ours(name, comm, op, tree=None, bandwidth=None):
        def run(send, recv, check=False):
            return algorithms.allreduce(send, recv, op=op, algorithm=name, comm=comm, check=check, tree=tree,
                                        bandwidth=bandwidth)
        return run

    @staticmethod
    def mpi_count(send, recv, n):
        """MPI's count argument: the whole vector."""
        return send.size

    @classmethod
    def run_mpi(cls, comm, op):
        mpi_op = MPI_OPS[op]

        def run(send, recv, check=False):
            comm.Allreduce(MPI.IN_PLACE if recv is send else send, recv, op=mpi_op)
            return cls.mpi_result(send, recv, op, comm.size)
        return run


class ReduceScatter(_Spec):
    name = "reducescatter"
    has_op = True
    ours = tuple(name for name, algorithm in algorithms.ALGORITHMS.items() if algorithm.reduce_scatter)
    half = "reduce_scatter"

    @staticmethod
    def factor(n):
        return (n - 1) / n if n > 1 else 0.0

    @staticmethod
    def counts(nbytes, itemsize, n):
        """(elements in the whole vector, one rank's chunk), as nccl-tests takes a size for this
        collective and the all-gather (``base = (count/nranks) & -(16/eltSize)``, its
        src/reduce_scatter.cu): each rank's chunk rounded down to whole elements and to a
        multiple of 16 bytes, so that the vector moved, the size printed, may be smaller than
        the size asked for, or 0."""
        per = nbytes // itemsize // n
        per -= per % max(1, 16 // itemsize)
        return per * n, per

    @staticmethod
    def inputs(xp, dtype, op, total, rank, n):
        send = xp.asarray(check_fill(dtype, op, total, rank, n))
        return send, xp.empty(total // n, dtype=send.dtype)

    @staticmethod
    def expected(dtype, op, total, rank, n):
        per = total // n
        return check_expected(dtype, op, total, n)[rank * per:(rank + 1) * per]

    @staticmethod
    def run_ours(name, comm, op, tree=None, bandwidth=None):
        def run(send, recv, check=False):
            return algorithms.reduce_scatter(send, None if recv is send else recv, op=op, algorithm=name, comm=comm,
                                             check=check, bandwidth=bandwidth)
        return run

    @staticmethod
    def result(send, recv, n):
        """MPI's in-place result is the first chunk of the buffer."""
        return send[:send.size // n] if recv is send else recv

    @staticmethod
    def mpi_count(send, recv, n):
        """MPI's count argument: one rank's chunk."""
        return send.size // n

    @classmethod
    def run_mpi(cls, comm, op):
        mpi_op = MPI_OPS[op]

        def run(send, recv, check=False):
            comm.Reduce_scatter_block(MPI.IN_PLACE if recv is send else send, recv, op=mpi_op)
            return cls.mpi_result(send, recv, op, comm.size)
        return run


class AllGather(_Spec):
    name = "allgather"
    has_op = False
    ours = tuple(name for name, algorithm in algorithms.ALGORITHMS.items() if algorithm.all_gather)
    half = "all_gather"
    factor = ReduceScatter.factor  # (n-1)/n of the whole vector, as reduce-scatter
    counts = ReduceScatter.counts

    @staticmethod
    def _whole(dtype, total):
        return ((np.arange(total) * 3 + 1) % 11).astype(dtype)

    @classmethod
    def inputs(cls, xp, dtype, op, total, rank, n):
        per = total // n
        return xp.asarray(cls._whole(dtype, total)[rank * per:(rank + 1) * per]), xp.empty(total, dtype=dtype)

    @staticmethod
    def in_place_buffer(xp, send, recv, rank, n):
        """In place, rank r's chunk already sits at its place in the whole vector."""
        per = send.size
        recv[rank * per:(rank + 1) * per] = send
        return recv

    @classmethod
    def expected(cls, dtype, op, total, rank, n):
        return cls._whole(dtype, total)

    @staticmethod
    def run_ours(name, comm, op, tree=None, bandwidth=None):
        def run(send, recv, check=False):
            return algorithms.all_gather(send, None if recv is send else recv, algorithm=name, comm=comm, check=check,
                                         bandwidth=bandwidth)
        return run

    @staticmethod
    def mpi_count(send, recv, n):
        """MPI's count argument: one rank's chunk."""
        return recv.size // n

    @staticmethod
    def run_mpi(comm, op):
        def run(send, recv, check=False):
            comm.Allgather(MPI.IN_PLACE if recv is send else send, recv)
            return recv
        return run


COLLECTIVES = {spec.name: spec for spec in (AllReduce, ReduceScatter, AllGather)}


def _average(result, op, size):
    if op == "avg" and size > 1:
        result /= size
    return result
