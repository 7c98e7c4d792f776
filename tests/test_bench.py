"""The benchmark driver and its tools, run for real (under mpiexec where it takes ranks)."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, mpiexec, run_mpi

import algorithms
from algorithms.settings import size_text

REFERENCE = ROOT / "tests" / "data" / "nccl-tests"  # copies of shared/reference/nccl-tests


def superbench_parse(text):
    """A SuperBench-style nccl-tests parser: per table, the line with 'out-of-place', the header
    naming size/time/algbw/busbw, numeric rows mapped by those names, the 'Out of bounds' line."""
    tables, current, names = [], None, None
    for line in text.splitlines():
        if "out-of-place" in line:
            current, names = {"rows": []}, None
            tables.append(current)
        elif current is not None and names is None and re.search(r"\bsize\b.*\bbusbw\b", line):
            names = line.lstrip("#").split()
        elif current is not None and names and not line.startswith("#") and line.strip():
            values = line.split()
            half = (len(names) - 5) // 2  # columns per placement after size count type redop root
            row = dict(zip(names[:5], values[:5]))
            row["oop"] = dict(zip(names[5:5 + half], map(float, values[5:5 + half])))
            row["ip"] = dict(zip(names[5 + half:], map(float, values[5 + half:])))
            current["rows"].append(row)
        elif current is not None and line.startswith("# Out of bounds values"):
            current["oob"] = int(line.split(":")[1].split()[0])
        elif current is not None and line.startswith("# Avg bus bandwidth"):
            current["avg"] = float(line.split(":")[1])
    return tables


def algorithms_in(text):
    return re.findall(r"# Algorithm: (\S+)", text)


def bench(ranks, *args, tmp_path, timeout=180):
    log = tmp_path / "log.jsonl"
    return run_mpi(ranks, ["-m", "bench", "--log", str(log), *args], timeout=timeout), log


def test_sweep_every_algorithm_read_by_a_superbench_style_parser(tmp_path):
    out = tmp_path / "run.json"
    proc, log = bench(2, "-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "-o", "all",
                      "-d", "int32", "--algo", "all", "-J", str(out), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert algorithms_in(proc.stdout) == ["ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier", "oneshot", "twoshot", "mpi", "mpi4py"]
    assert "# Topology: probed 2 ranks in 1 rounds" in proc.stdout  # no --topology: probe first
    transports = re.findall(r"# Transport: (.+)", proc.stdout)
    assert transports == [transports[0]] * 13 + [
        "the MPI library's own collective, timed in a compiled loop (avg: MPI_SUM calls, divided by the rank count "
        "once after them)",
        "the MPI library's own collective, called through mpi4py (avg: MPI_SUM, divided by the rank count after "
        "every call)"]
    assert transports[0].startswith("shared-memory within a node; MPI between nodes")
    assert len(list(tmp_path.glob("probe-*-2r.json"))) == 1
    tables = superbench_parse(proc.stdout)
    assert len(tables) == 15
    for table in tables:
        assert table["oob"] == 0 and len(table["rows"]) == 5 * 4  # 5 sizes x 4 ops (no avg for ints)
        busbw = [r["oop"]["busbw"] for r in table["rows"]] + [r["ip"]["busbw"] for r in table["rows"]]
        assert table["avg"] == pytest.approx(sum(busbw) / len(busbw), abs=0.01)
        for r in table["rows"]:
            assert int(r["size"]) == 4 * int(r["count"]) and r["type"] == "int32" and r["root"] == "-1"
            assert r["oop"]["#wrong"] == 0 and r["ip"]["#wrong"] == 0 and r["oop"]["time"] > 0
    document = json.loads(out.read_text())
    assert len(document["results"]) == 300 and document["out_of_bounds"] == {"count": 0, "okay": "true"}
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 300 and {l["algorithm"] for l in lines} == {"ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier", "oneshot", "twoshot", "mpi", "mpi4py"}
    assert all(l["malloc"] == "glibc defaults" for l in lines)
    assert all(l["ranks"] == 2 and l["mpi"].startswith("MPICH") and l["commit"] for l in lines)


def test_per_iteration_json_has_what_analyze_perf_json_reads(tmp_path):
    """The keys and invariants nccl-tests' tools/analyze_perf_json.py relies on."""
    out = tmp_path / "iters.json"
    proc, _ = bench(2, "-b", "1K", "-e", "64K", "-f", "8", "-n", "6", "-w", "1", "-I", "1", "-K", "2",
                    "--rounds", "2", "--algo", "ring,mpi", "-J", str(out), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [l for l in proc.stdout.splitlines() if l and not l.startswith("#")]
    assert rows and all(len(l.split()) == 21 for l in rows)  # 5 + 2 x (4 + i_min i_max i_p99 i_cv%)
    doc = json.loads(out.read_text())
    assert doc["version"] == 3 and doc["config"]["iterations"] == 6
    assert doc["config"]["aggregated_iterations"] == 1 and doc["config"]["per_iter_skip"] == 2
    assert doc["config"]["per_iter_timing"] == "true" and len(doc["config"]["devices"]) == 2
    assert {"hostname", "rank", "pid"} <= set(doc["config"]["devices"][0])
    for r in doc["results"]:
        for key in ("out_of_place_per_iter", "in_place_per_iter"):
            it = r[key]  # every iteration of both rounds, in the order run
            assert it["skipped_iterations"] == 2 and len(it["times_us"]) == 6 * 2
            rows_ = it["per_process_max_times_us"]
            assert len(rows_) == 2 and all(len(x) == 6 * 2 for x in rows_)
            assert it["times_us"] == pytest.approx([max(a, b) for a, b in zip(*rows_)])
            kept = sorted(it["times_us"][2:])
            assert it["min_us"] == pytest.approx(kept[0]) and it["max_us"] == pytest.approx(kept[-1])
            assert it["avg_us"] == pytest.approx(np.mean(kept))
            assert it["cv_pct"] == pytest.approx(np.std(kept) / np.mean(kept) * 100)
            for k in ("p50_us", "p95_us", "p99_us", "stdev_us"):
                assert isinstance(it[k], float)
        if r["algorithm"] == "ring":  # a round's time: the mean over ranks (-a 1) of each rank's mean in that round
            for placement in ("out_of_place", "in_place"):
                per_process = r[f"{placement}_per_iter"]["per_process_max_times_us"]
                expected = [np.mean([np.mean(p[i * 6:(i + 1) * 6]) for p in per_process]) for i in range(2)]
                assert r[placement]["round_times_us"] == pytest.approx(expected, rel=1e-6)


def _middle(values):
    """The median, worked out here: the middle value, or the mean of the middle two."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


# the 95% interval of a median by order statistics, worked out by hand for these round counts:
# 3 rounds: no rank reaches 95%, so the whole range, which holds the median with 1 - 2/2^3;
# 10 rounds: [x_(2), x_(9)] with 1 - 2 (1 + 10)/2^10 ([x_(3), x_(8)] holds it with only 89%)
INTERVAL_RANKS = {3: (0, 2, 0.75), 10: (1, 8, 0.9785)}


@pytest.mark.parametrize("ranks,rounds", [(1, 3), (2, 10), (3, 3)])
def test_rounds_interleave_and_every_row_carries_them(tmp_path, ranks, rounds):
    """--rounds R --algo ring,tree: every row (the log and -J alike) holds R round times per
    placement, its time their median and time_ci its interval (order statistics, worked out
    here), busbw from that median; the two took turns, each first in alternate rounds; each
    table prints whole, its rows' times the medians."""
    from bench.formats.report import time_text

    out = tmp_path / "run.json"
    proc, log = bench(ranks, "-b", "1K", "-e", "8K", "-f", "8", "-n", "2", "-w", "1", "--rounds", str(rounds),
                      "--algo", "ring,tree", "-J", str(out), "--quiet", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["results"]
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["size"], r["algorithm"]) for r in rows] == [(1024, "ring"), (1024, "tree"), (8192, "ring"),
                                                            (8192, "tree")]
    assert [{k: r[k] for k in rows[0]} for r in logged] == rows  # the log's rows are -J's
    low, high, coverage = INTERVAL_RANKS[rounds]
    factor = 2 * (ranks - 1) / ranks
    for r in rows:
        assert r["rounds"] == rounds
        first = [0, 1] * rounds if r["algorithm"] == "ring" else [1, 0] * rounds
        assert r["round_positions"] == first[:rounds]  # ring, tree; tree, ring; ...
        for placement in ("out_of_place", "in_place"):
            cell = r[placement]
            times = cell["round_times_us"]
            assert len(times) == rounds and all(t > 0 for t in times)
            ordered = sorted(times)
            assert cell["time"] == pytest.approx(_middle(times))
            assert cell["time_ci"] == {"median": pytest.approx(_middle(times)), "ci_low": pytest.approx(ordered[low]),
                                       "ci_high": pytest.approx(ordered[high]), "rounds": rounds,
                                       "coverage": coverage}
            assert cell["alg_bw"] == pytest.approx(r["size"] / cell["time"] * 1e-3)
            assert cell["bus_bw"] == pytest.approx(cell["alg_bw"] * factor)
            assert cell["nwrong"] == 0
    tables = superbench_parse(proc.stdout)
    assert algorithms_in(proc.stdout) == ["ring", "tree"] and len(tables) == 2
    for table, name in zip(tables, ("ring", "tree")):
        mine = [r for r in rows if r["algorithm"] == name]
        assert [int(t["size"]) for t in table["rows"]] == [r["size"] for r in mine]
        for printed, r in zip(table["rows"], mine):
            assert printed["oop"]["time"] == float(time_text(r["out_of_place"]["time"]))
            assert printed["ip"]["time"] == float(time_text(r["in_place"]["time"]))


def _rows(rounds, size=65536):
    """Hand-made rows of one size, as the sweep saves them: {algorithm: [us per round]}."""
    rows = []
    for name, times in rounds.items():
        median = _middle(times)
        rows.append({"type": "float", "redop": "sum", "size": size, "algorithm": name, "cycle": 1,
                     "out_of_place": {"time": median, "bus_bw": size / median * 1e-3,
                                      "time_ci": {"median": median}, "round_times_us": times}})
    return rows


def test_summary_calls_a_pair_within_noise_a_tie():
    from bench.formats import summary

    drift = [10.0, 14.0, 9.0, 12.0, 20.0, 11.0, 10.5, 13.0, 9.5, 16.0]  # the machine's, shared by both
    ring = drift
    rd = [t * f for t, f in zip(drift, (1.02, 0.98, 1.01, 1.03, 1.04, 0.97, 1.00, 1.02, 0.99, 1.01))]
    mpi = [t * 1.5 for t in drift]
    [entry] = summary.by_size(_rows({"ring": ring, "rd": rd, "mpi": mpi}))
    # medians: ring (11 + 12) / 2 = 11.5, rd (10.67 + 12.36) / 2 = 11.515; rd / ring per round, sorted:
    # 0.97 0.98 0.99 1.00 1.01 1.01 1.02 1.02 1.03 1.04: median 1.01, [x_(2), x_(9)] = [0.98, 1.03], holding 1
    assert (entry["fastest"], entry["ties"], entry["runner_up"]) == ("ring", ["ring", "rd"], "rd")
    assert entry["fastest_vs_runner_up"] == {"median": pytest.approx(1.01), "ci_low": pytest.approx(0.98),
                                             "ci_high": pytest.approx(1.03), "rounds": 10, "coverage": 0.9785}
    assert entry["fastest_vs_mpi"]["median"] == pytest.approx(1.5)
    text = summary.text([entry])
    assert all(line.startswith("#") and len(line) <= 120 for line in text.splitlines())
    verdict = next(line for line in text.splitlines() if line.startswith("#      65536") and "x [" in line)
    assert verdict.split()[1:3] == ["65536", "tie"]  # no winner named
    assert re.search(r" 1\.01x \[0\.980, 1\.03\] tie +1\.50x \[1\.50, 1\.50\]$", verdict), verdict
    tied = [line for line in text.splitlines() if line.startswith("#      65536  ")]
    assert tied and set(tied[-1].split(None, 2)[2].split(", ")) == {"ring", "rd"}


def test_summary_names_a_clear_winner_with_its_interval():
    from bench.formats import summary

    drift = [10.0, 14.0, 9.0, 12.0, 20.0, 11.0, 10.5, 13.0, 9.5, 16.0]
    twoshot = [t / 2 for t in drift]  # twice as fast in every round however the machine drifts
    ring = [t * f for t, f in zip(drift, (1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98, 1.0, 1.01))]
    [entry] = summary.by_size(_rows({"ring": ring, "twoshot": twoshot, "mpi": [t * 4 for t in drift]}))
    assert (entry["fastest"], entry["ties"], entry["runner_up"]) == ("twoshot", ["twoshot"], "ring")
    # ring / twoshot per round: 2 x (1.0 1.1 0.9 1.05 0.95 1.0 1.02 0.98 1.0 1.01), sorted: 1.8 1.9 1.96 2.0 2.0
    # 2.0 2.02 2.02 2.1 2.2: median 2.0, [x_(2), x_(9)] = [1.9, 2.1]
    assert entry["fastest_vs_runner_up"] == {"median": pytest.approx(2.0), "ci_low": pytest.approx(1.9),
                                             "ci_high": pytest.approx(2.1), "rounds": 10, "coverage": 0.9785}
    assert entry["fastest_vs_mpi"]["median"] == pytest.approx(8.0) and entry["fastest_vs_mpi4py"] is None
    assert entry["time_us"]["twoshot"] == pytest.approx(_middle(twoshot))
    assert entry["busbw"]["twoshot"] == pytest.approx(65536 / _middle(twoshot) * 1e-3)
    lines = summary.text([entry]).splitlines()
    verdict = next(line for line in lines if line.startswith("#      65536") and "x [" in line)
    assert verdict.split()[1:6] == ["65536", "twoshot", "ring", "2.00x", "[1.90,"]
    assert "2.10]" in verdict and " tie" not in verdict and "8.00x [8.00, 8.00]" in verdict
    assert not any("within noise" in line for line in lines)  # no ties to name


def test_summary_pairs_rounds_of_the_same_cycle_and_fits_15_algorithms():
    """-N: round i of cycle c pairs with round i of cycle c; 15 algorithms fit 120 columns."""
    from bench.formats import summary

    rows = []
    for cycle, drift in ((1, 1.0), (2, 10.0)):  # the second cycle ten times slower for every algorithm
        for row in _rows({"ring": [drift * 1.0] * 6, "rd": [drift * 2.0] * 6}):
            rows.append({**row, "cycle": cycle})
    [entry] = summary.by_size(rows)
    assert entry["rounds"] == 12 and entry["fastest_vs_runner_up"]["ci_low"] == pytest.approx(2.0)
    assert entry["fastest_vs_runner_up"]["ci_high"] == pytest.approx(2.0)  # paired: no spread from the drift
    names = [f"algorithm{i}" for i in range(15)]
    many = summary.by_size(_rows({name: [1.0 + i / 10] * 6 for i, name in enumerate(names)}))
    lines = summary.text(many).splitlines()
    assert all(line.startswith("#") and len(line) <= 120 for line in lines)
    shown = [name for line in lines if line.startswith("#       size") and "fastest" not in line
             for name in line.split()[2:]]
    assert shown == [name[:8] for name in names]


@pytest.mark.parametrize("collective", ["reducescatter", "allgather"])
def test_reduce_scatter_and_all_gather_sweeps(tmp_path, collective):
    proc, _ = bench(3, "--collective", collective, "-b", "96", "-e", "96K", "-f", "32", "-n", "2",
                    "-w", "1", "-o", "all", "-d", "float64", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    halves = {"reducescatter": ["ring", "bamring", "dring", "rabenseifner", "hier", "twoshot"],
              "allgather": ["ring", "bamring", "dring", "rd", "rabenseifner", "hier", "twoshot"]}[collective]
    assert algorithms_in(proc.stdout) == [*halves, "mpi", "mpi4py"]
    for table in superbench_parse(proc.stdout):
        assert table["oob"] == 0
        for r in table["rows"]:
            assert int(r["size"]) == 8 * 3 * int(r["count"])  # count is per rank, size the whole vector
            assert r["oop"]["#wrong"] == 0 and r["ip"]["#wrong"] == 0


def nccl_tests_size(nbytes, itemsize, ranks, collective):
    """(size moved, count printed) as nccl-tests' GetCollByteCount takes a size (src/all_reduce.cu,
    src/reduce_scatter.cu, src/all_gather.cu): whole elements; for the halves each rank's
    ``base = (count/nranks) & -(16/eltSize)``, the whole vector ``base * nranks``."""
    count = nbytes // itemsize
    if collective == "allreduce":
        return count * itemsize, count
    base = (count // ranks) & -(16 // itemsize)
    return base * ranks * itemsize, base


@pytest.mark.parametrize("ranks,collective", [(3, "reducescatter"), (5, "allgather"), (6, "reducescatter"),
                                              (8, "allgather"), (3, "allreduce")])
def test_every_size_taken_and_rounded_as_nccl_tests_rounds_it(tmp_path, ranks, collective):
    """nccl-tests' everyday sizes (8 B up, doubling) at any rank count, of every type: none
    refused; each row moves and prints the size nccl-tests would (0 where a rank's chunk rounds
    to nothing), and its elements are right (6, 8 ranks: oversubscribed, a functional check)."""
    from algorithms.dtypes import BY_NAME
    asked = [6, 48, 384]
    proc, _ = bench(ranks, "--collective", collective, "-b", "6", "-e", "384", "-f", "8", "-n", "1", "-w", "0",
                    "--rounds", "1", "-d", "all", "--algo", "ring,mpi", tmp_path=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tables = superbench_parse(proc.stdout)
    assert len(tables) == 2
    for table in tables:
        assert table["oob"] == 0
        types = list(dict.fromkeys(r["type"] for r in table["rows"]))
        assert len(types) >= 10, types  # every type the algorithm takes (mpi: not bfloat16)
        for t in types:
            rows = [r for r in table["rows"] if r["type"] == t]
            expected = [nccl_tests_size(n, BY_NAME[t].dtype.itemsize, ranks, collective) for n in asked]
            assert [(int(r["size"]), int(r["count"])) for r in rows] == expected, (t, collective, ranks)
            assert all(r["oop"]["#wrong"] == 0 and r["ip"]["#wrong"] == 0 for r in rows)


def test_matched_trees_from_a_probe(tmp_path):
    """probe -> bandwidth file -> bench --topology runs bamtree and kmtree with zero wrong."""
    topo = tmp_path / "topo.json"
    proc = run_mpi(3, ["-m", "topology", "probe", "-o", str(topo), "-b", "64K", "--reps", "2"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc, _ = bench(3, "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "--algo", "all",
                    "--topology", str(topo), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert algorithms_in(proc.stdout) == ["ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier", "oneshot", "twoshot", "mpi", "mpi4py"]
    assert all(t["oob"] == 0 and len(t["rows"]) == 3 for t in superbench_parse(proc.stdout))


@pytest.mark.parametrize("flags", [["-a", "0"], ["-a", "2"], ["-a", "3", "-z", "1"]])
def test_aggregation_and_blocking_modes(tmp_path, flags):
    proc, _ = bench(2, "-b", "1K", "-e", "1K", "-n", "3", "-w", "1", "--algo", "ring", *flags, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {"0": "rank 0", "2": "min", "3": "max"}[flags[1]] in proc.stdout
    if "-z" in flags:
        assert "# Blocking Enabled" in proc.stdout


def test_timeout_aborts_a_size_that_runs_too_long(tmp_path):
    # 10^6 iterations of 8 MiB take minutes on any machine: only the watchdog can end this in time.
    proc, log = bench(2, "-b", "8M", "-e", "8M", "-n", "1000000", "-w", "0", "--algo", "ps", "-T", "0.2",
                      tmp_path=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "timeout: ps float32 sum 8388608 B ran over 0.2 s (-T)" in proc.stderr


def test_a_killed_run_leaves_every_finished_size_readable(tmp_path):
    log = tmp_path / "log.jsonl"
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "bench", "--log", str(log), "-b", "1K", "-e", "1G",
               "-f", "2", "-n", "20", "-w", "1", "--algo", "ring", "--quiet"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not log.exists() or log.read_text().count("\n") < 3):
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) >= 3
    assert [r["size"] for r in rows[:3]] == [1024, 2048, 4096]
    assert all(r["out_of_place"]["nwrong"] == 0 for r in rows)


@pytest.mark.parametrize("collective,algos", [("allreduce", "ring,tree,ps,rd,mpi"), ("allgather", "ring,mpi")])
def test_registered_buffers_with_R(tmp_path, collective, algos):
    """-R 1: every algorithm (and MPI's own) on registered vectors, in and out of place, no wrong
    element, sizes on both sides of the slot and the 256 KiB MPI threshold; the header says so."""
    proc, _ = bench(3, "-R", "1", "--collective", collective, "-b", "96K", "-e", "768K", "-f", "8", "-n", "2",
                    "-w", "1", "-c", "1", "-d", "int32", "--rounds", "1", "--algo", algos, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert algorithms_in(proc.stdout) == algos.split(",")
    assert proc.stdout.count("# Buffers: registered (algorithms.alloc_registered; -R 1)") == len(algos.split(","))
    for table in superbench_parse(proc.stdout):
        assert table["oob"] == 0 and len(table["rows"]) == 2
        for r in table["rows"]:
            assert r["oop"]["#wrong"] == 0 and r["ip"]["#wrong"] == 0


BAD = [
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["-b", "12Q"], "argument -b/--minbytes: not a size: '12Q' (use e.g. 8, 64K, 128M, 1G)"),
    (["-b", "1M", "-e", "1K"], "max bytes 1024 is below min bytes 1048576"),
    (["--algo", "ring,butterfly"], "unknown --algo butterfly for allreduce; choices: ps,ring,bamring,dring,tree,bamtree,kmtree,dbtree,rd,rabenseifner,hier,oneshot,twoshot,native,auto,mpi,"
     "mpi:recursive_doubling,mpi:recursive_multiplying,mpi:reduce_scatter_allgather,mpi:tree,mpi:recexch,mpi:ring,"
     "mpi:k_reduce_scatter_allgather,mpi4py,nccl,nccl:ALGO/PROTO,gloo,all"),
    (["--algo", "nccl"], "--algo nccl needs --device gpu"),
    (["--device", "gpu", "--algo", "mpi"], "--device gpu: no GPU to run on, rank 0"),  # before CUDA-awareness
    (["--collective", "allgather", "--algo", "tree"], "unknown --algo tree for allgather; choices: ring,bamring,dring,rd,rabenseifner,hier,twoshot,auto,mpi,"
     "mpi4py,nccl,nccl:ALGO/PROTO,gloo,all"),
    (["-I", "1", "-K", "20"], "-K 20 skips every one of the 20 iterations"),
    (["-R", "2"], "-R 2 does not apply here: 2 is NCCL's symmetric registration"),
    (["-R", "1", "--device", "gpu"], "-R 1 needs --device cpu: registered vectors are host memory"),
]


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_arguments_give_one_clear_line(argv, message):
    proc = subprocess.run([sys.executable, "-m", "bench", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_gpu_without_a_gpu_says_so(tmp_path):
    proc, _ = bench(2, "--device", "gpu", "-b", "1K", "-e", "1K", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "--device gpu: no GPU to run on, rank 0:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_compare_reads_vendor_logs_of_both_formats_and_ours(tmp_path):
    ours = tmp_path / "ours.json"
    proc, _ = bench(2, "-b", "32", "-e", "8K", "-f", "16", "-n", "2", "-w", "1", "--algo", "ring,mpi",
                    "-J", str(ours), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text_output = tmp_path / "text.txt"
    text_output.write_text(proc.stdout)
    new_format = tmp_path / "new.log"  # nccl-tests' current layout: root and #wrong columns
    new_format.write_text("#       size         count      type   redop    root     time   algbw   busbw  #wrong"
                          "     time   algbw   busbw  #wrong\n"
                          "          32             8     float     sum      -1    10.00    0.00    9.50       0"
                          "    10.00    0.00    9.00       0\n# Out of bounds values : 0 OK\n")
    proc = subprocess.run([sys.executable, "-m", "bench", "compare",
                           str(REFERENCE / "superbench_8xA100_allreduce.log"), str(new_format), str(ours),
                           str(text_output)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [re.split(r"\s{2,}", l.strip()) for l in proc.stdout.splitlines() if l.strip() and l[0] != "#"]
    assert rows[0][-1] == "vs superbench_8xA100_allreduce"  # the first vendor log is the reference
    # the same algorithm in two files is labelled with each file's name
    assert list(dict.fromkeys(r[1] for r in rows[1:])) == \
        ["superbench_8xA100_allreduce", "new", "ring (ours)", "mpi (ours)", "ring (text)", "mpi (text)"]
    row32 = {r[1]: r for r in rows if r[0] == "32 B"}
    # the vendor log's and the new-format log's busbw; the reference's 0.00 divides nothing
    assert row32["superbench_8xA100_allreduce"][2] == "0" and row32["new"][2:] == ["9.50", "10.0", "-"]
    for log in REFERENCE.glob("*.log"):
        proc = subprocess.run([sys.executable, "-m", "bench", "compare", str(log)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "\n  8 GiB  " in proc.stdout, (log, proc.stderr)


def test_compare_unreadable_log(tmp_path):
    junk = tmp_path / "junk.log"
    junk.write_text("hello\n")
    for path, message in ((tmp_path / "missing.log", "cannot read"), (junk, "no nccl-tests table found")):
        proc = subprocess.run([sys.executable, "-m", "bench", "compare", str(path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.splitlines()) == 1


def test_model_reproduces_the_seed_and_reads_a_probe(tmp_path):
    from algorithms.costs import cost_model
    from algorithms.runtime.layout import SEGMENT_BYTES
    from bench.tools.model import ring_worked_example
    from topology import seed_example, uniform

    volume, bandwidth_term, latency_term = ring_worked_example()
    assert volume == pytest.approx(24.5e9) and bandwidth_term == pytest.approx(0.06125)
    assert latency_term == pytest.approx(0.14e-3)
    model = cost_model(uniform(8, 400, 10))
    assert model.time("ring", 14e9) == pytest.approx(0.06125 + 0.14e-3)
    segments = math.ceil(14e9 / SEGMENT_BYTES)  # workers stream at once, the root answers one by one
    # the 7 workers' streams share the root's port: 7 M / beta, then 7 answers one after another
    assert model.time("ps", 14e9) == pytest.approx(segments * 10e-6 + 7 * 14e9 / 400e9 + 7 * (10e-6 + 14e9 / 400e9))
    # the pipelined trees, step by step, are checked against a reference schedule in tests/test_model.py
    assert model.time("rd", 14e9) == pytest.approx(3 * (10e-6 + 14e9 / 400e9))
    # two trees on 2 ranks, S segments of s = M/2/S each: step 0 carries the two uploads (one
    # each way), step S the two downloads, and the S - 1 steps between a segment of each tree
    # each way (two messages on each direction of the link)
    half = math.ceil(7e9 / SEGMENT_BYTES)
    s = 7e9 / half
    assert cost_model(uniform(2, 400, 10)).time("dbtree", 14e9) == pytest.approx(
        2 * (10e-6 + s / 400e9) + (half - 1) * 2 * (10e-6 + s / 400e9))
    assert cost_model(uniform(6, 400, 10)).time("rd", 1e6) == pytest.approx((2 + 2) * (10e-6 + 1e6 / 400e9))
    seed = cost_model(seed_example())
    assert seed.time("bamtree", 1e9) < seed.time("kmtree", 1e9)  # BAM's slowest link 4 beats KM's 3
    cross = model.crossover("ring", "tree")
    assert cross is not None
    assert model.time("ring", cross) <= model.time("tree", cross) and model.time("ring", cross // 2) > model.time("tree", cross // 2)
    path = tmp_path / "seed.json"
    seed_example().save(path)
    proc = subprocess.run([sys.executable, "-m", "bench", "model", "--topology", str(path), "-b", "1M", "-e", "16M"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ring overtakes the binomial tree" in proc.stdout or "never overtakes" in proc.stdout
    assert "# bamtree: 2 levels, bottlenecks (GB/s) 10.00, 4.00" in proc.stdout
    assert "# kmtree: 2 levels, bottlenecks (GB/s) 10.00, 3.00" in proc.stdout


def test_plot_writes_a_png(tmp_path):
    png = tmp_path / "busbw.png"
    proc = subprocess.run([sys.executable, "-m", "bench", "plot", str(REFERENCE / "superbench_8xA100_allreduce.log"),
                           "-o", str(png)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000


def test_scaling_reproduces_the_seed():
    proc = subprocess.run([sys.executable, "-m", "bench", "scaling", "--params", "7e9", "--dtype", "float16",
                           "--compute-time", "0.3", "--ranks", "8,64", "--beta-GBps", "400", "--algo", "ring"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ring8 = next(l.split() for l in proc.stdout.splitlines() if l.split()[:2] == ["ring", "8"])
    assert float(ring8[2]) == pytest.approx(0.0614, abs=0.001) and ring8[4] == "83.0%"
    pcie = subprocess.run([sys.executable, "-m", "bench", "scaling", "--params", "7e9", "--compute-time", "0.3",
                           "--ranks", "8", "--beta-GBps", "20", "--algo", "ring"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    ring8 = next(l.split() for l in pcie.stdout.splitlines() if l.split()[:2] == ["ring", "8"])
    assert float(ring8[2]) == pytest.approx(1.2, abs=0.03) and float(ring8[4].rstrip("%")) == pytest.approx(20, abs=0.5)


def test_bucketed_overlap_hides_all_but_the_last_bucket():
    from bench.tools.scaling import exposed_time

    assert exposed_time(0.01, 10, 1.0) == pytest.approx(0.01)  # each bucket fits behind the next
    assert exposed_time(0.2, 10, 1.0) == pytest.approx(10 * 0.2 + 0.1 - 1.0)  # communication-bound


def own_median(values):
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def own_interval(values):
    """(median, low, high, coverage): the order statistics x_(k), x_(n+1-k) of the largest k whose
    coverage 1 - 2 P(Binomial(n, 1/2) <= k-1) reaches 95%, else the whole range (worked out here)."""
    ordered, n = sorted(values), len(values)
    coverage = lambda k: 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    k = max([k for k in range(1, (n + 1) // 2 + 1) if coverage(k) >= 0.95] or [1])
    return own_median(values), ordered[k - 1], ordered[n - k], coverage(k) if n > 1 else 0.0


def assert_interval(written, values):
    """``written`` ({"median", "ci_low", "ci_high", "rounds", "coverage"}) is the interval of ``values``."""
    median, low, high, coverage = own_interval(values)
    assert (written["median"], written["ci_low"], written["ci_high"]) == pytest.approx((median, low, high), rel=1e-9)
    assert (written["rounds"], written["coverage"]) == (len(values), pytest.approx(coverage, abs=1e-4))


def own_verdict(interval, bound, above=True):
    _, low, high, _ = interval
    if low <= bound <= high:
        return "tie (within noise)"
    return "met" if (low > bound) == above else "missed"


def test_perf_benchmark_writes_every_target(tmp_path):
    """``python -m bench.perf`` on small sizes (8 B always): one row per size with every candidate timed, each
    target judged (sizes it did not run are judged not met), and the Markdown table."""
    out = tmp_path / "perf"
    proc = run_mpi(2, ["-m", "bench.perf", "-b", "32K", "-e", "64K", "--repeats", "1", "--runs", "3", "-o", str(out)],
                   timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr  # e.g. a vector summed into itself overflowing
    data = json.loads((tmp_path / "perf.json").read_text(),
                      parse_constant=lambda name: pytest.fail(f"perf.json holds {name}, which is not JSON"))
    assert [r["bytes"] for r in data["rows"]] == [8, 32768, 65536]
    for row in data["rows"]:
        for name in ("native", "mpi", "ring", "dring", "tree", "dbtree", "ps", "rd", "rabenseifner", "oneshot", "twoshot", "auto",
                     "ring_checked", "ring_reg", "tree_reg", "dbtree_reg", "twoshot_reg", "ring_reg_inplace", "native_4kpages",
                     "ring_4kpages"):
            assert row[f"{name}_s"] > 0, (name, row)
        assert row["copy_GBps"] > 0 and row["copy_all_ranks_GBps"] > 0
        assert row["auto_ran"] in algorithms.auto.candidates()
        assert row["small_pages_huge_share"] in (0.0, None) and 0 <= (row["plain_huge_share"] or 0) <= 1
    assert data["rows"][0]["sendrecv_s"] > 0 and all("sendrecv_s" not in row for row in data["rows"][1:])
    assert len(data["runs"]) == 3 and data["rounds_per_sweep"] == 1
    for i, row in enumerate(data["rows"]):  # every time: the median and interval of all the sweeps' rounds
        assert set(row["rounds_s"]) == set(row["times_us"]) and "rounds_s" not in data["runs"][0]["rows"][i]
        for name, rounds in row["rounds_s"].items():
            assert len(rounds) == 3, name
            assert_interval(row["times_us"][name], [t * 1e6 for t in rounds])
            for j, run in enumerate(data["runs"]):  # each sweep's row: its own round
                assert_interval(run["rows"][i]["times_us"][name], [rounds[j] * 1e6])
            if name.startswith("copy"):
                assert row[f"{name}_GBps"] == pytest.approx(row["bytes"] / own_median(rounds) / 1e9, rel=1e-12)
            else:
                assert row[f"{name}_s"] == pytest.approx(own_median(rounds), rel=1e-12), name
    targets = {t["target"]: t for t in data["targets"]}
    assert len(targets) == 22  # the per-call cost: of a call and of a persistent one
    small = {r["bytes"]: [c / a for c, a in zip(r["rounds_s"]["mpi"], r["rounds_s"]["auto"])]
             for r in data["rows"] if r["bytes"] <= 4096}  # auto against the library in C, round by round: 8 B here
    found = targets["auto busbw >= 1.0x the MPI library timed in C, 8 B..4 KiB"]
    assert list(small) == [8] and found["at_bytes"] == 8 and found["worst"] == round(own_median(small[8]), 3)
    assert found["verdict"] == own_verdict(own_interval(small[8]), 1.0)
    for name in ("twoshot busbw >= 1.0x ring on registered vectors, 1..256 MiB",
                 "ring busbw >= 1.0x the MPI library timed in C, 256 KiB..256 MiB",
                 "ring busbw >= 1.0x native through mpi4py, 256 KiB..256 MiB"):  # no size in range
        assert (targets[name]["verdict"], targets[name]["holds"], targets[name]["interval"]) == ("size not run", False, None)
    eight = data["rows"][0]["rounds_s"]
    for algo, exchanges in (("rd", 1), ("ring", 2)):  # the cost over the bare exchanges, round by round, worked out here
        cost = [(a - exchanges * b) * 1e6 for a, b in zip(eight[algo], eight["sendrecv"])]
        found = [t for name, t in targets.items() if name.startswith(f"{algo}'s Python cost over its {exchanges}")]
        assert len(found) == 1 and found[0]["worst"] == round(own_median(cost), 3), (found, cost)
        assert_interval(found[0]["interval"], cost)
        assert found[0]["verdict"] == own_verdict(own_interval(cost), float(found[0]["target"].split()[-2]), above=False)
        persistent = [(a - exchanges * b) * 1e6 for a, b in zip(eight[f"{algo}_persistent"], eight["sendrecv"])]
        assert_interval(data["persistent_cost_us"][algo], persistent)
    rounds = data["per_call_rounds_s"]  # over the engine's own run of the plan, round by round
    assert_interval(data["per_call_overhead_us"], [(a - b) * 1e6 for a, b in zip(rounds["ours"], rounds["engine"])])
    assert_interval(data["persistent_overhead_us"], [(a - b) * 1e6 for a, b in zip(rounds["persistent"], rounds["engine"])])
    # ring over native at each size of the range: busbw ratio = native's time over the ring's, round by round
    ratios = {row["bytes"]: [n / r for n, r in zip(row["rounds_s"]["native"], row["rounds_s"]["ring"])]
              for row in data["rows"] if 32768 <= row["bytes"] <= 262144}
    verdicts = {size: own_verdict(own_interval(values), 0.9) for size, values in ratios.items()}
    target = targets["ring busbw >= 0.9x native through mpi4py, 32 KiB..256 KiB"]
    order = ["missed", "tie (within noise)", "met"]
    deciding = min(ratios, key=lambda s: (order.index(verdicts[s]), own_median(ratios[s])))
    assert (target["worst"], target["at_bytes"], target["verdict"]) == \
        (round(own_median(ratios[deciding]), 3), deciding, min(verdicts.values(), key=order.index))
    assert_interval(target["interval"], ratios[deciding])
    assert target["holds"] is (target["verdict"] == "met")
    for i, run in enumerate(data["runs"]):  # each sweep judged on its own rounds
        alone = {t["target"]: t for t in run["targets"]}["ring busbw >= 0.9x native through mpi4py, 32 KiB..256 KiB"]
        own = {size: values[i:i + 1] for size, values in ratios.items()}
        assert alone["worst"] == round(own_median(own[alone["at_bytes"]]), 3)
    assert set(data["steady_state_python_bytes"]) == {*(a for a in algorithms.auto.candidates() if a != "native"), "auto"}
    text = (tmp_path / "perf.md").read_text()
    assert ("| target | measured (the deciding size: median [95% interval]) | at bytes | verdict | sweep 1 | sweep 2 "
            "| sweep 3 |") in text and "| 65536 |" in text
    assert ("| ring busbw >= 1.0x native through mpi4py, 256 KiB..256 MiB | size not run |  | size not run "
            "| size not run | size not run | size not run |") in text
    for few in ("1 round the interval is the whole range, which holds the median 0%",
                "3 rounds the interval is the whole range, which holds the median 75%"):
        assert few in text
    assert "native: `MPI_Allreduce` called through mpi4py" in text
    # the library both ways, and ours over each, at every size: the ratios worked out here from the JSON
    cell = r"([\d.]+) \[([\d.]+), ([\d.]+)\]"  # a time: median [95% interval]
    table = {int(m[0]): m[1:] for m in re.findall(rf"^\| (\d+) \| {cell} \| {cell} \| ([\d.]+) \| (\w+) \| "
                                                  r"([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", text, re.M)}
    assert sorted(table) == [8, 32768, 65536]
    for row in data["rows"]:
        *c, py_median, py_low, py_high, _, best, best_over_c, ring_over_c, _ = table[row["bytes"]]
        shown = own_interval([t * 1e6 for t in row["rounds_s"]["mpi"]])
        assert [float(v) for v in c] == pytest.approx([shown[0], shown[1], shown[2]], abs=0.06)
        assert float(py_median) == pytest.approx(row["native_s"] * 1e6, abs=0.06)
        ours = [*(a for a in algorithms.auto.candidates() if a != "native"), "auto"]
        assert best == min(ours, key=lambda a: row[f"{a}_s"])
        assert float(ring_over_c) == pytest.approx(row["mpi_s"] / row["ring_s"], abs=0.006)
    assert f"Page backing (transparent huge pages: {data['machine']['transparent_hugepages']};" in text
    assert re.search(r"^\| 65536 \| (\d+%|unknown) / (0%|unknown) \|", text, re.M)


def synthetic_perf(ring_over_native):
    """A perf document of one size, 64 KiB, whose ring busbw is ``ring_over_native[i]`` times
    native's in round i; every other figure fixed."""
    rounds = len(ring_over_native)
    native = [1e-4 * (1 + i % 3) for i in range(rounds)]  # drifting between rounds, as a shared machine does
    return {"ranks": 2, "rows": [{"bytes": 65536, "rounds_s": {
        "native": native, "ring": [t / r for t, r in zip(native, ring_over_native)], "auto": native}}],
        "per_call_rounds_s": {"bare": [1e-6] * 6, "engine": [1e-6] * 6, "ours": [1.5e-6] * 6, "persistent": [1.2e-6] * 6},
        "steady_state_python_bytes": {"ring": {"retained": 0, "transient_peak": 100}},
        "peak_memory": {"peak_bytes": 1, "budget_bytes": 2, "vector_bytes": 1}}


@pytest.mark.parametrize("ratios, verdict", [
    ([1.2, 1.1, 1.3, 1.15, 1.25, 1.2, 1.1], "met"),  # ring at least 0.9x native in every round
    ([0.5, 0.6, 0.55, 0.5, 0.7, 0.6, 0.65], "missed"),
    ([0.85, 0.95, 0.88, 0.93, 0.9, 0.92, 0.87], "tie (within noise)"),  # on both sides of 0.9
])
def test_perf_target_verdicts_on_synthetic_ratios(ratios, verdict):
    from bench.tools.perf import targets

    found = {t["target"]: t for t in targets(synthetic_perf(ratios))}
    target = found["ring busbw >= 0.9x native through mpi4py, 32 KiB..256 KiB"]
    assert (target["verdict"], target["holds"], target["at_bytes"]) == (verdict, verdict == "met", 65536)
    assert_interval(target["interval"], ratios)
    assert found["a call's cost over the engine's run of its plan <= 0.3 us"]["verdict"] == "missed"  # 0.5 us a round
    assert found["a persistent call's cost over the engine's run of its plan <= 0.3 us"]["verdict"] == "met"  # 0.2 us
    assert found["auto busbw >= 1.0x native through mpi4py, 8 B..256 MiB"]["verdict"] == "tie (within noise)"  # 1.0x
    assert found["ring busbw >= 1.0x native through mpi4py, 256 KiB..256 MiB"]["verdict"] == "size not run"


def test_perf_judges_a_range_by_its_worst_verdict():
    """A size missed decides over one that ties with a lower median; ties over met; the bound's side matters."""
    from bench.formats.stats import Interval
    from bench.tools.perf import judge, worst_check

    tie, miss, met = Interval(0.7, 0.5, 1.2, 7, 0.98), Interval(0.8, 0.75, 0.85, 7, 0.98), Interval(1.5, 1.2, 1.6, 7, 0.98)
    assert [judge(i, 0.9) for i in (tie, miss, met)] == ["tie (within noise)", "missed", "met"]
    assert [judge(i, 0.9, above=False) for i in (tie, miss, met)] == ["tie (within noise)", "met", "missed"]
    assert worst_check("t", {1: tie, 2: miss, 3: met}, 0.9)["at_bytes"] == 2
    assert worst_check("t", {1: tie, 3: met}, 0.9)["verdict"] == "tie (within noise)"
    assert worst_check("t", {3: met}, 0.9) == {"target": "t", "worst": 1.5, "at_bytes": 3, "interval": met.as_dict(),
                                              "verdict": "met", "holds": True}



LEAKY_CALLS = """
kept = []
def leaks(x, y, **_):
    kept.append(bytes(100))
def cycles(x, y, **_):
    loop = []
    loop.append(loop)  # garbage that only the cycle collector frees
def neither(x, y, **_):
    y[...] = x
"""


@pytest.mark.parametrize("call, retained", [("leaks", True), ("cycles", False), ("neither", False)])
def test_steady_state_counts_what_a_call_keeps_not_what_the_collector_frees(monkeypatch, call, retained):
    """A call that keeps 100 bytes each time shows in every window; one that leaves cyclic
    garbage or a free list behind does not (a full collection runs before each count). The calls
    are compiled under the ``algorithms`` package's path, which is what the count is filtered to."""
    from mpi4py import MPI

    from bench.tools.perf import steady_state_allocation

    space = {}
    exec(compile(LEAKY_CALLS, os.path.join(os.path.dirname(algorithms.__file__), "leaky.py"), "exec"), space)
    monkeypatch.setattr(algorithms, "allreduce", lambda x, y, algorithm, comm, check: space[algorithm](x, y))
    found = steady_state_allocation(MPI.COMM_SELF, call, 1024)
    assert (found["retained"] >= 50 * 100) == retained and (found["retained"] == 0) == (not retained), found


def test_gpu_check_script_installs_its_wheels_offline_and_runs_on_numpy_buffers(tmp_path):
    """bench/gpu_check.sh as on a GPU machine with no mpiexec and no network, on NumPy buffers
    (DEVICE=cpu): the mpich and mpi4py wheels that bench/gpu_wheels.sh fetches, installed from that
    folder offline, then every part within its share of the time limit, merged into .json/.md:
    every algorithm checked on every transport, swept beside its bound, NCCL's refusal said."""
    wheels = tmp_path / "wheels"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    fetch = subprocess.run(["bash", "bench/gpu_wheels.sh", str(wheels)], cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable, "PYTHON_VERSION": version}, timeout=300)
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    bare = tmp_path / "bin"  # a python with no mpiexec beside it, and none on PATH
    bare.mkdir()
    (bare / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bare / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bare}:/usr/bin:/bin", "DEVICE": "cpu", "PYTHON": str(bare / "python"),
           "WHEELS": str(wheels), "RANKS": "2 3", "TIME_LIMIT": "50", "MIN_BYTES": "64K", "MAX_BYTES": "256K",
           "LARGEST_COUNT": "5003"}
    assert shutil.which("mpiexec", path=env["PATH"]) is None
    proc = subprocess.run(["bash", "bench/gpu_check.sh", str(tmp_path / "gpu-host")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== no mpiexec: installing mpich and mpi4py from" in proc.stdout
    data = json.loads((tmp_path / "gpu-host.json").read_text())
    parts = {(p["part"], p["ranks"]): p for p in data["parts"]}
    assert set(parts) == {("copy", 1), ("check", 2), ("check", 3), ("sanitize", 2), ("busbw", 2), ("busbw", 3),
                          ("nccl", 2)}
    assert data["total_wrong"] == 0 and data["copy_GBps"] > 0
    algos = {"ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier",
             "oneshot", "twoshot"}
    check = parts["check", 2]
    assert [r["transport"] for r in check["runs"]] == ["shm", "staged", "direct"]
    for run in check["runs"]:  # the first tier at least: float32 sum, two counts, in and out of place
        assert set(run["checked"]) == algos and min(run["checked"].values()) >= 4 and run["description"]
    busbw = parts["busbw", 2]
    assert [r["transport"] for r in busbw["runs"]] == ["shm", "staged"]
    for run in busbw["runs"]:
        at_64k = {r["algorithm"]: r for r in run["rows"] if r["bytes"] == 65536}
        assert set(at_64k) == algos
        for row in at_64k.values():
            low, high = row["busbw_ci_GBps"]
            assert 0 < low <= row["busbw_GBps"] <= high and row["bound_busbw_GBps"] > 0
    assert parts["nccl", 2]["unavailable"].startswith("--algo nccl needs CuPy with NCCL and a GPU")
    assert parts["sanitize", 2]["note"] == "not checked: no GPU"
    text = (tmp_path / "gpu-host.md").read_text()
    for heading in ("## Copy rates", "## Correctness, 2 ranks", "## busbw, 3 ranks", "## NCCL, 2 ranks",
                    "## compute-sanitizer"):
        assert heading in text, heading
    assert "Wrong elements in all: 0." in text


def test_a_gpu_check_part_cut_off_keeps_what_it_measured(tmp_path):
    """A part killed before its end (SIGTERM, as bench/gpu_check.sh's timeout sends it), here once
    its first tier is saved, leaves its file as of its last step: the cases checked so far,
    marked incomplete."""
    out = tmp_path / "check-2.json"
    proc = subprocess.Popen([mpiexec(), "-n", "2", sys.executable, "-m", "bench.gpu_check", "--part", "check",
                             "--device", "cpu", "--output", str(out), "--until", str(time.time() + 600),
                             "--largest-count", "40000000"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def first_tier_saved():
        runs = json.loads(out.read_text()).get("runs", []) if out.exists() else []
        return bool(runs) and all(min(run["checked"].values()) >= 4 for run in runs)

    deadline = time.time() + 120
    while not first_tier_saved() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0, stdout.decode() + stderr.decode()
    part = json.loads(out.read_text())
    assert part["complete"] is False and part["part"] == "check" and part["ranks"] == 2
    assert all(min(run["checked"].values()) >= 4 for run in part["runs"]), part


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU here: bench/gpu_check.sh runs on the device machine")
def test_gpu_check_script_on_a_gpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "RANKS": "2", "TIME_LIMIT": "120", "MAX_BYTES": "16M",
           "LARGEST_COUNT": "100000"}
    proc = subprocess.run(["bash", "bench/gpu_check.sh", str(tmp_path / "gpu")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "gpu.json").read_text())["total_wrong"] == 0


def _kernel_huge_share(array):
    """The share of ``array``'s 4 KiB pages that the kernel backs by a transparent huge page,
    page by page: each page's frame from /proc/self/pagemap, its flags from /proc/kpageflags
    (KPF_THP, bit 22). None where frames are hidden (not root)."""
    start = array.__array_interface__["data"][0]
    pages = range(start // 4096, (start + array.nbytes - 1) // 4096 + 1)
    try:
        with open("/proc/self/pagemap", "rb") as pagemap, open("/proc/kpageflags", "rb") as kpageflags:
            pagemap.seek(pages[0] * 8)
            entries = np.frombuffer(pagemap.read(len(pages) * 8), np.uint64)
            frames = entries & np.uint64((1 << 55) - 1)
            if not frames.any():
                return None
            huge = 0
            for frame in frames:
                kpageflags.seek(int(frame) * 8)
                huge += bool(int.from_bytes(kpageflags.read(8), "little") >> 22 & 1)
    except OSError:
        return None
    return huge / len(pages)


def test_page_backing_agrees_with_the_kernels_page_flags():
    """bench.core.pages' share of a vector in huge pages (from smaps) against the kernel's own flags
    for each page; a 4 KiB-page vector holds none; the THP setting read from its file."""
    import mmap

    from algorithms.runtime.transports.pages import thp_mode
    from bench.core.pages import huge_page_share, small_page_vector

    huge = 2 << 20
    mapping = mmap.mmap(-1, 9 * huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    whole = np.frombuffer(mapping, np.uint8)
    start = -whole.__array_interface__["data"][0] % huge
    advised = whole[start:start + 8 * huge]
    small = small_page_vector(8 * huge // 4, np.float32)
    heap = np.ones(3 << 20, np.uint8)
    for vector in (advised, small, heap):
        vector[:] = 1  # touched: the pages exist
    for vector in (advised, small, heap):
        reference = _kernel_huge_share(vector)
        if reference is None:
            pytest.skip("page frames are hidden from this user (/proc/self/pagemap needs root)")
        assert huge_page_share(vector) == pytest.approx(reference, abs=1 / 8 + 1e-9), vector.nbytes
    assert huge_page_share(small) == 0.0
    if thp_mode() in ("always", "madvise"):
        assert _kernel_huge_share(advised) > 0  # the check above compared something
    mode = thp_mode()
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        assert f"[{mode}]" in f.read()


def test_thp_setting_is_the_bracketed_word(tmp_path):
    from algorithms.runtime.transports.pages import thp_mode

    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert thp_mode(setting) == "madvise"
    assert thp_mode(tmp_path / "missing") == "unavailable"


def own_decision(rounds, incumbent):
    """The tune rule worked out here: (choice, order) from {name: [us per round]} and the incumbent."""
    ratios = {name: [a / b for a, b in zip(values, rounds[incumbent])] for name, values in rounds.items()
              if name != incumbent}
    faster = [name for name, values in ratios.items() if own_interval(values)[2] < 1]
    choice = min(faster, key=lambda name: own_median(ratios[name])) if faster else incumbent
    return choice, [choice, *sorted((n for n in rounds if n != choice), key=lambda n: own_median(rounds[n]))]


def check_tune_table(table, incumbents):
    """Every rule of ``table`` follows the tune rule on its own rounds (worked out here), from
    ``incumbents`` ({bytes: name}); its intervals and medians are those of the rounds."""
    rounds = table["rounds_us"]["float32"]
    for rule in table["rules"]:
        size = str(rule["measured_bytes"])
        row = rounds[size]
        assert rule["incumbent"] == incumbents[rule["measured_bytes"]]
        choice, order = own_decision(row, rule["incumbent"])
        assert rule["order"] == order and rule["replaced"] is (choice != rule["incumbent"]), (rule, row)
        ties = [n for n in order[1:] if own_interval([a / b for a, b in zip(row[n], row[choice])])[1] <= 1
                <= own_interval([a / b for a, b in zip(row[n], row[choice])])[2]]
        assert rule["ties"] == ties
        challenger = choice if rule["replaced"] else (order[1] if len(order) > 1 else None)
        assert rule["challenger"] == challenger
        assert_interval(rule["challenger_over_incumbent"],
                        [a / b for a, b in zip(row[challenger], row[rule["incumbent"]])])
        for name, values in row.items():
            assert_interval(table["intervals_us"]["float32"][size][name], values)
            assert table["measured_us"]["float32"][size][name] == round(own_median(values), 3)


def auto_picks(ranks, sizes, env, collective="allreduce"):
    """What algorithm="auto" runs at each of ``sizes`` of ``collective`` on every rank (a real run
    under mpiexec)."""
    script = ("import json, algorithms; from mpi4py import MPI; "
              f"picks = MPI.COMM_WORLD.gather([algorithms.auto.choice(b, collective={collective!r})[0] "
              f"for b in {sizes!r}]); "
              "MPI.COMM_WORLD.rank or print(json.dumps(picks))")
    follow = run_mpi(ranks, ["-c", script], timeout=60, env=env)
    assert follow.returncode == 0, follow.stderr
    picks = json.loads(follow.stdout)
    assert all(p == picks[0] for p in picks)
    return dict(zip(sizes, picks[0]))


@pytest.mark.parametrize("ranks, repeats, sizes", [(1, 2, [8, 1024, 4096, 16384]), (2, 2, [8, 1024, 4096, 16384]),
                                                   (3, 1, [8, 1024])])  # 3 ranks on 2 cores: slow calls
def test_tune_writes_a_table_auto_follows(tmp_path, ranks, repeats, sizes):
    """``bench tune`` on a few sizes: every candidate timed at each in every round, each rule's first
    candidate the incumbent (here the model's choice) unless a challenger's paired time over it lies
    wholly below 1, then the others by median time; the intervals those of the rounds; rules
    meeting at the geometric mean of neighbouring sizes, "*" standing for other dtypes; then a
    run of auto on that table picks each rule's first."""
    out = tmp_path / "tuning.json"
    proc = run_mpi(ranks, ["-m", "bench", "tune", "-b", "1K", "-e", str(sizes[-1]), "-f", "4", "--repeats", str(repeats),
                           "-o", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = json.loads(out.read_text())
    assert (table["schema"], table["ranks"], table["nodes"]) == ("allreduce-tuning/1", ranks, 1)
    rounds = table["rounds_us"]["float32"]
    assert sorted(int(b) for b in rounds) == sizes
    assert all(len(values) == repeats for row in rounds.values() for values in row.values())
    for rules in ([r for r in table["rules"] if r["dtype"] == "float32"], [r for r in table["rules"] if r["dtype"] == "*"]):
        assert [r["measured_bytes"] for r in rules] == sizes
        assert [r["upto_bytes"] for r in rules] == [90, 2048, 8192, None][:len(sizes) - 1] + [None]  # isqrt(8 * 1024)
        for rule in rules:
            assert set(rule["order"]) == set(algorithms.auto.candidates()) == set(rounds[str(rule["measured_bytes"])])
            assert "the model decides" in rule["incumbent_from"]
    check_tune_table(table, auto_picks(ranks, sizes, {}))  # the model's choices, without a table
    assert f"wrote {out}" in proc.stdout
    held = 1 - 2 / 2 ** repeats if repeats > 1 else 0  # the whole range misses the median when all fall on one side
    assert (f"{repeats} round{'s' * (repeats > 1)} a size: medians with 95% intervals (below 6 rounds the whole range, "
            f"which holds the median {held:.0%} of the time)") in proc.stdout
    for rule in table["rules"][:len(sizes)]:
        size = rule["measured_bytes"]
        size = f"{size >> 10} KiB" if size >= 1024 else f"{size} B"  # as the tool writes sizes
        line = next(l for l in proc.stdout.splitlines() if l.startswith(size + ": "))
        assert line.startswith(f"{size}: {rule['order'][0]} "
                               + ("replaces" if rule["replaced"] else "stays")), line
        assert ("tie with" in line) is bool(rule["ties"]) and all(name in line for name in rule["ties"])
    follow = auto_picks(ranks, sizes, {"ALLREDUCE_TUNING_FILE": str(out)})
    assert follow == {rule["measured_bytes"]: rule["order"][0] for rule in table["rules"][:len(sizes)]}
    engine = table["engine"]  # the two engines timed from 8 B up: the compiled one's reach, followed
    timed = sorted(int(b) for b in engine["compiled_over_python"])
    assert timed == sizes[:len(timed)] and isinstance(engine["compiled_bytes"], int), engine
    swept = run_mpi(ranks, ["-m", "bench", "-b", "8", "-e", "8", "--algo", "ring", "--log", "none"], timeout=60,
                    env={"ALLREDUCE_TUNING_FILE": str(out)})
    expected = f"# Engine: compiled up to {size_text(engine['compiled_bytes'])}, python above (tuning table {out})"
    assert expected in swept.stdout, swept.stdout[-3000:]


def test_tune_tables_the_halves_beside_the_allreduce(tmp_path):
    """``bench tune --collective reducescatter,allgather`` times each half's candidates (those with
    the half, no others) on the whole vector's size and writes rules per collective, keeping the
    all-reduce's rules of the table already at the output path; auto then follows each
    collective's own rules."""
    out = tmp_path / "tuning.json"
    sizes = [8, 1024, 4096]
    proc = run_mpi(2, ["-m", "bench", "tune", "-b", "1K", "-e", "4K", "-f", "4", "--repeats", "2",
                       "--algo", "ring,ps", "-o", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = json.loads(out.read_text())
    allreduce_rules = first["rules"]
    proc = run_mpi(2, ["-m", "bench", "tune", "-b", "1K", "-e", "4K", "-f", "4", "--repeats", "2",
                       "--collective", "reducescatter,allgather", "-o", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = json.loads(out.read_text())
    assert [r for r in table["rules"] if r.get("collective", "allreduce") == "allreduce"] == allreduce_rules
    assert all(table[key] == first[key] for key in ("measured_us", "intervals_us", "rounds_us"))
    for collective in ("reduce_scatter", "all_gather"):
        rules = [r for r in table["rules"] if r.get("collective") == collective and r["dtype"] == "float32"]
        assert [r["measured_bytes"] for r in rules] == sizes
        rounds = table[f"{collective}_rounds_us"]["float32"]
        for rule in rules:
            assert set(rule["order"]) == set(algorithms.auto.candidates(collective)) == set(
                rounds[str(rule["measured_bytes"])])
            assert "ps" not in rule["order"]  # the parameter server has no halves of its own
        picks = auto_picks(2, sizes, {"ALLREDUCE_TUNING_FILE": str(out)}, collective)
        assert picks == {rule["measured_bytes"]: rule["order"][0] for rule in rules}
    assert "# reduce_scatter float32 sum, 2 ranks" in proc.stdout and "# all_gather float32, 2 ranks" in proc.stdout


def test_tune_keeps_a_given_tables_choices_unless_beaten(tmp_path):
    """The incumbents come from ``--tuning``'s table, then from the table already at the output path."""
    given, out = tmp_path / "given.json", tmp_path / "tuning.json"
    given.write_text(json.dumps({"schema": "allreduce-tuning/1", "ranks": 2, "nodes": 1, "rules": [
        {"placement": "host", "dtype": "*", "upto_bytes": None, "order": ["ps"]}]}))
    args = ["-m", "bench", "tune", "-b", "4K", "-e", "64K", "-f", "16", "--repeats", "3", "--algo", "ring,ps,rd",
            "-o", str(out)]
    proc = run_mpi(2, [*args, "--tuning", str(given)], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = json.loads(out.read_text())
    assert all(f"tuning table {given}" in rule["incumbent_from"] for rule in table["rules"])
    check_tune_table(table, {8: "ps", 4096: "ps", 65536: "ps"})
    proc = run_mpi(2, args, timeout=180)  # now the output's own table stands
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = json.loads(out.read_text())
    assert all(f"tuning table {out}" in rule["incumbent_from"] for rule in again["rules"])
    check_tune_table(again, {rule["measured_bytes"]: rule["order"][0] for rule in table["rules"]
                             if rule["dtype"] == "float32"})


def test_tune_rule_on_synthetic_rounds():
    """A tie keeps the incumbent; a clear 2x win replaces it; of two winners the larger wins; a
    challenger faster by median but not in every one of 7 rounds (the whole range: 98.4%) ties."""
    from bench.tools.tune import decide

    incumbent = [1.00, 1.02, 0.98, 1.01, 0.99, 1.03, 1.00]
    rounds = {"rd": incumbent, "ring": [1.01, 1.00, 1.00, 0.99, 1.02, 1.01, 0.99], "ps": [2 * t for t in incumbent]}
    kept = decide(rounds, "rd")
    assert (kept["choice"], kept["replaced"], kept["challenger"], kept["ties"]) == ("rd", False, "ring", ["ring"])
    assert kept["order"] == ["rd", "ring", "ps"] and kept["ratio"].holds(1.0)
    won = decide({**rounds, "oneshot": [t / 2 for t in incumbent]}, "rd")
    assert (won["choice"], won["replaced"], won["challenger"], won["ties"]) == ("oneshot", True, "oneshot", [])
    assert (won["ratio"].median, won["ratio"].low, won["ratio"].high) == (0.5, 0.5, 0.5)
    assert won["order"] == ["oneshot", "ring", "rd", "ps"] or won["order"] == ["oneshot", "rd", "ring", "ps"]
    both = decide({**rounds, "a": [t * 0.8 for t in incumbent], "b": [t * 0.6 for t in incumbent]}, "rd")
    assert both["choice"] == "b" and both["ratio"].median == pytest.approx(0.6)
    once_slower = decide({"rd": [1.0] * 7, "ring": [0.8] * 6 + [1.1]}, "rd")
    assert (once_slower["choice"], once_slower["ties"]) == ("rd", ["ring"])
    alone = decide({"ring": [1.0] * 3}, "ring")
    assert (alone["choice"], alone["challenger"], alone["ratio"], alone["ties"]) == ("ring", None, None, [])


def test_tune_engine_threshold_on_synthetic_rounds():
    """The compiled engine keeps every size up to the first where it is slower in every round (the
    interval wholly above 1), to the geometric mean with the size before; ties keep it; all of them
    where it is never slower; none where it is slower at the smallest."""
    from bench.tools.tune_engine import threshold

    def rows(ratios):
        return {n: {"python": [1.0] * 7, "compiled": [r * (1 + 0.01 * k) for k in range(7)]} for n, r in ratios.items()}
    assert threshold(rows({8: 0.3, 1024: 0.5, 65536: 0.995, 1 << 20: 1.5}))["compiled_bytes"] == 262144  # a tie at 64K kept
    assert threshold(rows({8: 0.3, 1024: 0.9}))["compiled_bytes"] == 1024
    assert threshold(rows({8: 1.2, 1024: 0.9}))["compiled_bytes"] == 0
    found = threshold(rows({8: 0.3}))
    assert found["compiled_over_python"]["8"]["median"] == pytest.approx(0.3 * 1.03) and found["algorithm"] == "ring"


def test_tune_refuses_an_unknown_candidate(tmp_path):
    proc = run_mpi(2, ["-m", "bench", "tune", "--algo", "ring,warp", "-o", str(tmp_path / "t.json")], timeout=60)
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines() == [
        "python -m bench tune: unknown --algo warp; choices: " + ",".join(algorithms.auto.candidates()) + ",all"]
    assert not (tmp_path / "t.json").exists()


def test_only_hiers_allreduce_needs_a_topology_under_bamtree(monkeypatch):
    """With ALLREDUCE_HIER_ACROSS=bamtree only hier's all-reduce builds a tree from a bandwidth
    matrix, so a sweep probes first for it, not for hier's reduce-scatter or all-gather (rings
    across nodes); bamring's halves keep the ring order they take from the matrix."""
    from bench.core.collectives import AllGather, AllReduce, ReduceScatter
    from bench.core.entries import entries
    monkeypatch.setenv("ALLREDUCE_HIER_ACROSS", "bamtree")
    assert entries(AllReduce)["hier"].needs_topology
    assert not entries(ReduceScatter)["hier"].needs_topology and not entries(AllGather)["hier"].needs_topology
    assert entries(ReduceScatter)["bamring"].needs_topology and entries(AllGather)["bamring"].needs_topology
    monkeypatch.setenv("ALLREDUCE_HIER_ACROSS", "ring")
    assert not entries(AllReduce)["hier"].needs_topology
