"""The machine under a communicator, found in one place: which ranks share a node (its
communicator, ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``, and node numbers, from it or from
labels given, ``ALLREDUCE_NODE_MAP``'s, which hier reads), which ranks share one running kernel
and its cores (the lab's network namespaces are nodes to MPI but one machine), the CPU's name,
and the kernel's copy between two processes (``process_vm_readv``/``process_vm_writev``, Linux
3.2+, CMA)."""

import ctypes
import os
import platform
import socket

from mpi4py import MPI


def node_comm(comm):
    """The communicator of this rank's node within ``comm`` (the ranks that share its memory),
    ranked as in ``comm``; collective; the caller frees it."""
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def numbered(labels):
    """``(node per rank, ranks per node)`` from any node label per rank: nodes numbered 0..K-1 in
    the order of their first ranks, each node's ranks in rank order (the first its leader)."""
    order = {}
    index = [order.setdefault(label, len(order)) for label in labels]
    return index, members(index)


def members(nodes):
    """The ranks of each node of ``nodes`` (node numbers 0..K-1 per rank), in node order."""
    found = [[] for _ in range(max(nodes, default=-1) + 1)]
    for rank, node in enumerate(nodes):
        found[node].append(rank)
    return found


def node_numbers(comm):
    """The node of each rank of ``comm``, on every rank (collective): the ranks that share
    memory, numbered by :func:`numbered`."""
    node = node_comm(comm)
    try:
        first = node.bcast(comm.Get_rank(), root=0)  # a node's label: its first rank
    finally:
        node.Free()
    return numbered(comm.allgather(first))[0]


def boot_id():
    """This kernel's boot id: processes in network or UTS namespaces of one host (the lab's
    nodes) share it, and with it the host's cores; the host name where it cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def affinity():
    """The CPUs this process may run on (all of them where the system cannot say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def machines(comm):
    """The machines under ``comm``'s ranks, on every rank (collective): ``{"ranks", "hosts",
    "cores"}`` per running kernel (:func:`boot_id`), ``cores`` the CPUs its ranks may run on
    together (the union of their affinities)."""
    cpus = affinity()
    found = {}
    for rank, (key, host, mine) in enumerate(comm.allgather((boot_id(), socket.gethostname(), cpus))):
        machine = found.setdefault(key, {"ranks": [], "hosts": [], "cpus": set()})
        machine["ranks"].append(rank)
        machine["hosts"] += [] if host in machine["hosts"] else [host]
        machine["cpus"] |= set(mine)
    return [{"ranks": m["ranks"], "hosts": m["hosts"], "cores": len(m["cpus"])} for m in found.values()]


def crowding(comm, threads=1):
    """(ranks, cores, host) of the first machine (:func:`machines`) whose ranks, ``threads`` busy
    threads each, outnumber the cores they may run on, else None; the same on every rank
    (collective). Timings from such a machine measure the operating system's scheduler."""
    for machine in machines(comm):
        if len(machine["ranks"]) * threads > machine["cores"]:
            return len(machine["ranks"]), machine["cores"], machine["hosts"][0]
    return None


def cpu_name():
    """The CPU's model name ("AMD EPYC 7B13"), from /proc/cpuinfo where it says."""
    try:
        with open("/proc/cpuinfo") as f:
            found = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        found = None
    return found or platform.processor() or platform.machine() or "unknown cpu"


class IoVec(ctypes.Structure):
    """One ``struct iovec``: a base address and a length."""

    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _bound(name):
    call = getattr(ctypes.CDLL(None, use_errno=True), name, None)
    if call is not None:
        call.restype = ctypes.c_ssize_t
        call.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.POINTER(IoVec), ctypes.c_ulong,
                         ctypes.c_ulong]
    return call


#: ``process_vm_readv(pid, local, n, remote, n, 0)`` and ``process_vm_writev``, or None where the C library lacks them
PROCESS_VM_READV, PROCESS_VM_WRITEV = _bound("process_vm_readv"), _bound("process_vm_writev")
