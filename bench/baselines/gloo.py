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

from plumbing.ending import raise_together

from .base import Baseline, Unavailable

_OPS = {"sum": "SUM", "avg": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN"}


def dtypes():
    """NumPy's names of the dtypes gloo's all-reduce takes on CPU tensors, from the table of types
    (imported here: nothing in this package may start MPI before the driver asks it to)."""
    from algorithms.dtypes import TYPES
    return tuple(t.name for t in TYPES if t.gloo)


def problem():
    """Why gloo cannot run in this process (None when it can)."""
    try:
        import torch.distributed as dist
    except Exception as exc:  # ImportError, or a broken install
        return f"--algo gloo needs PyTorch (pip install -e '.[gloo]'): {type(exc).__name__}: {exc}"
    if not (dist.is_available() and dist.is_gloo_available()):
        return "--algo gloo needs a PyTorch build with torch.distributed and its gloo backend"
    return None


def as_tensor(torch, array):
    """``array`` as a CPU tensor on the same memory: ``torch.from_numpy``, bfloat16 (which NumPy
    knows through ml_dtypes, and torch.from_numpy does not) through its 16-bit pattern."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class GlooBaseline(Baseline):
    """A gloo process group over every rank (made by :meth:`start`, collective)."""

    family = "gloo"
    help = "gloo (PyTorch's torch.distributed on CPU tensors, when torch is installed)"
    description = None

    def names(self, collective):
        return ["gloo"]

    def check(self, args, chosen):
        if not chosen:
            return None
        if args.device != "cpu":
            return "--algo gloo runs on CPU tensors: it needs --device cpu"
        return None

    def lacks(self, name, dtype):
        if dtype.name not in dtypes():
            return f"gloo has no {dtype.name} all-reduce; it takes {', '.join(dtypes())}"
        return None

    def start(self, comm, timeout_s=120):
        raise_together(comm, problem(), Unavailable)
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

    def runner(self, spec, name, comm, op):
        """``run(send, recv, check=False) -> result`` of ``spec``'s collective with ``op``: gloo's
        ``all_reduce``, ``reduce_scatter_tensor`` (in place: its result is the input's first chunk,
        as MPI's) or ``all_gather_single`` (the output's chunk r is rank r's input; in place the
        input is copied out of the output first: gloo takes no aliased tensors)."""
        torch, dist, size = self.torch, self.dist, self.size
        if spec.name == "allgather":
            def gather(send, recv, check=False):
                per = recv.size // size
                mine = recv[comm.Get_rank() * per:][:per].copy() if recv is send else send
                dist.all_gather_single(as_tensor(torch, recv), as_tensor(torch, mine))
                return recv
            return gather
        reduce_op = getattr(dist.ReduceOp, _OPS[op])
        if spec.name == "reducescatter":
            def scatter(send, recv, check=False):
                out = recv[:recv.size // size] if recv is send else recv
                dist.reduce_scatter_tensor(as_tensor(torch, out), as_tensor(torch, send), op=reduce_op)
                if op == "avg" and size > 1:
                    out /= size
                return out
            return scatter

        def run(send, recv, check=False):
            if recv is not send:
                np.copyto(recv, send)
            dist.all_reduce(as_tensor(torch, recv), op=reduce_op)
            if op == "avg" and size > 1:
                recv /= size
            return recv
        return run

    def transport(self, name, xp):
        return self.description

    def close(self):
        """Destroy the process group (before MPI_Finalize)."""
        if self.description is not None:
            self.dist.destroy_process_group()
            self.description = None
