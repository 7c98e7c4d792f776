"""``python -m topology probe|tree|report``.

* ``mpiexec -n N python -m topology probe -o FILE.json [-b 8M] [--reps 5] [--warmup 2] [--mode rounds|each]``
  measures every pair of ranks (between nodes, their leaders) and each node's ports, and writes
  the bandwidth matrix (rank 0 writes, atomically). An error or a signal on any rank ends every
  rank (:mod:`plumbing.ending`).
* ``python -m topology tree FILE.json [--method bam|km|binomial] [--root R|best]``
  prints the tree built from a matrix, level by level with each level's bottleneck.
* ``python -m topology report FILE.json [--threshold 0.7] [--asymmetry 1.5] [--heatmap PATH |
  --no-heatmap] [--json]`` prints the matrix's health (slow NICs, slow nodes, slow and
  asymmetric links, :mod:`topology.report`) and writes a heatmap PNG. Exits 0 with findings
  or without, 2 on a file it cannot read or a bad option, with one line on stderr.
"""

import json
import os
import sys

from plumbing.cli import Parser
from plumbing.ending import ask_thread_level, fail_together, run_together
from plumbing.files import cannot_write, check_writable
from plumbing.shm import settle_before_mpi_init
from plumbing.units import parse_size

from . import report
from .build import METHODS, build_tree, tree_cost
from .matrix import as_matrix
from .report import ASYMMETRY, THRESHOLD


def main(argv=None):
    parser = Parser(prog="python -m topology", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = commands.add_parser("probe", help="measure every pair of ranks (between nodes, their leaders) and the "
                                          "nodes' ports (run under mpiexec)")
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
    r = commands.add_parser("report", help="the health of a matrix: slow NICs, nodes and links; a heatmap PNG",
                            description="Print the health of a bandwidth matrix, a header line and one line per "
                                        "finding (slow NIC, slow node, slow link, asymmetric link; rules in "
                                        "topology/report.py and docs/topology.md), and draw its heatmap. Exits 0 "
                                        "with findings or without; 2, with one line on stderr, on a file it cannot "
                                        "read or a bad option.")
    r.add_argument("matrix", help="a file from 'probe' (versions 1 and 2)")
    r.add_argument("--threshold", type=float, default=THRESHOLD,
                   help=f"a link, node or port below this share of its median is slow (default {THRESHOLD})")
    r.add_argument("--asymmetry", type=float, default=ASYMMETRY,
                   help=f"a link whose two directions differ by more than this factor is asymmetric "
                        f"(default {ASYMMETRY})")
    where = r.add_mutually_exclusive_group()
    where.add_argument("--heatmap", metavar="PATH",
                       help="the PNG to write (default: the matrix file's name with .json replaced by .png, "
                            "beside it; FILE.png for a name without .json)")
    where.add_argument("--no-heatmap", action="store_true", help="write no PNG")
    r.add_argument("--json", action="store_true",
                   help="print one JSON object instead of text: the figures compared with, the options and "
                        "'findings', a list of objects with kind, node or nodes and ranks, value_GBps, ratio; "
                        "'not_judged', the nodes whose links within ran on more ranks than cores")
    args = parser.parse_args(argv)
    ask_thread_level()  # MPI_THREAD_SINGLE, before the probe starts MPI

    if args.command == "probe":
        if args.bytes < 1 or args.reps < 1 or args.warmup < 0:
            p.error("need --bytes >= 1, --reps >= 1, --warmup >= 0")
        return run_together(lambda: probe_command(args), "python -m topology probe")

    if args.command == "report":
        if not 0 < args.threshold <= 1:
            r.error(f"--threshold must be in (0, 1], got {args.threshold:g}")
        if not args.asymmetry > 1:
            r.error(f"--asymmetry must be above 1, got {args.asymmetry:g}")
        return report_command(args)

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


def report_command(args):
    """Print the findings of ``args.matrix`` (text or JSON) and write its heatmap."""
    name = "python -m topology report"
    try:
        matrix = as_matrix(args.matrix)
        found = report.findings(matrix, args.threshold, args.asymmetry)
    except ValueError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    path = None if args.no_heatmap else (args.heatmap or report.default_heatmap_path(args.matrix))
    if path:
        try:
            check_writable(path)  # before drawing
            report.heatmap(matrix, path, f"{os.path.basename(args.matrix)}: {matrix.size} ranks on "
                                         f"{matrix.node_count} node{'s' if matrix.node_count != 1 else ''}")
        except OSError as exc:
            print(f"{name}: --heatmap {cannot_write(path, exc)}", file=sys.stderr)
            return 2
    if args.json:
        data = {"file": args.matrix, **report.summary(matrix), "threshold": args.threshold,
                "asymmetry": args.asymmetry, "heatmap": path, "findings": found,
                "not_judged": report.oversubscribed(matrix)}
        print(json.dumps(data, indent=1))
    else:
        print("\n".join(report.lines(matrix, found, args.matrix, args.threshold, args.asymmetry)))
    if path:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def probe_command(args):
    """Check that ``-o`` can be written (rank 0, before measuring), probe, write the file."""
    refused = settle_before_mpi_init("python -m topology probe")  # before MPI starts
    if refused:
        return refused
    from mpi4py import MPI  # MPI starts here

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
        on = f" on {matrix.node_count} nodes" if matrix.node_count > 1 else ""
        print(f"wrote {args.output}: {matrix.size} ranks{on}, {matrix.measured['rounds']} rounds, "
              f"{matrix.measured['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
