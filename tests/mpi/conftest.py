"""Shared pieces for the tests that run on every rank under mpiexec (pytest --with-mpi)."""

import functools
import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import algorithms
from algorithms.ops import LOW_PRECISION
from bench.baselines.gloo import GlooBaseline
from topology import random_heterogeneous


@pytest.fixture
def comm():
    return MPI.COMM_WORLD


@pytest.fixture(scope="module")
def gloo_process_group():
    """A gloo process group over every rank for a module's tests (DDP and FSDP need one), made as
    the gloo baseline makes it and destroyed after them."""
    gloo = GlooBaseline()
    gloo.start(MPI.COMM_WORLD)
    yield
    gloo.close()


def rank_input(dtype, op, count, rank, size, salt=0):
    """Rank ``rank``'s input (see :func:`_input`), a fresh writable copy of one kept read-only:
    every algorithm of a dtype reduces the same inputs, and building a long one again for each
    was most of the one-rank suite's time."""
    return _kept_input(np.dtype(dtype), op, count, rank, size, salt).copy()


@functools.lru_cache(maxsize=96)
def _kept_input(dtype, op, count, rank, size, salt):
    """:func:`_input`, read-only and kept: 96 cases, every op and count of one dtype and salt."""
    kept = _input(dtype, op, count, rank, size, salt)
    kept.flags.writeable = False
    return kept


def _input(dtype, op, count, rank, size, salt=0):
    """Rank ``rank``'s input: small integers whose reduction is exact in every dtype, in any order.

    sum/avg: values in [-4, 4] (unsigned: [0, 8]), so 8 ranks stay within int8/uint8; in
    bfloat16 and fp8, values in [-1, 1], so every partial sum of 8 ranks is an integer in
    [-8, 8], which float8_e5m2, the narrowest, holds.
    prod: +-1, times 2 on one rank per element, so the product is +-1 or +-2.
    max/min: values spread over [-100, 100] (unsigned [0, 200]; in fp8 rounded to the type,
    which keeps their order).
    """
    dtype = np.dtype(dtype)
    i = np.arange(count, dtype=np.int64)
    signed = dtype.kind != "u"
    if op in ("sum", "avg") and dtype in LOW_PRECISION:
        v = (i * 7 + rank * 13 + salt) % 3 - 1
    elif op in ("sum", "avg"):
        v = (i * 7 + rank * 13 + salt) % 9 - (4 if signed else 0)
    elif op == "prod":
        v = np.where((i + rank + salt) % 3 == 0, -1 if signed else 1, 1)
        v = v * np.where(i % size == rank, 2, 1)
    else:
        v = (i * 31 + rank * 17 + salt) % 201 - (100 if signed else 0)
    return v.astype(dtype)


@functools.lru_cache(maxsize=64)
def numpy_reference(dtype, op, count, size, salt=0):
    """The exact reduction computed by NumPy from every rank's input, rank order; read-only,
    and kept for the next algorithm checked against it (building it takes N inputs, which at
    8 ranks on 2 cores was most of the correctness suite's time). 64 cases: every op and
    count of one dtype. bfloat16 and fp8: reduced in float64, then rounded to the type once
    (exact: the inputs' partial results are all in the type); avg: that sum divided by N,
    rounded once to the type, avg's definition (algorithms.ops)."""
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    if np.dtype(dtype) in LOW_PRECISION:
        wide = functools.reduce(lambda a, b: ufunc(a, b), (_input(dtype, op, count, r, size, salt).astype(np.float64)
                                                           for r in range(size)))
        result = wide.astype(dtype)
        if op == "avg":  # the quotient rounded once to the type (float64 rounds it innocuously)
            result = (result.astype(np.float64) / size).astype(dtype)
        result.flags.writeable = False
        return result
    result = _input(dtype, op, count, 0, size, salt)
    for r in range(1, size):
        ufunc(result, _input(dtype, op, count, r, size, salt), out=result)
    if op == "avg":
        np.divide(result, size, out=result)
    result.flags.writeable = False
    return result


def native_reference(comm, sendbuf, op):
    """``comm.Allreduce`` (the MPI library's own), with avg as sum / size."""
    mpi_op = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
    out = np.empty_like(sendbuf)
    comm.Allreduce(sendbuf, out, op=mpi_op)
    if op == "avg":
        np.divide(out, comm.size, out=out)
    return out


def wrong_elements(result, expected):
    """Elements that differ bit for bit."""
    if result.dtype != expected.dtype or result.shape != expected.shape:
        return max(result.size, expected.size) or 1
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[result.dtype.itemsize]
    return int(np.count_nonzero(result.view(width) != expected.view(width)))


LARGE_COUNT = 1_000_003  # about a million, a prime: several segments and uneven chunks


def counts_for(size, large=True):
    """0, 1, N-1, N, N+1, a prime, and (when ``large``) :data:`LARGE_COUNT`."""
    return sorted({0, 1, max(size - 1, 0), size, size + 1, 1009, *([LARGE_COUNT] if large else [])})


def options(algorithm, size):
    """Extra keyword arguments an algorithm needs or takes: a bandwidth matrix for the matched
    trees, bamring and dring (random and heterogeneous, so their trees differ from the binomial
    one and the rings' order from the ranks'; dring in the ranks' order: tests/mpi/test_dring.py)."""
    declared = algorithms.ALGORITHMS.get(algorithm)
    if declared is not None and (declared.wants_bandwidth() or declared.accepts_bandwidth):
        return {"bandwidth": random_heterogeneous(size, seed=size).bandwidth}
    return {}


def pytest_sessionfinish(session, exitstatus):
    """Each rank leaves its own verdict in $MPI_SUITE_REPORT_DIR for the launching test,
    since the ranks' terminal output interleaves."""
    folder = os.environ.get("MPI_SUITE_REPORT_DIR")
    if not folder:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = reporter.stats if reporter else {}
    report = {
        "rank": MPI.COMM_WORLD.Get_rank(),
        "exitstatus": int(exitstatus),
        **{key: len(stats.get(key, [])) for key in ("passed", "failed", "error", "skipped")},
    }
    with open(os.path.join(folder, f"rank{report['rank']}.json"), "w") as f:
        json.dump(report, f)
