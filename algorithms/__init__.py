"""All-reduce over mpi4py on NumPy (host) and CuPy (device) buffers.

* ``allreduce(sendbuf, recvbuf=None, *, op="sum", algorithm="ring", comm=None)``
  with ``algorithm`` one of ``ALGORITHMS`` (name -> :class:`Algorithm`, what each declares of
  itself: the registry's, :mod:`.registry`, and ``"auto"``, which picks among them per call:
  :mod:`.auto`): ``"ps"`` (parameter server),
  ``"ring"`` (reduce-scatter + all-gather), ``"tree"`` (binomial, or any
  ``topology.Tree`` passed as ``tree=``), ``"bamtree"``/``"kmtree"`` (trees
  matched from link bandwidths, ``bandwidth=``), ``"dbtree"`` (two binary trees),
  ``"rd"`` (recursive doubling), ``"hier"`` (within nodes, then across them) and
  ``"bamring"`` (the ring in the order whose slowest link is fastest, ``bandwidth=``).
* ``allreduce_init(sendbuf, recvbuf=None, ...)``: the same, persistent (MPI 4's
  ``MPI_Allreduce_init``): checked once, then each call of what it returns runs it.
* ``reduce_scatter`` and ``all_gather``: the two halves of an all-reduce, on their own
  (``algorithm=`` one of ``HALVES[...]``: those built of the halves, and ``auto``); chunk layout
  from ``chunk_offsets`` whichever runs them.
* ``alloc_registered(count, dtype)`` / ``free_registered(vector)``: vectors in the
  node's shared memory, which messages within the node read in place (no copy); where the
  node's ``/dev/shm`` cannot back one, ``ShmTooSmall`` (a ``MemoryError``) on every rank.
* ``transport_in_use(xp)``: how messages travel (shared memory or CUDA IPC within a
  node, MPI direct or staged through host memory otherwise).
* ``cost_model(links)``: every algorithm's predicted time on a network of links, ports and
  uplinks (:mod:`.costs`, :mod:`topology.model`), the model ``auto`` decides by without a table.
* ``run_together(main, prog)``: run a program's ``main()`` so that an error or a signal on
  any rank ends every rank within seconds (:mod:`plumbing.ending`).

Imported before ``mpi4py.MPI``, it first settles what ``MPI_Init`` needs of a small
``/dev/shm`` (:func:`plumbing.shm.before_mpi_init`: ``SHM_NOTE`` says what it changed; it
raises ``MemoryError`` where MPI could not start at all).
"""

from plumbing.ending import run_together
from plumbing.shm import ShmTooSmall, before_mpi_init

SHM_NOTE = before_mpi_init()  # before mpi4py.MPI is first imported: what MPI_Init needs of /dev/shm

from .collectives import ALGORITHMS, HALVES  # noqa: E402 (MPI starts with this import)
from .collectives import (PersistentAllreduce, all_gather, alloc_registered, allreduce, allreduce_init,  # noqa: E402
                          engine_in_use, free_registered, reduce_scatter, transport_in_use)
from .costs import cost_model  # noqa: E402
from .runtime.executor import WORKSPACE
from .dtypes import DTYPES, TYPES
from .ops import OPS
from .algorithm import Algorithm
from .catalog.ring import chunk_offsets
from .runtime.transports.mpi import mpi_is_cuda_aware


def free_workspace():
    """Drop the cached scratch buffers (they are reused across calls otherwise)."""
    WORKSPACE.clear()


__all__ = [
    "ALGORITHMS", "HALVES", "DTYPES", "TYPES", "OPS",
    "allreduce", "allreduce_init", "PersistentAllreduce", "reduce_scatter", "all_gather",
    "alloc_registered", "free_registered", "chunk_offsets", "free_workspace", "mpi_is_cuda_aware", "Algorithm",
    "run_together", "transport_in_use", "engine_in_use", "ShmTooSmall", "cost_model",
]
