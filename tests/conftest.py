"""Helpers for launching the multi-rank suites under the venv's real mpiexec."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The mpich wheel's UCX netmod now and then fails MPI_Init on one rank with "failed to unpack
# address, invalid bandwidth 0.00" (pmodels/mpich#7417, seen here under srun), leaving the other
# ranks waiting. On one machine all traffic goes through shared memory whichever netmod is
# loaded, so the tests load OFI; a value set by the caller wins.
os.environ.setdefault("MPIR_CVAR_CH4_NETMOD", "ofi")

# Most multi-rank tests run more ranks than the machine has cores (3, 5, 8 on 2). There MPICH's
# progress loop spins on the cores the ranks with work to do are waiting for; told to sleep a
# microsecond after 10 polls in a row that find nothing (MPICH's own throttle, meant for many
# ranks a node), it lets them run: 3 ranks' sweep of every op 2.6x faster here, and one of every
# dtype with the compiled MPI loop 4x. It changes when MPI polls, not what any call computes;
# these tests check results, the benchmarks in results/ measure speed.
os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT", "10")

# The sweeps under test check what they compute, not how fast: 2 rounds of each size, not the
# default 10, unless a test passes --rounds (those that test the rounds and intervals do; the
# commands of the README and docs/ that tests/test_docs.py runs take it too).
os.environ.setdefault("BENCH_ROUNDS", "2")


def mpiexec():
    """The mpiexec beside this Python (the ``mpich`` wheel's Hydra), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        pytest.fail("no mpiexec: install the package (pip install -e .[test]) into this Python's venv")
    return found


#: OFI's tcp provider on the loopback: OFI otherwise takes the first interface it finds, and
#: interfaces that come and go on the machine (the lab's veths) failed MPI_Init and MPI_Finalize.
LOOPBACK = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo"}


def cliques(k):
    """MPICH's cliques: Split_type(SHARED) makes K blocks of consecutive ranks, nodes on one
    machine, whose messages go through the netmod (on the loopback)."""
    return {"MPIR_CVAR_NUM_CLIQUES": str(k), "MPIR_CVAR_CLIQUES_BY_BLOCK": "1", **LOOPBACK}


def run_mpi(ranks, args, timeout, env=None):
    """Run ``python ARGS`` on ``ranks`` ranks; a hang becomes a failure after ``timeout`` s."""
    command = [mpiexec(), "-n", str(ranks), sys.executable, *args]
    full_env = {**os.environ, **(env or {})}
    try:
        return subprocess.run(command, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-4000:]
        pytest.fail(f"{' '.join(command)} did not finish in {timeout} s (deadlock?)\n{out!r}")
