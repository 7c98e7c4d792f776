"""The cost model: an all-reduce's time on a network, from the schedule of its algorithm.

An algorithm's schedule is a function ``schedule(model, nbytes)`` that says how it runs as a
list of parts ``(count, label, PhaseTime)``: a phase of concurrent transfers (:mod:`.phases`)
run ``count`` times. The schedules live with the algorithms (``algorithms/<name>.py``, each its
``schedule``), which hand them to :class:`Model`; this module knows no algorithm by name. It
gives the schedules what they are built from: phases kept by key (:meth:`Model.phase`),
pipelined trees (:meth:`Model.pipelined`), the trees and the bottleneck ring of the links
(:meth:`Model.tree`, :meth:`Model.bottleneck_ring`), and anything else a schedule builds once
(:meth:`Model.kept`). An estimate's time is the sum of its parts; what limits it is the
resource its phases spend the most time on (:func:`.phases.limit_of`); the lower bound of any
all-reduce on the same network is :mod:`.lower_bound`.
"""

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from ..build import build_tree
from ..rings import bottleneck_ring
from ..trees import binomial_tree
from .lower_bound import LowerBound
from .network import Network
from .phases import Limit, Phase, limit_of


@dataclass
class Estimate:
    """An algorithm's predicted ``seconds``: the sum of ``parts``, each (count, label,
    :class:`.phases.PhaseTime`): a phase run count times."""

    seconds: float
    parts: list = field(default_factory=list)

    @property
    def limit(self):
        """What the time is mostly made of (:class:`.phases.Limit`)."""
        if not self.parts:
            return Limit("none", "nothing moves")
        return limit_of([(count, phase) for count, _, phase in self.parts])

    def part(self, label):
        """The PhaseTime of the part named ``label`` (e.g. "period")."""
        return next(phase for _, name, phase in self.parts if name == label)


class Model:
    """Predicted all-reduce times on a :class:`topology.BandwidthMatrix` or a
    :class:`.network.Network`, of the algorithms whose ``schedules`` ({name: schedule}) it is
    given. ``ports``: "capacity" (the file's ports, or each node's fastest link where it has
    none) or "file" (the file's ports only, unlimited where it has none). ``across``: a
    choice the schedules may read (hier's all-reduce between the nodes); the model itself knows
    no algorithm and no choice of one."""

    def __init__(self, matrix, schedules, ports="capacity", across="ring"):
        self.network = matrix if isinstance(matrix, Network) else Network.from_matrix(matrix, ports)
        self.n = self.network.n
        self.schedules = dict(schedules)
        self.across = across
        self._kept = {}
        self._variants = {across: self}
        self._bound = None

    @property
    def matrix(self):
        return self.network.matrix

    # ---- the public calls

    def time(self, algorithm, nbytes, across=None):
        """Predicted seconds of one all-reduce of ``nbytes`` per rank."""
        return self.estimate(algorithm, nbytes, across).seconds

    def limit(self, algorithm, nbytes, across=None):
        """What binds it: a :class:`.phases.Limit`, ``str()`` of which is "latency", "link",
        "port", "uplink" or "memory" and whose ``detail`` names the resource ("ingress port of node 0")."""
        return self.estimate(algorithm, nbytes, across).limit

    def busbw(self, algorithm, nbytes, across=None):
        """Predicted busbw in GB/s: M / T x 2(N-1)/N."""
        t = self.time(algorithm, nbytes, across)
        return nbytes / t / 1e9 * 2 * (self.n - 1) / self.n if t > 0 else 0.0

    def estimate(self, algorithm, nbytes, across=None):
        """The :class:`Estimate` of one all-reduce: its seconds and its phases (``across``:
        hier's all-reduce between the nodes for this estimate, else the model's)."""
        schedule = self.schedules.get(algorithm)
        if schedule is None:
            raise ValueError(f"unknown algorithm {algorithm!r}; choices: {', '.join(self.schedules)}")
        if self.n == 1:
            return Estimate(0.0)
        parts = schedule(self._with_across(across), float(nbytes))
        return Estimate(sum(count * phase.seconds for count, _, phase in parts), parts)

    def lower_bound(self, nbytes):
        """The :class:`.lower_bound.Bound` no all-reduce of ``nbytes`` per rank can beat here."""
        if self._bound is None:
            self._bound = LowerBound(self.network)
        return self._bound.at(nbytes)

    def crossover(self, faster="ring", slower="tree"):
        """The smallest message size (bytes) from which ``faster`` beats ``slower``, or None."""
        def gap(m):
            return self.time(faster, m) - self.time(slower, m)
        if gap(1 << 50) >= 0:
            return None
        if gap(1) < 0:
            return 1
        lo, hi = 1.0, float(1 << 50)
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if gap(mid) >= 0 else (lo, mid)
        return int(math.ceil(hi))

    def _with_across(self, across):
        """This model, or one that shares its caches and carries another ``across``."""
        if across is None:
            return self
        other = self._variants.get(across)
        if other is None:
            other = self._variants[across] = copy.copy(self)  # the same dicts: phases and trees kept once
            other.across = across
        return other

    # ---- what schedules are built from

    def kept(self, key, build):
        """``build()``, made once per ``key`` and kept (phases, trees, orders)."""
        value = self._kept.get(key)
        if value is None:
            value = self._kept[key] = build()
        return value

    def phase(self, key, build, concurrent=True):
        """The kept :class:`.phases.Phase` ``key`` of the (src, dst) arrays ``build()`` returns."""
        return self.kept(("phase", key), lambda: Phase(self.network, *build(), concurrent))

    def tree(self, method):
        """The :class:`topology.Tree` that ``method`` ("binomial", "bam", "km") builds on these
        links, rooted at rank 0 (on uniform links the binomial tree needs no matrix)."""
        def build():
            if method == "binomial" and not self.network.has_matrix:
                tree = binomial_tree(self.n)
                tree.bottlenecks = [self._slowest(level) for level in tree.levels]
                return tree
            return build_tree(self.matrix, root=0, method=method)
        return self.kept(("tree", method), build)

    def tree_edges(self, method):
        """The (parent, child) rows of every level of :meth:`tree`, as one array."""
        return self.kept(("edges", method), lambda: np.array(
            [pair for level in self.tree(method).levels for pair in level], dtype=np.int64).reshape(-1, 2))

    def bottleneck_ring(self):
        """The ring order whose slowest link is fastest (:func:`topology.rings.bottleneck_ring`),
        or None on uniform links, where every order is alike."""
        if not self.network.has_matrix:
            return None
        return self.kept("bamring", lambda: bottleneck_ring(self.matrix))

    def _slowest(self, level):
        """A level's slowest link in GB/s, the slower direction of each pair."""
        pairs = np.array(level).reshape(-1, 2)
        up, _ = self.network.link(pairs[:, 1], pairs[:, 0])
        down, _ = self.network.link(pairs[:, 0], pairs[:, 1])
        return float(np.minimum(up, down).min()) / 1e9

    def pipelined(self, key, forests, share, segment_bytes):
        """Pipelined trees as ``algorithms/catalog/tree.py`` runs them, step by step: each of
        ``forests`` (arrays of (parent, child) rows: a tree, or disjoint trees) carries ``share``
        bytes in S = ceil(share / ``segment_bytes``) segments of s bytes; at step i a rank of
        height h sends segment i - h up and a parent at depth d segment i - H - d down to each
        child (H its root's height). A step takes the phase of the transfers active in it;
        steps with the same transfers are one part ("period" where every transfer is active)."""
        count = max(1, math.ceil(share / segment_bytes))
        s = share / count
        src, dst, first = self.kept(("schedule", key), lambda: _schedule(forests))
        if not len(src):
            return []
        events = np.unique(np.concatenate([first, first + count]))
        parts = []
        for lo, hi in zip(events[:-1], events[1:]):
            active = (first <= lo) & (lo < first + count)
            if not active.any():
                continue
            label = "period" if active.all() else f"steps {lo}-{hi - 1}"
            phase = self.phase((*key, active.tobytes()), lambda a=active: (src[a], dst[a]))
            parts.append((int(hi - lo), label, phase.time(s)))
        return parts


def _schedule(forests):
    """(src, dst, first step) of every transfer of pipelined ``forests`` (see
    :meth:`Model.pipelined`): up from each child at its height, down to each child at its
    root's height plus its parent's depth; a transfer is active from its first step for S steps."""
    src, dst, first = [], [], []
    for edges in forests:
        parent = {int(c): int(p) for p, c in edges}
        children = {}
        for p, c in edges:
            children.setdefault(int(p), []).append(int(c))
        depth, root = {}, {}
        order = [r for r in children if r not in parent]
        for r in order:
            depth[r], root[r] = 0, r
        for r in order:  # breadth first: parents before children
            for c in children.get(r, []):
                depth[c], root[c] = depth[r] + 1, root[r]
                order.append(c)
        height = {}
        for r in reversed(order):
            height[r] = 1 + max((height[c] for c in children.get(r, [])), default=-1)
        for c, p in parent.items():
            src += [c, p]
            dst += [p, c]
            first += [height[c], height[root[p]] + depth[p]]
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(first, dtype=np.int64)
