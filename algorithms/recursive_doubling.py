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
"""

import functools

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


def allreduce(coll, sendbuf, recvbuf):
    if coll.size == 1:
        coll.start_in(sendbuf, recvbuf)
        return
    cuts, pair, sits_out, steps = _plan(recvbuf.size, recvbuf.itemsize, coll.size, coll.rank)
    if sits_out:
        for k in range(len(cuts) - 1):
            coll.send(sendbuf[cuts[k]:cuts[k + 1]], pair)
        coll.recv(recvbuf, pair)
        return
    combine = coll.combine
    incoming_all = coll.scratch(recvbuf.dtype, cuts[1], "rd-in")
    current = sendbuf  # what this rank holds: its input until it first combines into recvbuf
    if pair is not None:
        for mine, out, theirs in _pieces(current, recvbuf, incoming_all, cuts):
            coll.recv(theirs, pair)
            combine(theirs, mine, out=out)
        current = recvbuf
    for partner, lower in steps:
        for mine, out, theirs in _pieces(current, recvbuf, incoming_all, cuts):
            coll.sendrecv(mine, partner, theirs, partner)
            if lower:
                combine(theirs, mine, out=out)
            else:
                combine(mine, theirs, out=out)
        current = recvbuf
    if pair is not None:
        coll.send(recvbuf, pair)


def _pieces(current, recvbuf, incoming_all, cuts):
    """Each segment of ``current`` (what this rank holds), of ``recvbuf`` (where its
    combination goes) and the scratch view of the same length it is combined with (the
    whole buffers, without making views, when there is one segment)."""
    if len(cuts) == 2:
        return ((current, recvbuf, incoming_all),)
    return ((current[lo:hi], recvbuf[lo:hi], incoming_all[: hi - lo]) for lo, hi in zip(cuts, cuts[1:]))
