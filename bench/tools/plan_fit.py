"""``mpiexec -n N python -m bench plan-fit``: each algorithm's time at small sizes beside what the
cost model prices its plan at, from the time of one message measured through the same engine.

Each round times, at every size, two probes run by the engine that runs the plans of that size
(``algorithms/runtime/engine.py``'s choice: the compiled engine up to its threshold): one
reducing exchange with the ring's neighbours (the step the ring takes N-1 times), and two such
exchanges one after the other; then every algorithm through the same engine (each algorithm's
bound call, without the entry point's checks), the candidates in an order rotated each round.
The second exchange's time (the two probes' difference), α + m/β by least squares over the
sizes, gives the links of a uniform network (``topology.model.Network.uniform``); what one
exchange takes beyond it is the call's own cost c (entering and leaving the engine, paid once a
call whatever its steps). Each algorithm's plan is replayed on those links
(``topology/model/replay.py``) at each size and priced at c plus the replay. So each round gives
a measured time and a price per algorithm and size; the table shows the medians with their 95%
intervals and the paired ratio, measured over priced, with its interval, judged against
1 ± ``--within``: met where the interval lies inside, missed where it lies outside, a tie where
it straddles a bound."""

import sys

import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.runtime import engine
from algorithms.runtime.executor import private_comm
from algorithms.runtime.plan import sendrecv_reduce
from algorithms.registry import REGISTERED
from plumbing.files import check_writable, write_json_atomically
from topology.model import Network
from topology.model.replay import replay
from topology.probe import node_numbers

from ..core.cli import Parser, add_size_flags
from ..core.machine import results_header
from ..core.sizes import sweep
from ..core.timing import iterations_for, time_calls
from ..formats.stats import median_interval, round_order
from ..formats.tables import size_label

#: the algorithms written as plans that run without a bandwidth matrix
FITTED = tuple(name for name, record in REGISTERED.items() if record.steps is not None and not record.wants_bandwidth())
PROBE, PROBE_TWICE = "exchange", "two exchanges"
UNRESOLVED = 1000.0  # GB/s: β where a round's times did not grow with size (no bandwidth term to fit)


def main(argv):
    p = Parser(prog="python -m bench plan-fit", description=__doc__.split("\n\n")[0].replace("``", "'"))
    add_size_flags(p, "8", "4K", 4)
    p.add_argument("--algo", default=",".join(FITTED), help=f"comma list of {','.join(FITTED)} (default all)")
    p.add_argument("--rounds", type=int, default=9, help="rounds, each timing every size and candidate (default 9)")
    p.add_argument("--within", type=float, default=0.25, help="the target: measured within this share of the "
                   "price (default 0.25)")
    p.add_argument("-J", "--json", metavar="FILE", help="write the rows and the fits as JSON")
    args = p.parse_args(argv)
    names = args.algo.split(",")
    unknown = [name for name in names if name not in FITTED]
    if unknown or args.rounds < 3 or not 0 < args.within < 1:
        p.error(f"--algo {','.join(unknown)}: choices {','.join(FITTED)}" if unknown else
                "--rounds must be at least 3 and --within between 0 and 1")
    if args.json:
        check_writable(args.json)
    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        p.error("needs at least 2 ranks (mpiexec -n 2 or more): one rank sends no message to fit")
    sizes = [s for s in sweep(args.minbytes, args.maxbytes, args.stepfactor) if s >= 4]
    samples = measure(comm, names, sizes, args.rounds)
    fits, rows = price(node_numbers(comm), names, sizes, samples)
    header = results_header("plan-fit", comm=comm)  # collective
    if comm.Get_rank() == 0:
        print("\n".join(lines(comm.Get_size(), fits, rows, args.within)))
        if args.json:
            write_json_atomically(args.json, {**header, "within": args.within, "fits": fits, "rows": rows})
    return 0


def exchange_steps(size, rank, count, itemsize, times=1):
    """The probes' plan: ``times`` reducing exchanges of ``count`` elements with the ring's
    neighbours, one after the other (each reduces what it receives into the output)."""
    right, left = (rank + 1) % size, (rank - 1) % size
    whole = ("input", 0, count)
    first = sendrecv_reduce(right, whole, left, whole, ("output", 0, count))
    again = sendrecv_reduce(right, whole, left, ("output", 0, count), ("output", 0, count))
    return (first,) + (again,) * (times - 1)


def exchanges_twice(size, rank, count, itemsize):
    return exchange_steps(size, rank, count, itemsize, 2)


def probe(coll, count, build=exchange_steps):
    """The probe ``build`` makes on ``count`` float32, through the engine that runs the algorithms'
    plans of that size (``engine.bound``: the compiled one where it runs)."""
    return engine.bound(coll, build, count, np.dtype(np.float32))


def measure(comm, names, sizes, rounds):
    """{size: {name: [seconds per call, one a round]}}, the probe (:data:`PROBE`) among the names;
    every size and candidate in each round, the candidates' order rotated each round."""
    coll = private_comm(comm).collective(np, "sum")
    calls = {}
    for size in sizes:
        count = size // 4
        x, y = np.ones(count, np.float32), np.empty(count, np.float32)
        once, twice = probe(coll, count), probe(coll, count, exchanges_twice)
        for name in names:  # a first call builds what an algorithm builds collectively (hier's nodes)
            algorithms.allreduce(x, y, algorithm=name, comm=comm, check=False)
        runners = {name: coll.runner(algorithms.ALGORITHMS[name], count, x.dtype) for name in names}
        timed = {PROBE: once, PROBE_TWICE: twice, **runners}  # each on this size's vectors
        calls[size] = {name: (lambda run=run, x=x, y=y: run(x, y)) for name, run in timed.items()}
    samples = {size: {name: [] for name in calls[size]} for size in sizes}
    for index in range(rounds):
        for size in sizes:
            iters = min(iterations_for(size), 500)
            for name in round_order(list(calls[size]), index):
                seconds, _ = time_calls(comm, calls[size][name], iters, min(50, iters))
                samples[size][name].append(comm.allreduce(seconds, op=MPI.MAX))
    return samples


def price(nodes, names, sizes, samples):
    """(each round's fit ``{"call_us", "alpha_us", "beta_GBps"}``, the rows): each round's α and β
    from its second exchanges (:func:`fit`), and each plan (hier's on the ranks' ``nodes``) replayed
    on uniform links of those at each size, plus the call's own cost."""
    n, rounds = len(nodes), len(samples[sizes[0]][PROBE])
    fits, priced = [], {(size, name): [] for size in sizes for name in names}
    for r in range(rounds):
        once = np.array([samples[size][PROBE][r] for size in sizes])
        twice = np.array([samples[size][PROBE_TWICE][r] for size in sizes])
        call, alpha, beta = fit(np.array(sizes, dtype=float), once, twice)
        fits.append({"call_us": call * 1e6, "alpha_us": alpha * 1e6, "beta_GBps": beta / 1e9})
        network = Network.uniform(n, beta / 1e9, alpha * 1e6, nodes=nodes, intra_GBps=beta / 1e9)
        for size in sizes:
            for name in names:
                record = REGISTERED[name]
                extra = () if record.plan_input is None else (record.plan_input(n, None, nodes),)
                plan = [record.steps(n, k, size // 4, 4, *extra) for k in range(n)]
                priced[size, name].append(call + replay(plan, 4, network).seconds)
    rows = []
    for size in sizes:
        for name in names:
            measured, model = samples[size][name], priced[size, name]
            rows.append({"bytes": size, "algorithm": name, "measured_us": _us(median_interval(measured)),
                         "priced_us": _us(median_interval(model)),
                         "ratio": _plain(median_interval([a / b for a, b in zip(measured, model) if b > 0]))})
    return fits, rows


def fit(sizes, once, twice):
    """``(call, alpha, beta)`` in seconds and bytes a second from one round's times of one exchange
    (``once``) and of two (``twice``) at each of ``sizes`` bytes: the second exchange, ``twice -
    once``, is α + m/β (least squares); the call's own cost is what one exchange takes beyond
    that (its median over the sizes, at least 0)."""
    step = twice - once
    slope, alpha = np.polyfit(sizes, step, 1) if len(sizes) > 1 else (0.0, step[0])
    alpha, beta = max(alpha, 1e-9), 1.0 / slope if slope > 0 else UNRESOLVED * 1e9
    call = max(float(np.median(once - (alpha + sizes / beta))), 0.0)
    return call, alpha, beta


def lines(n, fits, rows, within):
    call = median_interval([f["call_us"] for f in fits])
    alpha = median_interval([f["alpha_us"] for f in fits])
    beta = median_interval([f["beta_GBps"] for f in fits])
    beta_text = (f"beta {beta.median:.2f} GB/s [{beta.low:.2f}, {beta.high:.2f}]" if beta.median < UNRESOLVED else
                 f"beta unresolved (in most rounds the times did not grow with size; {UNRESOLVED:g} GB/s taken)")
    out = [f"# plan-fit: {n} ranks; one and two reducing exchanges through the engine, fitted each round: "
           f"a call {call.median:.2f} us [{call.low:.2f}, {call.high:.2f}], a step's alpha "
           f"{alpha.median:.2f} us [{alpha.low:.2f}, {alpha.high:.2f}], {beta_text} (95% intervals over "
           f"{len(fits)} rounds)",
           f"# {'size':>8s}  {'algorithm':13s} {'measured us':>24s}  {'priced us':>9s}  "
           f"{'measured/priced':>22s}  within {within:.0%}"]
    for row in rows:
        m, ratio = row["measured_us"], row["ratio"]
        out.append(f"  {size_label(row['bytes']):>8s}  {row['algorithm']:13s} {m['median']:8.2f} "
                   f"[{m['low']:6.2f}, {m['high']:6.2f}]  {row['priced_us']['median']:9.2f}  "
                   f"{ratio['median']:6.2f} [{ratio['low']:5.2f}, {ratio['high']:5.2f}]  "
                   f"{verdict(ratio, within)}")
    return out


def verdict(ratio, within):
    """"met" where the ratio's interval lies within 1 ± ``within``, "missed" where it lies outside,
    else "tie" (noise decides)."""
    low, high = 1 - within, 1 + within
    if low <= ratio["low"] and ratio["high"] <= high:
        return "met"
    if ratio["high"] < low or ratio["low"] > high:
        return "missed"
    return "tie"


def _us(interval):
    return {key: value * 1e6 for key, value in _plain(interval).items()}


def _plain(interval):
    return {"median": interval.median, "low": interval.low, "high": interval.high}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
