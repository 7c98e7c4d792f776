"""A node's ``/dev/shm``: how much room it has, and what MPI needs of it before ``MPI_Init``.

Containers get a small ``/dev/shm`` unless told otherwise (Docker's and Kubernetes' default is
64 MiB). Two things then go wrong before any all-reduce runs, each measured with the ``mpich``
wheel (MPICH 5.0.2 over UCX), ranks on one node:

* MPICH's own shared-memory file needs about 1 MiB per rank of the node besides 1 MiB
  (:data:`MPI_BYTES_PER_RANK`): with less, ``MPI_Init`` dies with SIGBUS.
* UCX turns its own POSIX shared-memory transport off where ``/dev/shm`` has less than 16 MiB
  free (``UCX_POSIX_SHM_MIN_SIZE``). When some ranks of a node see more than that and others
  less (each rank's UCX takes a few MiB as it starts), ``MPI_Init`` dies with SIGSEGV: seen at
  16-22 MiB with 2 ranks, 28 MiB with 4, 40 MiB with 8. MPICH moves messages within a node
  through its own shared memory, not UCX's, so turning UCX's off (``UCX_TLS=^posix``) costs
  nothing there (the same busbw, 8 B to 16 MiB, 2 ranks).

:func:`before_mpi_init`, called before ``mpi4py.MPI`` is first imported, settles both from
the size of ``/dev/shm`` (the same on every rank of a node, unlike its free space, which
changes as the ranks start). Nothing here talks MPI, so it can run first.
"""

import os
import socket
import sys

from .launcher import local_rank, local_size, world_rank

SHM_PATH = "/dev/shm"
PAGE = 4096
MIB = 1 << 20
MPI_BYTES_PER_RANK = MIB      # MPICH's own shared-memory file, per rank of the node, besides MIB
UCX_MIN_BYTES = 16 * MIB      # UCX_POSIX_SHM_MIN_SIZE's default
UCX_BYTES_PER_RANK = 8 * MIB  # what each rank's UCX may take as it starts, with room to spare
SHM_FIX = ("give the container a larger /dev/shm (docker run --shm-size=1g; in Kubernetes an "
           "emptyDir volume with medium: Memory mounted at /dev/shm)")


class ShmTooSmall(MemoryError):
    """``/dev/shm`` cannot back what was asked of it. ``short`` is the reason without the advice
    (for a fallback's note)."""

    def __init__(self, short, fix=SHM_FIX):
        super().__init__(f"{short}; {fix}")
        self.short = short


def _statvfs(path):
    try:
        return os.statvfs(path)
    except OSError:
        return None


def free_bytes(path=SHM_PATH):
    """Bytes that can still be written to the file system at ``path`` (None where there is none)."""
    stat = _statvfs(path)
    return None if stat is None else stat.f_bavail * stat.f_frsize


def total_bytes(path=SHM_PATH):
    """The size of the file system at ``path`` (None where there is none)."""
    stat = _statvfs(path)
    return None if stat is None else stat.f_blocks * stat.f_frsize


def mib(nbytes):
    return f"{nbytes / MIB:.1f} MiB"


def before_mpi_init(env=os.environ):
    """Settle what ``MPI_Init`` needs of ``/dev/shm`` (module docstring); call it before
    ``mpi4py.MPI`` is imported. Sets ``UCX_TLS=^posix`` in ``env`` where ``/dev/shm`` is small
    and the user set no ``UCX_TLS``, returning a note saying so (else None); raises
    :class:`ShmTooSmall` where MPI itself cannot start on it."""
    total = total_bytes()
    if total is None or "mpi4py.MPI" in sys.modules:
        return None
    ranks = local_size()
    need = MPI_BYTES_PER_RANK * ranks + MIB
    if total < need:
        raise ShmTooSmall(f"{SHM_PATH} on {socket.gethostname()} is {mib(total)}; MPI needs about "
                          f"{mib(need)} of it for the {ranks} ranks there")
    if total < UCX_MIN_BYTES + UCX_BYTES_PER_RANK * ranks and "UCX_TLS" not in env:
        env["UCX_TLS"] = "^posix"
        return (f"{SHM_PATH} is {mib(total)}: UCX's shared-memory transport is off (UCX_TLS=^posix), "
                f"since UCX can fail in MPI_Init on so small a {SHM_PATH}")
    return None


def settle_before_mpi_init(prog):
    """:func:`before_mpi_init` for a command line: its note once on stderr (the job's rank 0),
    and 2 where MPI cannot start on this node's ``/dev/shm`` (after one line from the node's
    first rank: every rank of the node decides alike), else None."""
    try:
        note = before_mpi_init()
    except ShmTooSmall as exc:
        if local_rank() == 0:
            sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    if note and world_rank() == 0:
        sys.stderr.write(f"{prog}: note: {note}\n")
    return None
