"""``python -m bench model``: the alpha-beta model of seed 000 for every algorithm.

alpha is a message's start-up time, beta a link's bandwidth, M the bytes per rank:
  ps        the workers stream their vectors to the root at once, in S segments, and the
            root sends the result back to one worker after another:
            max over workers (S alpha_w0 + M/beta_w0) + sum over workers (alpha_0w + M/beta_0w).
            Behind one root link (the seed's setting) both halves serialise instead:
            2(N-1)(alpha + M/beta); the links here are independent, as in a probe matrix.
  ring      2(N-1) steps, each as slow as the slowest ring link:
            2(N-1)(alpha_max + M/(N beta_min)) ~ 2(N-1)alpha + 2(N-1)/N M/beta
  tree      (binomial), bamtree, kmtree, pipelined in S = ceil(M / segment) segments of
            s = M/S bytes (``algorithms.layout``): t_l = alpha_l + s/beta_l for level l's
            slowest pair; fill the pipeline up and down, then one segment per t_max:
            2 sum over levels t_l + (S-1) max_l t_l  (S = 1: sum over levels 2(alpha + M/beta))
  dbtree    two binary trees (``topology.double_binary_trees``), each carrying M/2 in S segments
            of s bytes, one segment per tree and step on each of its links, both directions:
            S + 2H - 1 steps (H the taller tree's height), each as slow as the busiest
            directed link: the sum of alpha + s/beta over the trees using it
  rd        recursive doubling: per step the slowest pair exchanging M, log2 p steps
            (p the largest power of two <= N), plus the fold in and out when N > p
With a probe file, alpha and beta are per link (beta of a tree edge is its slower
direction); without one, ``--alpha-us`` and ``--beta-GBps`` describe uniform links.
"""

import argparse
import math
import sys


from algorithms.layout import SEGMENT_BYTES
from topology import BandwidthMatrix, build_tree, double_binary_trees, uniform

from .results import read_results
from .sizes import parse_size, sweep

ALGORITHMS = ("ps", "ring", "tree", "bamtree", "kmtree", "dbtree", "rd")
_TREE_METHODS = {"tree": "binomial", "bamtree": "bam", "kmtree": "km"}


class Model:
    """Predicted all-reduce times over the links of a :class:`BandwidthMatrix`."""

    def __init__(self, matrix):
        self.matrix = matrix
        self.n = matrix.size
        self.beta = matrix.bandwidth * 1e9          # B/s, i -> j
        self.alpha = matrix.latency * 1e-6          # s
        self.trees = {}

    def time(self, algorithm, nbytes):
        n, m = self.n, float(nbytes)
        if n == 1:
            return 0.0
        if algorithm == "ps":
            segments = max(1, math.ceil(m / SEGMENT_BYTES))
            up = max(segments * self.alpha[w, 0] + m / self.beta[w, 0] for w in range(1, n))
            return up + sum(self._link(0, w, m) for w in range(1, n))
        if algorithm == "ring":
            links = [(r, (r + 1) % n) for r in range(n)]
            alpha = max(self.alpha[i, j] for i, j in links)
            beta = min(self.beta[i, j] for i, j in links)
            return 2 * (n - 1) * (alpha + m / (n * beta))
        if algorithm == "rd":
            return self._recursive_doubling(m)
        if algorithm == "dbtree":
            return self._two_trees(m)
        return self._pipelined_tree(self.tree(algorithm), m)

    def _link(self, i, j, m):
        """Seconds to move ``m`` bytes from rank i to rank j."""
        return self.alpha[i, j] + m / self.beta[i, j]

    def _pipelined_tree(self, tree, m):
        segments = max(1, math.ceil(m / SEGMENT_BYTES))
        s = m / segments
        levels = [max(max(self._link(c, p, s), self._link(p, c, s)) for p, c in level) for level in tree.levels]
        return 2 * sum(levels) + (segments - 1) * max(levels)

    def _two_trees(self, m):
        trees = self.trees.get("dbtree")
        if trees is None:
            trees = self.trees["dbtree"] = double_binary_trees(self.n)
        segments = max(1, math.ceil(m / 2 / SEGMENT_BYTES))
        s = m / 2 / segments
        load = {}
        for tree in trees:
            for level in tree.levels:
                for p, c in level:
                    for i, j in ((p, c), (c, p)):
                        load[i, j] = load.get((i, j), 0.0) + self._link(i, j, s)
        height = max(max(t.heights()) for t in trees)
        return (segments + 2 * height - 1) * max(load.values())

    def _recursive_doubling(self, m):
        n = self.n
        p = 1 << (n.bit_length() - 1)
        extra = n - p
        real = [2 * v + 1 if v < extra else v + extra for v in range(p)]
        total = 0.0
        if extra:
            total += max(self._link(2 * i, 2 * i + 1, m) for i in range(extra))
            total += max(self._link(2 * i + 1, 2 * i, m) for i in range(extra))
        mask = 1
        while mask < p:
            total += max(max(self._link(real[v], real[v ^ mask], m), self._link(real[v ^ mask], real[v], m))
                         for v in range(p))
            mask <<= 1
        return total

    def tree(self, algorithm):
        if algorithm not in self.trees:
            self.trees[algorithm] = build_tree(self.matrix, root=0, method=_TREE_METHODS[algorithm])
        return self.trees[algorithm]

    def busbw(self, algorithm, nbytes):
        """Predicted busbw in GB/s: M / T x 2(N-1)/N."""
        t = self.time(algorithm, nbytes)
        return nbytes / t / 1e9 * 2 * (self.n - 1) / self.n if t > 0 else 0.0

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


def ring_seed_check(n=8, nbytes=14e9, beta_GBps=400, alpha_us=10):
    """The seed's worked example: (volume per rank in bytes, bandwidth term s, latency term s)."""
    volume = 2 * (n - 1) / n * nbytes
    return volume, volume / (beta_GBps * 1e9), 2 * (n - 1) * alpha_us * 1e-6


def main(argv):
    p = argparse.ArgumentParser(prog="python -m bench model", description=__doc__.splitlines()[0])
    p.add_argument("--topology", help="a probe file: per-link alpha and beta")
    p.add_argument("--ranks", type=int, help="rank count for uniform links (without --topology)")
    p.add_argument("--alpha-us", type=float, default=5.0, help="uniform start-up time (default 5 us)")
    p.add_argument("--beta-GBps", type=float, default=10.0, help="uniform link bandwidth (default 10 GB/s)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("256M"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("--algo", default=",".join(ALGORITHMS))
    p.add_argument("--results", nargs="*", default=[], help="our results files: measured beside predicted")
    args = p.parse_args(argv)
    try:
        if args.topology:
            matrix = BandwidthMatrix.load(args.topology)
        elif args.ranks:
            matrix = uniform(args.ranks, args.beta_GBps, args.alpha_us)
        else:
            raise ValueError("give --topology FILE, or --ranks N with --alpha-us and --beta-GBps")
        algos = args.algo.split(",")
        bad = [a for a in algos if a not in ALGORITHMS]
        if bad:
            raise ValueError(f"unknown --algo {','.join(bad)}; choices: {','.join(ALGORITHMS)}")
        sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
        measured = {}
        for path in args.results:
            for r in read_results(path):
                if r.get("collective", "allreduce") == "allreduce":
                    measured[(r["algorithm"], r["size"])] = r["out_of_place"]["time"]
        model = Model(matrix)
        for a in algos:
            if a in _TREE_METHODS:
                model.tree(a)
    except (ValueError, OSError) as exc:
        print(f"python -m bench model: {exc}", file=sys.stderr)
        return 2
    source = f"links of {args.topology}" if args.topology else \
        f"uniform links, alpha {args.alpha_us:g} us, beta {args.beta_GBps:g} GB/s"
    print(f"# alpha-beta model, {model.n} ranks, {source}")
    print(f"# predicted time (us) and busbw (GB/s){'; measured time (us) in brackets' if measured else ''}")
    print(f"{'size (B)':>12}" + "".join(f"  {a + ' us':>18}  {'GB/s':>7}" for a in algos))
    for size in sizes:
        line = f"{size:12d}"
        for a in algos:
            t = model.time(a, size) * 1e6
            seen = measured.get((a, size))
            text = f"{t:.2f}" + (f" [{seen:.1f}]" if seen is not None else "")
            line += f"  {text:>18}  {model.busbw(a, size):7.2f}"
        print(line)
    if "ring" in algos and "tree" in algos:
        cross = model.crossover("ring", "tree")
        print(f"# ring overtakes the binomial tree from {cross} bytes" if cross else
              "# ring never overtakes the binomial tree on these links")
    for a in algos:
        if a in _TREE_METHODS:
            tree = model.tree(a)
            print(f"# {a}: {tree.depth()} levels, bottlenecks (GB/s) "
                  + ", ".join(f"{b:.2f}" for b in tree.bottlenecks))
    return 0
