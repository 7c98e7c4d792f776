"""``mpiexec -n N python -m bench plan-fit``: each algorithm's time at small sizes beside what the
cost model prices its plan at, from the time of one message and of one step measured through the
same engine.

Each round times, at every size, three probes run by the engine that runs the plans of that size
(``algorithms/runtime/engine.py``'s choice: the compiled engine up to its threshold): one
reducing exchange with the ring's neighbours (the step the ring takes N-1 times), the same
exchange in three steps (a nonblocking send, a receive that reduces, a wait: the double tree's
way), and two exchanges one after the other; then every algorithm through the same engine (each
algorithm's bound call, without the entry point's checks), the candidates in an order rotated
each round. Half of what the three-step exchange takes beyond the one-step one is a step's own
cost o (the engine taking a step: LogP's overhead). The second exchange's time (the difference
of the one- and two-exchange probes) less o, α + m/β by least squares over the sizes, gives the
links of a uniform network (``topology.model.Network.uniform``); what one exchange takes beyond
o + α + m/β is the call's own cost c (entering and leaving the engine, paid once a call whatever
its steps). Each algorithm's plan is replayed on those links with o a step
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
from algorithms.runtime.plan import isend, recv_reduce, sendrecv_reduce, wait
from algorithms.registry import REGISTERED
from plumbing.files import check_writable, write_json_atomically
from topology.model import Network
from topology.model.replay import replay
from topology.machine import node_numbers

from .plan import plan_that_runs

from ..core.cli import Parser, add_algo_flag, add_size_flags, algos_in
from ..core.machine import results_header
from ..core.sizes import sweep
from ..core.timing import iterations_for, time_calls
from ..formats.stats import median_interval, round_order
from ..formats.tables import size_label

#: the algorithms written as plans that run without a bandwidth matrix
FITTED = tuple(name for name, record in REGISTERED.items() if record.steps is not None and not record.wants_bandwidth())
PROBE, PROBE_SPLIT, PROBE_TWICE = "exchange", "exchange in three steps", "two exchanges"
UNRESOLVED = 1000.0  # GB/s: β where a round's times did not grow with size (no bandwidth term to fit)


def main(argv):
    p = Parser(prog="python -m bench plan-fit", description=__doc__.split("\n\n")[0].replace("``", "'"))
    add_size_flags(p, "8", "4K", 4)
    add_algo_flag(p, "all", f"comma list of {','.join(FITTED)}, or all (default all)")
    p.add_argument("--rounds", type=int, default=9, help="rounds, each timing every size and candidate (default 9)")
    p.add_argument("--within", type=float, default=0.25, help="the target: measured within this share of the "
                   "price (default 0.25)")
    p.add_argument("-J", "--json", metavar="FILE", help="write the rows and the fits as JSON")
    args = p.parse_args(argv)
    try:
        names = algos_in(args.algo, dict(zip(FITTED, FITTED)))
    except ValueError as exc:
        p.error(str(exc))
    if args.rounds < 3 or not 0 < args.within < 1:
        p.error("--rounds must be at least 3 and --within between 0 and 1")
    if args.json:
        check_writable(args.json)
    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        p.error("needs at least 2 ranks (mpiexec -n 2 or more): one rank sends no message to fit")
    sizes = [s for s in sweep(args.minbytes, args.maxbytes, args.stepfactor) if s >= 4]
    samples = measure(comm, names, sizes, probe_sizes(sizes), args.rounds)
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


def exchange_in_three_steps(size, rank, count, itemsize):
    """The one-exchange probe's messages and reduction in three steps: a nonblocking send to the
    right, a receive from the left reduced into the output, a wait for the send."""
    right, left = (rank + 1) % size, (rank - 1) % size
    whole = ("input", 0, count)
    return (isend(right, whole, 0), recv_reduce(left, whole, ("output", 0, count)), wait(0))


def probe(coll, count, build=exchange_steps):
    """The probe ``build`` makes on ``count`` float32, through the engine that runs the algorithms'
    plans of that size (``engine.bound``: the compiled one where it runs)."""
    return engine.bound(coll, build, count, np.dtype(np.float32))


def probe_sizes(sizes):
    """The sizes the probes run at: every power of two from 4 B to the largest of ``sizes``, and
    those (the messages of a plan are its vector's size or a part of it)."""
    top = max(sizes)
    return sorted({1 << k for k in range(2, top.bit_length()) if 1 << k <= top} | set(sizes))


def measure(comm, names, sizes, probed, rounds):
    """{size: {name: [seconds per call, one a round]}}: the algorithms ``names`` at ``sizes``, the
    probes (:data:`PROBE`, :data:`PROBE_SPLIT`, :data:`PROBE_TWICE`) at ``probed``; every size and
    candidate in each round, the candidates' order rotated each round."""
    coll = private_comm(comm).collective(np, "sum")
    calls = {}
    for size in sorted(set(sizes) | set(probed)):
        count = size // 4
        x, y = np.ones(count, np.float32), np.empty(count, np.float32)
        timed = {}
        if size in probed:
            timed = {PROBE: probe(coll, count), PROBE_SPLIT: probe(coll, count, exchange_in_three_steps),
                     PROBE_TWICE: probe(coll, count, exchanges_twice)}
        if size in sizes:
            for name in names:  # a first call builds what an algorithm builds collectively (hier's nodes)
                algorithms.allreduce(x, y, algorithm=name, comm=comm, check=False)
            timed.update({name: coll.runner(algorithms.ALGORITHMS[name], count, x.dtype) for name in names})
        calls[size] = {name: (lambda run=run, x=x, y=y: run(x, y)) for name, run in timed.items()}  # this size's vectors
    samples = {size: {name: [] for name in calls[size]} for size in calls}
    for index in range(rounds):
        for size in calls:
            iters = min(iterations_for(size), 500)
            for name in round_order(list(calls[size]), index):
                seconds, _ = time_calls(comm, calls[size][name], iters, min(50, iters))
                samples[size][name].append(comm.allreduce(seconds, op=MPI.MAX))
    return samples


def price(nodes, names, sizes, samples):
    """(each round's fit ``{"call_us", "step_us", "alpha_us", "beta_GBps", "message_us"}``, the
    rows): each round's c, o and a message's time at each probe size from its probes
    (:func:`fit`), and each plan (hier's on the ranks' ``nodes``) replayed with o a step and each
    message priced at the time measured for its size (interpolated between the probe sizes), plus
    c; α and β: the least-squares line of the messages' times, for the header (a message holds
    no port beyond its measured time: ``Network.uniform`` of :data:`UNRESOLVED` GB/s)."""
    n = len(nodes)
    probed = sorted(size for size in samples if PROBE in samples[size])
    rounds = len(samples[probed[0]][PROBE])
    fits, priced = [], {(size, name): [] for size in sizes for name in names}
    for r in range(rounds):
        once, twice, split = (np.array([samples[size][name][r] for size in probed])
                              for name in (PROBE, PROBE_TWICE, PROBE_SPLIT))
        call, step, way = fit(once, twice, split)
        slope, alpha = np.polyfit(probed, way, 1) if len(probed) > 1 else (0.0, way[0])
        alpha, beta = max(alpha, 1e-9), 1.0 / slope if slope > 0 else UNRESOLVED * 1e9
        fits.append({"call_us": call * 1e6, "step_us": step * 1e6, "alpha_us": alpha * 1e6, "beta_GBps": beta / 1e9,
                     "message_us": {str(size): t * 1e6 for size, t in zip(probed, way)}})
        # each message takes the time measured for its size, ports and links holding it for none
        network = Network.uniform(n, UNRESOLVED, alpha * 1e6, nodes=nodes, intra_GBps=UNRESOLVED)

        def message(nbytes, way=way):
            return float(np.interp(nbytes, probed, way))
        for size in sizes:
            for name in names:
                record = plan_that_runs(name, nodes)
                extra = () if record.plan_input is None else (record.plan_input(n, None, nodes),)
                plan = [record.steps(n, k, size // 4, 4, *extra) for k in range(n)]
                priced[size, name].append(call + replay(plan, 4, network, step, message).seconds)
    rows = []
    for size in sizes:
        for name in names:
            measured, model = samples[size][name], priced[size, name]
            rows.append({"bytes": size, "algorithm": name, "measured_us": _us(median_interval(measured)),
                         "priced_us": _us(median_interval(model)),
                         "ratio": _plain(median_interval([a / b for a, b in zip(measured, model) if b > 0]))})
    return fits, rows


def fit(once, twice, split):
    """``(call, step, way)`` from one round's times of one exchange (``once``), of two
    (``twice``) and of one in three steps (``split``) at each probe size, as the replay prices the
    probes: two exchanges take c + 2(o + t), one c + o + t, t a message's way, so the second
    exchange, D = ``twice - once``, is o + t; the one in three steps takes d = ``split - once``
    more than one, which is o where its receive waits for the message (t >= o: the wait step's o)
    and 3o - D where it does not (the receive's o outlasts the message's way). o: the median over
    the sizes of each size's (:func:`step_cost`); ``way``: D - o at each size, in seconds; the
    call's own cost c: what one exchange takes beyond o + t (its median over the sizes, at least
    0)."""
    step = float(np.median([step_cost(d, second) for d, second in zip(split - once, twice - once)]))
    way = np.maximum(twice - once - step, 0.0)
    call = max(float(np.median(once - step - way)), 0.0)
    return call, step, way


def step_cost(extra, second):
    """A step's own cost o from what the three-step exchange takes beyond the one-step one
    (``extra`` = o + max(0, 2o - D), the replay's price of it) and the second exchange's time
    ``second`` = D; 0 where the extra is not positive (noise)."""
    if extra <= 0:
        return 0.0
    return extra if 2 * extra <= second else (extra + second) / 3


def lines(n, fits, rows, within):
    call = median_interval([f["call_us"] for f in fits])
    step = median_interval([f["step_us"] for f in fits])
    alpha = median_interval([f["alpha_us"] for f in fits])
    beta = median_interval([f["beta_GBps"] for f in fits])
    beta_text = (f"beta {beta.median:.2f} GB/s [{beta.low:.2f}, {beta.high:.2f}]" if beta.median < UNRESOLVED else
                 f"beta unresolved (in most rounds the times did not grow with size; {UNRESOLVED:g} GB/s taken)")
    out = [f"# plan-fit: {n} ranks; one reducing exchange, the same in three steps, and two exchanges "
           f"through the engine, fitted each round: a call {call.median:.2f} us [{call.low:.2f}, {call.high:.2f}], "
           f"a step's own cost o {step.median:.2f} us [{step.low:.2f}, {step.high:.2f}]; each message priced at "
           f"the second exchange's time at its size less o, whose line is alpha {alpha.median:.2f} us "
           f"[{alpha.low:.2f}, {alpha.high:.2f}], {beta_text} (95% intervals over {len(fits)} rounds)",
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
