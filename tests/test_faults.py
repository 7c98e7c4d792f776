"""Faults on purpose, under a real mpiexec, each under a timeout: a job ends together.

Signals to mpiexec and to single ranks, ``kill -9``, an error on one rank, settings on one
rank alone, unwritable and full outputs, bad topology files, sizes that cannot fit, and the
silent cases. Each case asserts how long the job took to end, its exit code, its message,
that no rank outlived it, and that the JSON-lines log and the ``-J`` document hold every
finished row and nothing else. results/reliability.md lists them with measured timings.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, mpiexec
from mpi_jobs import RANKS, Job, lines_of, one_line, table_rows

#: a sweep long enough to be cut part way: rows every few tens of milliseconds, then longer; one
#: algorithm, whose table prints row by row (several take turns, their tables printed at the end)
SWEEP = ["-m", "bench", "-b", "8K", "-e", "64M", "-f", "2", "-n", "40", "-w", "1", "--algo", "ring", "--quiet"]
SHORT = ["-m", "bench", "-b", "8K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "--algo", "ring", "--quiet"]
END_BOUND = 5.0  # seconds from the fault to the last rank gone


def check_results(log, document_path, stdout, exact):
    """Every log line is one whole row; ``-J`` is valid and not marked complete; the log, the
    document and the printed table hold the same finished rows (``exact``), or, when the job
    was cut from another rank than 0 (rank 0 killed while saving a row), the document may lag
    the log by that one row."""
    rows = [json.loads(line) for line in lines_of(log)]  # raises on a half-written row
    document = json.loads(document_path.read_text())
    keys = [(r["algorithm"], r["size"]) for r in rows]
    saved = [(r["algorithm"], r["size"]) for r in document["results"]]
    assert document["allreduce_bench"]["complete"] is False
    assert len(rows) >= 3, "the fault came after three rows"
    assert len(set(keys)) == len(keys), "a row logged twice"
    if exact:
        assert saved == keys and len(table_rows(stdout)) == len(rows)
    else:
        assert keys[:len(saved)] == saved and len(keys) - len(saved) in (0, 1)
        assert len(table_rows(stdout)) in (len(rows), len(rows) - 1)
    assert document["out_of_bounds"]["count"] == 0 and all(r["out_of_place"]["nwrong"] == 0 for r in rows)
    return rows


def started_sweep(tmp_path, extra=()):
    log, document = tmp_path / "sweep.jsonl", tmp_path / "sweep.json"
    job = Job(tmp_path, [*SWEEP, "--log", str(log), "-J", str(document), *extra])
    job.wait_until(lambda: len(lines_of(log)) >= 3 and len(job.rank_pids()) == RANKS)
    return job, log, document


# ------------------------------------------------------------------ signals and kills

@pytest.mark.parametrize("target,signum", [("mpiexec", signal.SIGINT), ("mpiexec", signal.SIGTERM),
                                           (0, signal.SIGINT), (1, signal.SIGINT), (2, signal.SIGTERM)],
                         ids=["INT-mpiexec", "TERM-mpiexec", "INT-rank0", "INT-rank1", "TERM-rank2"])
def test_a_signal_ends_every_rank_and_keeps_every_finished_row(tmp_path, target, signum):
    job, log, document = started_sweep(tmp_path)
    os.kill(job.proc.pid if target == "mpiexec" else job.rank_pids()[target], signum)
    code, seconds = job.end(timeout=30)
    assert code == 128 + signum, job.stderr()
    assert seconds < END_BOUND
    who = 0 if target == "mpiexec" else target  # mpiexec forwards the signal to every rank: rank 0 says it
    assert f"python -m bench: rank {who}: interrupted by {signal.Signals(signum).name}; ending every rank" in job.stderr()
    assert "Traceback" not in job.stderr()
    check_results(log, document, job.stdout(), exact=who == 0)


def test_kill_9_of_one_rank_ends_the_job(tmp_path):
    job, log, document = started_sweep(tmp_path)
    os.kill(job.rank_pids()[1], signal.SIGKILL)
    code, seconds = job.end(timeout=30)
    assert code != 0 and seconds < END_BOUND
    check_results(log, document, job.stdout(), exact=False)


# ------------------------------------------------------------------ an error on one rank

@pytest.mark.parametrize("runner", ["run_together", "python -m mpi4py"])
def test_an_error_on_one_rank_ends_every_rank(tmp_path, runner):
    """Rank 1 raises in the middle of a loop of all-reduces while the others wait for it in the
    next one: under algorithms.run_together, and under mpi4py's runner as the README advises."""
    script = str(ROOT / "tests" / "scripts" / "fail_midway.py")
    args = [script] if runner == "run_together" else ["-m", "mpi4py", script, "plain"]
    job = Job(tmp_path, args, env={"FAIL_RANK": "1", "FAIL_AFTER": "20"})
    code, seconds = job.end(timeout=60)
    assert code == 1, job.stderr()
    assert time.monotonic() - job.started < 20
    if runner == "run_together":
        line = re.compile(r"^fail_midway: rank 1: RuntimeError: injected failure after 20 calls "
                          r"\(tests/scripts/fail_midway\.py:\d+\)$", re.M)
        assert line.search(job.stderr()), job.stderr()
        assert "Traceback" not in job.stderr()
    else:
        assert "RuntimeError: injected failure after 20 calls" in job.stderr()


# ------------------------------------------------------------------ thread levels

END_IN_MPI = str(ROOT / "tests" / "scripts" / "end_in_mpi.py")


@pytest.mark.parametrize("level,wait,ranks,aborter", [
    ("single", "python", 3, "MainThread"),  # the signal thread hands the end to the main thread, which aborts
    ("single", "mpi", 2, None),  # the main thread waits inside MPI: the rank ends alone, mpiexec the others
    ("funneled", "mpi", 2, None),
    ("multiple", "mpi", 3, "end-together"),  # the signal thread may call MPI_Abort itself
])
def test_a_signal_ends_every_rank_at_each_thread_level(tmp_path, level, wait, ranks, aborter):
    """SIGTERM to rank 1 while every main thread waits. Below MPI_THREAD_MULTIPLE no thread but
    the main one calls MPI: the script's COMM_WORLD notes which thread of which rank called
    MPI_Abort (MPICH's own "Abort(" line is lost when mpiexec tears the job down first). A rank
    that ends alone leaves its exit status to mpiexec, which mostly reports it at 2 ranks on a node,
    so those cases run 2; where mpiexec's own SIGKILL of the other rank is reaped first, it reports
    9 with its BAD TERMINATION banner instead (docs/benchmark.md), seen on loaded machines."""
    aborts = tmp_path / "aborts.txt"
    job = Job(tmp_path, [END_IN_MPI], ranks=ranks, env={"LEVEL": level, "WAIT": wait, "ABORT_LOG": str(aborts)})
    job.wait_until(lambda: len(job.rank_pids()) == ranks)
    assert f"at MPI_THREAD_{level.upper()}" in job.stdout()
    os.kill(job.rank_pids()[1], signal.SIGTERM)
    code, seconds = job.end(timeout=30)
    killed_first = aborter is None and code == 9  # mpiexec's SIGKILL of rank 0 reaped before rank 1's 143
    assert (code == 143 or killed_first) and seconds < END_BOUND, (code, job.stderr())
    assert "end_in_mpi: rank 1: interrupted by SIGTERM; ending every rank" in job.stderr()
    called = aborts.read_text().splitlines() if aborts.exists() else []
    assert called == ([f"rank 1: {aborter}"] if aborter else []), job.stderr()
    assert "Traceback" not in job.stderr() and ("BAD TERMINATION" in job.stdout()) <= killed_first


def run_tool_at_its_level(tmp_path, *argv):
    """A tool of TOOLS (tests/scripts/end_in_mpi.py, which prints its MPI's thread level) run by
    ``python -m bench``'s main under mpiexec, with train's thread level (``--overlap``)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import bench.tools as t; from bench.__main__ import main; "
            "t.TOOLS['level'] = t.Tool('end_in_mpi', 'the thread level', True, t.overlapping); "
            "sys.exit(main(['level', *sys.argv[2:]]))")
    job = Job(tmp_path, ["-c", code, str(ROOT / "tests" / "scripts"), *argv], ranks=2)
    assert job.end(timeout=60)[0] == 0, job.stderr()
    return sorted(re.findall(r"rank \d+: MPI_THREAD_[A-Z]+", job.stdout()))  # lines of two ranks may interleave


def test_tools_run_at_mpi_thread_single_and_an_overlapping_train_at_serialized(tmp_path):
    assert run_tool_at_its_level(tmp_path, "--algo", "ring") == ["rank 0: MPI_THREAD_SINGLE", "rank 1: MPI_THREAD_SINGLE"]
    assert run_tool_at_its_level(tmp_path, "--overlap", "off,on") == ["rank 0: MPI_THREAD_SERIALIZED",
                                                                      "rank 1: MPI_THREAD_SERIALIZED"]


def test_the_sweep_runs_at_mpi_thread_single_and_says_so(tmp_path):
    document = tmp_path / "sweep.json"
    job = Job(tmp_path, [*SHORT, "--log", "none", "-J", str(document)], ranks=2)
    assert job.end(timeout=60)[0] == 0, job.stderr()
    assert json.loads(document.read_text())["allreduce_bench"]["thread_level"] == "MPI_THREAD_SINGLE"
    assert re.search(r"^# Algorithm: ring .*  MPI: .*  Threads: MPI_THREAD_SINGLE$", job.stdout(), re.M), job.stdout()


# ------------------------------------------------------------------ outputs

@pytest.mark.parametrize("case", ["log-under-a-file", "log-is-a-folder", "json-under-a-file", "json-is-a-folder",
                                  "same-path"])
def test_unwritable_outputs_are_refused_before_the_first_size(tmp_path, case):
    afile = tmp_path / "afile"
    afile.write_text("x")
    log, document = tmp_path / "out" / "sweep.jsonl", tmp_path / "out" / "sweep.json"
    expected = {"log-under-a-file": f"--log {afile}/x.jsonl: cannot write there: part of its folder is a file",
                "log-is-a-folder": f"--log {tmp_path}: cannot write there: Is a directory",
                "json-under-a-file": f"-J {afile}/x.json: cannot write there: part of its folder is a file",
                "json-is-a-folder": f"-J {tmp_path}: cannot write there: Is a directory",
                "same-path": f"-J and --log both name {log}; the JSON document would overwrite the log"}[case]
    if case.startswith("log"):
        log = afile / "x.jsonl" if case == "log-under-a-file" else tmp_path
    elif case.startswith("json"):
        document = afile / "x.json" if case == "json-under-a-file" else tmp_path
    else:
        log.parent.mkdir()
        log.write_text('{"kept": true}\n')
        document = log
    job = Job(tmp_path, [*SHORT, "--log", str(log), "-J", str(document)])
    code, _ = job.end(timeout=60)
    assert code == 2 and time.monotonic() - job.started < 15
    assert one_line(job.stderr()) == f"python -m bench: error: {expected}"
    assert table_rows(job.stdout()) == []
    if case == "same-path":
        assert log.read_text() == '{"kept": true}\n'


def test_the_probe_and_perf_refuse_before_measuring(tmp_path):
    """The other MPI tools check what they will write, and the settings, first."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    job = Job(tmp_path, ["-m", "topology", "probe", "-o", str(afile / "p.json")])
    assert job.end(timeout=60)[0] == 2 and time.monotonic() - job.started < 15
    assert one_line(job.stderr()) == f"python -m topology probe: error: -o {afile}/p.json: cannot write there: part of its folder is a file"
    job = Job(tmp_path, ["-m", "bench", "perf", "-o", str(afile / "perf")])
    assert job.end(timeout=60)[0] == 2
    assert one_line(job.stderr()) == f"python -m bench perf: error: {afile}/perf.json: cannot write there: part of its folder is a file"
    job = Job(tmp_path, ["-m", "bench", "perf"], env={"ALLREDUCE_SHM_SLOT_BYTES": "100"})
    assert job.end(timeout=60)[0] == 2
    assert one_line(job.stderr()) == ("python -m bench perf: error: ALLREDUCE_SHM_SLOT_BYTES='100' is below its lower "
                                      "bound, 256 B (on ranks 0, 1, 2)")


def mount_tmpfs(folder, options):
    folder.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


@pytest.fixture
def mounts(tmp_path):
    made = []
    yield made
    for folder in made:
        subprocess.run(["umount", "-l", str(folder)])


def test_a_read_only_file_system_is_refused(tmp_path, mounts):
    ro = tmp_path / "ro"
    mount_tmpfs(ro, "ro,size=1m")
    mounts.append(ro)
    job = Job(tmp_path, [*SHORT, "--log", str(ro / "x.jsonl")])
    code, _ = job.end(timeout=60)
    assert code == 2
    assert one_line(job.stderr()) == f"python -m bench: error: --log {ro}/x.jsonl: cannot write there: Read-only file system"


def test_a_disk_that_fills_mid_run_ends_every_rank_and_keeps_whole_rows(tmp_path, mounts):
    full = tmp_path / "full"
    mount_tmpfs(full, "size=64k")
    mounts.append(full)
    log, document = full / "sweep.jsonl", full / "sweep.json"
    job = Job(tmp_path, ["-m", "bench", "-b", "1024", "-e", "4194304", "-i", "1024", "-n", "2", "-w", "0",
                         "--algo", "ring", "--quiet", "--log", str(log), "-J", str(document)])
    code, _ = job.end(timeout=120)
    assert code == 1, job.stderr()
    assert re.search(rf"^python -m bench: rank 0: OSError: \[Errno 28\] No space left on device: '{full}/sweep\.jsonl?' "
                     r"\(bench/formats/results\.py:\d+\)$", job.stderr(), re.M), job.stderr()
    rows = [json.loads(line) for line in lines_of(log)]  # whole rows only: a cut one was taken back
    saved = json.loads(document.read_text())["results"]
    assert len(rows) >= 3 and [r["size"] for r in saved] == [r["size"] for r in rows[:len(saved)]]
    assert len(rows) - len(saved) in (0, 1)


def test_an_append_starts_on_a_fresh_line_and_a_cut_row_is_skipped(tmp_path):
    from bench.formats.results import read_results

    log = tmp_path / "sweep.jsonl"
    log.write_text('{"algorithm": "ring", "size": 1, "out_of_place": {}, "in_place": {}}\n{"algorithm": "ri')
    job = Job(tmp_path, [*SHORT, "--log", str(log)])
    assert job.end(timeout=60)[0] == 0, job.stderr()
    lines = lines_of(log)
    assert lines[1] == '{"algorithm": "ri' and len(lines) == 2 + 2
    assert [json.loads(line)["size"] for line in lines[2:]] == [8192, 65536]
    assert [r["size"] for r in read_results(log)] == [1, 8192, 65536]


def test_output_files_honour_the_umask(tmp_path):
    log, document, probe = tmp_path / "sweep.jsonl", tmp_path / "sweep.json", tmp_path / "probe.json"
    job = Job(tmp_path, [*SHORT, "--log", str(log), "-J", str(document)], umask=0o027)
    assert job.end(timeout=60)[0] == 0, job.stderr()
    job = Job(tmp_path, ["-m", "topology", "probe", "-o", str(probe), "-b", "64K", "--reps", "1"], umask=0o027)
    assert job.end(timeout=60)[0] == 0, job.stderr()
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in (log, document, probe)} == {
        "sweep.jsonl": "0o640", "sweep.json": "0o640", "probe.json": "0o640"}


def test_json_is_rewritten_after_every_size(tmp_path):
    """Read while the sweep runs, -J always parses and holds the rows logged so far (the one
    being saved at that moment aside: the log takes it first)."""
    job, log, document = started_sweep(tmp_path)
    seen = set()
    while len(seen) < 4 and job.proc.poll() is None:
        logged = len(lines_of(log))
        saved = len(json.loads(document.read_text())["results"])  # atomic: never half a file
        assert logged - 1 <= saved <= len(lines_of(log))
        seen.add(saved)
        time.sleep(0.01)
    job.kill()
    assert len(seen) >= 4


# ------------------------------------------------------------------ settings

SETTINGS = {"ALLREDUCE_TRANSPORT": "direct", "ALLREDUCE_CUDA_AWARE": "1", "ALLREDUCE_SEGMENT_BYTES": "65536",
            "ALLREDUCE_STAGE_BYTES": "4096", "ALLREDUCE_SHM_SLOT_BYTES": "65536", "ALLREDUCE_IPC_SLOT_BYTES": "65536",
            "ALLREDUCE_SHM_MIN_BYTES": "1024", "ALLREDUCE_SHM_MAX_BYTES": "100", "ALLREDUCE_IPC_MIN_BYTES": "64",
            "ALLREDUCE_IPC_MAX_BYTES": "4096", "ALLREDUCE_SHM_BY_PAGES": "1", "ALLREDUCE_NODE_MAP": "0,0,1",
            "ALLREDUCE_HIER_ACROSS": "bamtree", "ALLREDUCE_ONESHOT_BYTES": "4096", "ALLREDUCE_TWOSHOT_BYTES": "4096",
            "ALLREDUCE_KERNEL_COPY": "0",
            "ALLREDUCE_RADIX": "3", "ALLREDUCE_TUNING_FILE": "results/tuning-elsewhere-3r.json",
            "ALLREDUCE_BF16_KERNEL": "ml_dtypes", "ALLREDUCE_ENGINE": "python", "ALLREDUCE_COMPILED_BYTES": "4096"}


def test_every_wire_setting_is_listed_here():
    from algorithms.settings import WIRE

    assert set(SETTINGS) == set(WIRE)


def test_every_setting_on_one_rank_alone_is_refused_on_every_rank(tmp_path):
    """Every wire setting given to rank 0 alone: one line that names each of them, exit 2, on
    every rank (the check compares them all in one collective and reports every difference)."""
    python = [sys.executable, *SHORT, "--log", "none"]
    on_rank_0 = [arg for variable, value in SETTINGS.items() for arg in ("-env", variable, value)]
    command = [mpiexec(), "-n", "1", *on_rank_0, *python, ":", "-n", str(RANKS - 1), *python]
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    job = Job(tmp_path, None, command=command, env=env)
    code, _ = job.end(timeout=60)
    assert code == 2 and time.monotonic() - job.started < 15
    line = one_line(job.stderr()).removeprefix("python -m bench: error: ")
    assert not line.startswith("python"), job.stderr()
    for variable, value in SETTINGS.items():
        assert re.search(rf"(^|; ){variable} differs between ranks: '{re.escape(value)}' on rank 0; "
                         rf"unset \(default [^)]+\) on ranks 1, 2(;|$)", line), (variable, line)
    assert line.count("differs between ranks") == len(SETTINGS), line


BAD_SETTINGS = {
    "ALLREDUCE_SEGMENT_BYTES": ("1", "ALLREDUCE_SEGMENT_BYTES='1' is below its lower bound, 4 KiB"),
    "ALLREDUCE_SHM_SLOT_BYTES": ("1000", "ALLREDUCE_SHM_SLOT_BYTES=1000 must be a multiple of 64"),
    "ALLREDUCE_STAGE_BYTES": ("lots", "ALLREDUCE_STAGE_BYTES='lots' must be a positive number of bytes"),
    "ALLREDUCE_TRANSPORT": ("pigeon", "ALLREDUCE_TRANSPORT='pigeon' is not one of auto, direct, staged, shm"),
    "ALLREDUCE_RADIX": ("1", "ALLREDUCE_RADIX='1' must be from 2 to 64")}


def test_bad_settings_are_one_line_and_exit_2(tmp_path):
    """Five invalid settings at once: one line naming each, in the settings' own order, exit 2."""
    from algorithms.settings import WIRE

    job = Job(tmp_path, [*SHORT, "--log", "none"], env={k: value for k, (value, _) in BAD_SETTINGS.items()})
    assert job.end(timeout=60)[0] == 2
    messages = [f"{BAD_SETTINGS[name][1]} (on ranks 0, 1, 2)" for name in WIRE if name in BAD_SETTINGS]
    assert one_line(job.stderr()) == "python -m bench: error: " + "; ".join(messages)


BAD_TUNING = {
    "not-json": ("{not json", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
                              "(char 1))"),
    "missing": (None, "cannot be read (No such file or directory)"),
    "a-folder": ("", "cannot be read (Is a directory)"),
    "not-a-table": ('{"schema": "other"}', "not a tuning table (schema 'allreduce-tuning/1'; python -m bench tune "
                                           "writes them)"),
    "rules-not-a-list": ('{"schema": "allreduce-tuning/1", "rules": 3}', "its rules are not a list of objects"),
}


@pytest.mark.parametrize("tool, case", [*(("sweep", case) for case in sorted(BAD_TUNING)),
                                        ("perf", "not-json"), ("perf", "a-folder")])
def test_a_bad_tuning_file_is_one_line_and_exit_2(tmp_path, case, tool):
    """ALLREDUCE_TUNING_FILE that auto would read: refused before the first size on every rank
    (every case under the sweep; under perf, which reads it through the same loader, a file
    that is not JSON and one that cannot be read)."""
    content, problem = BAD_TUNING[case]
    path = tmp_path / "tuning.json"
    if content == "":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    args = [*SHORT, "--algo", "ring,auto", "--log", "none"] if tool == "sweep" else [
        "-m", "bench", "perf", "-o", str(tmp_path / "perf")]
    job = Job(tmp_path, args, env={"ALLREDUCE_TUNING_FILE": str(path)})
    assert job.end(timeout=60)[0] == 2 and time.monotonic() - job.started < 15
    prog = "python -m bench" + (" perf" if tool == "perf" else "")
    assert one_line(job.stderr()) == f"{prog}: error: ALLREDUCE_TUNING_FILE: {path}: {problem}"
    assert table_rows(job.stdout()) == []


# ------------------------------------------------------------------ topology files, memory, the silent ones

BAD_TOPOLOGIES = {
    "not-json": ("{not json", r"is not valid JSON"),
    "huge-integer": ('{"bandwidth_GBps": [[0, 1%s], [1, 0]]}' % ("0" * 400),
                     r"bandwidth_GBps\[0\]\[1\] is an integer of 401 digits, too large"),
    "hosts-a-number": ('{"bandwidth_GBps": [[0, 1], [1, 0]], "hosts": 5}', r"'hosts' must be a list of host names"),
    "deep-nesting": ("[" * 100000 + "]" * 100000, r"nested too deeply"),
    "ranks-a-string": ('{"bandwidth_GBps": [[0, 1], [1, 0]], "ranks": "2"}', r"'ranks' is a string '2', not an integer"),
    "implausible": ('{"bandwidth_GBps": [[0, 1e308], [1, 0]]}',
                    r"bandwidth_GBps\[0\]\[1\] is 1e\+308, above the largest plausible bandwidth, 100000 GB/s"),
    "numeric-string": ('{"bandwidth_GBps": [[0, "5"], [1, 0]]}', r"bandwidth_GBps\[0\]\[1\] is a string '5', not a number"),
    "boolean": ('{"bandwidth_GBps": [[0, true], [1, 0]]}', r"bandwidth_GBps\[0\]\[1\] is a boolean True, not a number"),
    "infinite": ('{"bandwidth_GBps": [[0, 1e400], [1, 0]]}', r"bandwidth_GBps\[0\]\[1\] is inf, not a finite number"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOPOLOGIES))
def test_a_bad_topology_file_is_one_line_and_exit_2(tmp_path, case):
    """Under the sweep (bamtree or kmtree: the file is checked before either builds its tree)
    and under 'topology tree' (the methods in turn), the same line."""
    text, pattern = BAD_TOPOLOGIES[case]
    path = tmp_path / "topology.json"
    path.write_text(text)
    algo = "kmtree" if sorted(BAD_TOPOLOGIES).index(case) % 2 else "bamtree"
    job = Job(tmp_path, [*SHORT[:-3], "--algo", algo, "--quiet", "--topology", str(path), "--log", "none"], ranks=2)
    assert job.end(timeout=60)[0] == 2
    line = one_line(job.stderr())
    assert line.startswith(f"python -m bench: error: --topology: bandwidth matrix {path}") and re.search(pattern, line), line
    method = ("bam", "km", "binomial")[sorted(BAD_TOPOLOGIES).index(case) % 3]  # one loader reads for all three
    proc = subprocess.run([sys.executable, "-m", "topology", "tree", str(path), "--method", method], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and re.search(pattern, one_line(proc.stderr)), proc.stderr


def test_a_size_that_cannot_fit_is_refused_before_allocating(tmp_path):
    job = Job(tmp_path, ["-m", "bench", "-b", "64G", "-e", "64G", "--algo", "ring", "--log", "none"], ranks=2)
    assert job.end(timeout=60)[0] == 2 and time.monotonic() - job.started < 15
    assert re.fullmatch(r"python -m bench: error: the largest size, 68719476736 B, needs 896\.\d GiB on \S+: "
                        r"2 ranks x 448\.\d GiB each, but \d+\.\d GiB is available there; use a smaller -e, or fewer "
                        r"ranks per node", one_line(job.stderr())), job.stderr()


def test_avg_on_integers_alone_is_an_error(tmp_path):
    job = Job(tmp_path, [*SHORT, "-o", "avg", "-d", "int32", "--log", "none"])
    assert job.end(timeout=60)[0] == 2
    assert one_line(job.stderr()) == ("python -m bench: error: -o avg -d int32 leaves nothing to measure: avg is "
                                      "defined for floating-point types only (-d half, float, double, bfloat16, f8e4m3, f8e5m2)")


def test_a_timeout_ends_every_rank_with_exit_3(tmp_path):
    log, document = tmp_path / "sweep.jsonl", tmp_path / "sweep.json"
    job = Job(tmp_path, [*SHORT, "-T", "1e-6", "--log", str(log), "-J", str(document)])
    code, _ = job.end(timeout=60)
    assert code == 3 and time.monotonic() - job.started < 15
    assert re.search(r"^python -m bench: rank 0: timeout: ring float32 sum 8192 B ran over 1e-06 s \(-T\); "
                     r"ending every rank$", job.stderr(), re.M), job.stderr()
    assert table_rows(job.stdout()) == [] and lines_of(log) == []
    assert json.loads(document.read_text())["results"] == []


# ------------------------------------------------------------------ MPICH's leftovers

def shm_files():
    return {p for p in os.listdir("/dev/shm") if p.startswith("mpich_shm_")}


@pytest.fixture(autouse=True)
def no_leftovers():
    """The jobs these tests abort leave MPICH's files behind: remove this test's afterwards."""
    started = int(time.time())
    yield
    subprocess.run([str(ROOT / "jobs" / "clean-shm.sh"), str(started), "5"], capture_output=True, timeout=60)


def test_the_clean_up_leaves_the_files_of_a_running_job_alone(tmp_path):
    before = shm_files()
    job, log, document = started_sweep(tmp_path)
    mine = shm_files() - before
    proc = subprocess.run([str(ROOT / "jobs" / "clean-shm.sh"), "0", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and mine and mine <= shm_files(), proc.stdout
    rows = len(lines_of(log))
    job.wait_until(lambda: len(lines_of(log)) > rows)  # the job still runs, on its files
    job.kill()


def test_the_clean_up_removes_at_once_what_only_this_jobs_ranks_map():
    """A time limit's SIGKILL follows its SIGTERM within seconds: a file that only processes with
    this job's tag still map goes at once, and one that another process maps stays."""
    holder = ("import mmap, os, sys, time\n"
              "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); os.ftruncate(fd, 4096)\n"
              "view = mmap.mmap(fd, 4096); print('mapped', flush=True); time.sleep(60)\n")
    name = f"/dev/shm/mpich_shm_test{os.getpid()}_0"
    clean = [str(ROOT / "jobs" / "clean-shm.sh"), str(int(time.time()) - 1), "0"]
    proc = subprocess.Popen([sys.executable, "-c", holder, name], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CLEAN_SHM_TAG": "job-a"})
    try:
        assert proc.stdout.readline().strip() == "mapped"
        other = subprocess.run(clean, env={**os.environ, "CLEAN_SHM_TAG": "job-b"}, capture_output=True, text=True,
                               timeout=60)
        assert os.path.exists(name), other.stderr  # mapped by a process of another job: left alone
        untagged = subprocess.run(clean, env={k: v for k, v in os.environ.items() if k != "CLEAN_SHM_TAG"},
                                  capture_output=True, text=True, timeout=60)
        assert os.path.exists(name), untagged.stderr
        ours = subprocess.run(clean, env={**os.environ, "CLEAN_SHM_TAG": "job-a"}, capture_output=True, text=True,
                              timeout=60)
        assert not os.path.exists(name) and f"clean-shm: removed {name}" in ours.stdout, ours.stdout + ours.stderr
        assert proc.poll() is None  # the process that maps it runs on, undisturbed
    finally:
        proc.kill()
        proc.wait()
        if os.path.exists(name):
            os.unlink(name)


def test_the_job_scripts_remove_the_shared_memory_an_aborted_run_leaves(tmp_path):
    before = shm_files()
    job = Job(tmp_path, [*SHORT, "-T", "1e-6", "--log", "none"])
    assert job.end(timeout=60)[0] == 3
    left = shm_files() - before
    for name in left:
        os.unlink(f"/dev/shm/{name}")
    assert left, "an aborted run leaves MPICH's files (so the scripts' clean-up has something to do)"
    env = {"RANKS": "2", "VENV": os.path.dirname(os.path.dirname(sys.executable)), "RESULTS": str(tmp_path / "run"),
           "MIN_BYTES": "8K", "MAX_BYTES": "64K", "FACTOR": "8", "ITERS": "3", "WARMUP": "1", "ALGOS": "ring"}
    before = shm_files()
    proc = subprocess.run(["bash", str(ROOT / "jobs/slurm/cpu-sweep.sbatch"), "-T", "1e-6"], cwd=ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "clean-shm: removed /dev/shm/mpich_shm_" in proc.stderr
    assert shm_files() - before == set()
