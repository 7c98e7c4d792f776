"""GPU side of the driver: choosing a device per rank, and the NCCL baseline through CuPy.

Neither imports CuPy unless ``--device gpu`` or ``--algo nccl`` asks for it.
"""

from mpi4py import MPI


class Unavailable(RuntimeError):
    """A GPU feature is missing on some rank; the message says what and where."""


def _agree(comm, problem):
    """Raise :class:`Unavailable` on every rank if any rank has a ``problem``."""
    problems = [p for p in comm.allgather(problem) if p]
    if problems:
        raise Unavailable(problems[0])


def select_device(comm):
    """Use GPU ``local_rank % gpu_count`` on each rank; return (cupy, device id, gpus on this node)."""
    problem, cupy, device, count = None, None, -1, 0
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            raise RuntimeError("no CUDA device")
    except Exception as exc:  # ImportError, CUDA driver errors
        problem = f"--device gpu needs CuPy and a CUDA GPU on rank {comm.Get_rank()}: {exc}"
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    _agree(comm, problem)
    device = local_rank % count
    cupy.cuda.Device(device).use()
    return cupy, device, count if count else local_size


class NcclBaseline:
    """NCCL's own collectives (``cupy.cuda.nccl``), one communicator over every rank.

    Needs one GPU per rank: ranks sharing a GPU cannot form an NCCL communicator.
    """

    def __init__(self, comm, gpus_on_node):
        problem = None
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        sharing = local.Get_size() > gpus_on_node
        local.Free()
        try:
            import cupy
            from cupy.cuda import nccl
        except Exception as exc:
            problem = f"--algo nccl needs CuPy with NCCL: {exc}"
        if problem is None and sharing:
            problem = (f"--algo nccl needs one GPU per rank, but {gpus_on_node} GPU(s) serve more ranks "
                       "on one node")
        _agree(comm, problem)
        uid = nccl.get_unique_id() if comm.Get_rank() == 0 else None
        self.nccl = nccl
        self.cupy = cupy
        self.comm = nccl.NcclCommunicator(comm.Get_size(), comm.bcast(uid), comm.Get_rank())
        self.size = comm.Get_size()

    _OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN", "avg": "NCCL_AVG"}
    _TYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
              "int64": "NCCL_INT64", "uint64": "NCCL_UINT64", "float16": "NCCL_FLOAT16",
              "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}

    def runner(self, collective, op):
        nccl, stream = self.nccl, self.cupy.cuda.get_current_stream()

        def dtype_of(buf):
            name = self._TYPES.get(buf.dtype.name)
            if name is None:
                raise Unavailable(f"NCCL has no {buf.dtype.name}")
            return getattr(nccl, name)

        def run(send, recv, check=False):
            out = recv
            if collective == "allreduce":
                self.comm.allReduce(send.data.ptr, recv.data.ptr, send.size, dtype_of(send),
                                    getattr(nccl, self._OPS[op]), stream.ptr)
            elif collective == "reducescatter":
                per = send.size // self.size
                out = send[:per] if recv is send else recv
                self.comm.reduceScatter(send.data.ptr, out.data.ptr, per, dtype_of(send),
                                        getattr(nccl, self._OPS[op]), stream.ptr)
            else:
                per = recv.size // self.size
                src = recv[self.comm.rank_id() * per:] if recv is send else send
                self.comm.allGather(src.data.ptr, recv.data.ptr, per, dtype_of(recv), stream.ptr)
            stream.synchronize()
            return out
        return run
