"""Message sizes as nccl-tests writes them: ``8``, ``64K``, ``128M``, ``1G`` (powers of 1024)."""

import re

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text):
    """``"8"``, ``"64K"``, ``"128M"``, ``"1G"`` -> bytes; ``ValueError`` otherwise."""
    match = re.fullmatch(r"(\d+)([KMG]?)B?", str(text).strip().upper())
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 64K, 128M, 1G)")
    return int(match.group(1)) * _UNITS[match.group(2)]
