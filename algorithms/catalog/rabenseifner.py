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

from ..runtime import engine
from ..algorithm import Algorithm
from ..runtime.layout import chunk_offsets, segment_offsets
from ..runtime.plan import copy, irecv, isend, recv, recv_reduce, send, sendrecv, sendrecv_reduce, start_in, wait
from ..settings import setting


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


def _at(vector, piece):
    """The plan's slice of ``piece`` (a slice of the whole vector's elements) in ``vector``, a
    ``(name, base)`` whose element i is the whole vector's element base + i."""
    name, base = vector
    return name, piece.start - base, piece.stop - base


def _halving(rounds, current, out):
    """One halving step's plan, piece by piece: the k-1 parts sent and those received reduced
    into this core's part of ``current``, written to ``out`` (both ``(name, base)``). Radix 2: one
    reducing exchange a piece; else every part sent at once, those received reduced in round
    order, each as it arrives (straight from its slot within a node)."""
    plan = []
    for j in range(len(rounds[0][2])):
        if len(rounds) == 1:
            outs, dest, intos, source = rounds[0]
            plan.append(sendrecv_reduce(dest, _at(current, outs[j]), source, _at(current, intos[j]),
                                        _at(out, intos[j])))
            continue
        plan += [isend(dest, _at(current, outs[j]), t) for t, (outs, dest, _, _) in enumerate(rounds)]
        acc, target = _at(current, rounds[0][2][j]), _at(out, rounds[0][2][j])
        for _, _, _, source in rounds:
            plan.append(recv_reduce(source, acc, target))
            acc = target
        plan.append(wait(*range(len(rounds))))
    return plan


def _doubling(rounds, whole):
    """One doubling step's plan on ``whole`` (a vector's name), piece by piece: radix 2 one exchange
    a piece; else the k-1 receives and sends posted at once, then waited for."""
    plan, k = [], len(rounds)
    for j in range(len(rounds[0][0])):
        if k == 1:
            outs, dest, intos, source = rounds[0]
            plan.append(sendrecv(dest, _at((whole, 0), outs[j]), source, _at((whole, 0), intos[j])))
            continue
        plan += [irecv(source, _at((whole, 0), intos[j]), t) for t, (_, _, intos, source) in enumerate(rounds)]
        plan += [isend(dest, _at((whole, 0), outs[j]), k + t) for t, (outs, dest, _, _) in enumerate(rounds)]
        plan.append(wait(*range(2 * k)))
    return plan


def _segments(count, itemsize):
    cuts = segment_offsets(count, itemsize)
    return [slice(lo, hi) for lo, hi in zip(cuts, cuts[1:])]


def _fold_in(members, current, out, segments):
    """A core's fold in: each member's vector, segment by segment, reduced into ``current``
    (written to ``out``)."""
    plan = []
    for member in members:
        plan += [recv_reduce(member, _at(current, seg), _at(out, seg)) for seg in segments]
        current = out
    return plan


def allreduce_steps(size, rank, count, itemsize):
    """This rank's plan (:mod:`.plan`) of the all-reduce: a member sends its vector to its core in
    segments and receives the result; a core reduces its members' vectors in, runs the m halving
    steps (:func:`_halving`), the m doubling steps in reverse (:func:`_doubling`), and sends each
    member the result. Its partial sums are its input until it first reduces, then the output."""
    if size == 1:
        return (start_in(count),)
    core, members, rounds = _plan(count, itemsize, size, radix(size), rank, steps)
    segments = _segments(count, itemsize)
    if core is not None:
        return (*(send(core, _at(("input", 0), seg)) for seg in segments), recv(core, ("output", 0, count)))
    plan = _fold_in(members, ("input", 0), ("output", 0), segments)
    current = ("output", 0) if members else ("input", 0)
    for reduce_rounds, _ in rounds:
        plan += _halving(reduce_rounds, current, ("output", 0))
        current = ("output", 0)
    for _, gather_rounds in reversed(rounds):
        plan += _doubling(gather_rounds, "output")
    plan += [send(member, ("output", 0, count)) for member in members]
    return tuple(plan)


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype``: :func:`allreduce_steps`."""
    return engine.bound(coll, allreduce_steps, count, dtype)


def allreduce(coll, sendbuf, recvbuf):
    engine.run(coll, allreduce_steps, sendbuf, recvbuf)


def reduce_scatter_steps(size, rank, count, itemsize, partial="scratch"):
    """This rank's plan of the reduce-scatter, recursive halving cut at group boundaries
    (:func:`group_steps`): the members' vectors reduced into their cores, the m halving steps,
    then each core sends each member its chunk. A member sends its vector and receives its chunk
    (``"output"``). A core's partial sums go to ``partial``: ``"input"`` (in place) or
    ``"partial"`` (whole-length vectors), or ``"scratch"``, whole-length on a core with members,
    else as long as the part its first step keeps; a core without members reduces its last step
    straight into ``"output"``."""
    offsets = chunk_offsets(count, size)
    own = slice(offsets[rank], offsets[rank + 1])
    if size == 1:
        return (start_in(count),)
    core, members, rounds = _plan(count, itemsize, size, radix(size), rank, group_steps)
    segments = _segments(count, itemsize)
    if core is not None:
        return (*(send(core, _at(("input", 0), seg)) for seg in segments), recv(core, _at(("output", own.start), own)))
    kept = rounds[0][0][0][2][0].start if rounds else 0  # where the part the first step keeps starts
    store = (partial, 0) if partial != "scratch" or members else ("scratch", kept)
    plan = _fold_in(members, ("input", 0), store, segments)
    current = store if members else ("input", 0)
    for s, (reduce_rounds, _) in enumerate(rounds):
        last = s == len(rounds) - 1
        plan += _halving(reduce_rounds, current, ("output", own.start) if last and not members else store)
        current = store
    if members:
        offsets_of = [slice(offsets[m], offsets[m + 1]) for m in members]
        plan += [send(member, _at(store, chunk)) for member, chunk in zip(members, offsets_of)]
        plan.append(copy(_at(store, own), _at(("output", own.start), own)))
    return tuple(plan)


def all_gather_steps(size, rank, count, itemsize):
    """This rank's plan of the all-gather in place on ``"output"``: recursive doubling over the
    cores, the steps of :func:`group_steps` in reverse; the members' chunks gathered into their
    cores first, the whole vector sent to each member last."""
    if size == 1:
        return ()
    offsets = chunk_offsets(count, size)
    core, members, rounds = _plan(count, itemsize, size, radix(size), rank, group_steps)
    if core is not None:
        return (send(core, ("output", offsets[rank], offsets[rank + 1])), recv(core, ("output", 0, count)))
    plan = [recv(member, ("output", offsets[member], offsets[member + 1])) for member in members]
    for _, gather_rounds in reversed(rounds):
        plan += _doubling(gather_rounds, "output")
    plan += [send(member, ("output", 0, count)) for member in members]
    return tuple(plan)


reduce_scatter = engine.planned_reduce_scatter(reduce_scatter_steps, """``reduce_scatter(coll, src, partial,
    result)``: :func:`reduce_scatter_steps`, the partial sums in ``partial`` (``src`` itself in place), or
    in scratch when it is None.""")

all_gather = engine.planned_all_gather(all_gather_steps, """``all_gather(coll, whole)``: :func:`all_gather_steps`
    on ``whole``.""")


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
