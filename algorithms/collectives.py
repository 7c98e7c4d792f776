"""Public entry points: ``allreduce``, ``reduce_scatter`` and ``all_gather``.

Each call validates its arguments locally, then (unless ``check=False``)
checks with one small collective that every rank passed valid and matching
arguments, so a mistake raises the same ``ValueError``/``TypeError`` on every
rank instead of hanging. ``check`` itself must be the same on all ranks.
"""

import functools

import numpy as np
from mpi4py import MPI

from . import auto
from .catalog import ring
from .runtime import compiled
from .runtime.agreement import FIELDS, agree
from .arrays import array_module, check_vector, overlaps, same_memory
from .runtime.executor import LAST_CALL, LAST_USED, private_comm
from .dtypes import DTYPES
from .ops import DTYPE_INDEX, FLOATING, OPS, check_op_dtype, dtype_index, op_index
from .from_bandwidth import tree_for
from .registry import REGISTERED
from .runtime.transports.registered import Registry

_KINDS = ("allreduce", "reduce_scatter", "all_gather")
#: every name ``algorithm=`` takes -> its :class:`.algorithm.Algorithm`: the registry's, and ``auto``,
#: which picks among them per call
ALGORITHMS = {**REGISTERED, "auto": auto.ALGORITHM}
_NDARRAY, _WORLD = np.ndarray, MPI.COMM_WORLD
RUNNERS = 256  # common-case calls kept per communicator, by shape (each keeps its plan and views)
SAME_VECTORS_BYTES = 64 << 10  # the last call's vectors up to this size are referenced (LAST_CALL)
#: {"reduce_scatter" or "all_gather": the names ``algorithm=`` takes for it}: the algorithms built
#: of the two halves, and ``auto``
HALVES = {half: tuple(name for name, algorithm in ALGORITHMS.items() if algorithm.runs(half))
          for half in ("reduce_scatter", "all_gather")}
#: the algorithms a call runs with nothing but its vectors: those that take no tree, and those
#: whose tree, unless one is passed, is the binomial tree of the rank count
_PLAIN = {name: algorithm for name, algorithm in ALGORITHMS.items()
          if algorithm.treeless or algorithm.tree_method == "binomial"}


def allreduce(sendbuf, recvbuf=None, *, op="sum", algorithm="ring", comm=None, check=True,
              tree=None, bandwidth=None):
    """Reduce ``sendbuf`` over all ranks of ``comm`` with ``op``; every rank gets the result.

    ``recvbuf=None`` or ``recvbuf is sendbuf`` means in place. Ops: sum, prod,
    max, min, avg (floating only). ``algorithm`` is a key of ``ALGORITHMS``.
    Tree algorithms take ``tree=`` (a ``topology.Tree``) or ``bandwidth=`` (an
    S x S matrix in GB/s or a probe file) to build theirs from: ``"tree"`` is
    binomial without either, ``"bamtree"`` and ``"kmtree"`` need one of them;
    ``"bamring"`` needs ``bandwidth=``, and ``"hier"`` takes it with
    ``ALLREDUCE_HIER_ACROSS=bamtree``.
    Returns the result buffer.
    """
    if recvbuf is None:
        recvbuf = sendbuf
    last = LAST_CALL[0]
    if (sendbuf is last[0] and recvbuf is last[1] and algorithm is last[2] and op is last[3] and comm is last[4]
            and tree is None and bandwidth is None):
        # the same two vectors as the last call: what else it checked still holds where they are as
        # they were then in all that can change in place (dtype, shape, strides, flags)
        if not check:
            if last[6](sendbuf, recvbuf):
                return recvbuf
        elif last[5](sendbuf, recvbuf):
            agree(last[8], "allreduce", None, last[9], _describe)
            last[7](sendbuf, recvbuf)
            return recvbuf
    if type(recvbuf) is _NDARRAY and type(sendbuf) is _NDARRAY and tree is None and bandwidth is None:
        # a repeat of a common-case call (see _common_case) on the last communicator: its runner,
        # kept by shape, after the checks that the shape alone does not settle
        private = LAST_USED[1] if (_WORLD if comm is None else comm) is LAST_USED[0] else None
        if private is not None:
            dtype, size = sendbuf.dtype, sendbuf.size
            try:
                bound = private.runners.get((algorithm, op, dtype, size))
            except TypeError:  # an unhashable op or algorithm: the full validation says what is wrong
                bound = None
            if bound is not None:
                runner, strides, fields = bound
                if (recvbuf.dtype is dtype and recvbuf.size == size and sendbuf.strides == strides == recvbuf.strides
                        and recvbuf.flags.writeable and (recvbuf is sendbuf or sendbuf.base is None and recvbuf.base
                                                         is None or not overlaps(sendbuf, recvbuf))):
                    if check:
                        agree(private, "allreduce", None, fields, _describe)
                    runner(sendbuf, recvbuf)
                    if sendbuf.nbytes <= SAME_VECTORS_BYTES:
                        LAST_CALL[0] = (sendbuf, recvbuf, algorithm, op, comm,
                                        *compiled.repeat_checks(runner, sendbuf, recvbuf), runner, private, fields)
                    return recvbuf
    chosen = _common_case(sendbuf, recvbuf, op, algorithm, tree, bandwidth)
    if chosen is not None:
        private = _private("allreduce", comm)
        key = (algorithm, op, sendbuf.dtype, sendbuf.size)
        if key in private.runners:  # kept already (a call on another communicator came between)
            key = None
        if check or key is not None:
            own_tree = tree_for("binomial", private.size) if chosen.tree_method == "binomial" else None
            fields = _fields("allreduce", sendbuf.size, sendbuf, op, algorithm, own_tree)
            if check:
                agree(private, "allreduce", None, fields, _describe)
        coll, result, plan = private.contexts.get((np, op)) or private.collective(np, op), recvbuf, None
    else:
        coll, result, plan = _prepare("allreduce", sendbuf, op, algorithm, comm, check,
                                      _allreduce_validation(sendbuf, recvbuf, op, algorithm, tree, bandwidth))
        chosen, key = ALGORITHMS[algorithm], None
    if plan is not None:
        chosen.allreduce(coll, sendbuf, result, plan)
    else:
        chosen.allreduce(coll, sendbuf, result)
    if op == "avg":
        coll.finish(result)
    if key is not None:  # a common-case call of a new shape: its runner kept for the repeats
        if len(private.runners) >= RUNNERS:
            private.runners.clear()
        private.runners[key] = (coll.runner(chosen, sendbuf.size, sendbuf.dtype), (sendbuf.itemsize,), fields)
    return result


def allreduce_init(sendbuf, recvbuf=None, *, op="sum", algorithm="ring", comm=None, tree=None, bandwidth=None):
    """A persistent all-reduce, as MPI 4's ``MPI_Allreduce_init``: the arguments of
    :func:`allreduce` checked, and agreed on by every rank, once, here (collective); the
    returned :class:`PersistentAllreduce`, called, reduces the two vectors' current contents
    into ``recvbuf`` with nothing checked again. The vectors must keep their shape, dtype and
    memory while it is in use, and every rank calls it in the same order as its other collectives."""
    coll, result, plan = _prepare("allreduce", sendbuf, op, algorithm, comm, True,
                                  _allreduce_validation(sendbuf, recvbuf, op, algorithm, tree, bandwidth))
    return PersistentAllreduce(sendbuf, result, coll.runner(ALGORITHMS[algorithm], sendbuf.size, sendbuf.dtype, plan))


class PersistentAllreduce:
    """An all-reduce bound to its vectors (:func:`allreduce_init`); calling it runs it and
    returns ``recvbuf``, with none of the checks of a call of :func:`allreduce` (whose repeat on
    the same vectors checks what can change in place: ``bench perf`` times both)."""

    __slots__ = ("sendbuf", "recvbuf", "_run")

    def __init__(self, sendbuf, recvbuf, run):
        self.sendbuf, self.recvbuf, self._run = sendbuf, recvbuf, run

    def __call__(self):
        self._run(self.sendbuf, self.recvbuf)
        return self.recvbuf


def reduce_scatter(sendbuf, recvbuf=None, *, op="sum", algorithm="ring", comm=None, check=True, bandwidth=None):
    """Reduce-scatter: rank r gets chunk r of the reduction of ``sendbuf`` over all ranks.

    Chunks follow ``chunk_offsets(sendbuf.size, N)`` (sizes differ by at most one, the larger
    first), whichever ``algorithm`` runs it: one of ``HALVES["reduce_scatter"]`` (the
    algorithms built of the two halves, and ``auto``). ``recvbuf`` must hold this rank's
    chunk; when it is None (or ``sendbuf`` itself) the reduction happens in ``sendbuf`` (which
    is overwritten) and a view of this rank's chunk in it is returned. ``bandwidth=`` as for
    :func:`allreduce` (``bamring``'s order, ``dring``'s).
    """
    repeated = _repeat_half("reduce_scatter", algorithm, op, comm, sendbuf, recvbuf, check, bandwidth)
    if repeated is not None:
        return repeated

    def validate(rank, size):
        offsets = ring.chunk_offsets(sendbuf.size, size)
        own = slice(offsets[rank], offsets[rank + 1])
        if recvbuf is None or same_memory(recvbuf, sendbuf):
            result = _result_buffer(sendbuf, None, sendbuf.size)[own]
        else:
            result = _result_buffer(sendbuf, recvbuf, own.stop - own.start)
        check_op_dtype(op, sendbuf.dtype)
        return result, sendbuf.size, _half_plan("reduce_scatter", algorithm, size, bandwidth)

    coll, result, plan = _prepare("reduce_scatter", sendbuf, op, algorithm, comm, check, validate)
    in_place = recvbuf is None or same_memory(recvbuf, sendbuf)
    half = ALGORITHMS[algorithm].reduce_scatter
    if plan is not None:
        half(coll, sendbuf, sendbuf if in_place else None, result, plan)
    else:
        half(coll, sendbuf, sendbuf if in_place else None, result)
    coll.finish(result)
    if plan is None and bandwidth is None:
        _keep_half("reduce_scatter", algorithm, op, coll, sendbuf, recvbuf, half)
    return result


def all_gather(sendbuf, recvbuf=None, *, algorithm="ring", comm=None, check=True, bandwidth=None):
    """All-gather: every rank contributes its chunk and gets the whole vector.

    Out of place, ``sendbuf`` is this rank's chunk and ``recvbuf`` the whole
    vector, with chunks laid out by ``chunk_offsets(recvbuf.size, N)``. In
    place (``recvbuf`` None), ``sendbuf`` is the whole vector with this rank's
    chunk already at its place. ``algorithm``: one of ``HALVES["all_gather"]``;
    ``bandwidth=`` as for :func:`allreduce`. Returns the whole vector.
    """
    repeated = _repeat_half("all_gather", algorithm, None, comm, sendbuf, recvbuf, check, bandwidth)
    if repeated is not None:
        return repeated

    def validate(rank, size):
        plan = _half_plan("all_gather", algorithm, size, bandwidth)
        if recvbuf is None or same_memory(recvbuf, sendbuf):
            return _result_buffer(sendbuf, None, sendbuf.size), sendbuf.size, plan
        check_vector(recvbuf, "recvbuf", writable=True)
        offsets = ring.chunk_offsets(recvbuf.size, size)
        expected = offsets[rank + 1] - offsets[rank]
        if sendbuf.size != expected:
            raise ValueError(
                f"sendbuf has {sendbuf.size} elements, but chunk {rank} of a "
                f"{recvbuf.size}-element recvbuf over {size} ranks has {expected}"
            )
        return _result_buffer(sendbuf, recvbuf, recvbuf.size), recvbuf.size, plan

    coll, whole, plan = _prepare("all_gather", sendbuf, None, algorithm, comm, check, validate)
    if not same_memory(sendbuf, whole):
        offsets = ring.chunk_offsets(whole.size, coll.size)
        coll.start_in(sendbuf, whole[offsets[coll.rank]:offsets[coll.rank + 1]])
    half = ALGORITHMS[algorithm].all_gather
    if plan is not None:
        half(coll, whole, plan)
    else:
        half(coll, whole)
    if plan is None and bandwidth is None:
        _keep_half("all_gather", algorithm, None, coll, sendbuf, recvbuf, half)
    return whole


class _KeptHalf:
    """A reduce-scatter's or all-gather's call of one shape on one communicator, kept after its
    first full validation so that a repeat costs what the all-reduce's does: the few attributes
    of the vectors that the shape does not settle read again (:func:`_plain`), then the
    agreement on the kept ``fields``, then ``run``: the half's plan bound once where the half is one
    (``half.bind``: :func:`.runtime.engine.planned_reduce_scatter`), else the half itself on the
    context; ``run(src, partial or None, result)`` or ``run(whole)``. ``lo, hi``: this rank's chunk;
    ``whole``: the whole vector's length."""

    __slots__ = ("name", "coll", "run", "fields", "lo", "hi", "in_place", "whole")

    def __init__(self, name, coll, run, fields, lo, hi, in_place, whole):
        self.name, self.coll, self.run, self.fields = name, coll, run, fields
        self.lo, self.hi, self.in_place, self.whole = lo, hi, in_place, whole

    def call(self, sendbuf, recvbuf, check):
        """The call's result; None, having done nothing, where a vector is not as the kept call's."""
        coll, in_place, reducing = self.coll, self.in_place, self.name == "reduce_scatter"
        dtype, own = sendbuf.dtype, self.hi - self.lo
        if in_place:
            if not _plain(sendbuf, dtype, self.whole):
                return None
        elif not (_plain(recvbuf, dtype, own if reducing else self.whole)
                  and _plain(sendbuf, dtype, self.whole if reducing else own, writable=False)
                  and (sendbuf.base is None and recvbuf.base is None or not overlaps(sendbuf, recvbuf))):
            return None
        if check:
            agree(coll.private, self.name, None, self.fields, _describe)
        if reducing:
            result = sendbuf[self.lo:self.hi] if in_place else recvbuf
            self.run(sendbuf, sendbuf if in_place else None, result)
            coll.finish(result)
            return result
        whole = sendbuf if in_place else recvbuf
        if not in_place:
            coll.copy(whole[self.lo:self.hi], sendbuf)
        self.run(whole)
        return whole


def _plain(vector, dtype, size, writable=True):
    """Whether ``vector`` is a 1-D C-contiguous NumPy vector of ``dtype`` and ``size`` elements
    (and writable): what a kept half's call asks of its vectors."""
    if type(vector) is not _NDARRAY:
        return False
    flags = vector.flags
    return (vector.dtype is dtype and vector.ndim == 1 and vector.size == size and flags.c_contiguous
            and (flags.writeable or not writable))


def _half_key(name, algorithm, op, sendbuf, recvbuf):
    """A kept half's key in its communicator's ``runners``; in place: ``recvbuf`` None or ``sendbuf``."""
    in_place = recvbuf is None or recvbuf is sendbuf
    return name, algorithm, op, sendbuf.dtype, sendbuf.size, -1 if in_place else recvbuf.size


def _repeat_half(name, algorithm, op, comm, sendbuf, recvbuf, check, bandwidth):
    """The result of this call run as the :class:`_KeptHalf` of its shape on the last communicator
    used; None, having done nothing, where there is none or the vectors are not as it asks."""
    if bandwidth is not None or type(sendbuf) is not _NDARRAY or recvbuf is not None and type(recvbuf) is not _NDARRAY:
        return None
    private = LAST_USED[1] if (_WORLD if comm is None else comm) is LAST_USED[0] else None
    if private is None:
        return None
    try:
        kept = private.runners.get(_half_key(name, algorithm, op, sendbuf, recvbuf))
    except TypeError:  # an unhashable op or algorithm: the full validation says what is wrong
        return None
    return kept.call(sendbuf, recvbuf, check) if kept is not None else None


def _keep_half(name, algorithm, op, coll, sendbuf, recvbuf, half):
    """Keep a call of ``half`` that passed the full validation for its repeats (:class:`_KeptHalf`),
    where it is the common case: NumPy vectors as :func:`_plain` asks, in place only as
    ``recvbuf`` None or ``sendbuf`` itself, out of place two vectors that do not overlap."""
    in_place = recvbuf is None or recvbuf is sendbuf
    if (coll.xp is not np or not _plain(sendbuf, sendbuf.dtype, sendbuf.size, writable=in_place)
            or not in_place and (not _plain(recvbuf, sendbuf.dtype, recvbuf.size) or overlaps(recvbuf, sendbuf))):
        return
    whole = sendbuf.size if in_place or name == "reduce_scatter" else recvbuf.size
    offsets = ring.chunk_offsets(whole, coll.size)
    bind = getattr(half, "bind", None)  # (the call just made built what it binds: nothing collective)
    run = bind(coll, whole, sendbuf.dtype, in_place) if bind is not None else functools.partial(half, coll)
    private = coll.private
    if len(private.runners) >= RUNNERS:
        private.runners.clear()
    private.runners[_half_key(name, algorithm, op, sendbuf, recvbuf)] = _KeptHalf(
        name, coll, run, _fields(name, whole, sendbuf, op, algorithm, None), offsets[coll.rank],
        offsets[coll.rank + 1], in_place, whole)


def _half_plan(collective, algorithm, size, bandwidth):
    """What ``algorithm``'s ``prepare`` makes for one of the halves (None where it has none);
    ``ValueError`` where it does not run that half."""
    if algorithm not in HALVES[collective]:
        raise ValueError(f"algorithm {algorithm!r} has no {collective.replace('_', '-')} of its own; "
                         f"choices: {', '.join(HALVES[collective])}")
    chosen = ALGORITHMS[algorithm]
    if chosen.prepare is not None and chosen.halves_take_no_plan:
        if bandwidth is not None:  # checked as the all-reduce checks it, then unused
            chosen.prepare(size, None, bandwidth, algorithm)
        return None
    if chosen.prepare is not None:
        return chosen.prepare(size, None, bandwidth, algorithm)
    if bandwidth is not None:
        raise ValueError(f"algorithm {algorithm!r} takes no bandwidth")
    return None


def transport_in_use(xp, comm=None, algorithm=None):
    """How our collectives move buffers of array module ``xp`` (``numpy`` or ``cupy``) on
    ``comm``, in words: the transport, and why when CUDA IPC or shared memory could not be
    used; with ``algorithm``, as that algorithm describes itself on it (native MPI's own
    collective, auto's table, oneshot's window). Collective the first time for each
    communicator and module (it may set up shared memory)."""
    private = private_comm(MPI.COMM_WORLD if comm is None else comm)
    text = private.transport(xp).describe()
    describe = ALGORITHMS[algorithm].describe if algorithm in ALGORITHMS else None
    return describe(private, text) if describe is not None else text


def engine_in_use(xp, comm=None, algorithm=None):
    """Which engine runs ``algorithm``'s plan on ``comm`` for buffers of ``xp``, in words
    (:func:`.runtime.compiled.describe`); what runs an algorithm that is not a plan, and
    ``auto``'s choice among them. Collective the first time for each communicator."""
    private = private_comm(MPI.COMM_WORLD if comm is None else comm)
    record = ALGORITHMS.get(algorithm) if isinstance(algorithm, str) else None
    other = "its own code" if record is not None and record.plan_when_compiled else "python"
    text = compiled.describe(private, xp, private.transport(xp), other)
    if algorithm == "auto":
        return f"{text}, where the algorithm it picks is a plan"
    if record is not None and record.steps is None:
        return "none: it runs its own code, not a plan"
    return text


def alloc_registered(count, dtype="float32", comm=None):
    """A ``count``-element NumPy vector (uninitialised) in memory the ranks of this node share,
    which our collectives on ``comm`` send without copying it (:mod:`.transports.registered`), like NCCL's
    registered buffers. Collective over ``comm``; each rank may ask for its own ``count``; a bad
    argument on any rank raises on every rank. Freed by :func:`free_registered`, or with
    ``comm`` (at exit for COMM_WORLD)."""
    private, problem = private_comm(MPI.COMM_WORLD if comm is None else comm), None
    try:
        dtype = np.dtype(dtype)
        dtype_index(dtype)
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"count must be a non-negative integer, got {count!r}")
    except (TypeError, ValueError) as exc:
        problem = exc
    agree(private, "alloc_registered", problem, dict.fromkeys(FIELDS, 0), _describe)
    return private.resource("registered", Registry).alloc(int(count) * dtype.itemsize).view(dtype)


def free_registered(vector, comm=None):
    """Free a vector from :func:`alloc_registered` on ``comm`` (collective; every rank passes
    its own vector from the same call, else every rank raises). Every view of it becomes invalid."""
    private = private_comm(MPI.COMM_WORLD if comm is None else comm)
    registry = private.resource("registered", Registry)
    index, problem = -1, None
    try:
        index = registry.index_of(vector)
    except (TypeError, ValueError) as exc:
        problem = exc
    agree(private, "free_registered", problem, {**dict.fromkeys(FIELDS, 0), "count": index},
          lambda field, value: f"the vector of alloc_registered call {value}")
    registry.unregister(index)


def _allreduce_validation(sendbuf, recvbuf, op, algorithm, tree, bandwidth):
    """The ``validate(rank, size)`` of :func:`_prepare` for an all-reduce."""
    def validate(rank, size):
        result = _result_buffer(sendbuf, recvbuf, sendbuf.size)
        check_op_dtype(op, sendbuf.dtype)
        chosen = ALGORITHMS.get(algorithm)
        if chosen is None:
            raise ValueError(f"unknown algorithm {algorithm!r}; choices: {', '.join(ALGORITHMS)}")
        method = chosen.tree_method
        if method is None:
            prepare = chosen.prepare
            if prepare is not None:  # checks tree= and bandwidth= itself; what it returns is passed on
                return result, sendbuf.size, prepare(size, tree, bandwidth, algorithm)
            if tree is not None or bandwidth is not None:
                raise ValueError(f"algorithm {algorithm!r} takes no tree or bandwidth")
            return result, sendbuf.size, None
        return result, sendbuf.size, tree_for(method, size, tree, bandwidth, algorithm)
    return validate


def _result_buffer(sendbuf, recvbuf, count):
    """Check ``recvbuf`` against the (already checked) ``sendbuf``; return the result buffer
    (``sendbuf`` itself when ``recvbuf`` is None or the same memory: in place)."""
    xp = array_module(sendbuf)
    if recvbuf is None or recvbuf is sendbuf:
        check_vector(sendbuf, "sendbuf", writable=True)
        return sendbuf
    if check_vector(recvbuf, "recvbuf", writable=True) is not xp:
        raise TypeError("sendbuf and recvbuf must both be NumPy arrays or both CuPy arrays")
    if overlaps(recvbuf, sendbuf):
        if same_memory(recvbuf, sendbuf):
            check_vector(sendbuf, "sendbuf", writable=True)
            return sendbuf
        raise ValueError("sendbuf and recvbuf overlap without being the same buffer")
    if recvbuf.dtype is not sendbuf.dtype and recvbuf.dtype != sendbuf.dtype:
        raise TypeError(f"recvbuf dtype {recvbuf.dtype} differs from sendbuf dtype {sendbuf.dtype}")
    if recvbuf.size != count:
        raise ValueError(f"recvbuf has {recvbuf.size} elements, expected {count}")
    return recvbuf


def _common_case(sendbuf, recvbuf, op, algorithm, tree, bandwidth):
    """The record of ``algorithm`` when the call is the common case, else None: two distinct
    1-D contiguous NumPy vectors of one supported dtype and length, or one (in place),
    ``recvbuf`` writable, a
    known op that suits the dtype, an algorithm that takes no tree or none is passed to one
    whose own is the binomial tree. Checked in a few
    attribute reads (1.5 us less per call than the full validation), it accepts only what the
    full validation (:func:`_prepare`) accepts; anything else goes there, which says what is
    wrong."""
    if type(sendbuf) is not np.ndarray or type(recvbuf) is not np.ndarray or type(algorithm) is not str:
        return None
    chosen = _PLAIN.get(algorithm)
    if chosen is None or tree is not None or bandwidth is not None:
        return None
    dtype, flags = sendbuf.dtype, recvbuf.flags
    if (sendbuf.ndim != 1 or recvbuf.ndim != 1 or not sendbuf.flags.c_contiguous or not flags.c_contiguous
            or not flags.writeable or recvbuf.dtype is not dtype or recvbuf.size != sendbuf.size
            or dtype not in DTYPE_INDEX or type(op) is not str or op not in OPS
            or (op == "avg" and dtype not in FLOATING)):
        return None
    if recvbuf is not sendbuf and (sendbuf.base is not None or recvbuf.base is not None) and overlaps(sendbuf, recvbuf):
        return None  # overlapping without being the same vector (two that own their memory cannot overlap)
    return chosen


def _private(name, comm):
    """The :class:`executor.Private` of the caller's ``comm`` (COMM_WORLD when None)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if comm is LAST_USED[0]:  # the communicator of the last call, checked then
        return LAST_USED[1]
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"{name}: comm must be an mpi4py intracommunicator, got {comm!r}")
    return private_comm(comm)


def _fields(name, count, sendbuf, op, algorithm, plan):
    """The fields of the agreement check (:func:`agreement.agree`); -1 for what does not validate."""
    return {
        "collective": _KINDS.index(name),
        "count": count,
        "dtype": _field(lambda: dtype_index(sendbuf.dtype)),
        "op": _field(lambda: op_index(op)) if op is not None else 0,
        "algorithm": _field(lambda: list(ALGORITHMS).index(algorithm)) if algorithm else 0,
        "tree": plan.digest() if plan is not None else 0,
    }


def _prepare(name, sendbuf, op, algorithm, comm, check, validate):
    """Resolve the communicator, validate locally, agree across ranks.

    ``validate(rank, size)`` returns (result buffer, count, tree or None); the
    return value is (Collective, result buffer, tree or None)."""
    private = _private(name, comm)
    comm, rank, size = private.comm, private.rank, private.size
    problem, result, count, plan = None, None, -1, None
    xp = None
    try:
        xp = check_vector(sendbuf, "sendbuf")
        dtype_index(sendbuf.dtype)
        if op is not None:
            op_index(op)
        result, count, plan = validate(rank, size)
    except (TypeError, ValueError) as exc:
        problem = exc
    if check:
        agree(private, name, problem, _fields(name, count, sendbuf, op, algorithm, plan), _describe)
    elif problem is not None:
        raise problem
    return private.collective(xp, op), result, plan


def _field(index):
    try:
        return index()
    except Exception:
        return -1


def _describe(field, value):
    names = {
        "collective": _KINDS,
        "dtype": [dt.name for dt in DTYPES],
        "op": list(OPS),
        "algorithm": list(ALGORITHMS),
    }.get(field)
    if names is not None and 0 <= value < len(names):
        return repr(names[value])
    if field == "tree" and value:
        return f"checksum {value}"
    return "unknown" if value == -1 else str(value)
