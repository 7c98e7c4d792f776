"""One small collective that makes bad arguments fail on every rank instead of hanging.

Each rank packs a flag (did its own arguments fail to validate?) and the
integer fields that all ranks must agree on into one int64 vector ``v``, and
a single all-reduce (MAX) of ``[v, -v]`` yields every field's maximum
and minimum. Only when something is wrong, which every rank then knows, a
second collective gathers the details so the message can name the ranks.

Within a node that all-reduce is one step of the compiled engine (:func:`.plan.one_step`: every
rank sends its vector to every other and takes the maximum itself), else ``MPI_Allreduce``.
"""

import numpy as np
from mpi4py import MPI

from ..settings import rank_list
from . import compiled
from .plan import one_step

#: The fields ranks must agree on, in wire order.
FIELDS = ("collective", "count", "dtype", "op", "algorithm", "tree")
WORDS = 1 + 2 * len(FIELDS)  # the packed vector: the flag, the fields, their negations
_KEPT = "bound"  # the key under which a fields dict keeps its bound check (:func:`agree`)
_NEVER = np.array([-1], np.int64).tobytes()
RESOURCE = "agreement"  # the name its reduction is kept under, per communicator


class Maximum:
    """The agreement's all-reduce (MAX) of a packed vector on a communicator (built collectively;
    the same choice on every rank): :meth:`check` binds one."""

    def __init__(self, private):
        steps = one_step(private.size, private.rank, WORDS)
        self.compiled = compiled.checker_on(private, steps, np.dtype(np.int64), "max")
        self.allreduce = private.comm.Allreduce

    def check(self, packed, extremes, alike):
        """``check()``: reduce ``packed`` into ``extremes`` and say whether they equal ``alike``
        (bytes; None: never), in one call of the compiled engine's where it runs, else by
        ``MPI_Allreduce``."""
        if self.compiled is not None:  # a rank with a problem expects a flag of -1: never (the flags are 0 or 1)
            return self.compiled(packed, extremes, alike if alike is not None else _NEVER)
        allreduce, maximum = self.allreduce, MPI.MAX

        def check():
            allreduce(packed, extremes, op=maximum)
            return alike is not None and extremes.tobytes() == alike
        return check

    def free(self):
        self.compiled = self.allreduce = None


def agree(private, name, problem, fields, describe):
    """Raise the same error on every rank of ``private`` (an :class:`.executor.Private`) if any
    rank has a ``problem`` or the ``fields`` differ.

    ``problem`` is this rank's validation error (or None); ``fields`` maps each
    name of :data:`FIELDS` to an int (-1 when unknown); ``describe(field, value)``
    turns a value into text for the message. A ``fields`` dict keeps its bound check per
    communicator, so a repeated call packs nothing: its values must not change once passed.
    """
    kept = None if problem else fields.get(_KEPT)
    if kept is not None and kept[0] is private:  # packed and bound for this communicator already
        if kept[1]():
            return
        extremes = kept[2]
    else:
        values = [int(fields[f]) for f in FIELDS]
        packed = np.array([1 if problem else 0, *values, *(-v for v in values)], dtype=np.int64)
        extremes = np.empty_like(packed)
        maximum = private.resources.get(RESOURCE)
        if maximum is None:
            maximum = private.resources[RESOURCE] = Maximum(private)
        check = maximum.check(packed, extremes, None if problem else packed.tobytes())
        if not problem:
            fields[_KEPT] = (private, check, extremes)
        if check():  # no rank failed, and every field's maximum is every rank's own
            return
    values = [int(fields[f]) for f in FIELDS]
    k = len(values)
    failed = extremes[0] > 0
    differing = [f for i, f in enumerate(FIELDS) if extremes[1 + i] != -extremes[1 + k + i]]
    local = (type(problem).__name__, str(problem)) if problem else None
    reports = private.comm.allgather((local, values))
    if failed:
        groups = {}
        for rank, ((kind, text), _) in _failures(reports):
            groups.setdefault((kind, text), []).append(rank)
        kind = next(iter(groups))[0]
        error = TypeError if kind == "TypeError" else ValueError
        raise error(f"{name}: " + "; ".join(f"{text} (on {rank_list(rs)})" for (_, text), rs in groups.items()))
    parts = []
    for f in differing:
        i = FIELDS.index(f)
        groups = {}
        for rank, (_, vals) in enumerate(reports):
            groups.setdefault(vals[i], []).append(rank)
        parts.append(
            f"{f}: " + "; ".join(f"{describe(f, v)} on {rank_list(rs)}" for v, rs in groups.items())
        )
    raise ValueError(f"{name}: ranks disagree about " + " | ".join(parts))


def _failures(reports):
    return [(rank, report) for rank, report in enumerate(reports) if report[0] is not None]
