"""The least latency and the fastest copy of the machine under a communicator, for the lower
bound of any all-reduce (:mod:`topology.model.lower_bound`), measured in C (``probes/floor.c``):

* the half round trip of a 1-byte ``MPI_Send``/``MPI_Recv`` ping-pong timed in C, for every pair
  the probe measures (within a node every pair, between two nodes their leaders);
* the half round trip of a flag between two ranks of a node, spinning on cache lines of a
  shared window (``MPI_Win_allocate_shared``): no transport within a node is faster;
* the fastest copy (``memcpy`` or non-temporal stores) on each host at sizes
  :data:`COPY_SIZES`, hot in the caches where it fits.

Each figure is the least of its repetitions (a floor: noise only slows one). topology builds the
C itself, not through bench (which it may not import): with ``$MPICC``, else the ``mpicc`` beside
this Python (the MPI wheel's), else ``mpicc`` on PATH, into
``$XDG_CACHE_HOME/allreduce-bench/floor-HASH.so`` (HASH of the source, the compiler and the MPI),
one rank per node building while the others wait. Without a compiler the record says why and
holds no figures; the bound then takes 0 for the latencies and no limit for the copies, which
are always bounds.
"""

import ctypes
import hashlib
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys

import numpy as np
from mpi4py import MPI

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes", "floor.c")
FLAGS = ["-O2", "-shared", "-fPIC"]
COPY_SIZES = [4096 << (2 * i) for i in range(8)]  # 4 KiB to 64 MiB
PINGS = 2000  # round trips per pair, the least kept
WARMUP = 200


def compiler():
    """``(path, None)`` of the mpicc to build with, or ``(None, why there is none)``."""
    named = os.environ.get("MPICC")
    candidates = [named] if named else [os.path.join(os.path.dirname(sys.executable), "mpicc"), "mpicc"]
    for cc in candidates:
        found = shutil.which(cc)
        if found:
            return os.path.abspath(found), None
    return None, f"no C compiler: {'MPICC=' + named if named else 'no mpicc beside this Python nor on PATH'}"


def _target(cc):
    digest = hashlib.sha256(open(SOURCE, "rb").read())
    for part in (os.path.realpath(cc), MPI.Get_library_version()):
        digest.update(b"\0" + part.encode())
    folder = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "allreduce-bench")
    return os.path.join(folder, f"floor-{digest.hexdigest()[:16]}.so")


def _build():
    """``(library path, None)`` or ``(None, why not)``: the cached library, built if absent."""
    cc, missing = compiler()
    if missing:
        return None, missing
    target = _target(cc)
    if os.path.exists(target):
        return target, None
    temporary = f"{target}.{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        done = subprocess.run([cc, *FLAGS, "-o", temporary, SOURCE], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            lines = (done.stderr + done.stdout).strip().splitlines()
            detail = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else done.returncode)
            return None, f"{os.path.basename(cc)} could not build the floor probe: {detail}"
        os.replace(temporary, target)
        return target, None
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot build the floor probe: {exc}"
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def load(comm, node):
    """``(ctypes.CDLL, None)`` or ``(None, why not)``, alike on every rank (collective)."""
    path, problem = node.bcast(_build() if node.Get_rank() == 0 else None, root=0)
    library = None
    if path:
        try:
            library = ctypes.CDLL(path)
        except OSError as exc:
            problem = f"cannot load the floor probe: {exc}"
    problems = [p for p in comm.allgather(problem) if p]
    if problems:
        return None, problems[0]
    double = ctypes.POINTER(ctypes.c_double)
    library.floor_pingpong.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, double]
    library.floor_flag.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int, double]
    library.floor_copy.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_double]
    library.floor_copy.restype = ctypes.c_double
    return library, None


def _cpu():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor() or platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def measure(comm, nodes, schedule):
    """The floor record of the probe's file (``measured["floor"]``), on every rank: ``mpi_us``
    and ``flag_us`` (N x N, half the least round trip; between nodes the leaders' figure for
    every rank pair, ``flag_us`` null there), ``copy_GBps`` ({host: {bytes: GB/s}}), or
    ``problem`` alone where the C could not be built. ``schedule``: rounds of disjoint pairs."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        library, problem = load(comm, node)
        if problem:
            return {"problem": problem}
        return _measure(comm, node, library, nodes, schedule)
    finally:
        node.Free()


def _measure(comm, node, library, nodes, schedule):
    rank, size = comm.Get_rank(), comm.Get_size()
    local = node.allgather(rank)  # the world rank of each node rank
    window = MPI.Win.Allocate_shared(128 * node.Get_size() if node.Get_rank() == 0 else 0, 64, comm=node)
    try:
        memory, _ = window.Shared_query(0)
        lines = np.frombuffer(memory, dtype=np.uint8)
        if node.Get_rank() == 0:
            lines[:] = 0
        base = lines.ctypes.data
        node.Barrier()
        best, mine = ctypes.c_double(), []
        for number, pairs in enumerate(schedule):
            for a, b in pairs:
                if rank not in (a, b):
                    continue
                peer, leads = (b, 1) if rank == a else (a, 0)
                if library.floor_pingpong(comm.py2f(), peer, leads, WARMUP, PINGS, ctypes.byref(best)):
                    raise RuntimeError(f"the C ping-pong between ranks {a} and {b} failed")
                pingpong = best.value / 2
                flag = None
                if nodes[a] == nodes[b]:
                    slot = base + 128 * local.index(a)  # a leads one pair a round: its own lines
                    if library.floor_flag(slot, number * (PINGS + WARMUP + 1), leads, WARMUP, PINGS,
                                          ctypes.byref(best)):
                        raise RuntimeError(f"the shared-memory flag between ranks {a} and {b} timed out")
                    flag = best.value / 2
                if leads:
                    mine.append(((a, b), pingpong, flag))
            comm.Barrier()
        copies = {}
        if node.Get_rank() == 0:
            copies = {str(n): round(library.floor_copy(n, 5, 0.02) / 1e9, 3) for n in COPY_SIZES}
        node.Barrier()
    finally:
        window.Free()
    mpi_us, flag_us = np.zeros((size, size)), np.full((size, size), np.nan)
    node_of = np.asarray(nodes)
    for (a, b), pingpong, flag in (pair for rows in comm.allgather(mine) for pair in rows):
        rows, cols = ([a], [b]) if nodes[a] == nodes[b] else \
            (np.flatnonzero(node_of == nodes[a]), np.flatnonzero(node_of == nodes[b]))
        mpi_us[np.ix_(rows, cols)] = mpi_us[np.ix_(cols, rows)] = pingpong * 1e6
        if flag is not None:
            flag_us[a, b] = flag_us[b, a] = flag * 1e6
    hosts = {}
    for host, cpu, found in comm.allgather((socket.gethostname(), _cpu(), copies)):
        if found:
            hosts[host] = {"cpu": cpu, "copy_GBps": found}
    return {
        "method": f"the least of {PINGS} round trips (after {WARMUP}), halved, timed in C (CLOCK_MONOTONIC): "
                  "mpi_us, a 1-byte MPI_Send/MPI_Recv ping-pong; flag_us, a count stored into a cache line of "
                  "a shared window and stored back into another by the peer (within a node); copy_GBps, "
                  "per host and size, the fastest of memcpy and non-temporal stores, back-to-back copies of "
                  "the same buffers; built by " + os.path.basename(compiler()[0]) + " " + " ".join(FLAGS),
        "mpi_us": np.round(mpi_us, 4).tolist(),
        "flag_us": [[None if np.isnan(v) else round(float(v), 4) for v in row] for row in flag_us],
        "hosts": hosts,
    }
