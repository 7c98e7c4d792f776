"""Whether a host buffer lies in 4 KiB pages or in transparent huge pages (2 MiB).

MPICH moves a large message between two processes of a node with one kernel copy (CMA:
``process_vm_readv``), which pins the sender's pages one at a time: from 4 KiB pages it ran
at 6-9 GB/s on the test VM, from huge pages at 18-28 GB/s (``results/perf-cpu-notes.md``).
So the shared-memory transport can send a large message from 4 KiB pages through its slots
(two copies, nothing pinned) and one from huge pages through MPI (``ALLREDUCE_SHM_BY_PAGES``).

The kernel says which pages are huge through the ``PAGEMAP_SCAN`` ioctl of
``/proc/self/pagemap`` (Linux 6.7; ``PAGE_IS_HUGE``), a walk of the page tables of just
that range: about 1 us for the one page :meth:`PageProbe.is_huge` asks about. Where it is
missing, :class:`PageProbe` is not ``available`` and every large message goes through MPI.
"""

import ctypes
import fcntl
import os
import re

PAGE = 4096
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
PAGE_IS_HUGE = 1 << 6


def thp_mode(path=THP_SETTING):
    """The machine's THP setting (``always``, ``madvise`` or ``never``: the bracketed word of
    ``path``), or ``"unavailable"`` where the file cannot be read (not Linux, no THP)."""
    try:
        with open(path) as f:
            found = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return "unavailable"
    return found.group(1) if found else "unavailable"


class _ScanArgs(ctypes.Structure):  # struct pm_scan_arg, include/uapi/linux/fs.h
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages",
        "category_inverted", "category_mask", "category_anyof_mask", "return_mask")]


class _Region(ctypes.Structure):  # struct page_region
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("categories", ctypes.c_uint64)]


PAGEMAP_SCAN = (3 << 30) | (ctypes.sizeof(_ScanArgs) << 16) | (ord("f") << 8) | 16  # _IOWR('f', 16, ...)
REGIONS = 32
REMEMBERED = 4096  # pages whose answer is kept


class PageProbe:
    """Which host pages are huge, from the kernel: :meth:`is_huge` for one page,
    :meth:`huge_share` for a range."""

    def __init__(self):
        self.available, self._fd, self._known = False, None, {}
        try:
            self._fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        self._regions = (_Region * REGIONS)()
        self._args = _ScanArgs(size=ctypes.sizeof(_ScanArgs), vec=ctypes.addressof(self._regions),
                               vec_len=REGIONS, category_anyof_mask=PAGE_IS_HUGE, return_mask=PAGE_IS_HUGE)
        probe = ctypes.create_string_buffer(PAGE)
        self.available = self.huge_share(ctypes.addressof(probe), PAGE) is not None

    @classmethod
    def unavailable(cls):
        """A probe that is not ``available`` (the page route turned off), opening nothing."""
        probe = cls.__new__(cls)
        probe.available, probe._fd, probe._known = False, None, {}
        return probe

    def free(self):
        """Close ``/proc/self/pagemap`` (with the communicator's other resources)."""
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd, self.available = None, False

    def is_huge(self, address):
        """Whether the page holding ``address`` is part of a huge page (False when the kernel
        cannot say). Remembered per page (up to :data:`REMEMBERED` of them, then forgotten
        all at once): a program sends from the same buffers call after call, and the ioctl
        costs 2-4 us there. An answer outlives a buffer freed and mapped again otherwise;
        that can only choose the slower route, never lose a byte."""
        page = address - address % PAGE
        known = self._known.get(page)
        if known is None:
            if len(self._known) >= REMEMBERED:
                self._known.clear()
            args = self._args
            args.start, args.end = page, page + PAGE
            try:
                known = fcntl.ioctl(self._fd, PAGEMAP_SCAN, args) > 0
            except (OSError, TypeError):
                known = False
            self._known[page] = known
        return known

    def huge_share(self, address, nbytes):
        """Share (0..1) of bytes ``address..address+nbytes`` in huge pages; None when the
        kernel cannot say (no ``PAGEMAP_SCAN``)."""
        if nbytes <= 0:
            return 0.0
        end = address + nbytes
        args = self._args
        args.start, args.end = address - address % PAGE, -(-end // PAGE) * PAGE
        huge = 0
        while True:
            try:
                found = fcntl.ioctl(self._fd, PAGEMAP_SCAN, args)  # the kernel updates args.walk_end
            except (OSError, TypeError):
                return None
            for region in self._regions[:found]:
                huge += min(region.end, end) - max(region.start, address)
            if found < REGIONS or args.walk_end >= args.end:
                return huge / nbytes
            args.start = args.walk_end
