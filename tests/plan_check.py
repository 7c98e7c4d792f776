"""A plan run symbolically, to check it without MPI: every element of every vector holds the set of
ranks whose inputs are summed in it (a bit mask), and a count of how often each was added.

The run follows the rules a plan states (algorithms/runtime/plan.py): a message is what its slice held
when it was posted; a slice being sent (an ``isend`` not yet waited for) is not written, and a
slice being received into (an ``irecv`` not yet waited for) neither read nor written, nor its
``acc`` written; messages between two ranks match the receives in the order both were posted,
and their sizes must agree; a step whose message is not yet posted waits, and if no rank can
move the plan deadlocks (sends complete here without their receive: the replay,
topology/model/replay.py, is the strict one). At the end every output element must hold every
rank's input exactly once.
"""

import numpy as np


class PlanError(AssertionError):
    pass


def run_symbolically(ranks, count, in_place=False, collective="allreduce"):
    """Run the plan ``ranks`` (each rank's steps) of ``collective`` on ``count`` elements a rank
    (the all-reduce's and the reduce-scatter's input, the all-gather's output); ``PlanError`` on
    anything wrong. An all-reduce ends with every rank's input in every output element; a
    reduce-scatter's ``"output"`` is this rank's chunk of them (:func:`chunk_offsets`), its
    ``"partial"`` a whole-length vector; an all-gather starts from ``"output"`` holding rank r's
    input in chunk r on rank r and ends with chunk c holding rank c's on every rank."""
    return _Run(ranks, count, in_place, collective).result()


def chunk_offsets(count, parts):
    """The chunk layout, written here as the algorithms' docs state it: sizes differing by at
    most one, the larger first."""
    base, extra = divmod(count, parts)
    return [i * base + min(i, extra) for i in range(parts + 1)]


def _empty(length):
    return np.zeros(length, dtype=np.int64), np.zeros(length, dtype=np.int64)


class _Run:
    def __init__(self, ranks, count, in_place, collective):
        self.ranks, self.count, self.n, self.collective = ranks, count, len(ranks), collective
        self.offsets = chunk_offsets(count, self.n)
        self.state = []
        for r in range(self.n):
            given = (np.full(count, 1 << r, dtype=np.int64), np.ones(count, dtype=np.int64))
            length = max((p[2] for step in ranks[r] for p in (step.send, step.acc, step.into) if p and p[0] == "scratch"),
                         default=0)
            vectors = {"input": given, "scratch": _empty(length)}
            if collective == "allreduce":
                vectors["output"] = given if in_place else _empty(count)
            elif collective == "reduce_scatter":
                vectors["partial"] = _empty(count)
                vectors["output"] = _empty(self.offsets[r + 1] - self.offsets[r])
            else:
                lo, hi = self.offsets[r], self.offsets[r + 1]
                whole = _empty(count)
                whole[0][lo:hi], whole[1][lo:hi] = 1 << r, 1
                vectors = {"output": whole, "scratch": vectors["scratch"]}
            self.state.append(vectors)
        self.messages = {}  # (src, dst) -> payloads in posting order (taken ones become None)
        self.receives = {}  # (src, dst) -> receives posted so far
        self.sending = [dict() for _ in range(self.n)]  # handle -> slice being sent
        self.receiving = [dict() for _ in range(self.n)]  # handle -> (step, its message's index)
        self.blocked = [None] * self.n  # a blocking receive's message index, once posted
        self.pc = [0] * self.n

    def vector(self, r, name):
        if name not in self.state[r]:
            raise PlanError(f"rank {r}: unknown vector {name!r}")
        return self.state[r][name]

    def overlaps(self, r, piece, other):
        return (self.vector(r, piece[0]) is self.vector(r, other[0]) and piece[1] < other[2]
                and other[1] < piece[2])

    def check_free(self, r, piece, writing):
        for handle, sent in self.sending[r].items():
            if writing and self.overlaps(r, piece, sent):
                raise PlanError(f"rank {r} step {self.pc[r]}: writes {piece} while send #{handle} of {sent} is in flight")
        for handle, (step, _) in self.receiving[r].items():
            if self.overlaps(r, piece, step.into) or (writing and step.acc and self.overlaps(r, piece, step.acc)):
                raise PlanError(f"rank {r} step {self.pc[r]}: touches {piece} while receive #{handle} into "
                                f"{step.into} is in flight")

    def read(self, r, piece):
        name, lo, hi = piece
        masks, counts = self.vector(r, name)
        if not 0 <= lo <= hi <= masks.size:
            raise PlanError(f"rank {r}: slice {piece} outside 0..{masks.size}")
        self.check_free(r, piece, writing=False)
        return masks[lo:hi].copy(), counts[lo:hi].copy()

    def write(self, r, piece, value):
        name, lo, hi = piece
        target = self.vector(r, name)
        self.check_free(r, piece, writing=True)
        if value[0].size != hi - lo:
            raise PlanError(f"rank {r} step {self.pc[r]}: {value[0].size} elements received into {piece}")
        target[0][lo:hi], target[1][lo:hi] = value

    def combine(self, r, acc, incoming):
        mine = self.read(r, acc)
        if mine[0].size != incoming[0].size:
            raise PlanError(f"rank {r} step {self.pc[r]}: reduces {incoming[0].size} elements into {mine[0].size}")
        if np.any(mine[0] & incoming[0]):
            raise PlanError(f"rank {r} step {self.pc[r]}: adds a rank's input twice")
        return mine[0] | incoming[0], mine[1] + incoming[1]

    def post(self, r, to, piece):
        if not 0 <= to < self.n or to == r:
            raise PlanError(f"rank {r}: sends to {to}")
        self.messages.setdefault((r, to), []).append(self.read(r, piece))

    def post_receive(self, r, source):
        if not 0 <= source < self.n or source == r:
            raise PlanError(f"rank {r}: receives from {source}")
        index = self.receives.get((source, r), 0)
        self.receives[(source, r)] = index + 1
        return index

    def take(self, r, source, index):
        queue = self.messages.get((source, r), [])
        if index >= len(queue):
            return None
        payload, queue[index] = queue[index], None
        return payload

    def deliver(self, r, step, payload):
        value = self.combine(r, step.acc, payload) if step.kind.endswith("reduce") else payload
        self.write(r, step.into, value)

    def attempt(self, r):
        step = self.ranks[r][self.pc[r]]
        kind = step.kind
        if kind in ("isend", "irecv", "irecv_reduce") and (step.handle in self.sending[r]
                                                           or step.handle in self.receiving[r]):
            raise PlanError(f"rank {r} step {self.pc[r]}: handle #{step.handle} reused while in flight")
        if kind == "isend":
            self.post(r, step.to, step.send)
            self.sending[r][step.handle] = step.send
        elif kind in ("irecv", "irecv_reduce"):
            self.receiving[r][step.handle] = (step, self.post_receive(r, step.source))
        elif kind == "wait":
            for handle in step.waits:
                if handle in self.receiving[r]:
                    waited, index = self.receiving[r][handle]
                    if index >= len(self.messages.get((waited.source, r), [])):
                        return False
                elif handle not in self.sending[r]:
                    raise PlanError(f"rank {r} step {self.pc[r]}: waits for #{handle}, not in flight")
            for handle in step.waits:
                if self.sending[r].pop(handle, None) is None:
                    waited, index = self.receiving[r].pop(handle)
                    self.deliver(r, waited, self.take(r, waited.source, index))
        elif kind == "send":
            self.post(r, step.to, step.send)
        elif kind == "copy":
            self.write(r, step.into, self.read(r, step.send))
        elif kind == "zero":
            self.write(r, step.into, _empty(step.into[2] - step.into[1]))
        elif kind == "combine":
            self.write(r, step.into, self.combine(r, step.acc, self.read(r, step.send)))
        else:  # blocking receives
            if self.blocked[r] is None:
                if kind.startswith("sendrecv"):
                    if self.overlaps(r, step.send, step.into):
                        raise PlanError(f"rank {r} step {self.pc[r]}: receives into the slice it sends")
                    self.post(r, step.to, step.send)
                self.blocked[r] = self.post_receive(r, step.source)
            payload = self.take(r, step.source, self.blocked[r])
            if payload is None:
                return False
            self.blocked[r] = None
            self.deliver(r, step, payload)
        self.pc[r] += 1
        return True

    def result(self):
        n, ranks, pc = self.n, self.ranks, self.pc
        while True:
            moved, left = False, False
            for r in range(n):
                while pc[r] < len(ranks[r]):
                    if not self.attempt(r):
                        left = True
                        break
                    moved = True
            if not left:
                break
            if not moved:
                raise PlanError("deadlock: " + ", ".join(f"rank {r} at step {pc[r]}" for r in range(n)
                                                           if pc[r] < len(ranks[r])))
        for r in range(n):
            if self.sending[r] or self.receiving[r]:
                raise PlanError(f"rank {r}: never waited for #{sorted({*self.sending[r], *self.receiving[r]})}")
        unread = {pair: sum(m is not None for m in q) for pair, q in self.messages.items()}
        unread = {pair: k for pair, k in unread.items() if k}
        if unread:
            raise PlanError(f"messages never received: {unread}")
        full, outputs = (1 << n) - 1, []
        for r in range(n):
            masks, counts = self.state[r]["output"]
            if self.collective == "all_gather":
                owner = np.repeat(np.arange(n), np.diff(self.offsets))
                wrong = np.flatnonzero((masks != (1 << owner)) | (counts != 1))
            else:
                wrong = np.flatnonzero((masks != full) | (counts != n))
            if wrong.size:
                i = wrong[0]
                raise PlanError(f"rank {r}: {wrong.size} of {self.count} elements wrong, the first {i}: ranks "
                                f"{[b for b in range(n) if masks[i] >> b & 1]} added {counts[i]} times")
            outputs.append((masks, counts))
        return outputs
