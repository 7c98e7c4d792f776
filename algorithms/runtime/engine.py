"""The engine that runs a rank's plan (:mod:`.plan`) through the executor's ``coll``.

Each step becomes one call of the transport: ``isend``, ``send``, ``recv``, ``recv_combine``
(which reduces straight from a shared slot where the transport has them), a bound exchange
(:meth:`.executor.Collective.exchange`, found once per shape) or a copy. What every call of
the same shape repeats is done once, in :func:`bind`: the exchanges are bound and, for vectors
up to :data:`VIEWS_KEPT_BYTES`, the slices of the last call's vectors are kept and reused while
the call gets those same vectors, so a small call runs its steps and nothing else.
"""

from ..arrays import same_memory
from . import compiled
from .plan import scratch_length, sends_blocking

VIEWS_KEPT_BYTES = 64 << 10


#: the vectors the plans of an all-reduce, a reduce-scatter and an all-gather name, in the order
#: their runs take them (:func:`bound`'s ``names``)
ALLREDUCE, REDUCE_SCATTER, ALL_GATHER = ("input", "output"), ("input", "partial", "output"), ("output",)


def run(coll, build, sendbuf, recvbuf, *args):
    """Run the all-reduce plan ``build(size, rank, count, itemsize, *args)`` on the two vectors
    (:func:`bound`)."""
    bound(coll, build, sendbuf.size, sendbuf.dtype, *args)(sendbuf, recvbuf)


def reduce_scatter(coll, build, src, partial, result, *args):
    """Run the reduce-scatter plan ``build(size, rank, count, itemsize, *args, where)``: ``where`` its
    partial sums go, ``"scratch"`` when ``partial`` is None, ``"input"`` when it is ``src`` (in place),
    else ``"partial"``."""
    where = "scratch" if partial is None else "input" if partial is src or same_memory(partial, src) else "partial"
    bound(coll, build, src.size, src.dtype, *args, where, names=REDUCE_SCATTER)(src, partial, result)


def all_gather(coll, build, whole, *args):
    """Run the all-gather plan ``build(size, rank, count, itemsize, *args)`` in place on ``whole``."""
    bound(coll, build, whole.size, whole.dtype, *args, names=ALL_GATHER)(whole)


def planned_reduce_scatter(build, doc, *defaults):
    """The reduce-scatter ``half(coll, src, partial, result, *args)`` that runs the plan ``build``
    (:func:`reduce_scatter`; ``args``, where none are passed, ``defaults``), documented by ``doc``,
    with ``half.bind(coll, count, dtype, in_place)``: ``run(src, partial, result)`` for vectors of
    that shape, ``partial`` ``src`` itself (in place) or None, bound once (:func:`bound`), which a
    repeat of a call of that shape runs (``collectives._KeptHalf``)."""
    def half(coll, src, partial, result, *args):
        reduce_scatter(coll, build, src, partial, result, *(args or defaults))

    def bind(coll, count, dtype, in_place):
        return bound(coll, build, count, dtype, *defaults, "input" if in_place else "scratch", names=REDUCE_SCATTER)
    half.bind, half.__doc__ = bind, doc
    return half


def planned_all_gather(build, doc, *defaults):
    """The all-gather ``half(coll, whole, *args)`` that runs the plan ``build`` (:func:`all_gather`;
    ``args`` as :func:`planned_reduce_scatter` takes them), with ``half.bind(coll, count, dtype,
    in_place)``: ``run(whole)`` for vectors of that shape, bound once."""
    def half(coll, whole, *args):
        all_gather(coll, build, whole, *(args or defaults))

    def bind(coll, count, dtype, in_place):
        return bound(coll, build, count, dtype, *defaults, names=ALL_GATHER)
    half.bind, half.__doc__ = bind, doc
    return half


def bound(coll, build, count, dtype, *args, names=ALLREDUCE):
    """``run(*vectors)``, the vectors those ``names`` name in the plan (default ``run(sendbuf,
    recvbuf)``): :func:`bind` of the steps ``build(size, rank, count, itemsize, *args)`` makes for
    this rank, kept on ``coll`` per (``build``, count, dtype, ``args`` by identity, ``names``) and
    holding ``args``, so that their identity stays theirs."""
    key = (build, count, dtype, names, *map(id, args)) if args else (build, count, dtype, names)
    entry = coll.engines.get(key)
    if entry is None:  # (a kept entry holds its args, so the ids of live ones are theirs alone)
        steps = build(coll.size, coll.rank, count, dtype.itemsize, *args)
        if compiled.chosen(coll, count * dtype.itemsize):
            entry = (args, compiled.bind(coll, steps, count, dtype, names, VIEWS_KEPT_BYTES))
        else:
            entry = (args, bind(coll, steps, count, dtype, names))
        if len(coll.engines) >= 256:
            coll.engines.clear()
        coll.engines[key] = entry
    return entry[1]


def bind(coll, steps, count, dtype, names=ALLREDUCE):
    """``run(*vectors)`` running ``steps`` (this rank's, of a plan for ``count`` elements of
    ``dtype``) on the vectors ``names`` names, in that order (``"scratch"`` is the workspace's)."""
    if len(names) not in (1, 2, 3):
        raise ValueError(f"a plan's run takes one to three vectors, not {names}")
    steps = sends_blocking(steps)
    handles = [None] * (1 + max((s.handle for s in steps), default=-1))
    # per step: (function, its arguments with slices as (vector, lo, hi), the handle it sets)
    template = []
    for step in steps:
        kind = step.kind
        if kind == "isend":
            template.append((coll.isend, (step.send, step.to), step.handle))
        elif kind == "send":
            template.append((coll.send, (step.send, step.to), -1))
        elif kind == "wait":
            template.append((_wait, (handles, step.waits), -1))
        elif kind == "recv":
            template.append((coll.recv, (step.into, step.source), -1))
        elif kind == "recv_reduce":
            template.append((coll.recv_combine, (step.acc, step.source, step.into), -1))
        elif kind == "irecv":
            template.append((coll.irecv, (step.into, step.source), step.handle))
        elif kind == "irecv_reduce":  # each receive in flight its own scratch, where it needs one
            template.append((coll.irecv_combine, (step.acc, step.source, step.into, f"engine-in-{step.handle}"),
                             step.handle))
        elif kind == "sendrecv":
            exchange = coll.exchange(dtype, _length(step.send), step.to, _length(step.into), step.source)
            template.append((exchange, (step.send, step.into), -1))
        elif kind == "sendrecv_reduce":
            exchange = coll.exchange(dtype, _length(step.send), step.to, _length(step.into), step.source, True)
            template.append((exchange, (step.send, step.acc, step.into), -1))
        elif kind == "copy":
            template.append((_copy, (coll.copy, step.into, step.send), -1))
        elif kind == "combine":
            template.append((coll.combine, (step.acc, step.send, step.into), -1))
        elif kind == "zero":
            template.append((_zero, (step.into,), -1))
        else:
            raise ValueError(f"unknown step kind {kind!r}")
    template = tuple(template)
    scratch = coll.scratch(dtype, scratch_length(steps), "engine")

    def calls(vectors):
        named = dict(zip(names, vectors), scratch=scratch)
        return tuple((function, tuple(named[a[0]][a[1]:a[2]] if type(a) is tuple and a and type(a[0]) is str
                                      else a for a in args), handle)
                     for function, args, handle in template)

    def run_calls(calls_made):
        for function, args, handle in calls_made:
            if handle < 0:
                function(*args)
            else:
                handles[handle] = function(*args)

    if count * dtype.itemsize > VIEWS_KEPT_BYTES:
        return lambda *vectors: run_calls(calls(vectors))
    last = [None, None, None, ()]  # the last vectors (up to three), and their calls
    if len(names) == 1:
        def run_one(whole):
            if whole is not last[0]:
                last[0], last[3] = whole, calls((whole,))
            run_calls(last[3])
        return run_one
    if len(names) == 3:
        def run_three(a, b, c):
            if a is not last[0] or b is not last[1] or c is not last[2]:
                last[:] = a, b, c, calls((a, b, c))
            run_calls(last[3])
        return run_three

    def run_two(sendbuf, recvbuf):
        if sendbuf is not last[0] or recvbuf is not last[1]:
            last[:] = sendbuf, recvbuf, None, calls((sendbuf, recvbuf))
        run_calls(last[3])
    return run_two


def _length(piece):
    return piece[2] - piece[1]


def _wait(handles, names):
    for name in names:
        handles[name].Wait()
        handles[name] = None


def _zero(into):
    into.fill(0)


def _copy(copy, into, source):
    if not same_memory(into, source):
        copy(into, source)
