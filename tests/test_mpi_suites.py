"""Launch the multi-rank suites in tests/mpi under a real mpiexec, at several rank counts
(non-powers of two included; more ranks than cores is fine for correctness)."""

import re

import pytest

from conftest import run_mpi

RANK_COUNTS = [1, 2, 3, 4, 5, 8]


def run_suite(ranks, path, timeout, env=None):
    args = ["-m", "mpi4py", "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
            "-o", "addopts=", "-W", "error::pytest.PytestUnraisableExceptionWarning", path]
    proc = run_mpi(ranks, args, timeout, env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{ranks} ranks: exit {proc.returncode}\n{output[-6000:]}"
    summaries = re.findall(r"^(\d+ passed.*) in [\d.]+s", output, re.M)
    assert len(summaries) == ranks, f"expected a pytest summary from each of {ranks} ranks\n{output[-3000:]}"
    for summary in summaries:
        assert not re.search(r"failed|error", summary), summary


@pytest.mark.parametrize("ranks", RANK_COUNTS)
def test_correctness_suite(ranks):
    run_suite(ranks, "tests/mpi/test_correctness.py", timeout=300)


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_bad_input_suite(ranks):
    run_suite(ranks, "tests/mpi/test_bad_input.py", timeout=120)


def test_staged_transport_suite():
    """The staged (host-copy) transport that CuPy uses without CUDA-aware MPI, exercised on NumPy."""
    run_suite(3, "tests/mpi/test_correctness.py", timeout=300, env={"ALLREDUCE_TRANSPORT": "staged"})
