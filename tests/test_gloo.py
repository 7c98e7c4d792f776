"""The gloo baseline (PyTorch's torch.distributed all-reduce, reduce-scatter and all-gather over
gloo) in the driver, under a real mpiexec: exact on every dtype and op it takes, in and out of
place, on 2 and 3 ranks; what it cannot do is refused with a clear message before anything runs."""

import json

import pytest
from conftest import run_mpi

from algorithms.dtypes import TYPES
from bench.baselines.gloo import dtypes, problem

needs_torch = pytest.mark.skipif(problem() is not None, reason=problem() or "")


@needs_torch
@pytest.mark.parametrize("ranks", [2, 3])
def test_gloo_is_exact_beside_ours(tmp_path, ranks):
    document = tmp_path / "run.json"
    proc = run_mpi(ranks, ["-m", "bench", "-b", "8", "-e", "256K", "-f", "32", "-n", "2", "-w", "1",
                           "--algo", "gloo,ring", "-o", "all", "-d", "float32",
                           "-J", str(document), "--log", "none"], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# Algorithm: gloo" in proc.stdout and "gloo backend (TCP)" in proc.stdout
    rows = [r for r in json.loads(document.read_text())["results"] if r["algorithm"] == "gloo"]
    assert {r["redop"] for r in rows} == {"sum", "prod", "max", "min", "avg"}
    assert rows and all(r["out_of_place"]["nwrong"] == 0 and r["in_place"]["nwrong"] == 0 for r in rows)


@needs_torch
def test_gloo_on_every_dtype_it_takes(tmp_path):
    """One sweep of every dtype (-d all): a table of each type gloo takes, exact, and one line for
    each it does not."""
    proc = run_mpi(2, ["-m", "bench", "-b", "1K", "-e", "64K", "-f", "64", "-n", "1", "-w", "1",
                       "--algo", "gloo", "-d", "all", "-c", "1", "--log", "none", "--quiet"], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# Out of bounds values : 0 OK" in proc.stdout and "#wrong" in proc.stdout
    table = [line.split() for line in proc.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert table and all(row[8] == "0" and row[-1] == "0" for row in table), proc.stdout
    names = {t.name: t.nccl for t in TYPES}
    assert {row[2] for row in table} == {names[d] for d in dtypes()}
    skipped = [d for d in names if d not in dtypes()]
    assert skipped and all(f"# gloo skips -d {names[d]}: gloo has no {d} all-reduce" in proc.stdout for d in skipped)


@needs_torch
@pytest.mark.parametrize("ranks", [2, 3])
def test_gloo_halves_are_exact_beside_ours(tmp_path, ranks):
    """gloo's reduce_scatter_tensor (every op) and all_gather_single, in and out of place."""
    for collective, ops in (("reducescatter", "all"), ("allgather", "sum")):
        document = tmp_path / f"{collective}.json"
        proc = run_mpi(ranks, ["-m", "bench", "-b", "96", "-e", "384K", "-f", "64", "-n", "2", "-w", "1",
                               "--collective", collective, "--algo", "gloo,ring", "-o", ops, "-d", "float32",
                               "-J", str(document), "--log", "none"], timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = [r for r in json.loads(document.read_text())["results"] if r["algorithm"] == "gloo"]
        assert len({r["size"] for r in rows}) == 3, rows
        assert all(r["out_of_place"]["nwrong"] == 0 and r["in_place"]["nwrong"] == 0 for r in rows)
        if collective == "reducescatter":
            assert {r["redop"] for r in rows} == {"sum", "prod", "max", "min", "avg"}


@pytest.mark.parametrize("flags,message", [
    (["--algo", "gloo", "-d", "uint16"], "--algo gloo: gloo has no uint16 all-reduce; it takes int8"),
])
def test_what_gloo_cannot_do_is_refused(flags, message):
    proc = run_mpi(2, ["-m", "bench", "-b", "8", "-e", "8", *flags, "--log", "none"], timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr

