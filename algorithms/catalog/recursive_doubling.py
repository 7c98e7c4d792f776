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
from ..runtime import engine
from ..algorithm import Algorithm
from ..runtime.layout import segment_offsets
from ..runtime.plan import combine, recv, send, sendrecv, start_in


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


def steps(size, rank, count, itemsize):
    """This rank's plan (:mod:`.plan`) from :func:`_plan`: a rank that sits out sends its segments
    to its pair and receives the result; its pair receives each into scratch and reduces it into
    the output; then each power-of-two step exchanges every segment with the partner (into
    scratch) and reduces (lower rank's partial) op (higher rank's), into the output; the pair's
    result goes back last. A rank's partial is its input until it first reduces."""
    cuts, pair, sits_out, partners = _plan(count, itemsize, size, rank)
    pieces = [(lo, hi) for lo, hi in zip(cuts, cuts[1:])]
    if size == 1:
        return (start_in(count),)
    if sits_out:
        return (*(send(pair, ("input", lo, hi)) for lo, hi in pieces), recv(pair, ("output", 0, count)))
    plan, current = [], "input"
    if pair is not None:
        for lo, hi in pieces:
            theirs = ("scratch", 0, hi - lo)
            plan += [recv(pair, theirs), combine(theirs, (current, lo, hi), ("output", lo, hi))]
        current = "output"
    for partner, lower in partners:
        for lo, hi in pieces:
            mine, theirs = (current, lo, hi), ("scratch", 0, hi - lo)
            plan.append(sendrecv(partner, mine, partner, theirs))
            plan.append(combine(theirs, mine, ("output", lo, hi)) if lower else combine(mine, theirs, ("output", lo, hi)))
        current = "output"
    if pair is not None:
        plan.append(send(pair, ("output", 0, count)))
    return tuple(plan)


def bind(coll, count, dtype):
    return engine.bound(coll, steps, count, dtype)


def allreduce(coll, sendbuf, recvbuf):
    engine.run(coll, steps, sendbuf, recvbuf)


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


ALGORITHM = Algorithm("rd", allreduce, schedule=schedule, bind=bind, steps=steps, received=received, all_gather=bruck.all_gather,
                      all_gather_schedule=bruck.schedule)
