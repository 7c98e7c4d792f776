"""The ``mpi4py`` baseline: the MPI library's own collectives (``MPI_Allreduce``,
``MPI_Reduce_scatter_block``, ``MPI_Allgather``) called through mpi4py, once per call from
Python: what a Python program gets from the library, its per-call cost included (a few
microseconds), beside ``mpi`` (:mod:`.mpi`), the same calls timed in a compiled loop.
"""

from .mpi import LibraryBaseline


class Mpi4pyBaseline(LibraryBaseline):
    """``mpi4py``: ``comm.Allreduce`` and the like, each call made from Python."""

    family = "mpi4py"
    how = "called through mpi4py (avg: MPI_SUM, divided by the rank count after every call)"
    help = ("mpi4py (the same MPI calls made through mpi4py, one Python call each, Python's cost of a call "
            "included; avg: MPI_SUM, divided by the rank count after every call)")

    def runner(self, spec, name, comm, op):
        from algorithms.device import settle_for  # once MPI runs (bench.baselines.base)
        from algorithms.runtime.transports.mpi import mpi_is_cuda_aware

        run = spec.run_mpi(comm, op)
        if not mpi_is_cuda_aware():  # host buffers only: nothing queued on a device
            return run

        def settled(send, recv, check=False):
            settle_for(send)  # MPI does not order itself after the device's queued work
            return run(send, recv, check)
        return settled
