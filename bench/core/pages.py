"""Page backing of host vectors: 4 KiB pages or transparent huge pages (THP, 2 MiB).

It changes what a large intranode MPI message costs. MPICH moves one with a single kernel
copy (CMA: the receiver's ``process_vm_readv`` of the sender's memory), and the kernel pins
the sender's pages one at a time: from 4 KiB pages it ran at 6-9 GB/s on the 2-core test VM,
from huge pages at 18-28 GB/s (``results/perf-cpu-notes.md``), while ``numpy.copyto`` runs at
the same speed on either. NumPy asks for huge pages (``madvise``) for arrays of 4 MiB and
more; many other allocators (PyTorch's CPU allocator by default) do not, and a machine whose
THP setting is ``never`` gives none. :mod:`bench.tools.perf` therefore reports the share of its
plain vectors in huge pages, and times native and ring once more on vectors held in 4 KiB
pages (:func:`small_page_vector`). The share comes from ``/proc/self/smaps``, which every
Linux kernel has, not from :class:`algorithms.runtime.transports.pages.PageProbe` (Linux 6.7+); the tests check
the probe against it, and it against the kernel's per-page flags.
"""

import mmap
import re

import numpy as np

SMAPS = "/proc/self/smaps"
_VMA = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ")


def small_page_vector(count, dtype):
    """A zeroed vector of ``count`` ``dtype`` elements in a private anonymous mapping of its own
    that the kernel may not back by huge pages (``MADV_NOHUGEPAGE``): 4 KiB pages whatever the
    machine's THP setting. The array keeps the mapping alive."""
    nbytes = max(count * np.dtype(dtype).itemsize, 1)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mapping.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mapping, dtype, count)


def huge_page_share(array, path=SMAPS):
    """The share (0..1) of ``array``'s bytes backed by huge pages, from the kernel's memory map
    (``AnonHugePages`` of each mapping it lies in, spread evenly over that mapping: exact when
    a mapping is all huge or all small, as NumPy's ``madvise`` of a large array's own range makes
    it); None where ``path`` cannot be read."""
    start = array.__array_interface__["data"][0]
    end = start + array.nbytes
    huge = 0.0
    try:
        with open(path) as f:
            overlap = size = 0
            for line in f:
                vma = _VMA.match(line)
                if vma:
                    lo, hi = int(vma.group(1), 16), int(vma.group(2), 16)
                    size, overlap = hi - lo, max(0, min(hi, end) - max(lo, start))
                elif overlap and line.startswith("AnonHugePages:"):
                    huge += overlap * min(1.0, int(line.split()[1]) * 1024 / size)
    except OSError:
        return None
    return huge / array.nbytes if array.nbytes else 0.0
