"""``python -m bench.lab up|down|exec|run``: the heterogeneous network lab (root, iproute2).

  up    --rates FILE | --generator uniform|two-level|random|seed ...   build a lab and leave it up
        (seed: the 4-rank example matrix A, B, a, b of 100-1000 Mbit/s links on which BAM's
        tree is faster than KM's)
  down  remove exactly what ``up`` created (by its state file)
  exec  -- ARGS...   run ``python ARGS`` as one MPI job, rank i in namespace i
  run   [--only NAME ...] [--sizes 8M,...]   every experiment, lab up and down around each

Rates are Mbit/s (a JSON file: {"rates_mbit": [[...]]}, or a probe-format matrix in GB/s).
Exit 3 when the lab cannot run here (not root, no iproute2), with the reason.
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
from topology.units import parse_size  # noqa: E402

from . import experiments, network  # noqa: E402

CANNOT_RUN = 3


def _rates(args):
    if args.rates:
        with open(args.rates) as f:
            data = json.load(f)
        if "rates_mbit" in data:
            return np.asarray(data["rates_mbit"], dtype=float)
        return np.asarray(data["bandwidth_GBps"], dtype=float) * 8000
    k = args.k
    if args.generator == "uniform":
        return uniform(k, args.high).bandwidth
    if args.generator == "two-level":
        if k % args.per_node:
            raise network.LabError(f"--k {k} is not a multiple of --per-node {args.per_node}")
        return two_level(k // args.per_node, args.per_node, args.high, args.low).bandwidth
    if args.generator == "random":
        return random_heterogeneous(k, args.low, args.high, seed=args.seed).bandwidth
    return seed_example().bandwidth * 100


def _raise_on_signals():
    """SIGTERM and SIGHUP end the program like Ctrl-C, so every ``finally`` (lab down) runs."""
    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.lab", description=__doc__.splitlines()[0])
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
                   help="the rates without --rates: uniform, two-level (nodes of --per-node namespaces), random "
                        "(between --low and --high), or seed: the 4-rank example matrix of 100-1000 Mbit/s links "
                        "(default seed)")
    u.add_argument("--k", type=int, default=4,
                   help="namespaces (ranks) for the uniform, two-level and random generators (default 4)")
    u.add_argument("--low", type=float, default=100.0,
                   help="Mbit/s: random's lower bound, two-level's between nodes (default 100)")
    u.add_argument("--high", type=float, default=400.0,
                   help="Mbit/s: random's upper bound, uniform's rate, two-level's within a node (default 400)")
    u.add_argument("--per-node", type=int, default=2, help="namespaces per node for two-level (default 2)")
    u.add_argument("--seed", type=int, default=0, help="random-number seed of the random generator (default 0)")
    u.add_argument("--subnet", default=network.DEFAULT_SUBNET,
                   help=f"IPv4 subnet of the namespaces' addresses (default {network.DEFAULT_SUBNET})")
    sub.add_parser("down", help="remove what 'up' created")
    e = sub.add_parser("exec", help="run python ARGS as one MPI job across the namespaces")
    e.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of python, e.g. -- -m bench -b 8M")
    r = sub.add_parser("run", help="every experiment; writes results/lab/")
    r.add_argument("--out", default="results/lab", help="folder of the results (default results/lab)")
    r.add_argument("--only", nargs="*", choices=list(experiments.topologies()),
                   help=f"run only these experiments, of {', '.join(experiments.topologies())} (default: all)")
    r.add_argument("--sizes", help="comma list of message sizes in bytes, K/M/G powers of 1024, e.g. 8M "
                                   "(default: each experiment's own)")
    args = p.parse_args(argv)
    _raise_on_signals()
    try:
        if args.command == "down":
            removed = network.down(args.tag, args.owner)
            print(f"lab {args.tag}: removed {', '.join(removed) if removed else 'nothing (not up)'}")
            return 0
        reason = network.requirements()
        if reason:
            print(f"python -m bench.lab: cannot run here: {reason}", file=sys.stderr)
            return CANNOT_RUN
        if args.command == "up":
            lab = network.up(_rates(args), tag=args.tag, subnet=args.subnet, owner=args.owner)
            print(f"lab {args.tag}: {lab.k} namespaces {lab.names['netns'][0]}..{lab.names['netns'][-1]}, "
                  f"addresses {lab.addresses[0]}..{lab.addresses[-1]}; 'python -m bench.lab down' removes it")
            return 0
        if args.command == "exec":
            argv = args.args[1:] if args.args[:1] == ["--"] else args.args
            lab = network.load(args.tag)
            command = network.mpmd_command(lab, experiments.mpiexec_path(), [sys.executable, *argv])
            return subprocess.run(command, env={**os.environ, **network.mpi_environment()}).returncode
        sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else None
        records = experiments.run_all(args.out, args.tag, args.only, sizes, owner=args.owner)
        print(open(os.path.join(args.out, "summary.md")).read())
        return 0 if all(t["holds"] for rec in records for t in rec["targets"]) else 1
    except network.LabError as exc:
        print(f"python -m bench.lab: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
