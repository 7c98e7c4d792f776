"""``python -m bench.lab up|down|exec|run``: the heterogeneous network lab (root, iproute2).

  up    --rates FILE | --generator uniform|two-level|random|seed ...   build a lab and leave it up
        (seed: the 4-rank example matrix A, B, a, b of 100-1000 Mbit/s links on which BAM's
        tree is faster than KM's); the node-to-node rates, and the nodes' shape:
        --nodes K --ranks-per-node R [--nic-mbit X] [--racks N --oversubscription RATIO]
        [--slow-nic NODE:MBIT] [--slow-pair A:B:MBIT] [--second-mbit MBIT] (a second, slower
        interface on every node, on its own bridge and subnet)
  down  remove exactly what ``up`` created (by its state file)
  network -o FILE [--alpha-us A]   write the lab's network as a matrix file: its configured links
        and ports, the latencies and links within a node measured there by a short probe (or
        --alpha-us for every message); python -m bench scaling|train|model --topology read it
  exec  [--iface first|second] -- ARGS...   run ``python ARGS`` as one MPI job, R ranks in each
        node's namespace, MPI and gloo on each node's first (default) or second interface
  run   [--only NAME ...] [--sizes 8M,...] [--probe-bytes 8M] [--iters N]
                      every experiment, lab up and down around each

Rates are Mbit/s (a JSON file: {"rates_mbit": [[...]]}, or a probe-format matrix in GB/s).
Exit 3 when the lab cannot run here (not root, no iproute2 or unshare), with the reason.
"""

import argparse
import json
import os
import signal
import subprocess
import sys

import mpi4py

# This process only launches MPI jobs into the namespaces. It must not become an MPI process
# itself: MPI_Init here, beside the lab's address-less veths, may pick one and fail.
mpi4py.rc.initialize = False
mpi4py.rc.finalize = False

import numpy as np  # noqa: E402

from topology import random_heterogeneous, seed_example, two_level, uniform  # noqa: E402
from plumbing.cli import Parser
from plumbing.units import parse_size  # noqa: E402

from . import experiments, network  # noqa: E402

CANNOT_RUN = 3
DEFAULT_NODES = 4


def _rates(args):
    """The K x K node-to-node rates (Mbit/s) of ``up``'s arguments, before --slow-pair."""
    if args.rates:
        with open(args.rates) as f:
            data = json.load(f)
        if "rates_mbit" in data:
            rates = np.asarray(data["rates_mbit"], dtype=float)
        else:
            rates = np.asarray(data["bandwidth_GBps"], dtype=float) * 8000
    elif args.generator == "seed":
        rates = seed_example().bandwidth * 100
    else:
        k = DEFAULT_NODES if args.k is None else args.k
        if args.generator == "uniform":
            return uniform(k, args.high).bandwidth
        if args.generator == "two-level":
            if k % args.per_node:
                raise network.LabError(f"--nodes {k} is not a multiple of --per-node {args.per_node}")
            return two_level(k // args.per_node, args.per_node, args.high, args.low).bandwidth
        return random_heterogeneous(k, args.low, args.high, seed=args.seed).bandwidth
    if args.k is not None and args.k != len(rates):
        source = args.rates or "the seed matrix"
        raise network.LabError(f"--nodes {args.k}, but {source} has {len(rates)} nodes")
    return rates


def _numbers(text, count, flag):
    """``A:B[:C]`` as numbers (ints for the node indices), for --slow-nic and --slow-pair."""
    parts = text.split(":")
    try:
        if len(parts) != count:
            raise ValueError
        return [int(x) for x in parts[:-1]] + [float(parts[-1])]
    except ValueError:
        shape = "NODE:MBIT" if count == 2 else "A:B:MBIT"
        raise network.LabError(f"{flag} {text!r}: give {shape}") from None


def shape_of(args):
    """``up``'s arguments as the keyword arguments of :func:`network.up` (rates included)."""
    rates = network.validate_rates(_rates(args))
    k = len(rates)
    for text in args.slow_pair or []:
        a, b, mbit = _numbers(text, 3, "--slow-pair")
        rates = network.slow_pair(rates, a, b, mbit)
    nic = args.nic_mbit
    shape = {"rates_mbit": rates, "ranks_per_node": args.ranks_per_node, "nic_mbit": nic,
             "second_mbit": args.second_mbit}
    if args.racks is not None:
        shape.update(network.oversubscribed(k, args.racks, nic, args.oversubscription, rates))
        if args.uplink_mbit is not None:
            shape["uplink_mbit"] = args.uplink_mbit
    elif args.uplink_mbit is not None or args.oversubscription != 1.0:
        raise network.LabError(f"{'--uplink-mbit' if args.uplink_mbit is not None else '--oversubscription'} "
                               "needs --racks")
    for text in args.slow_nic or []:
        node, mbit = _numbers(text, 2, "--slow-nic")
        shape["nic_mbit"] = network.slow_nic(shape["nic_mbit"], k, node, mbit)
    return shape


def describe(lab):
    """One line: what ``lab`` is."""
    shape = lab.shape()
    text = (f"{lab.k} nodes {lab.names['netns'][0]}..{lab.names['netns'][-1]} x {lab.ranks_per_node} "
            f"rank{'s' if lab.ranks_per_node > 1 else ''} = {lab.ranks} ranks, "
            f"addresses {lab.addresses[0]}..{lab.addresses[-1]}")
    if shape["nic_mbit"]:
        text += ", NICs (egress, ingress Mbit/s) " + " ".join(
            f"{'-' if e is None else f'{e:g}'}/{'-' if n is None else f'{n:g}'}" for e, n in shape["nic_mbit"])
    if shape["racks"]:
        text += f", racks {shape['racks']}"
        if shape["uplink_mbit"]:
            text += ", uplinks (up, down Mbit/s) " + " ".join(
                f"{'-' if u is None else f'{u:g}'}/{'-' if d is None else f'{d:g}'}" for u, d in shape["uplink_mbit"])
    if shape["second_mbit"] is not None:
        text += (f", second interface {lab.second_veth(0)}..{lab.second_veth(lab.k - 1)} at {shape['second_mbit']:g} "
                 f"Mbit/s egress, addresses {lab.second_addresses[0]}..{lab.second_addresses[-1]}")
    return text


def _raise_on_signals():
    """SIGTERM and SIGHUP end the program like Ctrl-C, so every ``finally`` (lab down) runs."""
    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def main(argv=None):
    p = Parser(prog="python -m bench.lab", description=__doc__.splitlines()[0])
    p.add_argument("--tag", default=network.DEFAULT_TAG,
                   help=f"prefix of the namespaces, links and state file the lab creates (default {network.DEFAULT_TAG})")
    p.add_argument("--owner", default=os.environ.get("ALLREDUCE_LAB_OWNER"),
                   help="a token recorded by up/run; down with it removes only that owner's lab "
                        "(default $ALLREDUCE_LAB_OWNER)")
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="build a lab and leave it up")
    u.add_argument("--rates",
                   help='JSON file of link rates: {"rates_mbit": [[...]]} in Mbit/s, or a probe file in GB/s '
                        "(default: --generator)")
    u.add_argument("--generator", choices=("uniform", "two-level", "random", "seed"), default="seed",
                   help="the node-to-node rates without --rates: uniform, two-level (groups of --per-node nodes), random "
                        "(between --low and --high), or seed: the 4-rank example matrix of 100-1000 Mbit/s links "
                        "(default seed)")
    u.add_argument("--nodes", "--k", dest="k", metavar="K", type=int, default=None,
                   help=f"nodes (namespaces), K, for the uniform, two-level and random generators (default "
                        f"{DEFAULT_NODES}); with --rates or seed, K is the matrix's and --nodes must match it")
    u.add_argument("--ranks-per-node", metavar="R", type=int, default=1,
                   help="MPI ranks per node: they share memory, and only bytes between nodes cross the "
                        "shaped links (default 1)")
    u.add_argument("--nic-mbit", metavar="MBIT", type=float, default=None,
                   help="Mbit/s: cap on each node's total egress and on its total ingress, over all its "
                        "links (default: no cap)")
    u.add_argument("--racks", metavar="N", type=int, default=None,
                   help="put the nodes in this many racks of consecutive nodes, each on its own bridge, "
                        "joined to a core bridge by a shaped uplink (default: one bridge, no racks)")
    u.add_argument("--oversubscription", metavar="RATIO", type=float, default=1.0,
                   help="with --racks: each uplink = the rack's nodes x --nic-mbit (else each node's "
                        "fastest link) / RATIO, in each direction; 2 means 2:1 (default 1: non-blocking)")
    u.add_argument("--uplink-mbit", metavar="MBIT", type=float, default=None,
                   help="with --racks: each uplink's rate in Mbit/s per direction, instead of "
                        "--oversubscription's (default: from --oversubscription)")
    u.add_argument("--slow-nic", action="append", metavar="NODE:MBIT",
                   help="degraded: node NODE's NIC at MBIT both ways, the others as --nic-mbit; repeatable "
                        "(default: none)")
    u.add_argument("--slow-pair", action="append", metavar="A:B:MBIT",
                   help="degraded: the link between nodes A and B at MBIT in both directions; repeatable "
                        "(default: none)")
    u.add_argument("--second-mbit", metavar="MBIT", type=float, default=None,
                   help="a second interface on every node, on its own bridge and subnet, each node's egress "
                        "on it shaped to MBIT Mbit/s (default: none)")
    u.add_argument("--low", type=float, default=100.0,
                   help="Mbit/s: random's lower bound, two-level's between groups (default 100)")
    u.add_argument("--high", type=float, default=400.0,
                   help="Mbit/s: random's upper bound, uniform's rate, two-level's within a group (default 400)")
    u.add_argument("--per-node", type=int, default=2,
                   help="two-level: nodes per group (groups of consecutive nodes; default 2)")
    u.add_argument("--seed", type=int, default=0, help="random-number seed of the random generator (default 0)")
    u.add_argument("--subnet", default=network.DEFAULT_SUBNET,
                   help=f"IPv4 subnet of the namespaces' addresses (default {network.DEFAULT_SUBNET})")
    sub.add_parser("down", help="remove what 'up' created")
    w = sub.add_parser("network", help="write the network of the lab that is up as a matrix file: its configured "
                                       "links, ports and uplinks, with the latencies and the links within a node "
                                       "measured there")
    w.add_argument("-o", "--output", required=True, help="the JSON file to write (required)")
    w.add_argument("--alpha-us", type=float, default=None,
                   help="start-up time of every message in us, instead of measuring it (default: measured by a "
                        "probe of the lab's ranks, a few seconds; the lab adds no delay of its own)")
    e = sub.add_parser("exec", help="run python ARGS as one MPI job, the lab's ranks per node in each namespace")
    e.add_argument("--iface", choices=("first", "second"), default="first",
                   help="which interface MPI (FI_TCP_IFACE) and gloo are told to use; default first")
    e.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of python, e.g. -- -m bench -b 8M")
    r = sub.add_parser("run", help="every experiment; writes results/lab/")
    r.add_argument("--out", default="results/lab", help="folder of the results (default results/lab)")
    r.add_argument("--only", nargs="*", choices=list(experiments.topologies()),
                   help=f"run only these experiments, of {', '.join(experiments.topologies())} (default: all)")
    r.add_argument("--sizes", help="comma list of message sizes in bytes, K/M/G powers of 1024, e.g. 8M "
                                   "(default: each experiment's own)")
    r.add_argument("--probe-bytes", type=parse_size, default=experiments.PROBE_BYTES, metavar="SIZE",
                   help="message size of the probe, K/M/G powers of 1024 (default 8M)")
    r.add_argument("--iters", type=int, default=None, metavar="N",
                   help="timed iterations per size, bench -n (default: each experiment's own, 3 or 2)")
    args = p.parse_args(argv)
    _raise_on_signals()
    try:
        if args.command == "down":
            removed = network.down(args.tag, args.owner)
            print(f"lab {args.tag}: removed {', '.join(removed) if removed else 'nothing (not up)'}")
            return 0
        reason = network.requirements()
        if args.command == "network" and (args.alpha_us is not None or not reason):  # measuring needs the lab
            matrix = experiments.network_matrix(network.load(args.tag), args.alpha_us)
            matrix.save(args.output)
            print(f"lab {args.tag}: wrote its network ({matrix.size} ranks, {matrix.node_count} nodes; "
                  f"{_latencies(matrix, args.alpha_us)}) to {args.output}")
            return 0
        if reason:
            print(f"python -m bench.lab: cannot run here: {reason}", file=sys.stderr)
            return CANNOT_RUN
        if args.command == "up":
            lab = network.up(tag=args.tag, subnet=args.subnet, owner=args.owner, **shape_of(args))
            print(f"lab {args.tag}: {describe(lab)}; 'python -m bench.lab down' removes it")
            return 0
        if args.command == "exec":
            argv = args.args[1:] if args.args[:1] == ["--"] else args.args
            lab = network.load(args.tag)
            command = network.mpmd_command(lab, experiments.mpiexec_path(), [sys.executable, *argv], iface=args.iface)
            return subprocess.run(command, env={**os.environ, **network.mpi_environment(lab)}).returncode
        sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else None
        if args.iters is not None and args.iters < 1:
            raise network.LabError("--iters must be at least 1")
        records = experiments.run_all(args.out, args.tag, args.only, sizes, owner=args.owner,
                                      probe_bytes=args.probe_bytes, iters=args.iters)
        print(open(os.path.join(args.out, "summary.md")).read())
        return 0 if all(t["holds"] for rec in records for t in rec["targets"]) else 1
    except network.LabError as exc:
        print(f"python -m bench.lab: {exc}", file=sys.stderr)
        return 2


def _latencies(matrix, alpha_us):
    """The network file's latencies between nodes in words: configured, or as measured in the lab."""
    if alpha_us is not None:
        return f"{alpha_us:g} us a message, configured"
    nodes = np.asarray(matrix.nodes)
    between = matrix.latency[nodes[:, None] != nodes[None, :]]
    return f"measured there: {between.min():.3g}-{between.max():.3g} us a message between nodes" if between.size else \
        "measured there: one node"


if __name__ == "__main__":
    raise SystemExit(main())
