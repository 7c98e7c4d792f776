"""How messages travel between ranks: every transport offers the same point-to-point calls
(``send``, ``recv``, ``sendrecv``, ``isend``, ``irecv``, and the shared-memory ones their
reducing and bound forms), so an algorithm never knows which carries it.

* :mod:`.mpi`: MPI on the buffers themselves (host, or device with a CUDA-aware MPI), or
  staged through host memory;
* :mod:`.shared_memory`: the node's shared slots (:mod:`.shm_window`), moved as the messages
  of :mod:`.shm_messages`, reading registered vectors (:mod:`.registered`) in place, choosing
  routes by page size (:mod:`.pages`); for CuPy the slots are device memory mapped by CUDA IPC
  (:mod:`.cuda_ipc`);
* :mod:`.shared_windows`: every shared window sized against ``/dev/shm`` and touched at once.

:func:`build_transport` picks one per communicator and array module.
"""

from plumbing.shm import SHM_FIX, ShmTooSmall

from ...arrays import is_device
from ...settings import setting
from .cuda_ipc import IpcUnavailable
from .mpi import DirectTransport, StagedTransport, mpi_is_cuda_aware
from .shared_memory import SharedMemoryTransport
from .shared_windows import warn_once

TRANSPORTS = {"direct": DirectTransport, "staged": StagedTransport, "shm": SharedMemoryTransport}


def choose_transport(xp):
    """The kind of transport for buffers of module ``xp``: a key of :data:`TRANSPORTS`.

    Host buffers go through the node's shared memory (MPI between nodes); device buffers
    through CUDA IPC within a node and, between nodes, straight to a CUDA-aware MPI or
    staged through host memory. ``ALLREDUCE_TRANSPORT=direct|staged|shm`` overrides it
    (``shm`` means CUDA IPC for device buffers).
    """
    forced = setting("ALLREDUCE_TRANSPORT")
    return "shm" if forced == "auto" else forced


def build_transport(private, xp, workspace):
    """The transport for module ``xp`` on ``private``'s communicator, its scratch buffers from
    ``workspace`` (collective). When CUDA
    IPC cannot be set up on some rank, or the node's ``/dev/shm`` cannot back the slots, every
    rank falls back to MPI and ``note`` says why (the latter also once on stderr)."""
    mpi = DirectTransport if not is_device(xp) or mpi_is_cuda_aware() else StagedTransport
    kind = choose_transport(xp)
    if kind != "shm":
        return TRANSPORTS[kind](private, xp, workspace)
    try:
        return SharedMemoryTransport(private, xp, workspace, mpi)
    except IpcUnavailable as exc:
        note = f"no CUDA IPC ({exc})"
    except ShmTooSmall as exc:  # raised on every rank alike, before any slot was touched
        note = f"no shared memory: {exc.short}"
        warn_once(private.comm, f"{note}; messages within a node go through MPI instead; for shared memory, {SHM_FIX}")
    transport = mpi(private, xp, workspace)
    transport.note = note
    return transport
