"""Message sizes as nccl-tests takes them: ``-b 8 -e 128M -f 2`` (K/M/G are powers of 1024)."""

from plumbing.units import parse_size

__all__ = ["parse_size", "sweep"]


def sweep(min_bytes, max_bytes, factor=2, step=0):
    """Sizes from ``min_bytes`` to ``max_bytes``: times ``factor`` (``-f``), or plus ``step`` (``-i``)."""
    if max_bytes < min_bytes:
        raise ValueError(f"max bytes {max_bytes} is below min bytes {min_bytes}")
    if step > 0:
        return list(range(min_bytes, max_bytes + 1, step))
    if factor < 2:
        raise ValueError(f"factor must be at least 2, got {factor}")
    if min_bytes == 0:
        raise ValueError("min bytes must be positive when sizes grow by a factor")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes
