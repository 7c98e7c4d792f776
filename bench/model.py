"""``python -m bench model``: predicted all-reduce time and busbw of every algorithm in the alpha-beta model.

One row per size and algorithm: the model's time and busbw, and with ``--results`` the
measured ones beside them and each measured busbw over native MPI's (``mpi``). Below the
table: where ring overtakes the binomial tree, and each tree's levels and slowest links.

alpha is a message's start-up time, beta a link's bandwidth, M the bytes per rank, N ranks:
  ps        the workers stream their vectors to the root at once, in S segments, and the
            root sends the result back to one worker after another:
            max over workers (S alpha_w0 + M/beta_w0) + sum over workers (alpha_0w + M/beta_0w).
            Behind a single link into the root both halves serialise instead:
            2(N-1)(alpha + M/beta); the links here are independent, as in a probe matrix.
  ring      2(N-1) steps, each as slow as the slowest ring link:
            2(N-1)(alpha_max + M/(N beta_min)) ~ 2(N-1)alpha + 2(N-1)/N M/beta
  tree      (binomial), bamtree, kmtree, pipelined in S = ceil(M / segment) segments of
            s = M/S bytes (algorithms.layout): t_l = alpha_l + s/beta_l for level l's
            slowest pair; fill the pipeline up and down, then one segment per t_max:
            2 sum over levels t_l + (S-1) max_l t_l  (S = 1: sum over levels 2(alpha + M/beta))
  dbtree    two binary trees (topology.double_binary_trees), each carrying M/2 in S segments
            of s bytes, one segment per tree and step on each of its links, both directions:
            S + 2H - 1 steps (H the taller tree's height), each as slow as the busiest
            directed link: the sum of alpha + s/beta over the trees using it
  rd        recursive doubling: per step the slowest pair exchanging M, log2 p steps
            (p the largest power of two <= N), plus the fold in and out when N > p
busbw = M / time x 2(N-1)/N, as nccl-tests reports it. With a probe file (--topology),
alpha and beta are per link (beta of a tree edge is its slower direction); without one,
--ranks, --alpha-us and --beta-GBps describe uniform links.
"""

import argparse
import math
import sys

from algorithms.layout import SEGMENT_BYTES
from topology import BandwidthMatrix, build_tree, double_binary_trees, uniform

from .compare import NATIVE
from .results import placement_time, read_results
from .sizes import parse_size, sweep
from .tables import comment, description, epilog, plural, ratio_text, significant, size_label, table

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


def model_table(model, algos, sizes, measured):
    """Cells per size and algorithm: predicted time and busbw; with ``measured`` also the
    measured ones and the measured busbw over native MPI's (which gets a row of its own)."""
    rows = []
    for size in sizes:
        native = measured.get((NATIVE, size), {}).get("bus_bw")
        for a in algos + ([NATIVE] if native is not None else []):
            row = [size_label(size), a]
            if a == NATIVE:
                row += ["-", "-"]  # not modelled
            else:
                row += [significant(model.time(a, size) * 1e6), significant(model.busbw(a, size))]
            seen = measured.get((a, size))
            if seen:
                row += [significant(placement_time(seen)), significant(seen["bus_bw"]),
                        ratio_text(seen["bus_bw"] / native) if native else "-"]
            elif measured:
                row += ["-", "-", "-"]
            rows.append(row)
    return rows


def notes(model, algos):
    """The comment lines after the table: ring against the binomial tree, each tree's levels."""
    lines = []
    if "ring" in algos and "tree" in algos:
        cross = model.crossover("ring", "tree")
        lines.append(f"ring overtakes the binomial tree from {size_label(cross)}" if cross else
                     "ring never overtakes the binomial tree on these links")
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
                   help="a probe file (python -m topology probe): per-link alpha and beta (default: uniform links)")
    p.add_argument("--ranks", type=int, help="rank count for uniform links (no default: needed without --topology)")
    p.add_argument("--alpha-us", type=float, default=5.0, help="uniform start-up time, in us (default 5)")
    p.add_argument("--beta-GBps", type=float, default=10.0, help="uniform link bandwidth, in GB/s (default 10)")
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
        measured, measured_ranks = measured_rows(args.results)
        model = Model(matrix)
        for a in algos:
            if a in _TREE_METHODS:
                model.tree(a)
    except (ValueError, OSError) as exc:
        print(f"python -m bench model: {exc}", file=sys.stderr)
        return 2
    print("\n".join(heading(args, model, measured_ranks)))
    header = ["size", "algorithm", "model time (us)", "model busbw (GB/s)"]
    if measured:
        header += ["measured time (us)", "measured busbw (GB/s)", f"vs {NATIVE}"]
    print("\n".join(table(header, model_table(model, algos, sizes, measured), left=(1,))))
    print("\n".join(notes(model, algos)))
    return 0


def heading(args, model, measured_ranks):
    """The comment lines above the table: the links, and what the measured columns are."""
    source = f"the links of {args.topology}" if args.topology else \
        f"uniform links, alpha {args.alpha_us:g} us, beta {args.beta_GBps:g} GB/s"
    lines = [comment(f"alpha-beta model of {plural(model.n, 'rank')}, {source}")]
    if args.results:
        lines.append(comment(f"measured (out-of-place): {', '.join(args.results)}; vs {NATIVE} = measured busbw / "
                             f"the measured busbw of native MPI ({NATIVE}) at the same size"))
    if measured_ranks - {model.n}:
        ran = ", ".join(map(str, sorted(measured_ranks)))
        lines.append(comment(f"note: the measured runs had {ran} ranks, the model {model.n}"))
    return lines
