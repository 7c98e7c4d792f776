"""``python -m bench bound``: what compiled 2-rank rings and trees reach against a lone copy of the same size.

Builds ``bench/probes/ring_bound.c`` with the C compiler (``$CC``, else ``cc``;
``-O2 -march=native``, x86-64) and runs it for each size: two processes, each
reducing its half of a float32 sum in pieces, in the data paths a NumPy ring
cannot take (non-temporal stores, fused kernels) beside the one it takes, each
timed in turn with a lone ``memcpy`` (``numpy.copyto``'s) of the same size. It
bounds the ring/copy and tree/ring targets of ``bench perf``: for N = 2, busbw
= S/t, so a variant's busbw/copy is the copy's time over its own, and a tree's
busbw over the ring's of the same data path the ring's time over the tree's. Needs no MPI: the kernel's
copy between the processes is CMA (``process_vm_readv``), as MPICH's. Writes
``results/ring-bound-cpu.json`` and ``.md`` atomically.
"""

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

from plumbing.files import write_json_atomically, write_text_atomically

from ..core.machine import results_header
from ..core.cli import Parser, add_size_flags
from ..core.sizes import parse_size, sweep

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "probes", "ring_bound.c")
FLAGS = ["-O2", "-march=native"]
VARIANTS = {  # name in the probe's output: what it does (each rank, its half, piece by piece)
    "copy": "rank 0 alone: glibc's memcpy (numpy.copyto), non-temporal from its threshold; the reference",
    "copy_stream": "rank 0 alone: a copy with non-temporal stores",
    "cma_plain": "private vectors: the peer's piece read by the kernel (CMA) into L2, added into y with "
                 "ordinary stores, the peer's reduced half read into y by CMA: the data path of a NumPy ring over MPI",
    "cma_stream": "private: as cma_plain, with non-temporal stores into y and the all-gather through L2",
    "cma_push": "private: CMA of the peer's piece, added in L2, streamed into y and written into the peer's y by CMA",
    "slots_stream": "private: each piece copied into a shared slot, reduced into a second slot, streamed from "
                    "there into both ranks' y (the slots of algorithms.runtime.transports.shared_memory, with non-temporal stores)",
    "shared_plain": "shared (registered) vectors: both inputs added into y, then copied into the peer's y, "
                    "ordinary stores: the registered ring's data path",
    "shared_fused": "shared vectors: both inputs added in L2, streamed into both ranks' y: a copy's traffic",
    "tree_plain": "private: the 2-rank tree, pipelined: rank 0 reduces every piece as cma_plain does, "
                  "rank 1 CMA-reads each reduced piece into its y",
    "tree_stream": "private: as tree_plain, with non-temporal stores into y and rank 1's copy through L2",
}
TREE_RING = {"tree_plain": "cma_plain", "tree_stream": "cma_stream"}  # each tree against the ring of its data path


class ProbeError(RuntimeError):
    """The probe could not be built or run, or found a wrong sum."""


def compiler():
    return os.environ.get("CC") or "cc"


def build(folder):
    """Compile the probe into ``folder``; return the executable's path and the compiler's name."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise ProbeError(f"the probe uses x86-64 non-temporal stores; this machine is {platform.machine()}")
    cc = compiler()
    if shutil.which(cc) is None:
        raise ProbeError(f"no C compiler: {cc!r} is not on PATH (set CC)")
    exe = os.path.join(folder, "ring_bound")
    done = subprocess.run([cc, *FLAGS, "-o", exe, SOURCE], capture_output=True, text=True)
    if done.returncode != 0:
        raise ProbeError(f"{cc} failed to build {SOURCE}:\n{done.stderr.strip()}")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()
    return exe, (version[0] if version else cc)


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(exe, nbytes, piece, repeats, timeout=600):
    """One size: {variant: {"time_s" (median), "busbw_GBps", "vs_copy"}} and, for the trees,
    "vs_ring"; the ratios (busbw over busbw: the other's time over this one's) are taken
    repetition by repetition, then their median, least and greatest."""
    done = subprocess.run([exe, str(nbytes), str(piece), str(repeats)], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise ProbeError(f"the probe failed at {nbytes} bytes (exit {done.returncode}): {done.stderr.strip()}")
    times = {}
    for line in done.stdout.splitlines():
        name, *seconds = line.split("\t")
        times[name] = [float(t) for t in seconds]
    if set(times) != set(VARIANTS) or any(len(t) != repeats for t in times.values()):
        raise ProbeError(f"the probe printed {sorted(times)}, expected {repeats} times of each of {sorted(VARIANTS)}")
    row = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        row[name] = {"time_s": median, "busbw_GBps": nbytes / median / 1e9,
                     "vs_copy": spread([c / t for c, t in zip(times["copy"], ts)])}
        if name in TREE_RING:
            row[name]["vs_ring"] = spread([r / t for r, t in zip(times[TREE_RING[name]], ts)])
    return row


def _cell(ratio):
    return f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"


def markdown(data):
    m = data["machine"]
    names = list(VARIANTS)
    lines = ["# What compiled 2-rank rings and trees reach against a lone copy", "",
             f"{data['date']}, commit {m['commit']}, {m['cpu']} ({m['cores']} cores), THP {m['transparent_hugepages']}, "
             f"{data['compiler']} {' '.join(FLAGS)}. Two processes, float32 sum, pieces of {data['piece_bytes']} bytes, "
             f"{data['repeats']} repetitions with every variant timed in turn; each cell is the median over the "
             "repetitions of busbw/copy (copy time over the variant's time, the same repetition), least and greatest "
             "in brackets. `python -m bench bound` (bench/probes/ring_bound.c).", "",
             "| bytes | copy GB/s | " + " | ".join(names[1:]) + " |",
             "|---:|---:|" + "---:|" * (len(names) - 1)]
    for row in data["rows"]:
        v = row["variants"]
        lines.append(f"| {row['bytes']} | {v['copy']['busbw_GBps']:.1f} | "
                     + " | ".join(_cell(v[n]["vs_copy"]) for n in names[1:]) + " |")
    lines += ["", "The trees against the ring of the same data path (busbw over busbw, repetition by repetition):", "",
              "| bytes | " + " | ".join(f"{t}/{r}" for t, r in TREE_RING.items()) + " |",
              "|---:|" + "---:|" * len(TREE_RING)]
    for row in data["rows"]:
        lines.append(f"| {row['bytes']} | " + " | ".join(_cell(row["variants"][t]["vs_ring"]) for t in TREE_RING) + " |")
    lines += ["", "Variants:", ""] + [f"- `{n}`: {text}." for n, text in VARIANTS.items()]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = Parser(prog="python -m bench bound", description=__doc__.splitlines()[0])
    add_size_flags(p, "16M", "256M", 2, what="vector")
    p.add_argument("--piece", type=parse_size, default=parse_size("256K"),
                   help="bytes reduced at a time, a multiple of 64 that divides half of every size (default 256K)")
    p.add_argument("--repeats", type=int, default=9, help="repetitions per size, 1 to 101 (default 9)")
    p.add_argument("-o", "--output", default="results/ring-bound-cpu",
                   help="FILE prefix: writes FILE.json and FILE.md (default results/ring-bound-cpu)")
    args = p.parse_args(argv)
    try:
        sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as e:
        p.error(str(e))
    bad = [s for s in sizes if args.piece <= 0 or args.piece % 64 or s % (2 * args.piece)]
    if bad:
        p.error(f"--piece {args.piece} must be a multiple of 64 bytes that divides half of every size; it does not for {bad}")
    if not 1 <= args.repeats <= 101:
        p.error("--repeats must be 1..101")
    try:
        with tempfile.TemporaryDirectory() as folder:
            exe, cc = build(folder)
            rows = [{"bytes": s, "variants": measure(exe, s, args.piece, args.repeats)} for s in sizes]
    except (ProbeError, subprocess.TimeoutExpired) as e:
        print(f"bench bound: {e}", file=sys.stderr)
        return 1
    data = {**results_header("ring-bound-cpu", None, argv=["bound", *(sys.argv[1:] if argv is None else argv)],
                             ranks=2), "compiler": cc, "flags": FLAGS, "piece_bytes": args.piece,
            "repeats": args.repeats, "variants": VARIANTS, "rows": rows}
    write_json_atomically(args.output + ".json", data)
    text = markdown(data)
    write_text_atomically(args.output + ".md", text)
    print(text)
    return 0
