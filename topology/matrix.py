"""Bandwidth matrices: the file format, its validation, synthetic generators, networkx export.

``bandwidth[i][j]`` is the bandwidth from rank i to rank j in GB/s (1e9 B/s),
``latency[i][j]`` the one-way latency in microseconds; the diagonal is ignored.
A bandwidth of 0 means no link. The file is JSON::

    {"format": "allreduce-bench/bandwidth-matrix", "version": 1, "ranks": S,
     "hosts": [...], "bandwidth_GBps": [[...]], "latency_us": [[...]],
     "measured": {"method": ..., "bytes": ..., "reps": ..., "mpi": ..., "date": ...}}
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np

from .files import write_json_atomically

FORMAT = "allreduce-bench/bandwidth-matrix"


@dataclass
class BandwidthMatrix:
    """Measured or synthetic link bandwidths (GB/s) and latencies (us) between S ranks."""

    bandwidth: np.ndarray
    latency: np.ndarray = None
    hosts: list = None
    measured: dict = field(default_factory=dict)

    def __post_init__(self):
        self.bandwidth = _square(self.bandwidth, "bandwidth")
        size = len(self.bandwidth)
        if self.latency is None:
            self.latency = np.zeros((size, size))
        self.latency = _square(self.latency, "latency")
        if self.latency.shape != self.bandwidth.shape:
            raise ValueError(f"latency is {self.latency.shape[0]}x{self.latency.shape[1]}, "
                             f"bandwidth is {size}x{size}")
        self.hosts = list(self.hosts) if self.hosts is not None else ["localhost"] * size
        if len(self.hosts) != size:
            raise ValueError(f"{len(self.hosts)} host names for {size} ranks")

    @property
    def size(self):
        return len(self.bandwidth)

    def links(self):
        """Symmetric link weights for trees: min of both directions (reduce goes up, broadcast
        down, so a tree edge is as fast as its slower direction); zero diagonal."""
        weights = np.minimum(self.bandwidth, self.bandwidth.T)
        np.fill_diagonal(weights, 0.0)
        return weights

    def check_ranks(self, ranks, source="the matrix"):
        if ranks != self.size:
            raise ValueError(f"{source} has {self.size} ranks, the communicator has {ranks}")

    def to_networkx(self):
        """A ``networkx.DiGraph``: one node per rank (attribute ``host``), one edge per link
        with attributes ``bandwidth`` (GB/s) and ``latency`` (us)."""
        import networkx as nx

        graph = nx.DiGraph()
        for rank, host in enumerate(self.hosts):
            graph.add_node(rank, host=host)
        for i, j in zip(*np.nonzero(self.bandwidth)):
            if i != j:
                graph.add_edge(int(i), int(j), bandwidth=float(self.bandwidth[i, j]),
                               latency=float(self.latency[i, j]))
        return graph

    def to_json(self):
        return {
            "format": FORMAT,
            "version": 1,
            "ranks": self.size,
            "hosts": self.hosts,
            "bandwidth_GBps": self.bandwidth.tolist(),
            "latency_us": self.latency.tolist(),
            "measured": self.measured,
        }

    def save(self, path):
        """Write the JSON file atomically (a temporary file renamed over ``path``)."""
        write_json_atomically(path, self.to_json())

    @classmethod
    def load(cls, path, ranks=None):
        """Read and validate a matrix file; ``ranks`` (if given) must match its rank count."""
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as exc:
            raise ValueError(f"cannot read bandwidth matrix {path}: {exc.strerror or exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"bandwidth matrix {path} is not valid JSON: {exc}") from None
        try:
            matrix = cls.from_json(data)
        except ValueError as exc:
            raise ValueError(f"bandwidth matrix {path}: {exc}") from None
        if ranks is not None:
            matrix.check_ranks(ranks, f"bandwidth matrix {path}")
        return matrix

    @classmethod
    def from_json(cls, data):
        if not isinstance(data, dict) or "bandwidth_GBps" not in data:
            raise ValueError("no 'bandwidth_GBps' matrix in it")
        matrix = cls(data["bandwidth_GBps"], data.get("latency_us"), data.get("hosts"),
                     data.get("measured") or {})
        if "ranks" in data and data["ranks"] != matrix.size:
            raise ValueError(f"'ranks' says {data['ranks']} but the matrix is {matrix.size}x{matrix.size}")
        return matrix


def as_matrix(source, ranks=None):
    """A :class:`BandwidthMatrix` from a matrix object, an S x S array-like, or a file path."""
    if isinstance(source, BandwidthMatrix):
        matrix = source
    elif isinstance(source, (str, os.PathLike)):
        return BandwidthMatrix.load(source, ranks)
    else:
        matrix = BandwidthMatrix(source)
    if ranks is not None:
        matrix.check_ranks(ranks)
    return matrix


def _square(values, name):
    try:
        array = np.array(values, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a square matrix of numbers") from None
    if array.ndim != 2 or array.shape[0] != array.shape[1]:
        raise ValueError(f"{name} must be square, got shape {array.shape}")
    off_diagonal = ~np.eye(len(array), dtype=bool)
    bad = ~np.isfinite(array) & off_diagonal
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"{name}[{i}][{j}] is {array[i, j]}, not a finite number")
    negative = (array < 0) & off_diagonal
    if negative.any():
        i, j = np.argwhere(negative)[0]
        raise ValueError(f"{name}[{i}][{j}] is negative ({array[i, j]})")
    np.fill_diagonal(array, 0.0)
    return array


# ---- synthetic topologies ----

def uniform(size, bandwidth=10.0, latency=1.0):
    """Every link alike."""
    b = np.full((size, size), float(bandwidth))
    return BandwidthMatrix(b, np.full((size, size), float(latency)), measured={"synthetic": "uniform"})


def two_level(nodes, ranks_per_node, intra=100.0, inter=10.0, intra_latency=1.0, inter_latency=5.0):
    """``nodes`` nodes of ``ranks_per_node`` ranks: fast links inside a node, slow between nodes."""
    node = np.repeat(np.arange(nodes), ranks_per_node)
    same = node[:, None] == node[None, :]
    b = np.where(same, float(intra), float(inter))
    lat = np.where(same, float(intra_latency), float(inter_latency))
    hosts = [f"node{n}" for n in node]
    return BandwidthMatrix(b, lat, hosts, {"synthetic": "two_level", "nodes": nodes,
                                           "ranks_per_node": ranks_per_node})


def random_heterogeneous(size, low=1.0, high=100.0, seed=0, symmetric=True):
    """Bandwidths drawn uniformly from [low, high) with a seeded generator."""
    rng = np.random.default_rng(seed)
    b = rng.uniform(low, high, size=(size, size))
    if symmetric:
        b = np.triu(b, 1) + np.triu(b, 1).T
    return BandwidthMatrix(b, np.ones((size, size)), measured={"synthetic": "random_heterogeneous",
                                                                "seed": seed, "low": low, "high": high})


#: The seed paper's 2x2 example (seed 001, its table): rows U = {A, B}, columns V = {a, b}.
#: Scheme 1 (A-a, B-b): sum 9, minimum 4. Scheme 2 (A-b, B-a): sum 10, minimum 3.
SEED_EXAMPLE_WEIGHTS = np.array([[5.0, 7.0],
                                 [3.0, 4.0]])


def seed_example():
    """Four ranks A=0, B=1, a=2, b=3 whose second tree level is the seed's 2x2 example:
    from root A the first level takes B (the fastest link), then U = {A, B} meets V = {a, b}."""
    b = np.array([[0.0, 10.0, 5.0, 7.0],
                  [10.0, 0.0, 3.0, 4.0],
                  [5.0, 3.0, 0.0, 1.0],
                  [7.0, 4.0, 1.0, 0.0]])
    return BandwidthMatrix(b, np.ones((4, 4)), ["A", "B", "a", "b"], {"synthetic": "seed_example"})
