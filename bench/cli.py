"""``mpiexec -n N python -m bench [flags]``: an nccl-tests-style sweep of every algorithm.

Flags keep nccl-tests' meaning: -b/-e min/max bytes (K/M/G), -f factor, -i
step, -n iterations, -w warm-up iterations, -c check iterations, -o op, -d
dtype (``all`` for every op or dtype), -a aggregation of per-rank times (0
rank 0, 1 mean, 2 min, 3 max), -z 1 barrier after every call, -T timeout in
seconds, -J JSON file, -I 1 per-iteration statistics with -K leading
iterations skipped. Ours: --algo, --collective, --device, --topology, --log,
--quiet. Rank 0 prints one table per algorithm; the exit status is 1 when any
element was wrong or a rank failed, 2 for bad arguments, settings or files (found before
the first size), 3 for a -T timeout, 130 or 143 when interrupted.
"""

import argparse
import contextlib
import datetime
import os
import socket
import sys
import threading

import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.ending import end_job, fail_together, uncut
from algorithms.settings import agree_settings
from topology import BandwidthMatrix

from .check import wrong_elements
from .collectives import COLLECTIVES, algorithm_names, make_runner, needs_topology
from .machine import describe
from .memory import bytes_needed, check_memory
from .report import COLUMNS, PER_ITER_COLUMNS, TYPE_NAMES, bandwidths, footer, row
from .results import ResultsWriter, bool_text
from .sizes import parse_size, sweep
from .timing import AGGREGATIONS, aggregate, iteration_stats, time_calls

PROG = "python -m bench"
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "int": "int32",
            "char": "int8", "uint": "uint32"}


class Parser(argparse.ArgumentParser):
    def error(self, message):
        """One clear line on rank 0, exit 2 on every rank (all ranks parse the same argv)."""
        if MPI.COMM_WORLD.Get_rank() == 0:
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def parse_args(argv):
    p = Parser(prog="python -m bench", description=__doc__.splitlines()[0],
               epilog="Subcommands: python -m bench compare|model|plot|scaling|perf --help")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("32M"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=0)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-o", "--op", default="sum", choices=[*algorithms.OPS, "all"])
    p.add_argument("-d", "--datatype", default="float",
                   help="float, double, half, int8..uint64, any numpy name, or all")
    p.add_argument("-a", "--average", type=int, default=1, choices=sorted(AGGREGATIONS),
                   help="per-rank times: 0 rank 0, 1 mean, 2 min, 3 max")
    p.add_argument("-z", "--blocking", type=int, default=0, choices=(0, 1),
                   help="1: a barrier after every call, inside the timing")
    p.add_argument("-T", "--timeout", type=float, default=0,
                   help="abort the run when one size takes longer than this many seconds")
    p.add_argument("-J", "--output_file", metavar="FILE.json", help="nccl-tests JSON output")
    p.add_argument("-I", "--per_iter_timing", type=int, default=0, choices=(0, 1))
    p.add_argument("-K", "--per_iter_skip", type=int, default=0)
    p.add_argument("-R", "--local_register", type=int, default=0, choices=(0, 1),
                   help="1: send and receive buffers from algorithms.alloc_registered (host memory that the "
                        "ranks of a node read in place), as nccl-tests -R 1 registers them with NCCL")
    p.add_argument("--algo", default="all",
                   help="comma list of ps,ring,tree,bamtree,kmtree,dbtree,rd,mpi,nccl or all "
                        "(bamtree and kmtree need --topology; nccl needs --device gpu)")
    p.add_argument("--collective", default="allreduce", choices=sorted(COLLECTIVES))
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--topology", metavar="FILE",
                   help="bandwidth matrix for bamtree and kmtree (python -m topology probe -o FILE); "
                        "without it the driver probes first and saves the matrix beside the log")
    p.add_argument("--probe-bytes", type=parse_size, default=parse_size("4M"),
                   help="message size of that probe (default 4M)")
    p.add_argument("--log", metavar="FILE.jsonl",
                   help="append every row here as it finishes (default results/bench-<time>.jsonl; "
                        "'none' for no log)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    try:
        agree_settings(comm)  # ALLREDUCE_* variables: valid, and alike on every rank
    except ValueError as exc:
        p.error(str(exc))

    spec = COLLECTIVES[args.collective]
    known = algorithm_names(spec)
    cuda_aware = args.device != "gpu" or algorithms.mpi_is_cuda_aware()
    if args.algo == "all":  # the baselines that can run here
        args.algos = [a for a in known if (a != "nccl" or args.device == "gpu") and (a != "mpi" or cuda_aware)]
    else:
        args.algos = [a for a in args.algo.split(",") if a]
    unknown = [a for a in args.algos if a not in known]
    if unknown:
        p.error(f"unknown --algo {','.join(unknown)} for {spec.name}; choices: {','.join(known)},all")
    if "nccl" in args.algos and args.device != "gpu":
        p.error("--algo nccl needs --device gpu")
    if "mpi" in args.algos and not cuda_aware:
        p.error("--algo mpi with --device gpu needs a CUDA-aware MPI (MPIX_Query_cuda_support says no; "
                "ALLREDUCE_CUDA_AWARE=1 overrides)")
    if args.local_register and args.device != "cpu":
        p.error("-R 1 needs --device cpu: registered vectors are host memory")
    if args.topology:
        try:
            args.topology = shared_topology(comm, args.topology)
        except ValueError as exc:
            p.error(f"--topology: {exc}")
    names = [dt.name for dt in algorithms.DTYPES]
    if args.datatype == "all":
        args.dtypes = names
    elif _ALIASES.get(args.datatype, args.datatype) in names:
        args.dtypes = [_ALIASES.get(args.datatype, args.datatype)]
    else:
        p.error(f"unknown -d {args.datatype}; choices: {', '.join(names)}, float, double, half, all")
    args.ops = (list(algorithms.OPS) if args.op == "all" else [args.op]) if spec.has_op else ["none"]
    if not any(runs(dtype, op) for dtype in args.dtypes for op in args.ops):
        p.error(f"-o {args.op} -d {args.datatype} leaves nothing to measure: avg is defined for "
                "floating-point types only (-d half, float, double)")
    try:
        args.sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    except ValueError as exc:
        p.error(str(exc))
    for flag in ("iters", "warmup_iters", "check", "per_iter_skip"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag} must not be negative")
    if args.iters < 1:
        p.error("--iters must be at least 1")
    if args.per_iter_skip >= args.iters and args.per_iter_timing:
        p.error(f"-K {args.per_iter_skip} skips every one of the {args.iters} iterations")
    ranks = MPI.COMM_WORLD.Get_size()
    for dtype in args.dtypes:
        itemsize = np.dtype(dtype).itemsize
        unit = itemsize * (ranks if spec is not COLLECTIVES["allreduce"] else 1)
        odd = [s for s in args.sizes if s % unit]
        if odd:
            p.error(f"size {odd[0]} is not a multiple of {unit} bytes ({dtype}"
                    f"{f' x {ranks} ranks' if unit != itemsize else ''})")
    return args


def runs(dtype, op):
    """Whether the sweep measures ``op`` on ``dtype`` (avg only on floating types)."""
    return op != "avg" or np.dtype(dtype).kind == "f"


def shared_topology(comm, path):
    """The matrix in ``path``, read and checked on rank 0 alone and sent to every rank (on a
    cluster the file may lie on rank 0's node only); the same ``ValueError`` on every rank
    when it is bad."""
    matrix, problem = None, None
    if comm.Get_rank() == 0:
        try:
            matrix = BandwidthMatrix.load(path, ranks=comm.Get_size())
        except ValueError as exc:
            problem = str(exc)
    matrix, problem = comm.bcast((matrix, problem), root=0)
    if problem:
        raise ValueError(problem)
    return matrix


def malloc_mode():
    """Which allocator settings a row ran with (DESIGN.md section 4: MPI_Allreduce's temporary
    buffers pay page faults unless glibc keeps freed memory mapped)."""
    tuned = [k for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ]
    return "tuned (" + " ".join(f"{k}={os.environ[k]}" for k in tuned) + ")" if tuned else "glibc defaults"


TIMEOUT_EXIT = 3


class Watchdog:
    """``-T``: end every rank (exit 3) when one size runs longer than ``seconds`` (a hang,
    say), through :func:`algorithms.ending.end_job`: rank 0's line is the one printed."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.timer = None
        self.rank = MPI.COMM_WORLD.Get_rank()

    def arm(self, what):
        self.disarm()
        if self.seconds > 0:
            def fire():
                end_job(TIMEOUT_EXIT, f"python -m bench: rank {self.rank}: timeout: {what} ran over "
                                      f"{self.seconds:g} s (-T); ending every rank")
            self.timer = threading.Timer(self.seconds, fire)
            self.timer.daemon = True
            self.timer.start()

    def disarm(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def header_lines(comm, args, algo, device_lines, transport):
    config_line = (
        f"# nThread 1 nGpus 1 minBytes {args.minbytes} maxBytes {args.maxbytes} "
        f"step: {args.stepbytes if args.stepbytes else args.stepfactor}"
        f"({'bytes' if args.stepbytes else 'factor'}) warmup iters: {args.warmup_iters} "
        f"iters: {args.iters} agg iters: 1 validation: {1 if args.check else 0} graph: 0"
    )
    info = describe()
    lines = [config_line]
    if args.blocking:
        lines.append("# Blocking Enabled: barrier after each iteration, inside the timing")
    if args.per_iter_timing:
        lines.append("# Per-Iteration Report: MPI_Wtime timing; i_* uses max over process rows"
                     + (f"; summary skips first {args.per_iter_skip} iterations" if args.per_iter_skip else ""))
    lines += [
        "#",
        f"# Algorithm: {algo}  Collective: {args.collective}  Ranks: {comm.Get_size()}  "
        f"Hosts: {len({d['hostname'] for d in device_lines})}  Device: {args.device}  "
        f"Time aggregation: {AGGREGATIONS[args.average]}  MPI: {info['mpi']}",
        f"# Transport: {transport}",
        *(["# Buffers: registered (algorithms.alloc_registered; -R 1)"] if args.local_register else []),
        f"# Machine: {info['machine']} {info['cpu']}  Python {info['python']}  numpy {info['numpy']}"
        f"  Commit: {info['commit']}",
        f"# Env: {info['env']}",
        f"# Malloc: {malloc_mode()}  Transparent huge pages: {info['transparent_hugepages']}",
        "#",
        "# Using devices",
    ]
    for d in device_lines:
        lines.append(f"#  Rank {d['rank']:2d} Group  0 Pid {d['pid']:6d} on {d['hostname']:>10s} "
                     f"device {d['device']:2d} [{d['device_hex']}] {d['device_info']}")
    lines += ["#", PER_ITER_COLUMNS if args.per_iter_timing else COLUMNS]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    spec = COLLECTIVES[args.collective]
    say = print if rank == 0 else (lambda *a, **k: None)
    progress = rank == 0 and not args.quiet and sys.stderr.isatty()

    xp, device, nccl = np, -1, None
    try:
        if args.device == "gpu":
            from .gpu import NcclBaseline, select_device

            xp, device, gpus = select_device(comm)
            if "nccl" in args.algos:
                nccl = NcclBaseline(comm, gpus)
    except RuntimeError as exc:
        if rank == 0:
            sys.stderr.write(f"python -m bench: {exc}\n")
        return 2
    device_info = (f"{xp.cuda.runtime.getDeviceProperties(device)['name'].decode()}" if device >= 0
                   else "host memory")
    devices = comm.gather({"rank": rank, "group": 0, "pid": os.getpid(), "hostname": socket.gethostname(),
                           "device": max(device, 0), "device_hex": "gpu" if device >= 0 else "cpu",
                           "device_info": device_info}, root=0)

    problem = None
    try:
        check_memory(comm, bytes_needed(max(args.sizes), args.local_register),
                     f"the largest size, {max(args.sizes)} B,")
    except ValueError as exc:
        problem = str(exc)
    if fail_together(comm, PROG, problem):
        return 2
    log = args.log or os.path.join("results", f"bench-{_stamp()}-{size}r.jsonl")
    writer = None
    if rank == 0:  # -J and --log checked (and -J written) before the first size
        try:
            writer = open_results(args, argv, devices, size, spec, None if log == "none" else log)
        except ValueError as exc:
            problem = str(exc)
    if fail_together(comm, PROG, problem):
        return 2
    if writer is not None and args.output_file:
        say(f"# Writing JSON output to {args.output_file}")

    if args.topology is None and any(needs_topology(a) for a in args.algos):
        args.topology = probe_first(comm, args, os.path.dirname(log) if rank == 0 and log != "none" else None)

    watchdog = Watchdog(args.timeout)
    total_wrong = 0
    try:
        for algo in args.algos:
            transport = transport_of(algo, comm, xp)
            if rank == 0:
                say(header_lines(comm, args, algo, devices, transport), flush=True)
            wrong_here, busbws = 0, []
            for dtype in args.dtypes:
                for op in args.ops:
                    if not runs(dtype, op):
                        continue
                    run = make_runner(spec, algo, comm, op, args.topology, nccl)
                    for number, nbytes in enumerate(args.sizes, 1):
                        watchdog.arm(f"{algo} {dtype} {op} {nbytes} B")
                        if progress:
                            sys.stderr.write(f"\r[{algo}] {dtype} {op} {nbytes} B ({number}/{len(args.sizes)})   ")
                            sys.stderr.flush()
                        record = measure(comm, args, spec, run, xp, dtype, op, nbytes)
                        watchdog.disarm()
                        wrong_here += record["nwrong_total"]
                        if rank == 0:
                            busbws += [record["out_of_place"]["bus_bw"], record["in_place"]["bus_bw"]]
                            record.pop("nwrong_total")
                            with uncut():  # the table, the log and -J agree however the job ends
                                say(record.pop("text"), flush=True)
                                writer.add({**record, "algorithm": algo, "experiment_name": f"{spec.name}/{algo}"})
            if progress:
                sys.stderr.write("\r" + " " * 60 + "\r")
            say(footer(wrong_here, busbws), flush=True)
            say("#", flush=True)
            total_wrong += wrong_here
    finally:
        watchdog.disarm()
    if writer is not None:
        writer.finish()
    return 1 if total_wrong else 0


def open_results(args, argv, devices, size, spec, log):
    """The :class:`ResultsWriter` of this run (rank 0): the log opened, ``-J`` written."""
    config = {
        "nthreads": 1, "ngpus": 1, "minimum_bytes": args.minbytes, "maximum_bytes": args.maxbytes,
        **({"step_bytes": args.stepbytes} if args.stepbytes else {"step_factor": args.stepfactor}),
        "warmup_iters": args.warmup_iters, "iterations": args.iters, "aggregated_iterations": 1,
        "validation": args.check, "graph": 0, "blocking_collectives": bool_text(args.blocking),
        "per_iter_timing": bool_text(args.per_iter_timing), "per_iter_skip": args.per_iter_skip,
        "parallel_init": "false", "devices": devices,
    }
    run_info = {**describe(), "ranks": size, "hosts": sorted({d["hostname"] for d in devices}),
                "collective": spec.name, "device": args.device,
                "aggregation": AGGREGATIONS[args.average], "malloc": malloc_mode(),
                "command": " ".join(["python -m bench", *argv])}
    return ResultsWriter(args.output_file, log, ["python -m bench", *argv], config, run_info)


def transport_of(algo, comm, xp):
    """What carries ``algo``'s messages, for its header (collective: every rank calls it)."""
    if algo == "mpi":
        return "the MPI library's own collective" + (" on device buffers (CUDA-aware MPI)" if xp is not np else "")
    if algo == "nccl":
        return "NCCL"
    return algorithms.transport_in_use(xp, comm)


def probe_first(comm, args, folder):
    """Measure the links for bamtree and kmtree (no --topology given). Every rank gets the
    matrix; rank 0 also saves it beside the log, for ``--topology`` next time."""
    from topology.probe import probe

    matrix = probe(comm, args.probe_bytes, reps=3, warmup=1)
    if comm.Get_rank() == 0:
        path = os.path.join(folder or "results", f"probe-{_stamp()}-{comm.Get_size()}r.json")
        matrix.save(path)
        print(f"# Topology: probed {matrix.size} ranks in {matrix.measured['rounds']} rounds "
              f"({args.probe_bytes} B messages), saved to {path}", flush=True)
    return matrix


def measure(comm, args, spec, run, xp, dtype, op, nbytes):
    """Time one size out of place and in place, check it, and return its result record."""
    size, rank = comm.Get_size(), comm.Get_rank()
    total, count = spec.counts(nbytes, np.dtype(dtype).itemsize, size)
    send, recv = spec.inputs(xp, dtype, op, total, rank, size)
    in_place = spec.in_place_buffer(xp, send.copy(), recv, rank, size)
    with placed(comm, args.local_register, send, recv, in_place) as (send, recv, in_place):
        return _measure(comm, args, spec, run, xp, dtype, op, total, count, send, recv, in_place)


def _measure(comm, args, spec, run, xp, dtype, op, total, count, send, recv, in_place):
    """:func:`measure` on these buffers."""
    size, rank = comm.Get_size(), comm.Get_rank()
    actual_bytes = total * np.dtype(dtype).itemsize
    times = np.zeros(args.iters) if args.per_iter_timing else None
    record = {"size": int(actual_bytes), "count": int(count), "type": TYPE_NAMES.get(dtype, dtype),
              "redop": op, "root": f"{-1:6d}", "actual_iterations": args.iters}
    results, per_iter, wrong_total = [], [], 0
    for placement, (s, r) in (("out_of_place", (send, recv)), ("in_place", (in_place, in_place))):
        run(s, r, check=True)  # arguments agree on every rank before timing
        settle = xp.cuda.get_current_stream().synchronize if xp is not np else None
        with np.errstate(all="ignore"):  # in-place timing re-reduces its own output: floats reach inf
            seconds = time_calls(comm, lambda: run(s, r), args.iters, args.warmup_iters, bool(args.blocking),
                                 times, settle)
        seconds = aggregate(comm, seconds, args.average)
        algbw, busbw = bandwidths(actual_bytes, seconds, spec.factor(size))
        wrong = (check(comm, spec, run, xp, dtype, op, total, placement == "in_place", args.check,
                       args.local_register) if args.check else None)
        wrong_total += wrong or 0
        record[placement] = {"time": seconds * 1e6, "alg_bw": algbw, "bus_bw": busbw,
                             "nwrong": None if wrong is None else float(wrong)}
        if args.per_iter_timing:
            stats = iteration_stats(comm, times, args.per_iter_skip)
            if rank == 0:
                record[f"{placement}_per_iter"] = stats
                per_iter.append(stats)
        results.append((seconds, algbw, busbw, wrong))
    if rank == 0:
        record["text"] = row(actual_bytes, count, dtype, op, -1, results, per_iter or None)
    record["nwrong_total"] = wrong_total
    return record


def check(comm, spec, run, xp, dtype, op, total, in_place, checks, registered=0):
    """Wrong elements over ``checks`` runs on fresh data, summed over ranks."""
    rank, size = comm.Get_rank(), comm.Get_size()
    expected = spec.expected(dtype, op, total, rank, size)
    wrong = 0
    for _ in range(checks):
        send, recv = spec.inputs(xp, dtype, op, total, rank, size)
        if in_place:
            send = recv = spec.in_place_buffer(xp, send, recv, rank, size)
        with placed(comm, registered, *((send,) if in_place else (send, recv))) as here:
            result = run(here[0], here[-1], check=True)
            result = result.get() if hasattr(result, "get") and xp is not np else result
            wrong += wrong_elements(np.asarray(result), expected)
    return comm.allreduce(wrong, op=MPI.SUM)


@contextlib.contextmanager
def placed(comm, registered, *arrays):
    """``arrays`` as they are, or (``registered``, -R 1) copies of them in registered vectors,
    freed on leaving (collective, in the same order on every rank)."""
    if not registered:
        yield arrays
        return
    copies = []
    for array in arrays:
        copies.append(algorithms.alloc_registered(array.size, array.dtype, comm))
        copies[-1][...] = array
    yield tuple(copies)
    for copy in reversed(copies):
        algorithms.free_registered(copy, comm)


def _stamp():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")

