"""A real ``mpiexec`` job under test: started, watched, and ended with every process under it
accounted for; its numbers go to ``$FAULTS_REPORT`` for ``tests/scripts/reliability_report.py``."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, mpiexec

RANKS = 3


def report(**numbers):
    """Append this case's numbers to $FAULTS_REPORT (JSON lines) when it is set, for
    tests/scripts/reliability_report.py."""
    path = os.environ.get("FAULTS_REPORT")
    if path:
        case = os.environ.get("PYTEST_CURRENT_TEST", "? (call)").rsplit(" ", 1)[0].split("::")[-1]
        with open(path, "a") as f:
            f.write(json.dumps({"case": case, **numbers}) + "\n")


def descendants(pid):
    """Every live process below ``pid`` (the launcher's proxies and the ranks)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Job:
    """One ``mpiexec -n RANKS python ARGS`` (or a whole command) with its output in files."""

    def __init__(self, tmp_path, args, ranks=RANKS, env=None, command=None, umask=None):
        self.out, self.err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        command = command or [mpiexec(), "-n", str(ranks), sys.executable, *args]
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=out,
                                         stderr=err, start_new_session=True,
                                         preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
        self.started = time.monotonic()
        self.processes = []

    def stdout(self):
        return self.out.read_text()

    def stderr(self):
        return self.err.read_text()

    def wait_until(self, condition, timeout=60):
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"the condition never held (exit {self.proc.returncode})\n{self.stderr()[-2000:]}")
            time.sleep(0.02)
        self.processes = descendants(self.proc.pid)

    def rank_pids(self):
        """{rank: pid} from the table header's "Using devices" lines."""
        return {int(r): int(p) for r, p in re.findall(r"#\s+Rank\s+(\d+) Group\s+\d+ Pid\s+(\d+)", self.stdout())}

    def end(self, timeout):
        """(exit code, seconds from the mark) once mpiexec and every process under it are gone."""
        self.processes = self.processes or descendants(self.proc.pid)
        mark = time.monotonic()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running {timeout} s later (a hang)\n{self.stderr()[-2000:]}")
        while any(alive(p) for p in self.processes) and time.monotonic() - mark < timeout:
            time.sleep(0.02)
        left = [p for p in self.processes if alive(p)]
        self.kill()
        seconds = time.monotonic() - mark
        report(code=code, seconds_to_end=round(seconds, 3), seconds_in_all=round(time.monotonic() - self.started, 3),
               outlived=len(left), stderr=self.stderr()[-400:])
        assert left == [], f"processes outlived mpiexec: {left}"
        return code, seconds

    def kill(self):
        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def table_rows(text):
    """The table's data rows (size, count, ...) in the order printed."""
    return [line for line in text.splitlines() if line.strip() and line.split()[0].isdigit()]


def lines_of(path):
    return path.read_text().splitlines() if path.exists() else []


def one_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]
