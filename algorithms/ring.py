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

from .algorithm import Algorithm
from .layout import chunk_offsets, segment_offsets

__all__ = ["chunk_offsets", "reduce_scatter", "all_gather", "allreduce"]

VIEWS_KEPT_BYTES = 64 << 10  # vectors up to this size keep their slices (:func:`bind`)


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


def _reduce_scatter_pieces(coll, src, partial, result, pieces, order=None):
    """The N-1 reduce-scatter steps on one piece of every chunk; this rank's reduced piece
    goes to ``result`` (a vector as long as it)."""
    n, rank = coll.size, coll.rank
    _, _, right, left = _ring(n, rank, order)
    steps = _reduce_scatter_order(n, rank, order)
    lo, hi = pieces[steps[0][0]]
    outgoing = src[lo:hi]
    for step, (_, into) in enumerate(steps):
        lo, hi = pieces[into]
        if step == n - 2:
            target = result
        elif partial is None:
            # two buffers in turn: this step writes its partial while still sending the last one
            target = coll.scratch(src.dtype, hi - lo, f"ring-partial-{step % 2}")
        else:
            target = partial[lo:hi]
        coll.sendrecv_combine(outgoing, right, src[lo:hi], left, target)
        outgoing = target


def _all_gather_pieces(coll, buf, pieces, order=None):
    """The N-1 all-gather steps on one piece of every chunk of ``buf``."""
    n, rank = coll.size, coll.rank
    _, _, right, left = _ring(n, rank, order)
    for out, into in _all_gather_order(n, rank, order):
        (slo, shi), (rlo, rhi) = pieces[out], pieces[into]
        coll.sendrecv(buf[slo:shi], right, buf[rlo:rhi], left)


def _allreduce_plan(coll, count, dtype, order):
    """The all-reduce's exchanges in order, made once per shape (:meth:`Collective.plan`): for
    each piece, its N-1 reduce-scatter steps ``(exchange, True, from_input, sent, received)``
    then its N-1 all-gather steps ``(exchange, False, False, sent, received)``, the pieces as
    slices of the vectors and each exchange bound to their sizes (:meth:`Collective.exchange`).
    A reduce-scatter step sends from the input at step 0 and from the result vector (the
    partial sum) after."""
    n, rank = coll.size, coll.rank
    _, _, right, left = _ring(n, rank, order)
    offsets = chunk_offsets(count, n)
    parts = _parts(offsets, dtype.itemsize)

    def step(reducing, from_input, out, into):
        exchange = coll.exchange(dtype, out.stop - out.start, right, into.stop - into.start, left, reducing)
        return exchange, reducing, from_input, out, into

    plan = []
    for j in range(parts):
        pieces = [slice(lo, hi) for lo, hi in _pieces(offsets, parts, j)]
        for index, (out, into) in enumerate(_reduce_scatter_order(n, rank, order)):
            plan.append(step(True, index == 0, pieces[out], pieces[into]))
        for out, into in _all_gather_order(n, rank, order):
            plan.append(step(False, False, pieces[out], pieces[into]))
    return tuple(plan)


def reduce_scatter(coll, src, partial, result, order=None):
    """Ring reduce-scatter of ``src`` (read only) into ``result`` (this rank's chunk), around
    ``order`` (default: the ranks in order).

    Intermediate partial sums go to their chunk's place in ``partial`` (a
    full-length vector, which may be ``src`` itself when in place), or to two
    one-piece scratch buffers in turn when ``partial`` is None. Each piece is
    reduced as it arrives (:meth:`Collective.sendrecv_combine`).
    """
    n = coll.size
    offsets = chunk_offsets(src.size, n)
    if n == 1:
        coll.start_in(src, result)
        return
    parts = _parts(offsets, src.itemsize)
    cuts = chunk_offsets(result.size, parts)
    for j in range(parts):
        _reduce_scatter_pieces(coll, src, partial, result[cuts[j]:cuts[j + 1]],
                               _pieces(offsets, parts, j), order)


def all_gather(coll, buf, order=None):
    """Ring all-gather in place: ``buf`` holds this rank's chunk at its place and ends whole."""
    if coll.size > 1:
        _all_gather_pieces(coll, buf, _pieces(chunk_offsets(buf.size, coll.size), 1, 0), order)


def bind(coll, count, dtype, order=None):
    """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype`` around ``order``:
    the steps of :func:`_allreduce_plan` on slices of the two vectors. Up to
    :data:`VIEWS_KEPT_BYTES` the slices of the last two vectors are kept, and reused while the
    call gets those same vectors (a slice costs 0.2 us, a step 2-3 of them); a small ring
    all-reduce then makes none."""
    if coll.size == 1:
        return coll.start_in
    plan = coll.plan(_allreduce_plan, count, dtype, order)

    def steps(sendbuf, recvbuf):
        """Each step's exchange and its arguments, sliced as the step comes."""
        for exchange, reducing, from_input, out, into in plan:
            if reducing:
                yield exchange, ((sendbuf if from_input else recvbuf)[out], sendbuf[into], recvbuf[into])
            else:
                yield exchange, (recvbuf[out], recvbuf[into])

    if count * dtype.itemsize > VIEWS_KEPT_BYTES:
        def run(sendbuf, recvbuf):
            for exchange, args in steps(sendbuf, recvbuf):
                exchange(*args)
        return run
    last = [None, None, ()]  # the last vectors, and their steps

    def run_small(sendbuf, recvbuf):
        if sendbuf is not last[0] or recvbuf is not last[1]:
            last[:] = sendbuf, recvbuf, tuple(steps(sendbuf, recvbuf))
        for exchange, args in last[2]:
            exchange(*args)
    return run_small


def allreduce(coll, sendbuf, recvbuf, order=None):
    """Each partial sum goes to its place in ``recvbuf``, so no scratch is needed; ``order``
    (a tuple of the ranks, default theirs) is the ring's."""
    coll.plan(bind, sendbuf.size, sendbuf.dtype, order)(sendbuf, recvbuf)



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

ALGORITHM = Algorithm("ring", allreduce, schedule=schedule, bind=bind, reduce_scatter=reduce_scatter,
                      all_gather=all_gather, reduce_scatter_schedule=half_schedule, all_gather_schedule=half_schedule)
