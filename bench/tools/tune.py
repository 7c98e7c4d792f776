"""``mpiexec -n N python -m bench tune``: time every candidate of ``algorithm="auto"`` at each size
and write the tuning table that auto follows.

The candidates are our algorithms that need no bandwidth matrix, native ``MPI_Allreduce`` among them
(:func:`algorithms.auto.candidates`; "native" through our entry point, as auto would call it); for each size (8 B, and -b to -e by -f) they are timed in turn,
out of place, on host vectors of each ``--datatype`` with ``--op``, ``--repeats`` times, median kept
(:func:`bench.core.timing.timed`: slowest rank, mean over the iterations of a turn). Each measured size
gets a rule listing the candidates fastest first; a rule covers the sizes up to the geometric mean
of its size and the next, so a call between measured sizes takes its nearer neighbour's choice.
The rules of the first datatype also stand for every other ("*"). Writes the table, the machine
and the times (rank 0, atomically; default ``results/tuning-<host>-<N>r.json``) and prints them.
Then ``ALLREDUCE_TUNING_FILE=FILE`` makes ``algorithm="auto"`` follow it on communicators of
the same rank and node count. With more ranks than cores the times measure the scheduler, so the
table says it is oversubscribed.
"""

import argparse
import functools
import math

import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.auto import SCHEMA, candidates
from algorithms.ops import check_op_dtype, dtype_index
from topology.files import write_json_atomically
from topology.probe import node_numbers

from ..core.collectives import lacking
from ..core.machine import describe, oversubscription, tuning_path
from ..core.options import ALIASES
from ..core.sizes import parse_size, sweep
from ..core.startup import refused
from ..core.timing import iterations_for, timed


def measure(comm, dtype, op, sizes, repeats, names):
    """{bytes: {candidate: seconds per call}} on ``comm``, every candidate timed in turn at each size."""
    rows = {}
    for nbytes in sizes:
        count = max(nbytes // dtype.itemsize, 1)
        x = np.ones(count, dtype)
        y = np.empty_like(x)
        calls = {name: functools.partial(algorithms.allreduce, x, y, op=op, algorithm=name, comm=comm, check=False)
                 for name in names if not lacking(name, dtype)}  # native: MPI has no bfloat16 or fp8
        iters = iterations_for(count * dtype.itemsize)
        rows[count * dtype.itemsize] = timed(comm, calls, iters, max(2, iters // 10), repeats)
    return rows


def rules(times, dtype):
    """One rule per measured size: candidates fastest first, up to the geometric mean with the next size."""
    sizes = sorted(times)
    out = []
    for i, nbytes in enumerate(sizes):
        upto = math.isqrt(nbytes * sizes[i + 1]) if i + 1 < len(sizes) else None
        order = sorted(times[nbytes], key=times[nbytes].get)
        out.append({"placement": "host", "dtype": dtype, "upto_bytes": upto, "measured_bytes": nbytes,
                    "order": order})
    return out


def text_table(times):
    names = list(next(iter(times.values())))
    lines = ["bytes " + " ".join(f"{n + ' us':>11}" for n in names) + "  fastest"]
    for nbytes, row in sorted(times.items()):
        lines.append(f"{nbytes:>5} " + " ".join(f"{row[n] * 1e6:>11.1f}" for n in names)
                     + f"  {min(row, key=row.get)}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench tune", description=(
        "Time every candidate of algorithm=\"auto\" at each size, in turn, and write the tuning table auto "
        "follows (run it under mpiexec, on the ranks the table is for)."))
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("1K"),
                   help="smallest vector after 8 B, in bytes; K, M, G are powers of 1024 (default 1K)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("256M"),
                   help="largest vector, in bytes (default 256M)")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier between sizes (default 2)")
    p.add_argument("-d", "--datatype", default="float32",
                   help="comma list of element types (float32, float64, bfloat16, int32, ..., or float, double, "
                        "half, bf16, f8e4m3, f8e5m2, int); "
                        "the first also stands for the others (default float32)")
    p.add_argument("--op", default="sum", choices=list(algorithms.OPS), help="reduction op (default sum)")
    p.add_argument("--repeats", type=int, default=5, help="turns of every candidate per size; median kept (default 5)")
    p.add_argument("--algo", default="all",
                   help=f"comma list of candidates, of {','.join(candidates())} (default all)")
    p.add_argument("-o", "--output", help="the table's path (default results/tuning-<host>-<N>r.json)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    problem = None
    try:
        dtypes = [np.dtype(ALIASES.get(name.strip(), name.strip())) for name in args.datatype.split(",")]
        for dtype in dtypes:
            check_op_dtype(args.op, dtype)
            dtype_index(dtype)
        names = candidates() if args.algo == "all" else [a.strip() for a in args.algo.split(",")]
        unknown = [a for a in names if a not in candidates()]
        if unknown:
            raise ValueError(f"unknown --algo {','.join(unknown)}; candidates: {','.join(candidates())}")
        if args.stepfactor < 2 or args.repeats < 1 or args.minbytes > args.maxbytes:
            raise ValueError("need -f >= 2, --repeats >= 1 and -b <= -e")
    except (TypeError, ValueError) as exc:
        problem = exc
    if problem is not None:
        if comm.Get_rank() == 0:
            print(f"python -m bench tune: {problem}", flush=True)
        return 2
    output = args.output or tuning_path(comm)
    if refused(comm, "python -m bench tune", (output,)):
        return 2
    crowded = oversubscription(comm)
    sizes = sorted({8, *sweep(args.minbytes, args.maxbytes, args.stepfactor)})
    nodes = len(set(node_numbers(comm)))
    measured = {dtype.name: measure(comm, dtype, args.op, sizes, args.repeats, names) for dtype in dtypes}
    if comm.Get_rank() == 0:
        table = {"schema": SCHEMA, "ranks": comm.Get_size(), "nodes": nodes, "op": args.op,
                 "machine": describe(), "oversubscribed": crowded,
                 "rules": [rule for name, times in measured.items() for rule in rules(times, name)]
                 + [{**rule, "dtype": "*"} for rule in rules(measured[dtypes[0].name], "*")],
                 "measured_us": {name: {str(b): {k: round(v * 1e6, 3) for k, v in row.items()}
                                        for b, row in times.items()} for name, times in measured.items()}}
        write_json_atomically(output, table)
        for name, times in measured.items():
            print(f"# {name} {args.op}, {comm.Get_size()} ranks on {nodes} node(s)"
                  + (f" ({crowded}: the times measure the scheduler)" if crowded else ""))
            print(text_table(times))
        print(f"wrote {output}; ALLREDUCE_TUNING_FILE={output} makes algorithm=\"auto\" follow it", flush=True)
    return 0

