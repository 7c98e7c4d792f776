"""``python -m bench model``: predicted all-reduce time and busbw of every algorithm, with what limits each.

One row per size and algorithm: the model's time and busbw, what limits it (link, port,
uplink, or latency where the start-ups dominate), and with ``--results`` the measured time
and busbw beside them and each measured busbw over native MPI's (``mpi``). Below the table:
where ring overtakes the binomial tree, the lower bound at the largest size (of any
all-reduce on these links, :mod:`bench.lower_bound`: the traffic every rank or node must send
over what its ports carry, or M over the network's minimum cut), the resource that binds
each algorithm there, bamring's order, and each tree's levels and slowest links. Each row's
"x bound" is its time over that bound at its size.

Each algorithm is a sequence of phases, each phase a set of concurrent transfers. A
transfer's rate is its max-min fair share of its link, of the egress port (NIC) of its
node and the ingress port of the receiver's node (transfers between two ranks of one node
use no port), and of the up- and down-links of the racks it leaves and enters; a phase
takes alpha x (messages on the link) + bytes/rate of its slowest transfer. M is the bytes
per rank, N the ranks, S = ceil(M / segment) segments of s = M/S bytes (algorithms.layout).
The closed forms are those of uniform links: alpha, beta, every rank a node whose port is beta.
  ps      the workers stream their vectors to the root at once, S messages each, sharing its
          ingress port; the root sends the result to one worker after another:
          S alpha + (N-1) M/beta + (N-1)(alpha + M/beta)
  ring    2(N-1) steps, each rank sending M/N to the next (ranks in order, so only the links
          between consecutive nodes use ports, one transfer each): 2(N-1)(alpha + M/(N beta))
  bamring the ring in the order whose slowest link is fastest (topology.rings): the ring's
          closed form, its beta that slowest link
  tree    (binomial), bamtree, kmtree, pipelined: fill level by level, up then down, then one
          segment per period, in which every tree edge carries a segment up and one down at
          once, so a rank with k children and a parent moves k+1 segments through each port:
          sum over levels (up_l + down_l) + (S-1) period. Binomial, L = ceil(log2 N) levels,
          L children at the root: 2L(alpha + s/beta) + (S-1)(alpha + L s/beta), so busbw tends
          to 2(N-1)/N beta/L: a tree never beats its ports
  dbtree  two binary trees, each on M/2 in S segments of s bytes: S + 2H - 1 periods (H the
          taller tree's height), in each every edge of both trees carrying a segment both ways
  rd      recursive doubling: log2 p steps of all pairs exchanging M (p the largest power of
          two <= N), plus the fold in and out when N > p: (log2 p + 2[N > p])(alpha + M/beta)
  hier    a ring reduce-scatter within each node (R ranks, intra-node links alpha_i, beta_i),
          an all-reduce of each local rank's shard M/R across the K nodes, the R local ranks at
          once sharing their node's port (a ring, or with --hier-across bamtree a pipelined BAM
          tree over the nodes), then a ring all-gather within each node:
          2(R-1)(alpha_i + M/(R beta_i)) + 2(K-1)(alpha + M/(K beta)). Nodes of n_k ranks,
          L the largest: L pieces of M/L, ceil(L/n_k) rounds within node k, and the pieces
          cross the nodes in waves of the smallest node's n_k
  oneshot every rank reads every other rank's vector at once and reduces them all, in ceil(M/C)
          rounds of C = 64 KiB (one node; across nodes it is rd): ceil(M/C)(alpha + C/beta), where
          each rank's N-1 reads share nothing but their links
busbw = M / time x 2(N-1)/N, as nccl-tests reports it. With a probe file (--topology), alpha
and beta are per link, the nodes, ports, racks and uplinks those of the file; a node without
a port in the file gets its fastest link out and in as its port (--ports capacity). Without
one, --ranks N, --alpha-us and --beta-GBps describe uniform links: --ranks-per-node R
consecutive ranks a node (default 1: every rank its own node), each node's port --beta-GBps
out and in, the links within a node --intra-GBps (default 10 x beta).
"""

import argparse
import math
import sys
from dataclasses import dataclass, field

import numpy as np

from algorithms.layout import SEGMENT_BYTES
from algorithms.settings import setting
from topology import BandwidthMatrix, binomial_tree, build_tree, double_binary_trees
from topology.rings import bottleneck_ring, ring_bottleneck

from .compare import NATIVE
from .flows import Limit, Network, Phase, limit_of
from .lower_bound import LowerBound
from .results import placement_time, read_results
from .sizes import parse_size, sweep
from .tables import comment, description, epilog, plural, ratio_text, significant, size_label, table

ALGORITHMS = ("ps", "ring", "bamring", "tree", "bamtree", "kmtree", "dbtree", "rd", "hier", "oneshot")
_TREE_METHODS = {"tree": "binomial", "bamtree": "bam", "kmtree": "km"}
ONESHOT_BYTES = setting("ALLREDUCE_ONESHOT_BYTES")  # oneshot's buffer: a round per piece of it
ACROSS = ("ring", "bamtree")  # hier's all-reduce between the nodes


def segments(nbytes):
    """S: the pipeline segments of an ``nbytes`` vector (:data:`SEGMENT_BYTES` each at most)."""
    return max(1, math.ceil(nbytes / SEGMENT_BYTES))


@dataclass
class Estimate:
    """An algorithm's predicted ``seconds``: the sum of ``parts``, each (count, label,
    :class:`bench.flows.PhaseTime`): a phase run count times."""

    seconds: float
    parts: list = field(default_factory=list)

    @property
    def limit(self):
        """What the time is mostly made of (:class:`bench.flows.Limit`)."""
        if not self.parts:
            return Limit("none", "nothing moves")
        return limit_of([(count, phase) for count, _, phase in self.parts])

    def part(self, label):
        """The PhaseTime of the part named ``label`` (e.g. "period")."""
        return next(phase for _, name, phase in self.parts if name == label)


class Model:
    """Predicted all-reduce times on a :class:`BandwidthMatrix` (or a :class:`bench.flows.Network`):
    its links, and the ports and uplinks their transfers share (:mod:`bench.flows`).

    ``ports``: "capacity" (the file's ports, or each node's fastest link where it has none) or
    "file" (the file's ports only, unlimited where it has none). ``across``: hier's all-reduce
    between the nodes, "ring" or "bamtree"."""

    def __init__(self, matrix, ports="capacity", across="ring"):
        if across not in ACROSS:
            raise ValueError(f"hier across {across!r}: choices {', '.join(ACROSS)}")
        self.network = matrix if isinstance(matrix, Network) else Network.from_matrix(matrix, ports)
        self.n = self.network.n
        self.across = across
        self.trees = {}
        self._phases = {}
        self._bound = None

    @property
    def matrix(self):
        return self.network.matrix

    # ---- the public calls

    def time(self, algorithm, nbytes, across=None):
        """Predicted seconds of one all-reduce of ``nbytes`` per rank."""
        return self.estimate(algorithm, nbytes, across).seconds

    def limit(self, algorithm, nbytes, across=None):
        """What binds it: a :class:`bench.flows.Limit`, ``str()`` of which is "latency", "link",
        "port" or "uplink" and whose ``detail`` names the resource ("ingress port of node 0")."""
        return self.estimate(algorithm, nbytes, across).limit

    def busbw(self, algorithm, nbytes, across=None):
        """Predicted busbw in GB/s: M / T x 2(N-1)/N."""
        t = self.time(algorithm, nbytes, across)
        return nbytes / t / 1e9 * 2 * (self.n - 1) / self.n if t > 0 else 0.0

    def estimate(self, algorithm, nbytes, across=None):
        """The :class:`Estimate` of one all-reduce: its seconds and its phases."""
        m = float(nbytes)
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; choices: {', '.join(ALGORITHMS)}")
        if self.n == 1:
            return Estimate(0.0)
        if algorithm == "ps":
            parts = self._ps(m)
        elif algorithm in ("ring", "bamring"):
            pairs = self._phase((algorithm,), lambda: self._ring_pairs(algorithm))
            parts = [(2 * (self.n - 1), "step", pairs.time(m / self.n))]
        elif algorithm == "rd":
            parts = self._recursive_doubling(m)
        elif algorithm == "dbtree":
            parts = self._two_trees(m)
        elif algorithm == "hier":
            parts = self._hier(m, across or self.across)
        elif algorithm == "oneshot":
            parts = self._oneshot(m)
        else:
            parts = self._pipelined(("tree", algorithm), [np.concatenate(self._levels(algorithm))], m)
        return Estimate(sum(count * phase.seconds for count, _, phase in parts), parts)

    def tree(self, algorithm):
        """The :class:`topology.Tree` of ``tree``, ``bamtree`` or ``kmtree``, rooted at rank 0."""
        if algorithm not in self.trees:
            method = _TREE_METHODS[algorithm]
            if method == "binomial" and self.network.has_matrix:
                tree = build_tree(self.matrix, root=0, method="binomial")
            elif method == "binomial":  # uniform links: no matrix needed
                tree = binomial_tree(self.n)
                tree.bottlenecks = [self._slowest(level) for level in tree.levels]
            else:
                tree = build_tree(self.matrix, root=0, method=method)
            self.trees[algorithm] = tree
        return self.trees[algorithm]

    def lower_bound(self, nbytes):
        """The :class:`bench.lower_bound.Bound` no all-reduce of ``nbytes`` per rank can beat here."""
        if self._bound is None:
            self._bound = LowerBound(self.network)
        return self._bound.at(nbytes)

    def crossover(self, faster="ring", slower="tree"):
        """The smallest message size (bytes) from which ``faster`` beats ``slower``, or None."""
        def gap(m):
            return self.time(faster, m) - self.time(slower, m)
        if gap(1 << 50) >= 0:
            return None
        if gap(1) < 0:
            return 1
        lo, hi = 1.0, float(1 << 50)
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if gap(mid) >= 0 else (lo, mid)
        return int(math.ceil(hi))

    # ---- phases

    def _phase(self, key, build, concurrent=True):
        """The cached :class:`Phase` ``key``, of the (src, dst) arrays ``build()`` returns."""
        phase = self._phases.get(key)
        if phase is None:
            src, dst = build()
            phase = self._phases[key] = Phase(self.network, src, dst, concurrent)
        return phase

    def _levels(self, algorithm):
        """A tree's levels as arrays of (parent, child) rows, made once."""
        key = ("levels", algorithm)
        if key not in self._phases:
            self._phases[key] = [np.array(level).reshape(-1, 2) for level in self.tree(algorithm).levels]
        return self._phases[key]

    def _slowest(self, level):
        """A level's slowest link in GB/s, the slower direction of each pair."""
        pairs = np.array(level).reshape(-1, 2)
        up, _ = self.network.link(pairs[:, 1], pairs[:, 0])
        down, _ = self.network.link(pairs[:, 0], pairs[:, 1])
        return float(np.minimum(up, down).min()) / 1e9

    def ring_order(self, algorithm="bamring"):
        """The ring's order: the ranks' own for ``ring``, the bottleneck ring's for ``bamring``."""
        if algorithm == "ring" or not self.network.has_matrix:  # uniform links: every order alike
            return np.arange(self.n)
        if "bamring" not in self.trees:
            self.trees["bamring"] = bottleneck_ring(self.matrix)
        return np.array(self.trees["bamring"].order)

    def _ring_pairs(self, algorithm="ring"):
        order = self.ring_order(algorithm)
        return order, np.roll(order, -1)

    def _ps(self, m):
        workers = np.arange(1, self.n)
        root = np.zeros_like(workers)
        up = self._phase(("ps", "up"), lambda: (workers, root)).time(m, segments(m))
        down = self._phase(("ps", "down"), lambda: (root, workers), concurrent=False).time(m)
        return [(1, "up", up), (1, "down", down)]

    def _pipelined(self, key, forests, share):
        """Pipelined trees as :mod:`algorithms.tree` runs them, step by step: each of
        ``forests`` (arrays of (parent, child) rows: a tree, or disjoint trees) carries ``share``
        bytes in S segments of s bytes; at step i a rank of height h sends segment i - h up and a
        parent at depth d segment i - H - d down to each child (H its root's height). A step
        takes the phase of the transfers active in it; steps with the same transfers are one
        part ("period" where every transfer is active)."""
        count = segments(share)
        s = share / count
        src, dst, first = _schedule(forests)
        if not len(src):
            return []
        events = np.unique(np.concatenate([first, first + count]))
        parts = []
        for lo, hi in zip(events[:-1], events[1:]):
            active = (first <= lo) & (lo < first + count)
            if not active.any():
                continue
            label = "period" if active.all() else f"steps {lo}-{hi - 1}"
            phase = self._phase((*key, active.tobytes()), lambda a=active: (src[a], dst[a]))
            parts.append((int(hi - lo), label, phase.time(s)))
        return parts

    def _two_trees(self, m):
        trees = self.trees.get("dbtree")
        if trees is None:
            trees = self.trees["dbtree"] = double_binary_trees(self.n)
        forests = [np.array([pair for level in tree.levels for pair in level]).reshape(-1, 2) for tree in trees]
        return self._pipelined(("dbtree",), forests, m / 2)

    def _recursive_doubling(self, m):
        n = self.n
        p = 1 << (n.bit_length() - 1)
        extra = n - p
        real = np.array([2 * v + 1 if v < extra else v + extra for v in range(p)])
        parts = []
        if extra:
            evens = np.arange(extra) * 2
            parts.append((1, "fold in", self._phase(("rd", "in"), lambda: (evens, evens + 1)).time(m)))
        mask = 1
        while mask < p:
            v = np.arange(p)
            step = self._phase(("rd", mask), lambda v=v, k=mask: (real[v], real[v ^ k]))
            parts.append((1, f"step {mask}", step.time(m)))
            mask <<= 1
        if extra:
            parts.append((1, "fold out", self._phase(("rd", "out"), lambda: (evens + 1, evens)).time(m)))
        return parts

    def _oneshot(self, m):
        """oneshot as algorithms.oneshot runs it: on one node, ceil(M/C) rounds (C its buffer), in each
        every rank reading every other's piece at once; across nodes, recursive doubling."""
        if len(self.network.node_ranks()) > 1:
            return self._recursive_doubling(m)
        rounds = max(1, math.ceil(m / ONESHOT_BYTES))
        src, dst = (a.ravel() for a in np.meshgrid(np.arange(self.n), np.arange(self.n), indexing="ij"))
        phase = self._phase(("oneshot",), lambda: (src[src != dst], dst[src != dst]))
        return [(rounds, "round", phase.time(m / rounds))]

    def _hier(self, m, across):
        """hier as algorithms.hier runs it: L pieces of M/L (L the largest node's ranks); node k
        reduce-scatters (and all-gathers) them on its ring in ceil(L/n_k) rounds of n_k - 1 steps
        of a piece; the pieces cross the nodes in waves of the smallest node's n pieces, each
        piece on its owners' ring (or BAM tree), the owners of a wave at once."""
        if across not in ACROSS:
            raise ValueError(f"hier across {across!r}: choices {', '.join(ACROSS)}")
        groups = sorted(self.network.node_ranks(), key=lambda g: g[0])  # hier's nodes: by first rank
        k, sizes = len(groups), [len(g) for g in groups]
        pieces = max(sizes)
        piece = m / pieces
        parts = []
        within = None
        for n in sorted(set(sizes) - {1}):  # the nodes of n ranks, at once: no port between them
            rings = [g for g in groups if len(g) == n]
            phase = self._phase(("hier", "within", n), lambda rings=rings: (
                np.concatenate(rings), np.concatenate([np.roll(g, -1) for g in rings])))
            steps, t = 2 * math.ceil(pieces / n) * (n - 1), phase.time(piece)
            if within is None or steps * t.seconds > within[0] * within[1].seconds:
                within = (steps, t)
        if within:
            parts.append((within[0], "within nodes", within[1]))
        if k == 1:
            return parts
        wave = min(sizes)
        for w in range(math.ceil(pieces / wave)):
            owners = np.array([[g[p % len(g)] for g in groups] for p in range(w * wave, min(pieces, (w + 1) * wave))])
            label = "across nodes" if w == 0 else f"across nodes, wave {w + 1}"
            if across == "ring":
                ring = self._phase(("hier", "ring", w), lambda o=owners: (o.ravel(), np.roll(o, -1, axis=1).ravel()))
                parts.append((2 * (k - 1), label, ring.time(piece / k)))
                continue
            tree = self._across_tree(groups)
            levels = []
            for level in tree.levels:
                pairs = np.array(level).reshape(-1, 2)
                levels.append(np.stack([owners[:, pairs[:, 0]].ravel(), owners[:, pairs[:, 1]].ravel()], axis=1))
            tree_parts = self._pipelined(("hier", "bamtree", w), [np.concatenate(levels)], piece)
            parts += [(c, f"{label}: {name}", t) for c, name, t in tree_parts]
        return parts

    def _across_tree(self, groups):
        """hier's BAM tree over the nodes: on the links between their first ranks, root the node of rank 0."""
        tree = self.trees.get("hier-bamtree")
        if tree is None:
            if self.network.has_matrix:
                firsts = [int(g[0]) for g in groups]
                pick = np.ix_(firsts, firsts)
                between = BandwidthMatrix(self.matrix.bandwidth[pick], self.matrix.latency[pick])
            else:
                between = self.network.node_matrix()
            tree = self.trees["hier-bamtree"] = build_tree(between, root=0, method="bam")
        return tree


def _schedule(forests):
    """(src, dst, first step) of every transfer of pipelined ``forests`` (see
    :meth:`Model._pipelined`): up from each child at its height, down to each child at its
    root's height plus its parent's depth; a transfer is active from its first step for S steps."""
    src, dst, first = [], [], []
    for edges in forests:
        parent = {int(c): int(p) for p, c in edges}
        children = {}
        for p, c in edges:
            children.setdefault(int(p), []).append(int(c))
        depth, root = {}, {}
        order = [r for r in children if r not in parent]
        for r in order:
            depth[r], root[r] = 0, r
        for r in order:  # breadth first: parents before children
            for c in children.get(r, []):
                depth[c], root[c] = depth[r] + 1, root[r]
                order.append(c)
        height = {}
        for r in reversed(order):
            height[r] = 1 + max((height[c] for c in children.get(r, [])), default=-1)
        for c, p in parent.items():
            src += [c, p]
            dst += [p, c]
            first += [height[c], height[root[p]] + depth[p]]
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(first, dtype=np.int64)


def ring_worked_example(n=8, nbytes=14e9, beta_GBps=400, alpha_us=10):
    """The ring's worked example of 8 ranks with 14 GB at 400 GB/s and 10 us: (volume per
    rank in bytes, bandwidth term s, latency term s)."""
    volume = 2 * (n - 1) / n * nbytes
    return volume, volume / (beta_GBps * 1e9), 2 * (n - 1) * alpha_us * 1e-6


def measured_rows(paths):
    """{(algorithm, size): out-of-place dict (time us, bus_bw GB/s)} of our all-reduce rows in
    ``paths``, and the rank counts they ran on; ``ValueError`` for a file without any."""
    measured, ranks = {}, set()
    for path in paths:
        rows = [r for r in read_results(path) if r.get("collective", "allreduce") == "allreduce"
                and isinstance(r.get("out_of_place"), dict) and "algorithm" in r]
        if not rows:
            raise ValueError(f"--results {path}: no all-reduce rows of python -m bench (-J or --log)")
        for r in rows:
            measured[(r["algorithm"], r["size"])] = r["out_of_place"]
            ranks.update([r["ranks"]] if "ranks" in r else [])
    return measured, ranks


HEADER = ["size", "algorithm", "model us", "model GB/s", "limited by", "x bound"]
MEASURED_HEADER = ["measured us", "measured GB/s", "x bound", f"vs {NATIVE}"]
LEGEND = ("us: the time of one all-reduce; GB/s: its busbw; limited by: what binds in the model; "
          "x bound: the time over the lower bound of any all-reduce on these links (below the table)")


def model_cells(model, algorithm, size):
    """[time us, busbw GB/s, limited by, x bound] of the model, or dashes where it cannot model it."""
    try:
        estimate = model.estimate(algorithm, size)
    except ValueError:
        return ["-", "-", "-", "-"]
    t = estimate.seconds
    busbw = size / t / 1e9 * 2 * (model.n - 1) / model.n if t > 0 else 0.0
    return [significant(t * 1e6), significant(busbw), str(estimate.limit), bound_multiple(model, size, t)]


def bound_multiple(model, size, seconds):
    """``seconds`` as a multiple of the lower bound at ``size`` ("1.23x"), "-" where there is none."""
    try:
        bound = model.lower_bound(size).seconds
    except ValueError:
        return "-"
    return ratio_text(seconds / bound) if bound > 0 else "-"


def model_table(model, algos, sizes, measured):
    """Cells per size and algorithm: predicted time, busbw, what limits it and its multiple of
    the lower bound; with ``measured`` also the measured ones and the measured busbw over
    native MPI's (which gets a row of its own)."""
    rows = []
    for size in sizes:
        native = measured.get((NATIVE, size), {}).get("bus_bw")
        for a in algos + ([NATIVE] if native is not None else []):
            row = [size_label(size), a]
            row += ["-"] * 4 if a == NATIVE else model_cells(model, a, size)  # native: not modelled
            seen = measured.get((a, size))
            if seen:
                t = placement_time(seen)
                row += [significant(t), significant(seen["bus_bw"]), bound_multiple(model, size, t * 1e-6),
                        ratio_text(seen["bus_bw"] / native) if native else "-"]
            elif measured:
                row += ["-"] * 4
            rows.append(row)
    return rows


def notes(model, algos, largest=None):
    """The comment lines after the table: ring against the binomial tree, what binds each
    algorithm at the ``largest`` size, each tree's levels."""
    lines = []
    if "ring" in algos and "tree" in algos:
        cross = model.crossover("ring", "tree")
        lines.append(f"ring overtakes the binomial tree from {size_label(cross)}" if cross else
                     "ring never overtakes the binomial tree on these links")
    if largest:
        try:
            bound = model.lower_bound(largest)
            lines.append(f"lower bound at {size_label(largest)}: {significant(bound.seconds * 1e6)} us, "
                         f"{bound.kind}: {bound.detail}")
        except ValueError as exc:
            lines.append(f"no lower bound: {exc}")
        binds = []
        for a in algos:
            try:
                binds.append(f"{a}: {model.limit(a, largest).detail}")
            except ValueError as exc:
                binds.append(f"{a}: not modelled ({exc})")
        lines.append(f"at {size_label(largest)}, limited by " + "; ".join(binds))
    if "bamring" in algos and model.network.has_matrix and model.n > 1:
        model.ring_order("bamring")  # found once, kept in model.trees
        found = model.trees["bamring"]
        plain = ring_bottleneck(model.matrix.bandwidth, range(model.n))
        if list(found.order) == list(range(model.n)):
            where = "the ranks' own order"
        else:
            shown = " ".join(map(str, found.order[:16])) + (f" ... ({model.n} ranks)" if model.n > 16 else "")
            where = f"order {shown} (the ranks' own order: slowest link {significant(plain)} GB/s)"
        lines.append(f"bamring: {where}, slowest link {significant(found.bottleneck_GBps)} GB/s"
                     + ("" if found.exact else f", {found.gap:.1%} below the bound {significant(found.bound_GBps)}"))
    for a in algos:
        if a in _TREE_METHODS:
            tree = model.tree(a)
            lines.append(f"{a}: {plural(tree.depth(), 'level')}, "
                         f"{'bottleneck' if len(tree.bottlenecks) == 1 else 'bottlenecks'} (GB/s) "
                         + ", ".join(f"{b:.2f}" for b in tree.bottlenecks))
    return [comment(line) for line in lines]


def main(argv):
    p = argparse.ArgumentParser(prog="python -m bench model", description=description(__doc__),
                                epilog=epilog(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", metavar="FILE",
                   help="a probe file (python -m topology probe): per-link alpha and beta, nodes and ports "
                        "(default: uniform links)")
    p.add_argument("--ranks", type=int, help="rank count for uniform links (no default: needed without --topology)")
    p.add_argument("--ranks-per-node", type=int, default=1, metavar="R",
                   help="with --ranks: R consecutive ranks a node, sharing its port (default 1)")
    p.add_argument("--alpha-us", type=float, default=5.0, help="uniform start-up time, in us (default 5)")
    p.add_argument("--beta-GBps", type=float, default=10.0,
                   help="uniform link bandwidth between nodes, and each node's port, in GB/s (default 10)")
    p.add_argument("--intra-GBps", type=float,
                   help="with --ranks-per-node: link bandwidth within a node, in GB/s (default 10 x --beta-GBps)")
    p.add_argument("--ports", choices=("capacity", "file"), default="capacity",
                   help="with --topology, a node the file gives no port: capacity = as fast as its fastest "
                        "link out and in, file = no port limit (default capacity)")
    p.add_argument("--hier-across", choices=ACROSS, default="ring",
                   help="hier's all-reduce between the nodes (default ring)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"), metavar="SIZE",
                   help="smallest message, in bytes; K, M, G are powers of 1024 (default 8)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("256M"), metavar="SIZE",
                   help="largest message, in bytes; K, M, G are powers of 1024 (default 256M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between rows (default 4)")
    p.add_argument("--algo", default=",".join(ALGORITHMS),
                   help=f"comma list of algorithms to model (default {','.join(ALGORITHMS)})")
    p.add_argument("--results", nargs="*", default=[], metavar="FILE",
                   help="our -J documents or JSON-lines logs: measured time and busbw beside the model, "
                        "and the ratio to native MPI (default: none)")
    args = p.parse_args(argv)
    try:
        if args.topology:
            if args.ranks_per_node != 1 or args.intra_GBps is not None:
                raise ValueError("--ranks-per-node and --intra-GBps go with --ranks; a probe file has its own nodes")
            matrix = BandwidthMatrix.load(args.topology)
        elif args.ranks:
            if args.ranks_per_node < 1:
                raise ValueError("--ranks-per-node must be positive")
            matrix = Network.uniform(args.ranks, args.beta_GBps, args.alpha_us, args.ranks_per_node,
                                     args.intra_GBps)
        else:
            raise ValueError("give --topology FILE, or --ranks N with --alpha-us and --beta-GBps")
        algos = args.algo.split(",")
        bad = [a for a in algos if a not in ALGORITHMS]
        if bad:
            raise ValueError(f"unknown --algo {','.join(bad)}; choices: {','.join(ALGORITHMS)}")
        sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
        measured, measured_ranks = measured_rows(args.results)
        model = Model(matrix, ports=args.ports, across=args.hier_across)
        for a in algos:
            if a in _TREE_METHODS:
                model.tree(a)
    except (ValueError, OSError) as exc:
        print(f"python -m bench model: {exc}", file=sys.stderr)
        return 2
    print("\n".join(heading(args, model, measured_ranks)))
    header = HEADER + (MEASURED_HEADER if measured else [])
    print("\n".join(table(header, model_table(model, algos, sizes, measured), left=(1, 4))))
    print("\n".join(notes(model, algos, max(sizes))))
    return 0


def heading(args, model, measured_ranks):
    """The comment lines above the table: the links, the nodes and their ports, and what the
    measured columns are."""
    network = model.network
    source = f"the links of {args.topology}" if args.topology else \
        f"uniform links, alpha {args.alpha_us:g} us, beta {args.beta_GBps:g} GB/s"
    lines = [comment(f"alpha-beta model of {plural(model.n, 'rank')}, {source}")]
    k = network.node_count
    nodes = "every rank its own node" if k == model.n else \
        f"{plural(k, 'node')} of {'/'.join(sorted({str(len(g)) for g in network.node_ranks()}))} ranks"
    if not args.topology:
        if args.ranks_per_node > 1:
            nodes += f", links within a node {network.describe['intra_GBps']:g} GB/s"
        ports = f"each node's port {args.beta_GBps:g} GB/s out and in"
    elif network.matrix.ports is not None:
        ports = "the ports of the file"
    elif args.ports == "capacity":
        ports = "each node's port as fast as its fastest link out and in"
    else:
        ports = "no port limits"
    hier = f"; hier across nodes: {model.across}" if "hier" in args.algo.split(",") else ""
    lines.append(comment(f"{nodes}; {ports}, shared max-min fairly by the node's concurrent transfers{hier}"))
    if args.results:
        lines.append(comment(f"measured (out-of-place): {', '.join(args.results)}; vs {NATIVE} = measured busbw / "
                             f"the measured busbw of native MPI ({NATIVE}) at the same size"))
    if measured_ranks - {model.n}:
        ran = ", ".join(map(str, sorted(measured_ranks)))
        lines.append(comment(f"note: the measured runs had {ran} ranks, the model {model.n}"))
    lines.append(comment(LEGEND))
    return lines
