"""``python -m bench scaling``: what all-reduce costs a data-parallel training step, per algorithm and rank count.

The gradient is ``params x dtype size`` bytes. For each algorithm and rank count the
communication time T_m comes from the model of ``python -m bench model`` (its --help has
each algorithm's formula) on uniform links of ``--beta-GBps`` and ``--alpha-us``, or from a
measured busbw (``--results``, each algorithm's busbw at its largest measured size);
efficiency E = T_c / (T_c + T_m) and speed-up N x E. "limited by" says what the model's T_m
is mostly made of: link, port, uplink, or latency (the start-ups, alpha).

Every node has one port (NIC) of ``--beta-GBps`` out and in, which its concurrent transfers
share max-min fairly. By default every rank is a node of its own: a tree's rank with k
children and a parent moves k+1 segments through its port per period, so the binomial
tree's busbw is at most 2(N-1)/N beta/ceil(log2 N), while the ring, one transfer through
each port, takes 2(N-1)/N M/beta + 2(N-1) alpha. ``--ranks-per-node R`` puts R consecutive
ranks on a node, linked at ``--intra-GBps`` (default 10 x beta), all sharing its port:
there hier (``--hier-across`` ring or bamtree between the nodes) moves 2(K-1)/K M/beta
through each port of K nodes.

With ``--buckets K`` the gradient is sent in K equal buckets as they become ready
during a backward pass of ``--backward-time`` seconds (DDP-style); only the
communication that does not fit behind the remaining backward work is exposed (ideally
the last bucket). The worked example: 7e9 float16 parameters over 8 ranks at 400 GB/s
take 61 ms of ring.

``--train FILE`` projects a step measured by ``python -m bench train -J FILE`` instead of
guessing it (:mod:`bench.train.projection`): each of the file's noop runs (the step with DDP's
buckets returned untouched, one per dtype and bucket size) is a compute profile, T_c, the
backward pass T_b and each bucket's bytes and ready time. For each algorithm, rank count and
profile the table gives each bucket's all-reduce from the model (T_m, their sum), the exposed
communication and the step, synchronous (every bucket stalls the backward pass) and overlapped
(bucket k starts at max(its ready time, the end of bucket k-1); only what ends after the
backward pass is exposed), and E = T_c / (T_c + exposed). ``gloo`` is DDP's own overlapped ring.
The network: the uniform one of the flags above, or ``--topology FILE`` (a probe's matrix, or
the lab's network from ``python -m bench.lab network``), a probe of one node extended by
nodes joined at ``--beta-GBps`` where ``--ranks`` asks for more ranks than it has.
``--cores P``: every rank shares P cores (the lab's namespaces on one machine), so compute
slows by max(1, N t / P) / max(1, N0 t / P) from the file's N0 ranks of t threads, and an
overlapped all-reduce over MPI, which polls, takes its time from the backward pass.
``--check FILE``: a bench train -J file measured on that network at one of ``--ranks``:
each projected step beside its measured median and interval, and the error.
"""

import argparse
import sys

from algorithms.costs import cost_model
from algorithms.catalog.hier import ACROSS
from topology.model import Network

from ..core.cli import Parser, add_algo_flag, add_dtype_flag, add_network_flags, algos_in
from ..formats.tables import comment, description, epilog, plural
from ..train import projection
from ..train.predict import exposed_after
from .model import MODELLED, measured_rows


def exposed_time(bucket_time, buckets, backward):
    """Communication left after the backward pass when bucket k of K equal ones is ready at
    k/K of it and buckets go out one after another (:func:`bench.train.predict.exposed_after`)."""
    return exposed_after([k * backward / buckets for k in range(1, buckets + 1)], [bucket_time] * buckets, backward)


def measured_busbw(paths):
    """{algorithm: busbw GB/s at its largest measured all-reduce size} from our results files."""
    measured, _ = measured_rows(paths)
    return {algo: place["bus_bw"] for (algo, _), place in sorted(measured.items(), key=lambda item: item[0][1])}


def main(argv):
    p = Parser(prog="python -m bench scaling", description=description(__doc__),
                                epilog=epilog(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=float, help="model parameters, e.g. 7e9 (required without --train)")
    add_dtype_flag(p, "float16", "the gradient's element type", flags=("--dtype",))
    p.add_argument("--compute-time", type=float,
                   help="T_c: compute time per step, in seconds (required without --train)")
    p.add_argument("--train", metavar="FILE",
                   help="a python -m bench train -J file: its noop runs' compute profiles (compute and backward "
                        "time, each bucket's bytes and ready time) projected, instead of --params, --dtype, "
                        "--compute-time, --backward-time and --buckets (default: those flags)")
    p.add_argument("--topology", metavar="FILE",
                   help="with --train: the network of a matrix file (a probe's, or python -m bench.lab network's), "
                        "a one-node probe extended by nodes where --ranks asks for more (default: the uniform one)")
    p.add_argument("--cores", type=int, metavar="P",
                   help="with --train: every rank shares P cores, as the lab's do (default: each rank its own cores)")
    p.add_argument("--check", metavar="FILE",
                   help="with --train: a bench train -J file measured on the network: its steps beside the "
                        "projection (default: none)")
    add_network_flags(p, 10.0, 400.0, "comma list of rank counts (default 8)", ranks_default="8")
    p.add_argument("--hier-across", choices=ACROSS, default="ring",
                   help="hier's all-reduce between the nodes (default ring)")
    p.add_argument("--results", nargs="*", default=[], metavar="FILE",
                   help="our -J documents or JSON-lines logs: their measured busbw instead of the model "
                        "(default: the model)")
    p.add_argument("--buckets", type=int, default=0,
                   help="K equal gradient buckets overlapped with the backward pass (default 0: no overlap)")
    p.add_argument("--backward-time", type=float,
                   help="T_b: backward pass, in seconds (default: 2/3 of --compute-time)")
    add_algo_flag(p, "ps,ring,tree", f"comma list of algorithms, of {','.join(MODELLED)}, or all; with --train "
                  "also gloo (default ps,ring,tree)")
    args = p.parse_args(argv)
    if args.train:
        return projection.train_main(args)
    try:
        if args.params is None or args.compute_time is None:
            raise ValueError("needs --params and --compute-time, or --train FILE")
        if args.topology or args.cores or args.check:
            raise ValueError("--topology, --cores and --check need --train FILE")
        itemsize = args.dtype.dtype.itemsize
        ranks = [int(r) for r in args.ranks.split(",")]
        algos = algos_in(args.algo, dict(zip(MODELLED, MODELLED)))
        if min(ranks) < 1 or args.params <= 0 or args.compute_time <= 0 or args.ranks_per_node < 1:
            raise ValueError("--ranks, --ranks-per-node, --params and --compute-time must be positive")
        measured = measured_busbw(args.results)
    except (TypeError, ValueError, OSError) as exc:
        print(f"python -m bench scaling: {exc}", file=sys.stderr)
        return 2
    nbytes = args.params * itemsize
    backward = args.backward_time if args.backward_time is not None else args.compute_time * 2 / 3
    ready = [k * backward / args.buckets for k in range(1, args.buckets + 1)]  # none without --buckets
    sizes = [nbytes / args.buckets for _ in ready]
    r = args.ranks_per_node
    intra = args.intra_GBps if args.intra_GBps is not None else 10 * args.beta_GBps
    source = ("measured busbw from " + ", ".join(args.results)) if args.results else \
        f"alpha-beta model, alpha {args.alpha_us:g} us, beta {args.beta_GBps:g} GB/s"
    print(comment(f"gradient {nbytes / 1e9:.3f} GB ({args.params:g} x {args.dtype.name}), T_c {args.compute_time:g} s, {source}"))
    if not args.results:
        nodes = "every rank its own node" if r == 1 else \
            f"{r} ranks a node, linked at {intra:g} GB/s within it; hier across nodes: {args.hier_across}"
        print(comment(f"{nodes}; each node's port {args.beta_GBps:g} GB/s out and in, "
                      "shared by its concurrent transfers"))
    if args.buckets:
        print(comment(f"{plural(args.buckets, 'bucket')} overlapped with a {backward:g} s backward pass"))
    print(f"{'algorithm':>10}  {'ranks':>6}  {'T_m (s)':>10}  {'exposed (s)':>11}  {'efficiency':>10}  {'speed-up':>8}"
          f"  {'limited by':<10}")
    for algo in algos:
        for n in ranks:
            limit = "-"
            if args.results:
                if algo not in measured:
                    continue
                factor = 2 * (n - 1) / n if n > 1 else 0
                t_m = nbytes * factor / (measured[algo] * 1e9) if factor else 0.0
                times = [b * factor / (measured[algo] * 1e9) if factor else 0.0 for b in sizes]
            else:
                model = cost_model(Network.uniform(n, args.beta_GBps, args.alpha_us, r, intra), across=args.hier_across)
                try:
                    estimate = model.estimate(algo, nbytes)
                except ValueError as exc:
                    print(f"{algo:>10}  {n:6d}  not modelled: {exc}")
                    continue
                t_m, limit = estimate.seconds, str(estimate.limit)
                times = [model.time(algo, b) for b in sizes]
            exposed = exposed_after(ready, times, backward) if sizes else t_m
            efficiency = args.compute_time / (args.compute_time + exposed)
            print(f"{algo:>10}  {n:6d}  {t_m:10.4f}  {exposed:11.4f}  {efficiency * 100:9.1f}%  {n * efficiency:8.2f}"
                  f"  {limit}")
    return 0
