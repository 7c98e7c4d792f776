"""The bottleneck ring: the ring all-reduce (:mod:`.ring`) around the order of the measured
links whose slowest link is fastest (:func:`topology.rings.bottleneck_ring`, a bottleneck
travelling-salesman tour: exact up to 16 ranks, a search with its gap to the bound beyond).

A large ring all-reduce takes 2(N-1)/N M / b with b its slowest link, so on uneven links the
order is the whole difference: on links that are fast only between some pairs the ranks'
own order may cross the slowest link at every step. Takes ``bandwidth=`` (an S x S matrix in
GB/s, or a probe file); the order is found once per matrix and kept, and every rank that
reads the same matrix finds the same order (the agreement check compares its checksum).
"""

import zlib

import numpy as np

from topology.rings import bottleneck_ring

from . import ring
from ..algorithm import Algorithm
from ..from_bandwidth import from_bandwidth

_NEEDS_BANDWIDTH = ("algorithm {name!r} finds its ring order from link bandwidths, and none was given: pass "
                    "bandwidth= (an S x S matrix in GB/s, or a file from 'python -m topology probe')")


class RingOrder:
    """A ring order (a tuple of ranks) with the checksum the agreement check compares."""

    def __init__(self, ring_found):
        self.ring = ring_found
        self.order = tuple(int(r) for r in ring_found.order)
        self._digest = zlib.crc32(np.array(self.order, dtype=np.int64).tobytes()) & 0x7FFFFFFF

    def digest(self):
        return self._digest


def allreduce(coll, sendbuf, recvbuf, order):
    """The ring all-reduce around ``order`` (a :class:`RingOrder`)."""
    ring.allreduce(coll, sendbuf, recvbuf, order.order)


def steps(size, rank, count, itemsize, order):
    """The ring's plan (:func:`.ring.steps`) around ``order`` (a :class:`RingOrder`)."""
    return ring.steps(size, rank, count, itemsize, order.order)


def reduce_scatter(coll, src, partial, result, order):
    """The ring's reduce-scatter around ``order`` (a :class:`RingOrder`)."""
    ring.reduce_scatter(coll, src, partial, result, order.order)


def all_gather(coll, whole, order):
    """The ring's all-gather around ``order`` (a :class:`RingOrder`)."""
    ring.all_gather(coll, whole, order.order)


def prepare(size, tree=None, bandwidth=None, name="bamring"):
    """The :class:`RingOrder` of ``bandwidth`` for ``size`` ranks; ``ValueError`` for what does not fit."""
    if tree is not None:
        raise ValueError(f"algorithm {name!r} takes no tree; it finds its ring order from bandwidth=")
    if bandwidth is None:
        raise ValueError(_NEEDS_BANDWIDTH.format(name=name))
    return from_bandwidth(_ring_order, size, bandwidth)


def _ring_order(matrix):
    return RingOrder(bottleneck_ring(matrix))



def _found_order(model):
    """The model's bottleneck ring, or the ranks' own order on uniform links (every order alike)."""
    found = model.bottleneck_ring()
    return np.arange(model.n) if found is None else np.asarray(found.order, dtype=np.int64)


schedule = ring.schedule_around(_found_order, """The ring in the order whose slowest link is
    fastest (topology.rings): the ring's closed form, its beta that slowest link.""")

half_schedule = ring.half_schedule_around(_found_order, """One half of the ring in the order whose
    slowest link is fastest: (N-1)(alpha + M/(N beta)), its beta that slowest link.""")

# never run without its order (the common case of collectives.allreduce)
ALGORITHM = Algorithm("bamring", allreduce, schedule=schedule, steps=steps,
                      plan_input=lambda size, matrix, nodes: prepare(size, None, matrix), prepare=prepare, needs_bandwidth=lambda: True,
                      needs_plan=True, reduce_scatter=reduce_scatter, all_gather=all_gather,
                      reduce_scatter_schedule=half_schedule, all_gather_schedule=half_schedule)
