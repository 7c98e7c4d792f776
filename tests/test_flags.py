"""The sweep's flags as a newcomer meets them: nccl-tests' flags with nccl-tests' meanings
(and one-line refusals of those that do not apply), the summary, progress, oversubscription,
help on every flag; each variant's output read by the rules of nccl-tests' downstream
parsers (SuperBench's, CloudAI's). Run for real, under mpiexec where it takes ranks."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, mpiexec, run_mpi
from mpi4py import MPI

SMALL = ["-b", "8K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1"]


def bench(ranks, *args, timeout=120):
    return run_mpi(ranks, ["-m", "bench", *args], timeout=timeout)


def table_rows(text):
    """Data rows as nccl-tests' parsers find them: lines that start with a digit."""
    return [line.split() for line in text.splitlines() if re.match(r"^\s*\d", line)]


def superbench_busbw(text):
    """SuperBench's nccl-bw rule: the rows between the last 'out-of-place' line (+4) and the
    last 'Out of bounds values' line, each split on spaces, stopping at one of 10 fields or
    fewer; the result is the largest field -6 (out-of-place busbw)."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if "out-of-place" in line)
    end = max(i for i, line in enumerate(lines) if "Out of bounds values" in line)
    best = -1.0
    for line in lines[start + 4:end]:
        fields = line.strip().split()
        if len(fields) <= 10:
            break
        best = max(best, float(fields[-6]))
    return best


def cloudai_rows(text):
    """CloudAI's nccl-test report: lines starting with a digit that split into exactly 13 fields."""
    return [fields for fields in table_rows(text) if len(fields) == 13]


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("flag,value,reason", [
    ("-t", "2", "every rank is one process with one thread"),
    ("-g", "2", "every rank drives one GPU"),
    ("-p", "1", "parallel initialization starts a thread per GPU"),
    ("-y", "1", "there is no NULL-stream mode"),
    ("-G", "1", "CUDA graphs capture device work"),
    ("-x", "0", "it sets NCCL's CTA policy"),
    ("-D", "1", "NCCL's device API"),
    ("-V", "16", "NCCL's device API kernels"),
    ("-R", "2", "NCCL's symmetric registration"),
])
def test_nccl_tests_flags_that_do_not_apply_are_one_line(flag, value, reason):
    proc = subprocess.run([sys.executable, "-m", "bench", flag, value], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m bench: error: {flag} {value} does not apply here: ")
    assert reason in lines[0]


def test_nccl_tests_command_line_runs_with_t_g_and_r(tmp_path):
    """A typical nccl-tests command line, -g 1 included, runs as it is."""
    proc = bench(2, "-t", "1", "-g", "1", "-r", "1", *SMALL, "-c", "1", "--algo", "ring", "--log", "none")
    assert proc.returncode == 0, proc.stderr
    rows = table_rows(proc.stdout)
    assert len(rows) == 2 and all(r[4] == "-1" for r in rows)  # rootless: the root column prints -1
    assert "# nThread 1 nGpus 1 " in proc.stdout


def test_run_cycles_print_and_log_every_cycle(tmp_path):
    log, document = tmp_path / "log.jsonl", tmp_path / "run.json"
    proc = bench(2, *SMALL, "-N", "3", "--rounds", "3", "--algo", "ring,mpi", "--log", str(log), "-J", str(document),
                 "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert len(table_rows(proc.stdout)) == 2 * 3 * 2
    rows = rows_of(log)
    # the algorithms take turns within every size: each size's rows finish together
    assert [(r["algorithm"], r["cycle"], r["size"]) for r in rows] == [
        (a, c, s) for c in (1, 2, 3) for s in (8192, 65536) for a in ("ring", "mpi")]
    # each algorithm's table prints whole, every cycle's rows in it
    assert [r[0] for r in table_rows(proc.stdout)] == ["8192", "65536"] * 6
    saved = json.loads(document.read_text())
    assert len(saved["results"]) == 12 and saved["config"]["run_cycles"] == 3
    # the summary pools every cycle's rounds: busbw from the median of the 3 x 3 round times, out of place
    pooled = sorted(t for r in rows if r["algorithm"] == "ring" and r["size"] == 8192
                    for t in r["out_of_place"]["round_times_us"])
    assert len(pooled) == 9
    median_us = pooled[4]
    entry = next(e for e in saved["summary_by_size"] if e["size"] == 8192)
    assert entry["rounds"] == 9 and entry["time_us"]["ring"] == pytest.approx(median_us)
    assert entry["busbw"]["ring"] == pytest.approx(8192 / (median_us * 1e-6) / 1e9)  # 2 ranks: busbw = algbw


def test_run_cycles_0_runs_until_stopped(tmp_path):
    log = tmp_path / "log.jsonl"
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "bench", *SMALL, "-N", "0", "--algo", "ring",
               "--log", str(log), "--quiet"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not log.exists() or log.read_text().count("\n") < 6):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    cycles = [r["cycle"] for r in rows_of(log)]
    assert max(cycles) >= 3 and cycles[:6] == [1, 1, 2, 2, 3, 3]


def test_aggregated_iterations_run_m_calls_per_iteration():
    """bench.core.timing on one process: -n 3 -w 2 -m 4 makes 2 + 3 x 4 calls, each iteration's
    time divided by 4."""
    from bench.core.timing import time_calls

    calls = []
    per_iteration = [0.0] * 3
    seconds, host = time_calls(MPI.COMM_SELF, lambda: (calls.append(1), time.sleep(0.002)), 3, 2,
                               per_iteration=per_iteration, agg=4)
    assert len(calls) == 2 + 12
    assert 0.002 <= seconds < 0.02 and host <= seconds
    assert all(0.002 <= t < 0.02 for t in per_iteration)


def test_agg_iters_timestamps_and_cputime_in_table_and_json(tmp_path):
    document = tmp_path / "run.json"
    proc = bench(2, *SMALL, "-m", "4", "-S", "1", "-C", "1", "--rounds", "3", "--algo", "ring,mpi", "--log", "none",
                 "-J", str(document), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert " agg iters: 4 " in proc.stdout
    header = [line for line in proc.stdout.splitlines() if "#wrong" in line][0]
    assert header.split()[6] == "cputime" and header.split()[10] == "cputime" and header.endswith("timestamp")
    rows = table_rows(proc.stdout)
    assert rows and all(len(r) == 15 and re.fullmatch(r"\d{4}-\d\d-\d\d", r[13]) and
                        re.fullmatch(r"\d\d:\d\d:\d\d", r[14]) for r in rows)
    assert cloudai_rows(proc.stdout) == []  # as with nccl-tests' -S: CloudAI keeps 13-field rows only
    saved = json.loads(document.read_text())
    assert saved["config"]["aggregated_iterations"] == 4 and saved["config"]["report_cputime"] == "true"
    for r in saved["results"]:
        assert set(r["out_of_place"]) == {"cpu_time", "alg_bw", "bus_bw", "nwrong", "time_ci", "round_times_us",
                                          "cpu_time_ci", "round_cpu_times_us"}
        assert r["out_of_place"]["cpu_time"] > 0 and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", r["timestamp"])
        host = sorted(r["out_of_place"]["round_cpu_times_us"])  # the host's time: the median of 3 rounds
        assert len(host) == 3 and r["out_of_place"]["cpu_time"] == pytest.approx(host[1])


def test_the_tools_read_a_cputime_run(tmp_path):
    """compare and model take -C's cpu_time as the time of its rows."""
    from bench.formats.tables import significant

    document = tmp_path / "run.json"
    proc = bench(2, *SMALL, "-C", "1", "--algo", "ring,mpi", "--log", "none", "-J", str(document), "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(document.read_text())["results"]
    for tool in (["compare", str(document)], ["model", "--ranks", "2", "-b", "8K", "-e", "64K", "-f", "8",
                                             "--results", str(document)]):
        out = subprocess.run([sys.executable, "-m", "bench", *tool], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        ring_8k = next(r for r in rows if r["algorithm"] == "ring" and r["size"] == 8192)
        line = next(l for l in out.stdout.splitlines() if re.match(r"\s*8 KiB\s+ring\b", l))
        assert significant(ring_8k["out_of_place"]["cpu_time"]) in line.split(), line


def test_default_and_cputime_output_read_by_superbench_and_cloudai(tmp_path):
    document = tmp_path / "run.json"
    for extra in ([], ["-C", "1"], ["-M", "1"]):
        proc = bench(2, *SMALL, "-N", "2", "--algo", "ring,mpi", "--log", "none", "-J", str(document), "--quiet",
                     *extra)
        assert proc.returncode == 0, proc.stderr
        saved = json.loads(document.read_text())["results"]
        assert len(cloudai_rows(proc.stdout)) == len(saved) == 8
        last_table = [r for r in saved if r["algorithm"] == "mpi"]
        # SuperBench starts 4 lines after 'out-of-place', which skips the first row (its logs had a line there)
        expected = max(float(f"{r['out_of_place']['bus_bw']:.2f}") for r in last_table[1:])
        assert superbench_busbw(proc.stdout) == pytest.approx(expected, abs=0.006), extra


def test_memory_line_after_every_table(tmp_path):
    proc = bench(2, *SMALL, "-M", "1", "--algo", "ring,mpi", "--log", "none", "--quiet")
    assert proc.returncode == 0, proc.stderr
    lines = re.findall(r"^# Host memory usage    : Initialization (\S+) (\w+) \| User-Allocated (\S+) (\w+) \| "
                       r"Collective (\S+) (\w+) \| Total  (\S+) (\w+)$", proc.stdout, re.M)
    assert len(lines) == 2
    scale = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    for fields in lines:
        before, user, rest, total = (float(fields[i]) * scale[fields[i + 1]] for i in range(0, 8, 2))
        assert 10 << 20 < before < total and user >= 6 * 65536 * 0.99  # send, recv, in place, check's three
        assert before + user + rest == pytest.approx(total, rel=0.02)


@pytest.mark.parametrize("extra, sizes", [([], 2), (["-R", "1"], 1)], ids=["plain", "registered"])
def test_unaligned_buffers_are_exact_for_every_algorithm(tmp_path, extra, sizes):
    """96 B (through MPI) and 96 KiB (through shared memory, or read in place when registered: 96
    KiB alone, since a registered vector of 96 B takes MPI's path as a plain one does), 3
    elements off their allocations, every dtype: no wrong element."""
    proc = bench(3, "-b", "96" if sizes == 2 else "96K", "-e", "96K", "-f", "1024", "-n", "2", "-w", "1", "-u", "3",
                 "-d", "all", "-o", "sum", "--rounds", "1", "--algo", "ps,ring,tree,dbtree,rd,mpi", "--log", "none",
                 "--quiet", *extra, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert proc.stdout.count("# Buffers: unaligned by 3 elements (-u)") == 6
    rows = table_rows(proc.stdout)
    assert len(rows) == (5 * 14 + 11) * sizes and all(r[8] == "0" and r[12] == "0" for r in rows)  # mpi: no bf16, fp8


def test_oversubscription_is_said_in_stderr_every_header_and_the_json(tmp_path):
    document = tmp_path / "run.json"
    command = ["taskset", "-c", "0", mpiexec(), "-n", "2", sys.executable, "-m", "bench", *SMALL,
               "--algo", "ring,mpi", "--log", "none", "-J", str(document), "--quiet"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    host = MPI.Get_processor_name()
    assert f"python -m bench: warning: oversubscribed: 2 ranks on 1 cores of {host}: times are not meaningful" \
        in proc.stderr
    assert proc.stdout.count(f"# Oversubscribed: 2 ranks on 1 cores of {host}: times are not meaningful") == 2
    config = json.loads(document.read_text())["config"]
    assert config["oversubscribed"] == f"2 ranks on 1 cores of {host}: times are not meaningful"
    fits = bench(1, *SMALL, "--algo", "ring", "--log", "none", "-J", str(document), "--quiet")
    assert "Oversubscribed" not in fits.stdout and "oversubscribed" not in fits.stderr
    assert json.loads(document.read_text())["config"]["oversubscribed"] == "false"


def _median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _ten_round_interval(values):
    """Median and 95% interval of 10 values by order statistics, worked out by hand: [x_(2), x_(9)]
    holds the median with 1 - 2 (1 + 10) / 2^10 = 97.9%, [x_(3), x_(8)] with only 89%."""
    assert len(values) == 10
    ordered = sorted(values)
    return _median(ordered), ordered[1], ordered[8]


RATIO_CELL = re.compile(r"(itself|-|(\S+)x \[(\S+), (\S+)\]( tie)?)")


def test_summary_names_the_fastest_its_ties_and_paired_ratios(tmp_path):
    """The summary's verdicts, each worked out here from the rows' round times in the JSON: the
    fastest (least median time) or "tie", the runner-up, and each ratio (the other's time over
    the fastest's in the same round) with its interval; the busbw table holds every median."""
    from bench.formats.tables import significant

    document = tmp_path / "run.json"
    proc = bench(2, "-b", "8", "-e", "1M", "-f", "32", "-n", "5", "-w", "1", "--rounds", "10",
                 "--algo", "ring,rd,tree,mpi", "--log", "none", "-J", str(document), "--quiet")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout[proc.stdout.rindex("# Out of bounds values"):]
    block = text[text.index("# Summary"):].splitlines()
    assert all(line.startswith("#") and len(line) <= 120 for line in block)
    assert block[0] == "# Summary: busbw (GB/s, out of place) of every algorithm per size, the median of 10 rounds"
    rows = json.loads(document.read_text())["results"]
    times = {(r["size"], r["algorithm"]): r["out_of_place"]["round_times_us"] for r in rows}
    sizes = [8, 256, 8192, 262144]
    busbw_lines = block[block.index("#       size     ring       rd     tree      mpi") + 1:][:4]
    for line, size in zip(busbw_lines, sizes):
        fields = line.lstrip("#").split()
        assert int(fields[0]) == size
        for name, shown in zip(("ring", "rd", "tree", "mpi"), fields[1:]):
            assert shown == significant(size / (_median(times[size, name]) * 1e-6) / 1e9)
    header = next(i for i, line in enumerate(block) if line.startswith("#       size  fastest runner-up"))
    verdicts = block[header + 1:header + 5]
    for line, size in zip(verdicts, sizes):
        fields = line.lstrip("#").split()
        assert int(fields[0]) == size
        medians = {name: _median(times[size, name]) for name in ("ring", "rd", "tree", "mpi")}
        best, runner_up = sorted(medians, key=medians.get)[:2]

        def ratio(name):
            return _ten_round_interval([a / b for a, b in zip(times[size, name], times[size, best])])

        ties = [n for n in medians if n != best and ratio(n)[1] <= 1 <= ratio(n)[2]]
        assert fields[1] == ("tie" if ties else best) and fields[2] == runner_up, (line, medians)
        cells = [m[0] for m in RATIO_CELL.findall(line.split(runner_up, 1)[1])]
        assert len(cells) == 2, line
        for cell, name in zip(cells, (runner_up, "mpi")):
            if name == best:
                assert cell == "itself"
                continue
            median, low, high = ratio(name)
            tie = " tie" if low <= 1 <= high else ""
            assert cell == f"{significant(median)}x [{significant(low)}, {significant(high)}]{tie}", (cell, name)
        tie_line = [l for l in block[header + 5:] if l.lstrip("#").split()[:1] == [str(size)]]
        if ties:  # named, the fastest first
            assert tie_line and tie_line[0].lstrip("#").split(None, 1)[1].split(", ")[0] == best
            assert set(tie_line[0].lstrip("#").split(None, 1)[1].split(", ")) == {best, *ties}
        else:
            assert tie_line == []
    summary = json.loads(document.read_text())["summary_by_size"]
    assert [e["size"] for e in summary] == sizes and all(e["rounds"] == 10 for e in summary)


def test_progress_lines_and_the_log_path(tmp_path):
    log = tmp_path / "log.jsonl"
    proc = bench(2, *SMALL, "--algo", "ring,mpi", "--log", str(log))
    assert proc.returncode == 0, proc.stderr
    assert f"# Writing every row to {log} as it finishes" in proc.stdout
    progress = re.findall(r"^python -m bench: (\w+) float sum: (\d+) B done \((\d)/2\), busbw \S+ GB/s$",
                          proc.stderr, re.M)
    assert progress == [("ring", "8192", "1"), ("mpi", "8192", "1"), ("ring", "65536", "2"), ("mpi", "65536", "2")]
    quiet = bench(2, *SMALL, "--algo", "ring", "--log", "none", "--quiet")
    assert quiet.returncode == 0 and "done (" not in quiet.stderr


def test_one_rank_without_mpiexec_gets_a_hint():
    alone = subprocess.run([sys.executable, "-m", "bench", *SMALL, "--algo", "ring", "--log", "none", "--quiet"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert alone.returncode == 0
    assert "python -m bench: running 1 rank; for N ranks start it as mpiexec -n N python -m bench" in alone.stderr
    launched = bench(1, *SMALL, "--algo", "ring", "--log", "none", "--quiet")
    assert launched.returncode == 0 and "running 1 rank" not in launched.stderr


def test_gpu_without_a_gpu_says_so_first():
    proc = subprocess.run([sys.executable, "-m", "bench", "--device", "gpu", "--algo", "mpi"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    if "no GPU" not in proc.stderr and proc.returncode == 0:
        pytest.skip("a GPU is here")
    assert proc.returncode == 2
    assert proc.stderr.startswith("python -m bench: error: --device gpu: no")
    assert "CUDA-aware" not in proc.stderr


def test_every_flag_has_help_without_internal_references():
    from bench.core.options import build_parser

    parser = build_parser()
    missing = [a.option_strings for a in parser._actions if a.option_strings != ["-h", "--help"] and not a.help]
    assert missing == []
    text = parser.format_help()
    assert not re.search(r"seed 00|\bissue \d|DESIGN|\.\./shared|this machine", text, re.I)


@pytest.mark.parametrize("name", ["compare", "model", "plot", "scaling", "perf", "bound", "treebuild", "lab", "tune", "train",
                                  "mpi-tuning", "nccl-tuning", "gpu-check", "doctor"])
def test_every_subcommand_has_its_own_help(name):
    """Each tool of the one table (bench.tools.TOOLS) runs with its own --help, and the sweep's
    --help lists it."""
    from bench.tools import TOOLS

    assert name in TOOLS
    proc = subprocess.run([sys.executable, "-m", "bench", name, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: ") and "Subcommands (python -m bench NAME" not in proc.stdout
    listing = build_parser_help()
    assert re.search(rf"^  {re.escape(name)} +{re.escape(TOOLS[name].help[:30])}", listing, re.M), listing


def build_parser_help():
    """The sweep's --help as python -m bench prints it."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_console_script_runs_the_subcommands(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "allreduce-bench")
    proc = subprocess.run([script, "compare", str(tmp_path / "none.json")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("python -m bench compare:")
    proc = subprocess.run([script, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Subcommands (python -m bench NAME" in proc.stdout


def test_hier_says_and_saves_its_node_layout(tmp_path):
    """--algo hier on two "nodes" of one rank each: the header and the -J config say which nodes and
    what runs across them, with no wrong element; a map of the wrong length is one line, exit 2."""
    document = tmp_path / "run.json"
    proc = run_mpi(2, ["-m", "bench", *SMALL, "--algo", "hier", "--log", "none", "-J", str(document), "--quiet"],
                   timeout=120, env={"ALLREDUCE_NODE_MAP": "5,3"})
    assert proc.returncode == 0, proc.stderr
    assert "# Nodes: 2 nodes (0,1, from ALLREDUCE_NODE_MAP), ring across" in proc.stdout
    rows = table_rows(proc.stdout)
    assert len(rows) == 2 and all(r[8] == "0" and r[12] == "0" for r in rows)
    saved = json.loads(document.read_text())
    assert saved["config"]["hier"] == {"nodes": [0, 1], "across": "ring", "source": "ALLREDUCE_NODE_MAP"}
    assert {r["algorithm"] for r in saved["results"]} == {"hier"}
    bad = run_mpi(2, ["-m", "bench", *SMALL, "--algo", "hier", "--log", "none"], timeout=60,
                  env={"ALLREDUCE_NODE_MAP": "0,0,1"})
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "python -m bench: error: ALLREDUCE_NODE_MAP has 3 node ids (0,0,1) for a communicator of 2 ranks: "
        "give one node id per rank"]


def test_auto_sees_the_nodes_hier_sees():
    """ALLREDUCE_NODE_MAP is one answer everywhere: two ranks of one machine mapped to two nodes
    are two nodes to auto too, which then leaves out what runs within one node's shared memory
    (oneshot, its pick at 8 B on one node without a tuning table)."""
    code = ("import algorithms.auto as auto; from algorithms.catalog.hier import layout_of; from mpi4py import MPI\n"
            "c, hier = auto.Choices(MPI.COMM_WORLD), list(layout_of().nodes)  # collective\n"
            "if MPI.COMM_WORLD.rank == 0: print(c.nodes, hier, c.choose(False, 'float32', 8)[0])")
    picked = {}
    for node_map in ("", "5,3"):
        proc = run_mpi(2, ["-c", code], timeout=60, env={"ALLREDUCE_NODE_MAP": node_map, "ALLREDUCE_TUNING_FILE": ""})
        assert proc.returncode == 0, proc.stderr
        picked[node_map] = proc.stdout.split(maxsplit=3)
    assert picked[""][:3] == ["1", "[0,", "0]"] and picked[""][3].strip() == "oneshot"
    assert picked["5,3"][:3] == ["2", "[0,", "1]"] and picked["5,3"][3].strip() != "oneshot"


def test_timed_warms_up_every_turn_before_its_timed_calls():
    """bench.core.timing.timed on one process: in each round every candidate makes its warm-up
    calls right before its timed ones (what the turn before left behind falls on the warm-up),
    the order rotated by one each round."""
    from bench.core.timing import timed

    made = []
    calls = {name: (lambda name=name: made.append(name)) for name in ("a", "b")}
    rounds = timed(MPI.COMM_SELF, calls, 3, 2, 2)
    assert made == ["a"] * 5 + ["b"] * 5 + ["b"] * 5 + ["a"] * 5
    assert {name: len(times) for name, times in rounds.items()} == {"a": 2, "b": 2}
