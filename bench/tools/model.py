"""``python -m bench model``: predicted all-reduce time and busbw of every algorithm, with what limits each.

One row per size and algorithm: the model's time and busbw, what limits it (link, port,
uplink, or latency where the start-ups dominate), and with ``--results`` the measured time
and busbw beside them and each measured busbw over native MPI's (``mpi``, the library's
all-reduce timed in a compiled loop). Below the table:
where ring overtakes the binomial tree, the lower bound at the largest size (of any
all-reduce on these links, :mod:`topology.model.lower_bound`: the traffic every rank or node must send
over what its ports carry, or M over the network's minimum cut), the resource that binds
each algorithm there, bamring's order, and each tree's levels and slowest links. Each row's
"x bound" is its time over that bound at its size.

Each algorithm is a sequence of phases, each phase a set of concurrent transfers. A
transfer's rate is its max-min fair share of its link, of the egress port (NIC) of its
node and the ingress port of the receiver's node (transfers between two ranks of one node
use no port), and of the up- and down-links of the racks it leaves and enters; a phase
takes alpha x (messages on the link) + bytes/rate of its slowest transfer. M is the bytes
per rank, N the ranks, S = ceil(M / segment) segments of s = M/S bytes (algorithms.runtime.layout).
Each algorithm's schedule, and its closed form on uniform links (alpha, beta, every rank a
node whose port is beta), is its own (the ``schedule`` of its module in algorithms/), listed
below the options.
busbw = M / time x 2(N-1)/N, as nccl-tests reports it. With a probe file (--topology), alpha
and beta are per link, the nodes, ports, racks and uplinks those of the file; a node without
a port in the file gets its fastest link out and in as its port (--ports capacity). Without
one, --ranks N, --alpha-us and --beta-GBps describe uniform links: --ranks-per-node R
consecutive ranks a node (default 1: every rank its own node), each node's port --beta-GBps
out and in, the links within a node --intra-GBps (default 10 x beta).

--collective reducescatter or allgather models that half instead, as python -m bench
--collective measures it: the algorithms with a schedule of it, M the whole vector
(nccl-tests' size), busbw = M / time x (N-1)/N, --results rows of that collective only,
beside them the model's time over the measured (model/meas.), and the half's own lower
bound (below the table).
"""

import argparse
import re
import sys
import textwrap

import algorithms
from algorithms.costs import SCHEDULES, SCHEDULES_OF, cost_model
from algorithms.catalog.hier import ACROSS
from topology import BandwidthMatrix
from topology.model import HalfBound, LowerBound, Network
from topology.rings import ring_bottleneck

from ..core.cli import Parser, add_algo_flag, add_network_flags, add_size_flags, algos_in
from ..core.collectives import COLLECTIVES
from ..core.sizes import sweep
from ..formats.results import placement_time, read_results
from ..formats.tables import comment, description, epilog, plural, ratio_text, significant, size_label, table
from .compare import NATIVE

MODELLED = tuple(SCHEDULES)  # every algorithm the model knows: the registry's, with a schedule
#: the collectives as ``python -m bench --collective`` names them, in words
WORDS = {"allreduce": "all-reduce", "reducescatter": "reduce-scatter", "allgather": "all-gather"}
#: those the cost model has schedules of
MODELLED_COLLECTIVES = tuple(name for name, spec in COLLECTIVES.items() if spec.half in SCHEDULES_OF)


def schedules_of(collective):
    """{name: schedule} of every algorithm with a schedule of ``collective`` (a ``--collective`` name)."""
    return SCHEDULES_OF[COLLECTIVES[collective].half]


def schedules_text(collective="allreduce"):
    """Every modelled algorithm's schedule of ``collective`` in words: the first paragraph of its docstring."""
    if collective == "allreduce":
        lines = ["The algorithms' schedules (M bytes per rank, N ranks, S segments of s bytes):"]
    else:
        lines = [f"The algorithms' {WORDS[collective]} schedules (M the whole vector, N chunks of M/N, N ranks):"]
    schedules = schedules_of(collective)
    width = max([8, *(len(name) + 2 for name in schedules)])  # a name, then its text
    for name, schedule in schedules.items():
        first = " ".join((schedule.__doc__ or "").strip().split("\n\n")[0].split())
        first = re.sub(r":\w+:`([^`]*)`", r"\1", first).replace("``", "")  # no reST marks in --help
        wrapped = textwrap.wrap(first, 92 - width) or ["(undocumented)"]
        lines += [f"  {name:{width}s}{wrapped[0]}", *(f"  {'':{width}s}{line}" for line in wrapped[1:])]
    if collective == "allreduce":
        halves = " or ".join(c for c in MODELLED_COLLECTIVES if c != "allreduce")
        lines.append(f"With --collective {halves}, --help lists that collective's schedules.")
    return "\n".join(lines)


def tree_method(name):
    """The ``topology.build_tree`` method of a tree algorithm of the registry, else None."""
    return algorithms.ALGORITHMS[name].tree_method if name in algorithms.ALGORITHMS else None


def ring_worked_example(n=8, nbytes=14e9, beta_GBps=400, alpha_us=10):
    """The ring's worked example of 8 ranks with 14 GB at 400 GB/s and 10 us: (volume per
    rank in bytes, bandwidth term s, latency term s)."""
    volume = 2 * (n - 1) / n * nbytes
    return volume, volume / (beta_GBps * 1e9), 2 * (n - 1) * alpha_us * 1e-6


def measured_rows(paths, collective="allreduce"):
    """{(algorithm, size): out-of-place dict (time us, bus_bw GB/s)} of our rows of ``collective``
    in ``paths`` (rows of others left out), and the rank counts they ran on; ``ValueError`` for a
    file without any, naming the collectives it has."""
    measured, ranks = {}, set()
    for path in paths:
        ours = [r for r in read_results(path) if isinstance(r.get("out_of_place"), dict) and "algorithm" in r]
        rows = [r for r in ours if r.get("collective", "allreduce") == collective]
        others = sorted({str(r.get("collective", "allreduce")) for r in ours} - {collective})
        if not rows and others:
            raise ValueError(f"--results {path}: no {WORDS[collective]} rows, only rows of --collective "
                             f"{', '.join(others)}; give --collective {others[0]} to set them beside the model")
        if not rows:
            raise ValueError(f"--results {path}: no {WORDS[collective]} rows of python -m bench (-J or --log)")
        for r in rows:
            measured[(r["algorithm"], r["size"])] = r["out_of_place"]
            ranks.update([r["ranks"]] if "ranks" in r else [])
    return measured, ranks


HEADER = ["size", "algorithm", "model us", "model GB/s", "limited by", "x bound"]
MEASURED_HEADER = ["measured us", "measured GB/s", "x bound", f"vs {NATIVE}"]
HALF_MEASURED_HEADER = ["measured us", "measured GB/s", "model/meas.", "x bound", f"vs {NATIVE}"]
LEGEND = ("us: the time of one all-reduce; GB/s: its busbw; limited by: what binds in the model; "
          "x bound: the time over the lower bound of any all-reduce on these links (below the table)")


def legend(collective, measured):
    """What the columns mean: :data:`LEGEND` for the all-reduce, the half's words otherwise."""
    if collective == "allreduce":
        return LEGEND
    words = WORDS[collective]
    return (f"us: the time of one {words} of M bytes, the whole vector; GB/s: its busbw, M / time x (N-1)/N; "
            f"limited by: what binds in the model; "
            + ("model/meas.: the model's time over the measured; " if measured else "")
            + f"x bound: the time over the lower bound of any {words} on these links (below the table)")


def bound_of(model, collective):
    """``size -> Bound``: the lower bound of ``collective`` on the model's links (the all-reduce's:
    :meth:`topology.model.Model.lower_bound`)."""
    return model.lower_bound if collective == "allreduce" else HalfBound(model.network, COLLECTIVES[collective].half).at


def model_cells(model, algorithm, size, collective="allreduce", bound=None):
    """[time us, busbw GB/s, limited by, x bound] of the model, or dashes where it cannot model it."""
    try:
        estimate = model.estimate(algorithm, size)
    except ValueError:
        return ["-", "-", "-", "-"]
    t = estimate.seconds
    busbw = size / t / 1e9 * COLLECTIVES[collective].factor(model.n) if t > 0 else 0.0
    return [significant(t * 1e6), significant(busbw), str(estimate.limit),
            bound_multiple(bound or model.lower_bound, size, t)]


def bound_multiple(bound_at, size, seconds):
    """``seconds`` as a multiple of the lower bound ``bound_at(size)`` ("1.23x"), "-" where there is none."""
    try:
        bound = bound_at(size)
    except ValueError:
        return "-"
    return ratio_text(seconds / bound.seconds) if bound.seconds > 0 and not bound.missing else "-"


def model_over_measured(model, algorithm, size, measured_us):
    """The model's time over the measured ``measured_us`` ("0.85x"), "-" where it has none."""
    try:
        seconds = model.time(algorithm, size)
    except ValueError:  # not modelled (native MPI)
        return "-"
    return ratio_text(seconds * 1e6 / measured_us) if measured_us > 0 else "-"


def model_table(model, algos, sizes, measured, collective="allreduce"):
    """Cells per size and algorithm: predicted time, busbw, what limits it and its multiple of
    the lower bound; with ``measured`` also the measured ones (of a half, with the model's time
    over the measured) and the measured busbw over native MPI's (which gets a row of its own)."""
    rows, bound = [], bound_of(model, collective)
    half = collective != "allreduce"
    for size in sizes:
        native = measured.get((NATIVE, size), {}).get("bus_bw")
        for a in algos + ([NATIVE] if native is not None else []):
            row = [size_label(size), a]
            row += ["-"] * 4 if a == NATIVE else model_cells(model, a, size, collective, bound)  # native: not modelled
            seen = measured.get((a, size))
            if seen:
                t = placement_time(seen)
                row += [significant(t), significant(seen["bus_bw"])]
                if half:
                    row.append(model_over_measured(model, a, size, t))
                row += [bound_multiple(bound, size, t * 1e-6), ratio_text(seen["bus_bw"] / native) if native else "-"]
            elif measured:
                row += ["-"] * (5 if half else 4)
            rows.append(row)
    return rows


def notes(model, algos, largest=None, collective="allreduce"):
    """The comment lines after the table: ring against the binomial tree, the lower bound and
    what binds each algorithm at the ``largest`` size, each tree's levels."""
    lines = []
    if "ring" in algos and "tree" in algos:
        cross = model.crossover("ring", "tree")
        lines.append(f"ring overtakes the binomial tree from {size_label(cross)}" if cross else
                     "ring never overtakes the binomial tree on these links")
    if largest:
        try:
            if collective == "allreduce":
                bound = model.lower_bound(largest)
                if bound.missing:
                    lines.append(f"no sound bound (x bound: -): {bound.missing}")
                else:
                    lines.append(f"lower bound at {size_label(largest)}: {significant(bound.seconds * 1e6)} us, "
                                 f"{bound.kind}: {bound.detail}; it assumes {LowerBound(model.network).assumes}")
            else:
                lines.append(half_bound_note(model, largest, collective))
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
        found = model.bottleneck_ring()
        plain = ring_bottleneck(model.matrix.bandwidth, range(model.n))
        if list(found.order) == list(range(model.n)):
            where = "the ranks' own order"
        else:
            shown = " ".join(map(str, found.order[:16])) + (f" ... ({model.n} ranks)" if model.n > 16 else "")
            where = f"order {shown} (the ranks' own order: slowest link {significant(plain)} GB/s)"
        lines.append(f"bamring: {where}, slowest link {significant(found.bottleneck_GBps)} GB/s"
                     + ("" if found.exact else f", {found.gap:.1%} below the bound {significant(found.bound_GBps)}"))
    if "dring" in algos and model.network.has_matrix and model.n > 2:
        found = algorithms.catalog.dring.model_ring(model)
        order = [int(r) for r in found.order]
        where = "the ranks' own order" if order == list(range(model.n)) else \
            "order " + " ".join(map(str, order[:16])) + (f" ... ({model.n} ranks)" if model.n > 16 else "")
        lines.append(f"dring: {where} both ways, slowest link (the slower direction) "
                     f"{significant(found.bottleneck_GBps)} GB/s")
    for a in algos:
        method = tree_method(a)
        if method:
            tree = model.tree(method)
            lines.append(f"{a}: {plural(tree.depth(), 'level')}, "
                         f"{'bottleneck' if len(tree.bottlenecks) == 1 else 'bottlenecks'} (GB/s) "
                         + ", ".join(f"{b:.2f}" for b in tree.bottlenecks))
    return [comment(line) for line in lines]


def half_bound_note(model, size, collective):
    """The note on the lower bound of a reduce-scatter or all-gather (``collective``) at ``size``."""
    words = WORDS[collective]
    half_bound = HalfBound(model.network, COLLECTIVES[collective].half)
    bound = half_bound.at(size)
    if bound.missing:
        return f"no sound {words} bound (x bound: -): {bound.missing}"
    what = ("sends the (N-1)/N M of its input that the other ranks' chunks need" if collective == "reducescatter"
            else "receives the (N-1)/N M of the other ranks' chunks")
    return (f"{words} lower bound at {size_label(size)}: {significant(bound.seconds * 1e6)} us, {bound.kind}: "
            f"{bound.detail} (each rank {what}, each node of R ranks (N-R)/N M, each rack likewise, over what "
            f"its links and port carry, plus one latency; or the latency every rank's result takes); it assumes "
            f"{half_bound.parties()[1].assumes}")


def collective_of(argv):
    """The ``--collective`` of ``argv`` for the --help epilog (allreduce where absent or unknown;
    the parser itself says what is wrong with it)."""
    found = "allreduce"
    for i, arg in enumerate(argv):
        if arg == "--collective" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--collective="):
            found = arg.split("=", 1)[1]
    return found if found in MODELLED_COLLECTIVES else "allreduce"


def main(argv):
    p = Parser(prog="python -m bench model", description=description(__doc__),
                                epilog=epilog(__doc__) + "\n\n" + schedules_text(collective_of(argv)),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--collective", choices=MODELLED_COLLECTIVES, default="allreduce",
                   help="the collective to model, as python -m bench --collective names it (default allreduce)")
    p.add_argument("--topology", metavar="FILE",
                   help="a probe file (python -m topology probe): per-link alpha and beta, nodes and ports "
                        "(default: uniform links)")
    add_network_flags(p, 5.0, 10.0, "rank count for uniform links (no default: needed without --topology)", int)
    p.add_argument("--ports", choices=("capacity", "file"), default="capacity",
                   help="with --topology, a node the file gives no port: capacity = as fast as its fastest "
                        "link out and in, file = no port limit (default capacity)")
    p.add_argument("--hier-across", choices=ACROSS, default="ring",
                   help="hier's all-reduce between the nodes (default ring)")
    add_size_flags(p, "8", "256M", 4)
    add_algo_flag(p, "all", f"comma list of algorithms to model, of {','.join(MODELLED)}, or all (default all; with "
                  "--collective reducescatter or allgather, every one with a schedule of it)")
    p.add_argument("--results", nargs="*", default=[], metavar="FILE",
                   help="our -J documents or JSON-lines logs: measured time and busbw beside the model, "
                        "and the ratio to native MPI; rows of the --collective only (default: none)")
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
        known = tuple(schedules_of(args.collective))
        algos = algos_in(args.algo, dict(zip(known, known)), "" if args.collective == "allreduce" else args.collective)
        sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
        measured, measured_ranks = measured_rows(args.results, args.collective)
        model = cost_model(matrix, ports=args.ports, across=args.hier_across,
                           collective=COLLECTIVES[args.collective].half)
        for a in algos:  # a tree that cannot be built on these links is refused here, not in the table
            if tree_method(a):
                model.tree(tree_method(a))
    except (ValueError, OSError) as exc:
        print(f"python -m bench model: {exc}", file=sys.stderr)
        return 2
    print("\n".join(heading(args, model, measured_ranks, algos, bool(measured))))
    half = args.collective != "allreduce"
    header = HEADER + ((HALF_MEASURED_HEADER if half else MEASURED_HEADER) if measured else [])
    print("\n".join(table(header, model_table(model, algos, sizes, measured, args.collective), left=(1, 4))))
    print("\n".join(notes(model, algos, max(sizes), args.collective)))
    return 0


def heading(args, model, measured_ranks, algos, measured=False):
    """The comment lines above the table: the collective, the links, the nodes and their ports,
    and what the measured columns are."""
    network = model.network
    source = f"the links of {args.topology}" if args.topology else \
        f"uniform links, alpha {args.alpha_us:g} us, beta {args.beta_GBps:g} GB/s"
    what = "" if args.collective == "allreduce" else f"the {WORDS[args.collective]} on "
    lines = [comment(f"alpha-beta model of {what}{plural(model.n, 'rank')}, {source}")]
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
    hier = "" if "hier" not in algos else f"; hier across nodes: {model.across}" if args.collective == "allreduce" \
        else "; hier's halves run rings across nodes"
    lines.append(comment(f"{nodes}; {ports}, shared max-min fairly by the node's concurrent transfers{hier}"))
    if args.results:
        lines.append(comment(f"measured (out-of-place): {', '.join(args.results)}; vs {NATIVE} = measured busbw / "
                             f"the measured busbw of native MPI ({NATIVE}, timed in a compiled loop) at the same size"))
    if measured_ranks - {model.n}:
        ran = ", ".join(map(str, sorted(measured_ranks)))
        lines.append(comment(f"note: the measured runs had {ran} ranks, the model {model.n}"))
    lines.append(comment(legend(args.collective, measured)))
    return lines
