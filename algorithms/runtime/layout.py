"""How vectors are cut: into N chunks (one per rank) and into pipeline segments.

Both use the same rule, so sender and receiver always agree on the pieces:
``count`` elements in ``parts`` contiguous pieces whose sizes differ by at most
one, the larger first (pieces are empty when ``count < parts``).

Segments bound what one message carries, so that a received piece is reduced
while it is still in cache and trees can pipeline. ``ALLREDUCE_SEGMENT_BYTES``
(default 2 MiB, at least 4 KiB, read at import) sets the largest segment.
"""

import functools

from ..settings import setting_at_import

SEGMENT_BYTES = setting_at_import("ALLREDUCE_SEGMENT_BYTES")


@functools.lru_cache(maxsize=256)
def chunk_offsets(count, parts):
    """Offsets of ``parts`` pieces of a ``count``-element vector (a tuple of length parts+1)."""
    base, extra = divmod(count, parts)
    return tuple(i * base + min(i, extra) for i in range(parts + 1))


def segments(nbytes):
    """S: the pipeline segments of an ``nbytes`` vector (:data:`SEGMENT_BYTES` each at most)."""
    return max(1, -(-int(nbytes) // SEGMENT_BYTES))


@functools.lru_cache(maxsize=256)
def segment_offsets(count, itemsize):
    """Offsets of the pipeline segments of a ``count``-element vector: as few as keep each
    within ``SEGMENT_BYTES``, at least one."""
    parts = max(1, -(-count * itemsize // SEGMENT_BYTES))
    return chunk_offsets(count, parts)
