"""The least latency and the fastest copy of the machine under a communicator, for the lower
bound of any all-reduce (:mod:`topology.model.lower_bound`), measured in C (``probes/floor.c``):

* the half round trip of a 1-byte ``MPI_Send``/``MPI_Recv`` ping-pong timed in C, for every pair
  the probe measures (within a node every pair, between two nodes their leaders);
* the half round trip of a flag between two ranks of a node, spinning on cache lines of a
  shared window (``MPI_Win_allocate_shared``): no transport within a node is faster;
* the fastest copy (``memcpy`` or non-temporal stores) on each host at sizes
  :data:`COPY_SIZES`, hot in the caches where it fits.

Each figure is the least of its repetitions (a floor: noise only slows one). The C is built as
every library against MPI is (:mod:`topology.mpicc`: ``$MPICC``, else the MPI wheel's ``mpicc``;
cached per source, compiler and MPI; one rank per node building while the others wait; checked
to link the libmpi this process loaded). Without a compiler the record says why and
holds no figures; the bound then takes 0 for the latencies and no limit for the copies, which
are always bounds.
"""

import ctypes
import os
import socket

import numpy as np
from mpi4py import MPI

from . import mpicc
from .machine import cpu_name, node_comm

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes", "floor.c")
COPY_SIZES = [4096 << (2 * i) for i in range(8)]  # 4 KiB to 64 MiB
PINGS = 2000  # round trips per pair, the least kept
WARMUP = 200


def load(comm):
    """``(ctypes.CDLL, None)`` or ``(None, why not)``, alike on every rank (collective): the
    floor probe, built once per node (:func:`topology.mpicc.load`)."""
    library, problem = mpicc.load(comm, SOURCE)
    if problem:
        return None, problem
    double = ctypes.POINTER(ctypes.c_double)
    library.floor_pingpong.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, double]
    library.floor_flag.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int, double]
    library.floor_copy.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_double]
    library.floor_copy.restype = ctypes.c_double
    return library, None


def measure(comm, nodes, schedule):
    """The floor record of the probe's file (``measured["floor"]``), on every rank: ``mpi_us``
    and ``flag_us`` (N x N, half the least round trip; between nodes the leaders' figure for
    every rank pair, ``flag_us`` null there), ``copy_GBps`` ({host: {bytes: GB/s}}), or
    ``problem`` alone where the C could not be built. ``schedule``: rounds of disjoint pairs."""
    node = node_comm(comm)
    try:
        library, problem = load(comm)
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
    for host, cpu, found in comm.allgather((socket.gethostname(), cpu_name(), copies)):
        if found:
            hosts[host] = {"cpu": cpu, "copy_GBps": found}
    return {
        "method": f"the least of {PINGS} round trips (after {WARMUP}), halved, timed in C (CLOCK_MONOTONIC): "
                  "mpi_us, a 1-byte MPI_Send/MPI_Recv ping-pong; flag_us, a count stored into a cache line of "
                  "a shared window and stored back into another by the peer (within a node); copy_GBps, "
                  "per host and size, the fastest of memcpy and non-temporal stores, back-to-back copies of "
                  "the same buffers; built by " + os.path.basename(mpicc.compiler()[0]) + " " + " ".join(mpicc.FLAGS),
        "mpi_us": np.round(mpi_us, 4).tolist(),
        "flag_us": [[None if np.isnan(v) else round(float(v), 4) for v in row] for row in flag_us],
        "hosts": hosts,
    }
