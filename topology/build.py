"""Growing trees level by level from a bandwidth matrix (the bottleneck-aware matching, BAM, tree).

U is the set of ranks already in the tree (at first the root), V the rest.
Each level is one bipartite matching between U and V on the link weights
(:meth:`BandwidthMatrix.links`); every matched pair (u, v) makes v a child
of u. With every link present, U doubles each level, so S ranks take
ceil(log2 S) levels and the last level usually has |U| > |V|. With missing
links a level matches as many pairs as it can, and the tree takes more levels.

A level finishes when its slowest pair does, so the predicted time of a
large all-reduce on a tree is sum over levels of 2 M / beta_level
(:func:`tree_cost`); BAM maximises each beta_level, KM each level's sum.
"""

import numpy as np

from .matching import bottleneck_matching, max_weight_matching
from .matrix import as_matrix
from .trees import Tree, binomial_tree

METHODS = ("bam", "km", "binomial")


def build_tree(bandwidth, root=0, method="bam"):
    """A :class:`Tree` over all ranks of ``bandwidth`` (a matrix, an S x S array or a file path).

    ``method``: ``"bam"`` (bottleneck matching), ``"km"`` (Kuhn-Munkres), or
    ``"binomial"`` (the fixed binomial tree, its bottlenecks read from the
    matrix). ``root="best"`` tries every root and keeps the tree of least
    :func:`tree_cost`. The tree's ``bottlenecks`` list each level's slowest link (GB/s).
    """
    matrix = as_matrix(bandwidth)
    links = matrix.links()
    size = matrix.size
    if method not in METHODS:
        raise ValueError(f"unknown tree method {method!r}; choices: {', '.join(METHODS)}")
    if isinstance(root, str) and root == "best":
        return min((_build(links, r, method) for r in range(size)), key=tree_cost)
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"root must be a rank of 0..{size - 1} or 'best', got {root!r}")
    return _build(links, int(root), method)


def _build(links, root, method):
    size = len(links)
    _check_reachable(links, root)
    if method == "binomial":
        tree = binomial_tree(size, root)
        for level in tree.levels:
            for parent, child in level:
                if links[parent, child] <= 0:
                    raise ValueError(f"the binomial tree needs the link {parent}-{child}, which is missing")
        tree.bottlenecks = [min(float(links[p, c]) for p, c in level) for level in tree.levels]
        return tree
    match = bottleneck_matching if method == "bam" else max_weight_matching
    inside, outside = [root], [r for r in range(size) if r != root]
    levels, bottlenecks = [], []
    while outside:
        pairs = match(links[np.ix_(inside, outside)])
        level = [(inside[i], outside[j]) for i, j in pairs]
        levels.append(level)
        bottlenecks.append(min(float(links[p, c]) for p, c in level))
        joined = {c for _, c in level}
        inside += [c for _, c in level]
        outside = [r for r in outside if r not in joined]
    return Tree.from_levels(size, root, levels, bottlenecks)


def _check_reachable(links, root):
    """Raise naming the ranks no path of links connects to ``root``."""
    seen = np.zeros(len(links), dtype=bool)
    seen[root] = True
    frontier = [root]
    while frontier:
        nxt = np.flatnonzero((links[frontier] > 0).any(axis=0) & ~seen)
        seen[nxt] = True
        frontier = list(nxt)
    if not seen.all():
        missing = [int(r) for r in np.flatnonzero(~seen)]
        raise ValueError(f"rank(s) {missing} cannot be reached from rank {root}: "
                         "no spanning tree exists over these links")


def tree_cost(tree):
    """Seconds per byte of a large all-reduce on ``tree``: sum over levels of 2 / beta_level
    (alpha-beta model, M >> alpha beta), with beta in GB/s; 0 for a single rank."""
    return sum(2.0 / (b * 1e9) for b in tree.bottlenecks if b > 0)
