"""FSDP2's all-gathers and reduce-scatters through our collectives.

    from torch.distributed.fsdp import fully_shard
    import algorithms.torch as art
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    ag, rs = art.shard_with(model, algorithm="ring")

``shard_with`` sets one :class:`AllGather` and one :class:`ReduceScatter` on every FSDP module
(``set_custom_all_gather`` / ``set_custom_reduce_scatter``). ``algorithm`` is any name of
``algorithms.HALVES["all_gather"]`` / ``["reduce_scatter"]`` (``"auto"`` included); ``comm=None``
is ``MPI.COMM_WORLD``, whose ranks must be the FSDP group's (checked at each call). FSDP still
needs its process group (gloo) for its own bookkeeping; the parameters and gradients travel here.
They take contiguous CPU tensors as NumPy views of the same memory: the all-gather moves any
dtype's bytes (:func:`algorithms.torch.shared.as_bytes`; FSDP all-gathers ``uint8`` where a
unit's shards mix dtypes: frozen parameters of another dtype beside the trained ones), the
reduce-scatter sums float32, bfloat16, float16 and float64 (:func:`algorithms.torch.shared.as_numpy`;
another dtype raises ``TypeError``).

How FSDP2 calls them (PyTorch 2.13, CPU), N ranks:

* All-gather: one per FSDP module before its forward, and again before its backward (its
  parameters are resharded after the forward). FSDP flattens the module's shards, each
  parameter padded on dim 0 to a multiple of N, into ``output = allocate((N * n,))`` (so the
  output is N equal shards) and copies this rank's shard into shard r of it: ``input`` is that
  view of ``output``, in place. We run ``algorithms.all_gather(output)`` in place (an input
  elsewhere is copied to its place first). ``async_op`` is False unless the module's
  ``unshard_async_op`` is set (``FSDPModule._set_unshard_async_op(True)``; ``shard_with(...,
  overlap=True)`` sets it) or the program calls ``module.unshard(async_op=True)``; FSDP then
  waits on the returned ``Work`` in the module's pre-forward or pre-backward.
* Reduce-scatter: one per module after its backward (``input``: its gradients, flattened and
  padded as above; ``output``: a tensor of one shard), always with ``async_op=False``: FSDP uses the output at once (divides it, casts it, views it as the
  sharded gradients), so on CPU it cannot overlap. The op: ``AVG`` for float32 and bfloat16
  gradients (our sum, then a division by N in the dtype), ``SUM`` for others, FSDP dividing the
  input and output itself by factors near sqrt(N) (float16, float64) or under
  ``set_force_sum_reduction_for_comms(True)``, ``PREMUL_SUM(1/f)`` where
  ``set_gradient_divide_factor(f)`` is not N (we multiply a copy of the input by ``1/f`` in the
  dtype, then sum it). ``MIN``, ``MAX`` and ``PRODUCT`` map to ours too; others raise
  ``ValueError``. A vector that does not divide by N raises ``ValueError`` (FSDP pads, so it
  always does: then our chunks, ``chunk_offsets``, are FSDP's shards).
* On one rank FSDP calls neither.

Synchronous (``overlap=False``): each collective runs in the call, which returns None (a
completed ``Work`` where ``async_op=True``). Overlapped (``overlap=True``): every call goes to
one communication thread (:class:`algorithms.torch.shared.CommThread`, shared by all the overlapped
objects of this process: MPI sees one thread, in the calls' order, the same on every rank,
so it must run at ``MPI.THREAD_SERIALIZED`` or above, checked); an ``async_op=True`` all-gather
returns at once a ``Work`` whose ``wait()`` blocks until it finished (and raises what it
raised), the others wait in the call. What then overlaps, in FSDP's schedule: module i's
pre-backward issues module i-1's all-gather (implicit backward prefetch), which runs while
module i's backward computes; module i's reduce-scatter queues behind it. In the forward a
module waits on its own all-gather at once, unless ``set_modules_to_forward_prefetch`` issues
the next module's early, which then overlaps this module's forward. Reduce-scatters never
overlap. The thread, the GIL and the cores limit what overlaps as for the DDP hook
(:mod:`algorithms.torch`).

Records: every call appends a :class:`CommCall` to the object's ``calls`` when called (FSDP's
order), filled in when it ran; ``take()`` returns them and starts afresh (between steps, with
nothing in flight); :func:`exposed_seconds` sums the time the training thread waited for them.
``close()`` (or ``with``) lets the communication thread go; ``check=False`` skips the
collectives' check that every rank passed the same (one small collective per call).
"""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _FsdpAllGather
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _FsdpReduceScatter

from ..collectives import HALVES, all_gather, reduce_scatter
from .shared import CommThread, _perf_counter, as_bytes, as_numpy

_RedOp = dist.ReduceOp.RedOpType
#: torch's reduce op -> ours (PREMUL_SUM: a sum of the inputs times its factor)
_OPS = {_RedOp.SUM: "sum", _RedOp.AVG: "avg", _RedOp.PRODUCT: "prod", _RedOp.MIN: "min", _RedOp.MAX: "max",
        _RedOp.PREMUL_SUM: "sum"}


@dataclass
class CommCall:
    """One call: ``kind`` ("all_gather" or "reduce_scatter"), the whole vector's ``nbytes``
    (the all-gather's output, the reduce-scatter's input: nccl-tests' size) and ``dtype``
    (NumPy's name); ``time.perf_counter()`` when it was ``called``, when the collective
    ``started`` and ``finished`` (None until then; ``finished`` stays None where it raised);
    ``overlapped``: returned before it ran (``async_op=True`` on the communication thread);
    ``exposed``: the seconds the caller was blocked for it (from the call to its return, or
    in ``Work.wait()``)."""

    kind: str
    nbytes: int
    dtype: str
    called: float
    started: Optional[float] = None
    finished: Optional[float] = None
    overlapped: bool = False
    exposed: float = 0.0

    @property
    def seconds(self):
        """The collective's own time."""
        return self.finished - self.started


def exposed_seconds(calls):
    """The time the training thread spent blocked in ``calls``: what communication added to
    the step (all of it when synchronous)."""
    return sum(c.exposed for c in calls)


class _Pending(dist.Work):
    """The ``Work`` of a call handed to the communication thread. ``wait()`` blocks (the GIL
    released) until the collective finished, and raises what it raised (torch's
    ``_create_work_from_future`` would swallow the exception); it ignores ``timeout``. The wait
    adds to ``record.exposed``."""

    def __init__(self, future, record=None):
        super().__init__()
        self._future, self._record = future, record

    def wait(self, timeout=None):
        start = _perf_counter()
        self._future.wait()
        if self._record is not None:
            self._record.exposed += _perf_counter() - start
        return True

    def is_completed(self):
        return self._future.done()

    def get_future(self):
        return self._future


class _SharedThread:
    """The one communication thread of the overlapped objects, while any is open."""

    def __init__(self):
        self.worker, self.users = None, 0

    def acquire(self, owner):
        if self.worker is None:
            self.worker = CommThread(owner, "fsdp-comm")
        self.users += 1
        return self.worker

    def release(self):
        self.users -= 1
        if self.users == 0:
            self.worker.close()
            self.worker = None


_SHARED = _SharedThread()


class _Comm:
    """What :class:`AllGather` and :class:`ReduceScatter` share: the choices, the records, the
    buffers (``allocate``: ``torch.empty``, as FSDP's default) and the launch."""

    KIND = None

    def __init__(self, algorithm="ring", comm=None, overlap=False, check=True, *, bandwidth=None):
        if algorithm not in HALVES[self.KIND]:
            raise ValueError(f"unknown algorithm {algorithm!r} for the {self.KIND.replace('_', '-')}; "
                             f"choices: {', '.join(HALVES[self.KIND])}")
        self.algorithm, self.overlap, self.check, self.bandwidth = algorithm, bool(overlap), bool(check), bandwidth
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.calls = []
        self._closed = False
        self._worker = _SHARED.acquire(f"{type(self).__name__}(overlap=True)") if self.overlap else None

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def take(self):
        """The calls recorded so far; the record starts afresh."""
        calls, self.calls = self.calls, []
        return calls

    def close(self):
        """Let the communication thread go (it stops, after the calls handed over, when no
        overlapped object uses it); idempotent."""
        self._closed = True
        if self._worker is not None:
            self._worker = None
            _SHARED.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _place(self, group, elements):
        """(this rank, the rank count) of ``comm``, checked against FSDP's ``group``, and that
        ``elements`` divide into N equal shards; a closed object refuses."""
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed")
        rank, size = self.comm.Get_rank(), self.comm.Get_size()
        if group is not None and (group.rank(), group.size()) != (rank, size):
            raise ValueError(f"FSDP's group is rank {group.rank()} of {group.size()}, but comm is rank {rank} "
                             f"of {size}: pass the communicator of the same ranks in the same order")
        if elements % size:
            raise ValueError(f"the {self.KIND.replace('_', '-')} takes N equal shards (FSDP pads its parameters "
                             f"so that they divide): {elements} elements do not divide over {size} ranks")
        return rank, size

    def _record(self, tensor, called):
        record = CommCall(self.KIND, tensor.nbytes, str(tensor.dtype).removeprefix("torch."), called)
        self.calls.append(record)
        return record

    def _launch(self, record, run, tensor, async_op):
        """Run ``run()`` (the collective) now, or on the communication thread: what FSDP expects
        back (None, or a ``Work`` where ``async_op``)."""
        def timed():
            record.started = _perf_counter()
            run()
            record.finished = _perf_counter()
            return tensor
        if self._worker is None:
            timed()
            record.exposed = record.finished - record.called
            return _done(tensor) if async_op else None
        work = _Pending(self._worker.submit(timed), record)
        if async_op:
            record.overlapped = True
            return work
        work.wait()
        record.exposed = _perf_counter() - record.called
        return None


def _done(tensor):
    future = torch.futures.Future()
    future.set_result(tensor)
    return _Pending(future)


class AllGather(_Comm, _FsdpAllGather):
    """FSDP2's all-gather through ``algorithms.all_gather`` (see the module docstring): in
    place in ``output_tensor``, N equal shards, this rank's (``input_tensor``) at shard r."""

    KIND = "all_gather"

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        called = _perf_counter()
        whole = as_bytes(output_tensor)  # moved as bytes: N equal shards of bytes are N equal shards
        rank, size = self._place(group, output_tensor.numel())
        if input_tensor.dtype != output_tensor.dtype or input_tensor.numel() * size != output_tensor.numel():
            raise ValueError(f"the all-gather's input ({input_tensor.numel()} of {input_tensor.dtype}) is not one "
                             f"of {size} shards of its output ({output_tensor.numel()} of {output_tensor.dtype})")
        shard = whole[rank * input_tensor.nbytes:][:input_tensor.nbytes]
        if input_tensor.numel() and input_tensor.data_ptr() != shard.ctypes.data:
            np.copyto(shard, as_bytes(input_tensor))  # not FSDP's own in-place input
        record = self._record(output_tensor, called)
        return self._launch(record, lambda: all_gather(whole, algorithm=self.algorithm, comm=self.comm,
                                                       check=self.check, bandwidth=self.bandwidth),
                            output_tensor, async_op)


class ReduceScatter(_Comm, _FsdpReduceScatter):
    """FSDP2's reduce-scatter through ``algorithms.reduce_scatter`` (see the module docstring):
    shard r of the reduction of ``input_tensor`` into ``output_tensor``, with FSDP's ``op``
    (SUM, AVG, PREMUL_SUM; MIN, MAX, PRODUCT)."""

    KIND = "reduce_scatter"

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        called = _perf_counter()
        ours, factor = _reduce_op(op)
        src, result = as_numpy(input_tensor), as_numpy(output_tensor)
        _, size = self._place(group, src.size)
        if src.dtype != result.dtype or result.size * size != src.size:
            raise ValueError(f"the reduce-scatter's output ({result.size} of {output_tensor.dtype}) is not one of "
                             f"{size} shards of its input ({src.size} of {input_tensor.dtype})")
        record = self._record(input_tensor, called)
        if factor is not None:  # PREMUL_SUM: the inputs times the factor, in the dtype, then summed
            src = as_numpy(torch.mul(input_tensor.detach().reshape(-1), factor))
        return self._launch(record, lambda: reduce_scatter(src, result, op=ours, algorithm=self.algorithm,
                                                           comm=self.comm, check=self.check,
                                                           bandwidth=self.bandwidth),
                            output_tensor, async_op)


def _reduce_op(op):
    """(our op's name, PREMUL_SUM's factor or None) of torch's ``op`` (a ``ReduceOp`` or its
    ``RedOpType``); ``ValueError`` for one we do not run."""
    kind = getattr(op, "op", op)
    if kind not in _OPS:
        raise ValueError(f"the reduce-scatter runs SUM, AVG, PREMUL_SUM, PRODUCT, MIN and MAX, not {op}")
    factor = getattr(op, "factor", None) if kind == _RedOp.PREMUL_SUM else None
    if kind == _RedOp.PREMUL_SUM and factor is None:
        raise ValueError("PREMUL_SUM without its factor: pass ReduceOp.PREMUL_SUM(factor)")
    return _OPS[kind], factor


def shard_with(module, algorithm="ring", comm=None, overlap=False, check=True, *, bandwidth=None):
    """(ag, rs): one :class:`AllGather` and one :class:`ReduceScatter`, set on every FSDP module
    of ``module.modules()`` (after ``fully_shard``). With ``overlap=True`` each module's
    all-gathers also become asynchronous (``_set_unshard_async_op(True)``), so that FSDP's
    prefetches run on the communication thread (see the module docstring)."""
    modules = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError("shard_with: the module has no FSDP module; call fully_shard on its layers and on it first")
    ag = AllGather(algorithm, comm, overlap, check, bandwidth=bandwidth)
    try:
        rs = ReduceScatter(algorithm, comm, overlap, check, bandwidth=bandwidth)
    except BaseException:
        ag.close()
        raise
    for m in modules:
        m.set_custom_all_gather(ag)
        m.set_custom_reduce_scatter(rs)
        if overlap and hasattr(m, "_set_unshard_async_op"):
            m._set_unshard_async_op(True)
    return ag, rs

