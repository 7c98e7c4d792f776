"""Two-shot all-reduce through the node's shared memory: a reduce-scatter and an all-gather,
each one read of the others' data (PyTorch symmetric memory's ``two_shot_all_reduce``,
TensorRT-LLM's and vLLM's "two-shot"); ``oneshot``'s bandwidth-optimal sibling.

Every rank posts its vector into its own box of a window the node's ranks share
(:mod:`.transports.boxes`) and raises its counter; each rank then reduces its 1/N slice
(:func:`.layout.chunk_offsets`) from all N boxes, in rank order (its own slice from its vector),
straight into its result, copies that slice into its own box, where nobody read before, and
raises its counter again; then each copies the N-1 other reduced slices from the other boxes.
Each slice is reduced by one rank only, so every rank gets the same bits. A rank reads
2(N-1)/N M, as in the ring, after two synchronisations instead of 2(N-1) message steps:
T ~ 2 alpha_sync + 2(N-1)/N M/beta_mem, plus the copies into and out of the boxes, which the
ring's large MPI messages (one kernel copy) do not make.

Where the compiled engine runs plans of the vector's size, it runs this one's instead
(:func:`steps`, :func:`..runtime.plan.two_step`: the same messages and reduction order, through
the engine's channels).

A vector over one box (``ALLREDUCE_TWOSHOT_BYTES``, 1 MiB) is one round without the boxes:
each rank posts where its vectors lie and reads its slice of the others' pieces straight from
their memory, a box's worth at a time, through the kernel (``process_vm_readv``,
:mod:`.transports.kernel_copy`), reduces it and writes the sum into every other rank's result
the same way (``process_vm_writev``): one kernel copy each way, as the ring's large messages.
On 2 ranks of a 2-vCPU VM (bench perf): 0.96-1.18x the ring's busbw from 1 to 256 MiB on
plain vectors and 1.08x or more on registered ones, where through the boxes it ran 0.77-0.85x
the ring's at 32-64 MiB.
Where the kernel refuses such copies (containers' seccomp, Yama's ptrace_scope; probed once
between every pair) or ``ALLREDUCE_KERNEL_COPY=0``, such a vector goes through the boxes in
pieces, each a round.

Registered vectors (:func:`algorithms.alloc_registered`) are not copied: the box's header says
where a rank's piece and result lie; the others reduce from the piece where it lies, and each
writes its reduced slice into every registered result while it is still in its cache (into its
box only for the plain results). Once every rank has said in a round's header that both its
vectors are registered to their ends, the rest of the call is one round. A kernel round reads
and writes registered vectors where they lie, without the kernel.

The two shots are also the reduce-scatter and the all-gather on their own (chunk r of
:func:`.layout.chunk_offsets` on rank r): the first shot stops after the reduce, into the result
(this rank's chunk) instead of a box; the second posts each rank's chunk and copies the others'.
They run as rounds of the same boxes and counters as the all-reduce, so any mix of the three on
one communicator keeps the counters right; where the compiled engine runs plans of the whole
vector's size they are plans instead (:func:`reduce_scatter_steps`, :func:`all_gather_steps`).
A vector over one box goes in one round of kernel copies where the kernel allows them (the
reduce-scatter reads, the all-gather writes its chunk into every other rank's vector);
otherwise, and for a vector of one box or less, through the boxes, round k on piece k of every
chunk (the others' N-1 pieces end to end in a box for a reduce-scatter; its own one for an
all-gather). A registered vector is read where it lies, but
the halves do not take the all-reduce's single round for registered vectors: they go a box at a
time.

Round c (over every call and piece) uses box c mod 2, and its counter takes the values 2c-1
(posted) and 2c (reduced, and written into the registered results, or in a kernel round
into every result). A rank writes box c mod 2
in round c only after its wait in round c-1 for every counter to reach 2(c-1)-1, which each
rank raised after it finished round c-2, the last round of that box; no rank can raise a box's
counter past round c before every rank posted round c+1, so waiting for "at least" is exact.
A piece is read, and a registered (or in a kernel round any) result written by the others, only
between 2c-1 and 2c, and
every rank waits for 2c before it returns. Where the ranks span nodes, or for CuPy buffers, or
where ``/dev/shm`` cannot back the window, it is the ring (:mod:`.ring`), the bandwidth-optimal
all-reduce between nodes too, moving what this one moves.
"""

import dataclasses
import itertools
import math

import numpy as np

from . import ring
from ..runtime import engine
from ..runtime.layout import chunk_offsets
from ..runtime.plan import two_step, two_step_all_gather, two_step_reduce_scatter
from ..runtime.copies import copy
from ..runtime.posted import ROUND_MESSAGES, all_to_all, on_window, over_boxes
from ..settings import setting
from ..runtime.transports import kernel_copy
from ..runtime.transports.boxes import Boxes, wait_all
from ..runtime.transports.registered import decode, encode
from ..runtime.transports.shm_window import LINE

SOURCE, RESULT, WHOLE = 1, 2, 3  # header words after the counter: where the piece and the result lie
# (0: in the box), and whether both of this rank's vectors are registered to their ends
SEND, RECV = 4, 5  # for a kernel round: the addresses of this rank's piece and result


class TwoShotWindow(Boxes):
    """The node's boxes for two-shot all-reduce (:class:`.transports.boxes.Boxes`): per rank two,
    each a line of counter and labels and a buffer of ``ALLREDUCE_TWOSHOT_BYTES``."""

    def __init__(self, comm):
        super().__init__(comm, "twoshot", "ALLREDUCE_TWOSHOT_BYTES", "ring", words=6, offset=LINE)
        self.pids = None  # the ranks' process ids, where kernel rounds run
        if self.usable and self.size > 1:
            through_boxes = "copies vectors over one box through its boxes"
            if setting("ALLREDUCE_KERNEL_COPY") == "0":
                self.detail = f"{through_boxes} (ALLREDUCE_KERNEL_COPY=0)"
            else:
                self.pids, why = kernel_copy.usable(comm)
                self.detail = f"{through_boxes}: {why}" if why else None

    def round_for(self, dtype, count):
        """``round(piece, out, coll, whole=False)`` for pieces of ``count`` elements of ``dtype``
        (module docstring); it returns whether every rank said ``whole``. Over one box, only for
        pieces that every rank's labels place (kept apart from the pieces of a box, which
        :func:`.posted.over_boxes` finds by shape)."""
        shape = (dtype, count) if count * dtype.itemsize <= self.capacity else (dtype, count, "registered")
        return self.kept(shape, lambda: _round(self, dtype, count))

    def kernel_round_for(self, dtype, count, collective="allreduce"):
        """``round(piece, out, coll)``: a whole vector in one round of kernel copies (module
        docstring), of ``collective`` (for its halves, :func:`_kernel_round`); only where
        :attr:`pids` says the kernel allows them on every rank."""
        return self.kept((dtype, count, "kernel", collective), lambda: _kernel_round(self, dtype, count, collective))

    def half_round_for(self, dtype, sizes, collective):
        """``round(vector, starts, out, coll)``: a round of ``collective`` ("reduce_scatter" or
        "all_gather") through the boxes on pieces of ``sizes`` elements (one a rank) of ``dtype``
        (:func:`_half_round`)."""
        return self.kept((dtype, sizes, collective), lambda: _half_round(self, dtype, sizes, collective))


def in_pieces(boxes, sendbuf, recvbuf, coll):
    """A vector over one box: one round of kernel copies where the kernel allows them on every
    rank; otherwise in pieces of a box, each a round, until every rank has said in a round's
    header that both its vectors are registered (``whole``); then the rest in one round."""
    if boxes.pids is not None:
        boxes.kernel_round_for(sendbuf.dtype, sendbuf.size)(sendbuf, recvbuf, coll)
        return
    registry = coll.private.resources.get("registered")
    whole = bool(registry is not None and registry.windows and _label(registry, sendbuf) and _label(registry, recvbuf))
    step, size, lo, everyone = boxes.capacity // sendbuf.itemsize, sendbuf.size, 0, False
    while lo < size:
        hi = size if everyone else min(lo + step, size)
        everyone = boxes.round_for(sendbuf.dtype, hi - lo)(sendbuf[lo:hi], recvbuf[lo:hi], coll, whole)
        lo = hi


def _label(registry, vector):
    """Where ``vector`` lies in registered memory (:func:`.transports.registered.encode`), or 0."""
    found = registry.locate(vector.view(np.uint8))
    return 0 if found is None else encode(*found)


def _registered(registry, label, rank, lo, hi, dtype):
    """Elements lo..hi of the vector at ``label`` in rank ``rank``'s registered memory."""
    index, start = decode(label)
    return registry.view(index, rank, start + lo * dtype.itemsize, (hi - lo) * dtype.itemsize).view(dtype)


def _in_rank_order(combine, sources, out, spare, early):
    """``out`` = sources[0] op sources[1] op ... in rank order; the combinations flagged in
    ``early`` (one a source after the first) go to ``spare`` instead: in place, those before this
    rank's own source, which ``out`` overwrites, is read."""
    acc = sources[0]
    for source, first in zip(sources[1:], early):
        target = spare if first else out
        combine(acc, source, target)
        acc = target


def _round(boxes, dtype, count):
    """:meth:`TwoShotWindow.round_for`, its views of the boxes found once (none over one box)."""
    n, me, copyto, may_share_memory, sync = boxes.size, boxes.me, copy, np.may_share_memory, boxes.sync
    cuts = chunk_offsets(count, n)
    lo, hi = cuts[me], cuts[me + 1]
    mine = slice(lo, hi)
    boxed = count * dtype.itemsize <= boxes.capacity
    views = boxes.typed(dtype, count) if boxed else ((None,) * n,) * 2
    # by box: (where in this rank's box, what of the piece) for the others' slices of the piece
    posts = tuple(tuple((views[which][me][part], part) for part in (slice(0, lo), slice(hi, count))
                        if boxed and part.stop > part.start) for which in (0, 1))
    reads = tuple(tuple(v[mine] if boxed else None for v in views[which]) for which in (0, 1))
    publish = reads[0][me], reads[1][me]  # where it publishes its slice: its own box's
    # in place, whether combining rank k (1..N-1) goes to a partial sum (its box's slice, or
    # scratch over one box) rather than its result: until its own slice is read, as the result
    # overwrites it; out of place, never
    partial = tuple(k < me for k in range(1, n))
    out_of_place = (False,) * (n - 1)
    pulls = tuple(tuple((slice(cuts[j], cuts[j + 1]), views[which][j][cuts[j]:cuts[j + 1]] if boxed else None)
                        for j in range(n) if j != me) for which in (0, 1))  # the others' slices in their boxes
    headers, own, peers, calls_made = boxes.headers, boxes.mine, boxes.others, boxes.calls

    def one_round(piece, out, coll, whole=False):
        calls = calls_made[0] = calls_made[0] + 1
        which = calls & 1
        header, others = own[which], peers[which]
        registry = coll.private.resources.get("registered")
        # labels only while some vector is registered (alike on every rank: registering is collective)
        labelled = registry is not None and registry.windows
        source = result = 0
        if labelled:
            source, result = _label(registry, piece), _label(registry, out)
            header[SOURCE], header[RESULT], header[WHOLE] = source, result, whole
        if not source:
            for box, part in posts[which]:
                copyto(box, piece[part])
        if sync is not None:
            sync()  # the data and labels before the counter
        header[0] = 2 * calls - 1
        wait_all(others, 2 * calls - 1)
        if sync is not None:
            sync()  # the counters before the data
        # this rank's slice of every rank's piece, reduced in rank order
        sources = list(reads[which])
        sources[me] = piece[mine]
        every, everyone, boxing = headers[which], False, True
        if labelled:
            everyone = all(h[WHOLE] for h in every)
            boxing = not all(h[RESULT] for j, h in enumerate(every) if j != me)  # someone's result is plain
            for j, h in enumerate(every):
                if h[SOURCE] and j != me:
                    sources[j] = _registered(registry, h[SOURCE], j, lo, hi, dtype)
        combine, result_slice = coll.combine, out[mine]
        targets = partial if me > 1 and may_share_memory(piece, out) else out_of_place
        scratch = publish[which] if boxed else coll.scratch(dtype, hi - lo, "twoshot")
        _in_rank_order(combine, sources, result_slice, scratch, targets)
        if labelled:  # into every registered result straight from the cache
            for j, h in enumerate(every):
                if h[RESULT] and j != me:
                    copyto(_registered(registry, h[RESULT], j, lo, hi, dtype), result_slice)
        if boxing:
            copyto(publish[which], result_slice)
        if sync is not None:
            sync()  # the reduced slice before the counter
        header[0] = 2 * calls
        wait_all(others, 2 * calls)
        if sync is not None:
            sync()  # the counters before the slices
        if not result:  # a plain result: the others' slices from their boxes
            for where, view in pulls[which]:
                copyto(out[where], view)
        return everyone
    return one_round


def _kernel_round(boxes, dtype, count, collective="allreduce"):
    """:meth:`TwoShotWindow.kernel_round_for`: each rank posts the addresses of its piece and
    result (and where they lie in registered memory) and raises its counter (2c-1); then, chunk
    by chunk of its slice, reads the others' chunks (through the kernel, or where a registered
    one lies), reduces them in rank order into its result and writes the sum into every other
    rank's result likewise; raises its counter again (2c) and waits for everyone's. A rank's
    result slice j is written by rank j alone, after rank j read that chunk of it (in place, it
    is the piece), and nobody touches another's memory after 2c.

    Its halves: the reduce-scatter stops after the reduce, its result only this rank's slice
    (``out`` as long as that slice); the all-gather reduces nothing and writes its own slice of
    ``out`` (the whole vector, ``piece`` itself) into every other rank's."""
    n, me, pids, sync = boxes.size, boxes.me, boxes.pids, boxes.sync
    cuts = chunk_offsets(count, n)
    lo, hi = cuts[me], cuts[me + 1]
    step = max(1, boxes.capacity // dtype.itemsize)  # a box's worth from each rank, then reduced
    chunks = tuple((a, min(a + step, hi)) for a in range(lo, hi, step))
    others = tuple(j for j in range(n) if j != me)
    headers, own, peers, calls_made, itemsize = boxes.headers, boxes.mine, boxes.others, boxes.calls, dtype.itemsize
    reducing, writing = collective != "all_gather", collective != "reduce_scatter"
    shift = lo if collective == "reduce_scatter" else 0  # where this rank's slice lies in out

    def one_round(piece, out, coll, whole=False):
        calls = calls_made[0] = calls_made[0] + 1
        which = calls & 1
        header, every = own[which], headers[which]
        header[SEND], header[RECV] = piece.ctypes.data, out.ctypes.data
        registry = coll.private.resources.get("registered")
        labelled = registry is not None and registry.windows  # alike on every rank
        if labelled:
            header[SOURCE], header[RESULT] = _label(registry, piece), _label(registry, out)
        if sync is not None:
            sync()
        header[0] = 2 * calls - 1
        wait_all(peers[which], 2 * calls - 1)
        if sync is not None:
            sync()
        # per rank: its piece's and its result's label in registered memory (0: plain), and addresses
        sources = [(every[j][SOURCE] if labelled else 0, every[j][SEND]) for j in range(n)]
        results = [(every[j][RESULT] if labelled else 0, every[j][RECV]) for j in others] if writing else ()
        combine, in_place = coll.combine, np.may_share_memory(piece, out)
        fetched = coll.scratch(dtype, n * step, "twoshot-kernel") if reducing else None
        for a, b in chunks:
            size = b - a
            target = out[a - shift:b - shift]
            if reducing:
                chunk = []
                for j, (label, address) in enumerate(sources):
                    if j == me:
                        mine = piece[a:b]
                        if in_place and me > 0:  # its result overwrites it before its turn
                            mine = fetched[j * step:j * step + size]
                            copy(mine, piece[a:b])
                        chunk.append(mine)
                    elif label:  # read where it lies
                        chunk.append(_registered(registry, label, j, a, b, dtype))
                    else:
                        into = fetched[j * step:j * step + size]
                        kernel_copy.read(pids[j], address + a * itemsize, into)
                        chunk.append(into)
                combine(chunk[0], chunk[1], target)
                for source in chunk[2:]:
                    combine(target, source, target)
            for j, (label, address) in zip(others, results):
                if label:
                    copy(_registered(registry, label, j, a, b, dtype), target)
                else:
                    kernel_copy.write(pids[j], address + a * itemsize, target)
        if sync is not None:
            sync()
        header[0] = 2 * calls
        wait_all(peers[which], 2 * calls)
        return False
    return one_round


def _half_round(boxes, dtype, sizes, collective):
    """:meth:`TwoShotWindow.half_round_for`: ``round(vector, starts, out, coll)`` on the pieces
    ``vector[starts[j]:starts[j] + sizes[j]]``, one a rank, as the all-reduce's round (its counter
    2c-1 once posted, 2c once done):

    * reduce-scatter: each rank posts the others' pieces into its box, end to end, and reduces
      its own from every box (or where a registered vector lies) in rank order into ``out``;
    * all-gather: each rank posts its own piece at the start of its box and copies the others'
      from their boxes (or registered vectors) into ``vector``.

    Nobody reads a box of round c after raising 2c, and a box is written again in round c+2,
    after its writer saw every counter at 2(c+1)-1, so a rank waits for everyone's 2c only where
    the others read its vector where it lies (registered), before giving it back."""
    n, me, copyto, sync = boxes.size, boxes.me, copy, boxes.sync
    reducing = collective == "reduce_scatter"
    at = (0, *itertools.accumulate(sizes)) if reducing else (0,) * (n + 1)  # where each piece lies in a box
    views = boxes.typed(dtype, at[-1] if reducing else max(sizes))
    # box[which][j][k]: where rank j's box ``which`` holds piece k
    box = tuple(tuple(tuple(views[which][j][at[k]:at[k] + sizes[k]] for k in range(n)) for j in range(n))
                for which in (0, 1))
    if reducing:  # (where in this rank's box, whose piece) posted; where every box holds this rank's
        posts = tuple(tuple((box[which][me][k], k) for k in range(n) if k != me and sizes[k]) for which in (0, 1))
        reads = tuple(tuple(box[which][j][me] for j in range(n)) for which in (0, 1))
    else:
        posts = tuple((((box[which][me][me], me),) if sizes[me] else ()) for which in (0, 1))
        reads = tuple(tuple((j, box[which][j][j]) for j in range(n) if j != me and sizes[j]) for which in (0, 1))
    size = sizes[me]
    headers, own, peers, calls_made = boxes.headers, boxes.mine, boxes.others, boxes.calls

    def one_round(vector, starts, out, coll):
        calls = calls_made[0] = calls_made[0] + 1
        which = calls & 1
        header = own[which]
        registry = coll.private.resources.get("registered")
        labelled = registry is not None and registry.windows  # alike on every rank
        source = 0
        if labelled:
            source = header[SOURCE] = _label(registry, vector)
        if not source:
            for where, k in posts[which]:
                copyto(where, vector[starts[k]:starts[k] + sizes[k]])
        if sync is not None:
            sync()  # the data and labels before the counter
        header[0] = 2 * calls - 1
        wait_all(peers[which], 2 * calls - 1)
        if sync is not None:
            sync()  # the counters before the data
        every = headers[which]
        if reducing:
            lo = starts[me]
            sources = list(reads[which])
            sources[me] = vector[lo:lo + size]
            if labelled:
                for j, h in enumerate(every):
                    if h[SOURCE] and j != me:
                        sources[j] = _registered(registry, h[SOURCE], j, lo, lo + size, dtype)
            in_place = me > 1 and np.may_share_memory(vector, out)
            early = tuple(in_place and k < me for k in range(1, n))
            _in_rank_order(coll.combine, sources, out, coll.scratch(dtype, size, "twoshot") if in_place else None,
                           early)
        else:
            for j, view in reads[which]:
                label = every[j][SOURCE] if labelled else 0
                lo = starts[j]
                copyto(vector[lo:lo + sizes[j]], _registered(registry, label, j, lo, lo + sizes[j], dtype)
                       if label else view)
        if sync is not None:
            sync()  # the reads before the counter
        header[0] = 2 * calls
        if source:
            wait_all(peers[which], 2 * calls)
    return one_round


def _rounds_of(boxes, count, itemsize, collective):
    """The rounds of a half through the boxes: ``[(starts, sizes)]``, round k on piece k of every
    chunk (of :func:`.layout.chunk_offsets`), as few rounds as fit a box: the others' N-1 pieces
    for a reduce-scatter (one round if the whole vector fits), one piece for an all-gather."""
    offsets = chunk_offsets(count, boxes.size)
    room = boxes.capacity // itemsize
    longest = offsets[1] - offsets[0]
    if collective == "all_gather":
        parts = max(1, -(-longest // room))
    else:
        parts = 1 if count <= room else -(-longest // (room // boxes.size))
    rounds = []
    for j in range(parts):
        pieces = ring._pieces(offsets, parts, j)
        rounds.append((tuple(lo for lo, _ in pieces), tuple(hi - lo for lo, hi in pieces)))
    return rounds


def reduce_scatter_on(boxes, coll, src, partial, result):
    """The first shot alone: each rank reduces its chunk from every rank's vector in rank order
    straight into ``result``, through the kernel in one round over one box (where the kernel
    allows it), else through the boxes, piece k of every chunk a round (``partial`` unused).
    Where a box cannot hold a piece of every rank (a few bytes a box), the ring's."""
    if src.nbytes > boxes.capacity and boxes.pids is not None:
        boxes.kernel_round_for(src.dtype, src.size, "reduce_scatter")(src, result, coll)
        return
    if src.nbytes > boxes.capacity and boxes.capacity // src.itemsize < boxes.size:
        ring.reduce_scatter(coll, src, partial, result)
        return
    own = chunk_offsets(src.size, boxes.size)[boxes.me]
    for starts, sizes in _rounds_of(boxes, src.size, src.itemsize, "reduce_scatter"):
        lo = starts[boxes.me] - own
        boxes.half_round_for(src.dtype, sizes, "reduce_scatter")(src, starts, result[lo:lo + sizes[boxes.me]], coll)


def all_gather_on(boxes, coll, whole):
    """The second shot alone: each rank posts its chunk and copies the others', through the
    kernel in one round over one box (each rank writing its chunk into every other's vector,
    where the kernel allows it), else through the boxes, piece k of every chunk a round."""
    if whole.nbytes > boxes.capacity and boxes.pids is not None:
        boxes.kernel_round_for(whole.dtype, whole.size, "all_gather")(whole, whole, coll)
        return
    for starts, sizes in _rounds_of(boxes, whole.size, whole.itemsize, "all_gather"):
        boxes.half_round_for(whole.dtype, sizes, "all_gather")(whole, starts, None, coll)


def _rounds(model, m, phases):
    """ceil(M/C) rounds of ``phases`` phases each, every rank reading an M/(N ceil(M/C)) slice from
    every other at once (:func:`.posted.all_to_all`), a phase starting in half a message's time."""
    rounds = max(1, math.ceil(m / setting("ALLREDUCE_TWOSHOT_BYTES")))
    return [(phases * rounds, "phase", all_to_all(model).time(m / (model.n * rounds), ROUND_MESSAGES))]


def schedule(model, m):
    """On one node, ceil(M/C) rounds (C the two-shot buffer), each two phases of every rank
    reading an M/(N ceil(M/C)) slice from every other at once, a phase starting in half a
    message's time (a counter in shared memory, no message): 2 ceil(M/C)(alpha/2 + C/(N beta))
    where the reads share nothing but their links, 2(N-1)/N M/beta where each rank's memory takes
    its reads one after another; across nodes, the ring."""
    if len(model.network.node_ranks()) > 1:
        return ring.schedule(model, m)
    return _rounds(model, m, 2)


def half_schedule(model, m):
    """On one node, one shot: ceil(M/C) phases (C the two-shot buffer, M the whole vector) of
    every rank reading an M/(N ceil(M/C)) slice from every other at once, each starting in half a
    message's time (a counter in shared memory): ceil(M/C)(alpha/2 + C/(N beta)) where the reads
    share nothing but their links, ceil(M/C) alpha/2 + (N-1)/N M/beta where each rank's memory
    takes its reads one after another; across nodes, the ring's half."""
    if len(model.network.node_ranks()) > 1:
        return ring.half_schedule(model, m)
    return _rounds(model, m, 1)


def reduce_scatter_steps(size, rank, count, itemsize, partial="scratch"):
    """The first shot as a plan (:func:`..runtime.plan.two_step_reduce_scatter`; it keeps no
    partial sums, so ``partial`` is not used), which the compiled engine runs up to its threshold."""
    return two_step_reduce_scatter(size, rank, count)


def all_gather_steps(size, rank, count, itemsize):
    """The second shot as a plan (:func:`..runtime.plan.two_step_all_gather`)."""
    return two_step_all_gather(size, rank, count)


planned_reduce_scatter = engine.planned_reduce_scatter(reduce_scatter_steps, """``planned_reduce_scatter(coll, src,
    partial, result)``: the first shot's plan on the engine (:func:`reduce_scatter_steps`).""")

planned_all_gather = engine.planned_all_gather(all_gather_steps, """``planned_all_gather(coll, whole)``: the second
    shot's plan on the engine (:func:`all_gather_steps`).""")


def steps(size, rank, count, itemsize):
    """Its plan (:mod:`..runtime.plan`), which the compiled engine runs up to its threshold:
    :func:`..runtime.plan.two_step`, each rank's chunk reduced by it in rank order from the
    others' pieces sent through the engine's channels, then sent to every other rank (the
    rounds' arithmetic, the same bits)."""
    return two_step(size, rank, count)


ALGORITHM = dataclasses.replace(
    over_boxes("twoshot", TwoShotWindow, ring.ALGORITHM, schedule, in_pieces, steps=steps),
    reduce_scatter=on_window("twoshot", TwoShotWindow, reduce_scatter_on, ring.reduce_scatter, planned_reduce_scatter),
    all_gather=on_window("twoshot", TwoShotWindow, all_gather_on, ring.all_gather, planned_all_gather),
    reduce_scatter_schedule=half_schedule, all_gather_schedule=half_schedule)
