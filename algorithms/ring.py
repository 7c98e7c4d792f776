"""Ring all-reduce (seed 000 section 3): reduce-scatter then all-gather, N-1 steps each.

Chunk layout: a vector of ``count`` elements is cut into N contiguous chunks;
chunk i is ``[offsets[i], offsets[i+1])`` with ``offsets`` from
:func:`chunk_offsets`. The first ``count % N`` chunks hold one element more
than the others, so chunks differ by at most one element and may be empty
when ``count < N``. After the reduce-scatter, rank r holds the reduced chunk r.

At step s of the reduce-scatter, rank r sends chunk (r-s-1) mod N to rank
r+1 and receives chunk (r-s-2) mod N from rank r-1, which it reduces into its
own copy. Each rank moves 2(N-1)/N * M bytes; T ~ 2(N-1) alpha + 2(N-1)/N * M/beta.
"""

from .layout import chunk_offsets, segment_offsets

__all__ = ["chunk_offsets", "reduce_scatter", "all_gather", "allreduce"]


def reduce_scatter(coll, src, partial, result):
    """Ring reduce-scatter of ``src`` (read only) into ``result`` (this rank's chunk).

    Intermediate partial sums go to their chunk's place in ``partial`` (a
    full-length vector, which may be ``src`` itself when in place), or to two
    one-chunk scratch buffers in turn when ``partial`` is None. Each step moves its chunk
    in segments (:func:`segment_offsets` of the largest chunk, the same count for
    every chunk), each reduced as it arrives (:meth:`Collective.sendrecv_combine`).
    """
    n, rank = coll.size, coll.rank
    offsets = chunk_offsets(src.size, n)
    if n == 1:
        coll.start_in(src, result)
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    parts = len(segment_offsets(offsets[1], src.itemsize)) - 1
    first = (rank - 1) % n
    outgoing = src[offsets[first]:offsets[first + 1]]
    for step in range(n - 1):
        c = (rank - step - 2) % n
        lo, hi = offsets[c], offsets[c + 1]
        if step == n - 2:
            target = result
        elif partial is None:
            # two buffers in turn: this step writes its partial while still sending the last one
            target = coll.scratch(src.dtype, hi - lo, f"ring-partial-{step % 2}")
        else:
            target = partial[lo:hi]
        if parts == 1:
            coll.sendrecv_combine(outgoing, right, src[lo:hi], left, target)
        else:
            out_cuts, in_cuts = chunk_offsets(outgoing.size, parts), chunk_offsets(hi - lo, parts)
            for j in range(parts):
                a, b = in_cuts[j], in_cuts[j + 1]
                coll.sendrecv_combine(outgoing[out_cuts[j]:out_cuts[j + 1]], right,
                                      src[lo + a:lo + b], left, target[a:b])
        outgoing = target


def all_gather(coll, buf):
    """Ring all-gather in place: ``buf`` holds this rank's chunk at its place and ends whole.

    At step s rank r forwards chunk (r-s) mod N to rank r+1 and receives
    chunk (r-s-1) mod N from rank r-1.
    """
    n, rank = coll.size, coll.rank
    offsets = chunk_offsets(buf.size, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        s, r = (rank - step) % n, (rank - step - 1) % n
        coll.sendrecv(buf[offsets[s]:offsets[s + 1]], right, buf[offsets[r]:offsets[r + 1]], left)


def allreduce(coll, sendbuf, recvbuf):
    offsets = chunk_offsets(sendbuf.size, coll.size)
    own = recvbuf[offsets[coll.rank]:offsets[coll.rank + 1]]
    reduce_scatter(coll, sendbuf, recvbuf, own)
    all_gather(coll, recvbuf)
