"""The hierarchical all-reduce (``hier``) on the node layout the launcher sets through
``ALLREDUCE_NODE_MAP`` (unset: the ranks that share memory), against NumPy and comm.Allreduce,
bit for bit (the inputs are small integers, exact in any order, as in test_correctness.py);
its reduce-scatter and all-gather on their own against NumPy, comm.Reduce_scatter_block and
comm.Allgather(v), in the standard chunk layout whatever the nodes.

Every dtype and op, out of place, in place and recvbuf is sendbuf, counts below and above the
rank count. Bad maps and settings raise the same error on every rank, in seconds."""

import os
import time

import numpy as np
import pytest
from conftest import native_reference, numpy_reference, rank_input, wrong_elements
from mpi4py import MPI

import algorithms
from algorithms.runtime import executor
from algorithms.catalog.hier import layout_of, owners
from algorithms.ops import LOW_PRECISION, is_floating
from topology import binomial_tree, random_heterogeneous

pytestmark = pytest.mark.mpi

DTYPES = [dt.name for dt in algorithms.DTYPES]
ACROSS = os.environ.get("ALLREDUCE_HIER_ACROSS", "ring")


def extra(size):
    """bandwidth= for the bamtree variant: a random heterogeneous matrix, the same on every rank."""
    return {"bandwidth": random_heterogeneous(size, seed=7 + size).bandwidth} if ACROSS == "bamtree" else {}


def expected_nodes(comm):
    """Node index per rank, worked out here: from the map's text, or from Split_type."""
    text = os.environ.get("ALLREDUCE_NODE_MAP", "").strip()
    if text:
        labels = [int(t) for t in text.split(",")]
    else:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        labels = comm.allgather(node.allreduce(comm.rank, op=MPI.MIN))
        node.Free()
    first = {}
    return [first.setdefault(label, len(first)) for label in labels]


def counts_for(size):
    """0, 1, 7, N-1, N+1, a prime, and a prime long enough for several segments a piece where
    the suite sets 4 KiB ones (ALLREDUCE_SEGMENT_BYTES)."""
    return sorted({0, 1, 7, max(size - 1, 0), size + 1, 1009, 5003})


def ops_for(dtype):
    return [op for op in algorithms.OPS if not (op == "avg" and not is_floating(dtype))]


def test_layout_is_the_map(comm):
    """The layout hier runs on is the launcher's, and every piece has one owner per node."""
    layout = layout_of(comm)
    nodes = expected_nodes(comm)
    assert layout.describe() == {"nodes": nodes, "across": ACROSS,
                                 "source": "ALLREDUCE_NODE_MAP" if os.environ.get("ALLREDUCE_NODE_MAP")
                                 else "shared memory"}
    sizes = [nodes.count(k) for k in range(max(nodes) + 1)]
    assert [list(ranks) for ranks in layout.members] == [[r for r in range(comm.size) if nodes[r] == k]
                                                         for k in range(len(sizes))]
    for piece in range(max(sizes)):  # one owner per node, in node order
        assert [nodes[r] for r in owners(layout.members, piece)] == list(range(len(sizes)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_matches_references(comm, dtype):
    failures = []
    options = extra(comm.size)
    for op in ops_for(dtype):
        for count in counts_for(comm.size):
            x = rank_input(dtype, op, count, comm.rank, comm.size)
            expected = numpy_reference(dtype, op, count, comm.size)
            if np.dtype(dtype) not in LOW_PRECISION:  # MPI has no bfloat16 or fp8
                assert wrong_elements(native_reference(comm, x, op), expected) == 0, f"MPI disagrees: {op} {count}"
            out = np.full_like(x, 99)
            result = algorithms.allreduce(x, out, op=op, algorithm="hier", **options)
            bad = wrong_elements(out, expected)
            if bad or result is not out:
                failures.append(f"{op} n={count} out of place: {bad} wrong")
            if wrong_elements(x, rank_input(dtype, op, count, comm.rank, comm.size)):
                failures.append(f"{op} n={count}: sendbuf was modified")
            inplace = x.copy()
            result = algorithms.allreduce(inplace, op=op, algorithm="hier", **options)
            bad = wrong_elements(inplace, expected)
            if bad or result is not inplace:
                failures.append(f"{op} n={count} in place: {bad} wrong")
            same = x.copy()
            algorithms.allreduce(same, same, op=op, algorithm="hier", **options)
            if wrong_elements(same, expected):
                failures.append(f"{op} n={count} recvbuf is sendbuf: wrong")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


def block_reference(comm, x, op):
    """``comm.Reduce_scatter_block`` of ``x`` (a multiple of the rank count long), avg as sum / size."""
    mpi_op = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
    out = np.empty(x.size // comm.size, x.dtype)
    comm.Reduce_scatter_block(x, out, op=mpi_op)
    if op == "avg":
        np.divide(out, comm.size, out=out)
    return out


def allgatherv_reference(comm, chunk, count):
    """``comm.Allgather`` (or ``Allgatherv`` where the count does not divide) of each rank's chunk
    of ``chunk_offsets``, on the dtype's bit patterns (MPI has no bfloat16 or fp8)."""
    offsets = algorithms.chunk_offsets(count, comm.size)
    bits = np.dtype(f"u{chunk.itemsize}")
    whole = np.empty(count, chunk.dtype)
    if count % comm.size == 0:
        comm.Allgather(chunk.view(bits), whole.view(bits))
    else:
        comm.Allgatherv(chunk.view(bits), [whole.view(bits), (np.diff(offsets).tolist(), offsets[:-1])])
    return whole


def no_communicator_built(comm, call):
    """``call()``, checking it builds no communicator (hier's plans run on the caller's)."""
    live = len(executor._LIVE)
    call()
    assert len(executor._LIVE) == live


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_matches_references(comm, dtype):
    """Rank r gets chunk r of chunk_offsets(count, N), as NumPy and MPI_Reduce_scatter_block
    reduce it, out of place and in place, the input untouched."""
    failures = []
    options = extra(comm.size)
    for op in ops_for(dtype):
        for count in counts_for(comm.size):
            x = rank_input(dtype, op, count, comm.rank, comm.size)
            offsets = algorithms.chunk_offsets(count, comm.size)
            own = numpy_reference(dtype, op, count, comm.size)[offsets[comm.rank]:offsets[comm.rank + 1]]
            if count % comm.size == 0 and np.dtype(dtype) not in LOW_PRECISION:
                assert wrong_elements(block_reference(comm, x, op), own) == 0, f"MPI disagrees: {op} {count}"
            out = np.full(own.size, 99, dtype=x.dtype)
            result = algorithms.reduce_scatter(x, out, op=op, algorithm="hier", **options)
            bad = wrong_elements(out, own)
            if bad or result is not out:
                failures.append(f"{op} n={count} out of place: {bad} wrong")
            if wrong_elements(x, rank_input(dtype, op, count, comm.rank, comm.size)):
                failures.append(f"{op} n={count}: sendbuf was modified")
            inplace = x.copy()
            view = algorithms.reduce_scatter(inplace, op=op, algorithm="hier", **options)
            if wrong_elements(view, own) or (view.size and not np.shares_memory(view, inplace)):
                failures.append(f"{op} n={count} in place: wrong")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_matches_native_allgatherv(comm, dtype):
    """Every rank gets the whole vector, bit for bit as MPI_Allgather(v) gathers it, out of
    place and in place (the rest of the vector garbage before)."""
    failures = []
    options = extra(comm.size)
    for count in counts_for(comm.size):
        offsets = algorithms.chunk_offsets(count, comm.size)
        mine = slice(offsets[comm.rank], offsets[comm.rank + 1])
        whole = rank_input(dtype, "max", count, 0, 1, salt=5)  # the same vector on every rank
        chunk = whole[mine].copy()
        assert wrong_elements(allgatherv_reference(comm, chunk, count), whole) == 0
        out = np.full_like(whole, 7)
        if algorithms.all_gather(chunk, out, algorithm="hier", **options) is not out or wrong_elements(out, whole):
            failures.append(f"n={count} out of place")
        inplace = np.full_like(whole, 3)
        inplace[mine] = chunk
        if algorithms.all_gather(inplace, algorithm="hier", **options) is not inplace or wrong_elements(inplace, whole):
            failures.append(f"n={count} in place")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


def test_halves_make_an_allreduce_and_build_nothing_more(comm):
    """The reduce-scatter then the all-gather, in place, of floats whose sums round: the same bits
    on every rank (each element reduced in one order, then copied), the all-reduce's sum to
    rounding, and no communicator built beyond the all-reduce's."""
    options = extra(comm.size)
    rng = np.random.default_rng(11 + comm.rank)
    for count in (comm.size + 1, 4099):
        x = rng.standard_normal(count).astype(np.float32)
        reduced = algorithms.allreduce(x, np.empty_like(x), algorithm="hier", **options)
        halves = x.copy()
        no_communicator_built(comm, lambda: algorithms.reduce_scatter(halves, algorithm="hier", **options))
        no_communicator_built(comm, lambda: algorithms.all_gather(halves, algorithm="hier", **options))
        agreed = comm.allgather(halves.tobytes())
        assert agreed == [agreed[0]] * comm.size, "the ranks differ"
        assert np.allclose(halves, reduced, rtol=1e-5, atol=1e-5)


def test_bamtree_variant_uses_its_tree(comm):
    if ACROSS != "bamtree":
        pytest.skip("ALLREDUCE_HIER_ACROSS=bamtree runs only")
    layout = layout_of(comm)
    trees = list(layout._trees.values())
    nodes = len(layout.members)
    assert nodes == 1 or (len(trees) == 1 and trees[0].size == nodes)


def test_no_communicator_but_the_callers_private_one(comm):
    """hier runs on the caller's communicator: the only communicator made is its private
    duplicate, as for every algorithm, and it goes with the caller's."""
    live = len(executor._LIVE)
    dup = comm.Dup()
    x = np.arange(100, dtype=np.int64) + comm.rank
    algorithms.allreduce(x, algorithm="hier", comm=dup, **extra(comm.size))
    assert (x == np.arange(100) * comm.size + comm.size * (comm.size - 1) // 2).all()
    assert len(executor._LIVE) == live + 1
    dup.Free()
    assert len(executor._LIVE) == live


def one_message_everywhere(comm, error, match, call):
    """``call`` raises ``error`` matching ``match`` on every rank, with the same text, in seconds."""
    started = time.monotonic()
    with pytest.raises(error, match=match) as caught:
        call()
    assert time.monotonic() - started < 5
    texts = comm.allgather(str(caught.value))
    assert texts == [texts[0]] * comm.size, texts


class environment:
    """Set the variables on this rank for a while (every rank the same unless given per rank)."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        self.saved = {name: os.environ.get(name) for name in self.values}
        for name, value in self.values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def x_and_y(comm):
    return np.arange(10, dtype=np.float64) + comm.rank, np.zeros(10)


def still_works(comm, on):
    x, y = x_and_y(comm)
    algorithms.allreduce(x, y, algorithm="hier", comm=on, **extra(comm.size))
    assert (y == np.arange(10) * comm.size + comm.size * (comm.size - 1) // 2).all()


def test_map_of_the_wrong_length(comm):
    dup = comm.Dup()
    wrong = ",".join(["0"] * (comm.size + 1))
    with environment(ALLREDUCE_NODE_MAP=wrong):
        for in_place in (False, True):  # the fast path and the full validation
            x, y = x_and_y(comm)
            one_message_everywhere(
                comm, ValueError, f"ALLREDUCE_NODE_MAP has {comm.size + 1} node ids .* for a communicator of "
                                  f"{comm.size} rank.*: give one node id per rank",
                lambda: algorithms.allreduce(x, None if in_place else y, algorithm="hier", comm=dup,
                                             **extra(comm.size)))
    still_works(comm, dup)  # nothing was cached or sent: with the map put back, the same communicator works
    dup.Free()


@pytest.mark.parametrize("bad,match", [
    ("0,x", r"ALLREDUCE_NODE_MAP='0,x': entry 1, 'x', is not an integer node id"),
    ("0,,1", r"entry 1, '', is not an integer node id"),
    ("1.5", r"entry 0, '1.5', is not an integer node id"),
])
def test_map_that_is_not_integers(comm, bad, match):
    dup = comm.Dup()
    with environment(ALLREDUCE_NODE_MAP=bad):
        x, y = x_and_y(comm)
        one_message_everywhere(comm, ValueError, match + r".*\(on ranks? 0",
                               lambda: algorithms.allreduce(x, y, algorithm="hier", comm=dup))
    still_works(comm, dup)
    dup.Free()


def test_map_that_differs_between_ranks(comm):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    dup = comm.Dup()
    mine = ",".join(["0"] * comm.size) if comm.rank else ",".join(map(str, range(comm.size)))
    with environment(ALLREDUCE_NODE_MAP=mine):
        x, y = x_and_y(comm)
        one_message_everywhere(comm, ValueError, "ALLREDUCE_NODE_MAP differs between ranks",
                               lambda: algorithms.allreduce(x, y, algorithm="hier", comm=dup))
    dup.Free()


def test_bamtree_needs_bandwidth_and_ring_takes_none(comm):
    x, y = x_and_y(comm)
    matrix = random_heterogeneous(comm.size, seed=3).bandwidth
    for across, kwargs, match in [("bamtree", {}, "ALLREDUCE_HIER_ACROSS=bamtree builds its tree across nodes"),
                                  ("ring", {"bandwidth": matrix}, "takes bandwidth= only with ALLREDUCE_HIER_ACROSS"),
                                  ("bamtree", {"bandwidth": random_heterogeneous(comm.size + 1).bandwidth},
                                   f"has {comm.size + 1} ranks, the communicator has {comm.size}")]:
        dup = comm.Dup()
        with environment(ALLREDUCE_HIER_ACROSS=across):
            for in_place in (False, True):
                one_message_everywhere(comm, ValueError, match,
                                       lambda: algorithms.allreduce(x, None if in_place else y, algorithm="hier",
                                                                    comm=dup, **kwargs))
        dup.Free()
    one_message_everywhere(comm, ValueError, "algorithm 'hier' takes no tree",
                           lambda: algorithms.allreduce(x, y, algorithm="hier", tree=binomial_tree(comm.size)))


def test_the_halves_under_bamtree_need_no_bandwidth(comm):
    """With ALLREDUCE_HIER_ACROSS=bamtree only the all-reduce builds a tree across nodes: the
    halves run rings there, so they take no bandwidth= (one given is checked, then unused), reduce
    and gather as NumPy does either way, and auto may choose hier for them."""
    count = 4 * comm.size + 3
    offsets = algorithms.chunk_offsets(count, comm.size)
    mine = slice(offsets[comm.rank], offsets[comm.rank + 1])
    x = rank_input("float64", "sum", count, comm.rank, comm.size)
    reduced = numpy_reference("float64", "sum", count, comm.size)
    dup = comm.Dup()
    with environment(ALLREDUCE_HIER_ACROSS="bamtree"):
        hier = algorithms.ALGORITHMS["hier"]
        assert hier.wants_bandwidth() and not hier.wants_bandwidth("reduce_scatter")
        assert not hier.wants_bandwidth("all_gather") and "hier" in algorithms.auto.candidates("all_gather")
        for kwargs in ({}, {"bandwidth": random_heterogeneous(comm.size, seed=3).bandwidth}):
            out = algorithms.reduce_scatter(x, np.empty(mine.stop - mine.start), op="sum", algorithm="hier", comm=dup,
                                            **kwargs)
            assert wrong_elements(out, reduced[mine]) == 0, kwargs
            whole = np.zeros(count)
            whole[mine] = reduced[mine]
            assert wrong_elements(algorithms.all_gather(whole, algorithm="hier", comm=dup, **kwargs), reduced) == 0
        wrong_size = random_heterogeneous(comm.size + 1).bandwidth
        one_message_everywhere(comm, ValueError, f"has {comm.size + 1} ranks, the communicator has {comm.size}",
                               lambda: algorithms.reduce_scatter(x, algorithm="hier", comm=dup, bandwidth=wrong_size))
    dup.Free()
