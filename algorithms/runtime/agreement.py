"""One small collective that makes bad arguments fail on every rank instead of hanging.

Each rank packs a flag (did its own arguments fail to validate?) and the
integer fields that all ranks must agree on into one int64 vector ``v``, and
a single ``MPI_Allreduce(MAX)`` of ``[v, -v]`` yields every field's maximum
and minimum. Only when something is wrong, which every rank then knows, a
second collective gathers the details so the message can name the ranks.
"""

import numpy as np
from mpi4py import MPI

from ..settings import rank_list

#: The fields ranks must agree on, in wire order.
FIELDS = ("collective", "count", "dtype", "op", "algorithm", "tree")
_KEPT = "packed"  # the key under which a fields dict keeps its packed vector (:func:`agree`)


def agree(comm, name, problem, fields, describe):
    """Raise the same error on every rank if any rank has a ``problem`` or the ``fields`` differ.

    ``problem`` is this rank's validation error (or None); ``fields`` maps each
    name of :data:`FIELDS` to an int (-1 when unknown); ``describe(field, value)``
    turns a value into text for the message. A ``fields`` dict keeps its packed vector, so a
    repeated call packs nothing: its values must not change once passed.
    """
    kept = None if problem else fields.get(_KEPT)
    if kept is None:  # packed once per fields: a caller that passes the same fields again finds them
        values = [int(fields[f]) for f in FIELDS]
        packed = np.array([1 if problem else 0, *values, *(-v for v in values)], dtype=np.int64)
        kept = (packed, np.empty_like(packed), None if problem else packed.tobytes())
        if not problem:
            fields[_KEPT] = kept
    packed, extremes, alike = kept
    comm.Allreduce(packed, extremes, op=MPI.MAX)
    if extremes.tobytes() == alike:  # no rank failed, and every field's maximum is every rank's own
        return
    values = [int(fields[f]) for f in FIELDS]
    k = len(values)
    failed = extremes[0] > 0
    differing = [f for i, f in enumerate(FIELDS) if extremes[1 + i] != -extremes[1 + k + i]]
    local = (type(problem).__name__, str(problem)) if problem else None
    reports = comm.allgather((local, values))
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
