"""Whether the sweep's largest size fits, asked before anything is allocated.

Each rank of the sweep holds, at its largest size M (bytes of the whole vector): the send
and receive vectors, a copy for the in-place run, the expected result and the check's
fresh send and receive vectors, and up to one vector of workspace or of the check's
comparison, so :data:`VECTORS_PER_RANK` = 7 vectors of M; with ``-R 1`` the registered copies
of five of them besides, in the node's ``/dev/shm`` (checked against its free space:
:func:`check_registered_room`); and :data:`INTERPRETER_BYTES` of Python, NumPy and MPI (measured
at 256 MiB on 2 ranks: 6.5 M + 90 MiB for float32, 7.2 M for int8, 11.5 M with ``-R 1``,
peak resident memory per rank). Every rank of a node draws on that node's memory: the driver refuses, with
the numbers, when the node's ranks together need more than the memory available there
(``MemAvailable``, or what the cgroup limit leaves, whichever is less), instead of
dying by the kernel's out-of-memory killer part way. With ``-M 1`` the driver prints what the
ranks held (:func:`usage_line`), as nccl-tests prints its GPU memory usage.
"""

import os

from mpi4py import MPI

from algorithms.runtime.transports.registered import REGISTERED_FIX
from algorithms.runtime.transports.shared_windows import check_room, whole_pages
from topology.machine import node_comm

VECTORS_PER_RANK = 7
REGISTERED_COPIES = 5
INTERPRETER_BYTES = 128 << 20


def bytes_needed(nbytes, registered=False):
    """Host bytes one rank holds at a sweep size of ``nbytes``."""
    return nbytes * (VECTORS_PER_RANK + (REGISTERED_COPIES if registered else 0)) + INTERPRETER_BYTES


def _meminfo(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def _cgroup_room():
    """What this process's cgroup (v2) still allows, or None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.split(":", 2)[2].strip() for line in f if line.startswith("0::")), None)
        if path is None:
            return None
        folder = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
        with open(os.path.join(folder, "memory.max")) as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(folder, "memory.current")) as f:
            return int(limit) - int(f.read().strip())
    except (OSError, ValueError):
        return None


def available_bytes():
    """Memory this process can still have: ``MemAvailable``, bounded by its cgroup's limit."""
    room = [v for v in (_meminfo("MemAvailable"), _cgroup_room()) if v is not None]
    return min(room) if room else None


def check_memory(comm, need, what):
    """Raise the same ``ValueError`` on every rank of ``comm`` when the ranks of some node
    need more than that node has available (``need``: this rank's bytes; collective)."""
    node = node_comm(comm)
    try:
        total = node.allreduce(need, op=MPI.SUM)
        available = available_bytes() if node.Get_rank() == 0 else None
        available = node.bcast(available, root=0)
        short = None
        if node.Get_rank() == 0 and available is not None and total > available:
            short = (MPI.Get_processor_name(), node.Get_size(), total, available)
    finally:
        node.Free()
    found = [(rank, s) for rank, s in enumerate(comm.allgather(short)) if s]
    if found:
        host, ranks, total, available = found[0][1]
        others = f" (and {len(found) - 1} other nodes)" if len(found) > 1 else ""
        raise ValueError(
            f"{what} needs {_gib(total)} on {host}{others}: {ranks} ranks x {_gib(total / ranks)} each, "
            f"but {_gib(available)} is available there; use a smaller -e, or fewer ranks per node")


def check_registered_room(comm, largest):
    """``-R 1``: raise the same :class:`plumbing.shm.ShmTooSmall` on every rank
    when the registered vectors of the largest size (:data:`REGISTERED_COPIES` a rank, each
    ``largest`` bytes) would not fit the node's ``/dev/shm`` (collective)."""
    node = node_comm(comm)
    try:
        check_room(comm, node, REGISTERED_COPIES * whole_pages(largest),
                   f"-R 1 at the largest size ({REGISTERED_COPIES} registered vectors of {largest} B a rank)",
                   REGISTERED_FIX)
    finally:
        node.Free()


def _gib(nbytes):
    return f"{nbytes / (1 << 30):.1f} GiB"


# ---- -M: what the ranks held, as nccl-tests' memory-usage line ----

def status_bytes(field):
    """A ``/proc/self/status`` field in bytes (VmRSS, VmHWM), or 0 where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def resident_bytes():
    return status_bytes("VmRSS")


def reset_peak():
    """Start a new peak resident memory (VmHWM) from now (Linux: ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_bytes():
    return status_bytes("VmHWM")


def memory_text(nbytes):
    """nccl-tests' memory figures: B, KB, MB or GB (powers of 1024) with 2, 1 or 0 decimals."""
    amount, unit = float(nbytes), "B"
    for name, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(amount) >= scale:
            amount, unit = amount / scale, name
            break
    decimals = 2 if abs(amount) < 10 else 1 if abs(amount) < 100 else 0
    return f"{amount:.{decimals}f} {unit}"


def usage_line(comm, before, user):
    """``# Host memory usage : ...`` (collective): what the ranks held before the sweep
    (``before``), the driver's own vectors (``user``), the rest up to the peak since
    :func:`reset_peak` (the algorithms' workspace, shared windows, MPI's buffers), and that
    peak, each the maximum over ranks."""
    before, user, peak = (comm.allreduce(v, op=MPI.MAX) for v in (before, user, peak_bytes()))
    rest = max(0, peak - before - user)
    return (f"# {'Host memory usage':<20} : Initialization {memory_text(before)} | User-Allocated "
            f"{memory_text(user)} | Collective {memory_text(rest)} | Total  {memory_text(peak)}")
