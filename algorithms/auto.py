"""``algorithm="auto"``: per call, the algorithm measured fastest for the call's size, dtype,
placement (host or device memory) and rank layout, native ``MPI_Allreduce`` (:mod:`.native`) among them.

The measurements are a tuning table written by ``python -m bench tune`` (``results/tuning-<host>-<N>r.json``),
named by ``ALLREDUCE_TUNING_FILE``; rank 0 reads it and every rank gets its copy, so all choose
alike. A table applies to a communicator of its rank and node count; it lists, per placement and
dtype ("*": any), size ranges and the candidates fastest first, and a call takes the first one
that can run it; never native MPI for max and min on floating point, where MPI need not give NaN
for an element that is NaN on one rank, as every algorithm of ours does. Where no table applies,
the alpha-beta closed forms below decide among our algorithms (seed 000, section 5; the model knows
nothing of native MPI's, so it never picks it), with alpha per message step and beta per transfer:

    oneshot  (one node)  ceil(M/C) alpha/2 + N M/beta     (C the one-shot buffer)
    rd       (log2 p + 2[N > p]) (alpha + M/beta)           (p the largest power of two <= N)
    ring     2(N-1) (alpha + M/(N beta))
    hier     (K nodes of R ranks, R > 1)  2(R-1)(alpha + M/(10 R beta)) + 2(K-1)(alpha + M/(K beta))

:func:`choice` says what a call of a size would run, and why.
"""

import json
import math
from collections import Counter

import numpy as np
from mpi4py import MPI

from topology.probe import node_numbers

from .settings import setting

SCHEMA = "allreduce-tuning/1"
MODEL_ALPHA_S = 4e-6  # one message step of our algorithms (bench perf: rd at 8 B on 2 ranks, 2-core EPYC)
MODEL_BETA = 5e9  # bytes per second of one transfer
CACHED = 1024  # (module, dtype, bytes) choices kept


def _registry():
    from .registry import ALGORITHMS  # which imports this module

    return ALGORITHMS


def candidates():
    """The registry's algorithms auto may choose: those that need no bandwidth matrix or tree, native MPI among them."""
    from .registry import needs_bandwidth

    return [name for name in _registry() if name != "auto" and not needs_bandwidth(name)]


def load_table(path):
    """The tuning table in ``path``, checked: a dict with ``ranks``, ``nodes`` and ``rules``;
    ``ValueError`` naming ``path`` and what is wrong with it otherwise."""
    try:
        with open(path, "rb") as f:
            table = json.loads(f.read())
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(table, dict) or table.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a tuning table (schema {SCHEMA!r}; python -m bench tune writes them)")
    rules = table.get("rules")
    if not isinstance(rules, list) or not all(isinstance(rule, dict) for rule in rules):
        raise ValueError(f"{path}: its rules are not a list of objects")
    known = set(candidates())
    for rule in rules:
        order, upto = rule.get("order"), rule.get("upto_bytes")
        if not isinstance(order, list) or (upto is not None and not isinstance(upto, int)):
            raise ValueError(f"{path}: a rule's order is not a list, or its upto_bytes not a whole number: {rule}")
        unknown = [str(name) for name in order if name not in known]
        if unknown or not order:
            raise ValueError(f"{path}: a rule names {', '.join(unknown) or 'no algorithm'}; "
                             f"candidates: {', '.join(sorted(known))}")
    return table


class Choices:
    """What auto runs on one communicator (collective to build): the table that applies, or the model."""

    def __init__(self, comm):
        self.size = comm.Get_size()
        counts = Counter(node_numbers(comm))  # the same on every rank, so every rank decides alike
        self.nodes, self.single_node = len(counts), len(counts) == 1
        self.per_node = counts[0] if len(set(counts.values())) == 1 else None  # None: nodes of different sizes
        path = setting("ALLREDUCE_TUNING_FILE")
        loaded = None
        if comm.Get_rank() == 0 and path:
            try:
                loaded = load_table(path)
            except ValueError as exc:
                loaded = f"ALLREDUCE_TUNING_FILE: {exc}"
        loaded = comm.bcast(loaded, root=0)
        if isinstance(loaded, str):
            raise ValueError(loaded)
        self.table, self.reason = None, "no tuning table (ALLREDUCE_TUNING_FILE unset): the model decides"
        if loaded is not None:
            if (loaded.get("ranks"), loaded.get("nodes")) == (self.size, self.nodes):
                self.table, self.reason = loaded, f"tuning table {path}"
            else:
                self.reason = (f"tuning table {path} is for {loaded.get('ranks')} ranks on {loaded.get('nodes')} "
                               f"node(s), this communicator {self.size} on {self.nodes}: the model decides")
        self._cache = {}

    def pick(self, xp, dtype, nbytes, op):
        """The function to run for a call of ``nbytes`` of ``dtype`` in module ``xp``'s memory."""
        key = (xp, dtype, nbytes, op)
        run = self._cache.get(key)
        if run is None:
            if len(self._cache) >= CACHED:
                self._cache.clear()
            run = self._cache[key] = _registry()[self.choose(xp.__name__ != "numpy", dtype.name, nbytes, op)[0]]
        return run

    def choose(self, device, dtype, nbytes, op="sum"):
        """(algorithm name, why) for a call of ``nbytes`` of ``dtype`` (device memory or not)."""
        usable = self._usable(dtype, op)
        if self.table is not None:
            placement = "device" if device else "host"
            rules = [r for r in self.table["rules"] if r.get("placement", "host") == placement]
            exact = [r for r in rules if r.get("dtype") == dtype]
            for rule in exact or [r for r in rules if r.get("dtype", "*") == "*"]:
                upto = rule.get("upto_bytes")
                if upto is None or nbytes <= upto:
                    for name in rule["order"]:
                        if name in usable:
                            return name, f"{self.reason}, {rule.get('dtype', '*')} up to {upto} bytes"
        return self.modelled(nbytes, usable), self.reason if self.table is None else (
            f"{self.reason} has no rule for this call: the model decides")

    def _usable(self, dtype, op):
        names = set(candidates())
        if op in ("max", "min") and np.dtype(dtype).kind == "f":
            names.discard("native")  # MPI's MAX and MIN need not give NaN where one rank has it; ours all do
        if not self.single_node:
            names.discard("oneshot")  # it would run recursive doubling
        return names

    def modelled(self, nbytes, usable):
        """The algorithm of least modelled time (module docstring) among ``usable``."""
        n, m, alpha, beta = self.size, nbytes, MODEL_ALPHA_S, MODEL_BETA
        if n == 1:
            return "ring"
        p = 1 << (n.bit_length() - 1)
        times = {"rd": (math.log2(p) + 2 * (n > p)) * (alpha + m / beta),
                 "ring": 2 * (n - 1) * (alpha + m / (n * beta))}
        if self.single_node:
            times["oneshot"] = math.ceil(max(m, 1) / setting("ALLREDUCE_ONESHOT_BYTES")) * alpha / 2 + n * m / beta
        if self.nodes > 1 and (self.per_node or 0) > 1:
            r, k = self.per_node, self.nodes
            times["hier"] = 2 * (r - 1) * (alpha + m / (10 * r * beta)) + 2 * (k - 1) * (alpha + m / (k * beta))
        return min((t, name) for name, t in times.items() if name in usable)[1]

    def free(self):
        pass


def choice(nbytes, dtype="float32", comm=None, device=False, op="sum"):
    """``(algorithm, why)``: what ``algorithm="auto"`` runs for ``nbytes`` of ``dtype`` on ``comm``
    (COMM_WORLD when None), on device memory when ``device``. Collective the first time per communicator."""
    from .executor import private_comm

    private = private_comm(MPI.COMM_WORLD if comm is None else comm)
    return private.resource("auto", Choices).choose(device, np.dtype(dtype).name, int(nbytes), op)


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype``: what the
    algorithm chosen for them binds (:meth:`executor.Collective.bound`), so a repeat pays
    nothing for the choice."""
    return coll.bound(coll.private.resource("auto", Choices).pick(coll.xp, dtype, count * dtype.itemsize, coll.op),
                      count, dtype)


def allreduce(coll, sendbuf, recvbuf):
    choices = coll.private.resources.get("auto") or coll.private.resource("auto", Choices)
    choices.pick(coll.xp, sendbuf.dtype, sendbuf.nbytes, coll.op)(coll, sendbuf, recvbuf)


allreduce.bind = bind
