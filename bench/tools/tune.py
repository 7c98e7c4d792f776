"""``mpiexec -n N python -m bench tune``: time every candidate of ``algorithm="auto"`` at each size
and write the tuning table that auto follows.

The candidates are our algorithms that need no bandwidth matrix, native ``MPI_Allreduce`` among them
(:func:`algorithms.auto.candidates`; "native" through our entry point, as auto would call it); for each size (8 B, and -b to -e by -f) they are timed in turn,
out of place, on host vectors of each ``--datatype`` with ``--op``, in ``--repeats`` rounds
(:func:`bench.core.timing.timed`: slowest rank, mean over the iterations of a turn, the order
rotated each round). Each measured size gets a rule: its first candidate is the one auto ran
before (the incumbent: the rule of ``--tuning``'s table, else of ``ALLREDUCE_TUNING_FILE``'s, else
of the table already at the output path, else the cost model's choice; the first candidate where that one was not timed) unless a
challenger's paired time over the incumbent's, round by round, has a 95% interval wholly below 1
(:func:`decide`; :mod:`bench.formats.stats`), then the others by median time. Each rule records
that interval and the candidates that tie with its choice. A rule covers the sizes up to the
geometric mean of its size and the next, so a call between measured sizes takes its nearer
neighbour's choice.
The rules of the first datatype also stand for every other ("*"). ``--collective`` tunes the
reduce-scatter and the all-gather too (``reducescatter``, ``allgather``: the candidates that have
them, timed on the whole vector's size as nccl-tests sizes them); each rule names its collective,
and a table keeps the rules of the collectives not tuned from the standing table.
Writes the table, the machine and the times (rank 0, atomically; default
``results/tuning-<host>-<N>r.json``; the all-reduce's times as ``measured_us``, the others' as
``reduce_scatter_measured_us`` ...) and prints them.
Then the Python and the compiled engine are timed against each other (:mod:`.tune_engine`), and
the table keeps the size up to which the compiled one runs plans (``"engine"``).
Then ``ALLREDUCE_TUNING_FILE=FILE`` makes ``algorithm="auto"`` follow it on communicators of
the same rank and node count, and ``ALLREDUCE_ENGINE=auto`` its engine threshold on one node.
With more ranks than cores the times measure the scheduler, so the table says it is oversubscribed.
"""

import functools
import math
import os
import sys

import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.auto import SCHEMA, candidates, load_table
from algorithms.ops import check_op_dtype
from plumbing.files import write_json_atomically

from ..core.cli import Parser, add_algo_flag, add_dtype_flag, add_size_flags, algos_in
from ..core.machine import results_header, tuning_path
from ..core.sizes import sweep
from ..core.startup import refused
from ..core.timing import intervals, iterations_for, timed
from ..formats.stats import FULL_ROUNDS, LEVEL, median, paired_ratio
from ..formats.stats import coverage as stats_coverage
from ..formats.tables import plural, size_label
from . import tune_engine


def decide(rounds, incumbent, level=LEVEL):
    """Which candidate a size's rule puts first, from ``rounds`` ({name: [seconds per round]},
    every list from the same rounds): a challenger replaces ``incumbent`` only where its paired
    time over the incumbent's has an interval (at ``level``) wholly below 1, and of those the one
    of least median ratio wins; else the incumbent stays. Returns {"choice", "incumbent",
    "replaced", "challenger" (the winner, else the fastest other by median time, else None),
    "ratio" (the challenger's paired ratio over the incumbent, an Interval, else None), "ties"
    (the others whose paired time over the choice's has an interval holding 1), "order" (the
    choice, then the others by median time)}."""
    others = [name for name in rounds if name != incumbent]
    ratios = {name: paired_ratio(rounds[name], rounds[incumbent], level) for name in others}
    faster = [name for name in others if ratios[name].high < 1.0]
    if faster:
        choice = challenger = min(faster, key=lambda name: ratios[name].median)
    else:
        choice, challenger = incumbent, min(others, key=lambda name: median(rounds[name]), default=None)
    rest = sorted((name for name in rounds if name != choice), key=lambda name: median(rounds[name]))
    return {"choice": choice, "incumbent": incumbent, "replaced": choice != incumbent, "challenger": challenger,
            "ratio": ratios.get(challenger), "ties": [name for name in rest
                                                      if paired_ratio(rounds[name], rounds[choice], level).holds(1.0)],
            "order": [choice, *rest]}


#: --collective (the benchmark's names) -> the collective's name in algorithms and in a table's rules
COLLECTIVES = {"allreduce": "allreduce", "reducescatter": "reduce_scatter", "allgather": "all_gather"}


def call_of(comm, collective, name, x, op):
    """The call timed for candidate ``name`` of ``collective`` on the whole vector ``x``, out of
    place: the all-reduce of x, its reduce-scatter into this rank's chunk, or the all-gather of
    this rank's chunk into a vector as long."""
    if collective == "allreduce":
        return functools.partial(algorithms.allreduce, x, np.empty_like(x), op=op, algorithm=name, comm=comm,
                                 check=False)
    offsets = algorithms.chunk_offsets(x.size, comm.Get_size())
    own = offsets[comm.Get_rank() + 1] - offsets[comm.Get_rank()]
    if collective == "reduce_scatter":
        return functools.partial(algorithms.reduce_scatter, x, np.empty(own, x.dtype), op=op, algorithm=name,
                                 comm=comm, check=False)
    return functools.partial(algorithms.all_gather, x[:own].copy(), np.empty_like(x), algorithm=name, comm=comm,
                             check=False)


def measure(comm, dtype, op, sizes, repeats, names, collective="allreduce"):
    """{bytes: ({candidate: [seconds per round]}, (incumbent, why))} on ``comm``: every candidate
    of ``collective`` timed in turn at each size (the whole vector's), and what auto ran there
    before (:func:`algorithms.auto.choice`: the table it follows, else the model), or the first
    candidate where that one was not timed."""
    rows = {}
    for nbytes in sizes:
        count = max(nbytes // dtype.itemsize, 1)
        x = np.ones(count, dtype)
        calls = {name: call_of(comm, collective, name, x, op)
                 for name in names if not algorithms.ALGORITHMS[name].lacks(dtype)}  # native: MPI has no bf16, fp8
        iters = iterations_for(count * dtype.itemsize)
        standing = algorithms.auto.choice(count * dtype.itemsize, dtype.name, comm=comm, op=op, collective=collective)
        if standing[0] not in calls:
            standing = (next(iter(calls)), f"the first candidate (auto ran {standing[0]}, not timed here)")
        rows[count * dtype.itemsize] = (timed(comm, calls, iters, max(2, iters // 10), repeats), standing)
    return rows


def rules(measured, dtype, collective="allreduce"):
    """One rule per measured size of ``collective``, first its :func:`decide` choice, up to the
    geometric mean with the next size; each with the incumbent, where it came from, and the
    interval behind the choice."""
    sizes = sorted(measured)
    out = []
    for i, nbytes in enumerate(sizes):
        upto = math.isqrt(nbytes * sizes[i + 1]) if i + 1 < len(sizes) else None
        rounds, (incumbent, why) = measured[nbytes]
        decision = decide(rounds, incumbent)
        ratio = decision["ratio"]
        out.append({"collective": collective, "placement": "host", "dtype": dtype, "upto_bytes": upto, "measured_bytes": nbytes,
                    "order": decision["order"], "incumbent": incumbent, "incumbent_from": why,
                    "replaced": decision["replaced"], "challenger": decision["challenger"],
                    "challenger_over_incumbent": ratio and ratio.as_dict(), "ties": decision["ties"]})
    return out


def text_blocks(measured, dtype_rules):
    """Per size: the choice and why, then every candidate's median and interval (us) and its
    paired time over the choice's, fastest first."""
    lines = []
    for rule in dtype_rules:
        rounds = measured[rule["measured_bytes"]][0]
        choice, ratio = rule["order"][0], rule["challenger_over_incumbent"]
        evidence = ratio and (f"{rule['challenger']}'s paired time over {rule['incumbent']}'s "
                              f"{ratio['median']:.3g}x [{ratio['ci_low']:.3g}, {ratio['ci_high']:.3g}]")
        head = (f"{choice} replaces {rule['incumbent']} ({rule['incumbent_from']}): {evidence}" if rule["replaced"]
                else f"{choice} stays ({rule['incumbent_from']}): no candidate's paired time over it lies wholly "
                     f"below 1" + (f" (the fastest other: {evidence})" if evidence else ""))
        ties = f"; tie with {choice} (within noise): {', '.join(rule['ties'])}" if rule["ties"] else ""
        lines.append(f"{size_label(rule['measured_bytes'])}: {head}{ties}")
        spans = intervals({name: [t * 1e6 for t in times] for name, times in rounds.items()})
        for name in rule["order"]:
            over = "" if name == choice else f"  {paired_ratio(rounds[name], rounds[choice]).text(unit='x')} of {choice}"
            lines.append(f"  {name:<13} {spans[name].text('{:.2f}')} us{over}")
    return "\n".join(lines)


def standing_table(comm, given, output):
    """The table whose choices stand until measured beaten: ``given`` (``--tuning``, else
    ``ALLREDUCE_TUNING_FILE``), else ``output`` where it already holds a tuning table, else None
    (the cost model's choices; collective)."""
    if given:
        return given
    found = None
    if comm.Get_rank() == 0 and os.path.exists(output):
        try:
            load_table(output)
            found = output
        except ValueError:
            pass  # not a table: the model's choices stand, and the file is written over
    return comm.bcast(found, root=0)


def main(argv=None):
    p = Parser(prog="python -m bench tune", description=(
        "Time every candidate of algorithm=\"auto\" at each size, in turn, round after round, and write the "
        "tuning table auto follows (run it under mpiexec, on the ranks the table is for). At each size the "
        "incumbent, what auto ran before, stays unless a candidate's time over its own, round by round, has a "
        "95% confidence interval wholly below 1; the table records that interval and the candidates that tie."))
    add_size_flags(p, "1K", "256M", 2, what="vector (after 8 B)")
    add_dtype_flag(p, "float32", "comma list of element types; the first also stands for the others", many=True)
    p.add_argument("--op", default="sum", choices=list(algorithms.OPS), help="reduction op (default sum)")
    p.add_argument("--repeats", type=int, default=7,
                   help="rounds per size, each candidate timed once a round; medians and paired ratios over them, "
                        "with 95%% intervals from 6 rounds on (default 7)")
    p.add_argument("--collective", default="allreduce",
                   help="comma list of the collectives to tune, of allreduce, reducescatter and allgather "
                        "(default allreduce); a table holds rules for each, and the rules of those not tuned "
                        "are kept from the standing table")
    add_algo_flag(p, "all", f"comma list of candidates, of {','.join(candidates())} (default all; of each "
                  "collective's candidates, those named)")
    p.add_argument("-o", "--output", help="the table's path (default results/tuning-<host>-<N>r.json)")
    p.add_argument("--tuning", metavar="FILE",
                   help="the table whose choices stand unless a candidate is measured faster (default: "
                        "ALLREDUCE_TUNING_FILE, else the table already at the output path, else the cost model)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    problem = None
    try:
        dtypes = [row.dtype for row in args.datatype.rows]
        for dtype in dtypes:
            check_op_dtype(args.op, dtype)
        collectives = [c.strip() for c in args.collective.split(",")]
        bad = [c for c in collectives if c not in COLLECTIVES]
        if bad or not collectives:
            raise ValueError(f"unknown --collective {','.join(bad)}; choices: {','.join(COLLECTIVES)}")
        every = [name for name in candidates() if any(name in candidates(COLLECTIVES[c]) for c in collectives)]
        names = algos_in(args.algo, dict(zip(every, every)))
        if args.stepfactor < 2 or args.repeats < 1 or args.minbytes > args.maxbytes:
            raise ValueError("need -f >= 2, --repeats >= 1 and -b <= -e")
    except (TypeError, ValueError) as exc:
        problem = exc
    if problem is not None:
        if comm.Get_rank() == 0:
            print(f"python -m bench tune: {problem}", flush=True)
        return 2
    output = args.output or tuning_path(comm)
    standing = standing_table(comm, args.tuning or os.environ.get("ALLREDUCE_TUNING_FILE"), output)
    if standing:  # read by auto on first use, on every rank alike: its choices are the incumbents
        os.environ["ALLREDUCE_TUNING_FILE"] = standing
    if refused(comm, "python -m bench tune", (output,), tuning=True):
        return 2
    header = results_header("tune", SCHEMA, comm, ["tune", *(sys.argv[1:] if argv is None else argv)])
    sizes = sorted({8, *sweep(args.minbytes, args.maxbytes, args.stepfactor)})
    tuned = [COLLECTIVES[c] for c in collectives]
    measured = {(c, dtype.name): measure(comm, dtype, args.op, sizes, args.repeats,
                                         [n for n in names if n in candidates(c)], c)
                for c in tuned for dtype in dtypes}
    engine_rows, why = tune_engine.measure(comm, dtypes[0], args.op, sizes, args.repeats)
    engine = tune_engine.threshold(engine_rows) if engine_rows else None
    if comm.Get_rank() == 0:
        before = load_table(standing) if standing else {"rules": []}
        kept = [rule for rule in before["rules"] if rule.get("collective", "allreduce") not in tuned]

        def per(c, field):  # {dtype: {bytes: {candidate: field(rounds)}}} of collective c
            return {name: {str(b): field(rounds) for b, (rounds, _) in times.items()}
                    for (cc, name), times in measured.items() if cc == c}
        table = {"schema": SCHEMA, **header, "op": args.op,
                 "rules": kept + [rule for c in tuned for (cc, name), times in measured.items() if cc == c
                                  for rule in rules(times, name, c)]
                 + [{**rule, "dtype": "*"} for c in tuned for rule in rules(measured[c, dtypes[0].name], "*", c)],
                 "engine": engine or {"compiled_bytes": None, "why": why}}
        for c in set(COLLECTIVES.values()) - set(tuned):  # the times behind the kept rules, kept
            prefix = "" if c == "allreduce" else f"{c}_"
            table.update({key: before[key] for key in (f"{prefix}measured_us", f"{prefix}intervals_us",
                                                       f"{prefix}rounds_us") if key in before})
        for c in tuned:  # the all-reduce's as measured_us, ...; the others' as reduce_scatter_measured_us, ...
            prefix = "" if c == "allreduce" else f"{c}_"
            table[f"{prefix}measured_us"] = per(c, lambda rounds: {k: round(median(v) * 1e6, 3) for k, v in rounds.items()})
            table[f"{prefix}intervals_us"] = per(c, lambda rounds: {k: v.as_dict(1e6) for k, v in intervals(rounds).items()})
            table[f"{prefix}rounds_us"] = per(c, lambda rounds: {k: [t * 1e6 for t in v] for k, v in rounds.items()})
        write_json_atomically(output, table)
        coverage = stats_coverage(args.repeats) if args.repeats < FULL_ROUNDS else None
        for (c, name), times in measured.items():
            print(f"# {c} {name}{'' if c == 'all_gather' else ' ' + args.op}, {comm.Get_size()} ranks on {header['nodes']} node(s), "
                  f"{plural(args.repeats, 'round')} a size: "
                  "medians with 95% intervals" + (f" (below 6 rounds the whole range, which holds the median "
                                                  f"{coverage:.0%} of the time)" if coverage is not None else "")
                  + (f" ({header['oversubscribed']}: the times measure the scheduler)"
                     if header["oversubscribed"] else ""))
            print(text_blocks(times, [r for r in table["rules"]
                                      if r["dtype"] == name and r.get("collective", "allreduce") == c]))
        print(tune_engine.text(engine, why))
        print(f"wrote {output}; ALLREDUCE_TUNING_FILE={output} makes algorithm=\"auto\" follow it, and the "
              "compiled engine run up to its threshold", flush=True)
    return 0

