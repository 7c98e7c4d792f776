"""Spanning trees as plain data, the form the tree all-reduce executor runs.

A tree over ranks ``0..size-1`` is grown level by level (the BAM tree): level k is
a set of disjoint (parent, child) pairs in which every parent is already in
the tree and every child joins it. The reduce phase walks the levels from the
last to the first (children send to parents), the broadcast phase walks them
from the first to the last.
"""

import numbers
import zlib
from dataclasses import dataclass, field


@dataclass
class Tree:
    """A rooted spanning tree: ``root``, ``parent[rank]`` (``-1`` at the root) and ``levels``.

    ``levels[k]`` is a list of (parent, child) pairs, from the root down; no rank
    appears twice in one level. ``bottlenecks[k]``, when known, is level k's
    slowest link in GB/s. Construct with :meth:`from_levels`, which validates.
    """

    root: int
    parent: list
    levels: list
    bottlenecks: list = field(default_factory=list, compare=False)
    _children: list = field(default=None, compare=False, repr=False)
    _heights: list = field(default=None, compare=False, repr=False)
    _digest: int = field(default=None, compare=False, repr=False)

    @property
    def size(self):
        return len(self.parent)

    @classmethod
    def from_levels(cls, size, root, levels, bottlenecks=()):
        """Build and validate a tree over ``size`` ranks from its levels of (parent, child) pairs."""
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"tree size must be a positive integer, got {size!r}")
        if not 0 <= root < size:
            raise ValueError(f"tree root {root} is not a rank of 0..{size - 1}")
        parent = [None] * size
        parent[root] = -1
        frozen = []
        for k, level in enumerate(levels):
            seen = set()
            pairs = [(int(p), int(c)) for p, c in level]
            for p, c in pairs:
                for rank in (p, c):
                    if not 0 <= rank < size:
                        raise ValueError(f"tree level {k}: rank {rank} is not in 0..{size - 1}")
                    if rank in seen:
                        raise ValueError(f"tree level {k}: rank {rank} appears in two pairs")
                    seen.add(rank)
                if parent[p] is None:
                    raise ValueError(f"tree level {k}: parent {p} is not in the tree yet")
                if parent[c] is not None:
                    raise ValueError(f"tree level {k}: rank {c} is already in the tree")
            for p, c in pairs:
                parent[c] = p
            frozen.append(pairs)
        missing = [rank for rank, p in enumerate(parent) if p is None]
        if missing:
            raise ValueError(f"tree does not reach rank(s) {missing}")
        return cls(int(root), parent, frozen, [float(b) for b in bottlenecks])

    def children(self, rank):
        """Children of ``rank`` in the order they joined (earliest level first)."""
        if self._children is None:
            table = [[] for _ in self.parent]
            for level in self.levels:
                for p, c in level:
                    table[p].append(c)
            self._children = table
        return self._children[rank]

    def heights(self):
        """Each rank's height: 0 for a leaf, else one more than its highest child's."""
        if self._heights is None:
            heights = [0] * self.size
            for level in reversed(self.levels):  # a child joins after its parent: deepest first
                for p, c in level:
                    heights[p] = max(heights[p], heights[c] + 1)
            self._heights = heights
        return self._heights

    def depth_of(self, rank):
        """How many links lie between ``rank`` and the root."""
        depth = 0
        while rank != self.root:
            rank, depth = self.parent[rank], depth + 1
        return depth

    def depth(self):
        """Number of levels (communication steps of each phase)."""
        return len(self.levels)

    def digest(self):
        """A 31-bit checksum of the tree, so ranks can check they run the same one
        (computed once: the agreement check asks for it on every call)."""
        if self._digest is None:
            text = repr((self.root, [list(level) for level in self.levels]))
            self._digest = zlib.crc32(text.encode()) & 0x7FFFFFFF
        return self._digest


def binomial_tree(size, root=0):
    """The binomial tree: at level k each of the first 2**k ranks (relative to the root)
    takes the rank 2**k further on. ceil(log2 size) levels; time ~ 2 ceil(log2 N)(alpha + M/beta)."""
    levels = []
    span = 1
    while span < size:
        levels.append(
            [((v + root) % size, (v + span + root) % size) for v in range(span) if v + span < size]
        )
        span *= 2
    return Tree.from_levels(size, root, levels)


def double_binary_trees(size):
    """The two trees of NCCL's double binary tree (the two-tree scheme of Sanders, Speck and
    Traeff, Parallel Computing 35, 2009): each carries half of an all-reduce at the same time.

    The first is an in-order binary tree under rank 0: rank r > 0 with lowest set bit b
    hangs below r - b or r + b, whichever is a multiple of 2b but not of 4b (r - b when
    r + b is past the end), so odd ranks are leaves. The second is the first mirrored
    (r -> size-1-r) when ``size`` is even, which makes the odd ranks its inner nodes, or
    shifted by one rank when ``size`` is odd. Depth about log2 size each."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise ValueError(f"tree size must be a positive integer, got {size!r}")
    first = [-1] * size
    for r in range(1, size):
        low = r & -r
        up = (r ^ low) | (low << 1)
        first[r] = up if up < size else r ^ low
    if size % 2 == 0:
        second = [-1 if first[size - 1 - r] < 0 else size - 1 - first[size - 1 - r] for r in range(size)]
    else:
        second = [-1 if first[(r - 1) % size] < 0 else (first[(r - 1) % size] + 1) % size for r in range(size)]
    return _from_parents(first), _from_parents(second)


def _from_parents(parent):
    """The tree with these parents (``-1`` at the root) as levels: a rank's children join one
    level after another, in rank order, starting the level after the rank joined."""
    root = parent.index(-1)
    children = [[] for _ in parent]
    for rank, p in enumerate(parent):
        if p >= 0:
            children[p].append(rank)
    joined, order, levels = {root: -1}, [root], []
    for p in order:
        for i, c in enumerate(children[p]):
            level = joined[p] + 1 + i
            joined[c] = level
            order.append(c)
            levels.extend([] for _ in range(level + 1 - len(levels)))
            levels[level].append((p, c))
    return Tree.from_levels(len(parent), root, levels)
