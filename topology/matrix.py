"""Bandwidth matrices: the file format, its validation, synthetic generators, networkx export.

``bandwidth[i][j]`` is the bandwidth from rank i to rank j in GB/s (1e9 B/s),
``latency[i][j]`` the one-way latency in microseconds; the diagonal is ignored.
A bandwidth of 0 means no link. The file is JSON::

    {"format": "allreduce-bench/bandwidth-matrix", "version": 2, "ranks": S,
     "hosts": [...], "bandwidth_GBps": [[...]], "latency_us": [[...]],
     "nodes": [node of each rank], "ports_GBps": {"egress": [...], "ingress": [...]},
     "racks": [rack of each node], "uplinks_GBps": {"up": [...], "down": [...]},
     "measured": {"method": ..., "bytes": ..., "reps": ..., "mpi": ..., "date": ...}}

Version 2 adds the optional node and port fields; version 1 files (without them) still load.
``measured["floor"]`` (the probe's, :mod:`.floor`) holds what the lower bound of any all-reduce
needs (:mod:`.model.lower_bound`): ``mpi_us`` and ``flag_us``, S x S, half the least round trip
of a 1-byte MPI ping-pong timed in C and of a flag in shared memory (null where not measured),
and ``hosts``: {host: {"cpu": ..., "copy_GBps": {bytes: GB/s}}}, its fastest copies; or
``problem`` alone, why they could not be measured. Files without it (older probes) still load.
``nodes`` numbers the nodes 0..K-1; without it every rank is a node of its own. A pair of
ranks on one node is an intra-node link (shared memory, no port). ``ports_GBps`` holds each
node's network port (NIC) capacity out of and into the node, shared by all of the node's
concurrent transfers to other nodes; ``racks`` and ``uplinks_GBps`` (per rack, out of and
into it) describe switches whose uplinks transfers between racks share. Missing ports or
uplinks mean "not limited beyond the links".

Files and arrays are checked entry by entry, with one rule for every use: every entry a
number (JSON ``true`` or ``"5"`` is not), finite, not negative, bandwidths at most
:data:`MAX_BANDWIDTH_GBPS` and latencies at most :data:`MAX_LATENCY_US` (off the diagonal);
``ranks`` an integer equal to the matrix's size, ``hosts`` a list of that many names. A
``ValueError`` names the first entry that breaks a rule.
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np

from plumbing.files import write_json_atomically

FORMAT = "allreduce-bench/bandwidth-matrix"
VERSION = 2
MAX_BANDWIDTH_GBPS = 1e5  # 100 TB/s: a hundred times the fastest link there is
MAX_LATENCY_US = 1e7  # 10 s
_LIMITS = {"bandwidth": (MAX_BANDWIDTH_GBPS, "GB/s"), "latency": (MAX_LATENCY_US, "us")}


@dataclass
class BandwidthMatrix:
    """Measured or synthetic link bandwidths (GB/s) and latencies (us) between S ranks."""

    bandwidth: np.ndarray
    latency: np.ndarray = None
    hosts: list = None
    measured: dict = field(default_factory=dict)
    nodes: list = None
    ports: dict = None
    racks: list = None
    uplinks: dict = None

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
        self.nodes = _node_numbers(self.nodes, size, "nodes", "rank")
        self.ports = _in_out(self.ports, self.node_count, "ports_GBps", ("egress", "ingress"), "node")
        if self.racks is not None:
            self.racks = _node_numbers(self.racks, self.node_count, "racks", "node")
        if self.uplinks is not None and self.racks is None:
            raise ValueError("uplinks_GBps needs racks: the rack of each node")
        racks = max(self.racks) + 1 if self.racks is not None else 0
        self.uplinks = _in_out(self.uplinks, racks, "uplinks_GBps", ("up", "down"), "rack")
        self.floor()  # checked here, read where used

    def floor(self):
        """The lower bound's figures of ``measured["floor"]``, checked: None where there is none;
        else {"mpi_us", "flag_us": S x S arrays (nan where not measured), "copy_GBps": S, the
        fastest copy of each rank's host at any size (nan where unknown), "problem": text or None}."""
        record = self.measured.get("floor") if isinstance(self.measured, dict) else None
        if record is None:
            return None
        if not isinstance(record, dict):
            raise ValueError(f"'measured'['floor'] is {_kind(record)}, not an object")
        size = self.size
        found = {"problem": record.get("problem"), "copy_GBps": np.full(size, np.nan)}
        for key in ("mpi_us", "flag_us"):
            rows = record.get(key)
            if rows is None:
                found[key] = np.full((size, size), np.nan)
                continue
            if not isinstance(rows, list) or len(rows) != size or \
                    not all(isinstance(row, list) and len(row) == size for row in rows):
                raise ValueError(f"'measured'['floor'][{key!r}] must be a {size} x {size} matrix")
            values = [[np.nan if v is None else v for v in row] for row in rows]
            array = _numbers(values, f"'measured'['floor'][{key!r}]")
            off = ~np.eye(size, dtype=bool)
            bad = off & ~np.isnan(array) & ((array < 0) | (array > MAX_LATENCY_US))
            if bad.any():
                i, j = np.argwhere(bad)[0]
                raise ValueError(f"'measured'['floor'][{key!r}][{i}][{j}] is {array[i, j]:g}, not a latency in us")
            np.fill_diagonal(array, np.nan)
            found[key] = array
        hosts = record.get("hosts", {})
        if not isinstance(hosts, dict):
            raise ValueError(f"'measured'['floor']['hosts'] is {_kind(hosts)}, not an object")
        for host, entry in hosts.items():
            copies = entry.get("copy_GBps") if isinstance(entry, dict) else None
            if not isinstance(copies, dict) or not copies:
                raise ValueError(f"'measured'['floor']['hosts'][{host!r}] has no 'copy_GBps' object")
            rates = _numbers([list(copies.values())], f"'measured'['floor']['hosts'][{host!r}]['copy_GBps']",
                             square=False)[0]
            if (~np.isfinite(rates) | (rates <= 0) | (rates > MAX_BANDWIDTH_GBPS)).any():
                raise ValueError(f"'measured'['floor']['hosts'][{host!r}]['copy_GBps'] holds a rate outside "
                                 f"(0, {MAX_BANDWIDTH_GBPS:g}] GB/s")
            found["copy_GBps"][[r for r, h in enumerate(self.hosts) if h == host]] = rates.max()
        return found

    @property
    def size(self):
        return len(self.bandwidth)

    @property
    def node_count(self):
        return max(self.nodes) + 1

    def intra_node(self):
        """S x S booleans: True where both ranks are on one node (the diagonal included)."""
        nodes = np.asarray(self.nodes)
        return nodes[:, None] == nodes[None, :]

    def leaders(self):
        """The first rank of each node, in node order."""
        return [self.nodes.index(k) for k in range(self.node_count)]

    def node_matrix(self):
        """The K x K :class:`BandwidthMatrix` between the nodes' first ranks, with the ports and
        racks: the network between the nodes."""
        lead = self.leaders()
        return BandwidthMatrix(self.bandwidth[np.ix_(lead, lead)], self.latency[np.ix_(lead, lead)],
                               [self.hosts[r] for r in lead],
                               {k: v for k, v in self.measured.items() if k not in ("machines", "floor")}, None, self.ports,
                               self.racks, self.uplinks)

    def port_capacity(self):
        """{"egress": K GB/s, "ingress": K GB/s}: the ports of the file, or where it has none,
        each node's fastest link out of and into it (a port at least as fast as any one link;
        a node with no other node gets an unlimited port)."""
        if self.ports is not None:
            return self.ports
        nodes = np.asarray(self.nodes)
        egress, ingress = np.full(self.node_count, np.inf), np.full(self.node_count, np.inf)
        for k in range(self.node_count):
            inside, outside = nodes == k, nodes != k
            if outside.any():
                egress[k] = self.bandwidth[np.ix_(inside, outside)].max()
                ingress[k] = self.bandwidth[np.ix_(outside, inside)].max()
        return {"egress": egress, "ingress": ingress}

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
        data = {
            "format": FORMAT,
            "version": VERSION,
            "ranks": self.size,
            "hosts": self.hosts,
            "bandwidth_GBps": self.bandwidth.tolist(),
            "latency_us": self.latency.tolist(),
            "nodes": self.nodes,
            "measured": self.measured,
        }
        if self.ports is not None:
            data["ports_GBps"] = {k: v.tolist() for k, v in self.ports.items()}
        if self.racks is not None:
            data["racks"] = self.racks
        if self.uplinks is not None:
            data["uplinks_GBps"] = {k: v.tolist() for k, v in self.uplinks.items()}
        return data

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
        except RecursionError:
            raise ValueError(f"bandwidth matrix {path} is nested too deeply to be a bandwidth matrix") from None
        try:
            matrix = cls.from_json(data)
        except ValueError as exc:
            raise ValueError(f"bandwidth matrix {path}: {exc}") from None
        if ranks is not None:
            matrix.check_ranks(ranks, f"bandwidth matrix {path}")
        return matrix

    @classmethod
    def from_json(cls, data):
        if not isinstance(data, dict):
            raise ValueError(f"the file holds {_kind(data)}, not an object with a 'bandwidth_GBps' matrix")
        if "bandwidth_GBps" not in data:
            raise ValueError("no 'bandwidth_GBps' matrix in it")
        if "format" in data and data["format"] != FORMAT:
            raise ValueError(f"'format' is {data['format']!r}, not {FORMAT!r}")
        if "version" in data and (type(data["version"]) is not int or data["version"] not in (1, VERSION)):
            raise ValueError(f"'version' is {data['version']!r}; this reader knows versions 1 and {VERSION}")
        hosts = data.get("hosts")
        if hosts is not None and (not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts)):
            bad = hosts if not isinstance(hosts, list) else next(h for h in hosts if not isinstance(h, str))
            raise ValueError(f"'hosts' must be a list of host names; it holds {_kind(bad)} {bad!r}"[:200])
        measured = data.get("measured")
        measured = {} if measured is None else measured
        if not isinstance(measured, dict):
            raise ValueError(f"'measured' is {_kind(measured)}, not an object")
        matrix = cls(data["bandwidth_GBps"], data.get("latency_us"), hosts, measured, data.get("nodes"),
                     data.get("ports_GBps"), data.get("racks"), data.get("uplinks_GBps"))
        if "ranks" in data:
            ranks = data["ranks"]
            if type(ranks) is not int:
                raise ValueError(f"'ranks' is {_kind(ranks)} {ranks!r}, not an integer"[:200])
            if ranks != matrix.size:
                raise ValueError(f"'ranks' says {ranks} but the matrix is {matrix.size}x{matrix.size}")
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
    """``values`` as a square float array, checked entry by entry (see the module docstring)."""
    label = f"{name}_GBps" if name == "bandwidth" else f"{name}_us"
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iuf":
            raise ValueError(f"{label} must hold numbers, not {values.dtype} values")
        array = values.astype(float)
    else:
        array = _numbers(values, label)
    if array.ndim != 2 or array.shape[0] != array.shape[1] or array.shape[0] == 0:
        raise ValueError(f"{label} must be a square matrix with a row per rank, got shape {array.shape}")
    off_diagonal = ~np.eye(len(array), dtype=bool)
    limit, unit = _LIMITS[name]
    with np.errstate(invalid="ignore"):
        checks = ((~np.isfinite(array), "not a finite number"), (array < 0, "negative"),
                  (array > limit, f"above the largest plausible {name}, {limit:g} {unit}"))
    for bad, what in checks:
        bad &= off_diagonal
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise ValueError(f"{label}[{i}][{j}] is {array[i, j]:g}, {what}")
    np.fill_diagonal(array, 0.0)
    return array


def _node_numbers(values, count, label, what):
    """A list of ``count`` node (or rack) numbers 0..K-1, each used; None: one per ``what``."""
    if values is None:
        return list(range(count))
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise ValueError(f"'{label}' is {_kind(values)}, not a list with a number per {what}")
    if len(values) != count:
        raise ValueError(f"'{label}' has {len(values)} entries for {count} {what}s")
    numbers = []
    for i, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"'{label}'[{i}] is {_kind(value)} {value!r}, not a number from 0"[:200])
        numbers.append(int(value))
    missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
    if missing:
        raise ValueError(f"'{label}' numbers them 0..{max(numbers)} but never uses {missing[0]}")
    return numbers


def _in_out(values, count, label, keys, what):
    """{key: array of ``count`` GB/s} for the two ``keys`` (out, in), or None."""
    if values is None:
        return None
    if not isinstance(values, dict) or set(values) != set(keys):
        raise ValueError(f"'{label}' must be an object with the lists {keys[0]!r} and {keys[1]!r}")
    out = {}
    for key in keys:
        row = values[key]
        if not isinstance(row, (list, tuple, np.ndarray)):
            raise ValueError(f"'{label}'[{key!r}] is {_kind(row)}, not a list of GB/s, one per {what}")
        if len(row) != count:
            raise ValueError(f"'{label}'[{key!r}] has {len(row)} entries for {count} {what}{'s' if count != 1 else ''}")
        array = _numbers([row], f"'{label}'[{key!r}]", square=False)[0]
        bad = ~np.isfinite(array) | (array <= 0) | (array > MAX_BANDWIDTH_GBPS)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"'{label}'[{key!r}][{i}] is {array[i]:g}, not a bandwidth in (0, {MAX_BANDWIDTH_GBPS:g}] GB/s")
        out[key] = array
    return out


def _numbers(rows, label, square=True):
    """A nested list of JSON numbers as a float array; ``ValueError`` naming the first entry
    that is not a number (a string, a boolean, null, an integer too large for a float). Not
    ``square``: one row, named ``label[j]``."""
    if not isinstance(rows, (list, tuple)):
        raise ValueError(f"{label} is {_kind(rows)}, not a list of rows")
    out = np.zeros((len(rows), len(rows) if square else len(rows[0])))
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple, np.ndarray)):
            raise ValueError(f"{label}[{i}] is {_kind(row)}, not a row of numbers")
        if square and len(row) != len(rows):
            raise ValueError(f"{label} must be square: row {i} has {len(row)} entries for {len(rows)} rows")
        for j, value in enumerate(row):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                where = f"{label}[{i}][{j}]" if square else f"{label}[{j}]"
                raise ValueError(f"{where} is {_kind(value)} {value!r}, not a number"[:200])
            try:
                out[i, j] = float(value)
            except OverflowError:
                raise ValueError(f"{label}[{i}][{j}] is an integer of {len(str(value))} digits, "
                                 "too large for a number of GB/s or us") from None
    return out


def _kind(value):
    """``value``'s JSON kind, for messages."""
    if isinstance(value, (bool, np.bool_)):
        return "a boolean"
    if value is None:
        return "null"
    return {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), f"a {type(value).__name__}")


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
                                           "ranks_per_node": ranks_per_node}, node.tolist())


def random_heterogeneous(size, low=1.0, high=100.0, seed=0, symmetric=True):
    """Bandwidths drawn uniformly from [low, high) with a seeded generator."""
    rng = np.random.default_rng(seed)
    b = rng.uniform(low, high, size=(size, size))
    if symmetric:
        b = np.triu(b, 1) + np.triu(b, 1).T
    return BandwidthMatrix(b, np.ones((size, size)), measured={"synthetic": "random_heterogeneous",
                                                                "seed": seed, "low": low, "high": high})


#: The 2x2 example of the bottleneck-aware matching: rows U = {A, B}, columns V = {a, b}.
#: Scheme 1 (A-a, B-b): sum 9, minimum 4. Scheme 2 (A-b, B-a): sum 10, minimum 3.
SEED_EXAMPLE_WEIGHTS = np.array([[5.0, 7.0],
                                 [3.0, 4.0]])


def seed_example():
    """Four ranks A=0, B=1, a=2, b=3 whose second tree level is BAM's 2x2 example:
    from root A the first level takes B (the fastest link), then U = {A, B} meets V = {a, b}."""
    b = np.array([[0.0, 10.0, 5.0, 7.0],
                  [10.0, 0.0, 3.0, 4.0],
                  [5.0, 3.0, 0.0, 1.0],
                  [7.0, 4.0, 1.0, 0.0]])
    return BandwidthMatrix(b, np.ones((4, 4)), ["A", "B", "a", "b"], {"synthetic": "seed_example"})
