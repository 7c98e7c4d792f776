"""The probe, run for real under mpiexec, writes a valid matrix in O(N) rounds; the CLI prints trees."""

import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, run_mpi
from topology import BandwidthMatrix


@pytest.mark.parametrize("ranks,mode,rounds", [(3, "rounds", 3), (4, "rounds", 3), (4, "each", 6), (2, "rounds", 1)])
def test_probe_writes_a_valid_matrix(tmp_path, ranks, mode, rounds):
    out = tmp_path / "topo.json"
    proc = run_mpi(ranks, ["-m", "topology", "probe", "-o", str(out), "-b", "64K", "--reps", "3",
                           "--warmup", "1", "--mode", mode], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"probe: round {rounds}/{rounds} done" in proc.stderr
    matrix = BandwidthMatrix.load(out, ranks=ranks)
    off = ~np.eye(ranks, dtype=bool)
    assert (matrix.bandwidth[off] > 0).all() and (matrix.latency[off] > 0).all()
    assert np.array_equal(matrix.latency, matrix.latency.T)
    assert matrix.measured["rounds"] == rounds and matrix.measured["mode"] == mode
    assert matrix.measured["bytes"] == 65536 and matrix.measured["reps"] == 3
    assert matrix.measured["mpi"].startswith("MPICH") and len(matrix.hosts) == ranks


def test_probe_rejects_bad_options(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "topology", "probe", "-o", str(tmp_path / "x.json"),
                           "--reps", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--reps >= 1" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_tree_command(tmp_path):
    from topology import seed_example

    seed_example().save(tmp_path / "seed.json")
    proc = subprocess.run([sys.executable, "-m", "topology", "tree", str(tmp_path / "seed.json"),
                           "--method", "km"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "level 1: bottleneck 3.000 GB/s: 0->3 1->2" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "topology", "tree", str(tmp_path / "none.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "cannot read bandwidth matrix" in proc.stderr
