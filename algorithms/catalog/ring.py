"""Ring all-reduce: reduce-scatter then all-gather, N-1 steps each.

Chunk layout: a vector of ``count`` elements is cut into N contiguous chunks;
chunk i is ``[offsets[i], offsets[i+1])`` with ``offsets`` from
:func:`chunk_offsets`. The first ``count % N`` chunks hold one element more
than the others, so chunks differ by at most one element and may be empty
when ``count < N``. After the reduce-scatter, rank r holds the reduced chunk r.

At step s of the reduce-scatter, rank r sends chunk (r-s-1) mod N to rank
r+1 and receives chunk (r-s-2) mod N from rank r-1, which it reduces into its
own copy. Each rank moves 2(N-1)/N * M bytes; T ~ 2(N-1) alpha + 2(N-1)/N * M/beta.

Any ring order runs the same way (``order``: rank ``order[k]`` sends to ``order[k+1]``, the
last to the first): "rank r" above is then position r of the ring, which works on chunk
``order[r]``, so that after the reduce-scatter every rank still holds its own chunk.
``bamring`` (:mod:`.bamring`) runs the ring whose slowest link is fastest.

Large chunks move in pieces (:func:`segment_offsets` of the largest chunk, the
same count for every chunk). The all-reduce runs both phases on piece j of
every chunk before piece j+1, as NCCL's ring does: a reduced piece is sent on
while it is still in cache, so each rank reads and writes the vector about
once, like a copy, instead of reading its reduced chunk back for a separate
all-gather. Every element is still reduced in the same order.
"""

import numpy as np

from ..runtime import engine
from ..algorithm import Algorithm
from ..runtime.layout import chunk_offsets, segment_offsets
from ..runtime.plan import sendrecv, sendrecv_reduce, start_in

__all__ = ["chunk_offsets", "reduce_scatter", "all_gather", "allreduce"]


def _pieces(offsets, parts, j):
    """``[(lo, hi)]`` of piece j (of ``parts``) of every chunk, in chunk order."""
    ranges = []
    for lo, hi in zip(offsets, offsets[1:]):
        cuts = chunk_offsets(hi - lo, parts)
        ranges.append((lo + cuts[j], lo + cuts[j + 1]))
    return ranges


def _parts(offsets, itemsize):
    return len(segment_offsets(offsets[1], itemsize)) - 1


def _ring(n, rank, order):
    """(the ring's order, this rank's position in it, its right and its left neighbour)."""
    order = range(n) if order is None else order
    p = order.index(rank)
    return order, p, order[(p + 1) % n], order[(p - 1) % n]


def _reduce_scatter_order(n, rank, order=None):
    """(chunk sent, chunk received) at each reduce-scatter step: at step s position r sends
    chunk (r-s-1) mod N (its partial sum from step s-1, its input at step 0) to position r+1
    and receives chunk (r-s-2) mod N from position r-1; the last is its own chunk, r (chunk
    q of position q read through ``order``: chunk ``order[q]``)."""
    order, p, _, _ = _ring(n, rank, order)
    return [(order[(p - step - 1) % n], order[(p - step - 2) % n]) for step in range(n - 1)]


def _all_gather_order(n, rank, order=None):
    """(chunk sent, chunk received) at each all-gather step: at step s position r forwards
    chunk (r-s) mod N to position r+1 and receives chunk (r-s-1) mod N from position r-1."""
    order, p, _, _ = _ring(n, rank, order)
    return [(order[(p - step) % n], order[(p - step - 1) % n]) for step in range(n - 1)]


def steps(size, rank, count, itemsize, order=None):
    """This rank's plan (:mod:`.plan`) of the all-reduce around ``order``: for each piece, its N-1
    reduce-scatter steps (each a ``sendrecv_reduce``: the partial sum to the right, from the
    input at step 0 and from the output after, the left's partial reduced with this rank's input
    into the output) then its N-1 all-gather steps (``sendrecv`` of finished chunks)."""
    if size == 1:
        return (start_in(count),)
    _, _, right, left = _ring(size, rank, order)
    offsets = chunk_offsets(count, size)
    parts = _parts(offsets, itemsize)
    plan = []
    for j in range(parts):
        pieces = _pieces(offsets, parts, j)
        for index, (out, into) in enumerate(_reduce_scatter_order(size, rank, order)):
            plan.append(sendrecv_reduce(right, ("input" if index == 0 else "output", *pieces[out]), left,
                                        ("input", *pieces[into]), ("output", *pieces[into])))
        for out, into in _all_gather_order(size, rank, order):
            plan.append(sendrecv(right, ("output", *pieces[out]), left, ("output", *pieces[into])))
    return tuple(plan)


def reduce_scatter_steps(size, rank, count, itemsize, order=None, partial="scratch"):
    """This rank's plan of the reduce-scatter around ``order``, piece by piece: the N-1 steps of
    :func:`_reduce_scatter_order`, each a ``sendrecv_reduce`` of the partial sum to the right (the
    input at step 0) with the left's reduced into the next partial, the last into ``"output"``
    (this rank's chunk). The partial sums go to their chunk's place in ``partial``: ``"input"``
    (in place), ``"partial"`` (a whole-length vector of the caller's), or ``"scratch"`` (two
    pieces in turn: a step writes its partial while the last one is still being sent)."""
    offsets = chunk_offsets(count, size)
    if size == 1:
        return (start_in(count),)
    _, _, right, left = _ring(size, rank, order)
    parts, own = _parts(offsets, itemsize), offsets[rank]
    widest = -(-max(hi - lo for lo, hi in zip(offsets, offsets[1:])) // parts)
    plan = []
    for j in range(parts):
        pieces = _pieces(offsets, parts, j)
        moves = _reduce_scatter_order(size, rank, order)
        outgoing = ("input", *pieces[moves[0][0]])
        for index, (_, into) in enumerate(moves):
            lo, hi = pieces[into]
            if index == size - 2:
                target = ("output", lo - own, hi - own)
            elif partial == "scratch":
                target = ("scratch", index % 2 * widest, index % 2 * widest + hi - lo)
            else:
                target = (partial, lo, hi)
            plan.append(sendrecv_reduce(right, outgoing, left, ("input", lo, hi), target))
            outgoing = target
    return tuple(plan)


def all_gather_steps(size, rank, count, itemsize, order=None):
    """This rank's plan of the all-gather in place around ``order``: the N-1 ``sendrecv`` steps of
    :func:`_all_gather_order` on ``"output"``, the whole vector, one piece a chunk."""
    _, _, right, left = _ring(size, rank, order)
    pieces = _pieces(chunk_offsets(count, size), 1, 0)
    return tuple(sendrecv(right, ("output", *pieces[out]), left, ("output", *pieces[into]))
                 for out, into in _all_gather_order(size, rank, order)) if size > 1 else ()


reduce_scatter = engine.planned_reduce_scatter(reduce_scatter_steps, """``reduce_scatter(coll, src, partial,
    result, order=None)``: ring reduce-scatter of ``src`` (read only) into ``result`` (this rank's chunk), around
    ``order`` (default: the ranks in order): :func:`reduce_scatter_steps`, the partial sums in
    ``partial`` (a whole-length vector, which may be ``src`` itself when in place) or, when it
    is None, in scratch. Each piece is reduced as it arrives (:meth:`Collective.sendrecv_combine`).""", None)

all_gather = engine.planned_all_gather(all_gather_steps, """``all_gather(coll, buf, order=None)``: ring
    all-gather in place: ``buf`` holds this rank's chunk at its place and ends whole (:func:`all_gather_steps`).""",
                                       None)


def bind(coll, count, dtype, order=None):
    """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype`` around ``order``:
    :func:`steps` on the engine."""
    return engine.bound(coll, steps, count, dtype, order)


def allreduce(coll, sendbuf, recvbuf, order=None):
    """Each partial sum goes to its place in ``recvbuf``, so no scratch is needed; ``order``
    (a tuple of the ranks, default theirs) is the ring's."""
    engine.run(coll, steps, sendbuf, recvbuf, order)


def schedule_around(order_of, doc):
    """The ring's schedule (docstring ``doc``) around the order ``order_of(model)`` returns:
    2(N-1) steps, each rank sending M/N to the next at once."""
    def schedule(model, m):
        order = order_of(model)
        pairs = model.phase(("ring", order.tobytes()), lambda: (order, np.roll(order, -1)))
        return [(2 * (model.n - 1), "step", pairs.time(m / model.n))]
    schedule.__doc__ = doc
    return schedule


schedule = schedule_around(lambda model: np.arange(model.n), """2(N-1) steps, each rank sending
    M/N to the next (ranks in order, so only the links between consecutive nodes use ports, one
    transfer each): 2(N-1)(alpha + M/(N beta)) on uniform links.""")

def half_schedule_around(order_of, doc):
    """The schedule of one of the ring's halves (docstring ``doc``) around ``order_of(model)``:
    N-1 steps, each rank sending M/N to the next at once."""
    def schedule(model, m):
        order = order_of(model)
        pairs = model.phase(("ring", order.tobytes()), lambda: (order, np.roll(order, -1)))
        return [(model.n - 1, "step", pairs.time(m / model.n))]
    schedule.__doc__ = doc
    return schedule


half_schedule = half_schedule_around(lambda model: np.arange(model.n), """N-1 steps, each rank sending
    M/N to the next: (N-1)(alpha + M/(N beta)) on uniform links, M the whole vector.""")

ALGORITHM = Algorithm("ring", allreduce, schedule=schedule, bind=bind, steps=steps, reduce_scatter=reduce_scatter,
                      all_gather=all_gather, reduce_scatter_schedule=half_schedule, all_gather_schedule=half_schedule)
