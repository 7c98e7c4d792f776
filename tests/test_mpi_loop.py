"""The ``mpi`` baseline timed in a compiled loop (bench/probes/mpi_loop.c) beside ``mpi4py``, the
same calls made through mpi4py: exact results for every collective, dtype, op and flag, the
very calls mpi4py makes (counted through MPI's profiling interface), one build per machine, and
one line where there is no compiler. Run for real, under mpiexec."""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys

import pytest
from conftest import ROOT, run_mpi

from topology import mpicc as compiled
from bench.baselines.mpi_loop import SOURCE

NO_COMPILER = "no C compiler: MPICC=/nonexistent is not an executable"


def bench(ranks, *args, cache, env=None, timeout=120):
    """``python -m bench ARGS`` with the compiled library kept under ``cache``."""
    return run_mpi(ranks, ["-m", "bench", "--log", "none", "--quiet", *args], timeout=timeout,
                   env={"XDG_CACHE_HOME": str(cache), **(env or {})})


def tables(text):
    """{algorithm: rows split into fields} of a run's output."""
    found, current = {}, None
    for line in text.splitlines():
        named = re.match(r"# Algorithm: (\S+)", line)
        if named:
            current = found.setdefault(named.group(1), [])
        elif current is not None and re.match(r"^\s*\d", line):
            current.append(line.split())
    return found


def built(cache):
    return sorted((cache / "allreduce-bench").iterdir()) if (cache / "allreduce-bench").exists() else []


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache folder of the module's own, the loop built in it once."""
    folder = tmp_path_factory.mktemp("cache")
    proc = bench(1, "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--algo", "mpi", cache=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_no_wrong_element_for_every_collective_dtype_and_op(cache, ranks, collective):
    """#wrong 0 in place and out of place, with a barrier after every iteration (-z 1), per-iteration
    times (-I 1) and two calls an iteration (-m 2): the check runs the compiled call itself. Every
    op on every dtype at 1 and 2 ranks; at 3 (more ranks than the cores of the machines the suite
    runs on: uneven shares for reduce-scatter) sum on float: which MPI op and datatype a call gets
    does not depend on the rank count."""
    every = ranks < 3
    op = "all" if every else "sum"
    proc = bench(ranks, "--collective", collective, "-b", "96", "-e", "96K", "-f", "1024", "-n", "3", "-w", "1",
                 "-d", "all" if every else "float", "-o", op, "-z", "1", "-I", "1", "-m", "2", "--rounds", "1",
                 "--algo", "mpi,mpi4py", cache=cache, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    found = tables(proc.stdout)
    assert list(found) == ["mpi", "mpi4py"]
    ops = 1 if collective == "allgather" or op == "sum" else 5
    for rows in found.values():  # 11 types with MPI datatypes (no bfloat16, fp8), avg on the 3 floating ones
        assert len(rows) == 2 * ((11 * ops - (8 if ops > 1 else 0)) if every else 1)
        assert all(len(r) == 21 and r[8] == "0" and r[16] == "0" for r in rows), rows
        assert {r[3] for r in rows} == ({"sum", "prod", "max", "min", "avg"} if ops > 1 else
                                        {"none"} if collective == "allgather" else {"sum"})
    assert proc.stdout.count("# mpi skips -d bfloat16: ") == (1 if every else 0)


def test_the_headers_and_the_summary_say_which_is_which(cache, tmp_path):
    document = tmp_path / "run.json"
    proc = bench(2, "-b", "1K", "-e", "64K", "-f", "64", "-n", "2", "-w", "1", "--rounds", "6",
                 "--algo", "ring,mpi,mpi4py", "-J", str(document), cache=cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.findall(r"# Transport: (.+)", proc.stdout)[1:] == [
        "the MPI library's own collective, timed in a compiled loop (avg: MPI_SUM calls, divided by the rank count "
        "once after them)",
        "the MPI library's own collective, called through mpi4py (avg: MPI_SUM, divided by the rank count after "
        "every call)"]
    summary = proc.stdout[proc.stdout.index("# Summary"):].splitlines()
    assert summary[0] == "# Summary: busbw (GB/s, out of place) of every algorithm per size, the median of 6 rounds"
    assert re.match(r"^#\s+size\s+ring\s+mpi\s+mpi4py$", summary[2]), summary
    assert any("its busbw over the runner-up's, mpi's and mpi4py's" in line for line in summary)
    header = next(i for i, line in enumerate(summary) if line.split()[1:4] == ["size", "fastest", "runner-up"])
    assert summary[header].split()[4:] == ["vs", "runner-up", "vs", "mpi", "vs", "mpi4py"]
    rows = json.loads(document.read_text())["results"]
    for line in summary[header + 1:header + 3]:
        size, fastest = line.lstrip("#").split()[:2]
        times = {r["algorithm"]: r["out_of_place"]["round_times_us"] for r in rows if r["size"] == int(size)}
        best = min(times, key=lambda name: statistics.median(times[name]))
        assert fastest in (best, "tie")
        cells = re.findall(r"(\S+)x \[(\S+), (\S+)\]", line)
        for (median, _, _), reference in zip(cells[1:], ("mpi", "mpi4py")):
            if reference == best:
                continue
            paired = statistics.median(a / b for a, b in zip(times[reference], times[best]))  # same round
            assert float(median) == pytest.approx(paired, rel=0.01), (line, reference)


@pytest.mark.parametrize("blocking", ["0", "1"])
def test_per_iteration_times_are_the_loops_own(cache, tmp_path, blocking):
    """-I 1 -m 3 -a 0: rank 0's time per call is the mean of its per-iteration times, which the
    compiled loop wrote (each iteration's time over its 3 calls)."""
    document = tmp_path / "run.json"
    proc = bench(2, "-b", "4K", "-e", "64K", "-f", "16", "-n", "5", "-w", "1", "-m", "3", "-a", "0", "-I", "1",
                 "-z", blocking, "--rounds", "1", "--algo", "mpi", "-J", str(document), cache=cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(document.read_text())["results"]
    assert len(results) == 2
    for result in results:
        for placement in ("out_of_place", "in_place"):
            rank0 = result[f"{placement}_per_iter"]["per_process_max_times_us"][0]
            assert len(rank0) == 5 and min(rank0) > 0
            assert statistics.mean(rank0) == pytest.approx(result[placement]["time"], rel=1e-6)


COUNTER = ROOT / "tests" / "data" / "count_calls.c"


def calls_made(stderr):
    """{(rank, collective, count): calls} that tests/data/count_calls.c wrote at MPI_Finalize."""
    found = {}
    for line in stderr.splitlines():
        if line.startswith("calls "):
            _, rank, name, count, calls = line.split()
            found[(int(rank), name, int(count))] = int(calls)
    return found


@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_the_compiled_loop_makes_the_calls_mpi4py_makes(cache, tmp_path, collective):
    """The library's own collective timed from C makes exactly the calls the same run makes
    through mpi4py, counted through MPI's profiling interface (a library preloaded into both
    runs, not the code under test): at each size, on each rank, the element count MPI is given
    (the whole vector for the all-reduce, one rank's chunk for the halves) called, per
    placement, once to agree, once a -c check, and in each round -w warm-ups and -n iterations of
    -m calls each. What it costs against the call made from Python is a benchmark's
    (results/mpi-c-harness.md), not a test's."""
    cc, missing = compiled.compiler()
    assert missing is None, missing
    counter = tmp_path / "count_calls.so"
    assert compiled.build(str(COUNTER), cc, str(counter)) is None
    ranks, sizes, iters, warmup, agg, rounds, checks = 2, (1 << 20, 4 << 20), 3, 1, 2, 2, 1
    expected = 2 * (1 + checks + rounds * (warmup + iters * agg))
    made = {}
    for algo in ("mpi", "mpi4py"):
        proc = bench(ranks, "--collective", collective, "-b", "1M", "-e", "4M", "-f", "4", "-n", str(iters),
                     "-w", str(warmup), "-m", str(agg), "--rounds", str(rounds), "-c", str(checks), "--algo", algo,
                     cache=cache, env={"LD_PRELOAD": str(counter)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        made[algo] = calls_made(proc.stderr)
    for nbytes in sizes:
        count = nbytes // 4 if collective == "allreduce" else nbytes // 4 // ranks
        for rank in range(ranks):
            key = (rank, collective, count)
            assert made["mpi"].get(key) == made["mpi4py"].get(key) == expected, (key, made)


def test_the_loop_is_built_once_per_machine_and_reused(tmp_path):
    """A compiler that counts its runs: three ranks, then a second run, build once."""
    counted = tmp_path / "runs"
    wrapper = tmp_path / "mpicc"
    real, missing = compiled.compiler()
    assert missing is None, missing
    wrapper.write_text(f"#!/bin/sh\necho run >> {counted}\nexec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    cache = tmp_path / "cache"
    stats = []
    for _ in range(2):
        proc = bench(3, "-b", "1K", "-e", "1K", "-n", "2", "-w", "1", "--algo", "mpi", cache=cache,
                     env={"MPICC": str(wrapper)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        files = built(cache)
        assert [f.suffix for f in files] == [".so"], files  # no temporary left behind
        stats.append((files[0].name, files[0].stat().st_ino, files[0].stat().st_mtime_ns))
    assert counted.read_text().splitlines() == ["run"]
    assert stats[0] == stats[1]


def test_without_a_compiler_mpi_skips_in_one_line_and_mpi4py_runs(tmp_path):
    env = {"MPICC": "/nonexistent"}
    proc = bench(2, "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "1", "--algo", "mpi,mpi4py",
                 cache=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line for line in proc.stdout.splitlines() if "skips" in line] == [f"# mpi skips: {NO_COMPILER}"]
    found = tables(proc.stdout)
    assert list(found) == ["mpi4py"] and len(found["mpi4py"]) == 2
    assert all(r[8] == "0" and r[12] == "0" for r in found["mpi4py"])
    assert built(tmp_path) == []
    alone = bench(2, "-b", "1K", "-e", "1K", "--algo", "mpi", cache=tmp_path, env=env)
    assert alone.returncode == 2 and alone.stderr.splitlines() == [f"python -m bench: --algo mpi: {NO_COMPILER}"]
    assert "# Algorithm" not in alone.stdout


def test_a_library_that_links_a_second_mpi_is_refused(tmp_path):
    """ldd against this process's memory map: a copy of libmpi elsewhere is a second MPI."""
    from mpi4py import MPI

    MPI.Get_library_version()
    loaded = compiled.loaded_libmpi()
    assert loaded and all(os.path.basename(p).startswith("libmpi") for p in loaded), loaded
    if shutil.which("ldd") is None:
        pytest.skip("no ldd here")
    real, missing = compiled.compiler()
    assert missing is None, missing
    own = tmp_path / "own.so"
    assert compiled.build(SOURCE, real, str(own)) is None
    assert compiled.second_mpi(str(own)) is None
    copy = tmp_path / "copy"
    copy.mkdir()
    original = sorted(loaded)[0]
    shutil.copy(original, copy / os.path.basename(original))
    if os.path.basename(original) != "libmpi.so":
        (copy / "libmpi.so").symlink_to(os.path.basename(original))
    other = tmp_path / "other.so"
    done = subprocess.run([real, *compiled.FLAGS, f"-L{copy}", f"-Wl,-rpath,{copy}", "-o", str(other), SOURCE],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    problem = compiled.second_mpi(str(other))
    assert problem is not None and str(copy / os.path.basename(original)) in problem and original in problem


def test_a_failed_build_says_why_in_one_line(tmp_path):
    broken = tmp_path / "broken.c"
    broken.write_text("int mpi_loop(void) { return }\n")
    real, missing = compiled.compiler()
    assert missing is None, missing
    problem = compiled.build(str(broken), real, str(tmp_path / "out" / "broken.so"))
    assert problem.startswith(f"{real} could not build {broken} (exit 1): ") and "error" in problem
    assert os.listdir(tmp_path / "out") == []


def test_time_calls_runs_warm_up_and_iterations_through_a_loop():
    """The loop gets the warm-up alone, then the iterations with -m, -z and -I as given; the
    times are per call. The call itself is never made."""
    from mpi4py import MPI

    from bench.core.timing import time_calls

    asked = []

    def loop(iters, agg, blocking, per_iteration):
        asked.append((iters, agg, blocking, per_iteration))
        return 0.5 * iters * agg, 0.25 * iters * agg

    marker = object()
    seconds, host = time_calls(MPI.COMM_SELF, lambda: pytest.fail("called"), 4, 3, True, marker, None, 2, loop)
    assert asked == [(3, 1, False, None), (4, 2, True, marker)]
    assert (seconds, host) == (0.5, 0.25)
    asked.clear()
    time_calls(MPI.COMM_SELF, lambda: pytest.fail("called"), 2, 0, loop=loop)
    assert asked == [(2, 1, False, None)]


def test_the_help_says_what_each_baseline_is():
    proc = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    text = " ".join(proc.stdout.split())
    assert "mpi (the MPI library's own MPI_Allreduce, timed in a loop compiled from C" in text
    assert "mpi4py (the same MPI calls made through mpi4py" in text
    assert "divided by the rank count once after" in text and "divided by the rank count after every call" in text
