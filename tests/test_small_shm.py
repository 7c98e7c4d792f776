"""A container's small ``/dev/shm``: every case ends exact with the fallback said, or with exit 2
and one line naming ``/dev/shm``, within seconds, on every rank; none ends by a signal.

Each job runs in a mount namespace of its own with a tmpfs of the given size on ``/dev/shm``
(``unshare -m``, then ``mount -t tmpfs -o size=S``), as Docker (64 MiB by default) and
Kubernetes give containers; with MPICH's default network module (UCX), as users run it.
Needs root and ``unshare``; skips with the reason otherwise. results/reliability.md lists the
cases with their timings.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import mpiexec
from mpi_jobs import Job, one_line, table_rows

END_BOUND = 15.0  # seconds for a whole job of these (they start MPI and stop before measuring much)
PYTHON = [sys.executable]


def _can_unshare():
    if os.geteuid() != 0:
        return "needs root (a mount namespace with a tmpfs on /dev/shm)"
    if not shutil.which("unshare"):
        return "needs unshare (util-linux)"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                          capture_output=True, text=True)
    return None if proc.returncode == 0 else f"cannot mount a tmpfs on /dev/shm in a namespace: {proc.stderr.strip()}"


pytestmark = pytest.mark.skipif(_can_unshare() is not None, reason=str(_can_unshare()))


def in_small_shm(tmp_path, size, ranks, args, env=None):
    """A :class:`Job` of ``mpiexec -n RANKS python ARGS`` with a ``size`` tmpfs on ``/dev/shm``."""
    inner = [mpiexec(), "-n", str(ranks), *PYTHON, *args]
    # MPICH's default network module (UCX), as users run it: the conftest loads OFI for the other suites
    shell = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && unset MPIR_CVAR_CH4_NETMOD && exec "$@"'
    return Job(tmp_path, None, env=env, command=["unshare", "-m", "sh", "-c", shell, "sh", *inner])


def ended(job, code):
    """The job's exit ``code`` (never a signal's, 128+N), within :data:`END_BOUND` of its start."""
    got, _ = job.end(timeout=60)
    assert got == code, f"exit {got}, expected {code}\n{job.stderr()[-3000:]}"
    assert time.monotonic() - job.started < END_BOUND
    return job


def sweep(*extra):
    return ["-m", "bench", "-f", "16", "-n", "3", "-w", "1", "--log", "none", *extra]


@pytest.mark.parametrize("size, sizes", [("64m", ["-b", "1M", "-e", "256M"]), ("4m", ["-b", "1K", "-e", "16M"])])
def test_registered_vectors_that_cannot_fit_are_refused_before_the_first_size(tmp_path, size, sizes):
    job = ended(in_small_shm(tmp_path, size, 2, sweep(*sizes, "--algo", "ring,dbtree", "-R", "1")), 2)
    line = [text for text in job.stderr().splitlines() if "error" in text]
    assert len(line) == 1, job.stderr()
    assert line[0].startswith("python -m bench: error: -R 1 at the largest size"), line
    largest = 5 * (256 if size == "64m" else 4) * 2  # MiB: 5 registered vectors of the largest size, 2 ranks
    for words in (f"needs {largest:.1f} MiB of /dev/shm", "MiB is free there", "--shm-size", "-R 0"):
        assert words in line[0], line
    assert table_rows(job.stdout()) == []


def test_a_registered_vector_that_cannot_fit_raises_on_every_rank(tmp_path):
    """128 MiB a rank in a 64 MiB /dev/shm: MemoryError (ShmTooSmall) on both ranks, naming
    /dev/shm, the bytes and the fix; nothing is lost, so the job goes on and all-reduces."""
    script = tmp_path / "register.py"
    script.write_text(
        "import numpy as np\nfrom mpi4py import MPI\nimport algorithms\nsaid = []\n"
        "try:\n    algorithms.alloc_registered(32 << 20, 'float32')\n"
        "except MemoryError as exc:\n    said.append(f'rank {MPI.COMM_WORLD.rank}: {type(exc).__name__}: {exc}')\n"
        "x = np.ones(1 << 16, np.float32)\nalgorithms.allreduce(x, algorithm='ring')\n"
        "said.append(f'rank {MPI.COMM_WORLD.rank}: sum {int(x[0])}')\n"
        "everyone = MPI.COMM_WORLD.gather(said)\n"
        "if everyone:\n    print('\\n'.join(line for lines in everyone for line in lines), flush=True)\n")
    job = ended(in_small_shm(tmp_path, "64m", 2, ["-m", "mpi4py", str(script)]), 0)
    out = job.stdout().splitlines()
    for rank in (0, 1):
        said = [line for line in out if line.startswith(f"rank {rank}: ShmTooSmall: ")]
        assert len(said) == 1, out
        assert "a registered vector of 128.0 MiB needs 256.0 MiB of /dev/shm" in said[0]
        assert "--shm-size" in said[0]
        assert f"rank {rank}: sum 2" in out


def test_a_window_that_tmpfs_cannot_back_is_an_error_not_sigbus(tmp_path):
    """/dev/shm filling between the check and the use: the window is touched at once and the
    failure is an error on every rank (here the check is skipped and 16 MiB a rank asked of 8)."""
    script = tmp_path / "touch.py"
    script.write_text(
        "from mpi4py import MPI\nimport algorithms\nfrom algorithms.runtime.transports.shared_windows import allocate_touched\n"
        "world = MPI.COMM_WORLD\nnode = world.Split_type(MPI.COMM_TYPE_SHARED)\n"
        "said = []\ntry:\n    allocate_touched(world, node, 16 << 20, 1, 'a test window')\n"
        "except MemoryError as exc:\n    said.append(f'rank {world.rank}: {exc}')\n"
        "win = allocate_touched(world, node, 1 << 20, 1, 'a window that fits')\n"
        "said.append(f'rank {world.rank}: fits')\nwin.Free()\neveryone = world.gather(said)\n"
        "if everyone:\n    print('\\n'.join(line for lines in everyone for line in lines), flush=True)\n")
    job = ended(in_small_shm(tmp_path, "8m", 2, ["-m", "mpi4py", str(script)]), 0)
    for rank in (0, 1):
        said = [line for line in job.stdout().splitlines() if line.startswith(f"rank {rank}: a test window")]
        assert len(said) == 1 and "could not be backed by /dev/shm" in said[0] and "EFAULT" in said[0], job.stdout()
        assert f"rank {rank}: fits" in job.stdout()


def test_the_transport_falls_back_to_mpi_and_says_so(tmp_path):
    """4 MiB: the slots and oneshot's window do not fit; every table exact, the fallback in the
    header, in the JSON and once on stderr."""
    document = tmp_path / "sweep.json"
    job = ended(in_small_shm(tmp_path, "4m", 2, sweep("-b", "1K", "-e", "16M", "--algo", "ring,dbtree,oneshot",
                                                       "-J", str(document))), 0)
    out = job.stdout()
    assert out.count("# Out of bounds values : 0 OK") == 3 and len(table_rows(out)) == 12  # 1K, 16K, 256K, 4M
    headers = [line for line in out.splitlines() if line.startswith("# Transport:")]
    assert len(headers) == 3 and all(line.startswith("# Transport: MPI; no shared memory: the shared-memory "
                                                     "transport") for line in headers), headers
    assert "oneshot runs recursive doubling: no shared memory for its window" in headers[2]
    warnings = [line for line in job.stderr().splitlines() if line.startswith("allreduce: warning: no shared memory")]
    assert len(warnings) == 1 and "--shm-size" in warnings[0], job.stderr()
    rows = json.loads(document.read_text())["results"]
    assert len(rows) == 12 and all("no shared memory" in row["transport"] for row in rows)
    env_lines = [line.split() for line in out.splitlines() if line.startswith("# Env: ")]
    assert env_lines and all("UCX_TLS=^posix" in line for line in env_lines)  # UCX's shared memory off before MPI_Init


def test_twoshot_runs_the_ring_where_its_window_does_not_fit(tmp_path):
    """10 MiB, 2 ranks: the slots fit, twoshot's window (two 1 MiB boxes a rank) does not; it
    runs the ring, exact, and says so in its header and once on stderr."""
    job = ended(in_small_shm(tmp_path, "10m", 2, sweep("-b", "1K", "-e", "4M", "--algo", "ring,twoshot")), 0)
    out = job.stdout()
    assert out.count("# Out of bounds values : 0 OK") == 2
    headers = [line for line in out.splitlines() if line.startswith("# Transport: shared-memory within a node")]
    assert len(headers) == 2 and "no shared memory" not in headers[0], headers
    assert "twoshot runs ring: no shared memory for its window (twoshot's window needs" in headers[1]
    warnings = [line for line in job.stderr().splitlines() if line.startswith("allreduce: warning: twoshot runs ring")]
    assert len(warnings) == 1, job.stderr()


def test_where_it_fits_the_shared_memory_transport_runs_exact(tmp_path):
    """16 MiB, 3 ranks: where UCX itself failed MPI_Init (SIGSEGV) before its transport was
    turned off; the slots fit, every algorithm exact."""
    job = ended(in_small_shm(tmp_path, "16m", 3, sweep("-b", "1K", "-e", "16M", "--algo", "ring,tree,hier,oneshot")), 0)
    out = job.stdout()
    assert out.count("# Out of bounds values : 0 OK") == 4 and len(table_rows(out)) == 16
    assert out.count("# Transport: shared-memory within a node") == 4, out
    assert "no shared memory" not in out + job.stderr()


def test_a_dev_shm_too_small_for_mpi_itself_is_one_line_and_exit_2(tmp_path):
    job = ended(in_small_shm(tmp_path, "2m", 3, sweep("-b", "1K", "-e", "1M", "--algo", "ring")), 2)
    assert one_line(job.stderr()).startswith("python -m bench: error: /dev/shm on ")
    assert "is 2.0 MiB; MPI needs about 4.0 MiB of it for the 3 ranks there" in job.stderr()
    assert "--shm-size" in job.stderr()


def test_a_dev_shm_filled_mid_run_ends_every_rank_with_exit_2_and_keeps_the_rows(tmp_path):
    """Another job fills /dev/shm (all but 4 MiB) after the first size: a later size's registered
    vectors are refused on every rank (exit 2, one line), and the finished rows stay in the log."""
    log = tmp_path / "sweep.jsonl"
    inner = [mpiexec(), "-n", "2", *PYTHON, *sweep("-b", "1M", "-e", "8M", "-f", "2", "--algo", "ring", "-R", "1")]
    inner[inner.index("--log") + 1] = str(log)
    filler = (f"while ! grep -q . {log} 2>/dev/null; do sleep 0.02; done; "
              "until fallocate -l $(($(stat -f -c '%a*%S' /dev/shm) - (4 << 20))) /dev/shm/another-job 2>/dev/null; "
              "do sleep 0.01; done")  # the free space moves as the ranks allocate
    shell = (f'mount -t tmpfs -o size=96m tmpfs /dev/shm && unset MPIR_CVAR_CH4_NETMOD && ({filler}) & '
             'exec "$@"')
    job = ended(Job(tmp_path, None, command=["unshare", "-m", "sh", "-c", shell, "sh", *inner]), 2)
    errors = [line for line in job.stderr().splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("python -m bench: error: a registered vector of "), job.stderr()
    assert "/dev/shm" in errors[0] and "--shm-size" in errors[0]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert 1 <= len(rows) < 4 and [row["size"] for row in rows] == [1 << 20, 2 << 20, 4 << 20][:len(rows)]
    assert len(table_rows(job.stdout())) == len(rows)
