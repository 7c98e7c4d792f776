"""``mpiexec -n N python -m bench [flags]``: an nccl-tests-style sweep of every algorithm.

The flags (:mod:`.options`) keep nccl-tests' meanings. Each size is measured in ``--rounds``
rounds that interleave the algorithms (:func:`.timing.interleaved`); rank 0 saves every
finished size's rows as it finishes (:mod:`bench.formats.results`), prints one table per
algorithm (its rows as they finish when only one runs, else whole once the sweep ends), then a
summary per size (:mod:`bench.formats.summary`). Exit status: 1 when an element was wrong or a
rank failed, 2 for bad arguments, settings or files (found before the first size), 3 for a -T
timeout, 130 or 143 when interrupted.
"""

import contextlib
import datetime
import functools
import itertools
import os
import socket
import sys
import threading

import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.arrays import array_module
from algorithms.device import steps
from algorithms.dtypes import nccl_name
from algorithms.ops import kernels_text
from plumbing.ending import end_job, fail_together, uncut
from topology.model import LowerBound, Network
from topology.probe import probe
from plumbing.shm import ShmTooSmall

from ..baselines import BASELINES
from ..formats import report, summary
from ..formats.report import PLACEMENTS, Tables
from ..formats.results import ResultsWriter, bool_text, now
from .check import wrong_elements
from .collectives import COLLECTIVES
from .device import select_device
from .machine import describe, oversubscription
from .memory import bytes_needed, check_memory, check_registered_room, reset_peak, resident_bytes, usage_line
from .options import PROG, launched_alone, parse_args, runs
from .startup import tuning_problem
from .timing import AGGREGATIONS, aggregate, interleaved, iteration_stats, rule, time_calls


def malloc_mode():
    """Which allocator settings a row ran with (MPI_Allreduce's temporary
    buffers pay page faults unless glibc keeps freed memory mapped)."""
    tuned = [k for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ]
    return "tuned (" + " ".join(f"{k}={os.environ[k]}" for k in tuned) + ")" if tuned else "glibc defaults"


TIMEOUT_EXIT = 3


class Watchdog:
    """``-T``: end every rank (exit 3) when one size (every algorithm's rounds of it) runs longer
    than ``seconds`` (a hang, say), through :func:`plumbing.ending.end_job`: rank 0's line is
    the one printed, naming what ran when time ran out (:meth:`doing`)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.timer = None
        self.what = ""
        self.rank = MPI.COMM_WORLD.Get_rank()

    def doing(self, what):
        """Name what runs now (an algorithm at this size), for the line if time runs out."""
        self.what = what

    def arm(self, what):
        self.disarm()
        self.doing(what)
        if self.seconds > 0:
            def fire():
                end_job(TIMEOUT_EXIT, f"python -m bench: rank {self.rank}: timeout: {self.what} ran over "
                                      f"{self.seconds:g} s (-T); ending every rank")
            self.timer = threading.Timer(self.seconds, fire)
            self.timer.daemon = True
            self.timer.start()

    def disarm(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Progress:
    """Rank 0's progress on stderr: one line per finished size, or a bar on a terminal."""

    def __init__(self, enabled):
        self.enabled, self.bar = enabled, enabled and sys.stderr.isatty()

    def done(self, label, number, total, nbytes, busbw):
        if not self.enabled:
            return
        if self.bar:
            filled = round(20 * number / total)
            sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (20 - filled)}] {number}/{total} sizes   ")
        else:
            sys.stderr.write(f"{PROG}: {label}: {nbytes} B done ({number}/{total}), busbw {busbw:.3g} GB/s\n")
        sys.stderr.flush()

    def close(self):
        if self.bar:
            sys.stderr.write("\r" + " " * 79 + "\r")
            sys.stderr.flush()


def main(argv=None, epilog=""):
    """The sweep of ``argv``; ``epilog`` ends its ``--help`` (``python -m bench`` lists its tools there)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv, epilog)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    spec = COLLECTIVES[args.collective]
    say = print if rank == 0 else (lambda *a, **k: None)
    if rank == 0 and launched_alone():
        sys.stderr.write(f"{PROG}: running 1 rank; for N ranks start it as mpiexec -n N python -m bench ...\n")
    crowded = oversubscription(comm)

    xp, device = np, -1
    started = []
    try:
        if args.device == "gpu":
            xp, device, _ = select_device(comm)
        for baseline in BASELINES:
            if any(entry.baseline is baseline for entry in args.algos):
                baseline.start(comm)
                started.append(baseline)
    except RuntimeError as exc:  # raised on every rank alike (device.Unavailable, baselines.Unavailable)
        if rank == 0:
            sys.stderr.write(f"{PROG}: {exc}\n")
        return 2
    try:
        if all(entry.skips() for entry in args.algos):  # nothing left to measure: said as a refusal
            if rank == 0:
                sys.stderr.write(f"{PROG}: --algo {args.algos[0].name}: {args.algos[0].skips()}\n")
            return 2
        return _sweep(comm, args, argv, spec, say, crowded, xp, device)
    finally:
        for baseline in started:
            baseline.close()


def _sweep(comm, args, argv, spec, say, crowded, xp, device):
    """The sweep itself: every algorithm, dtype, op and size; the exit status."""
    rank, size = comm.Get_rank(), comm.Get_size()
    device_info = (f"{xp.cuda.runtime.getDeviceProperties(device)['name'].decode()}" if device >= 0
                   else "host memory")
    devices = comm.gather({"rank": rank, "group": 0, "pid": os.getpid(), "hostname": socket.gethostname(),
                           "device": max(device, 0), "device_hex": "gpu" if device >= 0 else "cpu",
                           "device_info": device_info}, root=0)

    problem = None
    try:
        largest = max(args.sizes) + args.unalign * 8
        check_memory(comm, bytes_needed(largest, args.local_register), f"the largest size, {max(args.sizes)} B,")
        if args.local_register:  # the transport's slots first, so that the room left is what the vectors get
            algorithms.transport_in_use(xp, comm)
            check_registered_room(comm, largest)
    except (ValueError, ShmTooSmall) as exc:
        problem = str(exc)
    if problem is None and any(entry.name == "auto" for entry in args.algos) and rank == 0:
        problem = tuning_problem()
    if fail_together(comm, PROG, problem):
        return 2
    log = args.log or os.path.join("results", f"bench-{_stamp()}-{size}r.jsonl")
    writer = None
    if rank == 0:  # -J and --log checked (and -J written) before the first size
        try:
            writer = open_results(args, argv, devices, size, spec, None if log == "none" else log, crowded)
        except ValueError as exc:
            problem = str(exc)
    if fail_together(comm, PROG, problem):
        return 2
    if rank == 0 and crowded:  # said once every check passed, so that a refusal stays one line
        sys.stderr.write(f"{PROG}: warning: oversubscribed: {crowded}: times are not meaningful "
                         "(start at most one rank per core)\n")
    if writer is not None and args.output_file:
        say(f"# Writing JSON output to {args.output_file}")
    if writer is not None and log != "none":
        say(f"# Writing every row to {log} as it finishes")

    if args.topology is None and any(entry.needs_topology for entry in args.algos):
        args.topology = probe_first(comm, args, os.path.dirname(log) if rank == 0 and log != "none" else None)

    watchdog, progress = Watchdog(args.timeout), Progress(rank == 0 and not args.quiet)
    before = resident_bytes()
    algos = []
    for entry in args.algos:
        reason = entry.skips()
        if reason:  # the others run
            say(f"# {entry.name} skips: {reason}", flush=True)
        else:
            algos.append(entry)
    transports = {entry.name: entry.transport(comm, xp) for entry in algos}  # collective, in order
    engines = {entry.name: entry.engine(comm, xp) for entry in algos}  # collective, in order
    facts = {"ranks": size, "crowded": crowded, "info": describe(), "timing": rule(args.device == "gpu"),
             "aggregation": AGGREGATIONS[args.average], "malloc": malloc_mode(),
             "kernels": kernels_text(args.dtypes) if args.device == "cpu" else ""} if rank == 0 else None
    heads = {e.name: report.header(args, e.name, facts, devices, transports[e.name], engines[e.name]) if rank == 0
             else "" for e in algos}
    if len(algos) > 1:
        say(f"# {len(algos)} algorithms take turns in {args.rounds} rounds of every size; their tables follow "
            + ("each cycle" if args.run_cycles == 0 else "when the sweep ends"), flush=True)
    tables = Tables(heads, say, stream=len(algos) == 1)
    reset_peak()
    held, total_wrong = 0, 0
    try:
        for dtype in args.dtypes:
            here = []
            for entry in algos:
                reason = entry.lacks(dtype)
                if reason:  # it runs the other types of -d all
                    tables.add(entry.name, f"# {entry.name} skips -d {nccl_name(dtype)}: {reason}")
                else:
                    here.append(entry)
            for op in args.ops:
                if not here or not runs(dtype, op):
                    continue
                runners = {entry.name: entry.runner(spec, comm, op, args.topology) for entry in here}
                cycles = itertools.count(1) if args.run_cycles == 0 else range(1, args.run_cycles + 1)
                for cycle in cycles:
                    for number, nbytes in enumerate(args.sizes, 1):
                        watchdog.arm(f"{here[0].name} {dtype} {op} {nbytes} B")
                        records = measure(comm, args, spec, runners, xp, dtype, op, nbytes, watchdog)
                        watchdog.disarm()
                        for record in records.values():
                            total_wrong += record["nwrong_total"]
                            held = max(held, record.pop("held_bytes"))
                        if rank == 0:
                            save_size(tables, writer, records, transports, engines, spec, cycle)
                            for algo, record in records.items():
                                label = (f"{algo} {nccl_name(dtype)} {op}"
                                         + (f" cycle {cycle}" if args.run_cycles != 1 else ""))
                                progress.done(label, number, len(args.sizes), record["size"],
                                              record["out_of_place"]["bus_bw"])
                    if args.run_cycles == 0 and not tables.stream:  # a run without end prints each cycle's
                        tables.flush(usage_line(comm, before, held) if args.memory else None)
        progress.close()
        tables.flush(usage_line(comm, before, held) if args.memory else None)
    except ShmTooSmall as exc:  # raised on every rank alike: /dev/shm filled up after the checks
        if rank == 0:
            sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    finally:
        watchdog.disarm()
    if writer is not None:
        sizes = summary.by_size(writer.rows)
        say(summary.text(sizes), flush=True)
        if args.topology is not None and spec.name == "allreduce" and size > 1:
            bounds = LowerBound(Network.from_matrix(args.topology))
            say(summary.bound_text(sizes, bounds.at, assumes=bounds.assumes), flush=True)
        writer.finish()
    return 1 if total_wrong else 0


def save_size(tables, writer, records, transports, engines, spec, cycle):
    """One finished size on rank 0: every algorithm's row into its table, the log and ``-J``,
    all inside :func:`plumbing.ending.uncut` (so the files agree however the job ends)."""
    with uncut():
        for algo, record in records.items():
            tables.add(algo, record.pop("text"), record.pop("nwrong_total"),
                       [record["out_of_place"]["bus_bw"], record["in_place"]["bus_bw"]])
        writer.add(*({**record, "algorithm": algo, "transport": transports[algo], "engine": engines[algo], "cycle": cycle,
                      "experiment_name": f"{spec.name}/{algo}"} for algo, record in records.items()))


def open_results(args, argv, devices, size, spec, log, crowded):
    """The :class:`ResultsWriter` of this run (rank 0): the log opened, ``-J`` written."""
    config = {
        "nthreads": 1, "ngpus": 1, "minimum_bytes": args.minbytes, "maximum_bytes": args.maxbytes,
        **({"step_bytes": args.stepbytes} if args.stepbytes else {"step_factor": args.stepfactor}),
        "warmup_iters": args.warmup_iters, "iterations": args.iters, "aggregated_iterations": args.agg_iters,
        "validation": args.check, "graph": 0, "blocking_collectives": bool_text(args.blocking),
        "per_iter_timing": bool_text(args.per_iter_timing), "per_iter_skip": args.per_iter_skip,
        "parallel_init": "false", "run_cycles": args.run_cycles, "unalign": args.unalign,
        "report_cputime": bool_text(args.report_cputime), "report_timestamps": bool_text(args.report_timestamps),
        "oversubscribed": f"{crowded}: times are not meaningful" if crowded else "false",
        "devices": devices,
        **({"hier": args.hier} if args.hier else {}),
    }
    run_info = {**describe(), "ranks": size, "hosts": sorted({d["hostname"] for d in devices}),
                "collective": spec.name, "device": args.device, "timing": rule(args.device == "gpu"),
                "aggregation": AGGREGATIONS[args.average], "malloc": malloc_mode(),
                "command": " ".join(["python -m bench", *argv]), "date": now()}
    return ResultsWriter(args.output_file, log, ["python -m bench", *argv], config, run_info)


def probe_first(comm, args, folder):
    """Measure the links for bamtree and kmtree (no --topology given). Every rank gets the
    matrix; rank 0 also saves it beside the log, for ``--topology`` next time."""
    matrix = probe(comm, args.probe_bytes, reps=3, warmup=1)
    if comm.Get_rank() == 0:
        path = os.path.join(folder or "results", f"probe-{_stamp()}-{comm.Get_size()}r.json")
        matrix.save(path)
        print(f"# Topology: probed {matrix.size} ranks in {matrix.measured['rounds']} rounds "
              f"({args.probe_bytes} B messages), saved to {path}", flush=True)
    return matrix


def measure(comm, args, spec, runners, xp, dtype, op, nbytes, watchdog):
    """Time one size of every algorithm of ``runners`` ({name: run}) in interleaved rounds,
    out of place and in place, check it, and return {name: its result record}."""
    size, rank = comm.Get_size(), comm.Get_rank()
    total, count = spec.counts(nbytes, np.dtype(dtype).itemsize, size)
    send, recv = spec.inputs(xp, dtype, op, total, rank, size)
    in_place = spec.in_place_buffer(xp, send.copy(), recv, rank, size)
    with placed(comm, args, send, recv, in_place) as (send, recv, in_place):
        buffers = {"out_of_place": (send, recv), "in_place": (in_place, in_place)}
        records = _measure(comm, args, spec, runners, xp, dtype, op, total, count, buffers, watchdog)
        own = sum(a.nbytes for a in (send, recv, in_place)) * (2 if args.local_register else 1)
        for record in records.values():
            record["held_bytes"] += own
        return records


def _measure(comm, args, spec, runners, xp, dtype, op, total, count, buffers, watchdog):
    """:func:`measure` on these buffers (every algorithm shares them): each algorithm checked
    and warmed up once, then ``args.rounds`` rounds of every algorithm's timed calls."""
    device_steps = steps(xp)
    checked = {}
    for name, run in runners.items():
        watchdog.doing(f"{name} {dtype} {op} {total * np.dtype(dtype).itemsize} B")
        checked[name] = prepare(comm, args, spec, run, xp, dtype, op, total, buffers)
    per_iteration = {name: {p: np.zeros(args.iters * args.rounds) for p in buffers} if args.per_iter_timing else None
                     for name in runners}

    def one_round(name, index):
        """{placement: (seconds, host seconds)} of ``name``'s calls in round ``index``, combined over ranks (-a)."""
        watchdog.doing(f"{name} {dtype} {op} {total * np.dtype(dtype).itemsize} B")
        run, times = runners[name], per_iteration[name]
        result = {}
        for placement, (s, r) in buffers.items():
            loop = getattr(run, "loop", None)  # a baseline timed in a compiled loop of its own
            window = times[placement][index * args.iters:(index + 1) * args.iters] if times else None
            with np.errstate(all="ignore"):  # in-place timing re-reduces its own output: floats reach inf
                seconds, host = time_calls(comm, lambda: run(s, r), args.iters, args.warmup_iters, bool(args.blocking),
                                           window, device_steps, args.agg_iters, loop and functools.partial(loop, s, r))
            result[placement] = (aggregate(comm, seconds, args.average), aggregate(comm, host, args.average))
        return result

    rounds, places = interleaved(list(runners), args.rounds, one_round)
    return {name: record_of(comm, args, spec, dtype, op, total, count, rounds[name], places[name],
                            per_iteration[name], *checked[name])
            for name in runners}


def prepare(comm, args, spec, run, xp, dtype, op, total, buffers):
    """Before the rounds, for each placement: one call whose arguments every rank checks
    agree and the ``-c`` check on fresh data (the ``-w`` warm-up comes in every round, before
    each turn's timed calls). ({placement: wrong elements or None}, the bytes the check held)."""
    wrong, held = {}, 0
    for placement, (s, r) in buffers.items():
        run(s, r, check=True)  # arguments agree on every rank before timing
        wrong[placement], checked = (check(comm, spec, run, xp, dtype, op, total, placement == "in_place", args)
                                     if args.check else (None, 0))
        held = max(held, checked)
    return wrong, held


def record_of(comm, args, spec, dtype, op, total, count, rounds, places, per_iteration, wrong, held):
    """One algorithm's result record of a size (:func:`bench.formats.report.record`, on rank 0;
    ``-I 1``'s statistics gathered from every rank), with the wrong elements and bytes held that
    every rank counts."""
    iterations = ({placement: iteration_stats(comm, per_iteration[placement], args.per_iter_skip)
                   for placement in PLACEMENTS} if args.per_iter_timing else None)  # collective
    record = {}
    if comm.Get_rank() == 0:
        record = report.record(args, dtype, op, total * np.dtype(dtype).itemsize, count, spec.factor(comm.Get_size()),
                               rounds, places, iterations, wrong)
    record["nwrong_total"] = sum(w or 0 for w in wrong.values())
    record["held_bytes"] = held
    return record


def check(comm, spec, run, xp, dtype, op, total, in_place, args):
    """(wrong elements over ``args.check`` runs on fresh data, summed over ranks; the bytes of
    the vectors the check held on this rank)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    expected = spec.expected(dtype, op, total, rank, size)
    wrong, held = 0, expected.nbytes
    for _ in range(args.check):
        send, recv = spec.inputs(xp, dtype, op, total, rank, size)
        if in_place:
            send = recv = spec.in_place_buffer(xp, send, recv, rank, size)
        with placed(comm, args, *((send,) if in_place else (send, recv))) as here:
            result = run(here[0], here[-1], check=True)
            result = result.get() if hasattr(result, "get") and xp is not np else result
            wrong += wrong_elements(np.asarray(result), expected, op)
            held = max(held, expected.nbytes + sum(a.nbytes for a in here))
    return comm.allreduce(wrong, op=MPI.SUM), held


@contextlib.contextmanager
def placed(comm, args, *arrays):
    """``arrays`` where ``args`` puts them: as they are, ``args.unalign`` elements into a larger
    allocation (``-u``), in registered vectors (``-R 1``, freed on leaving: collective, in the
    same order on every rank), or both."""
    offset, registered = args.unalign, args.local_register
    if not offset and not registered:
        yield arrays
        return
    xp = array_module(arrays[0])
    copies, owners = [], []
    for array in arrays:
        if registered:
            owners.append(algorithms.alloc_registered(array.size + offset, array.dtype, comm))
            whole = owners[-1]
        else:
            whole = xp.empty(array.size + offset, array.dtype)
        copies.append(whole[offset:])
        copies[-1][...] = array
    yield tuple(copies)
    for owner in reversed(owners):
        algorithms.free_registered(owner, comm)


def _stamp():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")

