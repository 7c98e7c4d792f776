"""A network of links, ports and uplinks: what the cost model's transfers cross (:class:`Network`).

Each transfer (source rank, destination rank) crosses its link, bandwidth[src, dst]; between
two nodes also the egress port of the source's node and the ingress port of the destination's
(two ranks of one node talk over their intra-node link and use no port); between two racks also
the up-link of the source's rack and the down-link of the destination's; and, where the network
gives ranks a memory bandwidth (``rank_in``, ``rank_out``: what one rank can copy in and out at
once), the destination's and the source's. Capacities in B/s, latencies in s. How a phase of
transfers shares them is :mod:`.phases`.
"""

import numpy as np

from ..machine import members
from ..matrix import BandwidthMatrix

UNIFORM_MATRIX_LIMIT = 2048  # the largest uniform network built as an N x N matrix (for BAM/KM trees)


class Network:
    """Links between N ranks, the node of each rank with its ports, and the rack of each node
    with its uplinks; capacities in B/s, latencies in s. Build one with :meth:`from_matrix` or
    :meth:`uniform` (which needs no N x N matrix, for very many ranks)."""

    def __init__(self, n, nodes, egress, ingress, link, racks=None, up=None, down=None, matrix=None,
                 node_matrix=None, describe=None, rank_in=None, rank_out=None):
        self.n = int(n)
        self.nodes = np.asarray(nodes, dtype=np.int64)
        self.node_count = int(self.nodes.max()) + 1
        self.egress = np.asarray(egress, dtype=float)
        self.ingress = np.asarray(ingress, dtype=float)
        self._link = link  # (src array, dst array) -> (B/s array, s array)
        self.racks = None if racks is None else np.asarray(racks, dtype=np.int64)
        self.up = None if up is None else np.asarray(up, dtype=float)
        self.down = None if down is None else np.asarray(down, dtype=float)
        self._matrix = matrix  # a BandwidthMatrix, or a function that builds one
        self._node_matrix = node_matrix  # a function: the K x K BandwidthMatrix between the nodes
        self.describe = describe
        # what each rank can copy in and out at once (its memory bandwidth); None: no limit
        self.rank_in = None if rank_in is None else np.asarray(rank_in, dtype=float)
        self.rank_out = None if rank_out is None else np.asarray(rank_out, dtype=float)

    @classmethod
    def from_matrix(cls, matrix, ports="capacity"):
        """The network of a :class:`topology.BandwidthMatrix`. ``ports="capacity"``: the file's
        ports, or where it has none each node's fastest link out and in
        (:meth:`BandwidthMatrix.port_capacity`); ``ports="file"``: the file's ports only, none
        (unlimited) where it has none."""
        if ports not in ("capacity", "file"):
            raise ValueError(f"ports must be 'capacity' or 'file', not {ports!r}")
        bandwidth, latency = matrix.bandwidth * 1e9, matrix.latency * 1e-6

        def link(src, dst):
            return bandwidth[src, dst], latency[src, dst]

        capacity = matrix.port_capacity() if ports == "capacity" else matrix.ports
        if capacity is None:
            capacity = {"egress": np.full(matrix.node_count, np.inf), "ingress": np.full(matrix.node_count, np.inf)}
        up = down = None
        if matrix.uplinks is not None:
            up, down = matrix.uplinks["up"] * 1e9, matrix.uplinks["down"] * 1e9
        return cls(matrix.size, matrix.nodes, np.asarray(capacity["egress"]) * 1e9,
                   np.asarray(capacity["ingress"]) * 1e9, link, matrix.racks if up is not None else None,
                   up, down, matrix, matrix.node_matrix)

    @classmethod
    def uniform(cls, n, beta_GBps, alpha_us, ranks_per_node=1, intra_GBps=None, intra_alpha_us=None,
                nodes=None, rank_GBps=None):
        """``n`` ranks, ``ranks_per_node`` consecutive ranks a node (the last node may have
        fewer), or each rank on node ``nodes[rank]``; links between nodes of ``beta_GBps`` and
        ``alpha_us``, within a node of ``intra_GBps`` (default 10 x beta) and ``intra_alpha_us``
        (default alpha_us); each node's port ``beta_GBps`` out and in; with ``rank_GBps``,
        each rank's memory that much in and out. Nothing of size N x N is made."""
        r = int(ranks_per_node)
        if n < 1 or r < 1:
            raise ValueError("the rank count and the ranks per node must be positive")
        intra = 10 * beta_GBps if intra_GBps is None else intra_GBps
        intra_alpha = alpha_us if intra_alpha_us is None else intra_alpha_us
        if min(beta_GBps, intra) <= 0 or min(alpha_us, intra_alpha) < 0:
            raise ValueError("bandwidths must be positive and start-up times not negative")
        nodes = np.arange(n) // r if nodes is None else np.asarray(nodes, dtype=np.int64)
        beta, alpha, beta_in, alpha_in = beta_GBps * 1e9, alpha_us * 1e-6, intra * 1e9, intra_alpha * 1e-6

        def link(src, dst):
            same = nodes[src] == nodes[dst]
            return np.where(same, beta_in, beta), np.where(same, alpha_in, alpha)

        def matrix():
            if n > UNIFORM_MATRIX_LIMIT:
                raise ValueError(f"the BAM and KM trees need the {n} x {n} link matrix; "
                                 f"this model builds it for at most {UNIFORM_MATRIX_LIMIT} ranks")
            same = nodes[:, None] == nodes[None, :]
            return BandwidthMatrix(np.where(same, float(intra), float(beta_GBps)),
                                   np.where(same, float(intra_alpha), float(alpha_us)),
                                   [f"node{v}" for v in nodes], {"synthetic": "uniform"}, nodes.tolist(),
                                   {"egress": [float(beta_GBps)] * k, "ingress": [float(beta_GBps)] * k})

        k = int(nodes.max()) + 1

        def node_matrix():
            if k > UNIFORM_MATRIX_LIMIT:
                raise ValueError(f"a tree over {k} nodes needs their {k} x {k} link matrix; "
                                 f"this model builds it for at most {UNIFORM_MATRIX_LIMIT} nodes")
            return BandwidthMatrix(np.full((k, k), float(beta_GBps)), np.full((k, k), float(alpha_us)),
                                   measured={"synthetic": "uniform"},
                                   ports={"egress": [float(beta_GBps)] * k, "ingress": [float(beta_GBps)] * k})

        memory = None if rank_GBps is None else np.full(n, rank_GBps * 1e9)
        return cls(n, nodes, np.full(k, beta), np.full(k, beta), link, matrix=matrix, node_matrix=node_matrix,
                   describe={"beta_GBps": beta_GBps, "alpha_us": alpha_us, "ranks_per_node": r,
                             "intra_GBps": intra, "intra_alpha_us": intra_alpha, "rank_GBps": rank_GBps},
                   rank_in=memory, rank_out=memory)

    def link(self, src, dst):
        """(bandwidth B/s, latency s) of the links src[i] -> dst[i]."""
        return self._link(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))

    @property
    def has_matrix(self):
        """Whether the N x N matrix is at hand (not to be built from uniform links)."""
        return self._matrix is not None and not callable(self._matrix)

    @property
    def matrix(self):
        """The :class:`topology.BandwidthMatrix` (built on first use for a uniform network)."""
        if callable(self._matrix):
            self._matrix = self._matrix()
        return self._matrix

    def node_matrix(self):
        """The K x K :class:`topology.BandwidthMatrix` between the nodes (their first ranks)."""
        return self._node_matrix()

    def node_ranks(self):
        """The ranks of each node, in rank order (:func:`topology.machine.members`)."""
        return [np.asarray(ranks, dtype=np.int64) for ranks in members(self.nodes.tolist())]
