"""The time of one phase of concurrent transfers on a network (:mod:`.network`).

A phase is a set of transfers (source rank, destination rank, bytes) that run at once.
Each transfer crosses these resources, each of a capacity in B/s:

* its link, bandwidth[src, dst], shared by the phase's transfers between the same two ranks;
* between two nodes only: the ingress port of the destination's node and the egress port of
  the source's node, each shared by all of the phase's transfers through it (two ranks of
  one node talk over their intra-node link and use no port);
* between two racks only: the up-link of the source's rack and the down-link of the
  destination's rack, each shared likewise;
* where the network has them, the destination rank's and the source rank's memory
  (``rank_in``, ``rank_out``), each shared by all of the phase's transfers into or out of
  that rank, within a node too: one core copies one piece after another.

Rates are max-min fair, by progressive filling (water-filling): the rates of all transfers
not yet frozen rise together as t; resource r (capacity c_r) is full at

    t_r = (c_r - sum of the frozen rates through r) / (transfers through r not yet frozen)

and the resource of the least t_r fills first: its transfers freeze at rate t_r, it binds
them, and the others go on rising. So k equal transfers through one port of capacity P
(their links at least P/k) get P/k each, and a transfer held lower by its own link leaves
the rest of the port to the others. Rates stay fixed for the phase. A transfer then takes

    t = alpha[src, dst] x (messages on its link in the phase) + bytes / rate

(the messages on one link go one after another, each paying its start-up), and the phase
takes the slowest transfer's t. :meth:`Phase.time` also says what bound that transfer:
its link, the ingress or egress port of node k, the up- or down-link of rack r, or the memory
of rank r (a tie goes to the first of these). A *sequential* phase (``concurrent=False``) runs its
transfers one after another, each alone on the network: the sum of their t.

The rates depend only on who talks to whom, not on the bytes, so a :class:`Phase` keeps
them and times any size after that; it fills them in only as far as the slowest transfer
needs (once no transfer still rising can be slower), which on uniform links is one round.
"""

import heapq
import math
from dataclasses import dataclass

import numpy as np

#: Resource kinds, in the order a tie between them is broken (the first that fills binds).
KINDS = ("link", "ingress", "egress", "up", "down", "rank_in", "rank_out")
#: What ``bench model`` and ``bench scaling`` call each kind in their "limited by" column.
GROUPS = {"link": "link", "ingress": "port", "egress": "port", "up": "uplink", "down": "uplink",
          "rank_in": "memory", "rank_out": "memory"}


@dataclass(frozen=True)
class PhaseTime:
    """A phase's seconds = ``latency`` (its slowest transfer's start-ups) + ``transfer`` (its
    bytes over its rate); ``resource`` bound that transfer: (kind of :data:`KINDS`, where),
    where is (src, dst) for a link, a node for a port, a rack for an uplink; None when no
    resource limits it (no bytes). A sequential phase sums its transfers: ``latency`` and
    ``transfer`` are sums, ``resource`` the slowest one's, and ``shares`` holds the transfer
    seconds of each binding resource ({resource: seconds}; None: all of it ``resource``'s)."""

    seconds: float
    latency: float
    transfer: float
    resource: tuple = None
    shares: dict = None

    def by_resource(self):
        """{resource: transfer seconds} of this phase."""
        if self.shares is not None:
            return self.shares
        return {self.resource: self.transfer} if self.resource is not None else {}

    def describe(self):
        return describe(self.resource)


def describe(resource):
    """ "link 3->4", "ingress port of node 0", "up-link of rack 1"."""
    if resource is None:
        return "nothing"
    kind, where = resource
    if kind == "link":
        return f"link {where[0]}->{where[1]}"
    if kind in ("egress", "ingress"):
        return f"{kind} port of node {where}"
    if kind in ("rank_in", "rank_out"):
        return f"memory of rank {where} ({'in' if kind == 'rank_in' else 'out'})"
    return f"{kind}-link of rack {where}"


class Phase:
    """Transfers src[i] -> dst[i] on ``network``, at once (``concurrent``) or one after another.
    Their max-min fair rates are filled in as far as a :meth:`time` call needs them (the
    slowest transfer's rate is known once no transfer still filling can be slower), and kept."""

    def __init__(self, network, src, dst, concurrent=True):
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        self.src, self.dst, self.concurrent = src, dst, concurrent
        self.size = len(src)
        if not self.size:
            return
        bandwidth, self.alpha = network.link(src, dst)
        bandwidth = np.broadcast_to(np.asarray(bandwidth, dtype=float), src.shape)
        self.alpha = np.broadcast_to(np.asarray(self.alpha, dtype=float), src.shape)
        keys, self.link_id = np.unique(src * network.n + dst, return_inverse=True)
        self.link_id = self.link_id.ravel()
        capacity = [np.zeros(len(keys))]
        capacity[0][self.link_id] = bandwidth
        columns, kinds = [self.link_id], ["link"]
        offsets = [0, len(keys)]

        def share(kind, crossing, where, cap):
            """A resource per entry of ``cap``: transfer i uses ``where[i]``'s when it is ``crossing``."""
            columns.append(np.where(crossing & np.isfinite(cap[where]), offsets[-1] + where, -1))
            capacity.append(cap)
            kinds.append(kind)
            offsets.append(offsets[-1] + len(cap))

        node_src, node_dst = network.nodes[src], network.nodes[dst]
        share("ingress", node_src != node_dst, node_dst, network.ingress)
        share("egress", node_src != node_dst, node_src, network.egress)
        if network.racks is not None:
            rack_src, rack_dst = network.racks[node_src], network.racks[node_dst]
            share("up", rack_src != rack_dst, rack_src, network.up)
            share("down", rack_src != rack_dst, rack_dst, network.down)
        if network.rank_in is not None:
            everywhere = np.ones(self.size, dtype=bool)
            share("rank_in", everywhere, dst, network.rank_in)
            share("rank_out", everywhere, src, network.rank_out)
        self._keys, self._n, self._offsets, self._kinds = keys, network.n, offsets, kinds
        resources = np.stack(columns, axis=1)
        capacity = np.concatenate(capacity)
        self._filling = MaxMin(resources, capacity) if concurrent else None
        if not concurrent:
            self._rates, self._binding = alone_rates(resources, capacity)

    @property
    def rates(self):
        """Every transfer's rate in B/s (filled to the end)."""
        if not self.size:
            return np.zeros(0)
        if self.concurrent:
            self._filling.finish()
            return self._filling.rates
        return self._rates

    def binding(self, i):
        """(kind, where) of the resource that bounds transfer ``i`` (filled to the end)."""
        if self.concurrent:
            self._filling.finish()
            return self.resource(int(self._filling.binding[i]))
        return self.resource(int(self._binding[i]))

    def resource(self, index):
        """(kind, where) of resource ``index`` (None for -1)."""
        if index < 0:
            return None
        column = int(np.searchsorted(self._offsets, index, side="right")) - 1
        local = int(index - self._offsets[column])
        if column == 0:
            key = int(self._keys[local])
            return "link", (key // self._n, key % self._n)
        return self._kinds[column], local

    def time(self, nbytes, messages=1):
        """:class:`PhaseTime` of this phase with ``nbytes`` per transfer (a number or one per
        transfer) in ``messages`` messages each."""
        if not self.size:
            return PhaseTime(0.0, 0.0, 0.0)
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), (self.size,))
        messages = np.broadcast_to(np.asarray(messages, dtype=float), (self.size,))
        if not self.concurrent:
            latency = self.alpha * messages
            transfer = _over(nbytes, self._rates)
            total = latency + transfer
            slowest = int(np.argmax(total))
            resource = self.resource(int(self._binding[slowest])) if nbytes[slowest] > 0 else None
            moving = (nbytes > 0) & (self._binding >= 0)
            index, inverse = np.unique(self._binding[moving], return_inverse=True)
            seconds = np.bincount(inverse.ravel(), weights=transfer[moving], minlength=len(index))
            shares = {self.resource(int(r)): float(t) for r, t in zip(index, seconds)}
            return PhaseTime(float(total.sum()), float(latency.sum()), float(transfer.sum()), resource, shares)
        latency = self.alpha * np.bincount(self.link_id, weights=messages)[self.link_id]
        filling = self._filling
        while True:  # rates of transfers still filling are a lower bound: their times an upper one
            transfer = _over(nbytes, filling.rates)
            total = latency + transfer
            if filling.complete:
                slowest = int(np.argmax(total))
                break
            done = ~filling.active
            if done.any():
                slowest = int(np.flatnonzero(done)[np.argmax(total[done])])
                if total[slowest] >= total[filling.active].max():
                    break
            filling.advance()
        resource = self.resource(int(filling.binding[slowest])) if nbytes[slowest] > 0 else None
        return PhaseTime(float(total[slowest]), float(latency[slowest]), float(transfer[slowest]), resource)


def _over(nbytes, rates):
    """nbytes / rates, 0 for no bytes (inf for a rate of 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nbytes > 0, nbytes / rates, 0.0)


class MaxMin:
    """Max-min fair rates by progressive filling, step by step. ``resources``: F x K resource
    indices of each flow (-1: none), ``capacity``: the resources' capacities (B/s).

    All flows still filling (``active``) share one rate t, which rises; resource r fills at
    t_r = (capacity_r - the rates of its frozen flows) / its active flows. The least t_r
    fills first and freezes its flows at t_r; resources within a relative 1e-9 of it fill
    with it, and a flow crossing several of them is bound by the one of its first column
    (the order of :data:`KINDS`). :meth:`advance` runs one such round on whole arrays (the
    first settles uniform cases), :meth:`finish` the rest with a heap of the t_r, one level
    at a time, for phases of many distinct levels. ``rates``: each flow's rate (frozen) or
    t (active; inf where nothing limits it), ``binding``: the resource that froze it (-1: none)."""

    ROUNDS = 16  # rounds on whole arrays before the heap takes over

    def __init__(self, resources, capacity):
        resources = np.asarray(resources, dtype=np.int64)
        flows = len(resources)
        self.rates = np.zeros(flows)
        self.binding = np.full(flows, -1, dtype=np.int64)
        self.valid = resources >= 0
        self.ids, inverse = np.unique(resources[self.valid], return_inverse=True)
        self.local = np.full(resources.shape, -1, dtype=np.int64)
        self.local[self.valid] = inverse.ravel()
        self.cap = np.asarray(capacity, dtype=float)[self.ids]
        self.safe = np.where(self.valid, self.local, 0)
        self.remaining = self.cap.copy()
        self.active = np.ones(flows, dtype=bool)
        self.rounds = 0
        self.complete = flows == 0

    def _bind(self, freeze, local_resource):
        self.binding[freeze] = self.ids[local_resource]

    def advance(self):
        """One more round (the heap for the rest after :data:`ROUNDS` of them)."""
        if self.complete:
            return
        if self.rounds >= self.ROUNDS:
            self.finish()
            return
        self.rounds += 1
        active, valid, local = self.active, self.valid, self.local
        counts = np.bincount(local[active][valid[active]], minlength=len(self.cap))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(counts > 0, self.remaining / np.maximum(counts, 1), np.inf)
        step = float(share.min()) if len(share) else math.inf
        if not math.isfinite(step):  # nothing limits the flows left
            self.rates[active] = np.inf
            self.active[:] = False
        else:
            step = max(step, 0.0)
            self.rates[active] += step
            self.remaining -= step * counts
            hit = ((counts > 0) & (share <= step * (1 + 1e-9)))[self.safe] & valid
            freeze = active & hit.any(axis=1)
            first = np.argmax(hit, axis=1)
            self._bind(freeze, local[freeze, first[freeze]])
            self.active &= ~freeze
        self.complete = not self.active.any()

    def finish(self):
        """Fill every flow left, a level at a time from a heap."""
        if self.complete:
            return
        if self.rounds == 0:
            self.advance()
            if self.complete:
                return
        local, valid, rates, active = self.local, self.valid, self.rates, self.active
        frozen = ~active
        weights = np.broadcast_to(rates[:, None], local.shape)
        used = np.bincount(local[frozen][valid[frozen]], weights=weights[frozen][valid[frozen]],
                           minlength=len(self.cap)).tolist()
        count = np.bincount(local[active][valid[active]], minlength=len(self.cap)).tolist()
        cap = self.cap.tolist()
        flows_on = [[] for _ in cap]
        rows = local.tolist()
        left = np.flatnonzero(active).tolist()
        for f in left:
            for r in rows[f]:
                if r >= 0:
                    flows_on[r].append(f)
        level = [(cap[r] - used[r]) / count[r] if count[r] else math.inf for r in range(len(cap))]
        heap = [(level[r], r) for r in range(len(cap)) if count[r]]
        heapq.heapify(heap)
        done = frozen.tolist()
        bound = {}
        while heap:
            t, r = heapq.heappop(heap)
            if not count[r] or t != level[r]:
                continue  # emptied, or an old entry of a resource whose level has risen
            batch = [r]
            while heap and heap[0][0] <= t * (1 + 1e-9):
                t2, r2 = heapq.heappop(heap)
                if count[r2] and t2 == level[r2]:
                    batch.append(r2)
            frees, members = [], set(batch)
            for r in batch:
                for f in flows_on[r]:
                    if not done[f]:
                        frees.append(f)
            for f in frees:  # a flow of several filling resources: its first column binds
                if done[f]:
                    continue
                done[f] = True
                mine = [c for c in rows[f] if c >= 0 and c in members]
                r = mine[0]
                rate = level[r]
                rates[f], bound[f] = rate, r
                for other in rows[f]:
                    if other >= 0 and other not in mine:
                        used[other] += rate
                        count[other] -= 1
                        if count[other]:
                            level[other] = max(rate, (cap[other] - used[other]) / count[other])
                            heapq.heappush(heap, (level[other], other))
                for other in mine:
                    used[other] += rate
                    count[other] -= 1
        unbounded = [f for f in left if not done[f]]
        rates[unbounded] = np.inf
        if bound:
            flows = np.fromiter(bound.keys(), dtype=np.int64, count=len(bound))
            self._bind(flows, np.fromiter(bound.values(), dtype=np.int64, count=len(bound)))
        self.active[:] = False
        self.complete = True


def max_min_rates(resources, capacity):
    """(rates, binding) of :class:`MaxMin`, filled to the end."""
    filling = MaxMin(resources, capacity)
    filling.finish()
    return filling.rates, filling.binding


def alone_rates(resources, capacity):
    """Each flow alone on the network: the least capacity on its way, and that resource."""
    capacity = np.asarray(capacity, dtype=float)
    caps = np.where(resources >= 0, capacity[np.where(resources >= 0, resources, 0)], np.inf)
    first = np.argmin(caps, axis=1)
    rows = np.arange(len(resources))
    rates = caps[rows, first]
    binding = np.where(np.isfinite(rates), resources[rows, first], -1)
    return rates, binding


@dataclass(frozen=True)
class Limit:
    """What an all-reduce's time is mostly made of: ``kind`` "latency" (the start-ups, alpha),
    "link", "port", "uplink" or "memory" (bytes through that kind of resource), and ``detail``, the
    resource of the phase that spends the most time on it ("ingress port of node 0")."""

    kind: str
    detail: str

    def __str__(self):
        return self.kind


def limit_of(parts):
    """The :class:`Limit` of phases run ``count`` times each: ``parts`` of (count, PhaseTime).
    Each phase's slowest transfer adds count x latency to "latency" and count x transfer to
    its binding resource's group (a sequential phase each of its transfers); the largest
    total wins (on a tie the shared resources first: port, uplink, memory, link, then latency), and
    the detail names that group's resource of the most seconds."""
    totals, seconds = {"latency": 0.0}, {}
    for count, phase in parts:
        totals["latency"] += count * phase.latency
        for resource, t in phase.by_resource().items():
            group = GROUPS[resource[0]]
            totals[group] = totals.get(group, 0.0) + count * t
            seconds[resource] = seconds.get(resource, 0.0) + count * t
    most = max(totals.values())
    kind = next(k for k in ("port", "uplink", "memory", "link", "latency") if totals.get(k, -1.0) >= most * (1 - 1e-9))
    if kind == "latency" or totals[kind] == 0:
        return Limit("latency", "start-ups (alpha)")
    top = max((r for r in seconds if GROUPS[r[0]] == kind), key=lambda r: seconds[r])
    return Limit(kind, describe(top))
