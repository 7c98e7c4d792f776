"""The prepared GPU check (``bench/gpu_check.sh``): every algorithm on device buffers, each
transport, against the device's own copy bandwidth.

``mpiexec -n N python -m bench.gpu_check --part FILE`` runs one rank count:

* correctness: every algorithm, every op on float32 and ``sum`` on every dtype, in and out of
  place, counts 0, 1, N+1, a prime and about a million, for each transport (CUDA IPC within
  the node, staged through pinned host memory, CUDA-aware MPI when the library is), each
  result compared bit for bit with its closed-form value (``bench.core.check``);
* a busbw sweep of every algorithm and transport, and of NCCL when every rank has its own
  GPU (otherwise the reason it cannot run), from ``--min-bytes`` to ``--max-bytes``;
* the device-to-device copy bandwidth (and host<->device through pinned memory) on rank 0,
  the physical references.

``python -m bench.gpu_check --merge PART... -o PREFIX`` writes ``PREFIX.json`` and
``PREFIX.md``. ``--device cpu`` runs the same on NumPy buffers (transports shm, staged,
direct), so the check itself is tested on machines without a GPU.
"""

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.arrays import stream_synchronize
from algorithms.settings import size_text
from plumbing.cli import Parser
from plumbing.ending import run_together
from plumbing.files import write_json_atomically, write_text_atomically
from topology.probe import probe

from ..baselines.base import Unavailable as BaselineUnavailable
from ..baselines.nccl import NcclBaseline
from ..core.check import check_expected, check_fill, wrong_elements
from ..core.collectives import AllReduce
from ..core.device import Unavailable, select_device
from ..core.machine import results_header
from ..core.sizes import parse_size, sweep
from ..core.startup import refused
from ..core.timing import time_calls
from ..formats.report import bandwidths

#: ours but those run by name only (auto runs these; native is MPI's own)
ALGOS = tuple(name for name, algorithm in algorithms.ALGORITHMS.items() if algorithm.in_all)
PRIME = 1009


def correctness_cases():
    """(dtype, op) pairs: every op on float32, sum on every dtype CuPy has (not bfloat16 or fp8)."""
    cases = [("float32", op) for op in algorithms.OPS]
    cases += [(t.name, "sum") for t in algorithms.TYPES if t.name != "float32" and t.gpu]
    return cases


def check_correctness(comm, xp, tree_options, largest):
    """Wrong elements per algorithm (summed over cases), and the first failures."""
    n, rank = comm.Get_size(), comm.Get_rank()
    wrong, failures = {a: 0 for a in ALGOS}, []
    for algo in ALGOS:
        for dtype, op in correctness_cases():
            for count in sorted({0, 1, n + 1, PRIME, largest}):
                expected = check_expected(np.dtype(dtype), op, count, n)
                for in_place in (False, True):
                    send = xp.asarray(check_fill(np.dtype(dtype), op, count, rank, n))
                    recv = send if in_place else xp.empty_like(send)
                    algorithms.allreduce(send, None if in_place else recv, op=op, algorithm=algo, comm=comm,
                                         **tree_options.get(algo, {}))
                    got = recv.get() if hasattr(recv, "get") else recv
                    bad = comm.allreduce(wrong_elements(got, expected), op=MPI.SUM)
                    wrong[algo] += bad
                    if bad and len(failures) < 10:
                        failures.append({"algorithm": algo, "dtype": dtype, "op": op, "count": count,
                                         "in_place": in_place, "wrong": bad})
    return wrong, failures


def time_call(comm, xp, call, nbytes):
    """Seconds per call (slowest rank), after one warm-up, iterations scaled to the size."""
    iters = max(2, min(20, (256 << 20) // max(nbytes, 1)))
    seconds = time_calls(comm, call, iters, 1, settle=lambda: stream_synchronize(xp))[0]
    return comm.allreduce(seconds, op=MPI.MAX)


def sweep_busbw(comm, xp, sizes, runs):
    """``runs``: name -> run(send, recv). Rows of time and bus bandwidth per name and size."""
    factor = AllReduce.factor(comm.Get_size())
    rows = []
    for nbytes in sizes:
        send = xp.ones(nbytes // 4, xp.float32)
        recv = xp.empty_like(send)
        for name, run in runs.items():
            seconds = time_call(comm, xp, lambda: run(send, recv), nbytes)
            algbw, busbw = bandwidths(nbytes, seconds, factor)
            rows.append({"algorithm": name, "bytes": nbytes, "time_us": seconds * 1e6,
                         "algbw_GBps": algbw, "busbw_GBps": busbw})
    return rows


def copy_bandwidths(xp, sizes):
    """GB/s of a device-to-device copy (and of copies between device and pinned host memory)."""
    rows = []
    for nbytes in sizes:
        a = xp.ones(nbytes // 4, xp.float32)
        b = xp.empty_like(a)
        row = {"bytes": nbytes, "d2d_GBps": _copy_rate(xp, lambda: xp.copyto(b, a), nbytes)}
        if xp is not np:
            import cupyx

            host = cupyx.empty_pinned(a.shape, a.dtype)
            row["d2h_GBps"] = _copy_rate(xp, lambda: a.get(out=host), nbytes)
            row["h2d_GBps"] = _copy_rate(xp, lambda: b.set(host), nbytes)
        rows.append(row)
    return rows


def _copy_rate(xp, copy, nbytes):
    """GB/s of ``copy`` on this rank alone."""
    iters = max(2, min(50, (1 << 30) // nbytes))
    return nbytes / time_calls(MPI.COMM_SELF, copy, iters, 1, settle=lambda: stream_synchronize(xp))[0] / 1e9


def transports_to_try(device):
    kinds = ["shm", "staged"]
    if device == "cpu" or algorithms.mpi_is_cuda_aware():
        kinds.append("direct")
    return kinds


def run_part(args):
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    gpus, device_name = 0, "host memory"
    if args.device == "gpu":
        xp, device, gpus = select_device(comm)
        device_name = xp.cuda.runtime.getDeviceProperties(device)["name"].decode()
    else:
        xp = np
    sizes = sweep(args.min_bytes, args.max_bytes, 2)
    matrix = probe(comm, 1 << 20, reps=2, warmup=1)
    tree_options = {a: {"bandwidth": matrix.bandwidth} for a in ALGOS if algorithms.ALGORITHMS[a].wants_bandwidth()}
    part = {"ranks": n, "device": args.device, "device_name": device_name, "gpus_per_node": gpus,
            "cuda_aware_mpi": algorithms.mpi_is_cuda_aware(), "runs": []}
    for kind in transports_to_try(args.device):
        os.environ["ALLREDUCE_TRANSPORT"] = kind  # read when a communicator first carries xp
        private = comm.Dup()
        description = algorithms.transport_in_use(xp, private)
        wrong, failures = check_correctness(private, xp, tree_options, args.largest_count)
        runs = {a: (lambda s, r, a=a: algorithms.allreduce(s, r, algorithm=a, comm=private, check=False,
                                                           **tree_options.get(a, {})))
                for a in ALGOS}
        rows = sweep_busbw(private, xp, sizes, runs)
        part["runs"].append({"transport": kind, "description": description, "wrong": wrong,
                             "failures": failures, "sweep": rows})
        if rank == 0:
            print(f"# {n} ranks, {kind}: {description}; wrong {sum(wrong.values())}", flush=True)
        private.Free()
        algorithms.free_workspace()
    os.environ.pop("ALLREDUCE_TRANSPORT")
    if args.device == "gpu":
        nccl = NcclBaseline()
        try:
            nccl.start(comm)
            run = nccl.runner(AllReduce, "nccl", comm, "sum")
            part["nccl"] = {"sweep": sweep_busbw(comm, xp, sizes, {"nccl": lambda s, r: run(s, r)})}
        except BaselineUnavailable as exc:
            part["nccl"] = {"unavailable": str(exc)}
    part["copy"] = copy_bandwidths(xp, sizes) if rank == 0 else None
    if rank == 0:
        write_json_atomically(args.part, part)


def merge(args):
    parts = sorted((json.load(open(p)) for p in args.merge), key=lambda p: p["ranks"])
    data = {**results_header("gpu_check", None, argv=["gpu-check", *sys.argv[1:]], ranks=max(p["ranks"] for p in parts)),
            "device_name": parts[0]["device_name"], "parts": parts}
    data["copy"] = parts[0]["copy"]
    data["total_wrong"] = sum(sum(r["wrong"].values()) for p in parts for r in p["runs"])
    write_json_atomically(args.output + ".json", data)
    write_text_atomically(args.output + ".md", markdown(data))
    print(f"wrote {args.output}.json and .md; wrong elements in all: {data['total_wrong']}")
    return 1 if data["total_wrong"] else 0


def markdown(data):
    m = data["machine"]
    copy = {row["bytes"]: row for row in data["copy"]}
    lines = [f"# GPU check: {data['device_name']}", "",
             f"{data['date']}, commit {m['commit']}, {m['mpi'].split()[0]} {m['mpi'].split()[-1]}, "
             f"{m['machine']} {m['cpu']}. Sizes in bytes, busbw in GB/s; every call out of place, float32 sum.", ""]
    lines += ["## Copy bandwidth (rank 0 alone; the physical reference)", "",
              "| bytes | device->device GB/s | device->host GB/s | host->device GB/s |", "|---:|---:|---:|---:|"]
    for row in data["copy"]:
        lines.append(f"| {row['bytes']} | {row['d2d_GBps']:.1f} | {row.get('d2h_GBps', float('nan')):.1f} | "
                     f"{row.get('h2d_GBps', float('nan')):.1f} |")
    for part in data["parts"]:
        lines += ["", f"## {part['ranks']} ranks ({part['gpus_per_node']} GPU(s) on the node)", ""]
        lines += ["| transport | how | " + " | ".join(f"{a} wrong" for a in ALGOS) + " |",
                  "|---|---|" + "---:|" * len(ALGOS)]
        for run in part["runs"]:
            lines.append(f"| {run['transport']} | {run['description']} | "
                         + " | ".join(str(run["wrong"][a]) for a in ALGOS) + " |")
        sweeps = [(run["transport"], run["sweep"]) for run in part["runs"]]
        if "sweep" in part.get("nccl", {}):
            sweeps.append(("nccl", part["nccl"]["sweep"]))
        elif "nccl" in part:
            lines += ["", f"NCCL: {part['nccl']['unavailable']}"]
        sizes = sorted({r["bytes"] for _, rows in sweeps for r in rows})
        lines += ["", "busbw (GB/s) by size; the last column is the best ratio of busbw to the copy bandwidth of the same size.",
                  "", "| algorithm | transport | " + " | ".join(size_text(b) for b in sizes) + " | best / copy |",
                  "|---|---|" + "---:|" * (len(sizes) + 1),
                  "| device copy | (reference) | " + " | ".join(f"{copy[b]['d2d_GBps']:.1f}" if b in copy else ""
                                                            for b in sizes) + " | |"]
        for transport, rows in sweeps:
            for algo in dict.fromkeys(r["algorithm"] for r in rows):
                busbw = {r["bytes"]: r["busbw_GBps"] for r in rows if r["algorithm"] == algo}
                ratio = max(busbw[b] / copy[b]["d2d_GBps"] for b in busbw if b in copy) if copy else float("nan")
                lines.append(f"| {algo} | {transport} | " + " | ".join(f"{busbw[b]:.2f}" if b in busbw else ""
                                                                      for b in sizes) + f" | {ratio:.2f} |")
    lines += ["", f"Wrong elements in all: {data['total_wrong']}."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = Parser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--part",
                   help="run under mpiexec; rank 0 writes this rank count's results to this file (no default)")
    p.add_argument("--merge", nargs="+", metavar="PART", help="merge parts into -o PREFIX.json/.md (no default)")
    p.add_argument("-o", "--output",
                   help="prefix of the merged OUTPUT.json and OUTPUT.md (no default: needed with --merge)")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="gpu: CuPy device buffers; cpu: NumPy buffers, to test the check itself (default gpu)")
    p.add_argument("--min-bytes", type=parse_size, default=parse_size("1M"),
                   help="smallest size of the busbw sweep, in bytes; K, M, G are powers of 1024 (default 1M)")
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("1G"),
                   help="largest size of the busbw sweep, in bytes; K, M, G are powers of 1024 (default 1G)")
    p.add_argument("--largest-count", type=int, default=1_000_003,
                   help="the largest vector of the correctness check, in elements (default 1000003)")
    args = p.parse_args(argv)
    if bool(args.part) == bool(args.merge) or (args.merge and not args.output):
        p.error("give --part FILE (under mpiexec), or --merge PART... -o PREFIX")
    if args.merge:
        return merge(args)
    return run_together(lambda: _part(args), "python -m bench.gpu_check")


def _part(args):
    """One rank count under mpiexec; exit 2 with one line when a GPU part is missing."""
    if refused(MPI.COMM_WORLD, "python -m bench.gpu_check", (args.part,)):
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
