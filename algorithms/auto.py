"""``algorithm="auto"``: per call, the algorithm measured fastest for the call's size, dtype,
placement (host or device memory) and rank layout, native ``MPI_Allreduce`` (:mod:`.native`) among them.

The measurements are a tuning table written by ``python -m bench tune`` (``results/tuning-<host>-<N>r.json``),
named by ``ALLREDUCE_TUNING_FILE``; rank 0 reads it and every rank gets its copy, so all choose
alike. A table applies to a communicator of its rank and node count; it lists, per placement and
dtype ("*": any), size ranges and the candidates fastest first, and a call takes the first one
that can run it; never native MPI for max and min on floating point, where MPI need not give NaN
for an element that is NaN on one rank, as every algorithm of ours does. Where no table applies,
the cost model decides (:mod:`.costs`: the same model and schedules as ``python -m bench model``),
on uniform links of the communicator's own nodes: alpha :data:`MODEL_ALPHA_S` per message,
beta :data:`MODEL_BETA` for every link, every node's port and every rank's memory (what one
core copies in and out at once, so that ``oneshot``'s N-1 reads take (N-1) M/beta). The model
knows nothing of native MPI's algorithm, so it never picks it. Auto is a selector over the
registry (:mod:`.registry`), not one of its algorithms, as MPICH's collective selection is.

:func:`choice` says what a call of a size would run, and why.
"""

import json
from collections import Counter

import numpy as np
from mpi4py import MPI

from topology.model import Network

from .algorithm import Algorithm
from .catalog.hier import Layout
from .costs import SCHEDULES_OF, cost_model
from .dtypes import LOW_PRECISION
from .runtime.executor import private_comm
from .ops import is_floating
from .registry import REGISTERED
from .settings import setting

SCHEMA = "allreduce-tuning/1"
MODEL_ALPHA_S = 4e-6  # one message step of our algorithms (bench perf: rd at 8 B on 2 ranks, 2-core EPYC)
MODEL_BETA = 5e9  # bytes per second of one transfer
CACHED = 1024  # (module, dtype, bytes) choices kept


def candidates(collective="allreduce"):
    """The registry's algorithms auto may choose for ``collective`` ("allreduce", "reduce_scatter",
    "all_gather"): those that run it and need no bandwidth matrix or tree, native MPI among them."""
    return [name for name, algorithm in REGISTERED.items()
            if algorithm.runs(collective) and not algorithm.wants_bandwidth(collective)]


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
    for rule in rules:
        order, upto = rule.get("order"), rule.get("upto_bytes")
        collective = rule.get("collective", "allreduce")
        if collective not in SCHEDULES_OF:
            raise ValueError(f"{path}: a rule's collective is {collective!r}; choices: {', '.join(SCHEDULES_OF)}")
        known = set(candidates(collective))
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
        self.node_of = list(Layout(comm).nodes)  # hier's nodes (ALLREDUCE_NODE_MAP where set): alike on every rank
        counts = Counter(self.node_of)
        self.nodes, self.single_node = len(counts), len(counts) == 1
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
        self._models = {}  # the cost model of each collective, made at its first use

    def pick(self, xp, dtype, nbytes, op, collective="allreduce"):
        """The :class:`.algorithm.Algorithm` to run for a call of ``nbytes`` of ``dtype`` in module
        ``xp``'s memory (the whole vector for the halves)."""
        key = (xp, dtype, nbytes, op, collective)
        run = self._cache.get(key)
        if run is None:
            if len(self._cache) >= CACHED:
                self._cache.clear()
            run = self._cache[key] = REGISTERED[self.choose(xp.__name__ != "numpy", dtype.name, nbytes, op,
                                                            collective)[0]]
        return run

    def choose(self, device, dtype, nbytes, op="sum", collective="allreduce"):
        """(algorithm name, why) for a call of ``nbytes`` of ``dtype`` (device memory or not) of
        ``collective``; a table's rules are each for one collective (``"collective"``, by default
        "allreduce")."""
        usable = self._usable(dtype, op, collective)
        if self.table is not None:
            placement = "device" if device else "host"
            rules = [r for r in self.table["rules"] if r.get("placement", "host") == placement
                     and r.get("collective", "allreduce") == collective]
            exact = [r for r in rules if r.get("dtype") == dtype]
            for rule in exact or [r for r in rules if r.get("dtype", "*") == "*"]:
                upto = rule.get("upto_bytes")
                if upto is None or nbytes <= upto:
                    for name in rule["order"]:
                        if name in usable:
                            return name, f"{self.reason}, {rule.get('dtype', '*')} up to {upto} bytes"
        return self.modelled(nbytes, usable, collective), self.reason if self.table is None else (
            f"{self.reason} has no rule for this call: the model decides")

    def _usable(self, dtype, op, collective="allreduce"):
        names = set(candidates(collective))
        if op in ("max", "min") and is_floating(dtype):
            names.discard("native")  # MPI's MAX and MIN need not give NaN where one rank has it; ours all do
        if np.dtype(dtype) in LOW_PRECISION:
            names.discard("native")  # MPI has no bfloat16 or fp8 reduction
        if not self.single_node:  # those that would run another algorithm across nodes
            names -= {name for name in names if REGISTERED[name].one_node_only}
        return names

    def modelled(self, nbytes, usable, collective="allreduce"):
        """The algorithm of least modelled time (module docstring) among ``usable``."""
        if self.size == 1:
            return "ring"
        model = self._models.get(collective)
        if model is None:
            beta = MODEL_BETA / 1e9
            model = self._models[collective] = cost_model(
                Network.uniform(self.size, beta, MODEL_ALPHA_S * 1e6, intra_GBps=beta, nodes=self.node_of,
                                rank_GBps=beta), collective=collective)
        schedules = SCHEDULES_OF[collective]
        order = list(schedules)  # a tie goes to the registry's first (ring before hier on one node)
        return min((model.time(name, nbytes), order.index(name), name) for name in schedules if name in usable)[2]

    def free(self):
        pass


def choice(nbytes, dtype="float32", comm=None, device=False, op="sum", collective="allreduce"):
    """``(algorithm, why)``: what ``algorithm="auto"`` runs for ``nbytes`` of ``dtype`` on ``comm``
    (COMM_WORLD when None), on device memory when ``device``, of ``collective`` ("allreduce",
    "reduce_scatter", "all_gather"). Collective the first time per communicator."""
    private = private_comm(MPI.COMM_WORLD if comm is None else comm)
    return private.resource("auto", Choices).choose(device, np.dtype(dtype).name, int(nbytes), op, collective)


def bind(coll, count, dtype):
    """``run(sendbuf, recvbuf)`` for vectors of ``count`` elements of ``dtype``: what the
    algorithm chosen for them binds (:meth:`executor.Collective.bound`), so a repeat pays
    nothing for the choice."""
    return coll.bound(coll.private.resource("auto", Choices).pick(coll.xp, dtype, count * dtype.itemsize, coll.op),
                      count, dtype)


def allreduce(coll, sendbuf, recvbuf):
    choices = coll.private.resources.get("auto") or coll.private.resource("auto", Choices)
    choices.pick(coll.xp, sendbuf.dtype, sendbuf.nbytes, coll.op).allreduce(coll, sendbuf, recvbuf)


def reduce_scatter(coll, src, partial, result):
    """The reduce-scatter of the algorithm chosen for the whole vector's size."""
    choices = coll.private.resource("auto", Choices)
    choices.pick(coll.xp, src.dtype, src.nbytes, coll.op, "reduce_scatter").reduce_scatter(coll, src, partial, result)


def all_gather(coll, whole):
    """The all-gather of the algorithm chosen for the whole vector's size."""
    choices = coll.private.resource("auto", Choices)
    choices.pick(coll.xp, whole.dtype, whole.nbytes, None, "all_gather").all_gather(coll, whole)


def describe(private, transport):
    """What auto follows (collective the first time: it reads the tuning table), then the transport."""
    return f"per size, as {private.resource('auto', Choices).choose(False, 'float32', 8)[1]}; {transport}"


# it runs the others: by name only
ALGORITHM = Algorithm("auto", allreduce, bind=bind, describe=describe, in_all=False, reduce_scatter=reduce_scatter,
                      all_gather=all_gather, received=None)
