"""One-shot all-reduce through the node's shared memory: the small-message all-reduce of
TensorRT-LLM's and vLLM's custom all-reduce ("one-shot") and of MSCCL++.

Every rank copies its vector into its own buffer of a window the node's ranks share
(``MPI_Win_allocate_shared``: :mod:`.transports.boxes`; the entry points: :mod:`.posted`),
raises its call counter, waits until every other rank's counter has reached the call, then
reduces all N buffers itself, in rank order, straight into its result:
one synchronisation instead of log2 N (recursive doubling) or 2(N-1) (ring) message steps, and
no MPI call at all, so T ~ alpha_sync + (N-1) M / beta_mem. Every rank computes the same
combinations in the same order, so all get bit-identical results.

Each rank has two buffers, each with its call counter just before it, and uses them in turn,
call by call, so a rank may post call k+1 while a slower one still reads call k: the buffer it
overwrites held call k-1, which every rank had finished reading before it posted call k, and
this rank waited for those posts.
``MPI_Win_sync`` orders the data and the counters (MPI 4.1 section 12.7), except on x86-64, whose
stores reach other cores in program order and whose loads are not reordered with older loads
(total store order; Intel SDM vol. 3A, 9.2.2), where both syncs of a call, 0.3 us, are left out. A vector over one
buffer (``ALLREDUCE_ONESHOT_BYTES``, 64 KiB) goes in pieces, each piece a round. Every rank
reads every other rank's buffer, (N-1) M per rank, so it pays only for small vectors; where the
ranks span nodes, or for CuPy buffers, it is recursive doubling (:mod:`.recursive_doubling`).
Where the compiled engine runs plans of the vector's size it runs the same algorithm as a plan
(:func:`steps`) instead: every rank's vector to every other through the engine's channels, one
step, the same reduction order.
"""

import dataclasses
import math

from . import recursive_doubling
from ..runtime.copies import copy
from ..runtime.plan import one_step
from ..runtime.posted import ROUND_MESSAGES, all_to_all, over_boxes
from ..settings import setting
from ..runtime.transports.boxes import Boxes, wait


class OneShotWindow(Boxes):
    """The node's boxes for one-shot all-reduce (:class:`.transports.boxes.Boxes`): per rank two,
    each a call counter followed at once by a buffer of ``ALLREDUCE_ONESHOT_BYTES``, so a vector
    of up to 56 bytes travels with its counter in one cache line."""

    def __init__(self, comm):
        super().__init__(comm, "oneshot", "ALLREDUCE_ONESHOT_BYTES", "recursive doubling")

    def round_for(self, dtype, count):
        """``round(piece, out, coll)`` for pieces of ``count`` elements of ``dtype``: post the piece,
        wait for every rank's, reduce them all, in rank order, into ``out`` (which may be the piece)."""
        return self.kept((dtype, count), lambda: _round(self, dtype, count))


def _round(boxes, dtype, count):
    """:meth:`OneShotWindow.round_for`, its buffers' views found once."""
    views = boxes.typed(dtype, count)
    rest = tuple(v[2:] for v in views)
    me, mine, others, calls_made, copyto, sync = boxes.me, boxes.mine, boxes.others, boxes.calls, copy, boxes.sync

    def one_round(piece, out, coll):
        calls = calls_made[0] = calls_made[0] + 1
        which = calls & 1
        buffers = views[which]
        copyto(buffers[me], piece)
        if sync is not None:
            sync()  # the data before the counter
        mine[which][0] = calls
        for counter in others[which]:
            if counter[0] < calls:
                wait(counter, calls)
        if sync is not None:
            sync()  # the counters before the data
        combine = coll.combine
        combine(buffers[0], buffers[1], out)
        for view in rest[which]:
            combine(out, view, out)
    return one_round


def steps(size, rank, count, itemsize):
    """Its plan (:mod:`..runtime.plan`), which the compiled engine runs up to its threshold:
    :func:`..runtime.plan.one_step`, each rank's vector sent to every other through the engine's
    channels and all N reduced by every rank in rank order (the rounds' arithmetic, the same bits)."""
    return one_step(size, rank, count)


def schedule(model, m):
    """On one node, ceil(M/C) rounds (C the one-shot buffer), in each every rank reading every
    other's piece at once, a round starting in half a message's time (a counter in shared
    memory, no message): ceil(M/C)(alpha/2 + C/beta) where the reads share nothing but their
    links, (N-1) M/beta where each rank's memory takes its reads one after another; across
    nodes, recursive doubling."""
    if len(model.network.node_ranks()) > 1:
        return recursive_doubling.schedule(model, m)
    rounds = max(1, math.ceil(m / setting("ALLREDUCE_ONESHOT_BYTES")))
    return [(rounds, "round", all_to_all(model).time(m / rounds, ROUND_MESSAGES))]


# on device buffers it runs recursive doubling, whose messages are what it receives there
ALGORITHM = dataclasses.replace(over_boxes("oneshot", OneShotWindow, recursive_doubling.ALGORITHM, schedule,
                                           steps=steps), received=recursive_doubling.received)
