"""``python -m bench train`` end to end under a real mpiexec, on a tiny model: the tables, the -J
document's fields against what they must be (bytes a step = parameters x item size, exposed =
step - compute in each round, parameters the same on every rank, noop's differing), every
figure's interval against its per-round values by order statistics computed here, the ratios
against gloo paired round by round, the rounds' rotated order, the plot, an all-reducing run
whose parameters differ (exit 1), bad flags (one line, exit 2 on every rank), PyTorch missing;
``bench scaling --train`` reading the document; the shared model of exposed communication; the
target and tie rules on synthetic values; the overlapping hook's refusal below
MPI_THREAD_SERIALIZED."""

import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys

import pytest
from conftest import ROOT, run_mpi

from bench.baselines.gloo import problem as gloo_problem
from bench.formats.stats import Interval, paired_ratio, verdict
from bench.tools.scaling import exposed_time
from bench.train.ddp import CHECKS, TIMES, hook_target
from bench.train.predict import exposed_after

needs_torch = pytest.mark.skipif(gloo_problem() is not None, reason=gloo_problem() or "")

LAYERS, WIDTH = 2, 64  # 2 x (64 x 64 + 64) = 8320 parameters
PARAMETERS = LAYERS * (WIDTH * WIDTH + WIDTH)
ROUNDS, STEPS = 6, 2  # 6 rounds: the fewest whose interval of the median reaches 95%
TINY = ["--layers", str(LAYERS), "--width", str(WIDTH), "--batch", "4", "--warmup", "1", "--steps", str(STEPS),
        "--rounds", str(ROUNDS)]
KEYS = {"algorithm", "bucket_mb", "dtype", "step_ms", "step_p95_ms", "compute_ms", "exposed_ms", "model_step_ms",
        "params_identical", "bytes_per_step", "buckets", "busbw", "overlap", "vs_gloo_max_rel_diff",
        "overlap_reached", "backward_ms", "step", "compute", "exposed", "model_step", "backward", "step_vs_gloo",
        "exposed_vs_gloo", "rounds"}


def train(ranks, tmp_path, *args, env=None, timeout=300):
    document = tmp_path / "train.json"
    proc = run_mpi(ranks, ["-m", "bench", "train", *TINY, "-J", str(document), *args], timeout, env)
    return proc, (json.loads(document.read_text()) if document.exists() else None)


def table_cells(text, keys=3):
    """{key cells: {column: cell}} of every table in ``text``, the tables a wide one was split into
    put together: a table is a "# " header line, its "# " units line, then its rows ("  "); a
    row's cells are two or more spaces apart (an interval, "1.2 [1.1, 1.3]", holds single ones),
    its first ``keys`` cells name it. Every line within 120 columns (tables split to fit)."""
    found, lines = {}, text.splitlines()
    assert max(map(len, lines)) <= 120
    for i, line in enumerate(lines):
        if line.startswith("  ") and i >= 2 and not lines[i - 1].startswith("  "):
            header = re.split(r"\s{2,}", lines[i - 2][2:].strip())
            for row in itertools.takewhile(lambda l: l.startswith("  "), lines[i:]):
                cells = re.split(r"\s{2,}", row.strip())
                assert len(cells) == len(header), (header, cells)
                found.setdefault(tuple(cells[:keys]), {}).update(zip(header[keys:], cells[keys:]))
    return found


def rows(text):
    """{(label, bucket, dtype): {column: cell}} of DDP's tables (before FSDP's section)."""
    return table_cells(text.split("# FSDP (", 1)[0])


def label(run):
    return run["algorithm"] + ("+ovl" if run["overlap"] and run["algorithm"] != "gloo" else "")


def order_interval(values):
    """(median, low, high, coverage) by order statistics, worked out here: of the sorted values,
    [x_(k), x_(n+1-k)] for the largest k that holds the median with 95% (1 - 2 P(B <= k-1), B ~
    Binomial(n, 1/2)), the whole range where none does."""
    ordered, n = sorted(values), len(values)

    def cover(k):
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    k = max([k for k in range(1, (n + 1) // 2 + 1) if cover(k) >= 0.95], default=1)
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2, ordered[k - 1], ordered[n - k], cover(k)


def check_figure(figure, values):
    """A -J figure ({"median", "ci_low", "ci_high", "rounds", "coverage"}) against its values."""
    median, low, high, cover = order_interval(values)
    assert figure["rounds"] == len(values)
    assert [figure["median"], figure["ci_low"], figure["ci_high"]] == pytest.approx([median, low, high])
    assert figure["coverage"] == pytest.approx(cover, abs=1e-4)


def check_rounds(document):
    """Every run's figures against its per-round values: a round's step the median of its steps,
    compute the noop run's step of the same round, exposed their difference, each interval by
    order statistics; the ratios against gloo each round's own; the hook's target judged on its
    interval; every configuration once a round, the order rotated by one each round."""
    runs = document["runs"]
    rounds = document["rounds"]
    assert rounds == ROUNDS and document["steps"] == STEPS
    for j, run in enumerate(runs):
        assert run["rounds"]["place"] == [(j - i) % len(runs) for i in range(rounds)]
    groups = {}
    for run in runs:
        groups.setdefault((run["bucket_mb"], run["dtype"]), {})[label(run)] = run
    for group in groups.values():
        noop, gloo = group["noop"], group.get("gloo")
        for run in group.values():
            per = run["rounds"]
            assert [len(steps) for steps in per["steps_ms"]] == [STEPS] * rounds
            assert per["step_ms"] == pytest.approx([statistics.median(steps) for steps in per["steps_ms"]])
            assert per["compute_ms"] == noop["rounds"]["step_ms"]
            assert per["exposed_ms"] == pytest.approx([s - c for s, c in zip(per["step_ms"], per["compute_ms"])])
            for name in ("step", "compute", "exposed", "model_step", "backward"):
                check_figure(run[name], per[f"{name}_ms"])
                assert run[f"{name}_ms"] == run[name]["median"]
            for bucket in run["buckets"]:
                check_figure(bucket["allreduce"], bucket["rounds"]["allreduce_ms"])
                check_figure(bucket["ready"], bucket["rounds"]["ready_ms"])
                ratio = bucket["hook_over_bare"]
                assert (ratio is None) == (run["algorithm"] in ("gloo", "noop"))
                if ratio is not None:
                    each = [h / b for h, b in zip(bucket["rounds"]["hook_alone_ms"], bucket["rounds"]["allreduce_ms"])]
                    assert bucket["rounds"]["hook_over_bare"] == pytest.approx(each)
                    check_figure(ratio, each)
                    assert ratio["target"] == ("met" if ratio["ci_high"] <= 1.05 else
                                               "missed" if ratio["ci_low"] > 1.05 else "undecided")
            if gloo is None or run["algorithm"] in ("gloo", "noop"):
                assert run["exposed_vs_gloo"] is None and run["step_vs_gloo"] is None
                continue
            for name in ("step", "exposed"):
                each = [a / b if b > 0 else None for a, b in zip(per[f"{name}_ms"], gloo["rounds"][f"{name}_ms"])]
                assert [r is None for r in per[f"{name}_vs_gloo"]] == [r is None for r in each]
                kept = [r for r in each if r is not None]
                assert [r for r in per[f"{name}_vs_gloo"] if r is not None] == pytest.approx(kept)
                ratio = run[f"{name}_vs_gloo"]
                if not kept:
                    assert ratio is None
                    continue
                check_figure(ratio, kept)
                assert ratio["verdict"] == ("tie" if ratio["ci_low"] <= 1 <= ratio["ci_high"] else
                                            "higher" if ratio["ci_low"] > 1 else "lower")


def cell_figure(cell):
    """[median, low, high] of a table's "1.23 [1.10, 1.40]" (or "0.5x [...]")."""
    return [float(v) for v in re.fullmatch(r"(\S+?)x? \[(\S+), (\S+)\]", cell).groups()]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """A 2-rank run of every kind: noop, gloo, ring and auto, sync and overlapping, fp32 and bf16,
    two bucket caps (a few buckets, and one), with the plot and the timeline."""
    tmp_path = tmp_path_factory.mktemp("train")
    proc, document = train(2, tmp_path, "--algo", "auto,ring,gloo,noop", "--overlap", "off,on",
                           "--dtype", "fp32,bf16", "--bucket-mb", "0.005,1", "--plot", str(tmp_path / "train.png"),
                           "--timeline", str(tmp_path / "timeline.png"))
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
                   f"1 warm-up step, then {ROUNDS} rounds of {STEPS} timed steps", "order rotated by one each round",
                   "predicted: the exposed communication from the noop run's compute profile", "not a prediction"):
        assert phrase in header, phrase
    assert "reach no 95% interval" not in proc.stdout  # 6 rounds do
    runs = document["runs"]
    # per bucket cap and dtype: noop, gloo, then auto and ring, each off and on
    assert len(runs) == 2 * 2 * 6
    assert [r["algorithm"] for r in runs[:6]] == ["noop", "gloo", "auto", "auto", "ring", "ring"]
    check_rounds(document)
    table = rows(proc.stdout)
    assert len(table) == len(runs)
    assert all(set(cells) == set(TIMES[3:] + CHECKS[3:]) for cells in table.values())
    for run in runs:
        assert KEYS <= set(run), KEYS - set(run)
        itemsize = 4 if run["dtype"] == "fp32" else 2
        assert run["bytes_per_step"] == PARAMETERS * itemsize == sum(b["bytes"] for b in run["buckets"])
        every = [t for steps in run["rounds"]["steps_ms"] for t in steps]
        assert run["step_p95_ms"] == sorted(every)[-(-len(every) * 95 // 100) - 1] > 0 and run["compute_ms"] > 0
        assert run["model_step_ms"] >= run["compute_ms"]
        key = label(run), f"{run['bucket_mb']:g}", run["dtype"]
        cells = table[key]
        for name in ("step", "exposed"):  # 3 significant digits
            cell = cells[name]
            figure = run[name]
            assert cell_figure(cell) == pytest.approx([figure["median"], figure["ci_low"], figure["ci_high"]],
                                                      rel=6e-3, abs=1e-9), (key, name)
        predicted = run["predicted_exposed_ms"]
        assert cells["predicted"] == ("-" if predicted is None else f"{predicted:.1f}")
        error = run["prediction_error"]
        assert cells["error"] == "-" if error is None else cells["error"] == f"{error * 100:+.0f}%" + (
            " in" if run["prediction_within"] else "")
        ratio, cell = run["exposed_vs_gloo"], cells["exposed/gloo"]
        assert cell == "-" if ratio is None else cell.endswith(" tie") == (ratio["verdict"] == "tie")
        if ratio is not None:
            assert cell_figure(cell.removesuffix(" tie")) == pytest.approx([ratio["median"], ratio["ci_low"], ratio["ci_high"]],
                                                          rel=6e-3, abs=1e-9)
        if run["algorithm"] == "noop":
            assert run["params_identical"] is False and cells["params"] == "differ"  # each rank its own gradients
            assert run["busbw"] is None and run["model_step_ms"] == run["compute_ms"] == run["step_ms"]
            continue
        assert run["params_identical"] is True and cells["params"] == "same"
        assert run["busbw"] > 0 and all(b["allreduce_ms"] > 0 for b in run["buckets"])
        if run["algorithm"] != "gloo":  # at 2 ranks dividing by 2 is exact: gloo's bits exactly
            assert run["vs_gloo_max_rel_diff"] == 0.0 and run["overlap_reached"] is not None
            assert run["overlap"] == key[0].endswith("+ovl")
            assert run["overlap_reached"] == 0.0 if not run["overlap"] else 0 <= run["overlap_reached"] <= 1
    few = [r for r in runs if r["bucket_mb"] == 0.005 and r["algorithm"] == "noop"]
    assert all(len(r["buckets"]) >= 2 for r in few)  # 5 KiB buckets: several
    for i in range(ROUNDS):  # each round's buckets ready in DDP's order, the last at the backward pass's end
        ready = [b["rounds"]["ready_ms"][i] for b in few[0]["buckets"]]
        assert ready == sorted(ready) and few[0]["rounds"]["backward_ms"][i] == ready[-1]
    summary = proc.stdout.replace("\n#   ", " ")
    assert "noop's parameters differ across ranks by construction" in summary
    pairs = {(label(r), r["bucket_mb"], r["dtype"], b["bytes"]): b["hook_over_bare"] for r in runs
             for b in r["buckets"] if b["hook_over_bare"]}
    targets = [ratio["target"] for ratio in pairs.values()]
    assert (f"{targets.count('met')} met, {targets.count('missed')} missed, {targets.count('undecided')} undecided "
            f"of {len(pairs)}") in summary
    assert max(len(line) for line in proc.stdout.splitlines()) <= 120
    png = tmp_path / "train.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20000


@needs_torch
def test_the_prediction_comes_from_the_noop_profile(two_ranks):
    """Every run but native's is predicted from its noop run's profile: noop exposes nothing; a
    synchronous hook exposes the sum of its buckets' predicted all-reduces, each stalling the
    backward pass where the noop run's bucket became ready; on one node with the cores shared (2
    ranks of 2 threads on 2 cores here) an overlapping one exposes all of it too, and where a core
    is spare only what ends after the backward pass; the error is predicted over measured exposed."""
    _, document, _ = two_ranks
    assert document["predicted_from"] == "a probe of these ranks (4 MiB messages), 1 node"
    noops = {(r["bucket_mb"], r["dtype"]): r for r in document["runs"] if r["algorithm"] == "noop"}
    for run in document["runs"]:
        buckets = run["predicted_buckets"]
        assert run["predicted_exposed_ms"] is not None and len(buckets) == len(run["buckets"])
        times = [b["allreduce_ms"] for b in buckets]
        if run["algorithm"] == "noop":
            assert run["predicted_exposed_ms"] == 0 and run["prediction_error"] is None
            continue
        assert all(t > 0 for t in times)
        last = noops[run["bucket_mb"], run["dtype"]]["buckets"]
        ready = [b["rounds"]["ready_ms"][-1] for b in last]
        if not run["overlap"] or document["cores_shared"]:  # the same bucket sizes every round: the same sum
            assert run["predicted_exposed_ms"] == pytest.approx(sum(times))
        else:
            backward = noops[run["bucket_mb"], run["dtype"]]["rounds"]["backward_ms"][-1]
            finish = 0.0
            for r, t in zip(ready, times):
                finish = max(finish, r) + t
            assert run["predicted_exposed"]["ci_low"] <= max(finish - backward, 0) <= run["predicted_exposed"]["ci_high"]
        if not run["overlap"]:
            stalled = [r + sum(times[:k]) for k, r in enumerate(ready)]
            assert [b["start_ms"] for b in buckets] == pytest.approx(stalled)
        measured = statistics.median(run["rounds"]["exposed_ms"])
        if measured > 0:
            assert run["prediction_error"] == pytest.approx(run["predicted_exposed_ms"] / measured - 1)


@needs_torch
def test_ddp_logger_and_timeline(two_ranks):
    """DDP's own logger's backward figures beside ours, for gloo and the hooks; the timeline's
    picture and its Chrome trace read back: a process per run but noop, a complete event per
    bucket measured (hook runs) and predicted, the backward pass on its own thread."""
    _, document, tmp_path = two_ranks
    for run in document["runs"]:
        logged = run["ddp_logger"]
        assert set(logged) == {"backward_compute_ms", "backward_comm_ms", "backward_overlap_ms"}
        assert logged["backward_compute_ms"] > 0 and 0 <= logged["backward_overlap_ms"]
        if run["algorithm"] != "noop":
            assert logged["backward_comm_ms"] > 0
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads((tmp_path / "timeline.trace.json").read_text())["traceEvents"]
    runs = [r for r in document["runs"] if r["algorithm"] != "noop"]
    names = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert len(names) == len(runs) and names[0] == f"gloo {runs[0]['bucket_mb']:g} MiB {runs[0]['dtype']}"
    for pid, run in enumerate(runs):
        mine = [e for e in events if e["pid"] == pid and e["ph"] == "X"]
        lanes = [[e for e in mine if e["tid"] == tid] for tid in range(3)]
        assert [e["dur"] for e in lanes[0]] == pytest.approx([run["backward_ms"] * 1e3])
        assert len(lanes[1]) == (0 if run["algorithm"] == "gloo" else len(run["buckets"]))
        assert [e["ts"] for e in lanes[2]] == pytest.approx([b["start_ms"] * 1e3 for b in run["predicted_buckets"]])
        for event, bucket in zip(lanes[1], run["buckets"]):
            timeline = bucket["timeline_ms"]
            assert event["ts"] == pytest.approx(timeline["start"] * 1e3) and event["dur"] >= 0
            assert timeline["ready"] <= timeline["start"] <= timeline["end"]


@needs_torch
def test_model_step_follows_the_runs_own_inputs(two_ranks):
    """model_step_ms recomputed here from the run's own numbers: synchronous hooks add every bucket's
    time, asynchronous all-reduces (gloo, the overlapping hook) expose what ends after the backward pass,
    and, where the ranks have no core to spare (2 ranks of 2 threads on 2 cores here), their CPU share;
    each round from that round's inputs, the run's model the median of the rounds'."""
    _, document, _ = two_ranks
    for run in document["runs"]:
        for i in range(ROUNDS):
            compute, backward = run["rounds"]["compute_ms"][i], run["rounds"]["backward_ms"][i]
            times = [b["rounds"]["allreduce_ms"][i] for b in run["buckets"]]
            if run["algorithm"] == "noop":
                expected = compute
            elif not run["overlap"]:
                expected = compute + sum(times)
            else:  # where the cores are shared, the all-reduce's CPU share of each bucket is exposed too
                shared = document["cores_shared"] is not None
                finish, stolen = 0.0, 0.0
                for bucket, took in zip(run["buckets"], times):
                    share = bucket["rounds"]["cpu_share"][i] if shared else 0.0
                    assert 0.0 <= share <= 1.0
                    stolen += took * share
                    finish = max(finish, bucket["rounds"]["ready_ms"][i]) + took * (1 - share)
                expected = compute + stolen + max(finish - backward, 0.0)
            assert run["rounds"]["model_step_ms"][i] == pytest.approx(expected), run["algorithm"]
        assert run["model_step_ms"] == pytest.approx(statistics.median(run["rounds"]["model_step_ms"]))


@needs_torch
@pytest.mark.parametrize("ranks", [1, 3])
def test_one_and_three_ranks(ranks, tmp_path):
    proc, document = train(ranks, tmp_path, "--algo", "auto,gloo,noop", "--overlap", "on", "--bucket-mb", "0.01")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    noop, gloo, auto = document["runs"]
    assert [noop["algorithm"], gloo["algorithm"], auto["algorithm"]] == ["noop", "gloo", "auto"]
    check_rounds(document)
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
    assert [table[a, "25", "fp32"]["params"] for a in ("noop", "gloo", "ring")] == ["differ", "WRONG", "WRONG"]
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == ["python -m bench train: error: parameters differ across ranks after the steps: "
                      "gloo (25 MiB, fp32), ring (25 MiB, fp32)"]
    assert "bit for bit the same" not in proc.stdout


def test_target_and_tie_rules_on_synthetic_values():
    """The hook's target, at most 1.05x, judged on an interval: met where the upper end is at most
    1.05, missed where the lower end is above, else undecided; against gloo, a tie where the
    interval holds 1. Paired by round, a ratio steady round after round is decided though the
    rounds drift by 30%."""
    def interval(low, high):
        return Interval((low + high) / 2, low, high, 10, 0.98)
    assert hook_target(interval(0.98, 1.05)) == "met"
    assert hook_target(interval(0.98, 1.0501)) == "undecided"
    assert hook_target(interval(1.05, 1.2)) == "undecided"  # the lower end at the bound, not above it
    assert hook_target(interval(1.0501, 1.2)) == "missed"
    bare = [1.0, 1.3, 0.9, 1.1, 1.2, 0.95, 1.05, 1.15, 1.25, 1.0]
    spread = [0.97, 1.0, 1.03, 1.04, 1.06, 1.08, 1.1, 1.12, 1.02, 1.07]
    assert hook_target(paired_ratio([b * 1.02 for b in bare], bare)) == "met"
    assert hook_target(paired_ratio([b * 1.10 for b in bare], bare)) == "missed"
    assert hook_target(paired_ratio([b * f for b, f in zip(bare, spread)], bare)) == "undecided"
    assert verdict(paired_ratio([b * f for b, f in zip(bare, spread)], bare)) == "tie"
    assert verdict(paired_ratio([b * 0.6 for b in bare], bare)) == "lower"
    assert verdict(paired_ratio([b * 1.3 for b in bare], bare)) == "higher"


@pytest.mark.parametrize("args,message", [
    (["--algo", "ring,bogus"], "unknown --algo bogus; choices: ps,ring,"),
    (["--dtype", "fp16"], "argument --dtype: unknown type fp16; choices: float (fp32), bfloat16 (bf16), float32"),
    (["--dtype", "float64"], "argument --dtype: unknown type float64; choices: float (fp32), bfloat16 (bf16)"),
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
    time recomputed here from the document's noop run matches the table's, overlapped (buckets one after
    another from their ready times) and synchronous (their sum); --cores 1 makes 8 ranks compute 4x
    slower than 2 (max(1, 8/1) / max(1, 2/1)); --check sets the document's own measured steps beside."""
    _, document, tmp_path = two_ranks
    path = tmp_path / "train.json"
    noop = document["runs"][0]
    beta = 0.001  # GB/s: slow enough that the buckets queue
    proc = subprocess.run([sys.executable, "-m", "bench", "scaling", "--train", str(path), "--ranks", "2,8",
                           "--algo", "ring", "--alpha-us", "0", "--beta-GBps", str(beta), "--check", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"compute profiles from {path}: 2 ranks" in proc.stdout
    rows = {tuple(line.split()[:5]): line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["ring"]}
    compute = noop["compute_ms"] / 1e3
    for n in (2, 8):
        finish, total = 0.0, 0.0
        for bucket in sorted(noop["buckets"], key=lambda b: b["ready_ms"]):
            took = 2 * (n - 1) / n * bucket["bytes"] / (beta * 1e9)
            finish, total = max(finish, bucket["ready_ms"] / 1e3) + took, total + took
        for mode, exposed in (("overlap", max(finish - noop["backward_ms"] / 1e3, 0)), ("sync", total)):
            row = rows["ring", mode, noop["dtype"], f"{noop['bucket_mb']:g}", str(n)]
            assert float(row[5]) == pytest.approx(total, abs=1e-4)
            assert float(row[6]) == pytest.approx(exposed, abs=1e-4)
            assert float(row[7]) == pytest.approx(compute + exposed, abs=1e-4)
            assert float(row[8].rstrip("%")) == pytest.approx(100 * compute / (compute + exposed), abs=0.06)
            assert (len(row) > 10) == (n == 2)  # the measured step only where the document's ranks are
    measured = next(r for r in document["runs"] if r["algorithm"] == "ring" and not r["overlap"])
    row = rows["ring", "sync", measured["dtype"], f"{measured['bucket_mb']:g}", "2"]
    assert float(row[10]) == pytest.approx(measured["step"]["median"] / 1e3, abs=1e-4)
    slow = subprocess.run([sys.executable, "-m", "bench", "scaling", "--train", str(path), "--ranks", "8", "--cores", "1",
                           "--algo", "ring", "--alpha-us", "0", "--beta-GBps", "1e6"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    row = next(line.split() for line in slow.stdout.splitlines() if line.split()[:2] == ["ring", "sync"])
    assert float(row[7]) == pytest.approx(4 * compute, abs=1e-4)  # the table prints 4 decimals
    bad = subprocess.run([sys.executable, "-m", "bench", "scaling", "--train", str(ROOT / "setup.cfg")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and re.match(r"python -m bench scaling: --train .*setup.cfg: not JSON", bad.stderr)
    neither = subprocess.run([sys.executable, "-m", "bench", "scaling"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert neither.returncode == 2 and "needs --params and --compute-time, or --train FILE" in neither.stderr


def test_a_wide_table_splits_into_tables_that_fit():
    """Columns past the width go into further tables, each led by the key columns; read back, the
    cells are the rows' (an independent parse: table_cells), and a narrow table stays one."""
    from bench.train.figures import table_lines
    columns = ("name", "kind", *(f"c{i}" for i in range(12)))
    units = ("", "", *("(ms)" for _ in range(12)))
    rows = [(f"run{r}", "x", *(f"{r}.{i} [{r}.{i}, 1{r}.{i}]" for i in range(12))) for r in range(3)]
    made = table_lines(columns, units, rows, keys=2, width=80)
    assert max(map(len, made)) <= 80 and made.count("#") >= 2
    headers = [line.split()[1:] for line in made if line.startswith("# name")]
    assert len(headers) == made.count("#") + 1 and all(h[:2] == ["name", "kind"] for h in headers)
    assert [c for h in headers for c in h[2:]] == list(columns[2:])
    back = table_cells("\n".join(made), keys=2)
    assert back == {(row[0], row[1]): dict(zip(columns[2:], row[2:])) for row in rows}
    assert "#" not in table_lines(columns[:4], units[:4], [row[:4] for row in rows], keys=2, width=80)
