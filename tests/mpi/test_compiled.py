"""The compiled engine (algorithms/runtime/compiled.py) against the Python engine, bit for bit:
every algorithm written as a plan, and every half, on every dtype and op, on uneven counts,
counts that fill many of its slots, in and out of place. Each engine runs on a communicator of
its own (``ALLREDUCE_ENGINE`` is read when a plan of a new shape is bound), from inputs of
random bits' worth (normal floats, integers over their whole range), so the two must make the
same roundings, wraps and NaN-free choices, not merely the same exact sums."""

import os

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import algorithms
from algorithms.collectives import HALVES
from algorithms.ops import is_floating
from algorithms.runtime import compiled
from algorithms.runtime.executor import private_comm
from conftest import options

pytestmark = [pytest.mark.skipif(compiled.MISSING is not None, reason=str(compiled.MISSING)),
              # the inputs hold NaN (random_input): NumPy's ufuncs say so on the Python engine
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

PLANNED = sorted(name for name, a in algorithms.ALGORITHMS.items() if a.steps is not None)
ALL_DTYPES = [np.dtype(t) for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                                    "float32", "float64")] + [np.dtype(ml_dtypes.bfloat16),
                                                              np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]
#: every dtype up to 3 ranks; from 4 on (2 ranks a core and more here) one of each kind of arithmetic
#: (wrapping, IEEE, bfloat16's kernel, a table): what differs there is the plans' schedule, and every
#: dtype's arithmetic runs at 1-3
FEW = MPI.COMM_WORLD.Get_size() <= 3
DTYPES = ALL_DTYPES if FEW else [np.dtype(np.int8), np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16),
                                 np.dtype(ml_dtypes.float8_e4m3fn)]
OPS = ("sum", "prod", "max", "min", "avg")


def engines_bound(comm):
    """The modules of the runs the engine bound on ``comm``'s contexts."""
    return {run.__module__ for coll in private_comm(comm).contexts.values() for _, run in coll.engines.values()}


@pytest.fixture(scope="module")
def engines():
    """{"python": comm, "compiled": comm}: a communicator per engine."""
    world = MPI.COMM_WORLD
    found = {"python": world.Dup(), "compiled": world.Dup()}
    yield found
    for comm in found.values():
        comm.Free()


def run_with(engine, call):
    before = os.environ.get("ALLREDUCE_ENGINE")
    os.environ["ALLREDUCE_ENGINE"] = engine
    try:
        return call()
    finally:
        if before is None:
            del os.environ["ALLREDUCE_ENGINE"]
        else:
            os.environ["ALLREDUCE_ENGINE"] = before


def random_input(dtype, count, rank, salt, op):
    rng = np.random.default_rng([rank, count, salt, dtype.num])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=count, endpoint=True, dtype=dtype)
    values = rng.standard_normal(count) * (1 if dtype.itemsize > 1 else 4)
    # where max and min (and vectorised loops) could part ways: NaN, infinities, zeros of either sign
    # (an arithmetic NaN's sign in bfloat16 is not pinned: kernels/bfloat16.h), so zeros alone there
    specials = ((-0.0, 89), (0.0, 83), (np.nan, 97), (np.inf, 79), (-np.inf, 73))
    kept = 2 if dtype == ml_dtypes.bfloat16 and op not in ("max", "min") else 3 if dtype.itemsize == 1 else 5
    for value, step in specials[:kept]:  # the 8-bit floats: no inf in e4m3fn
        values[rank % step::step] = value
    return values.astype(dtype)


def counts(size):
    """Uneven counts, 5000 elements (many slots' worth: a slot holds 8 KiB) and, up to 3 ranks, 20000
    (over the 64 KiB up to which a bound plan keeps its vectors' addresses, in every dtype from 4
    bytes: a path that does not depend on the rank count)."""
    return sorted({0, 1, size - 1, size + 1, 37, 3 * size + 2, 5000, 20000} if FEW else {0, size + 1, 37, 5000})


def same_bits(a, b):
    return a.tobytes() == b.tobytes()


@pytest.mark.parametrize("algorithm", PLANNED)
def test_allreduce_runs_the_same_bits_on_both_engines(engines, algorithm):
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    tried, extra = 0, options(algorithm, size)
    for dtype in DTYPES:
        for op in OPS:
            if op == "avg" and not is_floating(dtype):
                continue
            for count in counts(size):
                x = random_input(dtype, count, rank, hash((algorithm, op)) % 1000, op)
                results = {}
                for engine, comm in engines.items():
                    out = np.empty_like(x)
                    run_with(engine, lambda: algorithms.allreduce(x, out, op=op, algorithm=algorithm, comm=comm,
                                                                     **extra))
                    inplace = x.copy()
                    run_with(engine, lambda: algorithms.allreduce(inplace, None, op=op, algorithm=algorithm,
                                                                     comm=comm, **extra))
                    results[engine] = (out, inplace)
                python, ours = results["python"], results["compiled"]
                assert same_bits(python[0], ours[0]), (algorithm, dtype, op, count, python[0][:8], ours[0][:8])
                assert same_bits(python[1], ours[1]), (algorithm, dtype, op, count, "in place")
                tried += 1
    assert engines_bound(engines["compiled"]) == {"algorithms.runtime.compiled"}
    if algorithms.ALGORITHMS[algorithm].plan_when_compiled:  # on the Python engine its own code runs
        assert "algorithms.runtime.compiled" not in engines_bound(engines["python"])
    else:
        assert engines_bound(engines["python"]) == {"algorithms.runtime.engine"}
    assert tried > 0


@pytest.mark.parametrize("half", ["reduce_scatter", "all_gather"])
def test_halves_run_the_same_bits_on_both_engines(engines, half):
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    for algorithm in HALVES[half]:
        if algorithm == "auto" or algorithms.ALGORITHMS[algorithm].steps is None:
            continue
        extra = options(algorithm, size)
        for dtype in (np.dtype(np.float32), np.dtype(np.int16), np.dtype(ml_dtypes.bfloat16),
                      np.dtype(ml_dtypes.float8_e5m2)):
            for block in (0, 1, 3, 700):
                x = random_input(dtype, block * size, rank, 7, "sum")
                results = {}
                for engine, comm in engines.items():
                    if half == "reduce_scatter":
                        out = np.empty(block, dtype)
                        run_with(engine, lambda: algorithms.reduce_scatter(x, out, algorithm=algorithm, comm=comm,
                                                                              **extra))
                    else:
                        out = np.empty(block * size, dtype)
                        run_with(engine, lambda: algorithms.all_gather(x[:block], out, algorithm=algorithm, comm=comm,
                                                                          **extra))
                    results[engine] = out
                assert same_bits(results["python"], results["compiled"]), (half, algorithm, dtype, block)
    assert engines_bound(engines["compiled"]) == {"algorithms.runtime.compiled"}


@pytest.mark.parametrize("algorithm", ["oneshot", "twoshot"])
def test_posted_algorithms_run_their_plan_up_to_the_threshold_and_their_rounds_above(monkeypatch, algorithm):
    """oneshot's and twoshot's plans run on the compiled engine up to the threshold (here 64
    bytes), their rounds over the node's window above it; both exact, and the engine line says so."""
    size = MPI.COMM_WORLD.Get_size()
    monkeypatch.setenv("ALLREDUCE_COMPILED_BYTES", "64")
    comm = MPI.COMM_WORLD.Dup()
    try:
        assert algorithms.engine_in_use(np, comm, algorithm).startswith("compiled up to 64 B, its own code above")
        private, bound = private_comm(comm), []
        for count in (16, 256):  # 64 bytes, then 1 KiB
            x = np.full(count, MPI.COMM_WORLD.Get_rank() + 1, np.int32)
            out = algorithms.allreduce(x, np.empty_like(x), algorithm=algorithm, comm=comm)
            assert (out == size * (size + 1) // 2).all()
            bound.append(sum(len(coll.engines) for coll in private.contexts.values()))
        assert bound == ([1, 1] if size > 1 else [0, 0])  # a plan bound for 64 bytes, none for 1 KiB
        assert engines_bound(comm) <= {"algorithms.runtime.compiled"}
        assert (algorithm in private.resources) == (size > 1)  # its window: the rounds ran
    finally:
        comm.Free()


@pytest.mark.parametrize("half", ["reduce_scatter", "all_gather"])
def test_twoshots_halves_run_their_plans_up_to_the_threshold_and_their_rounds_above(monkeypatch, half):
    """twoshot's reduce-scatter and all-gather: their plans on the compiled engine up to the
    threshold (here 64 bytes of the whole vector), their rounds over the node's window above it."""
    size, rank = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    monkeypatch.setenv("ALLREDUCE_COMPILED_BYTES", "64")
    comm = MPI.COMM_WORLD.Dup()
    try:
        private, bound = private_comm(comm), []
        for block in (16 // size, 256):  # the whole vector 64 bytes or less, then 1 KiB a rank
            if half == "reduce_scatter":
                out = algorithms.reduce_scatter(np.full(block * size, rank + 1, np.int32), np.empty(block, np.int32),
                                                algorithm="twoshot", comm=comm)
                assert (out == size * (size + 1) // 2).all()
            else:
                out = algorithms.all_gather(np.full(block, rank + 1, np.int32), np.empty(block * size, np.int32),
                                            algorithm="twoshot", comm=comm)
                assert (out == np.repeat(np.arange(1, size + 1), block)).all()
            bound.append(sum(len(coll.engines) for coll in private.contexts.values()))
        if size > 1:  # (on one rank the ring's halves run)
            assert bound == [1, 1]  # a plan bound for the small vector, none for the large
            assert engines_bound(comm) == {"algorithms.runtime.compiled"}
            assert "twoshot" in private.resources  # its window: the rounds ran
    finally:
        comm.Free()


def test_a_plan_with_more_messages_in_flight_than_the_engine_keeps_is_not_compiled():
    """The agreement's plan (a message to every other rank) goes to MPI where the node has more
    ranks than the engine keeps messages in flight."""
    from algorithms.runtime import _compiled_engine, plan

    many = tuple(plan.isend(0, ("input", 0, 1), h) for h in range(_compiled_engine.MAX_PENDING + 1))
    few = many[:_compiled_engine.MAX_PENDING]
    private = private_comm(MPI.COMM_WORLD)
    assert compiled.checker_on(private, many, np.dtype(np.int64), "max") is None
    assert compiled.checker_on(private, few, np.dtype(np.int64), "max") is not None


def test_the_engine_setting_is_refused_when_unknown():
    comm = MPI.COMM_WORLD.Dup()
    try:
        with pytest.raises(ValueError, match="ALLREDUCE_ENGINE"):
            run_with("fast", lambda: algorithms.allreduce(np.ones(4, np.float32), comm=comm))
    finally:
        comm.Free()


def test_a_wait_lets_other_threads_run(engines):
    """Rank 0 waits in the compiled engine for a rank that comes 0.3 s late; meanwhile a thread of
    rank 0's counts on at its own rate (the wait let go of the GIL) instead of standing still."""
    comm = engines["compiled"]
    if comm.Get_size() < 2:
        pytest.skip("a wait needs a peer")
    import threading
    import time

    x, out = np.ones(4, np.float32), np.empty(4, np.float32)
    run_with("compiled", lambda: algorithms.allreduce(x, out, algorithm="rd", comm=comm))  # bound before
    counted, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            counted[0] += 1
    thread = threading.Thread(target=count)
    comm.Barrier()
    if comm.Get_rank() == 0:
        thread.start()
        time.sleep(0.01)
        start = counted[0]
        time.sleep(0.05)  # the thread alone: its rate
        rate, before = (counted[0] - start) / 0.05, counted[0]
    else:
        time.sleep(0.35)
    run_with("compiled", lambda: algorithms.allreduce(x, out, algorithm="rd", comm=comm, check=False))
    if comm.Get_rank() == 0:
        during = counted[0] - before
        stop.set()
        thread.join()
        # about 0.3 s of counting; a wait that held the GIL would leave it one switch interval (5 ms)
        assert during > 0.1 * rate, (during, rate)
    assert np.array_equal(out, np.full(4, comm.Get_size(), np.float32))
    assert engines_bound(comm) == {"algorithms.runtime.compiled"}


def test_small_and_large_messages_take_turns_in_the_same_slots(engines):
    """A slot carries a small piece after its flag and a large one a line on: pieces of every
    size in turn through the same slots, many times round each ring of slots, each holding the
    numbers its flags count (small integers), arrive whole: no piece is taken for another."""
    comm = engines["compiled"]
    size, rank = comm.Get_size(), comm.Get_rank()
    counts = (1, 7, 8, 1025, 2, 1024 * 3 + 1, 6, 9)  # int64 pieces: 8-56 bytes after the flag, 57+ a line on
    for turn in range(40):
        for count in counts:
            x = (np.arange(count, dtype=np.int64) + turn + rank) % 13 + 1
            expected = sum((np.arange(count, dtype=np.int64) + turn + r) % 13 + 1 for r in range(size))
            got = run_with("compiled", lambda: algorithms.allreduce(x, np.empty_like(x), algorithm="rd", comm=comm))
            assert np.array_equal(got, expected), f"count {count}, turn {turn}"
    if size > 1:
        assert "algorithms.runtime.compiled" in engines_bound(comm)
