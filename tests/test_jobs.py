"""jobs/: the workstation launcher, and the Slurm batch scripts submitted with `sbatch --wait`
to a real single-node Slurm cluster (slurmctld + slurmd) that these tests bring up and tear down."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

JOBS = ROOT / "jobs"
SCRIPTS = sorted([*JOBS.glob("*.sh"), *JOBS.glob("slurm/*.sbatch"), *JOBS.glob("cluster/*.sh"), *JOBS.glob("lab/*.sh"),
                  ROOT / "bench" / "gpu_check.sh", ROOT / "bench" / "gpu_wheels.sh"])
VENV = Path(sys.executable).parent.parent  # the venv these tests run in
IN_CI = os.environ.get("CI") == "true"


def unavailable(reason):
    """Skip where Slurm or a tool cannot be had; in CI that is a failure."""
    if IN_CI:
        pytest.fail(f"CI must run this: {reason}")
    pytest.skip(reason)


def rows_of(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_job_scripts_pass_bash_n_and_shellcheck(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        unavailable("shellcheck is not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", "-x", "-P", str(JOBS), str(script)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_workstation_run_leaves_a_complete_results_folder(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "RANKS": "2", "VENV": str(VENV), "RESULTS": str(out), "MIN_BYTES": "1K",
           "MAX_BYTES": "64K", "FACTOR": "8", "ITERS": "3", "WARMUP": "1",
           "VENDOR_LOG": str(ROOT / "tests/data/nccl-tests/superbench_8xA100_allreduce.log")}
    proc = subprocess.run([str(JOBS / "run-local.sh")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("topology.json", "tree-bam.txt", "tree-km.txt", "sweep.txt", "sweep.json", "sweep.jsonl",
                 "compare.txt", "model.txt", "busbw.png"):
        assert (out / name).stat().st_size > 0, name
    rows = rows_of(out / "sweep.jsonl")
    assert {r["algorithm"] for r in rows} == {"ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier", "oneshot", "twoshot", "mpi", "mpi4py"}
    assert all(r["out_of_place"]["nwrong"] == 0 and r["in_place"]["nwrong"] == 0 for r in rows)
    assert "superbench_8xA100_allreduce" in (out / "compare.txt").read_text()


# ---------------------------------------------------------------- a real Slurm cluster

@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm")
    up = subprocess.run([str(JOBS / "cluster/slurm-up.sh"), str(state)], capture_output=True, text=True,
                        timeout=300)
    if up.returncode == 3:
        unavailable(f"no Slurm here: {up.stderr.strip()}")
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    try:
        yield env
    finally:
        subprocess.run([str(JOBS / "cluster/slurm-down.sh"), str(state)], timeout=120)


def job_environment(env, results, settings):
    """A job script's environment: the cluster's, this venv, its results folder and its settings."""
    return {**env, "VENV": str(VENV), "RESULTS": str(results), **settings}


def sbatch(env, script, results, *options, timeout=240, **settings):
    """`sbatch --wait` from the repository root, wrapped in a timeout; returns (exit code, output file)."""
    output = results.parent / f"{results.name}.out"
    proc = subprocess.run(["timeout", str(timeout), "sbatch", "--wait", f"--output={output}", *options,
                           str(JOBS / "slurm" / script)], cwd=ROOT, env=job_environment(env, results, settings),
                          capture_output=True, text=True)
    log = output.read_text() if output.exists() else ""
    return proc.returncode, proc.stdout + proc.stderr + log


def test_cpu_sweep_job(slurm, tmp_path):
    results = tmp_path / "cpu"
    code, log = sbatch(slurm, "cpu-sweep.sbatch", results, "--ntasks=2", MIN_BYTES="8", MAX_BYTES="64K",
                       FACTOR="8", ITERS="3", WARMUP="1")
    assert code == 0, log[-4000:]
    rows = rows_of(results / "sweep.jsonl")
    assert {r["algorithm"] for r in rows} == {"ps", "ring", "tree", "hier", "mpi"} and len(rows) == 5 * 5
    assert all(r["ranks"] == 2 and r["out_of_place"]["nwrong"] == 0 and r["in_place"]["nwrong"] == 0
               for r in rows)
    document = json.loads((results / "sweep.json").read_text())
    assert document["out_of_bounds"]["count"] == 0
    assert (results / "sweep.txt").read_text().count("# Out of bounds values : 0 OK") == 5


def test_full_pipeline_job(slurm, tmp_path):
    results = tmp_path / "pipeline"
    code, log = sbatch(slurm, "pipeline.sbatch", results, "--ntasks=2", MIN_BYTES="1K", MAX_BYTES="64K",
                       FACTOR="8", ITERS="3", WARMUP="1", PROBE_BYTES="256K")
    assert code == 0, log[-4000:]
    for name in ("topology.json", "tree-bam.txt", "sweep.json", "model.txt", "compare.txt", "busbw.png"):
        assert (results / name).stat().st_size > 0, name
    rows = rows_of(results / "sweep.jsonl")
    assert {r["algorithm"] for r in rows} == {"ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier", "oneshot", "twoshot", "mpi", "mpi4py"}
    assert all(r["out_of_place"]["nwrong"] == 0 for r in rows)
    assert json.loads((results / "topology.json").read_text())["ranks"] == 2


def test_probe_job(slurm, tmp_path):
    results = tmp_path / "probe"
    code, log = sbatch(slurm, "probe.sbatch", results, "--nodes=1", "--ntasks-per-node=2", PROBE_BYTES="256K")
    assert code == 0, log[-4000:]
    matrix = json.loads((results / "topology.json").read_text())
    assert matrix["ranks"] == 2 and matrix["measured"]["rounds"] == 1
    assert "level 0: bottleneck" in (results / "tree-bam.txt").read_text()


def test_doctor_job(slurm, tmp_path):
    """The doctor's job, launched as the sweeps are (bound a core a rank): nothing found on a
    clean allocation, the findings file and the table in the results folder."""
    results = tmp_path / "doctor"
    code, log = sbatch(slurm, "doctor.sbatch", results, "--nodes=1", "--ntasks-per-node=2")
    assert code == 0, log[-4000:]
    document = json.loads((results / "doctor.json").read_text())
    assert document["findings"] == [] and document["ranks"] == 2
    assert (results / "doctor.txt").read_text().rstrip().endswith("# 0 findings: nothing found")


def test_a_cancelled_job_keeps_finished_sizes(slurm, tmp_path):
    """``scancel`` ends every rank (exit 143): the log says so, the log and -J hold the finished
    sizes, and the script removes the /dev/shm files MPICH left behind. Slurm ends a job at its
    time limit by the same signals (SIGCONT and SIGTERM to every process of the job, SIGKILL after
    KillWait), so this is also what a time limit does; the limit itself, a minute at the least
    and checked every 30 s, would cost this suite 60-90 s of waiting. The line that says so is the
    script's, printed once the launcher has returned: inside an allocation Hydra starts its proxies
    with srun, which gets the SIGTERM too and kills the step at once ("srun: forcing job
    termination"), so a rank slowed by load can be killed before its own line ("interrupted by
    SIGTERM; ending every rank") is written."""
    results = tmp_path / "cancelled"
    output = tmp_path / "cancelled.out"
    shm_before = {p for p in os.listdir("/dev/shm") if p.startswith("mpich_shm_")}
    settings = {"MIN_BYTES": "1K", "MAX_BYTES": "1G", "FACTOR": "2", "ITERS": "2000", "WARMUP": "1", "ALGOS": "ring"}
    submitted = subprocess.run(["sbatch", "--parsable", f"--output={output}", "--ntasks=2",
                                str(JOBS / "slurm" / "cpu-sweep.sbatch")], cwd=ROOT,
                               env=job_environment(slurm, results, settings), capture_output=True, text=True,
                               timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    log_rows = results / "sweep.jsonl"
    deadline = time.monotonic() + 120
    while not (log_rows.exists() and len(rows_of(log_rows)) >= 4) and time.monotonic() < deadline:
        time.sleep(0.2)
    subprocess.run(["scancel", job], env=slurm, check=True, timeout=30)
    cancelled = time.monotonic()
    while time.monotonic() - cancelled < 60 and subprocess.run(
            ["squeue", "-h", "-j", job], env=slurm, capture_output=True, text=True, timeout=30).stdout.strip():
        time.sleep(0.5)
    log = output.read_text() if output.exists() else ""
    assert time.monotonic() - cancelled < 30, log[-2000:]  # KillWait is 5 s
    assert "CANCELLED" in log, log[-2000:]
    rows = rows_of(log_rows)  # every line parses: no half-written row
    assert len(rows) >= 4 and [r["size"] for r in rows[:3]] == [1024, 2048, 4096]
    assert all(r["out_of_place"]["nwrong"] == 0 for r in rows)
    table = [l for l in (results / "sweep.txt").read_text().splitlines() if l and not l.startswith("#")]
    assert len(table) >= len(rows)
    document = json.loads((results / "sweep.json").read_text())  # rewritten after every size
    saved = [r["size"] for r in document["results"]]
    assert document["allreduce_bench"]["complete"] is False
    assert saved == [r["size"] for r in rows][:len(saved)] and len(rows) - len(saved) in (0, 1)
    assert f"allreduce-cpu: interrupted by SIGTERM; the finished sizes are in {results}\n" in log, log[-2000:]
    assert {p for p in os.listdir("/dev/shm") if p.startswith("mpich_shm_")} - shm_before == set()
