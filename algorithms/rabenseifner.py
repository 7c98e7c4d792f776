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

``ALLREDUCE_RADIX`` sets k (default 2; agreed on by every rank); a radix above N runs as N
(one step: each core exchanges a 1/N slice with every other). Parts move in pipeline segments
(:func:`.layout.segment_offsets`), so the workspace is k-1 segments.
"""

import functools

import numpy as np

from .algorithm import Algorithm
from .layout import chunk_offsets, segment_offsets
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


def _pieces(parts, itemsize):
    """Each part's pipeline pieces as slices, the same number for every part (that of the
    largest), so that the j-th piece sent matches the j-th piece received."""
    count = len(segment_offsets(parts[0][1] - parts[0][0], itemsize)) - 1
    return tuple(tuple(slice(lo + a, lo + b) for a, b in zip(cuts, cuts[1:]))
                 for lo, hi in parts for cuts in [chunk_offsets(hi - lo, count)])


@functools.lru_cache(maxsize=256)
def _plan(count, itemsize, n, k, rank):
    """What ``rank`` does, made once per shape: ``(core_rank, members, rounds)``: the core it
    sends to and gets the result from (None for a core), the members a core reduces in (by
    rank), and per step ``(reduce_rounds, gather_rounds)``, each round
    ``(send slices, dest, recv slices, source)`` over the same pieces."""
    p, core_ranks, groups = cores(n, k)
    group = int(np.searchsorted(groups, rank, side="right")) - 1
    if rank != core_ranks[group]:
        return core_ranks[group], (), ()
    members = tuple(range(groups[group], rank))
    plan = []
    for _, digit, parts, peers in steps(count, n, k, group):
        pieces = _pieces(parts, itemsize)
        reduce_rounds, gather_rounds = [], []
        for t in range(1, k):
            to, frm = (digit + t) % k, (digit - t) % k
            reduce_rounds.append((pieces[to], core_ranks[peers[to]], pieces[digit], core_ranks[peers[frm]]))
            gather_rounds.append((pieces[digit], core_ranks[peers[to]], pieces[frm], core_ranks[peers[frm]]))
        plan.append((tuple(reduce_rounds), tuple(gather_rounds)))
    return None, members, tuple(plan)


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype``."""
    n = coll.size
    if n == 1:
        return coll.start_in
    k = radix(n)
    core, members, plan = _plan(count, dtype.itemsize, n, k, coll.rank)
    send, recv, recv_combine, combine = coll.send, coll.recv, coll.recv_combine, coll.combine
    segments = segment_offsets(count, dtype.itemsize)
    if core is not None:
        def run_member(sendbuf, recvbuf):
            for lo, hi in zip(segments, segments[1:]):
                send(sendbuf[lo:hi], core)
            recv(recvbuf, core)
        return run_member
    isend, irecv = coll.isend, coll.irecv

    def exchanges(rounds, reducing):
        """Radix 2 (one round a step): the step's exchange of each piece, bound once here."""
        if len(rounds) > 1:
            return None
        outs, dest, intos, source = rounds[0]
        return tuple(coll.exchange(dtype, out.stop - out.start, dest, into.stop - into.start, source, reducing)
                     for out, into in zip(outs, intos))

    bound = tuple((exchanges(reduce_rounds, True), exchanges(gather_rounds, False)) for reduce_rounds, gather_rounds in plan)

    def reduce_step(rounds, paired, current, recvbuf):
        """The k-1 rounds of one halving step, piece by piece: its bound exchanges (``paired``)
        where k = 2, else every receive and send posted at once and the parts reduced in round order."""
        if paired is not None:
            outs, _, intos, _ = rounds[0]
            for exchange, out, into in zip(paired, outs, intos):
                exchange(current[out], current[into], recvbuf[into])
            return
        for j, into in enumerate(rounds[0][2]):
            incoming = [coll.scratch(dtype, into.stop - into.start, f"rabenseifner-{t}") for t in range(len(rounds))]
            receives = [irecv(buf, source) for buf, (_, _, _, source) in zip(incoming, rounds)]
            sends = [isend(current[outs[j]], dest) for outs, dest, _, _ in rounds]
            acc = current[into]
            for buf, request in zip(incoming, receives):
                request.Wait()
                combine(acc, buf, recvbuf[into])
                acc = recvbuf[into]
            for request in sends:
                request.Wait()

    def gather_step(rounds, paired, recvbuf):
        """The k-1 rounds of one doubling step, piece by piece, as :func:`reduce_step`."""
        if paired is not None:
            outs, _, intos, _ = rounds[0]
            for exchange, out, into in zip(paired, outs, intos):
                exchange(recvbuf[out], recvbuf[into])
            return
        for j in range(len(rounds[0][0])):
            requests = [irecv(recvbuf[intos[j]], source) for _, _, intos, source in rounds]
            requests += [isend(recvbuf[outs[j]], dest) for outs, dest, _, _ in rounds]
            for request in requests:
                request.Wait()

    def run(sendbuf, recvbuf):
        current = sendbuf
        for member in members:
            for lo, hi in zip(segments, segments[1:]):
                recv_combine(current[lo:hi], member, recvbuf[lo:hi])
            current = recvbuf
        for (reduce_rounds, _), (paired, _) in zip(plan, bound):
            reduce_step(reduce_rounds, paired, current, recvbuf)
            current = recvbuf
        for (_, gather_rounds), (_, paired) in zip(reversed(plan), reversed(bound)):
            gather_step(gather_rounds, paired, recvbuf)
        for member in members:
            send(recvbuf, member)
    return run


def allreduce(coll, sendbuf, recvbuf):
    coll.plan(bind, recvbuf.size, recvbuf.dtype)(sendbuf, recvbuf)




def schedule(model, m):
    """The fold in, m halving steps, m doubling steps and the fold out, each step a phase in
    which every core sends M/k^(s+1) to each of its k-1 peers at once:
    2 log_k(p) (alpha + (k-1) M/(k^(s+1) beta) summed) on uniform links."""
    n = model.n
    k = radix(n)
    p, core_ranks, groups = cores(n, k)
    core_ranks = np.array(core_ranks)
    parts = []
    members = np.array([r for r in range(n) if r not in set(core_ranks.tolist())], dtype=int)
    owner = core_ranks[np.searchsorted(groups, members, side="right") - 1] if members.size else members
    if members.size:
        parts.append((1, "fold in", model.phase(("rab", k, "in"), lambda: (members, owner)).time(m)))
    v = np.arange(p)
    stride, share, halving = 1, m, []
    while stride < p:
        digit = (v // stride) % k
        src = np.repeat(v, k - 1)
        dst = np.concatenate([v + (((digit + t) % k) - digit) * stride for t in range(1, k)]).reshape(k - 1, p).T.ravel()
        share /= k
        phase = model.phase(("rab", k, stride), lambda s=src, d=dst: (core_ranks[s], core_ranks[d]))
        halving.append((f"step {stride}", phase.time(share)))
        stride *= k
    parts += [(1, f"halving {label}", t) for label, t in halving]
    parts += [(1, f"doubling {label}", t) for label, t in reversed(halving)]
    if members.size:
        parts.append((1, "fold out", model.phase(("rab", k, "out"), lambda: (owner, members)).time(m)))
    return parts


ALGORITHM = Algorithm("rabenseifner", allreduce, schedule=schedule, bind=bind)
