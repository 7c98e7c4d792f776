"""``bench tune``'s second measurement: up to which size the compiled engine runs a plan faster
than the Python engine (algorithms/runtime/compiled.py), the threshold ``ALLREDUCE_ENGINE=auto``
then follows from the tuning table (``"engine": {"compiled_bytes": ...}``).

The ring's plan is timed on each engine in turn at every size, each engine on a communicator of
its own pinned to it (:func:`algorithms.runtime.compiled.pin`), round after round as the
candidates are (:func:`bench.core.timing.timed`), from the smallest size up to the first where the
compiled engine is slower; at each size the compiled engine's time over
the Python engine's is a paired ratio with its 95% interval. The compiled engine keeps every size
up to the first where it is slower (the interval wholly above 1), to the geometric mean of the
last size it keeps and that one, as a rule's reach is; every measured size where it is never
slower, and none where it is slower at the smallest."""

import math

import numpy as np

import algorithms
from algorithms.runtime import compiled

from ..core.timing import iterations_for, timed
from ..formats.stats import paired_ratio

ENGINES = ("python", "compiled")
ALGORITHM = "ring"  # the plan timed: what an engine costs shows in its steps, whichever algorithm's


def measure(comm, dtype, op, sizes, repeats):
    """``({bytes: {engine: [seconds per round]}}, None)``, or ``(None, why)`` where the compiled
    engine cannot run on ``comm`` (collective)."""
    pinned = {}
    try:
        for engine in ENGINES:
            pinned[engine] = comm.Dup()
            compiled.pin(pinned[engine], engine)
        why = algorithms.engine_in_use(np, pinned["compiled"], ALGORITHM)
        if not why.startswith("compiled"):
            return None, why
        rows = {}
        for nbytes in sizes:
            count = max(nbytes // dtype.itemsize, 1)
            x = np.ones(count, dtype)
            calls = {engine: _call(x, np.empty_like(x), op, pinned[engine]) for engine in ENGINES}
            iters = iterations_for(count * dtype.itemsize)
            rounds = rows[count * dtype.itemsize] = timed(comm, calls, iters, max(2, iters // 10), repeats)
            if paired_ratio(rounds["compiled"], rounds["python"]).low > 1:
                break  # slower here: the larger sizes are not timed (every rank saw the same rounds)
        return rows, None
    finally:
        for pinned_comm in pinned.values():
            pinned_comm.Free()


def _call(x, y, op, comm):
    return lambda: algorithms.allreduce(x, y, op=op, algorithm=ALGORITHM, comm=comm, check=False)


def threshold(rows):
    """``{"compiled_bytes", "algorithm", "ratios": {bytes: interval}}`` from :func:`measure`'s rows
    (the module docstring's rule)."""
    sizes = sorted(rows)
    ratios = {n: paired_ratio(rows[n]["compiled"], rows[n]["python"]) for n in sizes}
    limit = sizes[-1]
    for i, nbytes in enumerate(sizes):
        if ratios[nbytes].low > 1:
            limit = math.isqrt(sizes[i - 1] * nbytes) if i else 0
            break
    return {"compiled_bytes": limit, "algorithm": ALGORITHM,
            "compiled_over_python": {str(n): r.as_dict() for n, r in ratios.items()}}


def text(engine, why):
    """The lines ``bench tune`` prints of it."""
    if engine is None:
        return f"# engines: not compared ({why})"
    lines = [f"# engines: the {engine['algorithm']}'s plan, compiled engine's time over the Python engine's "
             "(median [95% interval])"]
    for nbytes, ratio in engine["compiled_over_python"].items():
        lines.append(f"{int(nbytes):>12}  {ratio['median']:.3f} [{ratio['ci_low']:.3f}, {ratio['ci_high']:.3f}]")
    lines.append(f"# the compiled engine up to {engine['compiled_bytes']} B")
    return "\n".join(lines)
