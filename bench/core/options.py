"""The sweep's command line: nccl-tests' flags with nccl-tests' meanings, and ours.

Every rank parses the same argv, so a bad argument is one line from rank 0 and exit 2 on
every rank. What the flags can only be checked against across ranks (the ``ALLREDUCE_*``
settings, the topology file, the GPUs) is agreed on here too, before anything is measured.
"""

import argparse
import os

from mpi4py import MPI

import algorithms
from algorithms.catalog.hier import layout_of
from algorithms.device import lacks as device_lacks
from algorithms.dtypes import TYPES
from algorithms.ops import is_floating
from algorithms.settings import agree_settings
from topology import BandwidthMatrix
from plumbing.cli import comma_names
from plumbing.ending import first_problem
from plumbing.launcher import launched

from ..baselines import BASELINES
from .cli import Parser, add_algo_flag, add_dtype_flag, add_size_flags, algos_in, size_type
from .collectives import COLLECTIVES
from .entries import entries, shown
from .sizes import sweep
from .timing import AGGREGATIONS

PROG = "python -m bench"
ROUNDS = 10  # --rounds: 10 rounds give the median a 97.9% interval from the 2nd to the 9th of them
ROUNDS_VARIABLE = "BENCH_ROUNDS"  # the default of --rounds where set (a quick functional run: 1 or 2)


def default_rounds():
    """--rounds' default: $BENCH_ROUNDS where set (a positive integer), else :data:`ROUNDS`."""
    text = os.environ.get(ROUNDS_VARIABLE, "").strip()
    if not text:
        return ROUNDS
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{ROUNDS_VARIABLE}={text!r}: the default of --rounds must be a positive integer")
    return int(text)

DESCRIPTION = """\
An nccl-tests-style sweep of every all-reduce algorithm, run under mpiexec:
  mpiexec -n 2 python -m bench -b 8 -e 4M -f 8

Rank 0 prints one table per algorithm (size, count, type, redop, root; then time in us,
algbw and busbw in GB/s and #wrong, out of place and in place), a summary per size, and
writes every finished row to the log. The algorithms take turns in --rounds rounds of each
size; time is the median of the rounds' means per call, and the summary's ratios, paired by
round, carry 95% confidence intervals ("tie" where one holds 1). With several algorithms the
tables print when the sweep ends; the log and -J get every size as it finishes. Sizes take K,
M and G suffixes (powers of 1024).
algbw = bytes / time; busbw = algbw x 2(N-1)/N for allreduce, x (N-1)/N for
reducescatter and allgather, N the rank count (nccl-tests' definition).

Exit status: 0; 1 when an element was wrong or a rank failed; 2 for bad arguments,
settings or files (found before the first size); 3 for a -T timeout; 130 or 143 when
interrupted by SIGINT or SIGTERM."""


class Formatter(argparse.RawDescriptionHelpFormatter):
    """The description and epilog as written; each flag's default after its help."""

    def _get_help_string(self, action):
        text = action.help or ""
        shown = action.default is not None and action.default is not False and action.default != argparse.SUPPRESS
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


def build_parser(epilog=""):
    """The sweep's parser; ``epilog`` follows the flags (``python -m bench`` lists its tools there)."""
    p = Parser(prog=PROG, description=DESCRIPTION, formatter_class=Formatter, epilog=epilog)
    sizes = p.add_argument_group("sizes and iterations (as nccl-tests)")
    add_size_flags(p, "32M", "32M", 2, group=sizes, step_note=" (used when -i is 0)")
    sizes.add_argument("-i", "--stepbytes", type=size_type, default=0, metavar="BYTES",
                       help="add this many bytes from one size to the next instead of -f")
    sizes.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    sizes.add_argument("-m", "--agg_iters", type=int, default=1,
                       help="calls per timed iteration, back to back; the time column is per call")
    sizes.add_argument("-w", "--warmup_iters", type=int, default=5,
                       help="untimed iterations before the timed ones, in every round of every size")
    sizes.add_argument("-N", "--run_cycles", type=int, default=1,
                       help="run every size this many times, each cycle's rows printed and logged "
                            "(0: until stopped by Ctrl-C or a signal)")
    what = p.add_argument_group("what is measured")
    what.add_argument("-o", "--op", default="sum", choices=[*algorithms.OPS, "all"],
                      help="reduction op, or all")
    add_dtype_flag(p, "float", f"the element type (all, with --device gpu: every type the GPU path reduces, which "
                   f"are not {', '.join(t.nccl for t in TYPES if not t.gpu)}, and bfloat16 only where CuPy holds it, "
                   "14 and newer); bfloat16 and fp8 reduce in their own arithmetic (each result rounded to the "
                   "type), on inputs whose every partial sum the type holds", every=True, group=what)
    what.add_argument("-r", "--root", type=int, default=0,
                      help="root rank of rooted collectives; these three are rootless, so the root "
                           "column prints -1, as nccl-tests prints it for them")
    add_algo_flag(p, "all", algo_help(), group=what)
    what.add_argument("--collective", default="allreduce", choices=sorted(COLLECTIVES),
                      help="allreduce, or ring's reducescatter or allgather on their own")
    what.add_argument("--device", default="cpu", choices=("cpu", "gpu"),
                      help="cpu: NumPy buffers; gpu: CuPy buffers, GPU local_rank %% GPUs per rank")
    what.add_argument("--topology", metavar="FILE",
                      help="bandwidth matrix for bamtree, kmtree and bamring (from python -m topology probe -o "
                           "FILE); without it the driver probes first and saves the matrix beside the log; with "
                           "it, the summary gives each all-reduce's time over the lower bound on its links")
    what.add_argument("--probe-bytes", type=size_type, default="4M", metavar="BYTES",
                      help="message size of that probe, K/M/G suffixes")
    how = p.add_argument_group("how it is measured (as nccl-tests)")
    how.add_argument("-c", "--check", type=int, default=1, metavar="N",
                     help="check each size N times on fresh data whose exact result is known (#wrong: "
                          "wrong elements summed over ranks); 0: no check (#wrong shows N/A)")
    how.add_argument("-a", "--average", type=int, default=1, choices=sorted(AGGREGATIONS),
                     help="how per-rank times become one: 0 rank 0, 1 mean, 2 min, 3 max")
    how.add_argument("-z", "--blocking", type=int, default=0, choices=(0, 1),
                     help="1: a barrier after every call, inside the timing")
    how.add_argument("-u", "--unalign", type=int, default=0, metavar="K",
                     help="misalign the send and receive buffers: they start K elements into their "
                          "allocations")
    how.add_argument("-R", "--local_register", type=int, default=0, choices=(0, 1, 2),
                     help="1: send and receive buffers from algorithms.alloc_registered (host memory the "
                          "ranks of a node read in place), as nccl-tests -R 1 registers them with NCCL; "
                          "2 (NCCL's symmetric registration) does not apply")
    how.add_argument("-T", "--timeout", type=float, default=0, metavar="SECONDS",
                     help="end every rank (exit 3) when one size (every algorithm's rounds of it) takes "
                          "longer; 0: never")
    how.add_argument("--rounds", type=int, default=None, metavar="R",
                     help="measure each size in R rounds that interleave the algorithms: in every round each "
                          "algorithm runs its -n calls once, out of place and in place, in an order rotated by "
                          "one each round, so that a slow moment of the machine falls on all of them alike "
                          "(the check once per algorithm and size, before the rounds; the -w warm-up before each "
                          "turn's timed calls). The time column "
                          "is the median over the rounds of each round's mean per call; the JSON keeps every "
                          "round's time and the median's 95%% confidence interval (order statistics: 6 rounds "
                          "or more reach 95%%), and the summary's ratios pair the rounds (default: "
                          f"${ROUNDS_VARIABLE} where set, else {ROUNDS})")
    report = p.add_argument_group("what is reported (as nccl-tests)")
    report.add_argument("-J", "--output_file", metavar="FILE.json",
                        help="nccl-tests' JSON document, written at the start and after every size")
    report.add_argument("-I", "--per_iter_timing", type=int, default=0, choices=(0, 1),
                        help="1: per-iteration statistics after each placement's #wrong: i_min, i_max and "
                             "i_p99 (us) over the iterations of the slowest rank's time per iteration, and "
                             "i_cv%% (standard deviation / mean); 21 fields a row instead of 13. The time "
                             "column stays each rank's mean per call combined by -a (the mean over ranks by "
                             "default), so it can be below i_min, a maximum over ranks. The JSON gets each "
                             "iteration's time, as nccl-tests' tools/analyze_perf_json.py reads it")
    report.add_argument("-K", "--per_iter_skip", type=int, default=0, metavar="K",
                        help="leave the first K iterations out of -I's statistics")
    report.add_argument("-S", "--report_timestamps", type=int, default=0, choices=(0, 1),
                        help="1: a timestamp column (YYYY-MM-DD HH:MM:SS, local time) at the end of every "
                             "row, as nccl-tests adds it: two more fields, so parsers that keep rows of "
                             "exactly 13 fields (CloudAI's) skip them and SuperBench's busbw field moves")
    report.add_argument("-C", "--report_cputime", type=int, default=0, choices=(0, 1),
                        help="1: the time columns, named cputime, report the host's time to issue the calls "
                             "without waiting for the device to finish (the same as time for CPU buffers), "
                             "as nccl-tests does; algbw and busbw still come from the full time; the JSON "
                             "key is cpu_time")
    report.add_argument("-M", "--memory", type=int, default=0, choices=(0, 1),
                        help="1: a host memory-usage line after each table, as nccl-tests' GPU one: what "
                             "the ranks held before the sweep, the driver's own vectors, the rest (the "
                             "algorithms' workspace, shared windows, MPI), and the peak, each the maximum "
                             "over ranks")
    report.add_argument("--log", metavar="FILE.jsonl",
                        help="append every row here as it finishes (default results/bench-<UTC time>-<N>r.jsonl; "
                             "'none' for no log)")
    report.add_argument("--quiet", action="store_true",
                        help="no progress lines on stderr (one per finished size; a bar on a terminal)")
    nccl = p.add_argument_group("nccl-tests flags that set one value here")
    nccl.add_argument("-t", "--nthreads", type=int, default=1,
                      help="threads per process: 1, since every rank is one process with one thread")
    nccl.add_argument("-g", "--ngpus", type=int, default=1,
                      help="devices per thread: 1, since every rank drives one device (or none)")
    nccl.add_argument("-p", "--parallel_init", type=int, default=0,
                      help="0: one thread per process initializes nothing in parallel")
    nccl.add_argument("-y", "--stream_null", type=int, default=0, help="0: CuPy's current stream is used")
    nccl.add_argument("-G", "--cudagraph", type=int, default=0,
                      help="0: the calls run from Python and cannot be captured in CUDA graphs")
    nccl.add_argument("-x", "--cta_policy", type=int, help="NCCL's CTA policy: not set (not applicable)")
    nccl.add_argument("-D", "--device_implementation", type=int, default=0,
                      help="0: NCCL's device API is not used")
    nccl.add_argument("-V", "--device_cta_count", type=int, help="NCCL device API CTAs: not set (not applicable)")
    return p


#: nccl-tests flags whose other values do not apply here, and why (flag, attribute, allowed, reason)
NOT_APPLICABLE = [
    ("-t", "nthreads", 1, "every rank is one process with one thread; start more ranks (mpiexec -n N) instead"),
    ("-g", "ngpus", 1, "every rank drives one GPU; start one rank per GPU (mpiexec -n N) instead"),
    ("-p", "parallel_init", 0, "parallel initialization starts a thread per GPU, and a rank here has one thread"),
    ("-y", "stream_null", 0, "the collectives run on CuPy's current stream; there is no NULL-stream mode"),
    ("-G", "cudagraph", 0, "CUDA graphs capture device work, and these collectives run from Python between "
                           "their device kernels"),
    ("-x", "cta_policy", None, "it sets NCCL's CTA policy, and only --algo nccl runs NCCL kernels "
                               "(set NCCL_CTA_POLICY for it)"),
    ("-D", "device_implementation", 0, "it selects a kernel of NCCL's device API, which is not used here"),
    ("-V", "device_cta_count", None, "it sizes NCCL's device API kernels (-D), which are not used here"),
    ("-R", "local_register", (0, 1), "2 is NCCL's symmetric registration of device memory; -R 1 registers "
                                     "host vectors (algorithms.alloc_registered)"),
]


def parse_args(argv, epilog=""):
    p = build_parser(epilog)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    for flag, attribute, allowed, reason in NOT_APPLICABLE:
        value = getattr(args, attribute)
        if value != allowed and (not isinstance(allowed, tuple) or value not in allowed):
            p.error(f"{flag} {value} does not apply here: {reason}")
    try:
        agree_settings(comm)  # ALLREDUCE_* variables: valid, and alike on every rank
    except ValueError as exc:
        p.error(str(exc))
    if args.rounds is None:  # from $BENCH_ROUNDS: valid, and alike on every rank, or exit 2 on all of them
        try:
            mine = default_rounds()
        except ValueError as exc:
            mine = str(exc)
        found = comm.allgather(mine)
        problem = next((f for f in found if isinstance(f, str)), None)
        if problem is None and len(set(found)) > 1:
            problem = f"{ROUNDS_VARIABLE} differs between ranks ({', '.join(map(str, found))}); set it alike, or pass --rounds"
        if problem:
            p.error(problem)
        args.rounds = mine

    spec = COLLECTIVES[args.collective]
    known = entries(spec)
    if args.local_register and args.device != "cpu":
        p.error("-R 1 needs --device cpu: registered vectors are host memory")
    wanted = None if args.datatype.every else args.datatype.rows[0]
    if args.device == "gpu" and wanted is not None and not wanted.gpu:  # said before looking for a GPU
        p.error(f"-d {wanted.nccl} needs --device cpu: {device_lacks(wanted.dtype)}")
    held = None
    if args.device == "gpu":
        problem = first_problem(comm, gpu_problem())
        if problem:
            p.error(problem)
        held = [t.name for t in TYPES if all(comm.allgather(device_lacks(t.dtype) is None))]
        if wanted is not None and wanted.name not in held:
            p.error(f"-d {wanted.nccl} needs --device cpu: {first_problem(comm, device_lacks(wanted.dtype))}")
    args.cuda_aware = args.device != "gpu" or algorithms.mpi_is_cuda_aware()
    every = comma_names(args.algo) == ["all"]
    try:  # each name resolved here, once; all: ours but those run by name only, and the baselines that can run here
        named = algos_in(args.algo, known, spec.name, choices=shown(spec))
    except ValueError as exc:
        p.error(str(exc))
    args.algos = [entry for entry in known.values() if entry.in_all(args)] if every else named
    if args.topology:
        try:
            args.topology = shared_topology(comm, args.topology)
        except ValueError as exc:
            p.error(f"--topology: {exc}")
    args.hier = None
    if "hier" in [entry.name for entry in args.algos]:  # its node layout, built now (collective): a bad ALLREDUCE_NODE_MAP is exit 2
        try:
            args.hier = layout_of(comm).describe()
        except ValueError as exc:  # the same on every rank: the map is agreed on
            p.error(str(exc))
    if args.datatype.every:
        args.dtypes = [t.name for t in TYPES] if held is None else held
    else:
        args.dtypes = [wanted.name]
    for baseline in BASELINES:
        problem = baseline.check(args, [entry.name for entry in args.algos if entry.baseline is baseline])
        if problem:
            p.error(problem)
    for entry in [] if every else args.algos:  # named alone for types it has none of: nothing to measure
        reasons = [entry.lacks(dtype) for dtype in args.dtypes]
        if all(reasons):
            p.error(f"--algo {entry.name}: {reasons[0]}")
    args.ops = (list(algorithms.OPS) if args.op == "all" else [args.op]) if spec.has_op else ["none"]
    if not any(runs(dtype, op) for dtype in args.dtypes for op in args.ops):
        named = "all" if args.datatype.every else args.datatype.rows[0].nccl
        p.error(f"-o {args.op} -d {named} leaves nothing to measure: avg is defined for "
                "floating-point types only (-d half, float, double, bfloat16, f8e4m3, f8e5m2)")
    try:
        args.sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    except ValueError as exc:
        p.error(str(exc))
    for flag in ("iters", "warmup_iters", "check", "per_iter_skip", "run_cycles", "unalign"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag} must not be negative")
    if args.iters < 1:
        p.error("--iters must be at least 1")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.agg_iters < 1:
        p.error("--agg_iters must be at least 1")
    if args.per_iter_skip >= args.iters and args.per_iter_timing:
        p.error(f"-K {args.per_iter_skip} skips every one of the {args.iters} iterations")
    return args


def algo_help():
    """--algo's help: ours, from the registry (and auto), then each baseline's own line."""
    ours = [name for name, algorithm in algorithms.ALGORITHMS.items() if algorithm.in_all]
    return (f"comma list of {','.join(ours)}, auto (per size, from the tuning table in ALLREDUCE_TUNING_FILE, else "
            "the model), native (MPI_Allreduce through our entry point) and the baselines "
            + ", ".join(b.help for b in BASELINES)
            + ", or all (ours and every baseline that can run here; auto, native and the baselines' variants "
            "NAME:... only by name); bamtree and kmtree build their trees, and bamring its ring order, from "
            "--topology, or from a probe the driver runs first when it is not given; hier (hierarchical: within "
            "nodes, then across) takes its nodes from ALLREDUCE_NODE_MAP or shared memory, and with "
            "ALLREDUCE_HIER_ACROSS=bamtree its tree across nodes from --topology too")


def runs(dtype, op):
    """Whether the sweep measures ``op`` on ``dtype`` (avg only on floating types)."""
    return op != "avg" or is_floating(dtype)


def gpu_problem():
    """Why this rank has no GPU to run on (text), else None."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return f"--device gpu: no CUDA GPU on rank {MPI.COMM_WORLD.Get_rank()}"
    except Exception as exc:  # ImportError, CUDA driver errors
        return f"--device gpu: no GPU to run on, rank {MPI.COMM_WORLD.Get_rank()}: {type(exc).__name__}: {exc}"
    return None


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


def launched_alone():
    """True when this process runs as one rank without a launcher (plain ``python -m bench``)."""
    return MPI.COMM_WORLD.Get_size() == 1 and not launched()
