"""The entry points of an all-reduce that runs in rounds over the node's boxes
(:mod:`.transports.boxes`): ``oneshot`` and ``twoshot``.

A vector of one box or less is one round, bound once per shape (``bind``); a longer one goes
in pieces of a box, each piece a round; on one rank it is a copy. Where the ranks span nodes,
for CuPy buffers, or where ``/dev/shm`` cannot back the window, the algorithm's fallback runs,
and ``describe`` says so in the last case (the others are the algorithm's documented rule).
For the cost model, their phase: every rank reading from every other at once (:func:`all_to_all`),
starting in :data:`ROUND_MESSAGES`.
"""

import functools

import numpy as np

from ..algorithm import Algorithm
from . import compiled, engine

#: a round's start-up in messages: one counter written and polled in shared memory, no message
#: (bench perf, 8 B on 2 ranks: oneshot 2.06 us, rd's one message 3.57 us)
ROUND_MESSAGES = 0.5


def in_pieces(boxes, sendbuf, recvbuf, coll):
    """A vector over one box, in pieces of a box, each a round."""
    step = boxes.capacity // sendbuf.itemsize
    for lo in range(0, sendbuf.size, step):
        piece = sendbuf[lo:lo + step]
        boxes.round_for(piece.dtype, piece.size)(piece, recvbuf[lo:lo + step], coll)


def over_boxes(name, window, fallback, schedule, pieces=in_pieces, steps=None):
    """The :class:`.algorithm.Algorithm` (``allreduce(coll, sendbuf, recvbuf)`` with its ``bind``
    and ``describe``, ``schedule``, one node only) of the algorithm ``name`` whose window is ``window(comm)`` (a :class:`.transports.boxes.Boxes`
    with ``round_for(dtype, count)``, giving ``round(piece, out, coll)``; collective to build, kept
    as the communicator's resource ``name``); ``fallback``, a registered algorithm's record, runs
    where it cannot (bound as its own calls bind it, and named by the record's ``across_nodes``),
    ``pieces(boxes, sendbuf, recvbuf, coll)`` a vector over one box (:func:`in_pieces`).
    ``steps``: the algorithm as a plan (:mod:`.plan`), which the compiled engine runs instead of the
    rounds wherever it runs plans of that size (the record's ``plan_when_compiled``)."""

    def planned(coll, nbytes):
        return _compiled_runs(steps, coll, nbytes)

    def bind(coll, count, dtype):
        """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype``: its plan on the
        compiled engine where that runs them; where they fit one buffer of the node's window, its
        round itself; otherwise :func:`allreduce`."""
        if planned(coll, count * dtype.itemsize):
            return engine.bound(coll, steps, count, dtype)
        boxes = coll.private.resources.get(name)  # made by the first call (collective)
        if boxes is not None and not boxes.usable and coll.xp is np and fallback.bind is not None:
            return fallback.bind(coll, count, dtype)  # across nodes, or no /dev/shm: the fallback, as it binds
        if (boxes is None or not boxes.usable or coll.xp is not np or coll.size == 1
                or count * dtype.itemsize > boxes.capacity):
            return functools.partial(allreduce, coll)
        one_round = boxes.round_for(dtype, count)

        def run(sendbuf, recvbuf):
            one_round(sendbuf, recvbuf, coll)
        return run

    def allreduce(coll, sendbuf, recvbuf):
        boxes = coll.private.resources.get(name)
        if boxes is not None and coll.xp is np:  # the common case first: a vector of one piece, seen before
            run = boxes.rounds.get((sendbuf.dtype, sendbuf.size))
            if run is not None:
                run(sendbuf, recvbuf, coll)
                return
        if coll.size == 1:
            coll.start_in(sendbuf, recvbuf)
            return
        if planned(coll, sendbuf.nbytes):
            engine.run(coll, steps, sendbuf, recvbuf)
            return
        boxes = boxes or coll.private.resource(name, window)
        if not boxes.usable or coll.xp is not np:
            fallback.allreduce(coll, sendbuf, recvbuf)
            return
        if sendbuf.size * sendbuf.itemsize <= boxes.capacity:
            boxes.round_for(sendbuf.dtype, sendbuf.size)(sendbuf, recvbuf, coll)
        else:
            pieces(boxes, sendbuf, recvbuf, coll)

    def describe(private, transport):
        """``transport``, and what runs instead where ``/dev/shm`` could not back the window, or
        what the window's ``detail`` says it does otherwise (made here, collective, as the first
        call would)."""
        if private.comm.Get_size() == 1:
            return transport
        boxes = private.resource(name, window)
        text = f"{transport}; {name} runs {boxes.note}" if boxes.note else transport
        return f"{text}; {name} {boxes.detail}" if boxes.detail else text

    # across nodes it runs its fallback
    return Algorithm(name, allreduce, schedule=schedule, bind=bind, describe=describe, one_node_only=True,
                     steps=steps, plan_when_compiled=steps is not None, across_nodes=fallback.name)


def on_window(name, window, run, fallback, planned=None):
    """``half(coll, *vectors)``, one of an algorithm's halves (reduce-scatter or all-gather) run
    as its all-reduce is: ``planned(coll, *vectors)`` (its plan on the engine) wherever the
    compiled engine runs plans of the first vector's size; else ``run(boxes, coll, *vectors)`` on
    the window of :func:`over_boxes` (built by the first call of any of them, collective), or
    ``fallback(coll, *vectors)`` where that does not run (one rank, ranks across nodes, CuPy
    buffers, no ``/dev/shm`` for it)."""
    def half(coll, *vectors):
        if _compiled_runs(planned, coll, vectors[0].nbytes):
            planned(coll, *vectors)
            return
        if coll.size > 1:
            boxes = coll.private.resources.get(name) or coll.private.resource(name, window)
            if boxes.usable and coll.xp is np:
                run(boxes, coll, *vectors)
                return
        fallback(coll, *vectors)

    def bind(coll, count, dtype, in_place):
        """The half for vectors of ``count`` elements (the whole vector's) of ``dtype``, decided once
        where the compiled engine runs it: its plan bound (``planned.bind``); else ``half`` itself,
        which decides each call."""
        if _compiled_runs(planned, coll, count * dtype.itemsize):
            return planned.bind(coll, count, dtype, in_place)
        return functools.partial(half, coll)
    half.bind = bind
    return half


def _compiled_runs(plan, coll, nbytes):
    """Whether ``plan`` (a plan, or a half that runs one; None: there is none) runs on the compiled
    engine for ``nbytes``: on several ranks, where that engine runs plans of the size."""
    return plan is not None and coll.size > 1 and compiled.chosen(coll, nbytes)


def all_to_all(model):
    """The phase of every rank reading from every other rank at once (kept by the model)."""
    def pairs():
        src, dst = (a.ravel() for a in np.meshgrid(np.arange(model.n), np.arange(model.n), indexing="ij"))
        return src[src != dst], dst[src != dst]
    return model.phase(("all-to-all",), pairs)
