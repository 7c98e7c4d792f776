"""``python -m bench train`` end to end under a real mpiexec, on a tiny model: the table, the -J
document's fields against what they must be (bytes a step = parameters x item size, exposed =
step - compute, parameters the same on every rank, noop's differing), the plot, an all-reducing run
whose parameters differ (exit 1), bad flags (one line, exit 2 on every rank), PyTorch missing;
``bench scaling --train`` reading the document; the shared model of exposed communication; the
overlapping hook's refusal below MPI_THREAD_SERIALIZED."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, run_mpi

from bench.baselines.gloo import problem as gloo_problem
from bench.tools.scaling import exposed_after, exposed_time

needs_torch = pytest.mark.skipif(gloo_problem() is not None, reason=gloo_problem() or "")

LAYERS, WIDTH = 2, 64  # 2 x (64 x 64 + 64) = 8320 parameters
PARAMETERS = LAYERS * (WIDTH * WIDTH + WIDTH)
TINY = ["--layers", str(LAYERS), "--width", str(WIDTH), "--batch", "4", "--warmup", "1", "--steps", "3"]
KEYS = {"algorithm", "bucket_mb", "dtype", "step_ms", "step_p95_ms", "compute_ms", "exposed_ms", "model_step_ms",
        "params_identical", "bytes_per_step", "buckets", "busbw", "overlap", "vs_gloo_max_rel_diff",
        "overlap_reached", "backward_ms"}


def train(ranks, tmp_path, *args, env=None, timeout=150):
    document = tmp_path / "train.json"
    proc = run_mpi(ranks, ["-m", "bench", "train", *TINY, "-J", str(document), *args], timeout, env)
    return proc, (json.loads(document.read_text()) if document.exists() else None)


def rows(text):
    """{(label, bucket, dtype): cells} of the table's rows."""
    found = {}
    for line in text.splitlines():
        cells = line.split()
        if line.startswith("  ") and len(cells) == 12:
            found[cells[0], cells[1], cells[2]] = cells
    return found


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """A 2-rank run of every kind: noop, gloo, ring and auto, sync and overlapping, fp32 and bf16,
    two bucket caps (a few buckets, and one), with the plot."""
    tmp_path = tmp_path_factory.mktemp("train")
    proc, document = train(2, tmp_path, "--algo", "auto,ring,gloo,noop", "--overlap", "off,on",
                           "--dtype", "fp32,bf16", "--bucket-mb", "0.005,1", "--plot", str(tmp_path / "train.png"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, document, tmp_path


@needs_torch
def test_two_ranks_table_and_document(two_ranks):
    proc, document, tmp_path = two_ranks
    assert document["complete"] and document["ranks"] == 2 and document["wrong"] == []
    assert document["model"]["parameters"] == PARAMETERS
    cores = len(os.sched_getaffinity(0))  # 2 ranks, each a torch thread and an all-reduce
    assert document["cores_shared"] == (f"2 ranks x (1 torch thread + 1 all-reduce) on {cores} cores" if cores < 4
                                        else None)
    assert document["machine"]["mpi"] and document["machine"]["commit"] and document["torch"]
    header = proc.stdout.split("\n  ")[0].replace("\n#   ", " ")  # comment lines wrap at 120 columns
    for phrase in ("2 ranks on 1 node", "torch ", "MPI: ", f"{PARAMETERS:,} parameters", "1 torch thread",
                   "1 warm-up + 3 timed steps"):
        assert phrase in header, phrase
    runs = document["runs"]
    # per bucket cap and dtype: noop, gloo, then auto and ring, each off and on
    assert len(runs) == 2 * 2 * 6
    assert [r["algorithm"] for r in runs[:6]] == ["noop", "gloo", "auto", "auto", "ring", "ring"]
    table = rows(proc.stdout)
    assert len(table) == len(runs)
    for run in runs:
        assert KEYS <= set(run), KEYS - set(run)
        itemsize = 4 if run["dtype"] == "fp32" else 2
        assert run["bytes_per_step"] == PARAMETERS * itemsize == sum(b["bytes"] for b in run["buckets"])
        assert run["step_p95_ms"] >= run["step_ms"] > 0 and run["compute_ms"] > 0
        assert run["exposed_ms"] == pytest.approx(run["step_ms"] - run["compute_ms"])
        assert run["model_step_ms"] >= run["compute_ms"]
        label = run["algorithm"] + ("+ovl" if run["overlap"] and run["algorithm"] != "gloo" else "")
        cells = table[label, f"{run['bucket_mb']:g}", run["dtype"]]
        assert float(cells[3]) == pytest.approx(run["step_ms"], abs=0.051)
        if run["algorithm"] == "noop":
            assert run["params_identical"] is False and cells[10] == "differ"  # each rank its own gradients
            assert run["busbw"] is None and run["model_step_ms"] == run["compute_ms"] == run["step_ms"]
            continue
        assert run["params_identical"] is True and cells[10] == "same"
        assert run["busbw"] > 0 and all(b["allreduce_ms"] > 0 for b in run["buckets"])
        if run["algorithm"] != "gloo":  # at 2 ranks dividing by 2 is exact: gloo's bits exactly
            assert run["vs_gloo_max_rel_diff"] == 0.0 and run["overlap_reached"] is not None
            assert run["overlap"] == (label.endswith("+ovl"))
            assert run["overlap_reached"] == 0.0 if not run["overlap"] else 0 <= run["overlap_reached"] <= 1
    few = [r for r in runs if r["bucket_mb"] == 0.005 and r["algorithm"] == "noop"]
    assert all(len(r["buckets"]) >= 2 for r in few)  # 5 KiB buckets: several
    ready = [b["ready_ms"] for b in few[0]["buckets"]]
    assert ready == sorted(ready) and few[0]["backward_ms"] == ready[-1]
    assert "noop's parameters differ across ranks by construction" in proc.stdout.replace("\n#   ", " ")
    assert max(len(line) for line in proc.stdout.splitlines()) <= 120
    png = tmp_path / "train.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20000


@needs_torch
def test_model_step_follows_the_runs_own_inputs(two_ranks):
    """model_step_ms recomputed here from the run's own numbers: synchronous hooks add every bucket's
    time, asynchronous all-reduces (gloo, the overlapping hook) expose what ends after the backward pass,
    and, where the ranks have no core to spare (2 ranks of 2 threads on 2 cores here), their CPU share."""
    _, document, _ = two_ranks
    for run in document["runs"]:
        times = [b["allreduce_ms"] for b in run["buckets"]]
        if run["algorithm"] == "noop":
            expected = run["compute_ms"]
        elif not run["overlap"]:
            expected = run["compute_ms"] + sum(times)
        else:  # where the cores are shared, the all-reduce's CPU share of each bucket is exposed too
            shared = document["cores_shared"] is not None
            finish, stolen = 0.0, 0.0
            for bucket in run["buckets"]:
                share = bucket["cpu_share"] if shared else 0.0
                assert 0.0 <= share <= 1.0
                stolen += bucket["allreduce_ms"] * share
                finish = max(finish, bucket["ready_ms"]) + bucket["allreduce_ms"] * (1 - share)
            expected = run["compute_ms"] + stolen + max(finish - run["backward_ms"], 0.0)
        assert run["model_step_ms"] == pytest.approx(expected), run["algorithm"]


@needs_torch
@pytest.mark.parametrize("ranks", [1, 3])
def test_one_and_three_ranks(ranks, tmp_path):
    proc, document = train(ranks, tmp_path, "--algo", "auto,gloo,noop", "--overlap", "on", "--bucket-mb", "0.01")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    noop, gloo, auto = document["runs"]
    assert [noop["algorithm"], gloo["algorithm"], auto["algorithm"]] == ["noop", "gloo", "auto"]
    assert gloo["params_identical"] and auto["params_identical"]
    assert noop["params_identical"] == (ranks == 1)  # one rank has nothing to differ from
    assert auto["vs_gloo_max_rel_diff"] < 1e-5  # three ranks: the sums' last bits differ
    if ranks == 1:
        assert auto["vs_gloo_max_rel_diff"] == 0 and auto["busbw"] == 0  # nothing moves: 2(N-1)/N is 0


@needs_torch
def test_an_all_reducing_run_whose_parameters_differ_exits_1(tmp_path):
    """BENCH_TRAIN_DISTURB_RANK=1 changes rank 1's first parameter after the steps of every run that
    all-reduces: each is reported WRONG, every run still finishes, then one line and exit 1."""
    proc, document = train(2, tmp_path, "--algo", "ring,gloo,noop", env={"BENCH_TRAIN_DISTURB_RANK": "1"})
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert [r["params_identical"] for r in document["runs"]] == [False, False, False]
    assert document["complete"] and document["wrong"] == ["gloo (25 MiB, fp32)", "ring (25 MiB, fp32)"]
    table = rows(proc.stdout)
    assert [table[a, "25", "fp32"][10] for a in ("noop", "gloo", "ring")] == ["differ", "WRONG", "WRONG"]
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == ["python -m bench train: error: parameters differ across ranks after all-reducing: "
                      "gloo (25 MiB, fp32), ring (25 MiB, fp32)"]
    assert "bit for bit the same" not in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["--algo", "ring,bogus"], "--algo: unknown bogus; choices: ps,ring,"),
    (["--dtype", "fp16"], "--dtype fp16: choices are fp32, bf16"),
    (["--bucket-mb", "0"], "--bucket-mb: sizes must be positive"),
    (["--overlap", "maybe"], "--overlap maybe: a comma list of off, on"),
    (["--steps", "x"], "argument --steps: invalid int value: 'x'"),
    (["--algo", "native", "--dtype", "bf16"], "--algo native --dtype bf16: algorithm 'native' (MPI_Allreduce): "),
])
def test_bad_flags_end_every_rank_with_one_line(args, message):
    proc = run_mpi(2, ["-m", "bench", "train", *args], timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"python -m bench train: error: {message}"), proc.stderr
    assert proc.stdout == ""


def test_without_pytorch_one_line_says_how_to_install_it(tmp_path):
    """A torch package that cannot be imported first on the path, as where PyTorch is not installed."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('No module named torch')\n")
    proc = run_mpi(1, ["-m", "bench", "train"], timeout=60, env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("python -m bench train: error: needs PyTorch: pip install -e '.[gloo]' "
                                   "(ImportError: No module named torch)")


@needs_torch
def test_overlap_needs_mpi_thread_serialized():
    code = ("import mpi4py; mpi4py.rc.thread_level = 'funneled'\n"
            "import algorithms.torch as art\n"
            "art.HookState(algorithm='ring')\n"  # the synchronous hook needs no thread
            "art.HookState(algorithm='ring', overlap=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert ("RuntimeError: HookState(overlap=True) calls MPI from a communication thread: it needs MPI initialized "
            "at MPI_THREAD_SERIALIZED or above, not MPI_THREAD_FUNNELED") in proc.stderr


def test_import_algorithms_leaves_torch_alone():
    code = "import sys, algorithms; assert 'torch' not in sys.modules and 'algorithms.torch' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_exposed_communication_model():
    # synchronous: every bucket blocks the backward pass
    assert exposed_after([1, 2, 3], [0.5, 0.5, 0.5], 3, blocking=True) == 1.5
    # asynchronous: each bucket hides behind the rest of the backward pass but the last
    assert exposed_after([1, 2, 3], [0.5, 0.5, 0.5], 3) == pytest.approx(0.5)
    # communication-bound: the buckets queue up behind each other
    assert exposed_after([1, 1.1, 1.2], [1, 1, 1], 1.2) == pytest.approx(1 + 3 - 1.2)
    # a bucket ready late starts late
    assert exposed_after([0.1, 2.9], [0.2, 0.2], 3.0) == pytest.approx(0.1)
    assert exposed_time(0.2, 10, 1.0) == pytest.approx(10 * 0.2 + 0.1 - 1.0)  # the equal buckets of --buckets


@needs_torch
def test_scaling_takes_its_inputs_from_bench_train(two_ranks):
    """With --alpha-us 0, ring's time for a bucket of b bytes on N ranks is 2(N-1)/N b / beta; the exposed
    time recomputed here from the document's first noop run matches the table's."""
    _, document, tmp_path = two_ranks
    path = tmp_path / "train.json"
    noop = document["runs"][0]
    beta = 0.001  # GB/s: slow enough that the buckets queue
    proc = subprocess.run([sys.executable, "-m", "bench", "scaling", "--train", str(path), "--ranks", "2,8",
                           "--algo", "ring", "--alpha-us", "0", "--beta-GBps", str(beta)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "measured by python -m bench train" in proc.stdout
    assert f"T_c {noop['compute_ms'] / 1e3:.4g} s" in proc.stdout
    for n in (2, 8):
        finish = 0.0
        for bucket in sorted(noop["buckets"], key=lambda b: b["ready_ms"]):
            finish = max(finish, bucket["ready_ms"] / 1e3) + 2 * (n - 1) / n * bucket["bytes"] / (beta * 1e9)
        exposed = max(finish - noop["backward_ms"] / 1e3, 0)
        row = next(line.split() for line in proc.stdout.splitlines() if line.split()[:2] == ["ring", str(n)])
        assert float(row[3]) == pytest.approx(exposed, abs=1e-4)
        assert float(row[4].rstrip("%")) == pytest.approx(
            100 * noop["compute_ms"] / 1e3 / (noop["compute_ms"] / 1e3 + exposed), abs=0.06)
    bad = subprocess.run([sys.executable, "-m", "bench", "scaling", "--train", str(ROOT / "setup.cfg")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and re.match(r"python -m bench scaling: --train .*setup.cfg: not JSON", bad.stderr)
    neither = subprocess.run([sys.executable, "-m", "bench", "scaling"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert neither.returncode == 2 and "needs --params and --compute-time, or --train FILE" in neither.stderr
