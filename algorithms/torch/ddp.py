"""A PyTorch DDP communication hook that all-reduces each gradient bucket with our algorithms.

    import algorithms.torch as art
    state = art.HookState(algorithm="ring")
    ddp_model.register_comm_hook(state, art.allreduce_hook)

``algorithm`` is any name of :data:`algorithms.ALGORITHMS` (``"auto"`` and ``"native"``
included); ``comm=None`` is ``MPI.COMM_WORLD``. DDP still needs a process group (gloo) for
its own bookkeeping, the first broadcast of the parameters and the buckets' rebuild; the
gradients travel through the hook. Not imported by ``import algorithms``: it needs PyTorch
(``pip install -e '.[gloo]'``).

The hook views the bucket's flat CPU tensor (``bucket.buffer()``) as a NumPy vector without
copying it (:func:`as_numpy`: float32, float64 and float16 by ``Tensor.numpy()``, bfloat16 as
its bits, ``int16``, viewed as ``ml_dtypes.bfloat16``), reduces it in place with
``algorithms.allreduce(view, view, op="avg", ...)`` (a sum, then a division by the rank count,
both in the dtype's own arithmetic: every rank ends with bit-identical gradients) and returns
a ``torch.futures.Future`` holding the bucket's tensor. Another dtype or a tensor off the CPU
raises ``TypeError``.

Synchronous (the default): the all-reduce runs inside the hook, so it blocks the backward pass
for its whole time; a step costs compute + the sum of the buckets' all-reduces, and efficiency
is E = T_c / (T_c + T_m) with T_m all of it. Overlapped, only the exposed communication (what
ends after the backward computation) takes T_m's place.

Overlapping (``overlap=True``): the hook hands the bucket to one communication thread (a
queue: buckets are reduced in the order DDP called the hook, which is the same on every rank)
and returns an uncompleted Future at once; the thread completes it (``set_result``, or
``set_exception`` when the all-reduce raised), and backward goes on meanwhile. DDP waits for
every Future at the end of the backward pass, so no bucket is in flight once
``loss.backward()`` has returned. Two things limit what overlaps:

* MPI: another thread calls MPI, so MPI must run at ``MPI.THREAD_SERIALIZED`` or above
  (mpi4py asks for ``MPI_THREAD_MULTIPLE`` unless ``mpi4py.rc.thread_level`` says otherwise;
  the suite's tools ask for ``MPI_THREAD_SINGLE``, and ``bench train --overlap on`` for
  ``MPI_THREAD_SERIALIZED``); the state checks ``MPI.Query_thread()`` when it is made and raises
  ``RuntimeError`` if lower.
  While buckets are in flight no other thread may call MPI or our collectives on ``comm``
  (between steps they may).
* The GIL and the cores: NumPy's ufuncs, mpi4py's calls and PyTorch's backward computation
  release the GIL. Our shared-memory transport waits for a peer by polling in Python, but
  after 64 idle polls each poll calls ``os.sched_yield()``, which releases the GIL too: a
  training thread lost under 1% of its time to stalls while the communication thread polled
  for a late peer (measured on 2 ranks). The other way round costs more: while the training
  thread runs Python, the polling thread gets the GIL back only at the interpreter's switch
  interval (5 ms, ``sys.getswitchinterval()``); and the communication thread needs a core of
  its own. With as many busy ranks as cores, 200 all-reduces of 256 KiB that took 20 ms beside
  an idle training thread took 2.6 s beside one busy in PyTorch (GIL released: the thread
  waits for a core) and 4 s beside one busy in Python (GIL held too). Overlap pays where each
  rank has a spare core; the records below measure what it reached.

Records: every call appends a :class:`BucketCall` to ``state.calls`` (DDP's bucket index,
its bytes and dtype, and ``time.perf_counter()`` when the hook was called, when the
all-reduce started and when it finished), so the overlap actually reached is measured, not
assumed (:func:`overlap_reached`). ``state.take()`` returns them and starts afresh.

:func:`noop_hook` returns the bucket untouched (no communication, recorded all the same): a
step then costs its computation alone, the "headroom" of PyTorch's debugging hooks.

``check=True`` (the default) keeps ``algorithms.allreduce``'s check that every rank passed the
same, one small collective per bucket; ``check=False`` skips it. The hook keeps one NumPy view
per bucket (:meth:`HookState.view_of`); its own work, the Future and the record, costs about
10 us a bucket over a bare ``algorithms.allreduce`` of the same vector (2 ranks of a 2-core VM).

``state.close()`` (or ``with HookState(...) as state:``) stops the communication thread.

FSDP2 (``fully_shard``) moves its parameters and gradients by all-gathers and reduce-scatters
instead: ``art.shard_with(model, algorithm="ring")`` runs them through ours
(:mod:`algorithms.torch.fsdp`, whose names this module re-exports: :class:`AllGather`,
:class:`ReduceScatter`, :class:`CommCall`, :func:`shard_with`, :func:`exposed_seconds`).
"""

from dataclasses import dataclass

try:
    import torch
except ImportError as exc:  # pragma: no cover - without torch the module is unusable
    raise ImportError(f"algorithms.torch needs PyTorch (pip install -e '.[gloo]'): {exc}") from exc
from mpi4py import MPI

from ..collectives import ALGORITHMS, allreduce
from .shared import CommThread, _perf_counter, as_numpy  # noqa: F401 (as_numpy: part of this module's API)

@dataclass
class BucketCall:
    """One call of a hook: DDP's bucket ``index``, its ``nbytes`` and ``dtype`` (NumPy's name),
    and ``time.perf_counter()`` when the hook was ``called`` (the bucket was ready), when its
    all-reduce ``started`` (later than ``called`` only in overlap mode, while earlier buckets
    were reduced) and ``finished`` (the Future completed just after); ``overlapped``: handed to
    the communication thread (else the call blocked the backward pass while it ran)."""

    index: int
    nbytes: int
    dtype: str
    called: float
    started: float
    finished: float
    overlapped: bool = False

    @property
    def seconds(self):
        """The all-reduce's own time."""
        return self.finished - self.started


class HookState:
    """What :func:`allreduce_hook` needs and what it records (see the module docstring).

    ``algorithm``: a name of :data:`algorithms.ALGORITHMS`; ``comm``: an mpi4py communicator
    (None: ``MPI.COMM_WORLD``); ``overlap``: reduce on a communication thread (needs
    ``MPI.THREAD_SERIALIZED`` or above); ``check``: ``algorithms.allreduce``'s check that
    every rank passed the same (a small collective per bucket; False skips it)."""

    def __init__(self, algorithm="auto", comm=None, overlap=False, check=True):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; choices: {', '.join(ALGORITHMS)}")
        self.algorithm, self.overlap, self.check = algorithm, bool(overlap), bool(check)
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.calls = []
        self._views = {}  # bucket index -> (its tensor's address, size, dtype, the NumPy view)
        self._worker = CommThread("HookState(overlap=True)", "allreduce-hook") if self.overlap else None

    @property
    def _thread(self):
        """The communication thread (None: synchronous, or closed)."""
        return None if self._worker is None else self._worker.thread

    def take(self):
        """The calls recorded so far; the record starts afresh."""
        calls, self.calls = self.calls, []
        return calls

    def close(self):
        """Stop the communication thread (after the buckets already handed over); idempotent."""
        if self._worker is not None:
            self._worker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def view_of(self, bucket):
        """(the bucket's tensor, the NumPy view of it, its dtype's name): the view made once per bucket and kept
        while DDP hands over the same memory, so that ``algorithms.allreduce`` sees the same vector
        step after step, as a program that reduces its own buffers does (a new view object a
        call costs it a few percent at 1-4 MiB). A kept view keeps its memory alive, so an
        address seen again is the same memory; DDP's rebuilt buckets replace the first step's, and
        the views of indices past the last bucket are dropped."""
        tensor = bucket.buffer()
        index = bucket.index()
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        known = self._views.get(index)
        if known is None or known[0] != key:
            view = as_numpy(tensor)
            known = self._views[index] = (key, view, view.dtype.name)  # NumPy computes a name a call: 3 us
            if getattr(bucket, "is_last", bool)():
                for stale in [i for i in self._views if i > index]:
                    del self._views[stale]
        return tensor, known[1], known[2]

    def _reduce(self, view):
        allreduce(view, view, op="avg", algorithm=self.algorithm, comm=self.comm, check=self.check)

    def _job(self, tensor, view, dtype, index, called):
        """What the communication thread runs for one bucket: the all-reduce, then its record;
        the bucket's tensor completes the Future."""
        def run():
            started = _perf_counter()
            self._reduce(view)
            self.calls.append(BucketCall(index, view.nbytes, dtype, called, started, _perf_counter(), True))
            return tensor
        return run


def allreduce_hook(state, bucket):
    """DDP communication hook: average the bucket over ``state.comm`` with ``state.algorithm``
    (``ddp_model.register_comm_hook(state, allreduce_hook)``); see the module docstring."""
    called = _perf_counter()
    tensor, view, dtype = state.view_of(bucket)
    if state.overlap:
        if state._thread is None:
            raise RuntimeError("this HookState is closed")
        return state._worker.submit(state._job(tensor, view, dtype, bucket.index(), called))
    future = torch.futures.Future()
    state._reduce(view)
    finished = _perf_counter()
    state.calls.append(BucketCall(bucket.index(), view.nbytes, dtype, called, called, finished))
    future.set_result(tensor)
    return future


def noop_hook(state, bucket):
    """DDP communication hook that returns the bucket untouched (each rank keeps its own
    gradients): what a step costs without communication. Recorded in ``state.calls`` like
    :func:`allreduce_hook`'s calls, with no time between start and finish."""
    called = _perf_counter()
    tensor = bucket.buffer()
    state.calls.append(BucketCall(bucket.index(), tensor.numel() * tensor.element_size(),
                                  str(tensor.dtype).removeprefix("torch."), called, called, called))  # any dtype
    future = torch.futures.Future()
    future.set_result(tensor)
    return future


def overlap_reached(calls):
    """The share of one step's all-reduce time hidden behind the backward pass, from its
    ``calls``: the backward computation ends when the last bucket is handed over (every
    gradient is ready then); what runs after that is exposed. 0 for the synchronous hook,
    whose buckets each block the backward pass; None without any all-reduce time."""
    busy = sum(c.seconds for c in calls)
    if not calls or busy <= 0:
        return None
    if not any(c.overlapped for c in calls):  # synchronous: every bucket blocked the backward pass
        return 0.0
    exposed = max(c.finished for c in calls) - max(c.called for c in calls)
    return min(max(1 - exposed / busy, 0.0), 1.0)
