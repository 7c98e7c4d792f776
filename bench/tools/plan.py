"""``python -m bench plan --algo tree -n 8``: an algorithm's plan, each rank's steps in order, with
what the cost model prices each step at; ``-J FILE`` writes the plan as JSON (docs/algorithms.md#plans).

The plan is what the engine runs (``algorithms/runtime/plan.py``): for each rank, whom it sends which
slice of which vector to, and what it receives and reduces. The price of a step is how long it
keeps its rank in a replay of every rank's steps on the links (``topology/model/replay.py``):
uniform links of ``--alpha-us`` and ``--beta-GBps``, or the links of a probe file (``--topology``,
from which the matched trees and rings are built too). Needs no MPI.
"""

import sys

from algorithms.registry import REGISTERED
from algorithms.runtime.plan import as_json, elements, text
from plumbing.files import check_writable, write_json_atomically
from topology import BandwidthMatrix
from topology.model import Network
from topology.model.replay import replay

from ..core.cli import Parser, add_algo_flag, add_dtype_flag, algos_in

#: the algorithms written as plans, which this tool prints
PLANNED = tuple(name for name, record in REGISTERED.items() if record.steps is not None)


def main(argv):
    p = Parser(prog="python -m bench plan", description=__doc__.split("\n\n")[0].replace("``", "'"))
    add_algo_flag(p, None, f"the algorithm, one of {','.join(PLANNED)}")
    p.add_argument("-n", "--nranks", type=int, metavar="N", help="rank count (default: the --topology "
                   "file's, else needed)")
    p.add_argument("--count", type=int, metavar="C", help="elements per rank (default: one per rank, N)")
    add_dtype_flag(p, "float32", "the element type")
    p.add_argument("--topology", metavar="FILE", help="a probe file (python -m topology probe): its links price "
                   "the steps, and the matched trees are built from them")
    p.add_argument("--alpha-us", type=float, default=5.0, help="without --topology: start-up time per message, "
                   "in us (default 5)")
    p.add_argument("--beta-GBps", type=float, default=10.0, help="without --topology: link bandwidth, in GB/s "
                   "(default 10)")
    p.add_argument("--ranks-per-node", type=int, default=None, metavar="R",
                   help="without --topology: R consecutive ranks a node (hier's nodes; default 1, and oneshot and "
                        "twoshot their own one-node plans; given, where the ranks span nodes, the plan those two run "
                        "there)")
    p.add_argument("-J", "--json", metavar="FILE", help="write the plan as JSON (docs/algorithms.md#plans)")
    args = p.parse_args(argv)
    try:
        if args.json:
            check_writable(args.json)
        document, lines = plan_of(args)
    except (ValueError, OSError) as exc:
        print(f"python -m bench plan: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if args.json:
        write_json_atomically(args.json, document)
    return 0


def plan_that_runs(name, nodes):
    """The record whose plan runs for ``name`` on ranks on ``nodes``: an algorithm of one node's
    shared memory runs its ``across_nodes`` algorithm where they span nodes."""
    record = REGISTERED[name]
    if record.across_nodes is not None and len(set(nodes)) > 1:
        return REGISTERED[record.across_nodes]
    return record


def plan_of(args):
    """(the JSON document, the printed lines) of the plan ``args`` ask for."""
    named = algos_in(args.algo, {name: REGISTERED[name] for name in PLANNED}, "a plan", every=None)
    if len(named) != 1:
        raise ValueError(f"--algo {args.algo}: one algorithm, not {len(named)}")
    record, row = named[0], args.datatype
    asked = record.name
    matrix = BandwidthMatrix.load(args.topology) if args.topology else None
    n = args.nranks or (matrix.size if matrix is not None else None)
    if not n or n < 1:
        raise ValueError("give -n N (the rank count), or --topology FILE")
    if matrix is not None and matrix.size != n:
        raise ValueError(f"{args.topology} holds {matrix.size} ranks, not {n}")
    count = n if args.count is None else args.count
    if count < 0:
        raise ValueError("--count must not be negative")
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise ValueError("--ranks-per-node must be positive")
    per_node = args.ranks_per_node or 1
    itemsize = row.dtype.itemsize
    nodes = list(matrix.nodes) if matrix is not None else [r // per_node for r in range(n)]
    placed = matrix is not None or args.ranks_per_node is not None  # nodes the user gave, not the default
    runs = plan_that_runs(asked, nodes) if placed else record
    instead = [] if runs is record else [f"# {asked} runs {runs.name}'s plan where its ranks span nodes, as here"]
    record = runs
    extra = () if record.plan_input is None else (record.plan_input(n, matrix, nodes),)
    ranks = [record.steps(n, r, count, itemsize, *extra) for r in range(n)]
    if matrix is not None:
        network, links = Network.from_matrix(matrix), f"the links of {args.topology}"
    else:
        network = Network.uniform(n, args.beta_GBps, args.alpha_us, per_node)
        links = f"uniform links of alpha {args.alpha_us:g} us and beta {args.beta_GBps:g} GB/s"
    priced = replay(ranks, itemsize, network)
    lines = [f"# {asked} on {n} ranks, {count} {row.name} elements a rank ({count * itemsize} B), "
             f"priced on {links}",
             *instead, "# rank  step  price(us)  what"]
    for r, steps in enumerate(ranks):
        for k, (step, (start, end)) in enumerate(zip(steps, priced.steps[r])):
            lines.append(f"{r:6d}  {k:4d}  {(end - start) * 1e6:9.2f}  {text(step)}")
    moved = sum(elements(s.send) * itemsize for steps in ranks for s in steps if s.kind != "copy" and s.send)
    lines.append(f"# modelled time {priced.seconds * 1e6:.2f} us; {priced.messages} messages, {moved} B sent")
    document = as_json(record.name, count, itemsize, ranks)  # the plan that runs: its algorithm
    document.update(dtype=row.name, modelled_us=priced.seconds * 1e6,
                    step_us=[[(end - start) * 1e6 for start, end in times] for times in priced.steps])
    return document, lines
