"""The ``mpi`` baseline's timed loop: ``bench/probes/mpi_loop.c``, built and loaded by
:mod:`.compiled`, called through ctypes with mpi4py's Fortran handles of the communicator,
datatype and op (``py2f()``), so that it runs on MPICH and Open MPI alike.

A runner's ``loop(send, recv, iters, agg, blocking, per_iteration) -> (seconds, host seconds)``
runs the calls back to back in C (:func:`bench.core.timing.time_calls` times through it); the
runner itself is one call of that loop, so the ``#wrong`` check checks what was timed. ``avg``:
MPI has no average, so the loop times ``MPI_SUM`` calls and divides the result by the rank
count once after them, outside the time.
"""

import ctypes
import os

from topology.mpicc import load

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "probes", "mpi_loop.c")
#: the collectives of mpi_loop.c, by the sweep's names
KINDS = {"allreduce": 0, "reducescatter": 1, "allgather": 2}
_INT = ctypes.c_int  # MPI_Fint: a C int in MPICH and Open MPI
_ARGUMENTS = [_INT, _INT, _INT, _INT, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, _INT, _INT, _INT, _INT,
              ctypes.c_void_p, ctypes.c_void_p]


def address(array):
    """Where a contiguous NumPy array's data starts, or a device array's (for a CUDA-aware MPI)."""
    if not array.flags.c_contiguous:
        raise ValueError("the compiled loop takes contiguous arrays")
    interface = getattr(array, "__cuda_array_interface__", None) or array.__array_interface__
    return interface["data"][0]


class CompiledLoop:
    """``mpi_loop`` of the library built from :data:`SOURCE`."""

    def __init__(self, library):
        self.function = library.mpi_loop
        self.function.restype, self.function.argtypes = _INT, _ARGUMENTS
        self.seconds = (ctypes.c_double * 2)()

    @classmethod
    def start(cls, comm):
        """``(CompiledLoop, None)``, or ``(None, why not)`` alike on every rank (collective)."""
        library, problem = load(comm, SOURCE)
        return (cls(library), None) if library is not None else (None, problem)

    def runner(self, spec, comm, op):
        """``run(send, recv, check=False) -> result`` of collective ``spec`` with ``op``: one call
        in C; ``run.loop`` the timed loop."""
        from mpi4py import MPI  # once MPI runs (bench.baselines.base)

        from algorithms.device import settle_for
        from algorithms.catalog.native import MPI_OPS

        kind, size, function, seconds = KINDS[spec.name], comm.Get_size(), self.function, self.seconds
        comm_handle, op_handle = comm.py2f(), MPI_OPS.get(op, MPI.OP_NULL).py2f()

        def loop(send, recv, iters, agg=1, blocking=False, per_iteration=None):
            times = None
            if per_iteration is not None:
                if per_iteration.dtype.name != "float64" or per_iteration.size < iters:
                    raise ValueError(f"per_iteration must hold {iters} float64 values")
                times = address(per_iteration)
            settle_for(send)  # device memory: MPI does not order itself after the device's queued work
            error = function(kind, comm_handle, MPI._typedict[recv.dtype.char].py2f(), op_handle, address(send),
                             address(recv), spec.mpi_count(send, recv, size), recv is send, iters, agg,
                             bool(blocking), times, seconds)
            if error:
                raise RuntimeError(f"{spec.name} in the compiled loop: {MPI.Get_error_string(error)}")
            spec.mpi_result(send, recv, op, size)  # avg: divided once, after the calls
            return seconds[0], seconds[1]

        def run(send, recv, check=False):
            loop(send, recv, 1)
            return spec.result(send, recv, size)
        run.loop = loop
        return run
