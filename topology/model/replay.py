"""A plan's time: its steps replayed on the links of a network, message by message.

A plan (``algorithms/runtime/plan.py``) is each rank's steps in order; this module knows no algorithm
and reads only the steps: each has a ``kind``, the peers ``to`` and ``source``, slices
``send``/``acc``/``into`` of ``(vector, lo, hi)`` elements, and the names ``handle``/``waits``
of nonblocking sends and receives. Each rank keeps a clock; a message of n bytes from a to b
(α, β the link's start-up time and bandwidth) starts once a's port is free, holds it n/β, and
is in b at start + α + n/β; b's port takes the messages it receives one after another (n/β
each). A receive ends when its message is in; a reducing one then spends n/γ more with the
rank's memory rate γ where the network gives one. A blocking exchange ends when both its
halves have, a send when its bytes have left. So the ring's 2(N-1) exchanges of M/N take
2(N-1)(α + M/(Nβ)) and a tree's steps add up level by level: the α-β closed forms.

Each step that calls the transport (a send, a receive, an exchange, a wait; not a copy or a
reduction within the rank) also costs its rank ``step_seconds`` (o) before it starts: the
engine's own time to take such a step (LogP's overhead o, Culler et al., 1993), which overlaps
no other step of the rank. An engine that runs a step in a few instructions has o near 0; one that
interprets each step in Python and calls MPI for it pays a microsecond or more, so that a plan
of more steps on the same chain of messages (the double tree's isend, receive and wait against
the ring's one exchange) costs more.

The replay is also strict about what a plan may rely on: a send (blocking, or waited for)
completes only once its receiver has posted the matching receive, as an MPI program that does
not count on buffering, and messages between two ranks match in the order they were posted.
A plan that waits forever under that rule raises ``ValueError`` naming the ranks and steps.
"""

import bisect
from dataclasses import dataclass

import numpy as np

_SENDS = {"isend", "send", "sendrecv", "sendrecv_reduce"}
_RECEIVES = {"recv", "recv_reduce", "sendrecv", "sendrecv_reduce"}
_REDUCES = {"recv_reduce", "irecv_reduce", "sendrecv_reduce"}
_MESSAGING = _SENDS | _RECEIVES | {"irecv", "irecv_reduce", "wait"}  # the steps that call the transport


@dataclass
class Replay:
    """``seconds``: when the last rank ends; ``steps[r]``: rank r's steps as ``(start, end)``
    in seconds; ``messages``: how many messages, ``bytes``: how many bytes crossed links."""

    seconds: float
    steps: list
    messages: int
    bytes: int


class _Message:
    __slots__ = ("start", "arrival", "left", "nbytes", "received")

    def __init__(self, start, arrival, left, nbytes):
        self.start, self.arrival, self.left, self.nbytes = start, arrival, left, nbytes
        self.received = False  # its receive is posted


def replay(ranks, itemsize, network, step_seconds=0.0, message_seconds=None):
    """Replay the plan ``ranks`` (rank r's steps: ``ranks[r]``) of elements of ``itemsize`` bytes
    on ``network`` (a :class:`.network.Network`: its links, the node of each rank and the nodes'
    ports; each rank reduces at its memory rate where the network gives one, else for nothing),
    each step that calls the transport costing its rank ``step_seconds`` before it starts. With
    ``message_seconds(nbytes)``, a message of n bytes takes that from its start to its arrival
    (a time measured for messages of that size) instead of its link's α + n/β; it still holds
    its ports n/β. Returns a :class:`Replay`; ``ValueError`` when the plan deadlocks or a step
    names a rank that is not in it."""
    if step_seconds < 0:
        raise ValueError(f"a step's cost of {step_seconds} s: it cannot be negative")
    n = len(ranks)
    if n != network.n:
        raise ValueError(f"a plan of {n} ranks on a network of {network.n}")
    bandwidth, latency = _links(n, network.link)
    node = network.nodes.tolist()
    egress, ingress = network.egress.tolist(), network.ingress.tolist()
    memory_Bps = None if network.rank_in is None else network.rank_in.tolist()
    clock = [0.0] * n
    ports_out = [[] for _ in egress]  # each node's port's busy times, out and in: sorted (start, end)
    ports_in = [[] for _ in ingress]
    pc = [0] * n
    times = [[] for _ in range(n)]
    channels = {}  # (src, dst) -> messages in posting order
    posted_recvs = {}  # (src, dst) -> receives posted so far
    handles = [{} for _ in range(n)]
    current = [None] * n  # the step under way: (its send's message, its receive's index)
    started = [None] * n  # when the step under way began (its cost o is paid from then)
    totals = [0, 0]

    def post_send(r, to, piece):
        if not 0 <= to < n:
            raise ValueError(f"rank {r} step {pc[r]}: sends to rank {to}, not in 0..{n - 1}")
        nbytes = (piece[2] - piece[1]) * itemsize
        hold = nbytes / bandwidth[r, to]
        start = clock[r]
        if node[r] != node[to] and nbytes:  # through both nodes' ports, in the first time both are free
            out, into = nbytes / egress[node[r]], nbytes / ingress[node[to]]
            start = _reserve(ports_out[node[r]], ports_in[node[to]], start, out, into)
            hold = max(hold, out, into)
        way = latency[r, to] + hold if message_seconds is None else message_seconds(nbytes)
        message = _Message(start, start + max(way, hold), start + hold, nbytes)
        queue = channels.setdefault((r, to), [])
        message.received = len(queue) < posted_recvs.get((r, to), 0)
        queue.append(message)
        totals[0] += 1
        totals[1] += nbytes
        return message

    def post_recv(r, source):
        if not 0 <= source < n:
            raise ValueError(f"rank {r} step {pc[r]}: receives from rank {source}, not in 0..{n - 1}")
        key = (source, r)
        index = posted_recvs.get(key, 0)
        posted_recvs[key] = index + 1
        queue = channels.get(key, ())
        if index < len(queue):
            queue[index].received = True
        return index

    def arrived(r, source, index, step):
        """The receive's end, or None while its message is not sent."""
        queue = channels.get((source, r), ())
        if index >= len(queue):
            return None
        message = queue[index]
        end = max(clock[r], message.arrival)
        if step.kind in _REDUCES and memory_Bps is not None:
            end += message.nbytes / memory_Bps[r]
        return end

    def attempt(r):
        """Run rank r's next step if it can end now; whether it did."""
        step = ranks[r][pc[r]]
        kind = step.kind
        if started[r] is None:  # the step begins: the engine takes o to take it, if it calls the transport
            started[r] = clock[r]
            clock[r] += step_seconds if kind in _MESSAGING else 0.0
        if kind == "isend":
            handles[r][step.handle] = post_send(r, step.to, step.send)
            return done(r, clock[r])
        if kind in ("irecv", "irecv_reduce"):
            handles[r][step.handle] = (step, post_recv(r, step.source))
            return done(r, clock[r])
        if kind == "wait":
            named = [handles[r][h] for h in step.waits]
            sent = [m for m in named if isinstance(m, _Message)]
            taken = [m for m in named if not isinstance(m, _Message)]
            if not all(m.received for m in sent) or not all(
                    index < len(channels.get((waited.source, r), ())) for waited, index in taken):
                return False
            end = max([clock[r]] + [m.left for m in sent])
            for waited, index in taken:
                end = max(end, arrived(r, waited.source, index, waited))
            return done(r, end)
        if kind in ("copy", "zero"):
            return done(r, clock[r])
        if kind == "combine":
            nbytes = (step.into[2] - step.into[1]) * itemsize
            return done(r, clock[r] + (nbytes / memory_Bps[r] if memory_Bps is not None else 0.0))
        if current[r] is None:
            message = post_send(r, step.to, step.send) if kind in _SENDS else None
            index = post_recv(r, step.source) if kind in _RECEIVES else None
            current[r] = (message, index)
        message, index = current[r]
        if message is not None and not message.received:
            return False
        end = max(clock[r], message.left) if message is not None else clock[r]
        if index is not None:
            got = arrived(r, step.source, index, step)
            if got is None:
                return False
            end = max(end, got)
        current[r] = None
        return done(r, end)

    def done(r, end):
        """Rank r's step ends at ``end``: recorded from when it began, and the next one due."""
        times[r].append((started[r], end))
        started[r] = None
        clock[r] = end
        pc[r] += 1
        return True

    while True:
        moved, unfinished = False, False
        for r in range(n):
            while pc[r] < len(ranks[r]):
                if not attempt(r):
                    unfinished = True
                    break
                moved = True
        if not unfinished:
            break
        if not moved:
            stuck = [f"rank {r} at step {pc[r]} ({ranks[r][pc[r]].kind})" for r in range(n) if pc[r] < len(ranks[r])]
            raise ValueError("the plan deadlocks: " + ", ".join(stuck))
    return Replay(max(clock, default=0.0), times, totals[0], totals[1])


def _reserve(out, into, start, hold_out, hold_in):
    """The earliest time from ``start`` at which the port busy times ``out`` and ``into`` (sorted
    lists of (start, end)) are both free for ``hold_out`` and ``hold_in``; both reserved from then.
    A message takes the first gap that fits, whatever order the replay reaches the messages in."""
    t = start
    while True:
        moved = False
        for busy, hold in ((out, hold_out), (into, hold_in)):
            i = bisect.bisect_right(busy, (t, float("inf"))) - 1
            i = max(i, 0)
            while i < len(busy) and busy[i][0] < t + hold:
                if busy[i][1] > t:
                    t, moved = busy[i][1], True
                i += 1
        if not moved:
            break
    bisect.insort(out, (t, t + hold_out))
    bisect.insort(into, (t, t + hold_in))
    return t


def _links(n, link):
    src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    bandwidth, latency = link(src.ravel(), dst.ravel())
    bandwidth = np.broadcast_to(np.asarray(bandwidth, dtype=float), (n * n,)).reshape(n, n)
    latency = np.broadcast_to(np.asarray(latency, dtype=float), (n * n,)).reshape(n, n)
    return bandwidth, latency
