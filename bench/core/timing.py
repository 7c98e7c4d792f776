"""The timed loop, nccl-tests' way: warm up, then ``iters`` calls back to back, timed by one rule
for every buffer and every candidate (:func:`rule`; docs/gpu.md, "Timing"): on host buffers by
the host's monotonic clock, on device buffers by CUDA events on the current stream, the calls
enqueued back to back and the stream waited for once at the end (or, for a runner with a
compiled loop of its own, the ``mpi`` baseline's, in that loop); per-rank times combined across
ranks as ``-a`` says; per-iteration times (``-I 1``) kept in a preallocated array. Nothing is
allocated inside the timed loop. :func:`timed` runs several candidates in turns of that loop,
round after round, and keeps every round's time (``bench perf``, ``bench tune``)."""

import time

import numpy as np
from mpi4py import MPI

from algorithms.device import steps as steps_of

from ..formats.stats import median_interval, round_order

#: -a: how per-rank times become one number.
AGGREGATIONS = {0: "rank 0", 1: "mean", 2: "min", 3: "max"}
HOST = steps_of(np)


def rule(device):
    """How a call is timed, in words, for the results header (``device``: device buffers)."""
    if device:
        return ("CUDA events on the current stream around the calls enqueued back to back after a barrier, "
                "the stream waited for once at the end (nccl-tests' rule), for ours and the baselines alike")
    return "the host's monotonic clock around the calls made back to back after a barrier"


def aggregate(comm, seconds, how):
    if how == 0:
        return comm.bcast(seconds, root=0)
    if how == 1:
        return comm.allreduce(seconds, op=MPI.SUM) / comm.Get_size()
    return comm.allreduce(seconds, op=MPI.MIN if how == 2 else MPI.MAX)


def time_calls(comm, call, iters, warmup, blocking=False, per_iteration=None, steps=None, agg=1, loop=None):
    """(seconds per call, host seconds per call) on this rank: ``iters`` iterations of ``agg``
    calls each (``-m``), by :func:`rule`: ``steps`` (:func:`algorithms.device.steps` of the
    buffers; None for host buffers) gives the clock, and settles the device before the barrier that starts the timing.
    The host time stops when the last call returns, before the wait for the device work it queued
    (``-C``: nccl-tests' cputime; the same for host buffers). ``blocking`` adds a barrier after
    every iteration (``-z 1``, inside the time); ``per_iteration`` (an array of ``iters``)
    receives each iteration's time per call. ``loop(iters, agg, blocking, per_iteration) ->
    (seconds, host seconds)``, where given, runs the warm-up and the timed iterations in a
    compiled loop of its own, under the same rules (its own clock on host buffers)."""
    calls = max(iters, 1) * agg
    steps = steps or HOST
    clock = steps.clock()
    if loop is not None:
        if warmup:
            loop(warmup, 1, False, None)
        steps.settle()
        comm.Barrier()
        clock.start()
        total, host = loop(iters, agg, blocking, per_iteration)
        seconds = clock.stop()
        return (seconds if steps.device else total) / calls, host / calls
    for _ in range(warmup):
        call()
    steps.settle()
    comm.Barrier()
    now = time.perf_counter
    if per_iteration is None and not blocking:
        clock.start()
        start = now()
        for _ in range(iters * agg):
            call()
        issued = now() - start
        return clock.stop() / calls, issued / calls
    total = host = 0.0
    for i in range(iters):
        clock.start()
        start = now()
        for _ in range(agg):
            call()
        host += now() - start
        if blocking:
            steps.settle()
            comm.Barrier()
        elapsed = clock.stop()
        total += elapsed
        if per_iteration is not None:
            per_iteration[i] = elapsed / agg
    return total / calls, host / calls


def timed(comm, calls, iters, warmup, repeats, most=None, steps=None):
    """{name: [seconds per call in each of ``repeats`` rounds]} (mean over a round's iterations,
    max over ranks) for each of ``calls`` (name -> function; one with a ``loop`` attribute is
    timed through it, as :func:`time_calls` takes it); ``most`` caps the iterations of some
    ({name: count}: a candidate a hundred times slower needs fewer to be timed as well);
    ``steps``, the buffers' device steps, as :func:`time_calls` takes them. The
    candidates take turns within every round, in an order rotated by one each round
    (:func:`.stats.round_order`), so a noisy moment of a shared machine falls on all of them
    alike and no candidate always runs first; :func:`intervals` makes the medians. Each turn
    starts with ``warmup`` untimed calls (at most its iterations), which absorb what the turn
    before left behind (docs/benchmark.md, what a run's order can change)."""
    samples = {name: [] for name in calls}
    for round_index in range(repeats):
        for name in round_order(calls, round_index):
            call = calls[name]
            count = min(iters, (most or {}).get(name, iters))
            seconds, _ = time_calls(comm, call, count, min(warmup, count), steps=steps,
                                    loop=getattr(call, "loop", None))
            samples[name].append(comm.allreduce(seconds, op=MPI.MAX))
    return samples


def intervals(rounds):
    """{name: :class:`.stats.Interval`} of :func:`timed`'s {name: [seconds per round]}."""
    return {name: median_interval(values) for name, values in rounds.items()}


def iterations_for(nbytes):
    """Iterations of a size for :func:`timed`: about 0.2 GB moved, 3 to 2000."""
    return max(3, min(2000, int(2e8 // max(nbytes, 1))))


def iteration_stats(comm, times, skip):
    """nccl-tests' per-iteration report on rank 0: each iteration's time is the max over ranks
    (process rows); min/max/avg/p50/p95/p99/stdev/cv over the iterations after the first ``skip``."""
    rows = comm.gather(times, root=0)
    if comm.Get_rank() != 0:
        return None
    per_process = np.array(rows)
    worst = per_process.max(axis=0)
    kept = np.sort(worst[skip:]) if len(worst) > skip else np.sort(worst)
    n = len(kept)

    def percentile(p):
        return float(kept[min(n - 1, (n * p + 99) // 100 - 1)])

    avg = float(kept.mean()) if n else 0.0
    stdev = float(np.sqrt(((kept - avg) ** 2).mean())) if n else 0.0
    us = 1e6
    return {
        "skipped_iterations": int(min(skip, len(worst))),
        "min_us": float(kept[0]) * us if n else 0.0,
        "max_us": float(kept[-1]) * us if n else 0.0,
        "avg_us": avg * us,
        "p50_us": float(kept[n // 2]) * us if n else 0.0,
        "p95_us": percentile(95) * us if n else 0.0,
        "p99_us": percentile(99) * us if n else 0.0,
        "stdev_us": stdev * us,
        "cv_pct": stdev / avg * 100 if avg > 0 else 0.0,
        "times_us": [float(t) * us for t in worst],
        "per_process_max_times_us": [[float(t) * us for t in row] for row in per_process],
    }


def interleaved(names, rounds, measure):
    """Rounds that interleave candidates (Hoefler and Belli, SC'15): in round i
    every one of ``names`` runs once, ``measure(name, i)``, in :func:`.stats.round_order`'s order
    (rotated by one each round), so that drift of the machine falls on all of them alike.
    Returns ({name: [measure's result per round]}, {name: [its place in each round, from 0]})."""
    results, places = {name: [] for name in names}, {name: [] for name in names}
    for round_index in range(rounds):
        for place, name in enumerate(round_order(names, round_index)):
            results[name].append(measure(name, round_index))
            places[name].append(place)
    return results, places
