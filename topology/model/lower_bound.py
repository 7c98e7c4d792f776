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
* **Latency**: each rank's result depends on every rank's input. Within a node a rank reads
  all its peers' memory at once, so one latency alpha_s (the least of a flag in shared memory
  and a C-timed MPI ping-pong, half the round trip). Between K nodes over a network each rank
  takes one message at a time, its node's ranks sharing what they heard: what a node can have
  heard of grows at most (1 + R)-fold a network latency alpha_n (R the most ranks of a node),
  so T >= h alpha_n, h the least with (1 + R)^h >= K: ceil(log2 K) with a rank a node.

On a probed network (a file of :mod:`topology.probe`, with its ``measured["floor"]``, or any
file that carries a probe's floor, as the network lab's does beside its configured links) the links
within a node carry at least their host's fastest copy at any size (a rank reading a peer's
memory moves bytes no faster than a copy; a copy hot in the caches is the fastest there is),
the links between nodes, the ports and the uplinks their measured rates raised by the probe's
accuracy (:data:`PROBE_ERROR`), and the latencies are the floor's,
not the probe's Python-timed ones. A probed file without the floor (an older probe) or whose C
could not be built gets 0 for the latencies and no limit within a node, always a bound, and
:attr:`Bound.missing` says so. A synthetic network's links (``Network.uniform``, a matrix not
from the probe) are definitions: its link latencies between nodes count, and within a node 0
(its links say nothing of shared memory).

Bytes and latencies combine as the larger of the latency bound and the larger byte bound plus
one latency (the least of any kind: the last byte across the cut still takes one to arrive);
not as their sum, which is no bound: a pipelined tree's messages overlap their latencies with
each other's bytes. :func:`lower_bound` says which binds and where.
"""

from dataclasses import dataclass

import numpy as np

#: a probed rate between nodes may be this much below what the network carries: the bound takes
#: its links, ports and uplinks this much faster (the probe's stated accuracy, 10%; the lab's
#: target "probe error <= 10% on every link between nodes")
PROBE_ERROR = 1.1
CUT_RANKS = 64  # the exact minimum cut (2(N-1) max flows) up to this many ranks
MOST_RANKS = 4096  # the N x N links this module builds


@dataclass(frozen=True)
class Bound:
    """``seconds`` no all-reduce of the size can beat; ``kind`` "traffic", "cut" or "latency",
    ``detail`` in words ("the egress of node 2", "all ranks' sending"); ``missing``: what the
    network lacks for a bound of its measured figures (then ``seconds`` takes 0 and no limit in
    their place), None where it lacks nothing."""

    seconds: float
    kind: str
    detail: str
    missing: str = None


def lower_bound(network, nbytes):
    """The :class:`Bound` of an all-reduce of ``nbytes`` per rank on ``network``."""
    return LowerBound(network).at(nbytes)


class LowerBound:
    """The bounds of one network, its capacities found once (they do not depend on the size);
    ``assumes`` says in words what network the bound takes, ``missing`` as :class:`Bound`'s."""

    def __init__(self, network):
        self.n = network.n
        floor = Floor(network)
        self.missing, self.assumes = floor.missing, floor.assumes
        if self.n > 1:
            capacity = Capacities(network, floor.intra, PROBE_ERROR if floor.probed else 1.0)
            self.traffic = [(parties, rate, text) for parties, rate, text in capacity.traffic()
                            if parties > 1 and rate > 0]
            self.cut = capacity.min_cut()
            self.latency, self.alpha = floor.latency()

    def at(self, nbytes):
        """The :class:`Bound` for ``nbytes`` per rank."""
        m = float(nbytes)
        if self.n == 1 or m <= 0:
            return Bound(0.0, "none", "nothing moves")
        bounds = [Bound(2 * (parties - 1) * m / rate, "traffic", text) for parties, rate, text in self.traffic]
        bounds.append(Bound(m / self.cut[0], "cut", self.cut[1]))
        most = max(bounds, key=lambda b: b.seconds)
        bytes_bound = Bound(most.seconds + self.alpha, most.kind, most.detail, self.missing)
        hops = Bound(self.latency[0], "latency", self.latency[1], self.missing)
        return hops if hops.seconds > bytes_bound.seconds else bytes_bound


def network_hops(nodes, most_ranks):
    """The least h with (1 + R)^h >= K: the network latencies before every one of K nodes can
    have heard of every other, each of a node's R ranks taking one message at a time."""
    hops, reach = 0, 1
    while reach < nodes:
        hops, reach = hops + 1, reach * (1 + most_ranks)
    return hops


class Floor:
    """What the bound takes for the network's least latencies and fastest links within a node:
    ``within`` (s, per node), ``between`` (s), ``intra`` (B/s per rank: its links within its
    node carry at least this; None: as the network's), ``missing`` and ``assumes`` in words."""

    def __init__(self, network):
        self.network = network
        k = network.node_count
        n, nodes = network.n, network.nodes
        src, dst = np.divmod(np.arange(n * n), n)
        off = src != dst
        src, dst = src[off], dst[off]
        same = nodes[src] == nodes[dst]
        matrix = network.matrix if network.has_matrix else None
        # a probe's file, or one with a probe's floor (the network lab's: configured links, measured latencies)
        probed = matrix is not None and "synthetic" not in matrix.measured and (
            "method" in matrix.measured or matrix.measured.get("floor") is not None)
        self.probed = probed
        self.missing, self.intra, self.within, self.between = None, None, np.zeros(k), 0.0
        if not probed:  # the links are definitions
            _, latency = network.link(src[~same], dst[~same])
            latency = np.broadcast_to(np.asarray(latency, dtype=float), src[~same].shape)
            self.between = float(latency.min()) if latency.size else 0.0
            self.assumes = "the network's own links: between nodes their latencies, within a node none"
            return
        floor = matrix.floor()
        if floor is None or floor["problem"]:
            self.missing = floor["problem"] if floor else \
                "the probe file has no C-timed latencies nor copy rates (an older probe); probe again"
            self.intra = np.full(n, np.inf)
            self.assumes = "the probe's links between nodes and ports; latencies 0, no limit within a node"
            return
        least = np.fmin(floor["flag_us"], floor["mpi_us"]) * 1e-6
        for node in range(k):
            inside = np.flatnonzero(nodes == node)
            block = least[np.ix_(inside, inside)]
            self.within[node] = np.nanmin(block) if np.isfinite(block).any() else 0.0
        outside = ~(nodes[:, None] == nodes[None, :])
        values = floor["mpi_us"][outside]
        self.between = float(np.nanmin(values)) * 1e-6 if np.isfinite(values).any() else 0.0
        copy = floor["copy_GBps"] * 1e9
        self.intra = np.where(np.isfinite(copy), copy, np.inf)
        if not np.isfinite(copy).all():
            self.missing = "the probe file has no copy rate of some host"
        self.assumes = ("within a node shared memory (a rank reads every peer at once, data at the host's "
                        "fastest copy)" + (", between nodes a network (a rank takes one message at a time, "
                                           "the probe's links and ports)" if k > 1 else ""))

    def latency(self):
        """((seconds, in words) of the latency bound, the least latency of any kind)."""
        network = self.network
        sizes = np.bincount(network.nodes, minlength=network.node_count)
        found, least = [(0.0, "no latency known")], []
        shared = sizes > 1
        if shared.any():
            alpha = float(self.within[shared].max())
            least.append(float(self.within[shared].min()))
            found.append((alpha, f"1 latency within a node of {alpha * 1e6:.3g} us (shared memory: a rank "
                                 "reads every peer at once)"))
        k = network.node_count
        if k > 1:
            r = int(sizes.max())
            hops = network_hops(k, r)
            least.append(self.between)
            hears = f"ceil(log2 {k})" if r == 1 else f"ceil(log{1 + r} {k})"
            found.append((hops * self.between, f"{hears} = {hops} network latencies of {self.between * 1e6:.3g} us "
                                               "(a rank takes one message at a time)"))
        return max(found, key=lambda f: f[0]), (min(least) if least else 0.0)


class Capacities:
    """What the network can carry: each rank's links, and the ports and uplinks over them (B/s)."""

    def __init__(self, network, intra=None, margin=1.0):
        """``intra``: B/s per rank; its links within its node carry at least this (None: as given);
        ``margin``: the links between nodes, the ports and the uplinks carry that many times theirs."""
        self.network = network
        self.margin = margin
        n = network.n
        if n > MOST_RANKS:
            raise ValueError(f"the lower bound needs the {n} x {n} links; it is built for at most {MOST_RANKS} ranks")
        src, dst = np.divmod(np.arange(n * n), n)
        bandwidth, _ = network.link(src, dst)
        w = np.broadcast_to(np.asarray(bandwidth, dtype=float), src.shape).reshape(n, n).copy()
        self.nodes = network.nodes
        self.same = self.nodes[:, None] == self.nodes[None, :]
        if intra is not None:
            w = np.where(self.same, np.maximum(w, np.minimum.outer(intra, intra)), w)
        w = np.where(self.same, w, w * margin)
        np.fill_diagonal(w, 0.0)
        self.w = w
        member = np.eye(network.node_count)[self.nodes]  # rank x node
        self.between = member.T @ np.where(self.same, 0.0, w) @ member  # node x node: the links between nodes
        np.fill_diagonal(self.between, 0.0)

    def _ports(self, kind):
        cap = getattr(self.network, kind) * self.margin
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
                found.append((count, self.margin * min(self.network.up.sum(), self.network.down.sum()), "the racks' uplinks"))
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
            found += [(u * self.margin, f"the up-link of rack {q}") for q, u in enumerate(self.network.up)]
            found += [(d * self.margin, f"the down-link of rack {q}") for q, d in enumerate(self.network.down)]
        return min(found, key=lambda f: f[0])

    def _exact_cut(self):
        import networkx as nx

        graph = self._graph()
        best = (np.inf, "no cut: no limit anywhere")
        for v in range(1, self.network.n):
            for a, b in ((0, v), (v, 0)):
                try:
                    value, (side, _) = nx.minimum_cut(graph, a, b)
                except nx.NetworkXUnbounded:  # no limit between them (unlimited links within a node)
                    continue
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
            edge(("out", node), ("egress", node), net.egress[node] * self.margin)
            edge(("ingress", node), ("in", node), net.ingress[node] * self.margin)
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
                edge(("up", q), ("core", q), net.up[q] * self.margin)
                edge(("core-in", q), ("down", q), net.down[q] * self.margin)
                for p in range(count):
                    if p != q:
                        edge(("core", q), ("core-in", p), np.inf)
        return g


class HalfBound:
    """A lower bound on the time of any reduce-scatter or all-gather of M bytes (the whole
    vector, N chunks of M/N) on a :class:`topology.model.Network`, for algorithms that move
    elements between ranks. A reduce-scatter's rank must send the (N-1)/N M of its input that
    the other ranks' chunks need (any sum holding it is still an element per place); an
    all-gather's rank must receive the (N-1)/N M of the other ranks' chunks. Likewise a node of R
    ranks (N-R)/N M over its port and its links to the other nodes, and a rack over its
    up-link (down-link). Each over the most its links carry at once
    (:class:`Capacities`), plus one least latency, or the latency
    bound of :class:`LowerBound` (every rank's result depends on every rank's
    input), whichever is larger; on a probed network the same margins and latencies as there."""

    def __init__(self, network, collective):
        """``collective``: "reduce_scatter" or "all_gather"."""
        self.network = network
        self.collective = collective
        self._parties = None

    def parties(self):
        """[(share of M, B/s, in words)] of each rank, node and rack, and the Floor, built once."""
        if self._parties is None:
            net = self.network
            floor = Floor(net)
            capacity = Capacities(net, floor.intra, PROBE_ERROR if floor.probed else 1.0)
            side = 0 if self.collective == "reduce_scatter" else 1  # sending, receiving
            way = ("sending", "receiving")[side]
            n, sizes = net.n, np.bincount(net.nodes, minlength=net.node_count)
            found = [((n - 1) / n, rate, f"rank {r}'s {way}") for r, rate in enumerate(capacity.rank_rates()[side])]
            if net.node_count > 1:
                port = ("egress", "ingress")[side]
                found += [((n - sizes[k]) / n, rate, f"the {port} of node {k}")
                          for k, rate in enumerate(capacity.node_rates()[side])]
            if net.racks is not None and net.racks.max() > 0:
                links, kind = (net.up, "up") if side == 0 else (net.down, "down")
                in_rack = np.bincount(net.racks, weights=sizes, minlength=len(links))
                found += [((n - in_rack[q]) / n, link * capacity.margin, f"the {kind}-link of rack {q}")
                          for q, link in enumerate(links)]
            self._parties = ([(share, float(rate), text) for share, rate, text in found if share > 0 and rate > 0],
                             floor)
        return self._parties

    def at(self, nbytes):
        """The :class:`Bound` for ``nbytes``, the whole vector."""
        m = float(nbytes)
        if self.network.n == 1 or m <= 0:
            return Bound(0.0, "none", "nothing moves")
        parties, floor = self.parties()
        (hops, hops_text), alpha = floor.latency()
        share, rate, text = max(parties, key=lambda p: p[0] / p[1], default=(0.0, 1.0, "no limit anywhere"))
        if hops > share * m / rate + alpha:
            return Bound(hops, "latency", hops_text, floor.missing)
        return Bound(share * m / rate + alpha, "traffic", text, floor.missing)
