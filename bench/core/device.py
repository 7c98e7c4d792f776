"""The device of each rank: a GPU for ``--device gpu`` (CuPy imported only then), else host memory.

NCCL, the GPU baseline, is :mod:`bench.baselines.nccl`.
"""

from plumbing.ending import raise_together
from topology.machine import node_comm


class Unavailable(RuntimeError):
    """A GPU feature is missing on some rank; the message says what and where."""


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
    local = node_comm(comm)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    raise_together(comm, problem, Unavailable)
    device = local_rank % count
    cupy.cuda.Device(device).use()
    return cupy, device, count if count else local_size
