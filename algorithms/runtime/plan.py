"""Plans: an algorithm's steps on each rank, written down as data.

A plan is, for each rank, the ordered steps it takes in one call on vectors of ``count``
elements: which peer it sends to or receives from, which slice of which vector, and whether a
received slice is copied into place or reduced into it (the reduction order is the plan's).
An algorithm's module says how to build the steps (``steps(size, rank, count, itemsize[, tree])``);
one engine runs them (:mod:`.engine`); the cost model prices them (:mod:`topology.model.replay`)
and ``python -m bench plan`` prints them or writes them as JSON (:func:`as_json`, documented in
docs/algorithms.md), so that another engine can run the same plan.

A slice is ``(vector, lo, hi)``: elements ``[lo, hi)`` of ``"input"`` (the send buffer, read
only unless the call is in place, when it is the output itself), ``"output"`` (the receive
buffer: a reduce-scatter's chunk, an all-gather's whole vector), ``"partial"`` (the whole-length
vector a reduce-scatter may keep its partial sums in) or ``"scratch"`` (the rank's workspace, as
long as the plan's slices of it reach). The kinds of step:

* ``isend``: start sending ``send`` to ``to``; the send is named ``handle`` for a later ``wait``;
* ``wait``: wait until the sends and receives named in ``waits`` are complete;
* ``send``: send ``send`` to ``to`` and wait until it is complete;
* ``recv``: receive from ``source`` into ``into``;
* ``recv_reduce``: receive from ``source`` and set ``into = acc (op) received``;
* ``irecv``, ``irecv_reduce``: start such a receive, named ``handle``: once a ``wait`` names it,
  ``into`` holds the message (``acc (op)`` it), and until then ``into`` is neither read nor
  written, nor ``acc`` written;
* ``sendrecv``: ``send`` to ``to`` while receiving from ``source`` into ``into``;
* ``sendrecv_reduce``: ``send`` to ``to`` while receiving from ``source``, then ``into = acc (op) received``;
* ``copy``: ``into = send``, within the rank (nothing when the two are the same memory);
* ``combine``: ``into = acc (op) send``, within the rank (the order of the operands is the plan's);
* ``zero``: ``into = 0`` (padding that is reduced and thrown away).

A plan may be made of plans (:func:`relabel`): one run on a subset of the ranks, on slices of the
vectors, as a hierarchical algorithm runs a ring within each node and another across the nodes.

Messages between two ranks match in the order they are posted, as MPI's do.
"""

from typing import NamedTuple

from .layout import chunk_offsets

FORMAT = "allreduce-plan/1"  # the JSON document's "format"
KINDS = ("isend", "wait", "send", "recv", "recv_reduce", "irecv", "irecv_reduce", "sendrecv", "sendrecv_reduce",
         "copy", "combine", "zero")
SENDING = frozenset({"isend", "send", "sendrecv", "sendrecv_reduce"})
RECEIVING = frozenset({"recv", "recv_reduce", "irecv", "irecv_reduce", "sendrecv", "sendrecv_reduce"})
REDUCING = frozenset({"recv_reduce", "irecv_reduce", "sendrecv_reduce"})
_FIELDS = {  # the fields each kind uses, besides its kind
    "isend": ("to", "send", "handle"), "wait": ("waits",), "send": ("to", "send"),
    "recv": ("source", "into"), "recv_reduce": ("source", "acc", "into"),
    "irecv": ("source", "into", "handle"), "irecv_reduce": ("source", "acc", "into", "handle"),
    "sendrecv": ("to", "send", "source", "into"), "sendrecv_reduce": ("to", "send", "source", "acc", "into"),
    "copy": ("send", "into"), "combine": ("acc", "send", "into"), "zero": ("into",),
}


class Step(NamedTuple):
    """One step of one rank (see the module docstring for the kinds)."""

    kind: str
    to: int = -1
    send: tuple = ()
    source: int = -1
    acc: tuple = ()
    into: tuple = ()
    handle: int = -1
    waits: tuple = ()


def isend(to, send, handle):
    return Step("isend", to=to, send=send, handle=handle)


def wait(*handles):
    return Step("wait", waits=tuple(handles))


def recv(source, into):
    return Step("recv", source=source, into=into)


def recv_reduce(source, acc, into):
    return Step("recv_reduce", source=source, acc=acc, into=into)


def irecv(source, into, handle):
    return Step("irecv", source=source, into=into, handle=handle)


def irecv_reduce(source, acc, into, handle):
    return Step("irecv_reduce", source=source, acc=acc, into=into, handle=handle)


def sendrecv(to, send, source, into):
    return Step("sendrecv", to=to, send=send, source=source, into=into)


def sendrecv_reduce(to, send, source, acc, into):
    return Step("sendrecv_reduce", to=to, send=send, source=source, acc=acc, into=into)


def send(to, piece):
    return Step("send", to=to, send=piece)


def copy(send, into):
    return Step("copy", send=send, into=into)


def start_in(count):
    """The input copied into the output (nothing in place): the whole plan on one rank, and the
    parameter server's root's first step."""
    return copy(("input", 0, count), ("output", 0, count))


def combine(acc, other, into):
    """``into = acc (op) other``, within the rank."""
    return Step("combine", acc=acc, send=other, into=into)


def zero(into):
    return Step("zero", into=into)


def one_step(size, rank, count):
    """An all-reduce in one step (one-shot): rank r keeps its vector in scratch and sends it to
    every other rank, then reduces the N vectors itself, in rank order, each received straight
    into the result: every rank makes the same operations in the same order, so all get the same
    bits. Correct in place (the result is written only after the vector is kept)."""
    mine, out = ("scratch", 0, count), ("output", 0, count)
    if size == 1:
        return (start_in(count),)
    peers = [p for p in range(size) if p != rank]
    steps = [copy(("input", 0, count), mine)] + [isend(p, mine, i) for i, p in enumerate(peers)]
    for p in range(size):
        if p == rank:
            steps.append(copy(mine, out) if p == 0 else combine(out, mine, out))
        else:
            steps.append(recv(p, out) if p == 0 else recv_reduce(p, out, out))
    steps.append(wait(*range(len(peers))))
    return tuple(steps)


def two_step(size, rank, count):
    """An all-reduce in two steps (two-shot): :func:`two_step_reduce_scatter` into this rank's
    chunk of the result (:func:`.layout.chunk_offsets`), then :func:`two_step_all_gather`. Each
    chunk is reduced by one rank only, so all get the same bits. Correct in place: a chunk of the
    vector is overwritten only after the send that reads it is complete."""
    if size == 1:
        return (start_in(count),)
    cuts = chunk_offsets(count, size)
    first = _reduce_own_chunk(size, rank, cuts, ("output", cuts[rank], cuts[rank + 1]))
    return first + _share_own_chunk(size, rank, cuts, size - 1)


def two_step_reduce_scatter(size, rank, count):
    """The reduce-scatter in one step: rank r sends chunk p of its vector to rank p and reduces
    its own chunk r of the N vectors itself, in rank order, each received straight into
    ``"output"`` (the chunk; its own piece kept in scratch first, as the output may be it)."""
    cuts = chunk_offsets(count, size)
    if size == 1:
        return (start_in(count),)
    return _reduce_own_chunk(size, rank, cuts, ("output", 0, cuts[rank + 1] - cuts[rank]))


def two_step_all_gather(size, rank, count):
    """The all-gather in one step, in place on ``"output"`` (the whole vector): rank r sends its
    chunk r to every other rank and receives theirs into place."""
    return _share_own_chunk(size, rank, chunk_offsets(count, size), 0) if size > 1 else ()


def _reduce_own_chunk(size, rank, cuts, out):
    """Chunk p of the input to rank p (sends 0..N-2), this rank's chunk of every rank's input
    reduced in rank order into ``out``, the sends waited for."""
    mine = ("scratch", 0, cuts[rank + 1] - cuts[rank])
    peers = [p for p in range(size) if p != rank]
    steps = [copy(("input", cuts[rank], cuts[rank + 1]), mine)]
    steps += [isend(p, ("input", cuts[p], cuts[p + 1]), i) for i, p in enumerate(peers)]
    for p in range(size):
        if p == rank:
            steps.append(copy(mine, out) if p == 0 else combine(out, mine, out))
        else:
            steps.append(recv(p, out) if p == 0 else recv_reduce(p, out, out))
    return (*steps, wait(*range(len(peers))))


def _share_own_chunk(size, rank, cuts, first):
    """This rank's chunk of ``"output"`` to every other rank (sends ``first``..), theirs received
    into place, the sends waited for."""
    peers = [p for p in range(size) if p != rank]
    steps = [isend(p, ("output", cuts[rank], cuts[rank + 1]), first + i) for i, p in enumerate(peers)]
    steps += [recv(p, ("output", cuts[p], cuts[p + 1])) for p in peers]
    return (*steps, wait(*range(first, first + len(peers))))


def relabel(steps, ranks, vectors):
    """``steps`` of a plan made for ``len(ranks)`` ranks, run by rank ``ranks[i]`` for its rank i, on
    other vectors: ``vectors[name] = (vector, offset)`` puts slice ``(name, lo, hi)`` at ``(vector,
    offset + lo, offset + hi)`` (a name not given keeps its place)."""
    def piece(p):
        if not p:
            return p
        vector, offset = vectors.get(p[0], (p[0], 0))
        return vector, offset + p[1], offset + p[2]
    return tuple(s._replace(to=ranks[s.to] if s.to >= 0 else -1, source=ranks[s.source] if s.source >= 0 else -1,
                            send=piece(s.send), acc=piece(s.acc), into=piece(s.into)) for s in steps)


def scratch_length(steps):
    """How many elements of scratch ``steps`` use."""
    return max((p[2] for s in steps for p in (s.send, s.acc, s.into) if p and p[0] == "scratch"), default=0)


def elements(piece):
    """How many elements a slice ``(vector, lo, hi)`` holds."""
    return piece[2] - piece[1]


def sends_blocking(steps):
    """``steps`` with each ``isend`` that the very next step waits for alone made a ``send``
    (the same thing in one call: the rank can do nothing between the two)."""
    out, skip = [], False
    for i, step in enumerate(steps):
        if skip:
            skip = False
            continue
        following = steps[i + 1] if i + 1 < len(steps) else None
        if step.kind == "isend" and following is not None and following.waits == (step.handle,):
            out.append(Step("send", to=step.to, send=step.send))
            skip = True
        else:
            out.append(step)
    return tuple(out)


def as_json(algorithm, count, itemsize, ranks):
    """The JSON document of a plan: ``ranks[r]`` is rank r's steps (docs/algorithms.md#plans)."""
    return {"format": FORMAT, "algorithm": algorithm, "ranks": len(ranks), "count": count,
            "itemsize": itemsize,
            "steps": [[{"kind": s.kind, **{f: _field(getattr(s, f)) for f in _FIELDS[s.kind]}} for s in steps]
                      for steps in ranks]}


def from_json(document):
    """``(algorithm, count, itemsize, ranks)`` of a document :func:`as_json` wrote; ``ValueError``
    if it is not one."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a plan: its \"format\" is not {FORMAT!r}")
    ranks = []
    for r, steps in enumerate(document["steps"]):
        rank = []
        for s in steps:
            kind = s.get("kind")
            if kind not in _FIELDS:
                raise ValueError(f"rank {r}: unknown step kind {kind!r}; kinds: {', '.join(KINDS)}")
            rank.append(Step(kind, **{f: tuple(s[f]) if isinstance(s[f], list) else s[f] for f in _FIELDS[kind]}))
        ranks.append(tuple(rank))
    return document["algorithm"], document["count"], document["itemsize"], ranks


def _field(value):
    return list(value) if isinstance(value, tuple) else value


def text(step):
    """One step in words: ``recv_reduce from 1: output[0:2] = input[0:2] + received``."""
    def piece(p):
        return f"{p[0]}[{p[1]}:{p[2]}]"
    kind = step.kind
    if kind == "wait":
        return "wait " + ", ".join(f"#{h}" for h in step.waits)
    parts = []
    if kind in SENDING:
        parts.append(f"{piece(step.send)} to {step.to}" + (f" as #{step.handle}" if kind == "isend" else ""))
    named = f" as #{step.handle}" if kind.startswith("irecv") else ""
    if kind in REDUCING:
        parts.append(f"{piece(step.into)} = {piece(step.acc)} (op) received from {step.source}{named}")
    elif kind in RECEIVING:
        parts.append(f"{piece(step.into)} from {step.source}{named}")
    if kind == "copy":
        parts.append(f"{piece(step.into)} = {piece(step.send)}")
    if kind == "combine":
        parts.append(f"{piece(step.into)} = {piece(step.acc)} (op) {piece(step.send)}")
    if kind == "zero":
        parts.append(f"{piece(step.into)} = 0")
    return f"{kind} " + "; ".join(parts)
