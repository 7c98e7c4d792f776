"""``mpiexec -n N python -m bench [flags]``: time every algorithm over a size sweep, nccl-tests style.

Flags keep nccl-tests' meaning: -b/-e min/max bytes (K/M/G), -f factor, -i
step, -n iterations, -w warm-up iterations, -c check iterations, -o op, -d
dtype (``all`` for every op or dtype). ``--algo`` is ours: a comma list of
``ps,ring,tree,mpi`` or ``all``. Rank 0 prints one table per algorithm; the
exit status is 1 when any element was wrong.
"""

import argparse
import os
import platform
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

import algorithms

from .baselines import RUNNERS, needs_topology
from .check import check_expected, check_fill, wrong_elements
from .machine import commit, cpu_model, relevant_env
from .report import COLUMNS, bandwidths, bus_factor, footer, row
from .sizes import parse_size, sweep


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("32M"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=0)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-o", "--op", default="sum", choices=[*algorithms.OPS, "all"])
    p.add_argument("-d", "--datatype", default="float",
                   help="float, double, half, int32, ... any numpy name, or all")
    p.add_argument("--algo", default="all",
                   help=f"comma list of {','.join(RUNNERS)}, or all (bamtree and kmtree need --topology)")
    p.add_argument("--topology", metavar="FILE",
                   help="bandwidth matrix (python -m topology probe -o FILE) for bamtree and kmtree")
    args = p.parse_args(argv)
    if args.algo == "all":
        args.algos = [a for a in RUNNERS if args.topology or not needs_topology(a)]
    else:
        args.algos = args.algo.split(",")
    unknown = [a for a in args.algos if a not in RUNNERS]
    if unknown:
        p.error(f"unknown --algo {','.join(unknown)}; choices: {','.join(RUNNERS)},all")
    lacking = [a for a in args.algos if needs_topology(a) and not args.topology]
    if lacking:
        p.error(f"--algo {','.join(lacking)} builds its tree from link bandwidths: pass --topology FILE "
                "(made by: mpiexec -n N python -m topology probe -o FILE)")
    args.dtypes = _dtypes(p, args.datatype)
    args.ops = list(algorithms.OPS) if args.op == "all" else [args.op]
    try:
        args.sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    except ValueError as exc:
        p.error(str(exc))
    for flag in ("iters", "warmup_iters", "check"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag} must not be negative")
    return args


_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "int": "int32",
            "char": "int8", "uint": "uint32"}


def _dtypes(parser, text):
    names = [dt.name for dt in algorithms.DTYPES]
    if text == "all":
        return names
    name = _ALIASES.get(text, text)
    if name not in names:
        parser.error(f"unknown -d {text}; choices: {', '.join(names)}, float, double, half, all")
    return [name]


def time_runs(comm, run, sendbuf, recvbuf, iters, warmup):
    """Mean seconds per call over ``iters`` back-to-back calls after ``warmup``, averaged over ranks."""
    run(sendbuf, recvbuf, check=True)  # one checked call: arguments agree on every rank
    for _ in range(warmup):
        run(sendbuf, recvbuf)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run(sendbuf, recvbuf)
    elapsed = (time.perf_counter() - start) / max(iters, 1)
    return comm.allreduce(elapsed, op=MPI.SUM) / comm.size


def count_wrong(comm, run, dtype, op, count, in_place, checks):
    """Elements that differ from the known answer, summed over ranks and check iterations."""
    wrong = 0
    expected = check_expected(dtype, op, count, comm.size)
    for _ in range(checks):
        sendbuf = check_fill(dtype, op, count, comm.rank, comm.size)
        recvbuf = sendbuf if in_place else np.zeros_like(sendbuf)
        run(sendbuf, recvbuf, check=True)
        wrong += wrong_elements(recvbuf, expected)
    return comm.allreduce(wrong, op=MPI.SUM)


def header(comm, args, algo):
    host = socket.gethostname()
    hosts = comm.allgather(host)
    pids = comm.gather(os.getpid())
    lines = [
        f"# nThread 1 nGpus 1 minBytes {args.minbytes} maxBytes {args.maxbytes} "
        f"step: {args.stepbytes if args.stepbytes else args.stepfactor}"
        f"({'bytes' if args.stepbytes else 'factor'}) warmup iters: {args.warmup_iters} "
        f"iters: {args.iters} agg iters: 1 validation: {1 if args.check else 0} graph: 0",
        "#",
        f"# Algorithm: {algo}  Collective: allreduce  Ranks: {comm.size}  Hosts: {len(set(hosts))}"
        f"  MPI: {MPI.Get_library_version().splitlines()[0].strip()}",
        f"# Machine: {platform.machine()} {cpu_model()}  Python {platform.python_version()}"
        f"  numpy {np.__version__}  Commit: {commit()}",
        f"# Env: {relevant_env()}",
        "#",
        "# Using devices",
    ]
    if comm.rank == 0:
        for rank, (h, pid) in enumerate(zip(hosts, pids)):
            lines.append(f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {h:>10s} device  0 [cpu] host memory")
    lines += ["#", COLUMNS]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    comm = MPI.COMM_WORLD
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    any_wrong = 0
    for algo in args.algos:
        say(header(comm, args, algo), flush=True)
        total_wrong, busbws = 0, []
        for dtype in args.dtypes:
            itemsize = np.dtype(dtype).itemsize
            for op in args.ops:
                if op == "avg" and np.dtype(dtype).kind != "f":
                    continue
                run = RUNNERS[algo](comm, op, args.topology)
                for size in args.sizes:
                    count = size // itemsize
                    nbytes = count * itemsize
                    sendbuf = check_fill(dtype, op, count, comm.rank, comm.size)
                    recvbuf = np.empty_like(sendbuf)
                    results = []
                    for in_place in (False, True):
                        target = sendbuf if in_place else recvbuf
                        seconds = time_runs(comm, run, sendbuf, target, args.iters, args.warmup_iters)
                        algbw, busbw = bandwidths(nbytes, seconds, bus_factor("allreduce", comm.size))
                        wrong = (count_wrong(comm, run, dtype, op, count, in_place, args.check)
                                 if args.check else None)
                        total_wrong += wrong or 0
                        busbws.append(busbw)
                        results.append((seconds, algbw, busbw, wrong))
                    say(row(nbytes, count, dtype, op, -1, results), flush=True)
        say(footer(total_wrong, busbws), flush=True)
        say("#", flush=True)
        any_wrong += total_wrong
    return 1 if any_wrong else 0
