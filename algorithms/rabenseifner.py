"""Rabenseifner's all-reduce: a reduce-scatter by recursive halving, then an all-gather by
recursive doubling (Thakur, Rabenseifner & Gropp 2005, section 4.2; MPICH's
``reduce_scatter_allgather``, Open MPI's algorithm 6), with a radix k (MPICH's
``k_reduce_scatter_allgather``): k = 2 halves, a larger k splits in k parts per step.

With p = k^m the largest power of k not above N, the ranks form p groups of consecutive ranks
(sizes differing by at most one, the larger first: :func:`.layout.chunk_offsets`); each group's
last rank is its core, to which the others (N - p in all) first send their vectors, and from
which they get the result at the end, as :mod:`.recursive_doubling` folds in the ranks above a
power of two. The cores are numbered 0..p-1 and step s (s = 0..m-1) groups those whose
numbers differ only in base-k digit s. Reduce-scatter: in step s a core cuts the range it holds
into k parts, keeps part d (its digit s), sends part j to the peer whose digit is j and reduces
the k-1 parts it receives into its own: after m steps it holds a 1/p piece of the vector
reduced over every rank. All-gather: the steps in reverse, each core sending its range to the
k-1 peers and receiving theirs. Each piece is reduced by one rank only, so every rank ends with
the same bits. Step 0 pairs the nearest cores and moves the most, so on nodes of consecutive
ranks the largest exchanges stay within a node.

Cost on uniform links: 2m rounds of k-1 concurrent messages,
T ~ 2 log_k(p) alpha + 2 (p-1)/p M/beta (+ 2 (alpha + M/beta) for the fold when N > p):
the ring's bandwidth term with log_k p instead of N-1 start-ups.

The halves run alone (:func:`reduce_scatter`, :func:`all_gather`) keep the chunk layout of
:func:`.layout.chunk_offsets`, so they cut the vector at group boundaries instead
(:func:`group_steps`): a core's range is always a whole number of groups' chunks, and the
steps go from the farthest cores to the nearest, so that after the m halving steps core v
holds group v's chunks, reduced over every rank, and sends each member its own; the all-gather
runs them in reverse (recursive doubling, nearest first). On uniform links each takes
log_k(p) alpha + (p-1)/p M/beta where N = p, plus the fold where N > p. The reduce-scatter's
last step reduces straight into the result (on a core without members); out of place, its
earlier partial sums go to a scratch as long as the first step's kept part (whole-length on a
core with members, which reduces their vectors in first).

``ALLREDUCE_RADIX`` sets k (default 2; agreed on by every rank); a radix above N runs as N
(one step: each core exchanges a 1/N slice with every other). Parts move in pipeline segments
(:func:`.layout.segment_offsets`), so the workspace is k-1 segments.
"""

import functools

import numpy as np

from . import engine
from .algorithm import Algorithm
from .layout import chunk_offsets, segment_offsets
from .plan import copy, irecv, isend, recv, recv_reduce, send, sendrecv, sendrecv_reduce, wait
from .settings import setting


def radix(n):
    """k for ``n`` ranks: ``ALLREDUCE_RADIX``, at most n (and 2 where n < 2)."""
    return max(2, min(setting("ALLREDUCE_RADIX"), n))


def cores(n, k):
    """(p, the rank of each core): p = k^m the largest power of k <= n, core v the last
    rank of group v of ``chunk_offsets(n, p)``."""
    p = 1
    while p * k <= n:
        p *= k
    groups = chunk_offsets(n, p)
    return p, tuple(hi - 1 for hi in groups[1:]), groups


def steps(count, n, k, core):
    """Each step's (range held before it as (lo, hi), this core's digit, the k parts as
    (lo, hi), the peers' core numbers by digit) for core number ``core`` of ``count`` elements."""
    p, _, _ = cores(n, k)
    lo, hi, stride, found = 0, count, 1, []
    while stride < p:
        digit = (core // stride) % k
        cuts = chunk_offsets(hi - lo, k)
        parts = tuple((lo + a, lo + b) for a, b in zip(cuts, cuts[1:]))
        peers = tuple(core + (j - digit) * stride for j in range(k))
        found.append(((lo, hi), digit, parts, peers))
        lo, hi = parts[digit]
        stride *= k
    return found


def group_steps(count, n, k, core):
    """:func:`steps` cut at group boundaries, the farthest cores first (stride p/k down to 1):
    part j of a step is the sub-block of cores whose digit is j, and the elements of their
    groups' ranks' chunks (:func:`.layout.chunk_offsets` of ``count`` over n), so that after
    the m steps core v holds group v's chunks (Thakur, Rabenseifner & Gropp 2005, section
    4.1's recursive halving; the all-gather runs them in reverse, nearest first)."""
    p, _, groups = cores(n, k)
    offsets = chunk_offsets(count, n)
    stride, found = p // k, []
    while stride:
        digit = (core // stride) % k
        base = core - core % (stride * k)
        parts = tuple((offsets[groups[base + j * stride]], offsets[groups[base + (j + 1) * stride]])
                      for j in range(k))
        peers = tuple(core + (j - digit) * stride for j in range(k))
        found.append(((parts[0][0], parts[-1][1]), digit, parts, peers))
        stride //= k
    return found


def _pieces(parts, itemsize):
    """Each part's pipeline pieces as slices, the same number for every part (that of the
    largest), so that the j-th piece sent matches the j-th piece received."""
    count = len(segment_offsets(parts[0][1] - parts[0][0], itemsize)) - 1
    return tuple(tuple(slice(lo + a, lo + b) for a, b in zip(cuts, cuts[1:]))
                 for lo, hi in parts for cuts in [chunk_offsets(hi - lo, count)])


@functools.lru_cache(maxsize=256)
def _plan(count, itemsize, n, k, rank, cut=steps):
    """What ``rank`` does, made once per shape: ``(core_rank, members, rounds)``: the core it
    sends to and gets the result from (None for a core), the members a core reduces in (by
    rank), and per step of ``cut`` (:func:`steps` or :func:`group_steps`)
    ``(reduce_rounds, gather_rounds)``, each round ``(send slices, dest, recv slices, source)``
    over the same pieces."""
    p, core_ranks, groups = cores(n, k)
    group = int(np.searchsorted(groups, rank, side="right")) - 1
    if rank != core_ranks[group]:
        return core_ranks[group], (), ()
    members = tuple(range(groups[group], rank))
    plan = []
    for _, digit, parts, peers in cut(count, n, k, group):
        pieces = _pieces(parts, itemsize)
        reduce_rounds, gather_rounds = [], []
        for t in range(1, k):
            to, frm = (digit + t) % k, (digit - t) % k
            reduce_rounds.append((pieces[to], core_ranks[peers[to]], pieces[digit], core_ranks[peers[frm]]))
            gather_rounds.append((pieces[digit], core_ranks[peers[to]], pieces[frm], core_ranks[peers[frm]]))
        plan.append((tuple(reduce_rounds), tuple(gather_rounds)))
    return None, members, tuple(plan)


def _shifted(pieces, by):
    """``pieces`` (slices) moved ``by`` elements down: their place in a vector that starts there."""
    return tuple(slice(piece.start - by, piece.stop - by) for piece in pieces)


def _reducer(coll, dtype, rounds, read=0, write=0):
    """``reduce(current, out)``: the k-1 rounds of one halving step, piece by piece, reducing the
    parts received into this core's part of ``current`` and writing it to ``out``; element i of
    the vector is ``current[i - read]`` and ``out[i - write]`` (0, 0: both whole-length). Radix 2:
    the step's exchange of each piece, bound once (:meth:`Collective.exchange`); else every send
    posted at once, then the parts received and reduced in round order, each as it arrives
    (:meth:`Collective.recv_combine`)."""
    if len(rounds) == 1:
        outs, dest, intos, source = rounds[0]
        paired = tuple(zip(
            (coll.exchange(dtype, out.stop - out.start, dest, into.stop - into.start, source, True)
             for out, into in zip(outs, intos)), _shifted(outs, read), _shifted(intos, read), _shifted(intos, write)))

        def reduce(current, out):
            for exchange, sent, into, target in paired:
                exchange(current[sent], current[into], out[target])
        return reduce
    isend, recv_combine = coll.isend, coll.recv_combine
    rounds = tuple((_shifted(outs, read), dest, intos, source) for outs, dest, intos, source in rounds)
    kept, targets = _shifted(rounds[0][2], read), _shifted(rounds[0][2], write)

    def reduce(current, out):
        for j in range(len(rounds[0][2])):
            sends = [isend(current[outs[j]], dest) for outs, dest, _, _ in rounds]
            acc, target = current[kept[j]], out[targets[j]]
            for _, _, _, source in rounds:  # in round order, each straight from its slot within a node
                recv_combine(acc, source, target)
                acc = target
            for request in sends:
                request.Wait()
    return reduce


def _gatherer(coll, dtype, rounds):
    """``gather(buf)``: the k-1 rounds of one doubling step, piece by piece, as :func:`_reducer`."""
    if len(rounds) == 1:
        outs, dest, intos, source = rounds[0]
        paired = tuple(zip(
            (coll.exchange(dtype, out.stop - out.start, dest, into.stop - into.start, source)
             for out, into in zip(outs, intos)), outs, intos))

        def gather(buf):
            for exchange, sent, into in paired:
                exchange(buf[sent], buf[into])
        return gather
    isend, irecv = coll.isend, coll.irecv

    def gather(buf):
        for j in range(len(rounds[0][0])):
            requests = [irecv(buf[intos[j]], source) for _, _, intos, source in rounds]
            requests += [isend(buf[outs[j]], dest) for outs, dest, _, _ in rounds]
            for request in requests:
                request.Wait()
    return gather


def _bound(coll, count, dtype, cut):
    """:func:`_plan` with each step bound (made once per shape: :meth:`Collective.plan`):
    ``(core_rank, members, steps)``, ``steps`` per step ``(reduce(current, out), gather(buf))``."""
    core, members, plan = _plan(count, dtype.itemsize, coll.size, radix(coll.size), coll.rank, cut)
    return core, members, tuple((_reducer(coll, dtype, reduce_rounds), _gatherer(coll, dtype, gather_rounds))
                                for reduce_rounds, gather_rounds in plan)


def _send_in(coll, vector, core):
    """A member's fold in: ``vector`` to its core, in pipeline segments."""
    segments = segment_offsets(vector.size, vector.itemsize)
    for lo, hi in zip(segments, segments[1:]):
        coll.send(vector[lo:hi], core)


def _fold_in(coll, members, current, out):
    """A core's fold in: each member's vector, segment by segment, reduced into ``current``
    (written to ``out``); what holds the sum after (``current`` where there are no members)."""
    segments = segment_offsets(current.size, current.itemsize)
    for member in members:
        for lo, hi in zip(segments, segments[1:]):
            coll.recv_combine(current[lo:hi], member, out[lo:hi])
        current = out
    return current


def allreduce_steps(size, rank, count, itemsize):
    """This rank's plan (:mod:`.plan`) of the all-reduce: a member sends its vector to its core in
    segments and receives the result; a core reduces its members' vectors in, runs the m halving
    steps (radix 2: one reducing exchange a piece; radix k: the k-1 parts sent at once, those
    received reduced in round order), the m doubling steps in reverse, and sends each member the
    result. Its partial sums are its input until it first reduces, then the output."""
    if size == 1:
        return (copy(("input", 0, count), ("output", 0, count)),)
    core, members, rounds = _plan(count, itemsize, size, radix(size), rank, steps)
    segments = segment_offsets(count, itemsize)
    segments = list(zip(segments, segments[1:]))
    if core is not None:
        return (*(send(core, ("input", lo, hi)) for lo, hi in segments), recv(core, ("output", 0, count)))
    plan, current = [], "input"
    for member in members:
        plan += [recv_reduce(member, (current, lo, hi), ("output", lo, hi)) for lo, hi in segments]
        current = "output"
    for reduce_rounds, _ in rounds:
        for j in range(len(reduce_rounds[0][2])):
            if len(reduce_rounds) == 1:
                outs, dest, intos, source = reduce_rounds[0]
                plan.append(sendrecv_reduce(dest, _slice(current, outs[j]), source, _slice(current, intos[j]),
                                            _slice("output", intos[j])))
                continue
            plan += [isend(dest, _slice(current, outs[j]), t) for t, (outs, dest, _, _) in enumerate(reduce_rounds)]
            acc, target = _slice(current, reduce_rounds[0][2][j]), _slice("output", reduce_rounds[0][2][j])
            for _, _, _, source in reduce_rounds:  # in round order
                plan.append(recv_reduce(source, acc, target))
                acc = target
            plan.append(wait(*range(len(reduce_rounds))))
        current = "output"
    for _, gather_rounds in reversed(rounds):
        for j in range(len(gather_rounds[0][0])):
            if len(gather_rounds) == 1:
                outs, dest, intos, source = gather_rounds[0]
                plan.append(sendrecv(dest, _slice("output", outs[j]), source, _slice("output", intos[j])))
                continue
            k = len(gather_rounds)
            plan += [irecv(source, _slice("output", intos[j]), t) for t, (_, _, intos, source) in enumerate(gather_rounds)]
            plan += [isend(dest, _slice("output", outs[j]), k + t) for t, (outs, dest, _, _) in enumerate(gather_rounds)]
            plan.append(wait(*range(2 * k)))
    plan += [send(member, ("output", 0, count)) for member in members]
    return tuple(plan)


def _slice(vector, piece):
    """A plan's slice of ``vector`` for a slice object."""
    return vector, piece.start, piece.stop


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype``: :func:`allreduce_steps`."""
    return engine.bound(coll, allreduce_steps, count, dtype)


def allreduce(coll, sendbuf, recvbuf):
    engine.run(coll, allreduce_steps, sendbuf, recvbuf)


def _scatter_bound(coll, count, dtype, in_place):
    """The reduce-scatter's steps (:func:`group_steps`), bound once per shape and placement:
    ``(core_rank, members, reducers, scratch)``, ``scratch`` the length of the vector this core's
    partial sums go to out of place (None: none). A core with members reduces them in, so its
    partial sums are whole-length (``partial``, or scratch); one without keeps them in place
    (``partial`` is ``src``) or in a scratch as long as the part its first step keeps (out of
    place), and its last step, which keeps its own chunk, reduces straight into ``result``."""
    n, rank = coll.size, coll.rank
    core, members, plan = _plan(count, dtype.itemsize, n, radix(n), rank, group_steps)
    if core is not None:
        return core, members, (), None
    keeps = [reduce_rounds[0][2] for reduce_rounds, _ in plan]
    kept, own = keeps[0][0].start, chunk_offsets(count, n)[rank]
    base = 0 if in_place or members else kept  # where the partial sums' vector starts
    scratch = None if in_place else count if members else keeps[0][-1].stop - kept if len(plan) > 1 else None
    reducers, read = [], 0
    for s, (reduce_rounds, _) in enumerate(plan):
        write = own if s == len(plan) - 1 and not members else base
        reducers.append(_reducer(coll, dtype, reduce_rounds, read, write))
        read = base
    return None, members, tuple(reducers), scratch


def reduce_scatter(coll, src, partial, result):
    """Recursive halving cut at group boundaries (:func:`group_steps`): the members' vectors
    reduced into their cores, the m halving steps, then each core sends each of its members its
    chunk. Partial sums go to ``partial``, or out of place to scratch (:func:`_scatter_bound`);
    a core without members reduces its last step straight into ``result``."""
    n, rank = coll.size, coll.rank
    if n == 1:
        coll.start_in(src, result)
        return
    core, members, reducers, scratch = coll.plan(_scatter_bound, src.size, src.dtype, partial is not None)
    if core is not None:
        _send_in(coll, src, core)
        coll.recv(result, core)
        return
    if partial is None and scratch is not None:
        partial = coll.scratch(src.dtype, scratch, "rabenseifner-partial")
    current = _fold_in(coll, members, src, partial)
    for reduce in reducers[:-1]:
        reduce(current, partial)
        current = partial
    if not members:
        reducers[-1](current, result)
        return
    reducers[-1](current, partial)
    offsets = chunk_offsets(src.size, n)
    for member in members:
        coll.send(partial[offsets[member]:offsets[member + 1]], member)
    coll.start_in(partial[offsets[rank]:offsets[rank + 1]], result)


def all_gather(coll, whole):
    """Recursive doubling over the cores, the steps of :func:`group_steps` in reverse: the
    members' chunks gathered into their cores, the m doubling steps, then each core sends each of
    its members the whole vector."""
    n, rank = coll.size, coll.rank
    if n == 1:
        return
    core, members, steps_bound = coll.plan(_bound, whole.size, whole.dtype, group_steps)
    offsets = chunk_offsets(whole.size, n)
    if core is not None:
        coll.send(whole[offsets[rank]:offsets[rank + 1]], core)
        coll.recv(whole, core)
        return
    for member in members:
        coll.recv(whole[offsets[member]:offsets[member + 1]], member)
    for _, gather in reversed(steps_bound):
        gather(whole)
    for member in members:
        coll.send(whole, member)


def _folds(model, k):
    """The fold's phases: the members to their cores and back (None, None where N = p)."""
    n = model.n
    p, core_ranks, groups = cores(n, k)
    if n == p:
        return None, None
    members = np.setdiff1d(np.arange(n), core_ranks)
    owner = np.array(core_ranks)[np.searchsorted(groups, members, side="right") - 1]
    return (model.phase(("rab", k, "in"), lambda: (members, owner)),
            model.phase(("rab", k, "out"), lambda: (owner, members)))


def _step_phase(model, k, stride):
    """One step's phase: every core sending to its k-1 peers at ``stride`` at once; and the core
    numbers of each transfer's source and destination."""
    p, core_ranks, _ = cores(model.n, k)
    core_ranks = np.array(core_ranks)
    v = np.arange(p)
    digit = (v // stride) % k
    src = np.repeat(v, k - 1)
    dst = np.concatenate([v + (((digit + t) % k) - digit) * stride for t in range(1, k)]).reshape(k - 1, p).T.ravel()
    return model.phase(("rab", k, stride), lambda: (core_ranks[src], core_ranks[dst])), src, dst


def schedule(model, m):
    """The fold in, m halving steps, m doubling steps and the fold out, each step a phase in
    which every core sends M/k^(s+1) to each of its k-1 peers at once:
    2 log_k(p) (alpha + (k-1) M/(k^(s+1) beta) summed) on uniform links."""
    k = radix(model.n)
    fold_in, fold_out = _folds(model, k)
    p = cores(model.n, k)[0]
    stride, share, halving = 1, m, []
    while stride < p:
        share /= k
        halving.append((f"step {stride}", _step_phase(model, k, stride)[0].time(share)))
        stride *= k
    parts = [(1, "fold in", fold_in.time(m))] if fold_in is not None else []
    parts += [(1, f"halving {label}", t) for label, t in halving]
    parts += [(1, f"doubling {label}", t) for label, t in reversed(halving)]
    if fold_out is not None:
        parts.append((1, "fold out", fold_out.time(m)))
    return parts


def _group_steps(model, m, k, sender):
    """The steps of :func:`group_steps` as (label, PhaseTime), farthest first: each transfer
    carries the chunks of the groups of the sub-block of cores of its ``sender`` ("src") or its
    receiver ("dst"), M/N per rank."""
    p, _, groups = cores(model.n, k)
    groups = np.asarray(groups)
    found, stride = [], p // k
    while stride:
        phase, src, dst = _step_phase(model, k, stride)
        block = (src if sender == "src" else dst) // stride * stride
        found.append((f"step {stride}", phase.time(m / model.n * (groups[block + stride] - groups[block]))))
        stride //= k
    return found


def reduce_scatter_schedule(model, m):
    """log_k(p) alpha + (p-1)/p M/beta on uniform links where N is a power of k; otherwise
    (p = k^m < N) each step's parts weigh their groups' ranks, M/N each, and the fold adds
    2 alpha + (g-1)(M + M/N)/beta, g the largest group's ranks.

    The fold in (each member's vector to its core), the halving steps, farthest first, in which
    each core sends its k-1 peers the parts they keep, at once, and the fold out (each member's
    chunk)."""
    k = radix(model.n)
    fold_in, fold_out = _folds(model, k)
    parts = [(1, "fold in", fold_in.time(m))] if fold_in is not None else []
    parts += [(1, f"halving {label}", t) for label, t in _group_steps(model, m, k, "dst")]
    if fold_out is not None:
        parts.append((1, "fold out", fold_out.time(m / model.n)))
    return parts


def all_gather_schedule(model, m):
    """log_k(p) alpha + (p-1)/p M/beta on uniform links where N is a power of k; otherwise
    (p = k^m < N) each step's parts weigh their groups' ranks, M/N each, and the fold adds
    2 alpha + (g-1)(M/N + M)/beta, g the largest group's ranks.

    The fold in (each member's chunk to its core), the doubling steps, nearest first, in which
    each core sends its range to its k-1 peers at once, and the fold out (the whole vector to
    each member)."""
    k = radix(model.n)
    fold_in, fold_out = _folds(model, k)
    parts = [(1, "fold in", fold_in.time(m / model.n))] if fold_in is not None else []
    parts += [(1, f"doubling {label}", t) for label, t in reversed(_group_steps(model, m, k, "src"))]
    if fold_out is not None:
        parts.append((1, "fold out", fold_out.time(m)))
    return parts


ALGORITHM = Algorithm("rabenseifner", allreduce, schedule=schedule, bind=bind, steps=allreduce_steps,
                      reduce_scatter=reduce_scatter,
                      all_gather=all_gather, reduce_scatter_schedule=reduce_scatter_schedule,
                      all_gather_schedule=all_gather_schedule)
