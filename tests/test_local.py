"""Single-process tests: pure data (chunks, trees, sizes, report format) and one-rank calls."""

import math

import numpy as np
import pytest
from mpi4py import MPI

import algorithms
from algorithms.ops import LOW_PRECISION, is_floating
from bench.core.collectives import COLLECTIVES
from bench.core.sizes import parse_size, sweep
from bench.formats.report import footer, row
from topology import Tree, binomial_tree


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("count", [0, 1, 4, 12, 13, 1009])
def test_chunk_offsets_cover_the_vector_evenly(count, size):
    offsets = algorithms.chunk_offsets(count, size)
    lengths = np.diff(offsets)
    assert offsets[0] == 0 and offsets[-1] == count and len(offsets) == size + 1
    assert lengths.max() - lengths.min() <= 1
    assert list(lengths) == sorted(lengths, reverse=True)  # the larger chunks first
    assert sum(lengths) == count


@pytest.mark.parametrize("size", range(1, 34))
def test_binomial_tree_shape(size):
    for root in {0, size // 2, size - 1}:
        tree = binomial_tree(size, root)
        assert tree.depth() == math.ceil(math.log2(size)) if size > 1 else tree.depth() == 0
        assert tree.parent[root] == -1
        # every rank reaches the root by following parents (brute force)
        for rank in range(size):
            hops, node = 0, rank
            while node != root:
                node = tree.parent[node]
                hops += 1
                assert hops <= size
        # each level at most doubles the tree, as in the seed's level-by-level growth
        inside = 1
        for level in tree.levels:
            assert len(level) <= inside
            inside += len(level)
        assert inside == size


def test_tree_validation_names_the_problem():
    with pytest.raises(ValueError, match="parent 2 is not in the tree yet"):
        Tree.from_levels(3, 0, [[(2, 1)], [(0, 2)]])
    with pytest.raises(ValueError, match="rank 0 appears in two pairs"):
        Tree.from_levels(3, 0, [[(0, 1), (0, 2)]])
    with pytest.raises(ValueError, match=r"does not reach rank\(s\) \[2\]"):
        Tree.from_levels(3, 0, [[(0, 1)]])
    with pytest.raises(ValueError, match="already in the tree"):
        Tree.from_levels(3, 0, [[(0, 1)], [(1, 0)]])
    with pytest.raises(ValueError, match="root 3 is not a rank"):
        Tree.from_levels(3, 3, [])


def test_tree_digest_tells_trees_apart():
    assert binomial_tree(8, 0).digest() == binomial_tree(8, 0).digest()
    assert binomial_tree(8, 0).digest() != binomial_tree(8, 1).digest()


@pytest.mark.parametrize("algorithm", sorted(algorithms.ALGORITHMS))
@pytest.mark.parametrize("dtype", [dt.name for dt in algorithms.DTYPES])
def test_one_rank_is_a_copy(algorithm, dtype):
    x = (np.arange(101) % 50).astype(dtype)
    for op in algorithms.OPS:
        if op == "avg" and not is_floating(dtype):
            continue
        out = np.zeros_like(x)
        extra = {"bandwidth": [[0.0]]} if algorithm in ("bamtree", "kmtree", "bamring") else {}
        if algorithm == "native" and np.dtype(dtype) in LOW_PRECISION:  # MPI has no bfloat16 or fp8
            with pytest.raises(TypeError, match=r"^algorithm 'native' \(MPI_Allreduce\): .*(no bfloat16|no float8)"):
                algorithms.allreduce(x, out, op=op, algorithm=algorithm)
            continue
        assert algorithms.allreduce(x, out, op=op, algorithm=algorithm, **extra) is out
        assert np.array_equal(out.view(np.uint8), x.view(np.uint8))


def test_one_rank_reduce_scatter_and_all_gather():
    x = np.arange(10, dtype=np.float32)
    assert np.array_equal(algorithms.reduce_scatter(x, np.empty(10, np.float32)), x)
    assert np.array_equal(algorithms.all_gather(x, np.empty(10, np.float32)), x)


def test_not_cuda_aware_here_and_override(monkeypatch):
    algorithms.mpi_is_cuda_aware.cache_clear()
    assert algorithms.mpi_is_cuda_aware() is False  # the mpich wheel is built without CUDA
    monkeypatch.setenv("ALLREDUCE_CUDA_AWARE", "1")
    algorithms.mpi_is_cuda_aware.cache_clear()
    assert algorithms.mpi_is_cuda_aware() is True
    algorithms.mpi_is_cuda_aware.cache_clear()


def test_unknown_transport_is_refused(monkeypatch):
    monkeypatch.setenv("ALLREDUCE_TRANSPORT", "carrier-pigeon")
    comm = MPI.COMM_SELF.Dup()  # the variable is read on a communicator's first use
    try:
        with pytest.raises(ValueError, match="ALLREDUCE_TRANSPORT='carrier-pigeon' is not one of auto, direct, staged, shm"):
            algorithms.allreduce(np.ones(3), comm=comm)
    finally:
        comm.Free()


@pytest.mark.parametrize("transport,variable", [("staged", "ALLREDUCE_STAGE_BYTES"), ("shm", "ALLREDUCE_SHM_MIN_BYTES"),
                                                ("shm", "ALLREDUCE_SHM_MAX_BYTES"), ("shm", "ALLREDUCE_SHM_SLOT_BYTES")])
def test_bad_transport_sizes_are_refused(monkeypatch, transport, variable):
    monkeypatch.setenv("ALLREDUCE_TRANSPORT", transport)
    monkeypatch.setenv(variable, "lots")
    comm = MPI.COMM_SELF.Dup()  # read on a communicator's first use
    try:
        with pytest.raises(ValueError, match=f"{variable}='lots' must be a positive number of bytes"):
            algorithms.allreduce(np.ones(3), comm=comm)
    finally:
        comm.Free()


def test_transport_in_use_says_how_host_buffers_travel():
    comm = MPI.COMM_SELF.Dup()
    try:
        assert algorithms.transport_in_use(np, comm) == (
            "shared-memory within a node; MPI between nodes and for messages under 8 KiB and over 256 KiB")
    finally:
        comm.Free()


def test_parse_size():
    assert parse_size("8") == 8
    assert parse_size("64K") == 65536
    assert parse_size("128M") == 128 * 2**20
    assert parse_size("1G") == 2**30
    for bad in ("", "12Q", "M", "-4"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_sweep_like_nccl_tests():
    assert sweep(8, 64, factor=2) == [8, 16, 32, 64]
    assert sweep(8, 100, factor=4) == [8, 32]
    assert sweep(0, 30, step=10) == [0, 10, 20, 30]
    with pytest.raises(ValueError):
        sweep(64, 8)


def test_bus_factor():
    assert COLLECTIVES["allreduce"].factor(8) == pytest.approx(1.75)
    assert COLLECTIVES["allgather"].factor(4) == pytest.approx(0.75)
    assert COLLECTIVES["reducescatter"].factor(4) == pytest.approx(0.75)
    assert COLLECTIVES["allreduce"].factor(1) == 0.0


def test_row_matches_nccl_tests_layout():
    # a row of DESIGN.md / nccl-tests, reproduced from its numbers
    line = row(33554432, 8388608, "float32", "sum", -1,
               [(190.1e-6, 176.52, 308.91, 0), (189.5e-6, 177.07, 309.87, 0)])
    assert line == ("    33554432       8388608     float     sum      -1"
                    "    190.1  176.52  308.91       0    189.5  177.07  309.87       0")
    assert footer(0, [308.91, 309.87]) == "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 309.39"
    assert footer(3, [1.0]).startswith("# Out of bounds values : 3 FAILED")
