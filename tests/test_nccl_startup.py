"""The NCCL baseline's start-up and calls, what a CPU can check of them: every rank judges
together whether NCCL can run (one message on every rank, never rank 0 alone while the others
wait: bench.baselines.nccl.judge), one GPU per rank told by PCI bus ids, not by each rank's
count of GPUs, NCCL's own in-place layout, and the types NCCL lacks named instead of aborting a
sweep. The calls themselves need NCCL and GPUs: tests/mpi/test_gpu.py."""

import importlib.util
import json

import numpy as np
import pytest
from conftest import run_mpi

from bench.baselines.nccl import NcclBaseline, in_place_chunk, local_facts

NO_NCCL = "--algo nccl: CuPy cannot load NCCL's library"


def judged(cases, ranks=3):
    """{case: [each rank's raised message or None]} of tests/scripts/nccl_judge.py."""
    proc = run_mpi(ranks, ["tests/scripts/nccl_judge.py", json.dumps(cases)], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_every_rank_ends_with_one_message_when_any_rank_cannot_run_nccl():
    """One rank without NCCL's library (CuPy imports its module all the same), one GPU per rank
    where each rank sees only its own (the same count of one GPU each, different bus ids), and two
    ranks of the node on one GPU: every rank raises, or none does, with the same words."""
    found = judged({
        "rank 1 has no libnccl": [[None, "0000:01:00.0"], [NO_NCCL, None], [None, "0000:21:00.0"]],
        "one GPU each, each seeing one": [[None, "0000:01:00.0"], [None, "0000:21:00.0"], [None, "0000:41:00.0"]],
        "ranks 0 and 2 on one GPU": [[None, "0000:01:00.0"], [None, "0000:21:00.0"], [None, "0000:01:00.0"]],
    })
    assert found["rank 1 has no libnccl"] == [NO_NCCL] * 3
    assert found["one GPU each, each seeing one"] == [None] * 3
    assert found["ranks 0 and 2 on one GPU"] == [
        "--algo nccl needs one GPU per rank: ranks 0, 2 drive the GPU at PCI 0000:01:00.0 (NCCL refuses two ranks "
        "of one communicator on one GPU)"] * 3


def test_a_rank_without_cupy_has_a_problem_not_an_exception():
    """Without CuPy the facts are a problem in words, for judge to share, not an exception."""
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the facts depend on its GPU")
    problem, bus = local_facts()
    assert problem.startswith("--algo nccl needs CuPy with NCCL and a GPU: ModuleNotFoundError") and bus is None


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_in_place_chunks_are_where_nccl_puts_them(rank):
    """NCCL's in place: ``recvbuff == sendbuff + rank * recvcount`` (reduce-scatter's result,
    all-gather's input), rank r's chunk, not the first on every rank as MPI's reduce-scatter has it."""
    whole = np.arange(12)
    chunk = in_place_chunk(whole, rank, 4)
    assert np.shares_memory(chunk, whole) and chunk.tolist() == list(range(4 * rank, 4 * rank + 4))
    assert chunk.__array_interface__["data"][0] == whole.__array_interface__["data"][0] + rank * 4 * whole.itemsize


def test_types_nccl_lacks_are_named_so_that_a_sweep_skips_them():
    """int16 and uint16 (and fp8) are not NCCL types: lacks() says so, and the sweep skips that
    type with the reason, as for the other baselines; bfloat16 is one (NCCL_BFLOAT16)."""
    import ml_dtypes

    nccl = NcclBaseline()
    for name in ("int16", "uint16"):
        assert nccl.lacks("nccl", np.dtype(name)) == (
            f"NCCL has no {name} type; it reduces int8, uint8, int32, uint32, int64, uint64, float16, float32, "
            "float64, bfloat16")
    assert nccl.lacks("nccl", np.dtype(ml_dtypes.float8_e4m3fn)).startswith("NCCL has no float8_e4m3fn type")
    assert all(nccl.lacks("nccl", np.dtype(t)) is None
               for t in ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
                         ml_dtypes.bfloat16))
