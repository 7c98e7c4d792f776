"""``python -m topology probe|tree``.

* ``mpiexec -n N python -m topology probe -o FILE.json [-b 8M] [--reps 5] [--warmup 2] [--mode rounds|each]``
  measures every pair of ranks and writes the bandwidth matrix (rank 0 writes, atomically).
  An error or a signal on any rank ends every rank (:mod:`algorithms.ending`).
* ``python -m topology tree FILE.json [--method bam|km|binomial] [--root R|best]``
  prints the tree built from a matrix, level by level with each level's bottleneck.
"""

import argparse
import os
import sys

from .build import METHODS, build_tree, tree_cost
from .matrix import as_matrix
from .units import parse_size


class Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line, from rank 0 alone under mpiexec, and exit 2 (every rank parses the same argv)."""
        if os.environ.get("PMI_RANK", "0") == "0":
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def main(argv=None):
    parser = Parser(prog="python -m topology", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = commands.add_parser("probe", help="measure every pair of ranks (run under mpiexec)")
    p.add_argument("-o", "--output", required=True, help="the JSON file to write")
    p.add_argument("-b", "--bytes", type=parse_size, default=8 << 20, help="message size (default 8M)")
    p.add_argument("--reps", type=int, default=5,
                   help="timed repetitions, their 25th percentile kept (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions first (default 2)")
    p.add_argument("--mode", choices=("rounds", "each"), default="rounds",
                   help="rounds: disjoint pairs at once, N-1 rounds; each: one pair at a time")
    t = commands.add_parser("tree", help="print the tree built from a bandwidth matrix")
    t.add_argument("matrix", help="a file from 'probe'")
    t.add_argument("--method", choices=METHODS, default="bam")
    t.add_argument("--root", default="0", help="a rank, or 'best'")
    args = parser.parse_args(argv)

    if args.command == "probe":
        if args.bytes < 1 or args.reps < 1 or args.warmup < 0:
            p.error("need --bytes >= 1, --reps >= 1, --warmup >= 0")
        from algorithms.ending import run_together

        return run_together(lambda: probe_command(args), "python -m topology probe")

    try:
        matrix = as_matrix(args.matrix)
        root = args.root if args.root == "best" else int(args.root)
        tree = build_tree(matrix, root=root, method=args.method)
    except ValueError as exc:
        print(f"python -m topology tree: {exc}", file=sys.stderr)
        return 2
    print(f"# {args.method} tree over {matrix.size} ranks, root {tree.root}, {tree.depth()} levels, "
          f"predicted {tree_cost(tree) * 1e9:.3f} s/GB")
    for k, (level, slowest) in enumerate(zip(tree.levels, tree.bottlenecks)):
        pairs = " ".join(f"{p}->{c}" for p, c in level)
        print(f"level {k}: bottleneck {slowest:.3f} GB/s: {pairs}")
    return 0


def probe_command(args):
    """Check that ``-o`` can be written (rank 0, before measuring), probe, write the file."""
    from mpi4py import MPI

    from algorithms.ending import fail_together

    from .files import cannot_write, check_writable
    from .probe import probe, stderr_progress

    comm = MPI.COMM_WORLD
    problem = None
    if comm.Get_rank() == 0:
        try:
            check_writable(args.output)
        except OSError as exc:
            problem = f"-o {cannot_write(args.output, exc)}"
    if fail_together(comm, "python -m topology probe", problem):
        return 2
    matrix = probe(comm, args.bytes, args.reps, args.warmup, args.mode, stderr_progress, stderr_progress)
    if comm.Get_rank() == 0:
        matrix.save(args.output)
        print(f"wrote {args.output}: {matrix.size} ranks, {matrix.measured['rounds']} rounds, "
              f"{matrix.measured['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
