"""Bruck's all-gather (Bruck, Ho, Kipnis, Upfal & Weathersby 1997, "Efficient algorithms for
all-to-all communications in multiport message-passing systems"; MPICH's
``MPIR_Allgather_intra_brucks``): recursive doubling for any N.

Rank r keeps the blocks in rotated order, position i holding chunk (r + i) mod N of
:func:`.layout.chunk_offsets`. At step s (s = 0..ceil(log2 N)-1, d = 2^s) it sends its first
min(d, N - d) positions to rank r - d and receives as many from rank r + d into positions d
onwards; the blocks it sends are those the receiver lacks, the same on both sides, so each step
is one contiguous message however uneven the chunks. A final rotation puts the blocks in
place. The latency-optimal all-gather for short vectors:
T ~ ceil(log2 N) alpha + (N-1)/N M/beta.
"""

import functools

import numpy as np

from .layout import chunk_offsets


@functools.lru_cache(maxsize=256)
def _plan(count, n, rank):
    """Made once per shape: ``(start, own, steps)``: where this rank's chunk starts and its
    length (the rotated vector is ``whole[start:]`` then ``whole[:start]``), and per step
    ``(dest, elements sent from position 0, source, slice received)``."""
    offsets = chunk_offsets(count, n)
    rotated = [offsets[(rank + i) % n + 1] - offsets[(rank + i) % n] for i in range(n)]
    starts = np.concatenate([[0], np.cumsum(rotated)]).astype(int).tolist()
    found, d = [], 1
    while d < n:
        blocks = min(d, n - d)
        found.append(((rank - d) % n, starts[blocks], (rank + d) % n, slice(starts[d], starts[d + blocks])))
        d *= 2
    return offsets[rank], rotated[0], tuple(found)


def _bound(coll, count, dtype):
    """:func:`_plan` with each step's exchange bound (:meth:`Collective.exchange`)."""
    start, own, steps = _plan(count, coll.size, coll.rank)
    return start, own, tuple((coll.exchange(dtype, sent, dest, into.stop - into.start, source), sent, into)
                             for dest, sent, source, into in steps)


def all_gather(coll, whole):
    """Bruck's all-gather in place: ``whole`` holds this rank's chunk at its place and ends
    whole. Where the chunk starts the vector (rank 0) the rotated order is the vector's own, so
    it works in ``whole``; elsewhere in a scratch vector, rotated into ``whole`` at the end."""
    if coll.size == 1:
        return
    start, own, steps = coll.plan(_bound, whole.size, whole.dtype)
    buf = whole if start == 0 else coll.scratch(whole.dtype, whole.size, "bruck")
    if buf is not whole:
        buf[:own] = whole[start:start + own]
    for exchange, sent, into in steps:
        exchange(buf[:sent], buf[into])
    if buf is not whole:
        cut = whole.size - start
        whole[start + own:] = buf[own:cut]
        whole[:start] = buf[cut:]


def schedule(model, m):
    """ceil(log2 N) alpha + (N-1)/N M/beta on uniform links: ceil(log2 N) steps, in step s every
    rank r sending min(2^s, N - 2^s) chunks of M/N to rank r - 2^s at once."""
    n = model.n
    ranks = np.arange(n)
    parts, d = [], 1
    while d < n:
        phase = model.phase(("bruck", d), lambda d=d: (ranks, (ranks - d) % n))
        parts.append((1, f"step {d}", phase.time(min(d, n - d) * m / n)))
        d *= 2
    return parts
