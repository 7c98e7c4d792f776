"""Lower bounds on the time of any all-reduce of M bytes per rank on a network of links,
ports and uplinks (:class:`.network.Network`), for algorithms that move elements between
ranks (no reduction inside the network).

* **Traffic** (Patarasuk and Yuan, 2009): each element's N inputs take N-1 transfers to meet
  and its result N-1 more to reach every rank, so the ranks together send and receive
  2(N-1)M bytes: T >= 2(N-1)M / (the most all ranks can send at once), and likewise
  receive; on equal ports beta, 2(N-1)/N M/beta. The same holds with the nodes as the
  parties (what moves inside a node is free to them), capped by their ports, and with the
  racks behind their uplinks.
* **Cut** (after ForestColl, Zhao et al., 2024): each element's result outside a set S of
  ranks (not all of them) depends on S's inputs, so at least M bytes leave S, and M enter
  it: T >= M / B+(S) and M / B-(S), B+(S) the most the links, ports and uplinks carry out of
  S at once. The largest is M over the network's minimum cut, found exactly by max flows from
  rank 0 to every other rank and back (:data:`CUT_RANKS` ranks at most; beyond, over the
  single ranks, the nodes and the racks). ForestColl's (M/N)|S|/B+(S), the bound of the
  all-gather half, is at most this.

* **Latency**: each rank's result depends on every rank's input, and what a rank can have
  heard of at most doubles with each message latency (by time t a rank's value depends on
  at most 2^(t/alpha) inputs, alpha the least latency of any link), so T >= ceil(log2 N) alpha.

Bytes and latencies combine as the larger of the latency bound and the larger byte bound plus
one latency (the last byte across the cut still takes a latency to arrive); not as their sum,
which is no bound: a pipelined tree's messages overlap their latencies with each other's
bytes. :func:`lower_bound` says which binds and where.
"""

from dataclasses import dataclass

import math

import numpy as np

CUT_RANKS = 64  # the exact minimum cut (2(N-1) max flows) up to this many ranks
MOST_RANKS = 4096  # the N x N links this module builds


@dataclass(frozen=True)
class Bound:
    """``seconds`` no all-reduce of the size can beat; ``kind`` "traffic", "cut" or "latency",
    ``detail`` in words ("the egress of node 2", "all ranks' sending")."""

    seconds: float
    kind: str
    detail: str


def lower_bound(network, nbytes):
    """The :class:`Bound` of an all-reduce of ``nbytes`` per rank on ``network``."""
    return LowerBound(network).at(nbytes)


class LowerBound:
    """The bounds of one network, its capacities found once (they do not depend on the size)."""

    def __init__(self, network):
        self.n = network.n
        if self.n > 1:
            capacity = Capacities(network)
            self.traffic = [(parties, rate, text) for parties, rate, text in capacity.traffic()
                            if parties > 1 and rate > 0]
            self.cut = capacity.min_cut()
            self.alpha = capacity.least_latency()
            self.hops = math.ceil(math.log2(self.n))

    def at(self, nbytes):
        """The :class:`Bound` for ``nbytes`` per rank."""
        m = float(nbytes)
        if self.n == 1 or m <= 0:
            return Bound(0.0, "none", "nothing moves")
        bounds = [Bound(2 * (parties - 1) * m / rate, "traffic", text) for parties, rate, text in self.traffic]
        bounds.append(Bound(m / self.cut[0], "cut", self.cut[1]))
        most = max(bounds, key=lambda b: b.seconds)
        bytes_bound = Bound(most.seconds + self.alpha, most.kind, most.detail)
        hops = Bound(self.hops * self.alpha, "latency",
                     f"ceil(log2 {self.n}) = {self.hops} latencies of {self.alpha * 1e6:.3g} us")
        return hops if hops.seconds > bytes_bound.seconds else bytes_bound


class Capacities:
    """What the network can carry: each rank's links, and the ports and uplinks over them (B/s)."""

    def __init__(self, network):
        self.network = network
        n = network.n
        if n > MOST_RANKS:
            raise ValueError(f"the lower bound needs the {n} x {n} links; it is built for at most {MOST_RANKS} ranks")
        src, dst = np.divmod(np.arange(n * n), n)
        bandwidth, _ = network.link(src, dst)
        w = np.broadcast_to(np.asarray(bandwidth, dtype=float), src.shape).reshape(n, n).copy()
        np.fill_diagonal(w, 0.0)
        self.w = w
        self.nodes = network.nodes
        self.same = self.nodes[:, None] == self.nodes[None, :]
        member = np.eye(network.node_count)[self.nodes]  # rank x node
        self.between = member.T @ w @ member  # node x node: the links from one node to another
        np.fill_diagonal(self.between, 0.0)

    def least_latency(self):
        """The least latency (s) of any link between two ranks."""
        n = self.network.n
        src, dst = np.divmod(np.arange(n * n), n)
        between = src != dst
        _, latency = self.network.link(src[between], dst[between])
        return float(np.min(np.broadcast_to(np.asarray(latency, dtype=float), src[between].shape)))

    def _ports(self, kind):
        cap = getattr(self.network, kind)
        return np.where(np.isfinite(cap), cap, np.inf)

    def rank_rates(self):
        """(out, in) of every rank: its links within its node, plus its links to other nodes
        capped by its node's port."""
        w, same = self.w, self.same
        egress, ingress = self._ports("egress")[self.nodes], self._ports("ingress")[self.nodes]
        out = np.where(same, w, 0).sum(1) + np.minimum(np.where(same, 0, w).sum(1), egress)
        into = np.where(same, w, 0).sum(0) + np.minimum(np.where(same, 0, w).sum(0), ingress)
        return out, into

    def node_rates(self):
        """(out, in) of every node to the others: its links out of it, capped by its port."""
        return (np.minimum(self.between.sum(1), self._ports("egress")),
                np.minimum(self.between.sum(0), self._ports("ingress")))

    def traffic(self):
        """(parties, the most they send or receive at once in B/s, in words) for the ranks, the
        nodes and the racks."""
        out, into = self.rank_rates()
        found = [(self.network.n, min(out.sum(), into.sum()), "all ranks' sending and receiving")]
        k = self.network.node_count
        if 1 < k < self.network.n:
            out, into = self.node_rates()
            found.append((k, min(out.sum(), into.sum()), "the nodes' ports"))
        if self.network.racks is not None:
            count = int(self.network.racks.max()) + 1
            if count > 1:
                found.append((count, min(self.network.up.sum(), self.network.down.sum()), "the racks' uplinks"))
        return found

    def min_cut(self):
        """(the least B/s any set of ranks can send out or take in, in words)."""
        if self.network.n <= CUT_RANKS:
            return self._exact_cut()
        return self._family_cut()

    def _family_cut(self):
        out, into = self.rank_rates()
        found = [(out[r], f"rank {r}'s sending") for r in range(len(out))]
        found += [(into[r], f"rank {r}'s receiving") for r in range(len(into))]
        if self.network.node_count > 1:
            out, into = self.node_rates()
            found += [(out[k], f"the egress of node {k}") for k in range(len(out))]
            found += [(into[k], f"the ingress of node {k}") for k in range(len(into))]
        if self.network.racks is not None:
            found += [(u, f"the up-link of rack {q}") for q, u in enumerate(self.network.up)]
            found += [(d, f"the down-link of rack {q}") for q, d in enumerate(self.network.down)]
        return min(found, key=lambda f: f[0])

    def _exact_cut(self):
        import networkx as nx

        graph = self._graph()
        best = (np.inf, "")
        for v in range(1, self.network.n):
            for a, b in ((0, v), (v, 0)):
                value, (side, _) = nx.minimum_cut(graph, a, b)
                if value < best[0]:
                    best = (value, self._name(sorted(r for r in side if isinstance(r, int))))
        return best

    def _name(self, ranks):
        """The set of ranks a cut leaves, in words."""
        n = self.network.n
        inside = np.zeros(n, dtype=bool)
        inside[ranks] = True
        way, inside = ("sending", inside) if inside.sum() <= n // 2 else ("receiving", ~inside)
        members = [int(r) for r in np.flatnonzero(inside)]
        if len(members) == 1:
            return f"rank {members[0]}'s {way}"
        nodes = sorted(set(self.nodes[members].tolist()))
        if len(nodes) == 1 and (self.nodes == nodes[0]).sum() == len(members):
            return f"the {'egress' if way == 'sending' else 'ingress'} of node {nodes[0]}"
        return f"ranks {','.join(map(str, members))}' {way}"

    def _graph(self):
        """Ranks, each node's egress and ingress port, each rack's up- and down-link, as a flow
        network: links within a node rank to rank; out of a node through its egress port to
        the other nodes' ingress ports (over the links between the nodes, and between racks
        through the uplinks), then to their ranks."""
        import networkx as nx

        net, w, same = self.network, self.w, self.same
        g = nx.DiGraph()
        n, k = net.n, net.node_count
        g.add_nodes_from(range(n))

        def edge(a, b, capacity):
            if capacity > 0:
                g.add_edge(a, b, **({"capacity": float(capacity)} if np.isfinite(capacity) else {}))

        for a in range(n):
            for b in range(n):
                if same[a, b]:
                    edge(a, b, w[a, b])
            edge(a, ("out", int(net.nodes[a])), np.where(same[a], 0, w[a]).sum())
            edge(("in", int(net.nodes[a])), a, np.where(same[:, a], 0, w[:, a]).sum())
        between = self.between
        for node in range(k):
            edge(("out", node), ("egress", node), net.egress[node])
            edge(("ingress", node), ("in", node), net.ingress[node])
        racks = net.racks
        for a in range(k):
            for b in range(k):
                if a == b:
                    continue
                if racks is None or racks[a] == racks[b]:
                    edge(("egress", a), ("ingress", b), between[a, b])
                else:
                    ra, rb = int(racks[a]), int(racks[b])
                    edge(("egress", a), ("up", ra), between[a, b])
                    edge(("down", rb), ("ingress", b), between[a, b])
        if racks is not None:
            count = int(racks.max()) + 1
            for q in range(count):
                edge(("up", q), ("core", q), net.up[q])
                edge(("core-in", q), ("down", q), net.down[q])
                for p in range(count):
                    if p != q:
                        edge(("core", q), ("core-in", p), np.inf)
        return g
