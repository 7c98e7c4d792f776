"""Bipartite matchings for building trees level by level (the bottleneck-aware matching, BAM).

``W`` is a |U| x |V| array of link bandwidths; a weight <= 0 means no link.
Every function returns a list of (i, j) pairs (row of U, column of V).

* :func:`bottleneck_matching` (BAM): among the maximum-cardinality matchings,
  one whose smallest weight is as large as possible (the bottleneck criterion):
  binary search over the sorted distinct weights for the largest threshold t
  such that the edges >= t still admit a maximum matching, each test a
  compiled Hopcroft-Karp (SciPy). Only the top edges are sorted: the search
  starts from the few largest edges and widens until a full matching exists.
* :func:`bottleneck_matching_reference`: BAM's original algorithm as first written
  (binary search + Hungarian DFS augmenting paths), readable and slow.
* :func:`max_weight_matching` (KM): among the maximum-cardinality matchings,
  one of largest weight sum, the baseline BAM is compared with.

All three accept |U| > |V|: they swap the roles of U and V, match, and swap back.
"""

import numpy as np


def _weights(W):
    try:
        w = np.array(W, dtype=float)
    except (TypeError, ValueError):
        raise ValueError("W must be a 2-D array of numbers") from None
    if w.ndim != 2:
        raise ValueError(f"W must be 2-D (|U| x |V|), got shape {w.shape}")
    if np.isnan(w).any():
        raise ValueError("W contains NaN")
    return w


def _swapped(match, w):
    """Run ``match`` with U the smaller side (the last level's case)."""
    if w.shape[0] > w.shape[1]:
        return [(i, j) for j, i in match(w.T)]
    return match(w)


def bottleneck_matching(W):
    """Maximum-cardinality matching maximising the minimum matched weight (BAM)."""
    return _swapped(_bam, _weights(W))


def _bam(w):
    from scipy.sparse import csr_matrix  # imported on first use: SciPy costs ~50 MB of memory
    from scipy.sparse.csgraph import maximum_bipartite_matching

    n_rows, n_cols = w.shape
    edges = int(np.count_nonzero(w > 0))
    if edges == 0:
        return []
    full = min(n_rows, n_cols)
    flat = w.ravel()

    def match(graph_rows, graph_cols):
        """Maximum matching on the given edges: (size, column of each row or -1)."""
        ones = np.ones(len(graph_rows), dtype=np.int8)
        mate = maximum_bipartite_matching(csr_matrix((ones, (graph_rows, graph_cols)), shape=w.shape),
                                          perm_type="column")
        return int(np.count_nonzero(mate >= 0)), mate

    # Candidates: every edge at least as heavy as the k-th heaviest, k widened until the
    # candidates hold a maximum matching (for dense matrices a few edges per rank suffice).
    k = min(edges, 4 * max(n_rows, n_cols))
    while True:
        floor = np.partition(flat, flat.size - k)[flat.size - k] if k < edges else 0.0
        rows, cols = np.nonzero(w >= floor) if floor > 0 else np.nonzero(w > 0)
        weights = w[rows, cols]
        order = np.argsort(-weights, kind="stable")
        rows, cols, weights = rows[order], cols[order], weights[order]
        target, best = match(rows, cols)
        if target == full or k == edges:
            break
        k = min(edges, 4 * k)

    # Binary search over the distinct candidate weights (descending) for the largest
    # threshold whose edges, a prefix of the sorted candidates, still match `target`.
    distinct = np.unique(weights)[::-1]
    prefix = len(weights) - np.searchsorted(weights[::-1], distinct, side="left")
    lo, hi = 0, len(distinct) - 1  # the lowest threshold (all candidates) is feasible
    while lo < hi:
        mid = (lo + hi) // 2
        n = int(prefix[mid])
        size, trial = match(rows[:n], cols[:n])
        if size == target:
            hi, best = mid, trial
        else:
            lo = mid + 1
    return [(int(i), int(j)) for i, j in enumerate(best) if j >= 0]


def bottleneck_matching_reference(W):
    """BAM's original algorithm: binary search on the sorted weights, Hungarian DFS for each
    threshold; success when the matching is as large as the maximum matching of all links."""
    return _swapped(_bam_reference, _weights(W))


def _bam_reference(w):
    n_rows, n_cols = w.shape

    def kuhn(threshold):
        match_col = [None] * n_cols

        def augment(u, visited):
            for v in range(n_cols):
                if not visited[v] and w[u][v] >= threshold:
                    visited[v] = True
                    if match_col[v] is None or augment(match_col[v], visited):
                        match_col[v] = u
                        return True
            return False

        count = sum(augment(u, [False] * n_cols) for u in range(n_rows))
        return count, [(u, v) for v, u in enumerate(match_col) if u is not None]

    levels = sorted({float(x) for x in w.ravel() if x > 0})
    if not levels:
        return []
    most, result = kuhn(levels[0])  # the maximum matching over all links
    low, high = 0, len(levels) - 1
    while low <= high:
        mid = (low + high) // 2
        count, pairs = kuhn(levels[mid])
        if count == most:
            low, result = mid + 1, pairs
        else:
            high = mid - 1
    return sorted(result)


def max_weight_matching(W):
    """Kuhn-Munkres: among maximum-cardinality matchings (over links only), the largest sum."""
    return _swapped(_km, _weights(W))


def _km(w):
    from scipy.optimize import linear_sum_assignment

    link = w > 0
    if not link.any():
        return []
    # A bonus larger than any possible weight sum makes cardinality dominate, then the sum.
    bonus = 1.0 + float(w[link].sum())
    gain = np.where(link, w + bonus, 0.0)
    rows, cols = linear_sum_assignment(gain, maximize=True)
    return [(int(i), int(j)) for i, j in zip(rows, cols) if link[i, j]]


def bottleneck(W, pairs):
    """The smallest weight among ``pairs`` (0 for an empty matching)."""
    w = np.asarray(W, dtype=float)
    return min((float(w[i, j]) for i, j in pairs), default=0.0)
