"""Shared windows sized against what ``/dev/shm`` can back, and touched before use.

MPICH backs an ``MPI_Win_allocate_shared`` window of a node of several ranks with a file in
``/dev/shm`` (a tmpfs), sized but not filled: a page is taken from the tmpfs when a process
first touches it. Where the tmpfs is smaller than the window (a container's 64 MiB
``/dev/shm``: Docker's and Kubernetes' default), that first touch kills the process with
SIGBUS, with no word of what ran out. So every shared window of ours (the transport's slots,
``oneshot``'s boxes, registered vectors) comes from :func:`allocate_shared`, which

1. asks before allocating: the node's ranks sum what they will ask for and compare it with
   the free space of ``/dev/shm`` (``statvfs``) less :data:`RESERVE_PER_RANK` per rank, left
   for MPICH's own shared-memory files, which it fills as it goes; then
2. touches every page of this rank's part at once with ``madvise(MADV_POPULATE_WRITE)``
   (Linux 5.14), which returns an error where a touch would raise SIGBUS, so that a
   ``/dev/shm`` filled by another job between the check and the use is an error, not a signal.
   It costs what the first touches would have cost later, moved to the allocation: the
   kernel allocates and zeroes each page (2 ranks of a 2-vCPU VM: 0.8 ms for 1 MiB a rank,
   11 ms for 16 MiB, 177 ms for 256 MiB, against 0.7, 12 and 183 ms for touching a page in
   every 4 KiB of a window allocated without it). Older kernels have the check alone.

Where either step fails on any rank, every rank of the communicator raises the same
:class:`plumbing.shm.ShmTooSmall` (a ``MemoryError``) naming ``/dev/shm``, the bytes needed and free, and
the fix; the window is freed first. A node of one rank is backed by private memory (no
``/dev/shm`` file), so it is not checked, only touched. What ``MPI_Init`` itself needs of
``/dev/shm`` is settled before it (:func:`plumbing.shm.before_mpi_init`).
"""

import ctypes
import errno
import sys

from mpi4py import MPI

from plumbing.ending import first_problem
from plumbing.shm import MPI_BYTES_PER_RANK, PAGE, SHM_FIX, SHM_PATH, ShmTooSmall, free_bytes, mib

RESERVE_PER_RANK = MPI_BYTES_PER_RANK  # left free for MPICH's own file, which it fills as it goes
MADV_POPULATE_WRITE = 23    # include/uapi/asm-generic/mman-common.h

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_warned = set()


def populate(address, nbytes):
    """Back bytes ``address..address+nbytes`` with pages now (``MADV_POPULATE_WRITE``): None
    when done or where the kernel lacks it, else the ``errno`` name of the failure (EFAULT:
    the file system could not back a page)."""
    if nbytes <= 0:
        return None
    start = address - address % PAGE
    length = -(-(address + nbytes - start) // PAGE) * PAGE
    if _libc.madvise(start, length, MADV_POPULATE_WRITE) == 0:
        return None
    code = ctypes.get_errno()
    return None if code == errno.EINVAL else errno.errorcode.get(code, str(code))


def whole_pages(nbytes):
    """``nbytes`` rounded up to whole pages: what tmpfs takes to back them."""
    return -(-nbytes // PAGE) * PAGE


def check_room(comm, node, nbytes, what, fix=SHM_FIX):
    """Raise the same :class:`ShmTooSmall` on every rank of ``comm`` when the ranks of some
    node of several ask for more than its ``/dev/shm`` has free, less :data:`RESERVE_PER_RANK`
    each (``nbytes``: this rank's share; ``node``: this rank's node of ``comm``; collective)."""
    ranks = node.Get_size()
    need = node.allreduce(nbytes, op=MPI.SUM)
    short = None
    if ranks > 1:
        free = free_bytes() if node.Get_rank() == 0 else None
        free = node.bcast(free, root=0)
        if free is not None and need + RESERVE_PER_RANK * ranks > free:
            short = (f"{what} needs {mib(need)} of {SHM_PATH} on {MPI.Get_processor_name()} ({ranks} ranks) "
                     f"beside {mib(RESERVE_PER_RANK * ranks)} kept for MPI; {mib(free)} is free there")
    short = first_problem(comm, short)
    if short:
        raise ShmTooSmall(short, fix)


def allocate_shared(comm, node, nbytes, disp_unit, what, fix=SHM_FIX, info=MPI.INFO_NULL):
    """``MPI.Win.Allocate_shared(nbytes, disp_unit, info, node)``, checked against ``/dev/shm``
    and pre-faulted (the module docstring). ``node`` is this rank's node of ``comm`` (from
    ``Split_type``); collective over ``comm``, whose every rank raises the same
    :class:`ShmTooSmall`, saying ``what`` needed the room and ``fix``, when some node cannot
    back its window."""
    check_room(comm, node, whole_pages(max(nbytes, 1)), what, fix)
    return allocate_touched(comm, node, nbytes, disp_unit, what, fix, info)


def allocate_touched(comm, node, nbytes, disp_unit, what, fix=SHM_FIX, info=MPI.INFO_NULL):
    """The window of :func:`allocate_shared` without the check before it: allocated, then
    every page of this rank's part touched (:func:`populate`); where that fails on any rank
    (``/dev/shm`` filled since the check), the window is freed and every rank of ``comm``
    raises the same :class:`ShmTooSmall`. Collective over ``comm``."""
    host = MPI.Get_processor_name()
    win = MPI.Win.Allocate_shared(nbytes, disp_unit, info=info, comm=node)
    memory = win.Shared_query(node.Get_rank())[0]
    failed = populate(MPI.Get_address(memory), nbytes) if nbytes else None
    failure = (f"{what} could not be backed by {SHM_PATH} on {host} ({failed} touching "
               f"{mib(nbytes)} of it; {mib(free_bytes() or 0)} free there now)") if failed else None
    failure = first_problem(comm, failure)
    if failure:
        win.Free()
        raise ShmTooSmall(failure, fix)
    return win


def warn_once(comm, text):
    """``allreduce: warning: TEXT`` on stderr, from rank 0 of ``comm``, once per process and text."""
    if comm.Get_rank() == 0 and text not in _warned:
        _warned.add(text)
        sys.stderr.write(f"allreduce: warning: {text}\n")
        sys.stderr.flush()
