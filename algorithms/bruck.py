"""Bruck's all-gather (Bruck, Ho, Kipnis, Upfal & Weathersby 1997, "Efficient algorithms for
all-to-all communications in multiport message-passing systems"; MPICH's
``MPIR_Allgather_intra_brucks``): recursive doubling for any N.

Rank r holds chunks r..r+d-1 (mod N, of :func:`.layout.chunk_offsets`) before step s
(s = 0..ceil(log2 N)-1, d = 2^s): Bruck's rotated order, position i holding chunk (r + i) mod N.
At step s it sends its first min(d, N - d) of them (chunks r..) to rank r - d and receives as many
(chunks r+d..) from rank r + d. It works in the vector itself: a run of consecutive chunks is
one range of it, or two where it wraps past chunk N-1, and sender and receiver cut the same
chunks at the same place, so a step is one exchange, or at most two messages each way, however
uneven the chunks, with no scratch and no final rotation. The latency-optimal all-gather for
short vectors: T ~ ceil(log2 N) alpha + (N-1)/N M/beta.
"""

import functools

import numpy as np

from .layout import chunk_offsets


def _ranges(offsets, first, blocks):
    """Chunks ``first``..``first + blocks - 1`` (mod N) as slices of the vector: one, or two where
    they wrap past chunk N-1; empty ones left out (the peer leaves out the same)."""
    n, last = len(offsets) - 1, first + blocks
    spans = [(offsets[first], offsets[last])] if last <= n else [(offsets[first], offsets[n]),
                                                                   (offsets[0], offsets[last - n])]
    return tuple(slice(lo, hi) for lo, hi in spans if hi > lo)


@functools.lru_cache(maxsize=256)
def _plan(count, n, rank):
    """Made once per shape: per step ``(dest, slices sent, source, slices received)``."""
    offsets = chunk_offsets(count, n)
    found, d = [], 1
    while d < n:
        blocks = min(d, n - d)
        found.append(((rank - d) % n, _ranges(offsets, rank, blocks),
                      (rank + d) % n, _ranges(offsets, (rank + d) % n, blocks)))
        d *= 2
    return tuple(found)


def _step(coll, dtype, dest, sent, source, received):
    """``step(whole)``: one step's messages. One each way: their exchange, bound once
    (:meth:`Collective.exchange`); otherwise every receive and send posted at once, then waited
    on (the peers' messages match in order: the same chunks cut the same way); None when it moves
    nothing."""
    if len(sent) == 1 and len(received) == 1:
        (out,), (into,) = sent, received
        exchange = coll.exchange(dtype, out.stop - out.start, dest, into.stop - into.start, source)

        def step(whole):
            exchange(whole[out], whole[into])
        return step
    if not sent and not received:
        return None
    isend, irecv = coll.isend, coll.irecv

    def step(whole):
        requests = [irecv(whole[into], source) for into in received]
        requests += [isend(whole[out], dest) for out in sent]
        for request in requests:
            request.Wait()
    return step


def _bound(coll, count, dtype):
    """:func:`_plan` with each step bound (:func:`_step`), the steps that move nothing left out."""
    steps = (_step(coll, dtype, *step) for step in _plan(count, coll.size, coll.rank))
    return tuple(step for step in steps if step is not None)


def all_gather(coll, whole):
    """Bruck's all-gather in place: ``whole`` holds this rank's chunk at its place and ends whole."""
    for step in coll.plan(_bound, whole.size, whole.dtype):
        step(whole)


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
