"""What PyTorch's hooks into our collectives share: CPU tensors viewed as NumPy vectors without a
copy (:func:`as_numpy`, :func:`as_bytes`) and the one communication thread overlapped collectives
run on (:class:`CommThread`). Used by the DDP hook (:mod:`algorithms.torch`) and FSDP2's comms
(:mod:`algorithms.torch.fsdp`); it needs PyTorch."""

import queue
import threading
import time

import ml_dtypes
import numpy as np
import torch
from mpi4py import MPI

from plumbing.ending import thread_level_name

#: torch dtype -> the NumPy dtype its CPU tensor is viewed as (bfloat16: ml_dtypes')
_VIEWS = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
          torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16)}
_perf_counter = time.perf_counter


def as_numpy(tensor):
    """A 1-D NumPy vector sharing ``tensor``'s memory (a contiguous CPU tensor of float32,
    float64, float16 or bfloat16); ``TypeError`` otherwise. Nothing is copied: the vector's
    first byte is the tensor's (checked): its bytes (:func:`as_bytes`) seen as the dtype."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    dtype = _VIEWS.get(tensor.dtype)
    if dtype is None or not tensor.is_cpu:
        raise TypeError(f"algorithms.torch all-reduces CPU tensors of {', '.join(d.name for d in _VIEWS.values())}; "
                        f"got a tensor of {str(tensor.dtype).removeprefix('torch.')} on {tensor.device}")
    return as_bytes(tensor).view(dtype)


def as_bytes(tensor):
    """A 1-D NumPy ``uint8`` vector of ``tensor``'s bytes (a contiguous CPU tensor of any dtype),
    sharing its memory (checked): what a collective that only moves data (an all-gather) needs;
    FSDP all-gathers ``uint8`` itself where a unit's shards mix dtypes. ``TypeError`` for a
    tensor elsewhere or strided."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cpu or not tensor.is_contiguous():
        raise TypeError(f"algorithms.torch moves contiguous CPU tensors; got a {'strided' if tensor.is_cpu else ''} "
                        f"tensor on {tensor.device}")
    flat = tensor.detach().reshape(-1)
    if flat.numel() <= 1:  # contiguous whatever its stride says
        flat = flat.as_strided((flat.numel(),), (1,))
    array = (flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)).numpy()
    if array.ctypes.data != tensor.data_ptr() and tensor.numel():
        raise RuntimeError("the NumPy view of the tensor does not share its memory")  # never expected
    return array


class CommThread:
    """One communication thread: it runs the jobs handed to :meth:`submit` one at a time, in
    the order handed over (a queue), so the collectives they run keep the caller's order, the
    same on every rank, and only this thread calls MPI while they are in flight. ``owner``
    names the caller in the error raised when MPI runs below ``MPI.THREAD_SERIALIZED``."""

    def __init__(self, owner, name):
        level = MPI.Query_thread()
        if level < MPI.THREAD_SERIALIZED:
            raise RuntimeError(f"{owner} calls MPI from a communication thread: it needs MPI "
                               f"initialized at MPI_THREAD_SERIALIZED or above, not {thread_level_name(level)} "
                               "(leave mpi4py.rc.thread_level at 'multiple', or set it to 'serialized')")
        self._queue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, job):
        """A ``torch.futures.Future`` of ``job()`` run on the thread: completed with what it
        returns (a tensor), or with the exception it raised (its ``wait()`` raises it)."""
        if self.thread is None:
            raise RuntimeError("this communication thread is closed")
        future = torch.futures.Future()
        self._queue.put((job, future))
        return future

    def close(self):
        """Stop the thread after the jobs already handed over; idempotent."""
        if self.thread is not None:
            self._queue.put(None)
            self.thread.join()
            self.thread = None

    def _serve(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, future = item
            try:
                result = job()
            except BaseException as exc:  # noqa: BLE001 - the waiting caller raises it
                future.set_exception(exc)
                continue
            future.set_result(result)
