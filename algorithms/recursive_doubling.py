"""Recursive doubling (Thakur, Rabenseifner & Gropp 2005; MPICH's short-message all-reduce).

At step k rank r exchanges its whole partial result with rank r XOR 2^k and
combines: after log2 N steps every rank holds the total. When N is not a power
of two, with p the largest power of two below N and e = N - p, the first 2e
ranks pair up first: each even one hands its vector to the odd one above it and
sits out, and gets the result back at the end. One message per step instead of
ring's 2(N-1), so it wins where alpha dominates:
T ~ ceil(log2 N)(alpha + M/beta) (+ 2(alpha + M/beta) when N is not a power of two).

Partners always compute (lower rank's partial) op (higher rank's partial), so
every rank ends with bit-identical results. Vectors move in segments
(:func:`layout.segment_offsets`), so the workspace is one segment. Out of place,
a rank's first combination reads ``sendbuf`` and writes ``recvbuf``, so the input
is never copied first (every rank combines at least once, or receives the result).

Its all-gather on its own (``all_gather(..., algorithm="rd")``) is Bruck's (:mod:`.bruck`):
recursive doubling generalised to any N, with no fold, in ceil(log2 N) steps,
T ~ ceil(log2 N) alpha + (N-1)/N M/beta. It has no reduce-scatter of its own (recursive
halving is :mod:`.rabenseifner`'s).
"""

import functools

import numpy as np

from . import bruck
from .algorithm import Algorithm
from .layout import segment_offsets


@functools.lru_cache(maxsize=256)
def _plan(count, itemsize, n, rank):
    """Made once per shape: the segment cuts, the rank this one pairs with first when N is not
    a power of two (None otherwise) and whether it then sits out, and the power-of-two steps
    as (partner, whether the partner is the lower rank)."""
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    cuts = segment_offsets(count, itemsize)
    if rank < 2 * extra:
        pair, sits_out, virtual = (rank + 1 if rank % 2 == 0 else rank - 1), rank % 2 == 0, rank // 2
    else:
        pair, sits_out, virtual = None, False, rank - extra
    steps = []
    mask = 1
    while mask < p and not sits_out:
        other = virtual ^ mask
        partner = 2 * other + 1 if other < extra else other + extra
        steps.append((partner, partner < rank))
        mask <<= 1
    return cuts, pair, sits_out, tuple(steps)


def _bound(coll, count, dtype):
    """:func:`_plan` with each power-of-two step's exchanges bound (:meth:`Collective.exchange`),
    made once per shape (:meth:`Collective.plan`): ``(cuts, pair, sits_out, pieces, steps)``,
    ``pieces`` each segment's slice (None for the whole vector) and scratch view, ``steps``
    ``(exchanges, lower)`` with one bound exchange per piece."""
    cuts, pair, sits_out, steps = _plan(count, dtype.itemsize, coll.size, coll.rank)
    if sits_out:
        return cuts, pair, sits_out, (), ()
    incoming = coll.scratch(dtype, cuts[1], "rd-in")
    if len(cuts) == 2:
        pieces = ((None, incoming),)
    else:
        pieces = tuple((slice(lo, hi), incoming[: hi - lo]) for lo, hi in zip(cuts, cuts[1:]))
    lengths = [hi - lo for lo, hi in zip(cuts, cuts[1:])]
    bound = tuple((tuple(coll.exchange(dtype, n, partner, n, partner) for n in lengths), lower)
                  for partner, lower in steps)
    return cuts, pair, sits_out, pieces, bound


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype``, its steps bound
    (:func:`_bound`); where nothing sits out and the vector is one segment (N a power of two,
    the short messages this algorithm is for), only the exchanges and combinations are left."""
    if coll.size == 1:
        return coll.start_in
    cuts, pair, sits_out, pieces, steps = coll.plan(_bound, count, dtype)
    send, recv, combine = coll.send, coll.recv, coll.combine
    if sits_out:
        def run(sendbuf, recvbuf):
            for k in range(len(cuts) - 1):
                send(sendbuf[cuts[k]:cuts[k + 1]], pair)
            recv(recvbuf, pair)
        return run
    if pair is None and len(pieces) == 1:
        theirs, exchanges = pieces[0][1], tuple((exchange, lower) for (exchange,), lower in steps)

        def run(sendbuf, recvbuf):
            current = sendbuf  # its input until it first combines into recvbuf
            for exchange, lower in exchanges:
                exchange(current, theirs)
                if lower:
                    combine(theirs, current, recvbuf)
                else:
                    combine(current, theirs, recvbuf)
                current = recvbuf
        return run

    def run(sendbuf, recvbuf):
        current = sendbuf
        if pair is not None:
            for cut, theirs in pieces:
                mine, out = (current, recvbuf) if cut is None else (current[cut], recvbuf[cut])
                recv(theirs, pair)
                combine(theirs, mine, out)
            current = recvbuf
        for exchanges, lower in steps:
            for (cut, theirs), exchange in zip(pieces, exchanges):
                mine, out = (current, recvbuf) if cut is None else (current[cut], recvbuf[cut])
                exchange(mine, theirs)
                if lower:
                    combine(theirs, mine, out)
                else:
                    combine(mine, theirs, out)
            current = recvbuf
        if pair is not None:
            send(recvbuf, pair)
    return run


def allreduce(coll, sendbuf, recvbuf):
    coll.plan(bind, recvbuf.size, recvbuf.dtype)(sendbuf, recvbuf)




def schedule(model, m):
    """log2 p steps of all pairs exchanging M (p the largest power of two <= N), plus the
    fold in and out when N > p: (log2 p + 2[N > p])(alpha + M/beta) on uniform links."""
    n = model.n
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    real = np.array([2 * v + 1 if v < extra else v + extra for v in range(p)])
    parts = []
    evens = np.arange(extra) * 2
    if extra:
        parts.append((1, "fold in", model.phase(("rd", "in"), lambda: (evens, evens + 1)).time(m)))
    mask = 1
    while mask < p:
        v = np.arange(p)
        step = model.phase(("rd", mask), lambda v=v, k=mask: (real[v], real[v ^ k]))
        parts.append((1, f"step {mask}", step.time(m)))
        mask <<= 1
    if extra:
        parts.append((1, "fold out", model.phase(("rd", "out"), lambda: (evens + 1, evens)).time(m)))
    return parts


def received(n, nbytes):
    """``(reduced, copied)`` bytes all ranks receive (:class:`.algorithm.Algorithm`): with p the
    largest power of two up to N and e = N - p, e vectors folded in and handed back, and p log2 p
    whole vectors exchanged and reduced: ((e + p log2 p) M, e M)."""
    p = 1 << (n.bit_length() - 1)
    return (n - p + p * (p.bit_length() - 1)) * nbytes, (n - p) * nbytes


ALGORITHM = Algorithm("rd", allreduce, schedule=schedule, bind=bind, received=received, all_gather=bruck.all_gather,
                      all_gather_schedule=bruck.schedule)
