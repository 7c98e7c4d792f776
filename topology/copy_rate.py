"""A host's copy bandwidth, the figure no link between two of its ranks can exceed: the fastest
lone copy of a message, by NumPy (glibc's ``memcpy``) or by the kernel (``process_vm_readv``,
MPI's single-copy path), between two page-aligned vectors, timed by one rank per host."""

import ctypes
import os
import socket
import time

import numpy as np

from .machine import PROCESS_VM_READV, IoVec, node_comm


def copy_bandwidth(comm, nbytes, least=10, seconds=0.05):
    """Bytes per second of the fastest lone copy of ``nbytes`` on each host, between two
    page-aligned vectors (:func:`page_aligned_pair`): a user-space copy (``numpy.copyto``) or
    the kernel's (``process_vm_readv``, MPI's single-copy path, which beats the first on some
    sizes), the best of at least ``least`` copies and
    ``seconds`` of each (a core's first copies run at a fraction of its speed), by one rank
    per host while the others wait asleep (an MPI barrier's polling would take the copying
    rank's core where ranks outnumber cores): {host: B/s} on every rank."""
    node = node_comm(comm)
    try:
        best = None
        if node.Get_rank() == 0:
            source, target = page_aligned_pair(nbytes)
            copies = [lambda: np.copyto(target, source)]
            kernel = _kernel_copy(source, target)
            copies += [kernel] if kernel else []
            best = max(nbytes / _fastest(copy, least, seconds) for copy in copies)
        done = node.Ibarrier()  # a nonblocking barrier matches only nonblocking ones
        while not done.Test():
            time.sleep(0.001)
    finally:
        node.Free()
    found = {}
    for host, value in comm.allgather((socket.gethostname(), best)):
        if value is not None:
            found[host] = max(found.get(host, 0.0), value)
    return found


def page_aligned_pair(nbytes):
    """Two ``nbytes`` uint8 vectors (of ones) that start on page boundaries, carved from one
    allocation. Two vectors allocated apart may lie a few bytes off a whole number of pages
    from each other (malloc's header: 16 bytes), where glibc's ``memcpy`` (``rep movsb`` from
    a few KiB) runs up to ten times slower on some x86 CPUs (4K aliasing): the host's copy
    bandwidth is that of a copy without it."""
    page = 4096
    span = -(-nbytes // page) * page
    whole = np.ones(2 * span + page, np.uint8)
    start = -whole.ctypes.data % page
    return whole[start:start + nbytes], whole[start + span:start + span + nbytes]


def _fastest(call, least, seconds):
    """The shortest time of at least ``least`` calls and ``seconds`` of them (at most 1000)."""
    fastest, count, began = np.inf, 0, time.perf_counter()
    while count < least or (time.perf_counter() - began < seconds and count < 1000):
        start = time.perf_counter()
        call()
        fastest = min(fastest, time.perf_counter() - start)
        count += 1
    return fastest


def _kernel_copy(source, target):
    """A call that copies ``source`` into ``target`` by ``process_vm_readv`` on this process,
    or None where the kernel refuses it."""
    if PROCESS_VM_READV is None:
        return None
    local, remote = IoVec(target.ctypes.data, target.nbytes), IoVec(source.ctypes.data, source.nbytes)
    pid = os.getpid()

    def copy():
        return PROCESS_VM_READV(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return copy if copy() == source.nbytes else None
