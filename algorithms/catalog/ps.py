"""Parameter server: every rank sends its vector to the root,
the root reduces the N-1 vectors it receives and sends the result back to each.

The root moves 2(N-1)M bytes, so T ~ 2(N-1)(alpha + M/beta). Workers send in
segments (:func:`layout.segment_offsets`); the root reduces each as it arrives
(:meth:`Collective.recv_combine`), so it needs at most one segment of workspace.
"""

import numpy as np

from ..runtime import engine
from ..algorithm import Algorithm
from ..runtime.layout import segment_offsets, segments
from ..runtime.plan import recv, recv_reduce, send, start_in

ROOT = 0


def steps(size, rank, count, itemsize):
    """This rank's plan (:mod:`.plan`): a worker sends its segments to the root and receives the
    result; the root reduces each worker's segments into its own as they arrive, segment by
    segment, worker by worker, then sends the result to each worker in turn."""
    cuts = segment_offsets(count, itemsize)
    pieces = [(lo, hi) for lo, hi in zip(cuts, cuts[1:])]
    if rank != ROOT:
        return (*(send(ROOT, ("input", lo, hi)) for lo, hi in pieces), recv(ROOT, ("output", 0, count)))
    plan = [start_in(count)]
    for lo, hi in pieces:
        plan += [recv_reduce(source, ("output", lo, hi), ("output", lo, hi)) for source in range(1, size)]
    plan += [send(dest, ("output", 0, count)) for dest in range(1, size)]
    return tuple(plan)


def allreduce(coll, sendbuf, recvbuf):
    engine.run(coll, steps, sendbuf, recvbuf)


def bind(coll, count, dtype):
    return engine.bound(coll, steps, count, dtype)


def schedule(model, m):
    """The workers stream their vectors to the root at once, S messages each, sharing its
    ingress; the root sends the result to one worker after another:
    S alpha + (N-1) M/beta + (N-1)(alpha + M/beta) on uniform links."""
    workers = np.arange(1, model.n)
    root = np.zeros_like(workers)
    up = model.phase(("ps", "up"), lambda: (workers, root)).time(m, segments(m))
    down = model.phase(("ps", "down"), lambda: (root, workers), concurrent=False).time(m)
    return [(1, "up", up), (1, "down", down)]


ALGORITHM = Algorithm("ps", allreduce, schedule=schedule, bind=bind, steps=steps)
