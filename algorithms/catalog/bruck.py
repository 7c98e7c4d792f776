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

from ..runtime import engine
from ..runtime.layout import chunk_offsets
from ..runtime.plan import irecv, isend, sendrecv, wait


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


def all_gather_steps(size, rank, count, itemsize):
    """This rank's plan (:mod:`.plan`) on ``"output"``, the whole vector: each step of :func:`_plan`
    one exchange where one range goes each way, else every receive and send posted at once, then
    waited for (the peers' messages match in order: the same chunks cut the same way); a step that
    moves nothing left out."""
    plan = []
    for dest, sent, source, received in _plan(count, size, rank):
        if len(sent) == 1 and len(received) == 1:
            plan.append(sendrecv(dest, ("output", sent[0].start, sent[0].stop), source,
                                 ("output", received[0].start, received[0].stop)))
        elif sent or received:
            plan += [irecv(source, ("output", into.start, into.stop), t) for t, into in enumerate(received)]
            plan += [isend(dest, ("output", out.start, out.stop), len(received) + t) for t, out in enumerate(sent)]
            plan.append(wait(*range(len(received) + len(sent))))
    return tuple(plan)


all_gather = engine.planned_all_gather(all_gather_steps, """``all_gather(coll, whole)``: Bruck's all-gather
    in place: ``whole`` holds this rank's chunk at its place and ends whole.""")


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
