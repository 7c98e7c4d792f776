"""The prepared GPU check's parts (``bench/gpu_check.sh`` runs them, each under its own time limit).

``mpiexec -n N python -m bench.gpu_check --part KIND --until EPOCH --output FILE`` runs one part
and has rank 0 rewrite FILE (JSON) after every step, so a part that its limit cuts off leaves
what it measured; each part sizes its work from the time left (``--until``, the wall-clock
second by which it must be done), never from a fixed sweep:

* ``copy`` (1 rank): the device copy's rate (device to device, and to and from pinned host
  memory), the reference of the one-GPU bound (:mod:`topology.model.one_device`);
* ``check``: every algorithm on every transport (CUDA IPC within the node, staged through pinned
  host memory, CUDA-aware MPI where the library is), in tiers, each result compared bit for bit
  with its closed-form value (:mod:`bench.core.check`): float32 sum first, then every op, every
  dtype the GPU path reduces, counts 0 and 1, then the largest count;
* ``sanitize``: one small case (ring and tree, CUDA IPC and staged) for ``compute-sanitizer``,
  which the script runs it under;
* ``busbw``: every algorithm on CUDA IPC and staged transports, sizes from ``--min-bytes`` up by
  4x while time is left, each size in interleaved rounds timed by the suite's one rule
  (:func:`bench.core.timing.rule`);
* ``nccl``: NCCL's all-reduce at one rank per GPU, or why it cannot run (it refuses two ranks on
  one GPU).

``python -m bench.gpu_check --merge DIR -o PREFIX`` writes ``PREFIX.json`` and ``PREFIX.md`` from
the parts in DIR (:mod:`bench.formats.gpu_report`). ``--device cpu`` runs the same on NumPy
buffers, so the check itself is tested on machines without a GPU.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.device import lacks as device_lacks
from algorithms.device import steps as steps_of
from algorithms.dtypes import TYPES
from plumbing.cli import Parser
from plumbing.ending import run_together
from plumbing.files import write_json_atomically

from ..baselines.base import Unavailable as BaselineUnavailable
from ..baselines.nccl import NcclBaseline
from ..core.check import check_expected, check_fill, wrong_elements
from ..core.collectives import AllReduce
from ..core.device import Unavailable, select_device
from ..core.sizes import parse_size
from ..core.startup import refused
from ..core.timing import intervals, rule, time_calls, timed
from ..formats.gpu_report import merge
from ..formats.report import bandwidths

#: ours but those run by name only (auto runs these; native is MPI's own)
ALGOS = tuple(name for name, algorithm in algorithms.ALGORITHMS.items() if algorithm.in_all)
PRIME = 1009
ROUNDS = 5  # interleaved rounds of every busbw size (medians and their intervals)
SANITIZED = ("ring", "tree")


class Part:
    """One part's results, rewritten (atomically, by rank 0) after every step."""

    def __init__(self, comm, path, kind, until, **facts):
        self.comm, self.path, self.until = comm, path, until
        self.data = {"part": kind, "ranks": comm.Get_size(), "complete": False, "cut": None, **facts}
        self.started, self.longest = time.time(), 0.0
        self.save()

    def save(self):
        if self.comm.Get_rank() == 0:
            self.data["seconds"] = round(time.time() - self.started, 3)
            write_json_atomically(self.path, self.data)

    def allows(self, what, scale=1.0):
        """Whether the step ``what`` fits in the time left, judged by rank 0 from the longest step
        so far times ``scale`` (collective); when not, the part says where it was cut."""
        fits = time.time() + self.longest * scale < self.until if self.comm.Get_rank() == 0 else None
        fits = self.comm.bcast(fits)
        if not fits:
            self.data["cut"] = f"cut by the time limit before {what}"
        return fits

    def step(self, run):
        """``run()``, timed for :meth:`allows`, then the results saved."""
        start = time.time()
        run()
        self.longest = max(self.longest, time.time() - start)
        self.save()

    def finish(self):
        self.data["complete"] = self.data["cut"] is None
        self.save()


def transports(device):
    """The transports each part runs: CUDA IPC (shared memory for NumPy), staged, and CUDA-aware MPI
    where the library is (always for NumPy)."""
    kinds = ["shm", "staged"]
    if device == "cpu" or algorithms.mpi_is_cuda_aware():
        kinds.append("direct")
    return kinds


def on_transport(comm, xp, kind):
    """A duplicate of ``comm`` whose ``xp`` buffers travel by transport ``kind`` (collective)."""
    os.environ["ALLREDUCE_TRANSPORT"] = kind  # read when a communicator first carries xp
    try:
        fresh = comm.Dup()
        return fresh, algorithms.transport_in_use(xp, fresh)
    finally:
        os.environ.pop("ALLREDUCE_TRANSPORT")


def tree_options(comm):
    """``bandwidth=`` for the algorithms that build on a matrix: uniform links (one device has no
    slow link for a matched tree to avoid)."""
    n = comm.Get_size()
    matrix = np.full((n, n), 100.0)
    np.fill_diagonal(matrix, 0.0)
    return {a: {"bandwidth": matrix} for a in ALGOS if algorithms.ALGORITHMS[a].wants_bandwidth()}


def device_dtypes(device):
    """The dtypes the GPU path reduces here (every dtype on NumPy buffers)."""
    return [t.name for t in TYPES if device == "cpu" or device_lacks(t.dtype) is None]


def tiers(comm, device, largest):
    """The check's cases, most telling first: (tier, dtype, op, count, in place)."""
    n = comm.Get_size()
    first = [("float32 sum", "float32", "sum", count, place) for count in (n + 1, PRIME) for place in (False, True)]
    ops = [("every op", "float32", op, PRIME, False) for op in algorithms.OPS if op != "sum"]
    dtypes = [("every dtype", dtype, "sum", PRIME, False) for dtype in device_dtypes(device) if dtype != "float32"]
    edges = [("counts 0 and 1", "float32", "sum", count, place) for count in (0, 1) for place in (False, True)]
    return [first, ops, dtypes, edges, [("largest count", "float32", "sum", largest, False)]]


def check_case(comm, xp, algo, options, dtype, op, count, in_place):
    """Wrong elements of one all-reduce against its closed form, summed over ranks."""
    n, rank = comm.Get_size(), comm.Get_rank()
    dtype = np.dtype(dtype)
    send = xp.asarray(check_fill(dtype, op, count, rank, n))
    recv = send if in_place else xp.empty_like(send)
    algorithms.allreduce(send, None if in_place else recv, op=op, algorithm=algo, comm=comm, **options)
    got = recv.get() if xp is not np else recv
    return comm.allreduce(wrong_elements(got, check_expected(dtype, op, count, n), op), op=MPI.SUM)


def run_check(comm, xp, part, args):
    """Every algorithm on every transport, tier by tier, while time is left."""
    options, runs, comms = tree_options(comm), [], []
    for kind in transports(args.device):
        private, description = on_transport(comm, xp, kind)
        comms.append(private)
        runs.append({"transport": kind, "description": description, "wrong": dict.fromkeys(ALGOS, 0),
                     "checked": dict.fromkeys(ALGOS, 0), "failures": []})
    all_tiers = tiers(comm, args.device, args.largest_count)
    part.data.update(runs=runs, tiers=[cases[0][0] for cases in all_tiers if cases])
    largest = 1
    try:
        for cases in all_tiers:
            counts = max((case[3] for case in cases), default=1)
            scale, largest = max(1.0, counts / largest), max(largest, counts)  # a tier of longer vectors takes longer
            for run, private in zip(runs, comms):
                for algo in ALGOS:
                    if cases and not part.allows(f"{cases[0][0]} of {algo} on {run['transport']}", scale):
                        return
                    scale = 1.0
                    part.step(lambda run=run, private=private, algo=algo: check_cases(
                        private, xp, algo, options.get(algo, {}), cases, run))
    finally:
        for private in comms:
            private.Free()


def check_cases(comm, xp, algo, options, cases, run):
    """``cases`` of one algorithm, their wrong elements and the first failures added to ``run``."""
    for tier, dtype, op, count, in_place in cases:
        bad = check_case(comm, xp, algo, options, dtype, op, count, in_place)
        run["wrong"][algo] += bad
        run["checked"][algo] += 1
        if bad and len(run["failures"]) < 10:
            run["failures"].append({"algorithm": algo, "dtype": dtype, "op": op, "count": count,
                                    "in_place": in_place, "wrong": bad})


def run_sanitize(comm, xp, part, args):
    """One small case for compute-sanitizer: ring and tree on CUDA IPC and staged, in and out of place."""
    options = tree_options(comm)
    part.data["runs"] = []
    for kind in ("shm", "staged"):
        private, description = on_transport(comm, xp, kind)
        for algo in SANITIZED:
            wrong = sum(check_case(private, xp, algo, options.get(algo, {}), "float32", "sum", 4099, place)
                        for place in (False, True))
            part.data["runs"].append({"transport": kind, "description": description, "algorithm": algo,
                                      "wrong": wrong})
            part.save()
        private.Free()


def sizes_from(smallest, largest):
    size = smallest
    while size <= largest:
        yield size
        size *= 4


def sweep(part, xp, tables, args):
    """Every size, from ``--min-bytes`` up by 4x while time is left (a size takes about 4x the
    last), of every table of ``tables`` ({label: (comm, {name: run(send, recv)}, rows)}), its runs
    in interleaved rounds timed by the suite's one rule; each run's rows appended to ``rows``."""
    for nbytes in sizes_from(args.min_bytes, args.max_bytes):
        if not part.allows(f"{nbytes} B", scale=4.5):
            return
        for comm, runs, rows in tables.values():
            part.step(lambda comm=comm, runs=runs, rows=rows: rows.extend(one_size(comm, xp, runs, nbytes)))


def one_size(comm, xp, runs, nbytes):
    """Rows (median time, its interval, busbw) of ``runs`` at ``nbytes``, float32 sum out of place."""
    send = xp.ones(nbytes // 4, xp.float32)
    recv = xp.empty_like(send)
    calls = {name: (lambda run=run: run(send, recv)) for name, run in runs.items()}
    iters = max(2, min(20, (64 << 20) // nbytes))
    factor, rows = AllReduce.factor(comm.Get_size()), []
    for name, interval in intervals(timed(comm, calls, iters, 1, ROUNDS, steps=steps_of(xp))).items():
        rows.append({"algorithm": name, "bytes": nbytes, "time_us": interval.median * 1e6,
                     "time_ci_us": [interval.low * 1e6, interval.high * 1e6],
                     "busbw_GBps": bandwidths(nbytes, interval.median, factor)[1],
                     "busbw_ci_GBps": [bandwidths(nbytes, t, factor)[1] for t in (interval.high, interval.low)]})
    return rows


def ours_on(comm, xp, kind, names, options):
    """(the duplicate of ``comm`` on transport ``kind``, its description, {name: run(send, recv)})."""
    private, description = on_transport(comm, xp, kind)
    return private, description, {a: (lambda s, r, a=a: algorithms.allreduce(s, r, algorithm=a, comm=private, check=False,
                                                                            **options.get(a, {})))
                                  for a in names}


def run_busbw(comm, xp, part, args):
    """Every algorithm's busbw on CUDA IPC and staged transports, sizes up while time is left."""
    options, tables = tree_options(comm), {}
    part.data.update(rounds=ROUNDS, runs=[])
    for kind in transports(args.device)[:2]:
        private, description, runs = ours_on(comm, xp, kind, ALGOS, options)
        run = {"transport": kind, "description": description, "rows": []}
        part.data["runs"].append(run)
        tables[kind] = (private, runs, run["rows"])
    try:
        sweep(part, xp, tables, args)
    finally:
        for private, _, _ in tables.values():
            private.Free()


def run_nccl(comm, xp, part, args):
    """NCCL's all-reduce beside our ring and tree on CUDA IPC, one rank per GPU; or why NCCL
    cannot run."""
    nccl = NcclBaseline()
    try:
        nccl.start(comm)
    except BaselineUnavailable as exc:
        part.data["unavailable"] = str(exc)
        return
    try:
        private, description, ours = ours_on(comm, xp, "shm", ("ring", "tree"), {})
        part.data.update(rounds=ROUNDS, description=description, rows=[])
        try:
            sweep(part, xp, {"nccl": (comm, {"nccl": nccl.runner(AllReduce, "nccl", comm, "sum"), **ours},
                                      part.data["rows"])}, args)
        finally:
            private.Free()
    finally:
        nccl.close()


def run_copy(comm, xp, part, args):
    """The copy rates on this rank alone, sizes up while time is left."""
    steps = steps_of(xp)
    rows = part.data["rows"] = []
    for nbytes in sizes_from(args.min_bytes, args.max_bytes):
        if not part.allows(f"copies of {nbytes} B", scale=4.5):
            return
        part.step(lambda nbytes=nbytes: rows.append(copy_rates(xp, steps, nbytes)))


def copy_rates(xp, steps, nbytes):
    """GB/s of a device-to-device copy of ``nbytes``, and of copies to and from pinned host memory."""
    a = xp.ones(nbytes // 4, xp.float32)
    b = xp.empty_like(a)
    row = {"bytes": nbytes, "d2d_GBps": _rate(steps, lambda: xp.copyto(b, a), nbytes)}
    if steps.device:
        host = steps.pinned(nbytes)
        # the staged transport's copies, each waited for (they run on side streams, outside the clock's stream)
        row["d2h_GBps"] = _rate(steps, lambda: steps.wait(steps.copy_out(a.view(np.uint8), host)), nbytes)
        row["h2d_GBps"] = _rate(steps, lambda: steps.wait(steps.copy_in(host, b.view(np.uint8))), nbytes)
    return row


def _rate(steps, copy, nbytes):
    """GB/s of ``copy`` on this rank alone: the fastest of the rounds' medians."""
    iters = max(2, min(50, (1 << 30) // nbytes))
    seconds = [time_calls(MPI.COMM_SELF, copy, iters, 1, steps=steps)[0] for _ in range(ROUNDS)]
    return nbytes / min(seconds) / 1e9


PARTS = {"copy": run_copy, "check": run_check, "sanitize": run_sanitize, "busbw": run_busbw, "nccl": run_nccl}


def run_part(args):
    comm = MPI.COMM_WORLD
    gpus, device_name = 0, "host memory"
    if args.device == "gpu":
        xp, device, gpus = select_device(comm)
        device_name = xp.cuda.runtime.getDeviceProperties(device)["name"].decode()
    else:
        xp = np
    part = Part(comm, args.output, args.part, args.until, device=args.device, device_name=device_name,
                gpus_per_node=gpus, cuda_aware_mpi=algorithms.mpi_is_cuda_aware(), timing=rule(args.device == "gpu"))
    PARTS[args.part](comm, xp, part, args)
    part.finish()
    if comm.Get_rank() == 0:
        print(f"# {args.part}, {comm.Get_size()} ranks: " + ("complete" if part.data["complete"] else part.data["cut"]),
              flush=True)


def main(argv=None):
    p = Parser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=sorted(PARTS), help="run this part under mpiexec (no default)")
    p.add_argument("--output", help="the part's JSON file, rewritten as the part goes (no default: needed with --part)")
    p.add_argument("--until", type=float,
                   help="the wall-clock second (epoch) by which the part must be done (default: 60 s from now)")
    p.add_argument("--merge", metavar="DIR", help="merge the parts in DIR into -o PREFIX.json/.md (no default)")
    p.add_argument("-o", "--prefix", help="prefix of the merged PREFIX.json and PREFIX.md (no default: needed with --merge)")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="gpu: CuPy device buffers; cpu: NumPy buffers, to test the check itself (default gpu)")
    p.add_argument("--min-bytes", type=parse_size, default=parse_size("1M"),
                   help="smallest size of the busbw sweeps and copies, in bytes; K, M, G are powers of 1024 (default 1M)")
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("1G"),
                   help="the largest size they may reach while time is left (default 1G)")
    p.add_argument("--largest-count", type=int, default=1_000_003,
                   help="the largest vector of the correctness check, in elements (default 1000003)")
    args = p.parse_args(argv)
    if bool(args.part) == bool(args.merge) or (args.merge and not args.prefix) or (args.part and not args.output):
        p.error("give --part KIND --output FILE (under mpiexec), or --merge DIR -o PREFIX")
    if args.merge:
        return merge(args.merge, args.prefix)
    if args.until is None:
        args.until = time.time() + 60
    return run_together(lambda: _part(args), "python -m bench.gpu_check")


def _part(args):
    """One part under mpiexec; exit 2 with one line when a GPU part is missing."""
    if refused(MPI.COMM_WORLD, "python -m bench.gpu_check", (args.output,)):
        return 2
    try:
        run_part(args)
    except Unavailable as exc:  # no GPU, no CuPy: raised on every rank alike
        if MPI.COMM_WORLD.Get_rank() == 0:
            sys.stderr.write(f"python -m bench.gpu_check: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
