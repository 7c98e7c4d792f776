"""Sizes read from the environment, checked the same way everywhere."""

import os


def env_bytes(name, default):
    """The positive byte count in environment variable ``name`` (``default`` when unset);
    ``ValueError`` naming the variable for anything else."""
    raw = os.environ.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be a positive number of bytes")
    return value


def size_text(nbytes):
    """``nbytes`` in the largest binary unit that divides it: "512 KiB", "1 GiB", "100 B"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"
