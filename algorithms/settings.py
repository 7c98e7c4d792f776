"""The ``ALLREDUCE_*`` environment variables that change what goes over the wire, read and
checked the same way everywhere, and agreed on by every rank.

Sender and receiver cut a message alike only when they read the same settings: a slot size,
segment size or route threshold set on one rank alone makes its peers expect other pieces,
and the job hangs. So :func:`agree_settings` (one ``allgather`` when a communicator is first
used, :class:`.executor.Private`) compares every rank's raw text of every variable in
:data:`WIRE` and raises the same ``ValueError`` on every rank, naming the variable and the
ranks that differ, or the value that is not valid and where it was set.

Sizes have lower bounds that keep a call's message count sane: pipeline segments of at least
4 KiB (``ALLREDUCE_SEGMENT_BYTES=1`` once made one 64 KiB all-reduce 65,536 messages and
20 s), staging chunks of at least 1 KiB, slots of at least 256 bytes (four cache lines) and
at most 64 MiB (the node's window holds 4 slots per pair of ranks).
"""

import importlib.util
import os
from dataclasses import dataclass

KIB, MIB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Size:
    """A byte count from ``lowest`` to ``highest``, a multiple of ``multiple``."""
    default: int
    lowest: int = 1
    highest: int = 1 << 62
    multiple: int = 1

    def parse(self, name, raw):
        try:
            value = int(raw.strip())
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise ValueError(f"{name}={raw!r} must be a positive number of bytes")
        if value < self.lowest:
            raise ValueError(f"{name}={raw!r} is below its lower bound, {size_text(self.lowest)}")
        if value > self.highest:
            raise ValueError(f"{name}={raw!r} is above its upper bound, {size_text(self.highest)}")
        if value % self.multiple:
            raise ValueError(f"{name}={value} must be a multiple of {self.multiple}")
        return value


@dataclass(frozen=True)
class Count:
    """A whole number from ``lowest`` to ``highest``."""
    default: int
    lowest: int = 1
    highest: int = 1 << 30

    def parse(self, name, raw):
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"{name}={raw!r} must be a whole number") from None
        if not self.lowest <= value <= self.highest:
            raise ValueError(f"{name}={raw!r} must be from {self.lowest} to {self.highest}")
        return value


@dataclass(frozen=True)
class Choice:
    """One of ``choices`` (compared in lower case, spaces stripped)."""
    default: str
    choices: tuple

    def parse(self, name, raw):
        value = raw.strip().lower()
        if value not in self.choices:
            raise ValueError(f"{name}={raw!r} is not one of {', '.join(self.choices)}")
        return value


@dataclass(frozen=True)
class Kernel(Choice):
    """A :class:`Choice` of kernel; a value that is also a key of ``needs`` needs that package
    installed (found, not imported)."""
    needs: tuple = ()

    def parse(self, name, raw):
        value = Choice.parse(self, name, raw)
        package = dict(self.needs).get(value)
        if package and importlib.util.find_spec(package) is None:
            raise ValueError(f"{name}={raw!r} needs {package}, which is not installed")
        return value


@dataclass(frozen=True)
class NodeMap:
    """A comma list of integer node ids, one per rank (``0,0,1,1``); empty means ``default``.
    Its length is checked against the communicator where it is used (:mod:`.hier`)."""
    default: tuple = ()
    default_text: str = "the ranks that share memory"

    def parse(self, name, raw):
        text = raw.strip()
        if not text:
            return self.default
        ids = []
        for index, entry in enumerate(text.split(",")):
            try:
                ids.append(int(entry.strip()))
            except ValueError:
                raise ValueError(f"{name}={raw!r}: entry {index}, {entry.strip()!r}, is not an integer node id "
                                 "(give one integer per rank, as 0,0,1,1)") from None
        return tuple(ids)


@dataclass(frozen=True)
class Path:
    """A file name (spaces stripped); empty means none."""
    default: str = ""
    default_text: str = "none"

    def parse(self, name, raw):
        return raw.strip()


#: every variable that changes how messages are cut or routed, with its rule
WIRE = {
    "ALLREDUCE_TRANSPORT": Choice("auto", ("auto", "direct", "staged", "shm")),
    "ALLREDUCE_CUDA_AWARE": Choice("detect", ("detect", "0", "1")),
    "ALLREDUCE_SEGMENT_BYTES": Size(2 * MIB, lowest=4 * KIB),
    "ALLREDUCE_STAGE_BYTES": Size(1 * MIB, lowest=1 * KIB),
    "ALLREDUCE_SHM_SLOT_BYTES": Size(256 * KIB, lowest=256, highest=64 * MIB, multiple=64),
    "ALLREDUCE_IPC_SLOT_BYTES": Size(4 * MIB, lowest=4 * KIB, highest=256 * MIB, multiple=64),
    "ALLREDUCE_SHM_MIN_BYTES": Size(8 * KIB),
    "ALLREDUCE_SHM_MAX_BYTES": Size(256 * KIB),
    "ALLREDUCE_IPC_MIN_BYTES": Size(1),
    "ALLREDUCE_IPC_MAX_BYTES": Size(1 << 62),
    "ALLREDUCE_SHM_BY_PAGES": Choice("auto", ("auto", "0", "1")),
    "ALLREDUCE_ONESHOT_BYTES": Size(64 * KIB, lowest=64, highest=64 * MIB, multiple=64),
    "ALLREDUCE_TWOSHOT_BYTES": Size(1 * MIB, lowest=64, highest=64 * MIB, multiple=64),
    # twoshot: a vector over one box in one round of kernel copies (auto: where the kernel allows)
    "ALLREDUCE_KERNEL_COPY": Choice("auto", ("auto", "0")),
    # hier: the node of each rank (empty: the ranks that share memory), and what runs across nodes
    "ALLREDUCE_NODE_MAP": NodeMap(),
    "ALLREDUCE_HIER_ACROSS": Choice("ring", ("ring", "bamtree")),
    # rabenseifner: the radix k of its halving and doubling steps (2: halves)
    "ALLREDUCE_RADIX": Count(2, lowest=2, highest=64),
    # auto: the tuning table it follows (python -m bench tune); unset, the model decides
    "ALLREDUCE_TUNING_FILE": Path(),
    # long bfloat16 vectors' add, multiply and divide (auto: PyTorch's where installed; algorithms.ops):
    # the same bits either way, but a rank alone on another kernel would time at its own speed
    # which engine runs a plan (auto: the compiled one up to ALLREDUCE_COMPILED_BYTES where the node's
    # shared memory is the transport; algorithms/runtime/compiled.py)
    "ALLREDUCE_ENGINE": Choice("auto", ("auto", "python", "compiled")),
    "ALLREDUCE_COMPILED_BYTES": Size(64 * KIB),
    "ALLREDUCE_BF16_KERNEL": Kernel("auto", ("auto", "torch", "ml_dtypes"), needs=(("torch", "torch"),)),
}

#: the raw text of the variables read once per process (at import), as they were read then
_READ_AT_IMPORT = {}


def is_set(name):
    """Whether the variable ``name`` (a key of :data:`WIRE`) is given, not left to its default."""
    return (_READ_AT_IMPORT[name] if name in _READ_AT_IMPORT else os.environ.get(name)) is not None


def setting(name):
    """The value of ``name`` (a key of :data:`WIRE`) now: its default when unset;
    ``ValueError`` naming the variable for anything its rule refuses."""
    raw = _READ_AT_IMPORT[name] if name in _READ_AT_IMPORT else os.environ.get(name)
    rule = WIRE[name]
    return rule.default if raw is None else rule.parse(name, raw)


def setting_at_import(name):
    """:func:`setting` for a value fixed when a module is imported (the segment size): the
    text is kept for :func:`agree_settings`, and an invalid one gives the default here, since
    the agreement, before any message, raises on every rank instead of on this one alone."""
    _READ_AT_IMPORT[name] = os.environ.get(name)
    try:
        return setting(name)
    except ValueError:
        return WIRE[name].default


def agree_settings(comm):
    """Raise the same ``ValueError`` on every rank of ``comm`` when a rank's :data:`WIRE`
    variable is invalid or the ranks' values differ (collective: one ``allgather``)."""
    mine = {name: (_READ_AT_IMPORT[name] if name in _READ_AT_IMPORT else os.environ.get(name)) for name in WIRE}
    everyone = comm.allgather(mine)
    problems = []
    for name, rule in WIRE.items():
        texts = [ranks[name] for ranks in everyone]
        values = []
        for raw in texts:
            try:
                values.append(rule.default if raw is None else rule.parse(name, raw))
            except ValueError as exc:
                values.append(exc)
        invalid = {}
        for rank, value in enumerate(values):
            if isinstance(value, ValueError):
                invalid.setdefault(str(value), []).append(rank)
        problems += [f"{text} (on {rank_list(ranks)})" for text, ranks in invalid.items()]
        if not invalid and len(set(values)) > 1:
            groups = {}
            for rank, raw in enumerate(texts):
                groups.setdefault("unset (default " + getattr(rule, "default_text", str(rule.default)) + ")"
                                  if raw is None else repr(raw),
                                  []).append(rank)
            problems.append(f"{name} differs between ranks: "
                            + "; ".join(f"{text} on {rank_list(rs)}" for text, rs in groups.items()))
    if problems:
        raise ValueError("; ".join(problems))


def rank_list(ranks):
    """"rank 3" or "ranks 0, 1, 2" (the first eight, then "...")."""
    shown = ", ".join(str(r) for r in ranks[:8]) + (", ..." if len(ranks) > 8 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}"


def size_text(nbytes):
    """``nbytes`` in the largest binary unit that divides it: "512 KiB", "1 GiB", "100 B"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"
