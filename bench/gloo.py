"""The gloo baseline: PyTorch's ``torch.distributed.all_reduce`` on CPU tensors over the gloo
backend, what CPU users of ``torch.distributed`` get. Optional: it needs torch
(``pip install -e '.[gloo]'``), imported only for ``--algo gloo``.

One process group over every rank, its rendezvous on a free port of rank 0 at rank 0's
address (``MASTER_ADDR`` when set, else its host name resolved), sent to every rank over MPI.
A call wraps the NumPy vector as a tensor without copying it (``torch.from_numpy``) and
reduces it in place: gloo's all-reduce has no output buffer, so out of place the input is
first copied into the output, as a user of torch.distributed does. ``avg`` is a sum divided
by the rank count (gloo has no average).
"""

import datetime
import os
import socket

import numpy as np

#: NumPy dtypes gloo's all-reduce takes on CPU tensors.
DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64")
_OPS = {"sum": "SUM", "avg": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN"}


class Unavailable(RuntimeError):
    """gloo cannot run on some rank; the message says why."""


def problem():
    """Why gloo cannot run in this process (None when it can)."""
    try:
        import torch.distributed as dist
    except Exception as exc:  # ImportError, or a broken install
        return f"--algo gloo needs PyTorch (pip install -e '.[gloo]'): {type(exc).__name__}: {exc}"
    if not (dist.is_available() and dist.is_gloo_available()):
        return "--algo gloo needs a PyTorch build with torch.distributed and its gloo backend"
    return None


class GlooBaseline:
    """A gloo process group over every rank of ``comm`` (collective: every rank builds it)."""

    def __init__(self, comm, timeout_s=120):
        problems = [p for p in comm.allgather(problem()) if p]
        if problems:
            raise Unavailable(problems[0])
        import torch
        import torch.distributed as dist

        address = None
        if comm.Get_rank() == 0:
            host = os.environ.get("MASTER_ADDR") or socket.gethostname()
            try:
                host = socket.gethostbyname(host)
            except OSError:
                host = "127.0.0.1"
            with socket.socket() as s:
                s.bind(("", 0))
                address = (host, s.getsockname()[1])
        host, port = comm.bcast(address, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=comm.Get_rank(),
                                world_size=comm.Get_size(), timeout=datetime.timedelta(seconds=timeout_s))
        self.torch, self.dist, self.size = torch, dist, comm.Get_size()
        self.description = f"PyTorch {torch.__version__} torch.distributed, gloo backend (TCP)"

    def runner(self, collective, op):
        """``run(send, recv, check=False) -> result`` of the all-reduce with ``op``."""
        if collective != "allreduce":
            raise Unavailable(f"--algo gloo runs the all-reduce only, not {collective}")
        torch, dist, size = self.torch, self.dist, self.size
        reduce_op = getattr(dist.ReduceOp, _OPS[op])

        def run(send, recv, check=False):
            if send.dtype.name not in DTYPES:
                raise Unavailable(f"gloo has no {send.dtype.name} all-reduce; it takes {', '.join(DTYPES)}")
            if recv is not send:
                np.copyto(recv, send)
            dist.all_reduce(torch.from_numpy(recv), op=reduce_op)
            if op == "avg" and size > 1:
                recv /= size
            return recv
        return run

    def close(self):
        """Destroy the process group (before MPI_Finalize)."""
        self.dist.destroy_process_group()
