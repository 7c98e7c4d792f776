"""``mpiexec -n 2 python -m bench perf``: our all-reduces against native MPI and a lone copy, each target judged.

For each size: native ``MPI_Allreduce`` called through mpi4py, as our calls are made (the
sweep's ``mpi4py`` baseline; its ``mpi`` times the library in a compiled loop, without Python's
cost of a call), and each of our algorithms (``check=False``;
the agreement check's extra cost is reported beside; ring, trees and twoshot also on registered
vectors, ``algorithms.alloc_registered``), timed in turn in ``--repeats`` rounds per sweep
(the order rotated each round), the whole sweep run ``--runs`` times; every time is the median
of all the rounds with its 95% interval (:mod:`bench.formats.stats`), and every target that
compares two things is judged on their paired ratio, round by round, with its interval: met,
missed, or a tie within noise where the interval holds the bound; busbw, the
ratio to native, and a single-process copy of the same size (the copy the transports make,
:mod:`algorithms.runtime.copies`: the physical
reference; beside it the same copy by every rank at once, which shares the caches and
memory bus as the all-reduce's ranks do), timed in turn with the all-reduces on the
same vectors; where PyTorch is installed, its gloo all-reduce (:mod:`bench.baselines.gloo`) among
them. Also the 8-byte latency against native, the per-call cost (a call on a one-rank
communicator, where nothing moves, less the engine's own run of its plan; the same for the
persistent handle), the Python cost of an
8-byte call over its bare ``MPI_Sendrecv`` exchanges (2 ranks; rd and the ring also
persistent, ``algorithms.allreduce_init``), whether steady-state calls allocate
(tracemalloc), and each rank's peak memory (VmHWM, measured first) against send + receive + one chunk
of workspace + 64 MiB of interpreter.
Writes ``results/perf-cpu.json`` and ``results/perf-cpu.md`` (rank 0, atomically); the
Markdown ends with ``results/perf-cpu-notes.md`` when it exists (the analysis of the misses).
For a fair native baseline, tell glibc's malloc to keep freed large blocks instead of
returning them to the kernel (else native ``MPI_Allreduce`` page-faults its temporary buffer
afresh at every large call):
``MALLOC_MMAP_THRESHOLD_=2147483648 MALLOC_TRIM_THRESHOLD_=8589934592``.
"""

import functools
import gc
import os
import sys
import tracemalloc

import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.runtime.copies import copy
from algorithms.runtime.executor import private_comm
from plumbing.files import write_json_atomically, write_text_atomically

from ..baselines.gloo import GlooBaseline
from ..baselines.gloo import problem as gloo_problem
from ..baselines.mpi_loop import CompiledLoop
from ..core.cli import Parser, add_size_flags
from ..core.collectives import AllReduce
from ..core.machine import results_header, tuning_path
from ..core.memory import status_bytes
from ..core.pages import huge_page_share, small_page_vector
from ..core.sizes import sweep
from ..core.startup import refused
from ..core.timing import intervals, iterations_for, timed
from ..formats.stats import FULL_ROUNDS, coverage, median, median_interval
from ..formats.tables import plural, size_label

#: ours: auto's candidates from the registry (native MPI through our entry point is the baseline's row), and auto
ALGOS = (*(a for a in algorithms.auto.candidates() if a != "native"), "auto")
REGISTERED = ("ring", "tree", "dbtree", "twoshot")  # also timed on vectors from algorithms.alloc_registered, as "<algo>_reg"
IN_PLACE = "ring_reg_inplace"  # and the ring in place on one, as nccl-tests' in-place columns
SMALL_PAGES = ("native", "ring")  # also timed on plain vectors held in 4 KiB pages, as "<name>_4kpages"
MIB = 1 << 20
#: half the Python cost of a small call over its bare MPI_Sendrecv exchanges before the one-shot
#: work (rd 3.3 us, ring 5.8 us at 8 B on 2 ranks, bench perf of 2026-12-01)
HALVED_COST_US = {"rd": 1.65, "ring": 2.9}
PER_CALL_US = 0.3  # what a call may cost over the engine's run of its plan (persistent or not)
#: the bare MPI_Sendrecv exchanges of an 8-byte call on 2 ranks, of the algorithms whose cost over
#: them is judged; each is also timed bound once, as "<algo>_persistent"
EXCHANGES = {"rd": 1, "ring": 2}
GLOO_ITERS = 20  # gloo's calls take 0.6 ms and more: 20 of them time it well
MET, MISSED, TIE, NOT_RUN = "met", "missed", "tie (within noise)", "size not run"  # a target's verdicts
#: what the targets compare with: MPI_Allreduce called from Python (not the library timed in C)
NATIVE = "native through mpi4py"
LIBRARY = "the MPI library timed in C"  # python -m bench's mpi baseline: MPI_Allreduce in a compiled loop


def copy_calls(comm, source, target):
    """The physical references, as candidates of :func:`timed` on the benchmark's own vectors:
    ``copy``, one process's copy (:func:`algorithms.runtime.copies.copy`: NumPy's, except where
    glibc's ``memcpy`` would run at its 4K-aliasing penalty; rank 0 copies, the others wait, so the slowest
    rank's time is its), and ``copy_all_ranks``, every rank copying at once (each its own
    vectors), which shares the caches and memory bus as the all-reduce's ranks do. Timed in
    turn with the all-reduces, a busy moment of the machine falls on the copy as on them."""
    alone = comm.Get_rank() == 0
    return {"copy": (lambda: copy(target, source)) if alone else (lambda: None),
            "copy_all_ranks": lambda: copy(target, source)}


def steady_state_allocation(comm, algorithm, count, calls=50, windows=3):
    """After warm-up, ``windows`` windows of ``calls`` repeated calls on the same buffers,
    traced: the bytes from the ``algorithms`` package allocated at the end of each window that
    were not at the end of the window before (tracemalloc's own bookkeeping excluded). Before
    each snapshot a full collection runs, which also empties the interpreter's free lists (a
    free list keeps up to a few dozen freed objects counted as allocated, and fills over the
    first hundred calls). A leak grows in every window, while a message still in flight when a
    call returns or a counter that outgrows the small-integer cache comes and goes, so what is
    ``retained`` is the least growth over the windows after the first; ``retained_first_window``
    is the first window's (NumPy keeps the shape buffers of freed views in a cache of its own,
    which the first traced window can refill). ``transient_peak`` is the largest allocation
    during a call (views and requests are ~100 bytes each; a vector-sized temporary would show
    here). What lived before is frozen meanwhile (``gc.freeze``): the collections walk what the
    calls made, not the whole interpreter (a tenth of a second each with PyTorch imported)."""
    gc.freeze()
    try:
        x = np.ones(count, np.float32)
        y = np.empty_like(x)
        for _ in range(5):
            algorithms.allreduce(x, y, algorithm=algorithm, comm=comm, check=False)
        ours = [tracemalloc.Filter(True, os.path.join(os.path.dirname(algorithms.__file__), "*"))]

        def snapshot():
            gc.collect()
            return tracemalloc.take_snapshot().filter_traces(ours)

        tracemalloc.start()
        snapshot()  # warms the caches that filtering itself fills
        snapshots = [snapshot()]
        transient = 0
        for _ in range(windows):
            for _ in range(calls):
                base = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                algorithms.allreduce(x, y, algorithm=algorithm, comm=comm, check=False)
                transient = max(transient, tracemalloc.get_traced_memory()[1] - base)
            snapshots.append(snapshot())
        tracemalloc.stop()
    finally:
        gc.unfreeze()
    first, *later = (sum(stat.size_diff for stat in after.compare_to(before, "filename") if stat.size_diff > 0)
                     for before, after in zip(snapshots, snapshots[1:]))
    return {"retained": comm.allreduce(min(later), op=MPI.MAX), "retained_first_window": comm.allreduce(first, op=MPI.MAX),
            "transient_peak": comm.allreduce(transient, op=MPI.MAX)}


def library_call(run, x, y):
    """The ``mpi`` baseline's one call on ``x``, ``y``, with its compiled loop (:func:`timed`
    times its iterations in C)."""
    def call():
        run(x, y)
    call.loop = functools.partial(run.loop, x, y)
    return call


def measure_sizes(comm, registered, sizes, repeats, factor, gloo=None, library=None):
    """One sweep: for each size, every candidate and the copies timed in turn (:func:`timed`);
    seconds per call, copy GB/s and busbw (``factor`` = 2(N-1)/N) per row. The candidates on
    registered vectors run on ``registered``, a duplicate of ``comm``: once a communicator has
    registered vectors, its large plain messages are announced in the mailboxes too, and the
    plain candidates should take the path of a program that registers nothing."""
    rows = []
    for nbytes in sizes:
        count = max(nbytes // 4, 1)
        x = np.ones(count, np.float32)
        y = np.empty_like(x)
        iters = iterations_for(nbytes)
        row = {"bytes": count * 4}
        calls = {"native": lambda: comm.Allreduce(x, y, op=MPI.SUM)}
        if library is not None:
            calls["mpi"] = library_call(library, x, y)
        for algo in ALGOS:  # each called as a program calls it, as the baselines are, in a lambda
            calls[algo] = lambda algo=algo: algorithms.allreduce(x, y, algorithm=algo, check=False)
        calls["ring_checked"] = lambda: algorithms.allreduce(x, y, algorithm="ring")
        if nbytes == 8 and comm.Get_size() == 2:  # the bare exchange the per-call costs are counted over
            peer, incoming = 1 - comm.Get_rank(), np.empty_like(x)
            calls["sendrecv"] = lambda: comm.Sendrecv(x, peer, 0, incoming, peer, 0)
            for algo in EXCHANGES:  # checked once (algorithms.allreduce_init), beside the calls checked each time
                calls[f"{algo}_persistent"] = algorithms.allreduce_init(x, y, algorithm=algo, comm=comm)
        if gloo is not None:
            calls["gloo"] = functools.partial(gloo, x, y)
        rx, ry = (algorithms.alloc_registered(count, np.float32, comm=registered) for _ in range(2))
        rx[:] = 1
        for algo in REGISTERED:
            calls[f"{algo}_reg"] = lambda algo=algo: algorithms.allreduce(rx, ry, algorithm=algo, comm=registered,
                                                                          check=False)
        rz = algorithms.alloc_registered(count, np.float32, comm=registered)
        rz[:] = 0  # summed into itself call after call: zeros stay finite (ones would overflow to inf)
        calls[IN_PLACE] = lambda: algorithms.allreduce(rz, None, algorithm="ring", comm=registered, check=False)
        sx, sy = (small_page_vector(count, np.float32) for _ in range(2))
        sx[:] = 1
        calls["native_4kpages"] = lambda: comm.Allreduce(sx, sy, op=MPI.SUM)
        calls["ring_4kpages"] = lambda: algorithms.allreduce(sx, sy, algorithm="ring", check=False)
        calls.update(copy_calls(comm, x, y))
        row["rounds_s"] = timed(comm, calls, iters, min(3, max(1, iters // 4)), repeats, {"gloo": GLOO_ITERS})
        row["plain_huge_share"], row["small_pages_huge_share"] = (least_huge_share(comm, pair) for pair in ((x, y), (sx, sy)))
        for vector in (rz, ry, rx):
            algorithms.free_registered(vector, comm=registered)
        row["auto_ran"] = algorithms.auto.choice(count * 4, comm=comm)[0]
        rows.append(summarised(row, factor))
        if comm.Get_rank() == 0:
            print(f"{size_label(row['bytes'])}, {repeats} rounds, us: " + ", ".join(
                f"{name} {median_interval([t * 1e6 for t in times]).text()}" for name, times in row["rounds_s"].items()),
                flush=True)
    return rows


def summarised(row, factor):
    """``row`` with, from its ``rounds_s`` ({name: [seconds per round]}): ``<name>_s`` (the
    median), ``times_us`` ({name: median and 95% interval, in us}), the copies' ``<copy>_GBps``
    (from the median time) and every ``<candidate>_busbw``."""
    row["times_us"] = {name: interval.as_dict(1e6) for name, interval in intervals(row["rounds_s"]).items()}
    for name, times in row["rounds_s"].items():
        if name in ("copy", "copy_all_ranks"):  # read + write counted once, as busbw counts bytes once
            row[f"{name}_GBps"] = row["bytes"] / median(times) / 1e9
        else:
            row[f"{name}_s"] = median(times)
    return with_busbw(row, factor)


def least_huge_share(comm, vectors):
    """The smallest share of ``vectors`` in huge pages on any rank (:func:`.pages.huge_page_share`;
    None where a rank cannot read its memory map)."""
    shares = [share for rank in comm.allgather([huge_page_share(v) for v in vectors]) for share in rank]
    return None if None in shares else round(min(shares), 3)


def with_busbw(row, factor):
    """``row`` with ``<candidate>_busbw`` (GB/s) from its ``<candidate>_s``."""
    for key in ("native", *ALGOS, *(f"{a}_reg" for a in REGISTERED), IN_PLACE, *(f"{a}_4kpages" for a in SMALL_PAGES),
                *(["gloo"] if "gloo_s" in row else []), *(["mpi"] if "mpi_s" in row else [])):
        row[f"{key}_busbw"] = row["bytes"] / row[f"{key}_s"] / 1e9 * factor
    return row


def pooled_rows(runs, factor):
    """Per size, every sweep's rounds of ``runs`` together, sweep after sweep (:func:`summarised`:
    medians, intervals, busbw), and the least huge-page shares. A sweep lasts half a minute or so;
    the memory bandwidth a shared machine gets can change for minutes at a time, so rounds spread
    over sweeps minutes apart hold more of that change than more rounds within one."""
    merged = []
    for rows in zip(*runs):
        row = {"bytes": rows[0]["bytes"], "auto_ran": rows[0]["auto_ran"],
               "rounds_s": {name: [t for r in rows for t in r["rounds_s"][name]] for name in rows[0]["rounds_s"]}}
        for key in ("plain_huge_share", "small_pages_huge_share"):
            row[key] = None if None in (r[key] for r in rows) else min(r[key] for r in rows)
        merged.append(summarised(row, factor))
    return merged


def peak_memory(comm, nbytes):
    """Peak resident memory of each rank (VmHWM) after every algorithm ran on ``nbytes``
    vectors, against the budget send + receive + one chunk + 64 MiB. Run before anything
    else, so that the peak is this test's."""
    interpreter = status_bytes("VmRSS")
    x = np.ones(nbytes // 4, np.float32)
    y = np.ones_like(x)
    for algo in ALGOS:
        for _ in range(3):
            algorithms.allreduce(x, y, algorithm=algo, comm=comm, check=False)
    peak = comm.allreduce(status_bytes("VmHWM"), op=MPI.MAX)
    budget = 2 * x.nbytes + -(-x.nbytes // comm.Get_size()) + 64 * MIB
    return {"vector_bytes": x.nbytes, "interpreter_bytes": comm.allreduce(interpreter, op=MPI.MAX),
            "peak_bytes": peak, "budget_bytes": budget}


def main(argv=None):
    p = Parser(prog="python -m bench.perf", description=__doc__.splitlines()[0])
    add_size_flags(p, "1K", "256M", 2, what="vector (8 B is always added)")
    p.add_argument("--repeats", type=int, default=7,
                   help="rounds per size and sweep, each candidate timed once a round in an order rotated each "
                        "round (default 7)")
    p.add_argument("--runs", type=int, default=3,
                   help="sweeps over all sizes; every time is the median of all their rounds with its 95%% interval, "
                        "each target judged on its ratio within each round (default 3)")
    p.add_argument("-o", "--output", default="results/perf-cpu",
                   help="FILE prefix: writes FILE.json and FILE.md (default results/perf-cpu)")
    p.add_argument("--tuning", metavar="FILE",
                   help="the tuning table algorithm=\"auto\" follows (default: ALLREDUCE_TUNING_FILE, else "
                        "results/tuning-<host>-<N>r.json from python -m bench tune where it exists, else the model)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    tuning = args.tuning or os.environ.get("ALLREDUCE_TUNING_FILE") or tuning_path(comm)
    if os.path.exists(tuning) or args.tuning:  # read by auto on first use, on every rank alike
        os.environ["ALLREDUCE_TUNING_FILE"] = tuning
    if refused(comm, "python -m bench perf", (args.output + ".json", args.output + ".md"), tuning=True):
        return 2
    n = comm.Get_size()
    factor = 2 * (n - 1) / n if n > 1 else 0.0
    memory = peak_memory(comm, min(args.maxbytes, 256 * MIB))
    sizes = sorted({8, *sweep(args.minbytes, args.maxbytes, args.stepfactor)})
    registered = comm.Dup()
    gloo = gloo_baseline(comm)
    loop, library_problem = CompiledLoop.start(comm)
    library = loop and loop.runner(AllReduce, comm, "sum")
    runs = [measure_sizes(comm, registered, sizes, args.repeats, factor, gloo and gloo.runner(AllReduce, "gloo", comm, "sum"),
                          library)
            for _ in range(args.runs)]
    registered.Free()
    rows = pooled_rows(runs, factor)

    self_rounds = per_call_rounds(max(args.repeats, 6))  # at least 6 rounds: a 95% interval
    overhead = {"per_call_overhead_us": overhead_interval(self_rounds).as_dict(),
                "persistent_overhead_us": overhead_interval(self_rounds, "persistent").as_dict(),
                "per_call_rounds_s": self_rounds}
    allocation = {a: steady_state_allocation(comm, a, 1 << 16) for a in ALGOS}
    auto_reason = algorithms.auto.choice(8, comm=comm)[1]

    header = results_header("perf-cpu", None, comm, ["perf", *(sys.argv[1:] if argv is None else argv)])
    if comm.Get_rank() == 0:
        data = {**header, "gloo": gloo.description if gloo else None, "auto": auto_reason,
                "library_problem": library_problem, "rounds_per_sweep": args.repeats, "rows": rows, **overhead,
                "steady_state_python_bytes": allocation, "peak_memory": memory}
        if any("sendrecv_s" in row for row in rows):
            data["persistent_cost_us"] = persistent_costs(rows)
        data["targets"] = targets(data)
        data["runs"] = [{"targets": targets(data, run), "rows": [{k: v for k, v in row.items() if k != "rounds_s"}
                                                                 for row in run]} for run in runs]
        write_json_atomically(args.output + ".json", data)
        text = markdown(data)
        notes = args.output + "-notes.md"  # hand-written: the profile behind each missed target
        if os.path.exists(notes):
            with open(notes) as f:
                text += "\n" + f.read()
        write_text_atomically(args.output + ".md", text)
        print(text)
    if gloo is not None:
        gloo.close()
    return 0


def gloo_baseline(comm):
    """PyTorch's gloo all-reduce as a started baseline where torch is installed on every rank, else None."""
    if any(comm.allgather(gloo_problem())):
        return None
    gloo = GlooBaseline()
    gloo.start(comm)
    return gloo


def round_values(row, value):
    """``value(times)`` of each round of ``row``, ``times`` that round's {name: seconds}."""
    rounds = row["rounds_s"]
    return [value({name: times[i] for name, times in rounds.items()}) for i in range(len(next(iter(rounds.values()))))]


def cost_over_exchanges(row, name, exchanges):
    """Per round of ``row`` (8 B), ``name``'s time less ``exchanges`` bare exchanges, in us."""
    return round_values(row, lambda t: (t[name] - exchanges * t["sendrecv"]) * 1e6)


def persistent_costs(rows):
    """Per algorithm of :data:`EXCHANGES`, its persistent call's time at 8 B less its bare
    exchanges (rd one, the ring two), round by round: median and 95% interval, in us."""
    row = {r["bytes"]: r for r in rows}[8]
    return {algo: median_interval(cost_over_exchanges(row, f"{algo}_persistent", exchanges)).as_dict()
            for algo, exchanges in EXCHANGES.items()}


def judge(interval, bound, above=True):
    """A target's verdict on ``interval`` (a ratio's or a cost's) against ``bound``, which it
    must lie above (``above``) or below: :data:`MET` or :data:`MISSED` where the whole interval
    lies on one side, :data:`TIE` where it holds the bound."""
    if interval.holds(bound):
        return TIE
    return MET if (interval.low > bound) == above else MISSED


def worst_check(name, measured, bound, above=True):
    """The target over several sizes, ``measured`` ({bytes: Interval}): missed where a size is
    missed, else a tie where a size ties, else met; the size shown is the one that decides (the
    worst verdict, then the worst median). No size: :data:`NOT_RUN`."""
    if not measured:
        return {"target": name, "worst": None, "at_bytes": None, "interval": None, "verdict": NOT_RUN,
                "holds": False}
    order = (MISSED, TIE, MET)
    verdicts = {size: judge(interval, bound, above) for size, interval in measured.items()}
    size = min(measured, key=lambda s: (order.index(verdicts[s]), measured[s].median * (1 if above else -1)))
    interval = measured[size]
    return {"target": name, "worst": round(interval.median, 3), "at_bytes": size, "interval": interval.as_dict(),
            "verdict": verdicts[size], "holds": verdicts[size] == MET}


def targets(data, rows=None):
    """The performance targets, each with its measure, verdict (:func:`judge`) and whether it
    holds, from ``rows`` (default ``data["rows"]``; one sweep's rows judge that sweep alone). A
    target that compares two things takes their ratio within each round, where a busy moment
    of a shared machine falls on both, and judges the interval of its median."""
    rows = {r["bytes"]: r for r in (rows or data["rows"])}
    n = data["ranks"]
    factor = 2 * (n - 1) / n if n > 1 else 0.0
    checks = []

    def ratio_check(name, lo, hi, ours, ref, bound, scale=1.0):  # busbw of ours over ref's: ref's time over ours
        measured = {s: median_interval(round_values(r, lambda t: scale * t[ref] / t[ours]))
                    for s, r in rows.items() if lo <= s <= hi}
        checks.append(worst_check(name, measured, bound))

    ratio_check(f"ring busbw >= 1.0x {NATIVE}, 256 KiB..256 MiB", 256 << 10, 256 << 20, "ring", "native", 1.0)
    ratio_check(f"ring busbw >= 0.9x {NATIVE}, 32 KiB..256 KiB", 32 << 10, 256 << 10, "ring", "native", 0.9)
    ratio_check("ring busbw >= 0.5x copy bandwidth, 16..256 MiB", 16 << 20, 256 << 20, "ring", "copy", 0.5, factor)
    ratio_check("ring busbw >= 0.5x copy bandwidth on registered vectors, 16..256 MiB", 16 << 20, 256 << 20,
                "ring_reg", "copy", 0.5, factor)
    ratio_check("ring busbw >= 0.5x copy bandwidth, registered, in place, 16..256 MiB", 16 << 20, 256 << 20,
                IN_PLACE, "copy", 0.5, factor)
    if 8 in rows:
        best = median_interval(round_values(rows[8], lambda t: min(t[a] for a in ALGOS) / t["native"]))
        checks.append(worst_check(f"8-byte time of our best <= 3x {NATIVE}", {8: best}, 3, above=False))
    ratio_check(f"auto busbw >= 1.0x {NATIVE}, 8 B..256 MiB", 8, 256 << 20, "auto", "native", 1.0)
    if "mpi_s" in rows.get(8, next(iter(rows.values()))):
        ratio_check(f"ring busbw >= 1.0x {LIBRARY}, 256 KiB..256 MiB", 256 << 10, 256 << 20, "ring", "mpi", 1.0)
        ratio_check(f"auto busbw >= 1.0x {LIBRARY}, 8 B..4 KiB", 8, 4 << 10, "auto", "mpi", 1.0)
    if 8 in rows and "sendrecv_s" in rows[8]:
        for algo, exchanges in EXCHANGES.items():
            bound = HALVED_COST_US[algo]
            checks.append(worst_check(f"{algo}'s Python cost over its {exchanges} bare exchange(s) <= {bound} us",
                                      {8: median_interval(cost_over_exchanges(rows[8], algo, exchanges))}, bound,
                                      above=False))
    for call, what in (("ours", "a call"), ("persistent", "a persistent call")):
        checks.append(worst_check(f"{what}'s cost over the engine's run of its plan <= {PER_CALL_US} us",
                                  {8: overhead_interval(data["per_call_rounds_s"], call)}, PER_CALL_US, above=False))
    ratio_check("tree busbw >= 0.8x ring at 64 MiB", 64 << 20, 64 << 20, "tree", "ring", 0.8)
    ratio_check("tree busbw >= 0.8x ring at 64 MiB on registered vectors", 64 << 20, 64 << 20,
                "tree_reg", "ring_reg", 0.8)
    ratio_check("double binary tree (dbtree) busbw >= 0.8x ring at 64 MiB", 64 << 20, 64 << 20, "dbtree", "ring", 0.8)
    ratio_check("double binary tree busbw >= 0.8x ring at 64 MiB on registered vectors", 64 << 20, 64 << 20,
                "dbtree_reg", "ring_reg", 0.8)
    ratio_check("twoshot busbw >= 1.0x oneshot, 256 KiB..256 MiB", 256 << 10, 256 << 20, "twoshot", "oneshot", 1.0)
    ratio_check("twoshot busbw >= 1.0x ring, 1..256 MiB", 1 << 20, 256 << 20, "twoshot", "ring", 1.0)
    ratio_check("twoshot busbw >= 1.0x ring on registered vectors, 1..256 MiB", 1 << 20, 256 << 20, "twoshot_reg",
                "ring_reg", 1.0)
    grown = max(a["retained"] for a in data["steady_state_python_bytes"].values())
    transient = max(a["transient_peak"] for a in data["steady_state_python_bytes"].values())
    checks.append(exact_check("no steady-state allocation (bytes retained; transient peak < 16 KiB)",
                              f"{grown} ({transient})", 1 << 18, grown == 0 and transient < 16 << 10))
    memory = data["peak_memory"]
    checks.append(exact_check("peak memory <= send + receive + one chunk + 64 MiB (MiB)",
                              round(memory["peak_bytes"] / MIB, 1), memory["vector_bytes"],
                              memory["peak_bytes"] <= memory["budget_bytes"]))
    return checks


def per_call_rounds(repeats):
    """{"engine", "ours", "persistent", "bare": [seconds per call, per round]} of an 8-byte ring on a
    one-rank communicator, where nothing moves: the engine's own run of the plan (what the entry
    point runs, bound once), the call as a program makes it (``check=False``), the persistent
    handle's (``algorithms.allreduce_init``), and a bare copy of the same bytes."""
    one = MPI.COMM_SELF
    tiny = np.ones(2, np.float32)
    out = np.empty_like(tiny)
    algorithms.allreduce(tiny, out, algorithm="ring", comm=one, check=False)  # the plan bound, as a repeat finds it
    run = algorithms.ALGORITHMS["ring"].bind(private_comm(one).collective(np, "sum"), tiny.size, tiny.dtype)
    persistent = algorithms.allreduce_init(tiny, out, algorithm="ring", comm=one)
    return timed(one, {"engine": lambda: run(tiny, out), "persistent": persistent, "bare": lambda: np.copyto(out, tiny),
                       "ours": lambda: algorithms.allreduce(tiny, out, algorithm="ring", comm=one, check=False)},
                 2000, 100, repeats)


def overhead_interval(rounds, call="ours"):
    """What a call (``call``: ``"ours"``, ``"persistent"``) costs over the engine's own run of its
    plan, round by round, on one rank (:func:`per_call_rounds`): an Interval, in us."""
    return median_interval([(ours - engine) * 1e6 for ours, engine in zip(rounds[call], rounds["engine"])])


def exact_check(name, measured, at_bytes, holds):
    """A target counted, not timed: no interval, met or missed."""
    return {"target": name, "worst": measured, "at_bytes": at_bytes, "interval": None,
            "verdict": MET if holds else MISSED, "holds": holds}


def _label(column):
    return column.replace("_reg", " reg").replace("_inplace", " in place")


def _measured(target):
    interval = target.get("interval")
    if target["worst"] is None:
        return NOT_RUN
    return target["worst"] if interval is None else \
        f"{interval['median']:.3g} [{interval['ci_low']:.3g}, {interval['ci_high']:.3g}]"


def _verdict(target):
    return target["verdict"] if target["verdict"] == NOT_RUN else f"{_measured(target)} {target['verdict']}"


def _shown(verdict):
    return f"**{verdict}**" if verdict == MISSED else verdict


def _few_rounds(per_sweep, sweeps):
    """What an interval of fewer than 6 rounds holds (the whole range: short of 95%), or ""."""
    few = sorted({n for n in (per_sweep, per_sweep * sweeps) if n < FULL_ROUNDS})
    return "".join(f"; of {plural(n, 'round')} the interval is the whole range, which holds the median "
                   f"{coverage(n):.0%} of the time" for n in few)


def _us(interval):
    """An interval of us (:meth:`.stats.Interval.as_dict`) as "1.23 us [1.10, 1.40]"."""
    return f"{interval['median']:.2f} us [{interval['ci_low']:.2f}, {interval['ci_high']:.2f}]"


def _time(row, name):
    """A time cell: the median and its 95% interval, in us."""
    t = row["times_us"][name]
    return f"{t['median']:.1f} [{t['ci_low']:.1f}, {t['ci_high']:.1f}]"


def markdown(data):
    m = data["machine"]
    runs = data.get("runs", [])
    memory = data["peak_memory"]
    columns = ["native", *ALGOS, *(f"{a}_reg" for a in REGISTERED), IN_PLACE]
    lines = [f"# Performance, {data['ranks']} ranks{' (oversubscribed: reference only)' if data['oversubscribed'] else ''}",
             "", f"{data['date']}, commit {m['commit']}, {m['cpu']} ({m['cores']} cores), {m['mpi'].split()[0]} "
             f"{m['mpi'].split()[-1]}, malloc env: {m['env']}. float32 sum, out of place unless marked, check=False. "
             f"Every time (us) is the median of {len(runs) or 1} sweeps of {data['rounds_per_sweep']} rounds, the "
             "candidates in turn within each round, with its 95% interval in brackets; busbw (GB/s) and the ratios "
             "from the medians. A target that compares two things is judged on their ratio within each round: met or "
             "missed where its 95% interval lies on one side of the bound, a tie (within noise) where it holds it"
             f"{_few_rounds(data['rounds_per_sweep'], len(runs) or 1)}. native: `MPI_Allreduce` called through mpi4py, "
             "as our calls are made (`python -m bench`'s `mpi4py` baseline; its `mpi` times the library in a compiled "
             "loop). \"reg\": on registered vectors (`algorithms.alloc_registered`, "
             "read in place by the peer, like nccl-tests -R); \"in place\": recvbuf is sendbuf; the others on "
             "plain NumPy arrays.", "",
             "| bytes | " + " | ".join(f"{_label(c)} (us)" for c in columns) + " | ring checked (us) | "
             + " | ".join(f"{_label(c)} busbw" for c in columns) + " | ring/native | tree/ring | dbtree/ring | copy GB/s | ring/copy "
             "| copy, all ranks at once GB/s | ring/that | ring reg/copy | ring reg in place/copy | tree reg/ring reg "
             "| dbtree reg/ring reg | auto/native | auto ran |",
             "|---:|" + "---:|" * (2 * len(columns) + 14)]
    for r in data["rows"]:
        cells = [str(r["bytes"]), *(_time(r, c) for c in columns), _time(r, "ring_checked"),
                 *(f"{r[f'{c}_busbw']:.2f}" for c in columns), f"{r['ring_busbw'] / r['native_busbw']:.2f}",
                 f"{r['tree_busbw'] / r['ring_busbw']:.2f}", f"{r['dbtree_busbw'] / r['ring_busbw']:.2f}",
                 f"{r['copy_GBps']:.1f}",
                 f"{r['ring_busbw'] / r['copy_GBps']:.2f}", f"{r['copy_all_ranks_GBps']:.1f}",
                 f"{r['ring_busbw'] / r['copy_all_ranks_GBps']:.2f}", f"{r['ring_reg_busbw'] / r['copy_GBps']:.2f}",
                 f"{r[f'{IN_PLACE}_busbw'] / r['copy_GBps']:.2f}",
                 f"{r['tree_reg_busbw'] / r['ring_reg_busbw']:.2f}",
                 f"{r['dbtree_reg_busbw'] / r['ring_reg_busbw']:.2f}",
                 f"{r['auto_busbw'] / r['native_busbw']:.2f}", r.get("auto_ran", "")]
        lines.append("| " + " | ".join(cells) + " |")
    if data.get("gloo"):
        lines += ["", f"PyTorch's gloo all-reduce ({data['gloo']}; out of place: the input copied into the output, "
                  "then reduced in place, as torch.distributed has it), timed in turn with the others:", "",
                  "| bytes | gloo (us) | gloo busbw | ring/gloo | native/gloo |", "|---:|---:|---:|---:|---:|"]
        for r in data["rows"]:
            lines.append(f"| {r['bytes']} | {_time(r, 'gloo')} | {r['gloo_busbw']:.3g} | "
                         f"{r['ring_busbw'] / r['gloo_busbw']:.2f} | {r['native_busbw'] / r['gloo_busbw']:.2f} |")
    if all("mpi_s" in r for r in data["rows"]):
        lines += ["", "The MPI library's own all-reduce two ways, timed in turn with the others: timed in C (`mpi`: "
                  "`MPI_Allreduce` in a compiled loop, `bench/probes/mpi_loop.c`, what a C program or IMB gets) and "
                  "called through mpi4py (`native` above, `python -m bench`'s `mpi4py`: what a Python program gets); "
                  "each of ours over both (busbw ratios; above 1, ours is faster):", "",
                  "| bytes | library in C (us) | through mpi4py (us) | mpi4py/C time | best of ours | best/C | "
                  "ring/C | auto/C | best/mpi4py | auto/mpi4py |", "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
        for r in data["rows"]:
            best = min(ALGOS, key=lambda a: r[f"{a}_s"])
            lines.append(f"| {r['bytes']} | {_time(r, 'mpi')} | {_time(r, 'native')} | "
                         f"{r['native_s'] / r['mpi_s']:.2f} | {best} | {r['mpi_s'] / r[f'{best}_s']:.2f} | "
                         f"{r['mpi_s'] / r['ring_s']:.2f} | {r['mpi_s'] / r['auto_s']:.2f} | "
                         f"{r['native_s'] / r[f'{best}_s']:.2f} | {r['native_s'] / r['auto_s']:.2f} |")
    elif data.get("library_problem"):
        lines += ["", f"The MPI library timed in C did not run: {data['library_problem']}."]
    lines += ["", f"Page backing (transparent huge pages: {m.get('transparent_hugepages', 'not recorded')}; "
              "`bench.core.pages`): the least share in huge pages of the plain vectors above and of a second pair held "
              "in 4 KiB pages (`MADV_NOHUGEPAGE`), over ranks and sweeps; native and ring timed in turn with the "
              "others on that second pair, where MPI's kernel copy (CMA) pins every 4 KiB page of the sender's.", "",
              "| bytes | in huge pages: plain / 4 KiB-page pair | native, 4 KiB pages (us) | ring, 4 KiB pages (us) "
              "| ring/native, 4 KiB pages | ring time, 4 KiB pages/plain | ring, 4 KiB pages/copy |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        shares = " / ".join("unknown" if r[k] is None else f"{r[k]:.0%}" for k in ("plain_huge_share", "small_pages_huge_share"))
        lines.append(f"| {r['bytes']} | {shares} | {_time(r, 'native_4kpages')} | {_time(r, 'ring_4kpages')} "
                     f"| {r['ring_4kpages_busbw'] / r['native_4kpages_busbw']:.2f} | {r['ring_4kpages_s'] / r['ring_s']:.2f} "
                     f"| {r['ring_4kpages_busbw'] / r['copy_GBps']:.2f} |")
    exchange = next((r["times_us"]["sendrecv"] for r in data["rows"] if "sendrecv_s" in r), None)
    lines += ["", f"auto: {data.get('auto')}. oneshot: every rank posts its vector in shared memory and "
              "reduces all of them itself (one synchronisation); native: comm.Allreduce, MPI_Allreduce called "
              "through mpi4py."]
    if exchange is not None:
        persistent = data.get("persistent_cost_us") or {}
        lines += ["", f"A bare 8-byte MPI_Sendrecv: {_us(exchange)}, timed in turn with the others; "
                  "a small call's Python cost is its time less its bare exchanges (rd one, ring two on 2 ranks). "
                  "The same, persistent (`algorithms.allreduce_init`: checked once, then only run): "
                  + ", ".join(f"{algo} {_us(cost)}" for algo, cost in persistent.items()) + "."]
    lines += ["", f"A call's cost over the engine's own run of its plan (8 B on a one-rank communicator, round by "
              f"round): {_us(data['per_call_overhead_us'])}; a persistent call's: {_us(data['persistent_overhead_us'])}."
              f" Steady state on 256 KiB, windows of 50 calls counted after "
              f"a full collection (bytes retained: the least growth over the windows after the first; the "
              f"first window's; the largest transient): {data['steady_state_python_bytes']}. Peak memory per rank with {memory['vector_bytes'] // MIB} MiB "
              f"vectors: {memory['peak_bytes'] / MIB:.1f} MiB (interpreter {memory['interpreter_bytes'] / MIB:.1f} "
              f"MiB; budget {memory['budget_bytes'] / MIB:.1f} MiB).", "",
              "| target | measured (the deciding size: median [95% interval]) | at bytes | verdict | "
              + " | ".join(f"sweep {i + 1}" for i in range(len(runs)))
              + " |", "|---|---:|---:|---|" + "---:|" * len(runs)]
    for i, t in enumerate(data["targets"]):
        measured = _measured(t)
        alone = [run["targets"][i] for run in runs]  # the same check on each sweep by itself
        lines.append(f"| {t['target']} | {measured} | {t['at_bytes'] or ''} | {_shown(t['verdict'])} | "
                     + " | ".join(_verdict(a) for a in alone) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
