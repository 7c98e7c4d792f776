"""Bad arguments raise a clear error on every rank, within seconds, and leave the
communicator usable (no stray messages, no rank left waiting)."""

import time
import warnings
import weakref

import numpy as np
import pytest
from conftest import options

import algorithms
from algorithms.runtime import agreement, compiled
from algorithms.runtime.executor import private_comm
from topology import binomial_tree

pytestmark = pytest.mark.mpi


def raises_everywhere(comm, error, match, call):
    """Every rank must raise ``error`` matching ``match``; then a normal all-reduce must work."""
    started = time.monotonic()
    with pytest.raises(error, match=match):
        call()
    assert time.monotonic() - started < 5, "the error took more than 5 seconds"
    for algorithm in algorithms.ALGORITHMS:
        x = np.full(17, comm.rank + 1, dtype=np.int64)
        algorithms.allreduce(x, algorithm=algorithm, **options(algorithm, comm.size))
        assert (x == comm.size * (comm.size + 1) // 2).all()


def x32(n=10):
    return np.arange(n, dtype=np.float32)


@pytest.mark.parametrize("algorithm", sorted(algorithms.ALGORITHMS))
def test_sizes_differ(comm, algorithm):
    raises_everywhere(comm, ValueError, "recvbuf has 9 elements, expected 10",
                      lambda: algorithms.allreduce(x32(), x32(9), algorithm=algorithm,
                                                   **options(algorithm, comm.size)))


def test_dtypes_differ(comm):
    raises_everywhere(comm, TypeError, "recvbuf dtype float64 differs from sendbuf dtype float32",
                      lambda: algorithms.allreduce(x32(), np.zeros(10)))


def test_not_contiguous(comm):
    raises_everywhere(comm, ValueError, "sendbuf must be contiguous",
                      lambda: algorithms.allreduce(x32(20)[::2]))


def test_multidimensional(comm):
    raises_everywhere(comm, ValueError, r"sendbuf must be 1-D, got shape \(2, 5\)",
                      lambda: algorithms.allreduce(x32().reshape(2, 5)))


def test_not_an_array(comm):
    raises_everywhere(comm, TypeError, "NumPy or CuPy arrays, got list",
                      lambda: algorithms.allreduce([1.0, 2.0]))


def test_unsupported_dtype(comm):
    raises_everywhere(comm, TypeError, "unsupported dtype complex128; supported: int8",
                      lambda: algorithms.allreduce(np.zeros(4, complex)))


def test_read_only_recvbuf(comm):
    frozen = x32()
    frozen.flags.writeable = False
    raises_everywhere(comm, ValueError, "recvbuf is read-only",
                      lambda: algorithms.allreduce(x32(), frozen))


def test_overlapping_buffers(comm):
    buf = x32(20)
    raises_everywhere(comm, ValueError, "overlap",
                      lambda: algorithms.allreduce(buf[:10], buf[5:15]))


def test_unknown_op_lists_choices(comm):
    raises_everywhere(comm, ValueError, r"unknown op 'mean'; choices: sum, prod, max, min, avg",
                      lambda: algorithms.allreduce(x32(), op="mean"))


def test_unknown_algorithm_lists_choices(comm):
    raises_everywhere(comm, ValueError, r"unknown algorithm 'butterfly'; choices: ps, ring, bamring, dring, tree, bamtree, kmtree, dbtree, rd, rabenseifner, hier, oneshot, twoshot, native, auto \(on rank",
                      lambda: algorithms.allreduce(x32(), algorithm="butterfly"))


@pytest.mark.parametrize("dtype", ["int32", "uint8"])
def test_avg_on_integers(comm, dtype):
    raises_everywhere(comm, TypeError, "op 'avg' needs a floating dtype",
                      lambda: algorithms.allreduce(np.ones(5, dtype), op="avg"))


def test_tree_of_wrong_size(comm):
    raises_everywhere(comm, ValueError, f"the tree spans {comm.size + 1} ranks",
                      lambda: algorithms.allreduce(x32(), algorithm="tree", tree=binomial_tree(comm.size + 1)))


def test_tree_with_ring(comm):
    raises_everywhere(comm, ValueError, "algorithm 'ring' takes no tree or bandwidth",
                      lambda: algorithms.allreduce(x32(), algorithm="ring", tree=binomial_tree(comm.size)))


def test_reduce_scatter_wrong_recvbuf(comm):
    raises_everywhere(comm, ValueError, "recvbuf has 11 elements",
                      lambda: algorithms.reduce_scatter(x32(), x32(11)))


def test_all_gather_wrong_chunk(comm):
    raises_everywhere(comm, ValueError, "sendbuf has 11 elements, but chunk",
                      lambda: algorithms.all_gather(x32(11), x32(10)))


def test_bad_comm(comm):
    with pytest.raises(TypeError, match="comm must be an mpi4py intracommunicator"):
        algorithms.allreduce(x32(), comm="world")


# ---- ranks that disagree: the error must name the field and the ranks, on every rank ----

needs_two = pytest.mark.mpi(min_size=2)


@needs_two
@pytest.mark.parametrize("algorithm", sorted(algorithms.ALGORITHMS))
def test_ranks_disagree_about_count(comm, algorithm):
    n = 10 if comm.rank == 0 else 11
    raises_everywhere(comm, ValueError, r"ranks disagree about count: 10 on rank 0; 11 on rank",
                      lambda: algorithms.allreduce(x32(n), algorithm=algorithm,
                                                   **options(algorithm, comm.size)))


@needs_two
def test_ranks_disagree_about_dtype(comm):
    dtype = np.float64 if comm.rank == 1 else np.float32
    raises_everywhere(comm, ValueError, r"dtype: .*'float64' on rank 1",
                      lambda: algorithms.allreduce(np.zeros(8, dtype)))


@needs_two
def test_ranks_disagree_about_op(comm):
    op = "max" if comm.rank == comm.size - 1 else "sum"
    raises_everywhere(comm, ValueError, rf"op: .*'max' on rank {comm.size - 1}",
                      lambda: algorithms.allreduce(x32(), op=op))


@needs_two
def test_ranks_disagree_about_algorithm(comm):
    algorithm = "ps" if comm.rank == 0 else "ring"
    raises_everywhere(comm, ValueError, r"algorithm: 'ps' on rank 0; 'ring' on rank",
                      lambda: algorithms.allreduce(x32(), algorithm=algorithm))


@needs_two
def test_ranks_disagree_about_tree(comm):
    tree = binomial_tree(comm.size, root=1 if comm.rank == 0 else 0)
    raises_everywhere(comm, ValueError, r"ranks disagree about tree",
                      lambda: algorithms.allreduce(x32(), algorithm="tree", tree=tree))


@needs_two
def test_ranks_disagree_about_collective(comm):
    def call():
        if comm.rank == 0:
            return algorithms.reduce_scatter(x32())
        return algorithms.allreduce(x32())
    raises_everywhere(comm, ValueError, r"collective: 'reduce_scatter' on rank 0", call)


@needs_two
def test_one_rank_passes_a_bad_buffer(comm):
    """Only rank 1 is wrong; every rank raises, naming rank 1 and its problem."""
    buf = x32().reshape(2, 5) if comm.rank == 1 else x32()
    raises_everywhere(comm, ValueError, r"sendbuf must be 1-D, got shape \(2, 5\); pass buf.ravel\(\) \(on rank 1\)$",
                      lambda: algorithms.allreduce(buf))


@needs_two
def test_one_rank_asks_avg_of_integers(comm):
    dtype = np.int32 if comm.rank == 0 else np.float32
    raises_everywhere(comm, TypeError, r"^allreduce: op 'avg' needs a floating dtype, got int32; use 'sum' \(on rank 0\)$",
                      lambda: algorithms.allreduce(np.ones(4, dtype), op="avg"))


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_the_agreement_refuses_a_mismatch_on_either_engine(comm, engine, monkeypatch):
    """The agreement's all-reduce is one step of the compiled engine within a node, and
    MPI_Allreduce under ALLREDUCE_ENGINE=python (or wherever the compiled engine cannot run);
    either way a mismatch, and one rank's problem, raise on every rank."""
    monkeypatch.setenv("ALLREDUCE_ENGINE", engine)
    mine = comm.Dup()
    try:
        algorithms.allreduce(x32(), comm=mine)
        maximum = private_comm(mine).resources[agreement.RESOURCE]
        assert (maximum.compiled is not None) == (engine == "compiled" and compiled.MISSING is None)
        if comm.size > 1:
            with pytest.raises(ValueError, match="ranks disagree about count: 11 on rank 0"):
                algorithms.allreduce(x32(10 if comm.rank else 11), comm=mine)
            with pytest.raises(ValueError, match=r"sendbuf must be 1-D, got shape \(2, 5\).* \(on rank 1\)$"):
                algorithms.allreduce(x32().reshape(2, 5) if comm.rank == 1 else x32(), comm=mine)
        x = np.full(3, comm.rank + 1, np.int64)
        algorithms.allreduce(x, comm=mine)
        assert (x == comm.size * (comm.size + 1) // 2).all()
    finally:
        mine.Free()


def _bad_recvbufs(n=10):
    """(error, message, recvbuf for a vector of ``n`` float32, n even): what the full validation refuses."""
    frozen = x32(n)
    frozen.flags.writeable = False
    return [(ValueError, "recvbuf is read-only", frozen),
            (ValueError, "recvbuf must be contiguous", x32(2 * n)[::2]),
            (ValueError, rf"recvbuf must be 1-D, got shape \(2, {n // 2}\)", x32(n).reshape(2, n // 2)),
            (TypeError, "recvbuf dtype float64 differs from sendbuf dtype float32", np.zeros(n)),
            (ValueError, f"recvbuf has {n - 1} elements, expected {n}", x32(n - 1))]


@pytest.mark.parametrize("algorithm", ["ring", "rd", "oneshot", "native", "auto"])
def test_bad_buffers_after_a_good_call_of_their_shape(comm, algorithm):
    """A repeat of a call's shape runs what the first call left bound (collectives.allreduce);
    its checks refuse what the full validation refuses, with the same message, on one rank alone too,
    with and without the agreement check."""
    sendbuf = x32()
    algorithms.allreduce(sendbuf, x32(), algorithm=algorithm)  # the good call of the shape
    for error, message, recvbuf in _bad_recvbufs():
        raises_everywhere(comm, error, message, lambda: algorithms.allreduce(sendbuf, recvbuf, algorithm=algorithm))
        if comm.size > 1:
            mine = recvbuf if comm.rank == 1 else x32()
            raises_everywhere(comm, error, message + r".* \(on rank 1\)",
                              lambda: algorithms.allreduce(sendbuf, mine, algorithm=algorithm))
    shared = x32(20)
    algorithms.allreduce(shared[:10], x32(), algorithm=algorithm, check=False)
    with pytest.raises(ValueError, match="sendbuf and recvbuf overlap without being the same buffer"):
        algorithms.allreduce(shared[:10], shared[5:15], algorithm=algorithm, check=False)
    comm.Barrier()


@pytest.mark.parametrize("algorithm", ["ring", "twoshot", "rabenseifner", "auto"])
def test_bad_buffers_after_good_halves_of_their_shape(comm, algorithm):
    """A repeat of a reduce-scatter's or an all-gather's shape runs what its first call kept
    (collectives._KeptHalf); what the full validation refuses is refused with the same message,
    on one rank alone too, and a kept shape that one rank calls with another count is a
    disagreement named on every rank."""
    n, chunk = 4 * comm.size, 4
    for _ in range(2):  # the good calls of the shapes: the second runs what the first kept
        algorithms.reduce_scatter(x32(n), x32(chunk), algorithm=algorithm)
        algorithms.all_gather(x32(chunk), x32(n), algorithm=algorithm)
    calls = [(lambda recvbuf: algorithms.reduce_scatter(x32(n), recvbuf, algorithm=algorithm), _bad_recvbufs(chunk)),
             (lambda recvbuf: algorithms.all_gather(x32(chunk), recvbuf, algorithm=algorithm),
              _bad_recvbufs(n)[:4] + [(ValueError, f"sendbuf has {chunk} elements, but chunk", x32(2))])]
    for call, bad in calls:
        for error, message, recvbuf in bad:
            raises_everywhere(comm, error, message, lambda: call(recvbuf))
            if comm.size > 1:
                raises_everywhere(comm, error, message + r".* \(on rank 1\)",
                                  lambda: call(recvbuf if comm.rank == 1 else None))
    shared = x32(n + 1)
    with pytest.raises(ValueError, match="sendbuf and recvbuf overlap without being the same buffer"):
        algorithms.all_gather(shared[:chunk], shared[1:], algorithm=algorithm, check=False)
    if comm.size > 1:
        more = n + comm.size if comm.rank else n  # rank 0 on its kept shape, the others on a new one
        raises_everywhere(comm, ValueError, rf"ranks disagree about count: {n} on rank 0; {n + comm.size} on rank",
                          lambda: algorithms.reduce_scatter(x32(more), x32(more // comm.size), algorithm=algorithm))
    comm.Barrier()


@pytest.mark.parametrize("algorithm", ["ring", "rd", "oneshot", "native", "auto"])
def test_the_same_vectors_changed_in_place_are_checked_again(comm, algorithm):
    """A repeat of the last call on the same two vectors checks only what can change in place
    (executor.LAST_CALL, compiled.repeat_checks): each such change is refused as the full validation
    refuses it, on one rank alone too and without the agreement check, and a valid change (both
    vectors reinterpreted as int32) runs as int32."""
    def restrided(buf):
        with warnings.catch_warnings():  # setting strides is deprecated from NumPy 2.4, and still works
            warnings.simplefilter("ignore", DeprecationWarning)
            buf.strides = (0,)

    def changes():
        yield ValueError, "recvbuf is read-only", lambda buf: setattr(buf.flags, "writeable", False)
        yield ValueError, r"recvbuf must be 1-D, got shape \(2, 5\)", lambda buf: setattr(buf, "shape", (2, 5))
        yield TypeError, "recvbuf dtype int32 differs from sendbuf dtype float32", lambda buf: setattr(buf, "dtype", np.int32)
        yield ValueError, "recvbuf must be contiguous", restrided

    for error, message, change in changes():
        for on in [range(comm.size)] + ([[1]] if comm.size > 1 else []):  # every rank, then rank 1 alone
            sendbuf, recvbuf = x32(), x32()
            for _ in range(3):  # the first call validates, the second keeps the vectors, the third reuses them
                algorithms.allreduce(sendbuf, recvbuf, algorithm=algorithm)
            if comm.rank in on:
                change(recvbuf)
            where = r".* \(on rank 1\)" if on == [1] else ""
            raises_everywhere(comm, error, message + where,
                              lambda: algorithms.allreduce(sendbuf, recvbuf, algorithm=algorithm))
        sendbuf, recvbuf = x32(), x32()
        for _ in range(3):  # unchecked, every rank changing its vector: each refuses it alone
            algorithms.allreduce(sendbuf, recvbuf, algorithm=algorithm, check=False)
        change(recvbuf)
        with pytest.raises(error, match=message):
            algorithms.allreduce(sendbuf, recvbuf, algorithm=algorithm, check=False)
        comm.Barrier()
    sendbuf, recvbuf = x32(), x32()
    for _ in range(3):
        algorithms.allreduce(sendbuf, recvbuf, algorithm=algorithm, check=False)
    sendbuf.dtype = recvbuf.dtype = np.int32
    sendbuf[:] = np.arange(10) + comm.rank
    algorithms.allreduce(sendbuf, recvbuf, algorithm=algorithm, check=False)
    assert recvbuf.dtype == np.int32
    np.testing.assert_array_equal(recvbuf, comm.size * np.arange(10) + comm.size * (comm.size - 1) // 2)


def test_a_freed_communicator_is_refused_after_repeated_calls(comm):
    """Calls repeated on a communicator leave nothing that runs on it once it is freed."""
    mine = comm.Dup()
    x, y = x32(), x32()
    for _ in range(3):
        algorithms.allreduce(x, y, algorithm="rd", comm=mine, check=False)
    mine.Free()
    with pytest.raises(TypeError, match="comm must be an mpi4py intracommunicator"):
        algorithms.allreduce(x, y, algorithm="rd", comm=mine, check=False)


def test_large_vectors_are_not_kept_referenced(comm):
    """Only the last call's vectors up to 64 KiB stay referenced between calls (as the ring's
    slices of them do); larger ones are freed when the caller drops them."""
    x = np.ones(32 << 10, np.float32)  # 128 KiB
    y = np.empty_like(x)
    for algorithm in ("rd", "ring", "native"):
        for _ in range(3):
            algorithms.allreduce(x, y, algorithm=algorithm, check=False)
    gone = weakref.ref(x), weakref.ref(y)
    del x, y
    assert all(ref() is None for ref in gone)


def test_persistent_allreduce_checks_once_on_every_rank(comm):
    """allreduce_init refuses what allreduce refuses, on every rank, one rank's mistake included."""
    for error, message, recvbuf in _bad_recvbufs():
        raises_everywhere(comm, error, message, lambda: algorithms.allreduce_init(x32(), recvbuf, algorithm="rd"))
    if comm.size > 1:
        count = 10 if comm.rank else 11
        raises_everywhere(comm, ValueError, "ranks disagree about count: 11 on rank 0",
                          lambda: algorithms.allreduce_init(x32(count), algorithm="ring"))


# ---- matched trees: the bandwidth matrix they are built from ----

@pytest.mark.parametrize("algorithm", ["bamtree", "kmtree"])
def test_matched_tree_without_matrix(comm, algorithm):
    raises_everywhere(comm, ValueError, rf"algorithm '{algorithm}' builds its tree from link bandwidths, "
                      "and none was given: pass bandwidth=",
                      lambda: algorithms.allreduce(x32(), algorithm=algorithm))


def test_bamring_needs_a_matrix_of_its_size_and_no_tree(comm):
    raises_everywhere(comm, ValueError, "algorithm 'bamring' finds its ring order from link bandwidths, and none "
                      "was given: pass bandwidth=", lambda: algorithms.allreduce(x32(), algorithm="bamring"))
    raises_everywhere(comm, ValueError, f"has {comm.size + 1} ranks, the communicator has {comm.size}",
                      lambda: algorithms.allreduce(x32(), algorithm="bamring",
                                                   bandwidth=np.ones((comm.size + 1, comm.size + 1))))
    raises_everywhere(comm, ValueError, "algorithm 'bamring' takes no tree",
                      lambda: algorithms.allreduce(x32(), algorithm="bamring", tree=binomial_tree(comm.size)))


def test_matched_tree_matrix_of_wrong_size(comm):
    raises_everywhere(comm, ValueError, f"has {comm.size + 1} ranks, the communicator has {comm.size}",
                      lambda: algorithms.allreduce(x32(), algorithm="bamtree",
                                                   bandwidth=np.ones((comm.size + 1, comm.size + 1))))


def test_matched_tree_unreadable_file(comm, tmp_path):
    missing = tmp_path / "nowhere.json"
    raises_everywhere(comm, ValueError, "cannot read bandwidth matrix .*nowhere.json",
                      lambda: algorithms.allreduce(x32(), algorithm="kmtree", bandwidth=str(missing)))


@needs_two
def test_matched_tree_disconnected(comm):
    cut = np.ones((comm.size, comm.size))
    cut[:, -1] = cut[-1, :] = 0  # the last rank has no link at all
    raises_everywhere(comm, ValueError, rf"rank\(s\) \[{comm.size - 1}\] cannot be reached from rank 0",
                      lambda: algorithms.allreduce(x32(), algorithm="bamtree", bandwidth=cut))


@needs_two
def test_one_rank_cannot_read_the_file(comm, tmp_path_factory):
    """A probe file that only some ranks can read (a node without the shared disk)."""
    folder = tmp_path_factory.mktemp(f"rank{comm.rank}")
    path = folder / "topo.json"
    if comm.rank != 1:
        from topology import uniform
        uniform(comm.size).save(path)
    raises_everywhere(comm, ValueError, r"cannot read bandwidth matrix .*\(on rank 1\)",
                      lambda: algorithms.allreduce(x32(), algorithm="bamtree", bandwidth=str(path)))
