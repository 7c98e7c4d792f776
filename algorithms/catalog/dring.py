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

Its reduce-scatter and all-gather on their own keep the one chunk layout of every algorithm
(chunk r of :func:`.layout.chunk_offsets` on rank r), so each chunk is cut in two instead: the
forward ring carries the first halves of every chunk, the backward ring the second halves, both
in flight at every step (the same step loop as the all-reduce), N-1 steps each:
T ~ (N-1)(alpha + M/(2N beta)) on per-pair links.

With ``bandwidth=`` (an S x S matrix or a probe file) the order is the bottleneck ring
(:func:`topology.rings.bottleneck_ring`, as ``bamring``) over the slower direction of each
link, min(B, B^T), since both directions are used; without it, the ranks' own order.
"""

import numpy as np

from topology import BandwidthMatrix
from topology.rings import bottleneck_ring

from ..runtime import engine
from . import ring
from ..algorithm import Algorithm
from .bamring import RingOrder
from ..runtime.layout import chunk_offsets, segment_offsets
from ..runtime.plan import irecv, irecv_reduce, isend, wait
from ..from_bandwidth import from_bandwidth


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


#: the vectors a step names, by index: the input, the partial sums (the all-reduce's result),
#: the reduce-scatter's result (this rank's chunk), and the reduce-scatter's spare pieces
#: (two a ring, in turn) where it has no whole-length vector for its partial sums
INPUT, PARTIAL, RESULT, SPARE = 0, 1, 2, 3


def _chunks(count, n, collective):
    """Each ring's N chunks as ``(lo, hi)``: for the all-reduce, the N chunks of each half of the
    vector; for its halves, the first and the second half of each chunk r of
    ``chunk_offsets(count, N)``, so that both rings end with the whole of chunk r on rank r."""
    if collective == "allreduce":
        half = chunk_offsets(count, 2)
        rings = [[half[h] + c for c in chunk_offsets(half[h + 1] - half[h], n)] for h in (0, 1)]
        return [list(zip(c, c[1:])) for c in rings]
    offsets = chunk_offsets(count, n)
    cuts = [lo + chunk_offsets(hi - lo, 2)[1] for lo, hi in zip(offsets, offsets[1:])]
    return [list(zip(offsets, cuts)), list(zip(cuts, offsets[1:]))]


def _piece(lo, hi, parts, j):
    """Piece j (of ``parts``, :func:`.layout.chunk_offsets`) of the chunk ``lo..hi``, a slice."""
    cuts = chunk_offsets(hi - lo, parts)
    return slice(lo + cuts[j], lo + cuts[j + 1])


def _reducing(n, own, chunks_pieces, orders, collective, spare):
    """The reduce-scatter steps of one piece of every chunk, both rings: per ring ``(vector
    sent, slice, vector reduced into, slice, slice of the input reduced with)``. Step s sends
    what step s-1 reduced (the input at step 0); the last step of a reduce-scatter reduces
    into its result, the others into the partial sums, or two spare pieces in turn."""
    steps, last = [], [None, None]
    for s, moves in enumerate(zip(*orders)):
        ways = []
        for way, (out, into) in enumerate(moves):
            sent, received = chunks_pieces[way][out], chunks_pieces[way][into]
            if collective == "reduce_scatter" and s == n - 2:
                target = (RESULT, slice(received.start - own, received.stop - own))
            elif spare:
                target = (SPARE + 2 * way + s % 2, slice(0, received.stop - received.start))
            else:
                target = (PARTIAL, received)
            source = (INPUT, sent) if s == 0 else last[way]
            ways.append((*source, *target, received))
            last[way] = target
        steps.append((True, *ways))
    return steps


def _both_rings(n, rank, count, itemsize, order, collective="allreduce", spare=False):
    """Every step of both rings, in order: ``(reducing, forward, backward)``, each ring's part
    ``(vector sent, slice, vector received into, slice, slice of the input reduced with)``, the
    vectors by index (:data:`INPUT` ...); per piece, the N-1 reduce-scatter steps and/or the
    N-1 all-gather steps (:mod:`.ring`) of ``collective``; with the longest piece, and this
    rank's neighbours."""
    forward = tuple(range(n)) if order is None else order
    rings = (forward, _reversed(forward))
    chunks = _chunks(count, n, collective)
    longest = max(hi - lo for way in chunks for lo, hi in way)
    parts = len(segment_offsets(longest, itemsize)) - 1
    own = chunk_offsets(count, n)[rank]
    gathered = INPUT if collective == "all_gather" else PARTIAL
    steps = []
    for j in range(parts):
        pieces = [[_piece(lo, hi, parts, j) for lo, hi in way] for way in chunks]
        if collective != "all_gather":
            orders = [ring._reduce_scatter_order(n, rank, way) for way in rings]
            steps += _reducing(n, own, pieces, orders, collective, spare)
        if collective != "reduce_scatter":
            orders = [ring._all_gather_order(n, rank, way) for way in rings]
            steps += [(False, *((gathered, pieces[way][out], gathered, pieces[way][into], None)
                                for way, (out, into) in enumerate(moves))) for moves in zip(*orders)]
    _, _, right, left = ring._ring(n, rank, forward)
    return tuple(steps), right, left, -(-longest // parts)


def _ranks(order):
    return None if order is None else order.order


def _as_plan(both, right, left, names, longest):
    """The steps of :func:`_both_rings` as a plan (:mod:`.plan`): at each, both receives posted
    (each reduced as it lands on a reduce-scatter step, straight from the slot within a node),
    both sends started, then all four waited for. ``names``: the plan's vector for each index
    (:data:`INPUT` ...); spare piece k is scratch from k times ``longest``."""
    def piece(vector, where):
        if vector >= SPARE:
            base = (vector - SPARE) * longest
            return "scratch", base + where.start, base + where.stop
        return names[vector], where.start, where.stop

    plan = []
    for reducing, (f_vec, f_out, f_into, f_in, f_acc), (b_vec, b_out, b_into, b_in, b_acc) in both:
        f_target, b_target = piece(f_into, f_in), piece(b_into, b_in)
        if reducing:  # each target a chunk neither ring sends at this step
            plan += [irecv_reduce(left, piece(INPUT, f_acc), f_target, 0),
                     irecv_reduce(right, piece(INPUT, b_acc), b_target, 1)]
        else:
            plan += [irecv(left, f_target, 0), irecv(right, b_target, 1)]
        plan += [isend(right, piece(f_vec, f_out), 2), isend(left, piece(b_vec, b_out), 3), wait(0, 1, 2, 3)]
    return tuple(plan)


def _ranks(order):
    return None if order is None else order.order


def steps(size, rank, count, itemsize, order=None):
    """This rank's plan of the all-reduce around the ranks' order or ``order`` (a
    :class:`.bamring.RingOrder`): :func:`_both_rings` as :func:`_as_plan` makes it, the partial
    sums in the output; on one or two ranks the ring's."""
    if size <= 2:
        return ring.steps(size, rank, count, itemsize, _ranks(order))
    both, right, left, longest = _both_rings(size, rank, count, itemsize, _ranks(order))
    return _as_plan(both, right, left, {INPUT: "input", PARTIAL: "output"}, longest)


def reduce_scatter_steps(size, rank, count, itemsize, order=None, partial="scratch"):
    """This rank's plan of the reduce-scatter: each chunk r of ``chunk_offsets(count, N)`` cut in
    two, the forward ring reducing the first halves and the backward ring the second, both in
    flight at every one of the N-1 steps, so rank r ends with both halves of chunk r in
    ``"output"``. Partial sums go to their place in ``partial`` (``"input"`` in place, or
    ``"partial"``), or to two pieces of scratch a ring in turn (``"scratch"``). On one or two
    ranks the ring's."""
    if size <= 2:
        return ring.reduce_scatter_steps(size, rank, count, itemsize, _ranks(order), partial)
    spare = partial == "scratch"
    both, right, left, longest = _both_rings(size, rank, count, itemsize, _ranks(order), "reduce_scatter", spare)
    return _as_plan(both, right, left, {INPUT: "input", PARTIAL: partial, RESULT: "output"}, longest)


def all_gather_steps(size, rank, count, itemsize, order=None):
    """This rank's plan of the all-gather in place on ``"output"``: the first half of each chunk
    forward, the second backward, both in flight at every one of the N-1 steps. On one or two
    ranks the ring's."""
    if size <= 2:
        return ring.all_gather_steps(size, rank, count, itemsize, _ranks(order))
    both, right, left, longest = _both_rings(size, rank, count, itemsize, _ranks(order), "all_gather")
    return _as_plan(both, right, left, {INPUT: "output"}, longest)


def allreduce(coll, sendbuf, recvbuf, order=None):
    """Both rings around the ranks' order, or ``order`` (a :class:`.bamring.RingOrder`): :func:`steps`."""
    engine.run(coll, steps, sendbuf, recvbuf, order)


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)`` around the ranks' order (a call that passes none)."""
    return engine.bound(coll, steps, count, dtype, None)


reduce_scatter = engine.planned_reduce_scatter(reduce_scatter_steps, """``reduce_scatter(coll, src, partial,
    result, order=None)``: both rings' reduce-scatter around the ranks' order, or ``order`` (a
    :class:`.bamring.RingOrder`): :func:`reduce_scatter_steps`, the partial sums in ``partial``
    (``src`` itself in place), or in scratch when it is None.""", None)

all_gather = engine.planned_all_gather(all_gather_steps, """``all_gather(coll, whole, order=None)``: both rings'
    all-gather in place around the ranks' order, or ``order``: :func:`all_gather_steps`.""", None)


def model_ring(model):
    """The model's bottleneck ring over both directions of each link (a
    :class:`topology.rings.Ring`), or None on uniform links, where the ranks' own order is run."""
    if not model.network.has_matrix:
        return None
    return model.kept("dring", lambda: bottleneck_ring(_both_ways(model.matrix)))


def _steps(model, m, count):
    """``count`` steps of both rings at once, each rank sending M/(2N) to each neighbour."""
    found = model_ring(model)
    order = np.arange(model.n) if found is None else np.asarray(found.order, dtype=np.int64)
    after = np.roll(order, -1)
    pairs = model.phase(("dring", order.tobytes()), lambda: (np.concatenate([order, after]),
                                                             np.concatenate([after, order])))
    return [(count, "step", pairs.time(m / (2 * model.n)))]


def schedule(model, m):
    """2(N-1) steps, each rank sending M/(2N) to each neighbour at once (the two rings' transfers
    in one phase, every direction of every link its own capacity, a node's ports shared by both):
    2(N-1)(alpha + M/(2N beta)) on uniform per-pair links; on 2 ranks the ring's."""
    if model.n <= 2:
        return ring.schedule(model, m)
    return _steps(model, m, 2 * (model.n - 1))


def half_schedule(model, m):
    """N-1 steps, each rank sending M/(2N) to each neighbour at once (the two rings' halves of
    every chunk): (N-1)(alpha + M/(2N beta)) on uniform per-pair links, M the whole vector; on
    2 ranks the ring's half."""
    if model.n <= 2:
        return ring.half_schedule(model, m)
    return _steps(model, m, model.n - 1)


# a matrix is optional: the ring's order
ALGORITHM = Algorithm("dring", allreduce, schedule=schedule, steps=steps, bind=bind,
                      plan_input=lambda size, matrix, nodes: prepare(size, None, matrix), prepare=prepare, accepts_bandwidth=True,
                      reduce_scatter=reduce_scatter, all_gather=all_gather, reduce_scatter_schedule=half_schedule,
                      all_gather_schedule=half_schedule)
