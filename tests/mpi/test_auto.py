"""``algorithm="auto"`` and ``"native"``: auto follows its tuning table (``ALLREDUCE_TUNING_FILE``),
falls back to the model where no table applies, refuses a bad table on every rank, and gives the
exact result whatever it picks (against NumPy, bit for bit: small integer inputs, as in
test_correctness.py), native MPI among its picks.

Each test sets the table on every rank, then works on a fresh duplicate of COMM_WORLD, whose
first auto call reads the variable."""

import json
import os

import numpy as np
import pytest
from conftest import numpy_reference, rank_input, wrong_elements
from mpi4py import MPI

import algorithms
from algorithms.auto import SCHEMA, candidates, choice
from algorithms.ops import LOW_PRECISION, is_floating

pytestmark = pytest.mark.mpi

#: one dtype of each item size, every op
DTYPES = ["int8", "float16", "float32", "float64", "bfloat16"]


def table(comm, tmp_dir, rules, ranks=None, nodes=1, name="table.json"):
    """Write a tuning table (rank 0) and name it in ALLREDUCE_TUNING_FILE on every rank."""
    path = os.path.join(tmp_dir, name)
    if comm.rank == 0:
        with open(path, "w") as f:
            json.dump({"schema": SCHEMA, "ranks": comm.size if ranks is None else ranks, "nodes": nodes,
                       "rules": rules}, f)
    comm.Barrier()
    os.environ["ALLREDUCE_TUNING_FILE"] = path
    return path


@pytest.fixture
def fresh(comm, tmp_path_factory):
    """(a duplicate of COMM_WORLD, a directory every rank shares); the variable unset afterwards."""
    directory = comm.bcast(str(tmp_path_factory.mktemp("auto")) if comm.rank == 0 else None)
    dup = comm.Dup()
    yield dup, directory
    dup.Free()
    os.environ.pop("ALLREDUCE_TUNING_FILE", None)


def single_node(comm):
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    alone = node.Get_size() == comm.size
    node.Free()
    return alone


def test_the_table_decides_per_size(fresh):
    dup, directory = fresh
    path = table(dup, directory, [{"dtype": "*", "upto_bytes": 100, "order": ["ps"]},
                                  {"dtype": "*", "upto_bytes": 10_000, "order": ["native", "ring"]},
                                  {"dtype": "float64", "upto_bytes": None, "order": ["rd"]},
                                  {"dtype": "*", "upto_bytes": None, "order": ["ring"]}])
    assert choice(8, comm=dup)[0] == "ps"
    assert choice(100, comm=dup)[0] == "ps"
    assert choice(101, comm=dup)[0] == "native"
    assert choice(1 << 20, comm=dup)[0] == "ring"
    assert choice(1 << 20, "float64", comm=dup)[0] == "rd"  # a rule for the dtype wins over "*"
    assert path in choice(8, comm=dup)[1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_results_are_exact_whatever_it_picks(fresh, dtype):
    """Sizes on both sides of each rule's end, so every pick runs: ps, native, ring."""
    dup, directory = fresh
    itemsize = np.dtype(dtype).itemsize
    table(dup, directory, [{"dtype": "*", "upto_bytes": 64 * itemsize, "order": ["ps"]},
                           {"dtype": "*", "upto_bytes": 4096 * itemsize, "order": ["native"]},
                           {"dtype": "*", "upto_bytes": None, "order": ["ring"]}])
    failures = []
    for op in [op for op in algorithms.OPS if not (op == "avg" and not is_floating(dtype))]:
        for count in (0, 1, 64, 65, 4096, 4097, 50_001):
            x = rank_input(dtype, op, count, dup.rank, dup.size)
            expected = numpy_reference(dtype, op, count, dup.size)
            out = np.full_like(x, 99)
            algorithms.allreduce(x, out, op=op, algorithm="auto", comm=dup)
            inplace = x.copy()
            algorithms.allreduce(inplace, op=op, algorithm="auto", comm=dup)
            for what, got in (("out of place", out), ("in place", inplace)):
                if wrong_elements(got, expected):
                    failures.append(f"{op} n={count} {what} ({choice(x.nbytes, dtype, comm=dup)[0]})")
    assert not failures, f"rank {dup.rank}: " + "; ".join(failures)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_native_refuses_what_mpi_lacks_and_auto_never_picks_it_there(fresh, dtype):
    dup, directory = fresh
    x = rank_input(dtype, "sum", 10, dup.rank, dup.size)
    with pytest.raises(TypeError, match=r"^algorithm 'native' \(MPI_Allreduce\): .*(no bfloat16|no float8)"):
        algorithms.allreduce(x, op="sum", algorithm="native", comm=dup)
    table(dup, directory, [{"dtype": "*", "upto_bytes": None, "order": ["native", "rd"]}])
    assert choice(x.nbytes, dtype, comm=dup)[0] == "rd"
    assert wrong_elements(algorithms.allreduce(x, op="sum", algorithm="auto", comm=dup),
                          numpy_reference(dtype, "sum", 10, dup.size)) == 0


@pytest.mark.parametrize("dtype", [d for d in DTYPES if np.dtype(d) not in LOW_PRECISION])
def test_native_is_exact(comm, dtype):
    failures = []
    for op in [op for op in algorithms.OPS if not (op == "avg" and not is_floating(dtype))]:
        for count in (0, 1, 7, 1009):
            x = rank_input(dtype, op, count, comm.rank, comm.size)
            expected = numpy_reference(dtype, op, count, comm.size)
            out = algorithms.allreduce(x, np.full_like(x, 99), op=op, algorithm="native")
            same = x.copy()
            algorithms.allreduce(same, same, op=op, algorithm="native")
            if wrong_elements(out, expected) or wrong_elements(same, expected):
                failures.append(f"{op} n={count}")
    assert not failures, f"rank {comm.rank}: " + "; ".join(failures)


@pytest.mark.parametrize("op", ["max", "min"])
def test_nan_propagates_even_where_the_table_says_native(fresh, op):
    """MPI's MAX and MIN need not give NaN where one rank has it; auto then takes the next candidate."""
    dup, directory = fresh
    table(dup, directory, [{"dtype": "*", "upto_bytes": None, "order": ["native", "rd"]}])
    for dtype in ("float16", "float32", "float64"):
        x = rank_input(dtype, op, 3 * dup.size + 1, dup.rank, dup.size).astype(dtype)
        x[dup.rank::dup.size] = np.nan  # element i: NaN on rank i % size alone
        out = algorithms.allreduce(x, np.empty_like(x), op=op, algorithm="auto", comm=dup)
        assert np.isnan(out).all(), (dtype, out)
        assert choice(x.nbytes, dtype, comm=dup, op=op)[0] == "rd"
    assert choice(8, "int32", comm=dup, op=op)[0] == "native"  # integers have no NaN


def test_without_a_table_the_model_decides(fresh):
    dup, _ = fresh
    os.environ.pop("ALLREDUCE_TUNING_FILE", None)
    small, why = choice(8, comm=dup)
    assert "model" in why
    assert small in candidates() and small != "native"  # the model does not know native MPI's algorithm
    if dup.size > 1:
        assert small == ("oneshot" if single_node(dup) else "rd")
        # ring: 2(N-1)(alpha + M/(N beta)) against rd's (log2 p + 2[N > p])(alpha + M/beta), at 1 GiB
        p = 1 << (dup.size.bit_length() - 1)
        rd_steps = (p.bit_length() - 1) + 2 * (dup.size > p)
        ring_wins = 2 * (dup.size - 1) / dup.size < rd_steps
        assert choice(1 << 30, comm=dup)[0] in ({"ring"} if ring_wins else {"rd", "ring"})


def test_a_table_for_another_layout_is_not_used(fresh):
    dup, directory = fresh
    table(dup, directory, [{"dtype": "*", "upto_bytes": None, "order": ["ps"]}], ranks=dup.size + 1)
    name, why = choice(8, comm=dup)
    assert name != "ps" or dup.size == 1
    assert f"for {dup.size + 1} ranks" in why and "the model decides" in why


@pytest.mark.parametrize("content, words", [("not json", "Expecting value"),
                                            (json.dumps({"schema": "other"}), "not a tuning table"),
                                            (json.dumps({"schema": SCHEMA, "ranks": 1, "nodes": 1,
                                                         "rules": [{"order": ["warp"]}]}), "names warp")])
def test_a_bad_table_raises_on_every_rank(fresh, content, words):
    dup, directory = fresh
    path = os.path.join(directory, "bad.json")
    if dup.rank == 0:
        with open(path, "w") as f:
            f.write(content)
    dup.Barrier()
    os.environ["ALLREDUCE_TUNING_FILE"] = path
    with pytest.raises(ValueError, match=words) as raised:
        algorithms.allreduce(np.ones(4, np.float32), algorithm="auto", comm=dup)
    assert path in str(raised.value)
    assert dup.allreduce(1) == dup.size  # every rank raised and is still in step
