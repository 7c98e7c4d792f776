"""A new algorithm is one module and one registry line, a new baseline one module and one table
entry: each then shows wherever the suite lists them, with nothing else edited.

Each test copies the code (plumbing/, algorithms/, topology/, bench/) into a folder of its own, adds the
module and the line there, and runs the copy (first on PYTHONPATH) as a user would, under a real
mpiexec where it measures.
"""

import os
import re
import shutil
import subprocess
import sys

from conftest import ROOT, mpiexec

TRIVIAL_ALGORITHM = '''"""A trivial all-reduce, for the test of the registry: recursive doubling's plan under another name."""

from . import recursive_doubling
from ..algorithm import Algorithm
from ..runtime import engine


def steps(size, rank, count, itemsize):
    return recursive_doubling.steps(size, rank, count, itemsize)


def allreduce(coll, sendbuf, recvbuf):
    engine.run(coll, steps, sendbuf, recvbuf)


ALGORITHM = Algorithm("trivial", allreduce, schedule=recursive_doubling.schedule, steps=steps)
'''

TRIVIAL_BASELINE = '''"""A trivial baseline, for the test of the baselines' table: the MPI library's collective under another name."""

from .base import Baseline


class EchoBaseline(Baseline):
    family = "echo"
    help = "echo (the test's baseline: MPI's own collective under another name)"

    def runner(self, spec, name, comm, op):
        return spec.run_mpi(comm, op)

    def transport(self, name, xp):
        return "the test's echo baseline"
'''


def copy_of_the_code(tmp_path):
    code = tmp_path / "code"
    for package in ("plumbing", "algorithms", "topology", "bench"):
        shutil.copytree(ROOT / package, code / package, ignore=shutil.ignore_patterns("__pycache__"))
    return code


def add_line(path, after, line):
    """Insert ``line`` after the first line of ``path`` that starts with ``after``."""
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, text in enumerate(lines) if text.startswith(after))
    lines.insert(index + 1, line + "\n")
    path.write_text("".join(lines))


def run(code, args, ranks=None, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(code)}
    command = ([mpiexec(), "-n", str(ranks)] if ranks else []) + [sys.executable, *args]
    proc = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_an_algorithm_is_one_module_and_one_registry_line(tmp_path):
    code = copy_of_the_code(tmp_path)
    (code / "algorithms" / "catalog" / "trivial.py").write_text(TRIVIAL_ALGORITHM)
    registry = code / "algorithms" / "registry.py"
    add_line(registry, "from .catalog import", "from .catalog import trivial")
    add_line(registry, "REGISTERED = {", '    trivial.ALGORITHM,')
    assert "trivial" not in run(ROOT, ["-m", "bench", "--help"])  # the original does not know it
    assert re.search(r"comma list of [a-z,]*\btrivial\b", " ".join(run(code, ["-m", "bench", "--help"]).split()))
    swept = run(code, ["-m", "bench", "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-w", "1", "--algo", "all",
                       "--log", "none"], ranks=2)
    assert "# Algorithm: trivial " in swept and swept.count("# Out of bounds values : 0 OK") == swept.count("# Algorithm:")
    modelled = run(code, ["-m", "bench", "model", "--ranks", "6", "-b", "1M", "-e", "1M"])
    rows = {line.split()[2]: line.split() for line in modelled.splitlines() if re.match(r"\s*\S+ \S+\s+trivial\b", line)}
    assert "trivial" in rows, modelled
    rd = next(line.split() for line in modelled.splitlines() if re.match(r"\s*\S+ \S+\s+rd\b", line))
    assert rows["trivial"][3:] == rd[3:]  # rd's schedule: rd's time, busbw and limit
    candidates = run(code, ["-c", "import algorithms; print(','.join(algorithms.auto.candidates()))"])
    assert "trivial" in candidates.strip().split(",")
    planned = run(code, ["-m", "bench", "plan", "--algo", "trivial", "-n", "4"])
    assert "sendrecv" in planned and "# modelled time 10.00 us" in planned, planned  # rd's 2 steps of 5 us


def test_a_baseline_is_one_module_and_one_table_entry(tmp_path):
    code = copy_of_the_code(tmp_path)
    (code / "bench" / "baselines" / "echo.py").write_text(TRIVIAL_BASELINE)
    table = code / "bench" / "baselines" / "__init__.py"
    add_line(table, "from .base import", "from .echo import EchoBaseline")
    text = table.read_text().replace("GlooBaseline())", "GlooBaseline(), EchoBaseline())")
    table.write_text(text)
    assert "echo" in " ".join(run(code, ["-m", "bench", "--help"]).split())
    swept = run(code, ["-m", "bench", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1", "--algo", "ring,echo",
                       "--log", "none"], ranks=2)
    assert "# Algorithm: echo " in swept and "# Transport: the test's echo baseline" in swept
    assert swept.count("# Out of bounds values : 0 OK") == 2
    assert re.search(r"^#\s+size\s+ring\s+echo$", swept, re.M), swept  # in the summary, as a baseline is
    env = {**os.environ, "PYTHONPATH": str(code)}
    proc = subprocess.run([mpiexec(), "-n", "1", sys.executable, "-m", "bench", "--algo", "nothere", "--log", "none"],
                          cwd=code, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and re.search(r"choices: .*\becho\b", proc.stderr), proc.stderr
