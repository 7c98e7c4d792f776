"""Hierarchical all-reduce, as NCCL and Horovod run it on nodes of several GPUs: reduce-scatter
within each node, all-reduce each shard across the nodes, all-gather within each node.

Nodes. The ranks that share memory (``Split_type(COMM_TYPE_SHARED)``), or the nodes that
``ALLREDUCE_NODE_MAP`` names, one integer id per rank of the communicator (``0,0,1,1``; any
integers, in any order: ``1,0,1,0`` is two nodes of ranks {0, 2} and {1, 3}). Node k is the
k-th id in rank order; a rank's local rank is its place among its node's ranks, in rank order.
K nodes of n_0..n_{K-1} ranks; L = max n_k.

Shard layout. The vector is cut into L pieces (:func:`layout.chunk_offsets`, sizes differing
by at most one, the larger first). On node k piece p belongs to local rank p mod n_k, so on a
node of L ranks local rank i holds piece i, and on a smaller node a local rank holds several.
Every piece has exactly one owner on every node, so each element is reduced across the nodes
exactly once, among its piece's K owners.

1. Reduce-scatter within the node (the ring's, :func:`ring.reduce_scatter_steps`, among the
   node's ranks), in rounds of n_k consecutive pieces: a round's pieces are exactly the n_k ring chunks of their
   span (consecutive pieces are non-increasing sizes c+1..c, as ``chunk_offsets`` cuts), so the
   ring reduces them in place in the result vector. When n_k does not divide L, the last
   round's m < n_k pieces go through a scratch vector of n_k chunks of the largest piece's
   size, zero-padded (the padding and the n_k - m spare chunks are reduced and thrown away).
2. All-reduce of each owned piece across the nodes among that piece's owners (one per node,
   its index there the node's): the ring (:func:`ring.steps`), or with
   ``ALLREDUCE_HIER_ACROSS=bamtree`` the pipelined tree (:func:`tree.steps`) on the
   bottleneck-matched tree (``topology.build_tree(method="bam")``) over the inter-node matrix:
   the bandwidths between the nodes' first ranks, from the rank-level ``bandwidth=`` matrix.
   A rank that owns several pieces reduces them in increasing order, as every rank does, so
   the smallest unfinished piece always has all its owners at it: no cycle of waits.
3. All-gather within the node (:func:`ring.all_gather_steps`), in the same rounds.

With K nodes of n ranks each rank moves 2(n-1)/n M within its node and 2(K-1)/K M/n across,
so a node's port to the network carries 2(K-1)/K M, where a flat ring over the N = nK ranks
carries 2(N-1)/N M through every rank, and n of its steps per node cross the network.

The three stages are one plan of plans (:func:`steps`): each sub-plan, made for the node's
ranks or a piece's owners, relabelled onto their ranks in the communicator and onto the slices
it runs on (:func:`.plan.relabel`), so the whole runs on the caller's communicator through one
engine, and no communicator is made for a node or a piece. The node layout (:class:`Layout`) is
found once per communicator (collective the first time). ``avg`` is summed here and divided once
by the whole rank count by the caller (:meth:`Collective.finish`).

The halves on their own (:func:`reduce_scatter`, :func:`all_gather`) keep the standard layout,
chunk r of ``chunk_offsets(count, N)`` on rank r, whatever the nodes: the reduce-scatter reduces
within the node, then across the nodes among the ranks that hold partial sums of the same
chunks; the all-gather runs the same stages in reverse (see :class:`Packing`). They run rings
across the nodes, also with ``ALLREDUCE_HIER_ACROSS=bamtree`` (a tree reduces to one root).
"""

import functools
import math
import zlib
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from topology import BandwidthMatrix, build_tree
from topology.machine import node_numbers, numbered

from ..runtime import engine
from . import ring
from . import tree as tree_executor
from ..algorithm import Algorithm
from ..runtime.executor import private_comm
from ..runtime.layout import SEGMENT_BYTES, chunk_offsets
from ..runtime.plan import copy, relabel, start_in, zero
from ..from_bandwidth import from_bandwidth, matrix_key
from ..settings import WIRE, setting

__all__ = ["Layout", "Nodes", "Packing", "all_gather", "allreduce", "layout_of", "prepare",
           "reduce_scatter", "steps"]

RESOURCE = "hier"  # the name of the Layout among a Private's resources
#: what runs between the nodes (ALLREDUCE_HIER_ACROSS; the cost model's ``across``)
ACROSS = WIRE["ALLREDUCE_HIER_ACROSS"].choices
_NEEDS_BANDWIDTH = ("algorithm 'hier' with ALLREDUCE_HIER_ACROSS=bamtree builds its tree across nodes from "
                    "link bandwidths, and none was given: pass bandwidth= (an S x S matrix in GB/s, or a file "
                    "from 'python -m topology probe')")


def owners(members, piece):
    """The rank that holds ``piece`` on each node, in node order."""
    return [ranks[piece % len(ranks)] for ranks in members]


class Layout:
    """The node layout of a communicator (collective: built by every rank at once, through
    :meth:`Private.resource`): the node of each rank and each node's ranks; hier's plans run on
    the communicator itself, so no communicator is made for a node or a piece."""

    def __init__(self, comm):
        size, rank = comm.Get_size(), comm.Get_rank()
        given = setting("ALLREDUCE_NODE_MAP")
        self.across = setting("ALLREDUCE_HIER_ACROSS")
        if given and len(given) != size:
            # the map is agreed on by every rank (settings.agree_settings), so every rank raises this
            raise ValueError(f"ALLREDUCE_NODE_MAP has {len(given)} node id{'s' if len(given) != 1 else ''} "
                             f"({','.join(map(str, given))[:200]}) for a communicator of {size} rank"
                             f"{'s' if size != 1 else ''}: give one node id per rank")
        self.source = "ALLREDUCE_NODE_MAP" if given else "shared memory"
        self._trees = {}  # bandwidth key -> the BAM tree across nodes
        self._nodes = {}  # id of the tree across nodes -> the plan's Nodes
        self.nodes, self.members = numbered(list(given) if given else node_numbers(comm))
        self.rank, self.size = rank, size

    def describe(self):
        """What the JSON of a run records: node index per rank, the across choice, the source."""
        return {"nodes": list(self.nodes), "across": self.across, "source": self.source}

    def across_tree(self, bandwidth):
        """The tree across nodes (None: the ring); ``bandwidth`` from :func:`prepare`."""
        if self.across != "bamtree":
            return None
        if bandwidth is None:
            raise ValueError(_NEEDS_BANDWIDTH)
        if len(self.members) == 1:
            return None
        tree = self._trees.get(bandwidth.key)
        if tree is None:
            firsts = [ranks[0] for ranks in self.members]
            pick = np.ix_(firsts, firsts)
            matrix = bandwidth.matrix
            inter = BandwidthMatrix(matrix.bandwidth[pick], matrix.latency[pick], [matrix.hosts[r] for r in firsts])
            if len(self._trees) >= 16:
                self._trees.clear()
            tree = self._trees[bandwidth.key] = build_tree(inter, root=0, method="bam")
        return tree

    def plan_nodes(self, tree=None):
        """The :class:`Nodes` the plans run on with ``tree`` across the nodes, made once per tree."""
        nodes = self._nodes.get(id(tree))
        if nodes is None or nodes.tree is not tree:
            nodes = self._nodes[id(tree)] = Nodes(tuple(map(tuple, self.members)), tree)
        return nodes

    def free(self):
        """Nothing to free: kept as every resource of a :class:`Private` has one."""


def layout_of(comm=None):
    """The :class:`Layout` hier uses on ``comm`` (COMM_WORLD when None); collective the first time."""
    return private_comm(MPI.COMM_WORLD if comm is None else comm).resource(RESOURCE, Layout)


class Nodes(NamedTuple):
    """What hier's plan runs on: each node's ranks in rank order (the nodes in order of their
    first rank), and the tree across the nodes (None: rings)."""

    members: tuple
    tree: object = None


def steps(size, rank, count, itemsize, nodes):
    """This rank's plan (:mod:`.plan`), a plan of plans (:func:`.plan.relabel`): the node's ring
    reduce-scatter in rounds (:func:`_within_reduce_scatter`), each owned piece's ring (or tree)
    all-reduce among its owners across the nodes, in increasing order of piece, and the node's
    ring all-gather in the same rounds (:func:`_within_all_gather`); ``nodes``, a :class:`Nodes`."""
    members = nodes.members
    node = next(k for k, ranks in enumerate(members) if rank in ranks)
    local = members[node]
    n, i = len(local), local.index(rank)
    if size == 1 or count == 0:
        return (start_in(count),)
    pieces = max(len(ranks) for ranks in members)
    offsets = chunk_offsets(count, pieces)
    plan = list(_within_reduce_scatter(local, i, pieces, offsets, itemsize)) if n > 1 else \
        [start_in(count)]
    for piece in range(i, pieces, n) if len(members) > 1 else ():
        lo, hi = offsets[piece], offsets[piece + 1]
        if hi > lo:
            k = len(members)
            sub = ring.steps(k, node, hi - lo, itemsize) if nodes.tree is None else \
                tree_executor.one_tree(k, node, hi - lo, itemsize, nodes.tree)
            plan += relabel(sub, owners(members, piece), {"input": ("output", lo), "output": ("output", lo)})
    if n > 1:
        plan += _within_all_gather(local, i, pieces, offsets, itemsize)
    return tuple(plan)


def _within_reduce_scatter(local, i, pieces, offsets, itemsize):
    """The node's reduce-scatter (its ranks ``local``, this one local rank ``i``): each full round's
    span the ring's reduce-scatter, in place in the output, leaving this rank's piece reduced at
    its place; the last round's m < n pieces zero-padded into scratch, n chunks of the largest
    piece's size, reduce-scattered there, and this rank's piece copied out."""
    n = len(local)
    full, rest = _rounds(n, pieces, offsets)
    plan = []
    for first, lo, hi in full:
        if hi > lo:
            plan += relabel(ring.reduce_scatter_steps(n, i, hi - lo, itemsize, None, "partial"), local,
                            {"input": ("input", lo), "partial": ("output", lo), "output": ("output", offsets[first + i])})
    if rest is None or rest[2] == 0:
        return plan
    first, m, width = rest
    for t in range(m):
        lo, hi = offsets[first + t], offsets[first + t + 1]
        plan.append(copy(("input", lo, hi), ("scratch", t * width, t * width + hi - lo)))
        if hi - lo < width:
            plan.append(zero(("scratch", t * width + hi - lo, (t + 1) * width)))
    plan.append(zero(("scratch", m * width, n * width)))
    plan += relabel(ring.reduce_scatter_steps(n, i, n * width, itemsize, None, "input"), local,
                    {"input": ("scratch", 0), "output": ("scratch", i * width)})
    if i < m:
        lo, hi = offsets[first + i], offsets[first + i + 1]
        plan.append(copy(("scratch", i * width, i * width + hi - lo), ("output", lo, hi)))
    return plan


def _within_all_gather(local, i, pieces, offsets, itemsize):
    """From this local rank's pieces, reduced everywhere, to the whole vector on every rank of the
    node: the ring's all-gather of each full round, and of the last round through the padded scratch."""
    n = len(local)
    full, rest = _rounds(n, pieces, offsets)
    plan = []
    for _, lo, hi in full:
        if hi > lo:
            plan += relabel(ring.all_gather_steps(n, i, hi - lo, itemsize), local, {"output": ("output", lo)})
    if rest is None or rest[2] == 0:
        return plan
    first, m, width = rest
    if i < m:
        lo, hi = offsets[first + i], offsets[first + i + 1]
        plan.append(copy(("output", lo, hi), ("scratch", i * width, i * width + hi - lo)))
    plan += relabel(ring.all_gather_steps(n, i, n * width, itemsize), local, {"output": ("scratch", 0)})
    for t in range(m):
        if t != i:
            lo, hi = offsets[first + t], offsets[first + t + 1]
            plan.append(copy(("scratch", t * width, t * width + hi - lo), ("output", lo, hi)))
    return plan


def allreduce(coll, sendbuf, recvbuf, bandwidth=None):
    """:func:`steps` on the communicator's :class:`Layout` and tree across the nodes."""
    layout = coll.private.resource(RESOURCE, Layout)
    engine.run(coll, steps, sendbuf, recvbuf, layout.plan_nodes(layout.across_tree(bandwidth)))


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)`` with rings across the nodes (a call that passes no ``bandwidth=``),
    where the node layout is built already (it is built collectively: else the first call builds it)."""
    layout = coll.private.resources.get(RESOURCE)
    if layout is None or layout.across != "ring":
        return functools.partial(allreduce, coll)
    return engine.bound(coll, steps, count, dtype, layout.plan_nodes())


def plan_input(size, matrix, nodes):
    """The :class:`Nodes` of ``size`` ranks on nodes ``nodes`` (one id per rank), the tree across
    them built from ``matrix`` where ``ALLREDUCE_HIER_ACROSS=bamtree``."""
    _, members = numbered(nodes)
    tree = None
    if setting("ALLREDUCE_HIER_ACROSS") == "bamtree" and len(members) > 1:
        if matrix is None:
            raise ValueError(_NEEDS_BANDWIDTH)
        firsts = [ranks[0] for ranks in members]
        pick = np.ix_(firsts, firsts)
        tree = build_tree(BandwidthMatrix(matrix.bandwidth[pick], matrix.latency[pick]), root=0, method="bam")
    return Nodes(tuple(map(tuple, members)), tree)


def _rounds(n, pieces, offsets):
    """The full rounds' spans ``(first piece, lo, hi)``, and the last round's ``(first piece,
    pieces in it, largest piece)`` or None when n divides the piece count."""
    full = [(j * n, offsets[j * n], offsets[j * n + n]) for j in range(pieces // n)]
    first = pieces // n * n
    rest = (first, pieces - first, offsets[first + 1] - offsets[first]) if first < pieces else None
    return full, rest


class Packing:
    """Where the halves keep the chunks (of ``chunk_offsets(count, N)``) on K > 1 nodes of up to
    L > 1 ranks, in a scratch vector: piece p (of L) is K slots of w elements (w the largest
    chunk), slot k the chunk of node k's local rank p, or spare where node k has p ranks or
    fewer. Piece p is what its owners (:func:`owners`) hold, one per node: on a node of L ranks
    local rank i's piece holds the chunks of the local ranks i of every node; on a smaller node
    a local rank owns several pieces, its chunk in the first. So within a node of n ranks the
    pieces go as the all-reduce's shards, in ceil(L/n) rounds of n (the last padded with spare
    pieces), and across the nodes each piece is K equal chunks on its owners' ring, the node's
    index its rank there. Padding (a short chunk's last element, spare slots and pieces) is
    zeroed by the reduce-scatter, reduced like the rest and thrown away."""

    def __init__(self, members, rank, count):
        size = sum(len(ranks) for ranks in members)
        node_of = {r: k for k, ranks in enumerate(members) for r in ranks}
        local_of = {r: i for ranks in members for i, r in enumerate(ranks)}
        k, pieces = len(members), max(len(ranks) for ranks in members)
        self.node, self.local = node_of[rank], members[node_of[rank]]
        n, i = len(self.local), local_of[rank]
        offsets = chunk_offsets(count, size)
        w = self.slot = offsets[1] - offsets[0]
        self.piece = k * w
        rounds = -(-pieces // n)
        self.length = rounds * n * self.piece
        #: (lo, hi) of every rank's chunk in the vector, and where it starts here
        self.places = [(offsets[r], offsets[r + 1], (local_of[r] * k + node_of[r]) * w) for r in range(size)]
        spare = [(at + hi - lo, at + w) for lo, hi, at in self.places if hi - lo < w]
        spare += [((p * k + j) * w, (p * k + j + 1) * w) for p in range(pieces)
                  for j, ranks in enumerate(members) if len(ranks) <= p]
        spare.append((pieces * self.piece, self.length))
        self.spare = [(lo, hi) for lo, hi in spare if hi > lo]
        #: this node's rounds: (where the round's span starts, where this local rank's piece in it starts)
        span = n * self.piece
        self.rounds = [(j * span, j * span + i * self.piece) for j in range(rounds)]
        #: the pieces this rank owns, in increasing order: where each starts, and its owners across the nodes
        self.mine = [(p * self.piece, owners(members, p)) for p in range(i, pieces, n)]
        lo, hi, at = self.places[rank]
        self.own = (at, at + hi - lo)  # this rank's chunk, at the start of its slot


def _runs_flat(nodes):
    """Whether the ring's halves on the whole communicator are hier's: one node (the node in
    rank order), or one rank per node (the across ring in rank order)."""
    return len(nodes.members) == 1 or max(len(ranks) for ranks in nodes.members) == 1


def reduce_scatter_steps(size, rank, count, itemsize, nodes, partial="scratch"):
    """This rank's plan of the reduce-scatter, chunk r of the reduction on rank r: every rank's
    chunks packed into their slots in scratch (:class:`Packing`), the node's ring reduce-scatter
    of its rounds of pieces leaving each local rank its pieces reduced over the node, then each
    owned piece's ring reduce-scatter among its owners across the nodes, in increasing order (as
    the all-reduce's shards: no cycle of waits), leaving each rank its own slot reduced over every
    rank, copied out. On one node, or one rank per node, the ring's (its partial sums in
    ``partial``, :func:`.ring.reduce_scatter_steps`). Rings run across the nodes whatever
    ``ALLREDUCE_HIER_ACROSS``."""
    if _runs_flat(nodes):
        return ring.reduce_scatter_steps(size, rank, count, itemsize, None, partial)
    if count == 0:
        return ()
    pack = Packing(nodes.members, rank, count)
    n, i = len(pack.local), pack.local.index(rank)
    plan = [copy(("input", lo, hi), ("scratch", at, at + hi - lo)) for lo, hi, at in pack.places]
    plan += [zero(("scratch", lo, hi)) for lo, hi in pack.spare]
    if n > 1:
        for span, mine in pack.rounds:
            plan += relabel(ring.reduce_scatter_steps(n, i, n * pack.piece, itemsize, None, "input"), pack.local,
                            {"input": ("scratch", span), "output": ("scratch", mine)})
    k = len(nodes.members)
    for at, across in pack.mine:
        plan += relabel(ring.reduce_scatter_steps(k, pack.node, pack.piece, itemsize, None, "input"), across,
                        {"input": ("scratch", at), "output": ("scratch", at + pack.node * pack.slot)})
    lo, hi = pack.own
    plan.append(copy(("scratch", lo, hi), ("output", 0, hi - lo)))
    return tuple(plan)


def all_gather_steps(size, rank, count, itemsize, nodes):
    """This rank's plan of the all-gather in place on ``"output"``: the reduce-scatter's stages in
    reverse, copies only: this rank's chunk into its slot, each owned piece's ring all-gather across
    the nodes (in increasing order), the node's ring all-gather of its rounds of pieces, then every
    chunk from its slot to its place. On one node, or one rank per node, the ring's."""
    if _runs_flat(nodes):
        return ring.all_gather_steps(size, rank, count, itemsize)
    if count == 0:
        return ()
    pack = Packing(nodes.members, rank, count)
    n, i = len(pack.local), pack.local.index(rank)
    lo, hi, _ = pack.places[rank]
    plan = [copy(("output", lo, hi), ("scratch", *pack.own))]
    k = len(nodes.members)
    for at, across in pack.mine:
        plan += relabel(ring.all_gather_steps(k, pack.node, pack.piece, itemsize), across, {"output": ("scratch", at)})
    if n > 1:
        for span, _ in pack.rounds:
            plan += relabel(ring.all_gather_steps(n, i, n * pack.piece, itemsize), pack.local,
                            {"output": ("scratch", span)})
    plan += [copy(("scratch", at, at + hi - lo), ("output", lo, hi))
             for r, (lo, hi, at) in enumerate(pack.places) if r != rank]
    return tuple(plan)


def reduce_scatter(coll, src, partial, result, plan=None):
    """:func:`reduce_scatter_steps` on the communicator's nodes (``plan`` is not used)."""
    layout = coll.private.resource(RESOURCE, Layout)
    engine.reduce_scatter(coll, reduce_scatter_steps, src, partial, result, layout.plan_nodes())


def all_gather(coll, whole, plan=None):
    """:func:`all_gather_steps` on the communicator's nodes (``plan`` is not used)."""
    layout = coll.private.resource(RESOURCE, Layout)
    engine.all_gather(coll, all_gather_steps, whole, layout.plan_nodes())


class Bandwidth:
    """A rank-level bandwidth matrix checked for this communicator, with the checksum the
    agreement check compares (as a tree's :meth:`topology.Tree.digest`)."""

    def __init__(self, matrix, key):
        self.matrix, self.key = matrix, key
        self._digest = zlib.crc32(key) & 0x7FFFFFFF

    def digest(self):
        return self._digest


def prepare(size, tree=None, bandwidth=None, name="hier"):
    """What :func:`collectives.allreduce` passes on (``validate``): None, or the checked
    ``bandwidth`` for ``ALLREDUCE_HIER_ACROSS=bamtree``; ``ValueError`` for what does not fit."""
    if tree is not None:
        raise ValueError(f"algorithm {name!r} takes no tree; with ALLREDUCE_HIER_ACROSS=bamtree it builds "
                         "its tree across nodes from bandwidth=")
    across = setting("ALLREDUCE_HIER_ACROSS")
    if bandwidth is None:
        if across == "bamtree":
            raise ValueError(_NEEDS_BANDWIDTH)
        return None
    if across != "bamtree":
        raise ValueError(f"algorithm {name!r} takes bandwidth= only with ALLREDUCE_HIER_ACROSS=bamtree "
                         f"(it runs {across} across nodes)")
    return from_bandwidth(_checked, size, bandwidth)


def _checked(matrix):
    return Bandwidth(matrix, matrix_key(matrix))




def schedule(model, m):
    """L pieces of M/L (L the largest node's ranks); node k reduce-scatters (and all-gathers)
    them on its ring in ceil(L/n_k) rounds of n_k - 1 steps of a piece; the pieces cross the
    nodes in waves of the smallest node's n pieces, each piece on its owners' ring (or BAM
    tree, ``model.across``), the owners of a wave at once, sharing their nodes' ports. Nodes of
    R ranks: 2(R-1)(alpha_i + M/(R beta_i)) + 2(K-1)(alpha + M/(K beta)) on uniform links."""
    if model.across not in ACROSS:
        raise ValueError(f"hier across {model.across!r}: choices {', '.join(ACROSS)}")
    groups = _nodes(model)
    k, pieces = len(groups), max(len(g) for g in groups)
    piece = m / pieces
    within = _within(model, groups, 2, piece)
    parts = [(within[0], "within nodes", within[1])] if within else []
    if k == 1:
        return parts
    for w, label, owners_of in _waves(groups):
        if model.across == "ring":
            parts.append((2 * (k - 1), label, _across_ring(model, w, owners_of).time(piece / k)))
            continue
        edges = model.kept(("hier", "edges", w), lambda o=owners_of: _across_edges(model, groups, o))
        tree_parts = model.pipelined(("hier", "bamtree", w), [edges], piece, SEGMENT_BYTES)
        parts += [(c, f"{label}: {name}", t) for c, name, t in tree_parts]
    return parts


def half_schedule(model, m):
    """Within each node L-1 steps of M/L, then across the nodes K-1 steps of M/N on each
    local rank's ring, the L rings of a node sharing its port: (L-1)(alpha_i + M/(L beta_i)) +
    (K-1)(alpha + M/(K beta)) on uniform links with K nodes of L ranks, M the whole vector.

    The reduce-scatter's schedule and the all-gather's (the same stages in reverse). On one node,
    or one rank per node, the ring's halves (:data:`ring.half_schedule`). Nodes of different sizes
    (:class:`Packing`): pieces of K chunks of M/N, node k's ring ceil(L/n_k) rounds of n_k - 1
    steps of a piece; the pieces cross in waves of the smallest node's n, each on its owners'
    ring, K-1 steps of M/N. Rings run across the nodes whatever ``model.across``."""
    groups = _nodes(model)
    k, pieces = len(groups), max(len(g) for g in groups)
    if k == 1 or pieces == 1:
        return ring.half_schedule(model, m)
    slot = m / model.n
    within = _within(model, groups, 1, k * slot)
    parts = [(within[0], "within nodes", within[1])] if within else []
    return parts + [(k - 1, label, _across_ring(model, w, owners_of).time(slot))
                    for w, label, owners_of in _waves(groups)]


def _nodes(model):
    """hier's nodes on the model's network: their ranks, the nodes in order of their first rank."""
    return sorted(model.network.node_ranks(), key=lambda g: g[0])


def _within(model, groups, laps, nbytes):
    """(steps, PhaseTime) of the reductions within the nodes: on nodes of n ranks ``laps`` times
    ceil(L/n) rounds of n - 1 steps of ``nbytes``, the nodes of each size at once (no port between
    them), the size that takes longest; None where every node has one rank."""
    pieces = max(len(g) for g in groups)
    within = None
    for n in sorted({len(g) for g in groups} - {1}):
        rings = [g for g in groups if len(g) == n]
        phase = model.phase(("hier", "within", n), lambda rings=rings: (
            np.concatenate(rings), np.concatenate([np.roll(g, -1) for g in rings])))
        steps, t = laps * math.ceil(pieces / n) * (n - 1), phase.time(nbytes)
        if within is None or steps * t.seconds > within[0] * within[1].seconds:
            within = (steps, t)
    return within


def _waves(groups):
    """``(w, label, owners)`` of each wave of pieces across the nodes, the smallest node's n pieces
    at once: ``owners[j, k]`` the rank of node k that holds the wave's piece j (:func:`owners`)."""
    sizes = [len(g) for g in groups]
    pieces, wave = max(sizes), min(sizes)
    for w in range(math.ceil(pieces / wave)):
        owners_of = np.array([[g[p % len(g)] for g in groups] for p in range(w * wave, min(pieces, (w + 1) * wave))])
        yield w, "across nodes" if w == 0 else f"across nodes, wave {w + 1}", owners_of


def _across_ring(model, w, owners_of):
    """The phase of wave ``w``'s rings across the nodes: each piece's owners in node order."""
    return model.phase(("hier", "ring", w), lambda: (owners_of.ravel(), np.roll(owners_of, -1, axis=1).ravel()))


def _across_edges(model, groups, owners_of):
    """The (parent, child) rows of hier's BAM tree over the nodes (on the links between their
    first ranks, rooted at the node of rank 0), for each piece of a wave on its owners."""
    tree = model.kept(("hier", "bamtree"), lambda: build_tree(_between_nodes(model, groups), root=0, method="bam"))
    levels = []
    for level in tree.levels:
        pairs = np.array(level).reshape(-1, 2)
        levels.append(np.stack([owners_of[:, pairs[:, 0]].ravel(), owners_of[:, pairs[:, 1]].ravel()], axis=1))
    return np.concatenate(levels)


def _between_nodes(model, groups):
    if not model.network.has_matrix:
        return model.network.node_matrix()
    firsts = [int(g[0]) for g in groups]
    pick = np.ix_(firsts, firsts)
    return BandwidthMatrix(model.matrix.bandwidth[pick], model.matrix.latency[pick])


ALGORITHM = Algorithm("hier", allreduce, schedule=schedule, steps=steps, bind=bind, plan_input=plan_input,
                      prepare=prepare,
                      needs_bandwidth=lambda: setting("ALLREDUCE_HIER_ACROSS") == "bamtree",
                      reduce_scatter=reduce_scatter, all_gather=all_gather,
                      reduce_scatter_schedule=half_schedule, all_gather_schedule=half_schedule,
                      halves_take_no_plan=True)
