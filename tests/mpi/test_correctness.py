"""Every algorithm against comm.Allreduce and a NumPy reference, bit for bit.

All ops x all dtypes x in/out of place x counts 0, 1, N-1, N, N+1, a prime, and ~1M (one
dtype of each item size at 1-2 ranks, the smallest and the largest item at 3, float32 alone
from 4 ranks on). At 8 ranks and more (4
ranks a core on the 2-core machines the suite runs on) the algorithms run on one integer, one
float and one low-precision type, with sum, max and avg: what differs there is the schedule,
and every dtype's and op's arithmetic runs at 1-5 ranks.
"""

import numpy as np
import pytest
from conftest import LARGE_COUNT, counts_for, native_reference, numpy_reference, options, rank_input, wrong_elements
from mpi4py import MPI

import algorithms
from algorithms.catalog import tree as tree_executor
from algorithms.ops import LOW_PRECISION, is_floating
from algorithms.runtime.executor import private_comm
from topology import Tree, binomial_tree

pytestmark = pytest.mark.mpi

DTYPES = [dt.name for dt in algorithms.DTYPES] if MPI.COMM_WORLD.Get_size() < 8 else ["int32", "float32", "bfloat16"]
#: the dtypes the large count runs on, one of each item size: what it tests beyond the small
#: counts, the segments and chunks of a long vector, depends on the item size alone, and every
#: dtype's arithmetic runs at the other counts (the large count was four fifths of the suite's time);
#: at 3 ranks the smallest and the largest item, and from 4 ranks on (2 ranks a core and more on
#: the 2-core machines the suite runs on) float32 alone: every item size's long vectors run at 1-2
LARGE_COUNT_DTYPES = {1: ("int8", "float16", "float32", "float64"), 2: ("int8", "float16", "float32", "float64"),
                      3: ("int8", "float64")}.get(MPI.COMM_WORLD.Get_size(), ("float32",))


#: the ops: every one up to 5 ranks; from 8 on, sum, max and avg: prod and min take the same
#: paths as sum and max (what differs at 8 ranks is the schedule, and every op's arithmetic runs
#: at 1-5 ranks)
OPS = algorithms.OPS if MPI.COMM_WORLD.Get_size() < 8 else ("sum", "max", "avg")


def ops_for(dtype):
    return [op for op in OPS if not (op == "avg" and not is_floating(dtype))]


def cases(comm, dtype):
    """(op, count, input, expected) for every op and count; expected checked against native MPI
    the first time it is used (every rank runs the same tests in the same order, so every rank
    makes the same checks)."""
    for op in ops_for(dtype):
        for count in counts_for(comm.size, large=dtype in LARGE_COUNT_DTYPES):
            x = rank_input(dtype, op, count, comm.rank, comm.size)
            expected = numpy_reference(dtype, op, count, comm.size)
            if np.dtype(dtype) not in LOW_PRECISION and (dtype, op, count) not in NATIVE_AGREES:  # MPI has no bf16, fp8
                native = native_reference(comm, x, op)
                assert wrong_elements(native, expected) == 0, f"native MPI disagrees with NumPy: {op} {count}"
                NATIVE_AGREES.add((dtype, op, count))
            yield op, count, x, expected


#: the (dtype, op, count) whose NumPy reference native MPI has reproduced
NATIVE_AGREES = set()


#: every algorithm but auto, which runs the others (its picks and native MPI: tests/mpi/test_auto.py)
ALGORITHMS = sorted(set(algorithms.ALGORITHMS) - {"auto", "native"})


@pytest.mark.parametrize("algorithm", ALGORITHMS)  # every algorithm on one dtype, then the next
@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_matches_references(comm, algorithm, dtype):
    failures = []
    extra = options(algorithm, comm.size)
    for op, count, x, expected in cases(comm, dtype):
        out = np.full_like(x, 99)
        result = algorithms.allreduce(x, out, op=op, algorithm=algorithm, **extra)
        if result is not out:
            failures.append(f"{op} n={count}: out-of-place did not return recvbuf")
        bad = wrong_elements(out, expected)
        if bad:
            failures.append(f"{op} n={count} out-of-place: {bad} wrong")
        if wrong_elements(x, rank_input(dtype, op, count, comm.rank, comm.size)):
            failures.append(f"{op} n={count}: sendbuf was modified")
        inplace = x.copy()
        result = algorithms.allreduce(inplace, op=op, algorithm=algorithm, **extra)
        bad = wrong_elements(inplace, expected)
        if bad or result is not inplace:
            failures.append(f"{op} n={count} in-place: {bad} wrong")
        if count == LARGE_COUNT:
            continue  # recvbuf is sendbuf: the same in-place call as above, which the entry point makes it
        same = x.copy()
        algorithms.allreduce(same, same, op=op, algorithm=algorithm, **extra)
        if wrong_elements(same, expected):
            failures.append(f"{op} n={count} recvbuf is sendbuf: wrong")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)

@pytest.mark.parametrize("algorithm", sorted(algorithms.ALGORITHMS))
def test_repeated_calls_of_one_shape(comm, algorithm):
    """A repeat of a call's shape runs what the first call left bound (collectives.allreduce keeps
    a runner per shape; the ring keeps its slices of the last two vectors): right on a new
    vector each time, on the same two vectors refilled, with their roles swapped, and with calls
    of other ops between; the input untouched."""
    extra, failures = options(algorithm, comm.size), []
    for dtype in ("float32", "int64"):
        for count in sorted({2, comm.size + 1, 1009}):
            mine, theirs = np.empty(count, dtype), np.empty(count, dtype)
            for turn in range(3):
                for op in ops_for(dtype):
                    x = rank_input(dtype, op, count, comm.rank, comm.size, salt=turn)
                    expected = numpy_reference(dtype, op, count, comm.size, salt=turn)
                    case = f"{dtype} n={count} {op} turn {turn}"
                    out = algorithms.allreduce(x, np.full_like(x, 99), op=op, algorithm=algorithm, **extra)
                    if wrong_elements(out, expected):
                        failures.append(f"{case}: new recvbuf wrong")
                    mine[:] = x
                    algorithms.allreduce(mine, theirs, op=op, algorithm=algorithm, **extra)
                    if wrong_elements(theirs, expected):
                        failures.append(f"{case}: reused recvbuf wrong")
                    theirs[:] = x
                    algorithms.allreduce(theirs, mine, op=op, algorithm=algorithm, **extra)
                    if wrong_elements(mine, expected):
                        failures.append(f"{case}: swapped vectors wrong")
                    if wrong_elements(x, rank_input(dtype, op, count, comm.rank, comm.size, salt=turn)):
                        failures.append(f"{case}: sendbuf was modified")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures[:8])


@pytest.mark.parametrize("algorithm", sorted(algorithms.ALGORITHMS))
def test_persistent_allreduce(comm, algorithm):
    """``allreduce_init``: each call reduces the vectors' current contents (new ones every turn),
    out of place and in place, every op; the input untouched."""
    extra, failures = options(algorithm, comm.size), []
    for dtype in ("float32", "int64", "bfloat16") if algorithm != "native" else ("float32", "int64"):
        for count in sorted({1, comm.size + 1, 1009}):
            for op in ops_for(dtype):
                x, out, inplace = np.empty(count, dtype), np.empty(count, dtype), np.empty(count, dtype)
                calls = (algorithms.allreduce_init(x, out, op=op, algorithm=algorithm, **extra),
                         algorithms.allreduce_init(inplace, op=op, algorithm=algorithm, **extra))
                for turn in range(3):
                    mine = rank_input(dtype, op, count, comm.rank, comm.size, salt=turn)
                    expected = numpy_reference(dtype, op, count, comm.size, salt=turn)
                    x[:], inplace[:] = mine, mine
                    case = f"{dtype} n={count} {op} turn {turn}"
                    if calls[0]() is not out or wrong_elements(out, expected):
                        failures.append(f"{case}: out of place wrong")
                    if wrong_elements(x, mine):
                        failures.append(f"{case}: sendbuf was modified")
                    if calls[1]() is not inplace or wrong_elements(inplace, expected):
                        failures.append(f"{case}: in place wrong")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures[:8])



#: the algorithms with a reduce-scatter and an all-gather of their own, auto among them
HALVES = {half: sorted(names) for half, names in algorithms.HALVES.items()}


def block_reference(comm, x, op):
    """``comm.Reduce_scatter_block`` of ``x`` (a multiple of the rank count long): this rank's
    block, avg as sum / size."""
    mpi_op = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
    out = np.empty(x.size // comm.size, x.dtype)
    comm.Reduce_scatter_block(x, out, op=mpi_op)
    if op == "avg":
        np.divide(out, comm.size, out=out)
    return out


@pytest.mark.parametrize("algorithm", HALVES["reduce_scatter"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_matches_references(comm, dtype, algorithm):
    """Rank r gets chunk r of chunk_offsets, as NumPy reduces it (and, where the count divides,
    as MPI_Reduce_scatter_block does), out of place and in place, the input untouched."""
    failures, extra = [], options(algorithm, comm.size)
    for op, count, x, expected in cases(comm, dtype):
        offsets = algorithms.chunk_offsets(count, comm.size)
        own = expected[offsets[comm.rank]:offsets[comm.rank + 1]]
        if count % comm.size == 0 and np.dtype(dtype) not in LOW_PRECISION and wrong_elements(
                block_reference(comm, x, op), own):
            failures.append(f"{op} n={count}: MPI_Reduce_scatter_block disagrees with NumPy")
        out = np.full(own.size, 99, dtype=x.dtype)
        if algorithms.reduce_scatter(x, out, op=op, algorithm=algorithm, **extra) is not out or wrong_elements(out, own):
            failures.append(f"{op} n={count} out-of-place")
        if wrong_elements(x, rank_input(dtype, op, count, comm.rank, comm.size)):
            failures.append(f"{op} n={count}: sendbuf was modified")
        inplace = x.copy()
        view = algorithms.reduce_scatter(inplace, op=op, algorithm=algorithm, **extra)
        if wrong_elements(view, own) or (view.size and not np.shares_memory(view, inplace)):
            failures.append(f"{op} n={count} in-place")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


@pytest.mark.parametrize("algorithm", HALVES["all_gather"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_matches_native_allgatherv(comm, dtype, algorithm):
    """Every rank gets the whole vector, bit for bit as MPI_Allgatherv (and MPI_Allgather where
    the count divides) gathers it, out of place and in place."""
    failures, extra = [], options(algorithm, comm.size)
    for count in counts_for(comm.size, large=dtype in LARGE_COUNT_DTYPES):
        offsets = algorithms.chunk_offsets(count, comm.size)
        whole = rank_input(dtype, "max", count, 0, 1, salt=5)  # same vector on every rank
        chunk = whole[offsets[comm.rank]:offsets[comm.rank + 1]].copy()
        native = np.empty_like(whole)
        sizes = np.diff(offsets)
        bits = np.dtype(f"u{whole.itemsize}")  # MPI has no bfloat16 or fp8: it gathers their bit patterns
        if count % comm.size == 0:
            comm.Allgather(chunk.view(bits), native.view(bits))
        else:
            comm.Allgatherv(chunk.view(bits), [native.view(bits), (sizes.tolist(), offsets[:-1])])
        assert wrong_elements(native, whole) == 0
        out = np.full_like(whole, 7)
        if algorithms.all_gather(chunk, out, algorithm=algorithm, **extra) is not out or wrong_elements(out, whole):
            failures.append(f"n={count} out-of-place")
        inplace = np.zeros_like(whole)
        inplace[offsets[comm.rank]:offsets[comm.rank + 1]] = chunk
        algorithms.all_gather(inplace, algorithm=algorithm, **extra)
        if wrong_elements(inplace, whole):
            failures.append(f"n={count} in-place")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


def _without_a_matrix(algorithm, size):
    """The keyword arguments of :func:`options` that an algorithm cannot run without: a repeat of
    a call's shape is kept only where no matrix is passed (collectives._KeptHalf)."""
    declared = algorithms.ALGORITHMS[algorithm]
    return options(algorithm, size) if declared.wants_bandwidth() else {}


@pytest.mark.parametrize("algorithm", HALVES["reduce_scatter"])
def test_reduce_scatter_repeated_on_new_vectors(comm, algorithm):
    """A repeat of a reduce-scatter's shape runs what its first call kept (collectives._KeptHalf):
    on new vectors with new contents each time, out of place and in place, avg divided, between
    all-reduces of the same length, each result as NumPy reduces it, checked and unchecked."""
    failures, extra = [], _without_a_matrix(algorithm, comm.size)
    for op, count in (("sum", 1), ("avg", comm.size + 1), ("sum", 1009), ("max", 1009)):
        offsets = algorithms.chunk_offsets(count, comm.size)
        mine = slice(offsets[comm.rank], offsets[comm.rank + 1])
        for salt in range(4):
            expected = numpy_reference("float32", op, count, comm.size, salt)[mine]
            x = rank_input("float32", op, count, comm.rank, comm.size, salt)
            out = np.full(expected.size, 99, np.float32)
            if algorithms.reduce_scatter(x, out, op=op, algorithm=algorithm, check=salt % 2 == 0,
                                         **extra) is not out or wrong_elements(out, expected):
                failures.append(f"{op} n={count} call {salt} out of place")
            inplace = x.copy()
            view = algorithms.reduce_scatter(inplace, op=op, algorithm=algorithm, **extra)
            if wrong_elements(view, expected) or (view.size and not np.shares_memory(view, inplace)):
                failures.append(f"{op} n={count} call {salt} in place")
            algorithms.allreduce(x.copy(), op=op, algorithm="ring")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


@pytest.mark.parametrize("algorithm", HALVES["all_gather"])
def test_all_gather_repeated_on_new_vectors(comm, algorithm):
    """A repeat of an all-gather's shape runs what its first call kept: new vectors, new contents,
    out of place and in place, each result the whole vector, checked and unchecked."""
    failures, extra = [], _without_a_matrix(algorithm, comm.size)
    for count in (1, comm.size + 1, 1009):
        offsets = algorithms.chunk_offsets(count, comm.size)
        mine = slice(offsets[comm.rank], offsets[comm.rank + 1])
        for salt in range(4):
            whole = rank_input("float32", "max", count, 0, 1, salt=salt)
            out = np.full_like(whole, 7)
            if algorithms.all_gather(whole[mine].copy(), out, algorithm=algorithm, check=salt % 2 == 0,
                                     **extra) is not out or wrong_elements(out, whole):
                failures.append(f"n={count} call {salt} out of place")
            inplace = np.zeros_like(whole)
            inplace[mine] = whole[mine]
            if algorithms.all_gather(inplace, algorithm=algorithm, **extra) is not inplace or wrong_elements(
                    inplace, whole):
                failures.append(f"n={count} call {salt} in place")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


def trees_for(size):
    """Trees of every shape the executor may be handed: binomial from each root, a chain,
    a star, and random level-by-level trees (the same on every rank)."""
    trees = [binomial_tree(size, root) for root in range(size)]
    chain = [[(r, r + 1)] for r in range(size - 1)]
    trees.append(Tree.from_levels(size, 0, chain))
    star = [[(size - 1, r)] for r in range(size - 1)]
    trees.append(Tree.from_levels(size, size - 1, star))
    rng = np.random.default_rng(1234 + size)
    for _ in range(4):
        order = [int(r) for r in rng.permutation(size)]
        inside, outside, levels = [order[0]], order[1:], []
        while outside:
            k = int(rng.integers(1, min(len(inside), len(outside)) + 1))
            parents = [int(p) for p in rng.choice(inside, size=k, replace=False)]
            level = list(zip(parents, outside[:k]))
            inside += outside[:k]
            outside = outside[k:]
            levels.append(level)
        trees.append(Tree.from_levels(size, order[0], levels))
    return trees


@pytest.mark.parametrize("op", ["sum", "max"])
def test_tree_executor_runs_any_tree(comm, op):
    failures = []
    for t, tree in enumerate(trees_for(comm.size)):
        for count in (comm.size + 1, 4099):
            x = rank_input("int32", op, count, comm.rank, comm.size)
            expected = numpy_reference("int32", op, count, comm.size)
            out = algorithms.allreduce(x, np.empty_like(x), op=op, algorithm="tree", tree=tree)
            if wrong_elements(out, expected):
                failures.append(f"tree {t} (root {tree.root}, {tree.depth()} levels) n={count}")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


def test_tree_executor_runs_two_trees_at_once(comm):
    """Two trees each carrying half of the vector at once, as dbtree's do: pairs of every shape,
    a tree with itself and a chain with its reverse among them, so that one link carries both
    trees' messages in one direction or in opposite ones."""
    trees = trees_for(comm.size)
    chain = Tree.from_levels(comm.size, comm.size - 1, [[(r, r - 1)] for r in range(comm.size - 1, 0, -1)])
    pairs = [(trees[0], trees[0]), (trees[comm.size], chain)] + [(t, trees[(3 * i + 1) % len(trees)]) for i, t in enumerate(trees)]
    coll = private_comm(comm).collective(np, "sum")
    failures = []
    for count in (comm.size + 1, 40_000):
        x = rank_input("int32", "sum", count, comm.rank, comm.size)
        expected = numpy_reference("int32", "sum", count, comm.size)
        for p, pair in enumerate(pairs):
            out = np.full_like(x, 99)
            tree_executor.allreduce(coll, x, out, list(pair))
            if wrong_elements(out, expected):
                failures.append(f"pair {p} (roots {pair[0].root}, {pair[1].root}) n={count}")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


def test_private_communicator_leaves_user_messages_alone(comm):
    """A receive the caller has posted on the same communicator must not catch our traffic."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    pending = np.full(4, -1, dtype=np.int32)
    request = comm.Irecv(pending, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    for algorithm in algorithms.ALGORITHMS:
        x = np.arange(64, dtype=np.int32) + comm.rank
        algorithms.allreduce(x, algorithm=algorithm, **options(algorithm, comm.size))
    matched_early = request.Test()
    comm.Barrier()  # nobody sends the real message before every rank has looked
    peer = (comm.rank - 1) % comm.size
    comm.Send(np.full(4, comm.rank, dtype=np.int32), (comm.rank + 1) % comm.size, tag=3)
    request.Wait()
    assert not matched_early, "the collective's messages matched the caller's receive"
    assert pending.tolist() == [peer] * 4


def test_subcommunicator(comm):
    """The comm argument is honoured: even and odd ranks reduce separately."""
    sub = comm.Split(comm.rank % 2, comm.rank)
    members = list(range(comm.rank % 2, comm.size, 2))
    for algorithm in algorithms.ALGORITHMS:
        x = np.full(1001, comm.rank, dtype=np.int64)
        algorithms.allreduce(x, algorithm=algorithm, comm=sub, **options(algorithm, sub.size))
        assert (x == sum(members)).all(), algorithm
    sub.Free()


def test_repeated_calls_reuse_workspace(comm):
    """After the first call of a size, further calls allocate no new scratch buffers."""
    x = np.ones(100_003, dtype=np.float32)
    for algorithm in algorithms.ALGORITHMS:
        algorithms.allreduce(x, np.empty_like(x), algorithm=algorithm, **options(algorithm, comm.size))
    before = {k: id(v) for k, v in algorithms.WORKSPACE._buffers.items()}
    for algorithm in algorithms.ALGORITHMS:
        algorithms.allreduce(x, np.empty_like(x), algorithm=algorithm, **options(algorithm, comm.size))
    after = {k: id(v) for k, v in algorithms.WORKSPACE._buffers.items()}
    assert before == after


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_propagate_nan_alike_on_every_rank(comm, op):
    """A NaN on any one rank gives NaN at that element on every rank, whichever rank holds it
    and with every algorithm (NumPy's maximum/minimum: the reference is NaN by definition).
    MPI's own MAX and MIN need not: MPICH's result depends on where the NaN enters."""
    count = 3 * comm.size + 1
    for algorithm in sorted(set(algorithms.ALGORITHMS) - {"native"}):  # native is MPI's own MAX and MIN
        for dtype in ("float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
            x = rank_input(dtype, op, count, comm.rank, comm.size).astype(dtype)
            x[comm.rank::comm.size] = np.nan  # element i: NaN on rank i % size alone
            out = algorithms.allreduce(x, np.empty_like(x), op=op, algorithm=algorithm,
                                       **options(algorithm, comm.size))
            finite = np.isfinite(out)
            assert not finite.any(), (algorithm, dtype, np.flatnonzero(finite)[:5])
            everyone = comm.allgather(out.tobytes())
            assert all(b == everyone[0] for b in everyone), (algorithm, dtype, "ranks differ")


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
def test_low_precision_sums_of_any_data_are_alike_on_every_rank(comm, dtype):
    """Random inputs, whose partial sums round: whatever order an algorithm adds in, every rank
    ends with the same bits, and each element is within the rounding of (N - 1) additions of the
    float64 sum: |result - exact| <= (N - 1) eps sum|x| (each addition rounds by at most eps
    times its result, which is at most sum|x|), eps the type's machine epsilon."""
    import ml_dtypes

    dt = np.dtype(getattr(ml_dtypes, dtype, dtype))
    count = 4099
    inputs = [np.random.default_rng(r).normal(0, 4, count).astype(dt) for r in range(comm.size)]
    wide = np.array([x.astype(np.float64) for x in inputs])
    exact, scale = wide.sum(0), np.abs(wide).sum(0)
    bound = (comm.size - 1) * float(ml_dtypes.finfo(dt).eps) * scale
    failures = []
    for algorithm in ALGORITHMS:
        out = algorithms.allreduce(inputs[comm.rank], np.empty_like(inputs[comm.rank]), op="sum", algorithm=algorithm,
                                   **options(algorithm, comm.size))
        every = comm.allgather(out.view(np.uint8).tobytes())
        if any(bits != every[0] for bits in every):
            failures.append(f"{algorithm}: ranks differ")
        far = int(np.count_nonzero(np.abs(out.astype(np.float64) - exact) > bound))
        if far:
            failures.append(f"{algorithm}: {far} elements beyond the rounding bound")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


class CountingTransport:
    """MPI, counting the bytes every receive takes in (so that an algorithm's ``received`` is
    checked against what it does, not against itself)."""

    def __init__(self, inner):
        self.inner, self.received = inner, 0
        self.send, self.isend, self.describe = inner.send, inner.isend, inner.describe

    def recv(self, buf, source):
        self.received += buf.nbytes
        self.inner.recv(buf, source)

    def sendrecv(self, sendbuf, dest, recvbuf, source):
        self.received += recvbuf.nbytes
        self.inner.sendrecv(sendbuf, dest, recvbuf, source)

    def irecv(self, buf, source):
        self.received += buf.nbytes
        return self.inner.irecv(buf, source)


#: what oneshot and twoshot run on device buffers, which their ``received`` describes (on NumPy
#: buffers they read the node's boxes instead: algorithms/runtime/posted.py)
ON_THE_DEVICE = {"oneshot": "rd", "twoshot": "ring"}


def test_received_bytes_are_what_each_algorithm_declares(comm):
    """The bytes all ranks receive in one all-reduce (on the MPI transport, counted at every
    receive) are the reduced and copied bytes each algorithm's record declares: the messages
    behind its one-GPU bound (docs/gpu.md)."""
    from algorithms.runtime.executor import WORKSPACE
    from algorithms.runtime.transports.mpi import DirectTransport

    fresh = comm.Dup()
    try:
        private = private_comm(fresh)
        counting = private.transports["numpy"] = CountingTransport(DirectTransport(private, np, WORKSPACE))
        x = rank_input("float32", "sum", 1001, comm.rank, comm.size)
        found, declared = {}, {}
        for name, algorithm in algorithms.ALGORITHMS.items():
            if algorithm.received is None:
                continue
            run = ON_THE_DEVICE.get(name, name)
            counting.received = 0
            algorithms.allreduce(x, np.empty_like(x), algorithm=run, comm=fresh, **options(run, comm.size))
            found[name] = comm.allreduce(counting.received)
            declared[name] = sum(algorithm.received(comm.size, x.nbytes))
    finally:
        fresh.Free()
    assert found == declared
