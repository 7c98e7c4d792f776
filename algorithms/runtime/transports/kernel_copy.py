"""Copies between the private memory of two processes of a node, made by the kernel in one step:
``process_vm_readv`` and ``process_vm_writev`` (Linux 3.2+; what MPICH and Open MPI call CMA,
cross-memory attach). A rank reads or writes another's NumPy array where it lies, with no
shared window and no copy into one; the kernel pins the other side's pages as it goes.

The kernel allows it where the caller may ptrace the other process (the same user, and Yama's
``ptrace_scope`` 0, or the capability ``CAP_SYS_PTRACE``); container runtimes often refuse it
(seccomp). :func:`usable` tries it between every pair of ranks and answers alike on every rank.
"""

import ctypes
import os

import numpy as np

from topology.machine import PROCESS_VM_READV, PROCESS_VM_WRITEV, IoVec


def _move(call, what, pid, address, array):
    """``call`` (read or write) of ``array``'s bytes against ``address`` in process ``pid``,
    repeated over what a short transfer left."""
    here, there = IoVec(), IoVec()
    start, nbytes, done = array.ctypes.data, array.nbytes, 0
    while done < nbytes:
        here.base, here.length = start + done, nbytes - done
        there.base, there.length = address + done, nbytes - done
        moved = call(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if moved <= 0:
            err = ctypes.get_errno()
            raise OSError(err, f"process_vm_{what}v from process {pid}: {os.strerror(err)}")
        done += moved


def read(pid, address, out):
    """Fill the contiguous array ``out`` from ``address`` in process ``pid``."""
    _move(PROCESS_VM_READV, "read", pid, address, out)


def write(pid, address, data):
    """Copy the contiguous array ``data`` to ``address`` in process ``pid``."""
    _move(PROCESS_VM_WRITEV, "write", pid, address, data)


def usable(comm):
    """``(pids, None)`` where every rank of ``comm`` (one node) can read and write every other's
    memory through the kernel, else ``(None, why)``; collective, the same answer on every rank."""
    rank = comm.Get_rank()
    probe = np.array([rank + 1, 0], np.int64)
    pids_and_addresses = comm.allgather((os.getpid(), probe.ctypes.data))
    why = None if PROCESS_VM_READV is not None and PROCESS_VM_WRITEV is not None else "the C library lacks process_vm_readv"
    if why is None:
        seen = np.zeros(1, np.int64)
        try:
            for other, (pid, address) in enumerate(pids_and_addresses):
                if other != rank:
                    read(pid, address, seen)
                    write(pid, address + 8, np.array([1], np.int64))
                    if seen[0] != other + 1:
                        why = f"process_vm_readv read {seen[0]} where rank {other} holds {other + 1}"
        except OSError as exc:
            why = exc.strerror or str(exc)
    comm.Barrier()  # every write is done before the probes are checked
    if why is None and comm.Get_size() > 1 and probe[1] != 1:
        why = "process_vm_writev wrote nothing"
    reasons = comm.allgather(why)
    found = next((r for r in reasons if r is not None), None)
    if found is not None:
        return None, f"the kernel refuses copies between processes ({found})"
    return tuple(pid for pid, _ in pids_and_addresses), None
