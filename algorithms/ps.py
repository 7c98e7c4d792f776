"""Parameter server: every rank sends its vector to the root,
the root reduces the N-1 vectors it receives and sends the result back to each.

The root moves 2(N-1)M bytes, so T ~ 2(N-1)(alpha + M/beta). Workers send in
segments (:func:`layout.segment_offsets`); the root reduces each as it arrives
(:meth:`Collective.recv_combine`), so it needs at most one segment of workspace.
"""

import numpy as np

from .algorithm import Algorithm
from .layout import segment_offsets, segments

ROOT = 0


def allreduce(coll, sendbuf, recvbuf):
    cuts = segment_offsets(sendbuf.size, sendbuf.itemsize)
    if coll.rank != ROOT:
        for k in range(len(cuts) - 1):
            coll.send(sendbuf[cuts[k]:cuts[k + 1]], ROOT)
        coll.recv(recvbuf, ROOT)
        return
    coll.start_in(sendbuf, recvbuf)
    workers = range(1, coll.size)
    for k in range(len(cuts) - 1):
        partial = recvbuf[cuts[k]:cuts[k + 1]]
        for source in workers:
            coll.recv_combine(partial, source, partial)  # straight from the slot within a node
    for dest in workers:
        coll.send(recvbuf, dest)


def schedule(model, m):
    """The workers stream their vectors to the root at once, S messages each, sharing its
    ingress; the root sends the result to one worker after another:
    S alpha + (N-1) M/beta + (N-1)(alpha + M/beta) on uniform links."""
    workers = np.arange(1, model.n)
    root = np.zeros_like(workers)
    up = model.phase(("ps", "up"), lambda: (workers, root)).time(m, segments(m))
    down = model.phase(("ps", "down"), lambda: (root, workers), concurrent=False).time(m)
    return [(1, "up", up), (1, "down", down)]


ALGORITHM = Algorithm("ps", allreduce, schedule=schedule)
