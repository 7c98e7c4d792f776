"""Tree all-reduce: reduce up a tree to its root, then broadcast back down, pipelined.

The trees are data (:class:`topology.Tree`): the binomial tree for ``"tree"``, the
bottleneck-matched tree for ``"bamtree"``, the Kuhn-Munkres tree for ``"kmtree"``, any
tree the caller passes, or the two trees of ``"dbtree"`` (:mod:`.double_tree`), each of
which carries its own share of the vector at the same time.

Each share moves in segments (:func:`layout.segment_offsets`) on a fixed schedule of
steps. At step i a rank of height h (leaves 0, a parent one more than its highest child)
sends segment i - h up, and a rank at depth d sends segment i - H - d down (H: the
root's height): each level works on its own segment, so segments flow up and down the
tree at once, and T ~ sum over levels 2 alpha_level + (S + 2H - 1) segment times instead
of sum over levels 2(alpha + M/beta_level) unpipelined (S segments; a matched tree's
slowest level sets the segment time). A step first starts its sends, which need nothing
of that step, then receives what the parent and children sent at the same step: a
child's segment is reduced as it arrives (:meth:`Collective.recv_combine`, straight from
the shared slot or the child's registered vector within a node), a result lands in the
receive buffer. So the ranks need no handshakes beyond the messages themselves, and two
trees over the same pair of ranks keep their messages apart: both ends of a link take
one step's messages in the same order (tree by tree), as MPI's ordering needs.
A leaf sends straight from the send buffer, so nothing is copied first.
"""

from ..runtime import engine
from ..algorithm import Algorithm
from ..runtime.layout import SEGMENT_BYTES, chunk_offsets, segment_offsets
from ..runtime.plan import isend, recv, recv_reduce, start_in, wait
from ..from_bandwidth import tree_for


def allreduce(coll, sendbuf, recvbuf, trees):
    """All-reduce over ``trees`` (a tuple of :class:`topology.Tree`); tree t carries share t of
    the vector (``chunk_offsets(size, len(trees))``). Runs :func:`steps`."""
    engine.run(coll, steps, sendbuf, recvbuf, trees)


def steps(size, rank, count, itemsize, trees):
    """This rank's plan (:mod:`.plan`) of the pipelined all-reduce over ``trees``: at each step
    of the schedule (the module docstring) first its sends, up (the partial sum, or a leaf's
    input) and down (the result, to each child), then its receives: each child's segment reduced
    as it arrives, in the order the children send, and the parent's result once this rank's
    send up of that segment is complete (the result lands where the partial sum was)."""
    shares = chunk_offsets(count, len(trees))
    roles = [_Role(rank, tree, shares[t], shares[t + 1], itemsize) for t, tree in enumerate(trees)]
    if all(role.parent < 0 and not role.children for role in roles):  # one rank
        return (start_in(count),)
    plan, handles, down = [], {}, []  # handles: (tree, segment) -> its send up's handle

    def named(key):
        handles[key] = len(handles) + len(down)
        return handles[key]

    for step in range(max(role.last_step for role in roles) + 1):
        for t, role in enumerate(roles):
            k = step - role.height
            if role.parent >= 0 and 0 <= k < role.segments:
                plan.append(isend(role.parent, role.segment("output" if role.children else "input", k),
                                  named((t, k))))
            k = step - role.down_from
            if role.children and 0 <= k < role.segments:
                for child in role.children:
                    down.append(len(handles) + len(down))
                    plan.append(isend(child, role.segment("output", k), down[-1]))
        for t, role in enumerate(roles):
            for first, (child, height) in enumerate(role.reduce_order):
                k = step - height
                if 0 <= k < role.segments:
                    acc = role.segment("input" if first == 0 else "output", k)
                    plan.append(recv_reduce(child, acc, role.segment("output", k)))
            k = step - role.down_from + 1
            if role.parent >= 0 and 0 <= k < role.segments:
                plan.append(wait(handles[t, k]))
                plan.append(recv(role.parent, role.segment("output", k)))
    if down:
        plan.append(wait(*down))
    return tuple(plan)


class _Role:
    """This rank's place in one tree, and the segments of that tree's share ``[lo, hi)``."""

    def __init__(self, rank, tree, lo, hi, itemsize):
        heights, depth = tree.heights(), tree.depth_of(rank)
        self.parent = tree.parent[rank]
        self.children = tree.children(rank)
        self.height = heights[rank]
        # children in the order their segments arrive: lowest first (they send earliest)
        self.reduce_order = sorted(((c, heights[c]) for c in self.children), key=lambda ch: ch[1])
        self.down_from = heights[tree.root] + depth  # segment k goes down at step k + H + d
        self.cuts = [lo + cut for cut in segment_offsets(hi - lo, itemsize)]
        self.segments = len(self.cuts) - 1
        self.last_step = self.segments - 1 + max(self.down_from, self.height)

    def segment(self, vector, k):
        """Segment k of this share as a slice of ``vector`` (``"input"`` or ``"output"``)."""
        return vector, self.cuts[k], self.cuts[k + 1]


_TREE_NAMES = {"binomial": "binomial", "bam": "bottleneck-matched (BAM)", "km": "Kuhn-Munkres (KM)"}
_CLOSED_FORMS = {
    "binomial": "L = ceil(log2 N) levels: 2L(alpha + s/beta) + (S-1)(alpha + L s/beta) on uniform links, so "
                "busbw tends to 2(N-1)/N beta/L: a tree never beats its ports.",
    "bam": "Its levels' bottleneck matchings (topology.matching) set each level's beta.",
    "km": "Its levels' Kuhn-Munkres matchings (the most bandwidth in sum) set each level's beta.",
}


def one_tree(size, rank, count, itemsize, tree):
    """:func:`steps` over the one tree ``tree``."""
    return steps(size, rank, count, itemsize, (tree,))


def built_by(name, method):
    """The tree all-reduce ``name``, registered with the ``topology.build_tree`` method that builds
    its tree: ``"binomial"``, ``"bam"`` (bottleneck-matched) or ``"km"`` (Kuhn-Munkres)."""
    def run(coll, sendbuf, recvbuf, tree=None):  # None: the binomial tree, which a call need not pass
        engine.run(coll, one_tree, sendbuf, recvbuf, tree_for(method, coll.size) if tree is None else tree)

    def schedule(model, m):
        return model.pipelined(("tree", method), [model.tree_edges(method)], m, SEGMENT_BYTES)

    def bind(coll, count, dtype):  # the binomial tree: a call passes none
        return engine.bound(coll, one_tree, count, dtype, tree_for(method, coll.size))

    schedule.__doc__ = f"""The {_TREE_NAMES[method]} tree, pipelined: level by level up then down, then one segment per
        period, in which every tree edge carries a segment up and one down at once
        (:meth:`topology.model.Model.pipelined`), so a rank with k children and a parent moves k+1
        segments through each port. {_CLOSED_FORMS[method]}"""

    def plan_input(size, matrix, nodes):
        return tree_for(method, size, bandwidth=matrix if method != "binomial" else None, name=name)

    return Algorithm(name, run, schedule=schedule, tree_method=method, steps=one_tree, plan_input=plan_input,
                     bind=bind if method == "binomial" else None)
