"""The compiled engine: a rank's whole plan (:mod:`.plan`) run in one call of C
(``compiled_engine.c``, built with the package as an optional extension), within a node, over
channels in memory the node's ranks share; the C file states the channels, the order messages
keep and the arithmetic (the same bits as the Python engine's ufuncs). It interprets plans: it
knows no algorithm.

Which engine runs a call (``ALLREDUCE_ENGINE``, agreed on by every rank): ``python`` the Python
engine (:mod:`.engine`) always; ``compiled`` this one wherever it can run; ``auto`` (the default)
this one for vectors up to a threshold (:func:`tuned_limit`: ``ALLREDUCE_COMPILED_BYTES``, or what
``bench tune`` measured) where the node's shared memory is the transport; a tool may pin a
communicator to one (:func:`pin`). It can run where every rank of the communicator shares one node, the vectors are
NumPy's, and every rank has the extension (an install without a C compiler has none and runs the
Python engine: :func:`note` says why). Each side of the choice is the same on every rank, so
every rank runs the same engine.
"""

import functools
import json
import math

import numpy as np
from mpi4py import MPI

from plumbing.shm import ShmTooSmall
from topology.machine import node_comm

from ..arrays import data_pointer
from ..dtypes import DTYPES
from ..ops import OPS
from ..settings import is_set, setting, size_text
from .executor import private_comm
from .plan import scratch_length
from .transports.shared_memory import SharedMemoryTransport
from .transports.shared_windows import allocate_shared

try:
    from . import _compiled_engine
    MISSING = None
except ImportError as exc:  # built without a C compiler: the Python engine runs every plan
    _compiled_engine, MISSING = None, f"the compiled engine was not built ({exc})"

KINDS = ("isend", "wait", "send", "recv", "recv_reduce", "irecv", "irecv_reduce", "sendrecv", "sendrecv_reduce",
         "copy", "combine", "zero")  # the C file's step kinds, in its order
VECTORS = ("input", "output", "partial", "scratch")  # the C file's vectors, in its order
OP_CODES = {"sum": 0, "avg": 0, "prod": 1, "max": 2, "min": 3}  # the C file's ops; avg: a sum, divided after
#: the C file's element types, in its order; the two 8-bit floats reduce by a table
TYPE_CODES = {dtype: code for code, dtype in enumerate(DTYPES[:12])}
TABLED = frozenset(DTYPES[12:])
SLOT_BYTES, DEPTH = 8 << 10, 4  # a channel's slots (fewer bytes where many ranks share the node)
CHANNELS_BYTES = 16 << 20  # at most this much for all the node's channels
SPINS = 64  # polls before a wait gives its core away
LINE = 64
RESOURCE = "compiled-engine"  # the name the channels are kept under, per communicator
_TABLES = {}


def table(dtype, op):
    """The 256 x 256 table of ``a (op) b`` for an 8-bit float, filled by ml_dtypes' own ufunc."""
    key = (dtype, op)
    if key not in _TABLES:
        words = np.arange(256, dtype=np.uint8)
        a, b = (words.view(dtype)[:, None], words.view(dtype)[None, :])
        ufunc = getattr(np, OPS[op])
        with np.errstate(all="ignore"):  # inf - inf and the like: NaN, as the ufunc makes it in a call
            _TABLES[key] = np.ascontiguousarray(ufunc(a, b).astype(dtype)).view(np.uint8).ravel()
    return _TABLES[key]


class Channels:
    """The node's channels (collective to build): for every ordered pair of ranks a head, a tail
    and ``depth`` slots of ``slot`` bytes, each a line ahead of its bytes for its flag (the layout:
    ``compiled_engine.c``), in one window of shared memory; ``usable`` the same on every rank,
    ``note`` why not where it is not."""

    def __init__(self, comm):
        size = comm.Get_size()
        node = node_comm(comm)
        self.win, self.note = None, None
        try:
            together = node.Get_size() == size
            everywhere = comm.allreduce(0 if MISSING else 1, op=MPI.MIN) == 1
            self.note = MISSING if not everywhere else None if together else "the ranks span nodes"
            if self.note is None:
                per_pair = min(SLOT_BYTES, CHANNELS_BYTES // (size * size * DEPTH) // LINE * LINE - LINE)
                self.slot = max(LINE, per_pair)
                self.stride = 2 * LINE + DEPTH * (LINE + self.slot)
                nbytes = size * size * self.stride
                try:
                    self.win = allocate_shared(comm, node, nbytes if comm.Get_rank() == 0 else 0, LINE,
                                               "the compiled engine's channels")
                except ShmTooSmall as exc:
                    self.note = f"no shared memory for its channels ({exc.short})"
            self.limit, self.limit_from = tuned_limit(comm)
            if self.win is not None:
                memory = self.win.Shared_query(0)[0]
                self.address = MPI.Get_address(memory)
                if comm.Get_rank() == 0:
                    np.frombuffer(memory, np.uint8)[:] = 0
                comm.Barrier()
        finally:
            node.Free()
        self.usable = self.win is not None
        self.size, self.rank = size, comm.Get_rank()

    def free(self):
        if self.win is not None:
            self.win.Free()
            self.win = None
            self.usable = False


def tuned_limit(comm):
    """``(bytes, from where)``: the longest vector ``ALLREDUCE_ENGINE=auto`` gives the compiled
    engine on ``comm`` (one node): ``ALLREDUCE_COMPILED_BYTES`` where set, else what ``bench tune``
    measured into the tuning table ``ALLREDUCE_TUNING_FILE`` for this many ranks on one node
    (``"engine": {"compiled_bytes": ...}``), else the setting's default. Collective."""
    if is_set("ALLREDUCE_COMPILED_BYTES"):
        return setting("ALLREDUCE_COMPILED_BYTES"), "ALLREDUCE_COMPILED_BYTES"
    path, found = setting("ALLREDUCE_TUNING_FILE"), None
    if path and comm.Get_rank() == 0:
        try:
            with open(path, "rb") as f:
                tuning = json.loads(f.read())
            limit = tuning["engine"]["compiled_bytes"]
            if (tuning.get("ranks"), tuning.get("nodes")) == (comm.Get_size(), 1) and isinstance(limit, int):
                found = limit
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no measured threshold there (auto says what is wrong with the table itself)
    found = comm.bcast(found, root=0)
    if found is not None:
        return found, f"tuning table {path}"
    return setting("ALLREDUCE_COMPILED_BYTES"), "ALLREDUCE_COMPILED_BYTES's default"


def pin(comm, engine):
    """Run every plan on ``comm`` (every rank's call alike) on ``engine``, ``"python"`` or
    ``"compiled"`` (where it can run), or on the setting's choice again (None), whatever
    ``ALLREDUCE_ENGINE`` says: for a tool that times the two engines side by side. Plans bound
    before keep their engine."""
    if engine not in (None, "python", "compiled"):
        raise ValueError(f"engine {engine!r}; choices: python, compiled, None")
    private_comm(comm).engine = engine


def channels(coll):
    """The communicator's :class:`Channels`, built on first use (collective)."""
    return coll.private.resource(RESOURCE, Channels)


def decision(private, xp, transport, other="python"):
    """``(limit, why)``: the longest vector (bytes) whose plan the compiled engine runs on
    ``private``'s communicator for vectors of module ``xp`` carried by ``transport`` (None: none),
    and that choice in words, ``other`` naming what runs where it does not (collective the first
    time: it may build the channels)."""
    limit, why = _decided(private, xp, transport)
    return limit, why(other)


def _decided(private, xp, transport):
    """``(limit, why(other))``: :func:`decision`, its words left to be written when asked for."""
    engine = private.engine or setting("ALLREDUCE_ENGINE")
    if engine == "python":
        return None, lambda other: f"{other} (ALLREDUCE_ENGINE=python)"
    if xp is not np:
        return None, lambda other: f"{other} (the compiled engine runs NumPy vectors)"
    place = private.resource(RESOURCE, Channels)
    if not place.usable:
        return None, lambda other: f"{other} (the compiled engine cannot run: {place.note})"
    if engine == "compiled":
        return math.inf, lambda other: "compiled (ALLREDUCE_ENGINE=compiled)"
    if not isinstance(transport, SharedMemoryTransport):
        return None, lambda other: f"{other} (ALLREDUCE_ENGINE=auto: the transport is not the node's shared memory)"
    return place.limit, lambda other: f"compiled up to {size_text(place.limit)}, {other} above ({place.limit_from})"


def chosen(coll, nbytes):
    """Whether the compiled engine runs a plan of ``nbytes`` vectors on ``coll`` (:func:`decision`)."""
    limit = _decided(coll.private, coll.xp, coll.transport)[0]
    return limit is not None and nbytes <= limit


def describe(private, xp, transport, other="python"):
    """Which engine runs a plan, by size, in words (:func:`decision`)."""
    return decision(private, xp, transport, other)[1]


def program(coll, steps, count, dtype):
    """The bytes the C engine runs for ``steps`` on ``coll`` (:func:`program_on`), its scratch the
    context's workspace."""
    scratch = coll.scratch(dtype, scratch_length(steps), "engine")
    return program_on(channels(coll), steps, dtype, coll.op, scratch)


def program_on(place, steps, dtype, op, scratch):
    """The bytes the C engine runs over channels ``place`` (:class:`Channels`): its header, each
    step's words, then the waits' handles; and what must stay alive while it may run (the memory
    the header points to). ``op`` None: a plan that reduces nothing (an all-gather)."""
    itemsize = dtype.itemsize
    handles = 1 + max((s.handle for s in steps), default=-1)
    tabled = table(dtype, op) if dtype in TABLED and op is not None else None
    words, waits = [], []

    def piece(slice_):
        if not slice_:
            return [0, 0, 0]
        vector, lo, hi = slice_
        return [VECTORS.index(vector), lo * itemsize, (hi - lo) * itemsize]

    for step in steps:
        send, acc, into = piece(step.send), piece(step.acc), piece(step.into)
        if step.kind == "wait":
            send = [0, len(waits), len(step.waits)]
            waits += step.waits
        words.append([KINDS.index(step.kind), step.to, step.source, *send, *acc[:2], *into, step.handle])
    header = [place.size, place.rank, place.address, place.slot, DEPTH, place.stride,
              TYPE_CODES.get(dtype, len(TYPE_CODES)), OP_CODES.get(op, 0),
              0 if tabled is None else data_pointer(tabled), data_pointer(scratch), len(steps), handles, SPINS,
              len(waits)]
    assert len(header) == _compiled_engine.HEADER_WORDS
    flat = np.array(header + [w for step in words for w in step] + waits, dtype=np.int64)
    return flat.tobytes(), (scratch, tabled)


def checker_on(private, steps, dtype, op):
    """``checker(input, output, expected)``: a callable that runs ``steps`` (an all-reduce's, on those
    two arrays) by the C engine over ``private``'s channels and says whether the output then is
    ``expected`` (bytes), in one call of C; or None where the engine does not run on that
    communicator (``ALLREDUCE_ENGINE=python``, ranks on several nodes, no extension, more
    messages in flight than the engine keeps): for the
    library's own agreement check (collective the first time: it may build the channels; the
    answer is the same on every rank)."""
    if (private.engine or setting("ALLREDUCE_ENGINE")) == "python":
        return None
    place = private.resource(RESOURCE, Channels)  # usable or not alike on every rank
    in_flight = max(sum(s.kind == "isend" for s in steps), sum(s.kind.startswith("irecv") for s in steps))
    if not place.usable or in_flight > _compiled_engine.MAX_PENDING:
        return None
    scratch = np.empty(scratch_length(steps), dtype)
    code, keep = program_on(place, steps, dtype, op, scratch)

    def checker(input, output, expected):
        run = functools.partial(_compiled_engine.run_expecting, code, data_pointer(input), data_pointer(output),
                                expected)
        run.keep = (keep, input, output)  # the memory the program and the addresses point to
        return run
    return checker


def bind(coll, steps, count, dtype, names, kept_bytes):
    """``run(*vectors)`` running ``steps`` through the C engine on the vectors ``names`` names
    (as :func:`.engine.bind`); the addresses of the last call's vectors are kept while the calls
    get those same vectors, up to ``kept_bytes``."""
    code, keep = program(coll, steps, count, dtype)
    run = _compiled_engine.run
    slots = tuple(VECTORS.index(name) for name in names)

    def addresses(vectors):
        found = [0, 0, 0]
        for slot, vector in zip(slots, vectors):
            if vector is not None:  # a reduce-scatter's partial sums in scratch: None
                found[slot] = data_pointer(vector)
        return found

    if count * dtype.itemsize > kept_bytes:
        def run_each(*vectors, keep=keep):  # keep: the scratch the program points into stays alive
            run(code, *addresses(vectors))
        return run_each
    last = [None, None, None, 0, 0, 0, keep]
    if names == ("input", "output"):
        def run_two(sendbuf, recvbuf):
            if sendbuf is not last[0] or recvbuf is not last[1]:
                last[0], last[1] = sendbuf, recvbuf
                last[3:6] = addresses((sendbuf, recvbuf))
            run(code, last[3], last[4], last[5])
        run_two.program = code  # what repeat_checks runs in one call of C
        return run_two

    if len(names) == 3:  # a reduce-scatter's (input, partial sums or None, output)
        def run_three(a, b, c):
            if a is not last[0] or b is not last[1] or c is not last[2]:
                last[:3] = a, b, c
                last[3:6] = addresses((a, b, c))
            run(code, last[3], last[4], last[5])
        return run_three

    if len(names) != 1:
        raise ValueError(f"a plan's run takes (input, output), (input, partial, output) or one vector, not {names}")

    def run_one(whole):  # an all-gather's whole vector
        if whole is not last[0]:
            last[0] = whole
            last[3:6] = addresses((whole,))
        run(code, last[3], last[4], last[5])
    return run_one


def repeat_checks(runner, sendbuf, recvbuf):
    """``(matches, run_if_same)`` for calls repeated on these two 1-D NumPy arrays (``runner``
    their all-reduce, bound): ``matches(a, b)`` says whether a and b are these arrays as they are now in
    all that can change in place (dtype, shape, strides, flags, data), and ``run_if_same(a, b)`` runs
    ``runner`` where they are, returning whether it did. Both are one call of C where the
    extension is built (``run_if_same`` runs the compiled engine's program itself); else NumPy's
    attributes read in Python."""
    if MISSING is None:
        kept = _compiled_engine.fingerprint(sendbuf, recvbuf)
        matches = functools.partial(_compiled_engine.matches, kept)
        program = getattr(runner, "program", None)
        if program is not None:
            return matches, functools.partial(_compiled_engine.run_if_same, program, kept)
    else:
        dtype, shape, strides = sendbuf.dtype, sendbuf.shape, sendbuf.strides

        def matches(a, b):
            return (a.dtype is dtype and b.dtype is dtype and a.shape == shape == b.shape and a.strides == strides
                    == b.strides and b.flags.writeable)

    def run_if_same(a, b):
        if matches(a, b):
            runner(a, b)
            return True
        return False
    return matches, run_if_same
