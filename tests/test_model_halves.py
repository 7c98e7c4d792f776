"""``python -m bench model --collective reducescatter|allgather``: the halves' table against their
closed forms on uniform links, busbw with nccl-tests' (N-1)/N, their own lower bound, measured
rows of a real run beside the model, and a results file of another collective refused."""

import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT, run_mpi

N, ALPHA, BETA = 4, 10e-6, 1e9  # --ranks 4 --alpha-us 10 --beta-GBps 1: s and B/s
MIB = 1 << 20


def tool(*args):
    return subprocess.run([sys.executable, "-m", "bench", "model", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def rows_of(text):
    """{(size cell, algorithm): cells} of the table, and its header; comments left out."""
    header, *rows = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()
                     if line.strip() and line[0] != "#"]
    return header, {(row[0], row[1]): dict(zip(header, row)) for row in rows}


@pytest.fixture(scope="module")
def reduce_scatter_run(tmp_path_factory):
    """A real 2-rank ``-J`` document of the ring's and native MPI's reduce-scatter of 1 MiB."""
    path = tmp_path_factory.mktemp("halves") / "reducescatter.json"
    proc = run_mpi(2, ["-m", "bench", "--collective", "reducescatter", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1",
                       "--algo", "ring,mpi", "--log", "none", "-J", str(path)], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return path


def test_ring_reduce_scatter_on_uniform_links_is_its_closed_form_with_half_busbw():
    proc = tool("--collective", "reducescatter", "--ranks", N, "--alpha-us", 10, "--beta-GBps", 1,
                "-b", "1M", "-e", "16M", "-f", "16")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# alpha-beta model of the reduce-scatter on 4 ranks, uniform links")
    header, rows = rows_of(proc.stdout)
    assert header == ["size", "algorithm", "model us", "model GB/s", "limited by", "x bound"]
    for cell, m in (("1 MiB", MIB), ("16 MiB", 16 * MIB)):
        ring = rows[(cell, "ring")]
        seconds = (N - 1) * (ALPHA + m / (N * BETA))  # (N-1)(alpha + M/(N beta)), M the whole vector
        assert float(ring["model us"]) == pytest.approx(seconds * 1e6, rel=0.006)
        assert float(ring["model GB/s"]) == pytest.approx(m / seconds * (N - 1) / N / 1e9, rel=0.006)
        assert ring["limited by"] == "link"
    # each rank sends (N-1)/N M of its input at beta, plus one alpha: the ring is within 1% of it at 16 MiB
    bound = (N - 1) / N * 16 * MIB / BETA + ALPHA
    assert re.search(rf"# reduce-scatter lower bound at 16 MiB: {bound * 1e6:.0f} us, traffic: rank \d's sending",
                     proc.stdout), proc.stdout
    assert rows[("16 MiB", "ring")]["x bound"] == f"{(N - 1) * (ALPHA + 16 * MIB / (N * BETA)) / bound:.2f}x"


def test_the_halves_schedules_are_listed_per_collective():
    from algorithms.costs import SCHEDULES_OF
    from bench.tools.model import schedules_text

    for collective, half in (("reducescatter", "reduce_scatter"), ("allgather", "all_gather")):
        text = schedules_text(collective)
        listed = [line.split()[0] for line in text.splitlines()[1:] if line.startswith("  ") and line[2] != " "]
        assert listed == list(SCHEDULES_OF[half]), text
        assert "(N-1)(alpha + M/(N beta))" in " ".join(text.split())  # the ring's closed form
    assert "With --collective reducescatter or allgather, --help lists" in schedules_text()


def test_measured_reduce_scatter_beside_the_model(reduce_scatter_run):
    document = json.loads(reduce_scatter_run.read_text())
    measured = {r["algorithm"]: r["out_of_place"] for r in document["results"]}
    proc = tool("--collective", "reducescatter", "--ranks", 2, "--alpha-us", 10, "--beta-GBps", 1,
                "-b", "1M", "-e", "1M", "--results", reduce_scatter_run)
    assert proc.returncode == 0, proc.stderr
    header, rows = rows_of(proc.stdout)
    assert header[6:] == ["measured us", "measured GB/s", "model/meas.", "x bound", "vs mpi"]
    ring, mpi = rows[("1 MiB", "ring")], rows[("1 MiB", "mpi")]
    assert float(ring["measured us"]) == pytest.approx(measured["ring"]["time"], rel=0.006)
    assert float(ring["measured GB/s"]) == pytest.approx(measured["ring"]["bus_bw"], rel=0.006)
    seconds = ALPHA + MIB / (2 * BETA)  # (N-1)(alpha + M/(N beta)) on 2 ranks
    assert float(ring["model us"]) == pytest.approx(seconds * 1e6, rel=0.006)
    assert float(ring["model/meas."][:-1]) == pytest.approx(seconds * 1e6 / measured["ring"]["time"], rel=0.006)
    assert float(ring["vs mpi"][:-1]) == pytest.approx(measured["ring"]["bus_bw"] / measured["mpi"]["bus_bw"],
                                                       rel=0.006)
    assert mpi["model us"] == "-" and float(mpi["measured us"]) == pytest.approx(measured["mpi"]["time"], rel=0.006)


def test_a_results_file_of_another_collective_is_refused_with_the_one_it_holds(reduce_scatter_run):
    proc = tool("--collective", "allgather", "--ranks", 2, "--results", reduce_scatter_run)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (f"python -m bench model: --results {reduce_scatter_run}: no all-gather rows, only "
                                   "rows of --collective reducescatter; give --collective reducescatter to set them "
                                   "beside the model")
