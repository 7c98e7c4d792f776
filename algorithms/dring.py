"""Double ring all-reduce: two rings in opposite directions, each carrying half of the vector,
so every link between neighbours carries data both ways at once (NCCL's and the gradient-sync
literature's "double ring", 双环).

The vector is cut in two halves (:func:`.layout.chunk_offsets` with 2 parts); the first goes
around the ring (rank ``order[k]`` sends to ``order[k+1]``), the second around the same ring
reversed, each as the ring all-reduce runs (:mod:`.ring`: reduce-scatter then all-gather, N-1
steps each, pieces of a chunk at a time). At every step a rank posts both receives (from its
left neighbour for the first ring, from its right for the second) and both sends, then reduces
each piece as it lands: both directions of both links are in flight together, not one ring
after the other. Each chunk of each half is reduced along one chain, so every rank gets the
same bits; after the reduce-scatter rank r holds chunk r of both halves, as in the ring.

Where each direction of a link has its own capacity and each pair of ranks its own link (NVLink,
per-pair links), a step moves M/(2N) each way instead of M/N one way, so the bandwidth term
halves at the same 2(N-1) steps: T ~ 2(N-1) alpha + (N-1)/N M/beta. Where the ranks share a
NIC, both rings cross the same ports and nothing is gained. On 2 ranks the ring already uses
both directions of its one link, and this is the ring.

With ``bandwidth=`` (an S x S matrix or a probe file) the order is the bottleneck ring
(:func:`topology.rings.bottleneck_ring`, as ``bamring``) over the slower direction of each
link, min(B, B^T), since both directions are used; without it, the ranks' own order.
"""

import numpy as np

from topology import BandwidthMatrix
from topology.rings import bottleneck_ring

from . import ring
from .algorithm import Algorithm
from .bamring import RingOrder
from .layout import chunk_offsets
from .plans import from_bandwidth


def _both_ways(matrix):
    """``matrix`` with each link as fast as its slower direction (both directions in use)."""
    b = np.asarray(matrix.bandwidth, dtype=float)
    return BandwidthMatrix(np.minimum(b, b.T), matrix.latency, matrix.hosts, matrix.measured, matrix.nodes,
                           matrix.ports, matrix.racks, matrix.uplinks)


def _ring_order(matrix):
    return RingOrder(bottleneck_ring(_both_ways(matrix)))


def prepare(size, tree=None, bandwidth=None, name="dring"):
    """None (the ranks' order), or the :class:`.bamring.RingOrder` of ``bandwidth``."""
    if tree is not None:
        raise ValueError(f"algorithm {name!r} takes no tree; it may take its ring order from bandwidth=")
    return None if bandwidth is None else from_bandwidth(_ring_order, size, bandwidth)


def _reversed(order):
    """The same ring the other way round, from the same first rank."""
    return (order[0], *reversed(order[1:]))


def _plan(coll, count, dtype, order):
    """Every step of both rings, in order: ``(reducing, from_input, (sent, received) of the
    forward ring, (sent, received) of the backward ring)``, each a slice of the vectors;
    per piece, the N-1 reduce-scatter steps then the N-1 all-gather steps (:mod:`.ring`)."""
    n, rank = coll.size, coll.rank
    forward = tuple(range(n)) if order is None else order
    rings = (forward, _reversed(forward))
    half = chunk_offsets(count, 2)
    own = [chunk_offsets(half[h + 1] - half[h], n) for h in (0, 1)]  # each half's chunks
    parts = max(ring._parts(c, dtype.itemsize) for c in own)
    chunks = [[half[h] + c for c in own[h]] for h in (0, 1)]
    steps = []
    for j in range(parts):
        pieces = [[slice(lo, hi) for lo, hi in ring._pieces(c, parts, j)] for c in chunks]
        orders = [ring._reduce_scatter_order(n, rank, way) for way in rings]
        for index, (f, b) in enumerate(zip(*orders)):
            steps.append((True, index == 0, (pieces[0][f[0]], pieces[0][f[1]]), (pieces[1][b[0]], pieces[1][b[1]])))
        orders = [ring._all_gather_order(n, rank, way) for way in rings]
        for f, b in zip(*orders):
            steps.append((False, False, (pieces[0][f[0]], pieces[0][f[1]]), (pieces[1][b[0]], pieces[1][b[1]])))
    _, _, right, left = ring._ring(n, rank, forward)
    return tuple(steps), right, left


def _run(coll, sendbuf, recvbuf, order):
    steps, right, left = coll.plan(_plan, sendbuf.size, sendbuf.dtype, order)
    isend, irecv, combine, scratch = coll.isend, coll.irecv, coll.combine, coll.scratch
    for reducing, from_input, (f_out, f_in), (b_out, b_in) in steps:
        if reducing:
            source = sendbuf if from_input else recvbuf  # later steps send the partial sums
            f_buf = scratch(sendbuf.dtype, f_in.stop - f_in.start, "dring-forward")
            b_buf = scratch(sendbuf.dtype, b_in.stop - b_in.start, "dring-backward")
            f_recv, b_recv = irecv(f_buf, left), irecv(b_buf, right)
            sends = isend(source[f_out], right), isend(source[b_out], left)
            f_recv.Wait()
            combine(sendbuf[f_in], f_buf, recvbuf[f_in])
            b_recv.Wait()
            combine(sendbuf[b_in], b_buf, recvbuf[b_in])
        else:
            f_recv, b_recv = irecv(recvbuf[f_in], left), irecv(recvbuf[b_in], right)
            sends = isend(recvbuf[f_out], right), isend(recvbuf[b_out], left)
            f_recv.Wait()
            b_recv.Wait()
        for request in sends:
            request.Wait()


def allreduce(coll, sendbuf, recvbuf, order=None):
    """Both rings around the ranks' order, or ``order`` (a :class:`.bamring.RingOrder`); on
    one or two ranks the ring."""
    ranks = None if order is None else order.order
    if coll.size <= 2:
        ring.allreduce(coll, sendbuf, recvbuf, ranks)
    else:
        _run(coll, sendbuf, recvbuf, ranks)


def model_ring(model):
    """The model's bottleneck ring over both directions of each link (a
    :class:`topology.rings.Ring`), or None on uniform links, where the ranks' own order is run."""
    if not model.network.has_matrix:
        return None
    return model.kept("dring", lambda: bottleneck_ring(_both_ways(model.matrix)))


def schedule(model, m):
    """2(N-1) steps, each rank sending M/(2N) to each neighbour at once (the two rings' transfers
    in one phase, every direction of every link its own capacity, a node's ports shared by both):
    2(N-1)(alpha + M/(2N beta)) on uniform per-pair links; on 2 ranks the ring's."""
    if model.n <= 2:
        return ring.schedule(model, m)
    found = model_ring(model)
    order = np.arange(model.n) if found is None else np.asarray(found.order, dtype=np.int64)
    after = np.roll(order, -1)
    pairs = model.phase(("dring", order.tobytes()), lambda: (np.concatenate([order, after]),
                                                             np.concatenate([after, order])))
    return [(2 * (model.n - 1), "step", pairs.time(m / (2 * model.n)))]


# a matrix is optional: the ring's order
ALGORITHM = Algorithm("dring", allreduce, schedule=schedule, prepare=prepare, accepts_bandwidth=True)
