"""The bottleneck ring: the ring order of a bandwidth matrix whose slowest link is fastest.

A ring all-reduce moves a chunk over every link ``order[k] -> order[k+1]`` at each of its
2(N-1) steps at once, so a large one takes 2(N-1)/N M / b, with b the slowest of those links.
The best order maximises b: the bottleneck travelling-salesman problem (Gilmore and Gomory,
1964; Garfinkel and Gilbert, 1978). As BAM does for its matchings (:mod:`topology.matching`),
binary-search a threshold t over the sorted distinct weights for the largest t whose links
>= t still hold a Hamiltonian cycle:

* exact up to :data:`EXACT_RANKS` ranks: a dynamic programme over subsets (Bellman, 1962;
  Held and Karp, 1962), for every set of ranks containing rank 0 the bit mask of the ranks a
  path from 0 through exactly that set can end at, O(2^N N^2) bit operations per threshold;
* beyond, a depth-first search with Warnsdorff's rule (next the rank with the fewest ways
  on) and a budget of steps per threshold, and beside it the threshold bound: the largest t
  whose links >= t are strongly connected and hold a cycle cover (every rank one link out
  and one in, a perfect bipartite matching), which every Hamiltonian cycle needs. The ring
  found is reported with its gap to that bound.

The matrix is directed: a cycle and its reverse are different rings, and the search takes
whichever orientation is faster (both directions of every link are candidates).

Nodes of several ranks (the matrix's ``nodes``): every link between two nodes crosses their
ports (NICs), which the matrix's pairwise figures do not show, so a ring that enters a node
twice halves what its port gives each step. The ring then visits each node's ranks in one run,
entering and leaving every node once as NCCL's rings do: the nodes in the order of the
bottleneck ring over the links between them, and within each node a path through its ranks,
its own bottleneck ring cut at its slowest link. Its gap is reported against the bound of the
whole matrix. Where the ranks' own order is as fast as the ring found, it is kept: a
launcher's order usually follows the machines' layout, racks included, which no matrix of
pairs shows.
"""

from dataclasses import dataclass

import numpy as np

from .matrix import as_matrix

EXACT_RANKS = 16  # the subset programme up to this many ranks (2^16 masks)
SEARCH_BUDGET = 20000  # steps of the heuristic search per threshold
OWN_TOLERANCE = 0.02  # the ranks' own order is kept when its slowest link is this close to the best (probe noise)


@dataclass(frozen=True)
class Ring:
    """A ring ``order`` (starting at rank 0; rank ``order[k]`` sends to ``order[k+1]``),
    its slowest link ``bottleneck_GBps``, the ``bound_GBps`` no ring over the matrix can
    beat, and whether the order was found by the exact search."""

    order: tuple
    bottleneck_GBps: float
    bound_GBps: float
    exact: bool

    @property
    def gap(self):
        """How far below the bound the ring's bottleneck is (0: optimal)."""
        return 1.0 - self.bottleneck_GBps / self.bound_GBps if self.bound_GBps > 0 else 0.0


def ring_bottleneck(bandwidth, order):
    """The slowest link ``order[k] -> order[k+1]`` of a ring (the last back to the first), GB/s."""
    w = np.asarray(bandwidth, dtype=float)
    order = list(order)
    if len(order) < 2:
        return float("inf")
    return float(min(w[a, b] for a, b in zip(order, order[1:] + order[:1])))


def bottleneck_ring(bandwidth, exact_up_to=EXACT_RANKS):
    """The :class:`Ring` of ``bandwidth`` (a matrix, an S x S array or a file path) whose
    slowest link is fastest, each node's ranks in one run; ``ValueError`` when no ring exists
    over its links (> 0)."""
    matrix = as_matrix(bandwidth)
    w = np.array(matrix.bandwidth, dtype=float)
    np.fill_diagonal(w, 0.0)
    count = matrix.node_count
    if count in (1, len(w)):
        return _flat(w, exact_up_to)
    groups = [[r for r, node in enumerate(matrix.nodes) if node == k] for k in range(count)]
    firsts = [g[0] for g in groups]
    between = _flat(w[np.ix_(firsts, firsts)], exact_up_to)
    order = [rank for k in between.order for rank in _path(w, groups[k], exact_up_to)]
    start = order.index(0)
    order = order[start:] + order[:start]
    bottleneck = ring_bottleneck(w, order)
    bound = _threshold_bound(w, np.unique(w[w > 0]))
    return Ring(tuple(order), bottleneck, max(bound or 0.0, bottleneck), False)


def _path(w, ranks, exact_up_to):
    """A path through ``ranks``: their bottleneck ring cut at its slowest link."""
    if len(ranks) == 1:
        return list(ranks)
    ring = list(_flat(w[np.ix_(ranks, ranks)], exact_up_to).order)
    links = [w[ranks[a], ranks[b]] for a, b in zip(ring, ring[1:] + ring[:1])]
    cut = int(np.argmin(links)) + 1
    path = [ranks[i] for i in ring[cut:] + ring[:cut]]
    own = sorted(ranks)
    return own if _slowest(w, own) >= (1 - OWN_TOLERANCE) * _slowest(w, path) else path


def _slowest(w, path):
    return min(w[a, b] for a, b in zip(path, path[1:]))


def _flat(w, exact_up_to):
    """The bottleneck ring over every rank of ``w`` (zero diagonal), ignoring nodes."""
    n = len(w)
    if n == 1:
        return Ring((0,), float("inf"), float("inf"), True)
    weights = np.unique(w[w > 0])
    if n <= exact_up_to:
        found, _ = _search(weights, lambda t: _hamiltonian_exact(w >= t))
        if found is None:
            raise ValueError("no ring over these links: no cycle through every rank uses only links > 0")
        order = _or_own(w, found, ring_bottleneck(w, found))
        return Ring(order, ring_bottleneck(w, order), ring_bottleneck(w, found), True)
    bound = _threshold_bound(w, weights)
    if bound is None:
        raise ValueError("no ring over these links: no cycle through every rank uses only links > 0")
    own = list(range(n))
    if ring_bottleneck(w, own) >= bound:  # the ranks' own order reaches the bound: nothing beats it
        return Ring(tuple(own), ring_bottleneck(w, own), float(bound), False)
    found = _hamiltonian_search(w >= bound)  # often the bound itself: try it first
    if found is None:
        found, _ = _search(weights[weights < bound], lambda t: _hamiltonian_search(w >= t))
    if found is None:
        raise ValueError(f"no ring found over these links within {SEARCH_BUDGET} search steps per threshold")
    order = _or_own(w, found, ring_bottleneck(w, found))
    return Ring(order, ring_bottleneck(w, order), float(bound), False)


def _or_own(w, found, best):
    """The ranks' own order where it is as fast as ``found`` within :data:`OWN_TOLERANCE` (a
    launcher's order usually follows the machines' layout, racks included, which no matrix of
    pairs shows), else ``found``."""
    own = tuple(range(len(w)))
    return own if ring_bottleneck(w, own) >= (1 - OWN_TOLERANCE) * best else tuple(int(r) for r in found)


def _search(weights, test):
    """Binary search for the largest weight t at which ``test(t)`` finds a ring: (ring, t)."""
    lo, hi, best = 0, len(weights) - 1, (None, None)
    while lo <= hi:
        mid = (lo + hi) // 2
        ring = test(weights[mid])
        if ring is not None:
            best, lo = (ring, weights[mid]), mid + 1
        else:
            hi = mid - 1
    return best


def _hamiltonian_exact(edges):
    """A Hamiltonian cycle from rank 0 over the directed ``edges`` (N x N bool), or None.

    ``ends[mask]``: bit v set when a path from 0 visits exactly the ranks of ``mask`` (which
    holds 0) and ends at v; grown one rank at a time, popcount by popcount."""
    n = len(edges)
    into = [sum(1 << v for v in range(n) if edges[v, u]) for u in range(n)]  # who links into u
    masks = np.arange(1 << n, dtype=np.int64)
    ends = np.zeros(1 << n, dtype=np.int64)
    ends[1] = 1
    odd = masks[1::2]
    counts = _popcount(odd)
    for size in range(1, n):
        layer = odd[counts == size]
        layer = layer[ends[layer] != 0]
        reach = ends[layer]
        for u in range(1, n):
            bit = 1 << u
            ok = ((layer & bit) == 0) & ((reach & into[u]) != 0)
            ends[layer[ok] | bit] |= bit
    full = (1 << n) - 1
    last = int(ends[full]) & into[0]
    if not last:
        return None
    path, mask, here = [], full, last.bit_length() - 1
    while here != 0:
        path.append(here)
        mask ^= 1 << here
        here = (int(ends[mask]) & into[here]).bit_length() - 1
    return [0, *reversed(path)]


def _popcount(values):
    counts = np.zeros(len(values), dtype=np.int64)
    v = values.copy()
    while v.any():
        counts += v & 1
        v >>= 1
    return counts


def _hamiltonian_search(edges, budget=SEARCH_BUDGET, tries=4):
    """A Hamiltonian cycle from rank 0 over ``edges`` by depth-first search with Warnsdorff's
    rule (next the rank with the fewest unvisited ranks to go on to; none only for the last,
    which must link back to 0), ``tries`` times with ties broken at random (a fixed seed),
    giving up after ``budget`` steps in all: the cycle, or None."""
    n = len(edges)
    out = [[int(u) for u in np.flatnonzero(edges[v]) if u != v] for v in range(n)]
    rng = np.random.default_rng(0)
    for attempt in range(tries):
        tie = rng.permutation(n) if attempt else np.arange(n)
        found = _depth_first(out, n, budget // tries, tie)
        if found is not None:
            return found
    return None


def _depth_first(out, n, budget, tie):
    path, on_path, steps = [0], [False] * n, 0
    on_path[0] = True

    def choices(v):
        last = len(path) == n - 1
        ranked = []
        for u in out[v]:
            if on_path[u]:
                continue
            onward = sum(not on_path[x] for x in out[u])
            if onward or (last and 0 in out[u]):
                ranked.append((onward, tie[u], u))
        return [u for _, _, u in sorted(ranked)]

    stack = [iter(choices(0))]
    while stack:
        steps += 1
        if steps > budget:
            return None
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            on_path[path.pop()] = False
            continue
        path.append(nxt)
        on_path[nxt] = True
        if len(path) == n:
            return list(path)  # choices() let the last rank in only with its link back to 0
        stack.append(iter(choices(nxt)))
    return None


def _threshold_bound(w, weights):
    """The largest weight t whose links >= t are strongly connected and hold a cycle cover
    (necessary for a Hamiltonian cycle), or None."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components, maximum_bipartite_matching

    def possible(t):
        graph = csr_matrix(w >= t)
        strong, _ = connected_components(graph, directed=True, connection="strong")
        return strong == 1 and (maximum_bipartite_matching(graph, perm_type="column") >= 0).all()

    lo, hi, best = 0, len(weights) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if possible(weights[mid]):
            best, lo = float(weights[mid]), mid + 1
        else:
            hi = mid - 1
    return best
