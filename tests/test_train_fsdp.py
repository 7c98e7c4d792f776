"""``python -m bench train --strategy ddp,fsdp`` end to end under a real mpiexec, on a tiny model:
the FSDP runs (noop, gloo, ours synchronous and overlapped, reshard-after-forward on and off)
beside the DDP runs, their -J figures against their per-round values (exposed = step - noop's
step, its parts, every interval by order statistics, the ratios against gloo paired by round),
memory per rank against the closed form (half of DDP's at 2 ranks), parameters equal to DDP's,
the tables; bad flags; and the FSDP step model in closed form on synthetic profiles."""

import json
import statistics

import pytest
from conftest import run_mpi
from test_train import cell_figure, check_figure, table_cells

import algorithms

from bench.baselines.gloo import problem as gloo_problem
from bench.train.predict_fsdp import Profile, predict

needs_torch = pytest.mark.skipif(gloo_problem() is not None, reason=gloo_problem() or "")

LAYERS, WIDTH = 2, 64
UNIT_BYTES = (WIDTH * WIDTH + WIDTH) * 4  # one Linear layer's fp32 weight and bias
PARAMETERS = LAYERS * (WIDTH * WIDTH + WIDTH)
ROUNDS, STEPS = 2, 2
LABELS = ["noop", "gloo", "ring", "ring+ovl"]
KEYS = {"strategy", "algorithm", "overlap", "prefetch", "dtype", "reshard_after_forward", "step_ms", "step",
        "step_p95_ms", "compute_ms", "compute", "exposed_ms", "exposed", "forward_ms", "forward",
        "exposed_all_gather_ms", "exposed_all_gather", "exposed_reduce_scatter_ms", "exposed_reduce_scatter",
        "blocked_ms", "units", "tail_ms", "predicted_exposed_ms", "predicted_exposed", "predicted_step_ms",
        "predicted_parts_ms", "predicted_synchronous_ms", "predicted_overlapped_ms", "predicted_collectives",
        "prediction_error", "prediction_within", "step_vs_gloo", "exposed_vs_gloo", "memory", "params_identical",
        "vs_ddp_max_rel_diff", "compute_vs_ddp", "rounds"}
PARTS = ("all_gather_forward", "all_gather_backward", "reduce_scatter")


def label(run):
    return run["algorithm"] + ("+ovl" if run["overlap"] and run["algorithm"] != "gloo" else "")


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    """One 2-rank run of both strategies: DDP's noop, gloo, ring and ring+ovl, and FSDP's, with
    reshard-after-forward on and off."""
    document = tmp_path_factory.mktemp("fsdp") / "train.json"
    proc = run_mpi(2, ["-m", "bench", "train", "--strategy", "ddp,fsdp", "--algo", "ring,gloo,noop",
                       "--overlap", "off,on", "--reshard-after-forward", "on,off", "--layers", str(LAYERS),
                       "--width", str(WIDTH), "--batch", "4", "--warmup", "1", "--steps", str(STEPS),
                       "--rounds", str(ROUNDS), "-J", str(document), "--plot", str(document.with_suffix(".png"))],
                   timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(document.read_text())


@needs_torch
def test_fsdp_picture_beside_the_ddp_one(fsdp):
    """--plot FILE.png draws the DDP runs there and the FSDP runs' parts in FILE-fsdp.png: a
    PNG with a panel per dtype and reshard choice."""
    proc, doc = fsdp
    for name in ("train.png", "train-fsdp.png"):
        assert "# wrote " in proc.stdout and name in proc.stdout
    picture = next(line.split()[-1] for line in proc.stdout.splitlines() if line.endswith("-fsdp.png"))
    with open(picture, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@needs_torch
def test_fsdp_runs_and_their_figures(fsdp):
    """Every FSDP run after the DDP runs, in the same rotated rounds; each round's exposed time is
    its step - noop's, split into the forward's all-gathers (forward - noop's forward), the
    reduce-scatters (time blocked in them - noop's) and the backward's all-gathers (the rest,
    none gathered with reshard-after-forward off); each figure the median of its rounds; noop's
    step over DDP's noop step paired by round."""
    _, document = fsdp
    runs, ddp = document["fsdp_runs"], document["runs"]
    assert [label(r) for r in ddp] == LABELS and all("strategy" not in r for r in ddp)
    assert [(label(r), r["reshard_after_forward"]) for r in runs] == [(n, on) for on in (True, False) for n in LABELS]
    for j, run in enumerate(ddp + runs):
        assert run["rounds"]["place"] == [(j - i) % (len(ddp) + len(runs)) for i in range(ROUNDS)]
    for run in runs:
        assert KEYS <= set(run), KEYS - set(run)
        assert run["strategy"] == "fsdp" and run["prefetch"] == (run["algorithm"] == "gloo" or run["overlap"])
        noop = next(r for r in runs if r["algorithm"] == "noop"
                    and r["reshard_after_forward"] == run["reshard_after_forward"])
        per, base = run["rounds"], noop["rounds"]
        assert per["step_ms"] == pytest.approx([statistics.median(s) for s in per["steps_ms"]])
        assert per["compute_ms"] == base["step_ms"]
        ddp_noop = ddp[LABELS.index("noop")]["rounds"]["step_ms"]  # FSDP's own work: its compute over DDP's
        check_figure(run["compute_vs_ddp"], [a / b for a, b in zip(per["compute_ms"], ddp_noop)])
        exposed = [s - c for s, c in zip(per["step_ms"], base["step_ms"])]
        assert per["exposed_ms"] == pytest.approx(exposed)
        forward = [f - b for f, b in zip(per["forward_ms"], base["forward_ms"])]
        scatter = [b - r for b, r in zip(per["blocked_reduce_scatter_ms"], base["blocked_reduce_scatter_ms"])]
        assert per["exposed_all_gather_forward_ms"] == pytest.approx(forward)
        assert per["exposed_reduce_scatter_ms"] == pytest.approx(scatter)
        assert per["exposed_all_gather_backward_ms"] == pytest.approx(
            [e - f - s for e, f, s in zip(exposed, forward, scatter)])
        for name, figure in (("step", run["step"]), ("exposed", run["exposed"]), ("forward", run["forward"]),
                             ("exposed_all_gather_forward", run["exposed_all_gather"]["forward"]),
                             ("exposed_all_gather_backward", run["exposed_all_gather"]["backward"]),
                             ("exposed_reduce_scatter", run["exposed_reduce_scatter"])):
            check_figure(figure, per[f"{name}_ms"])
        gathered_again = run["blocked_ms"]["all_gather_backward"]
        assert gathered_again > 0 if run["reshard_after_forward"] and run["algorithm"] != "noop" else \
            gathered_again == 0 if not run["reshard_after_forward"] else True
        assert [u["bytes"] for u in run["units"]] == [UNIT_BYTES] * LAYERS
        assert all(u["forward_ms"] > 0 and u["backward_ms"] > 0 for u in run["units"])
        if run["algorithm"] in ("noop", "gloo"):
            assert run["exposed_vs_gloo"] is None
            continue
        gloo = next(r for r in runs if r["algorithm"] == "gloo"
                    and r["reshard_after_forward"] == run["reshard_after_forward"])
        each = [a / b for a, b in zip(exposed, gloo["rounds"]["exposed_ms"]) if b > 0]
        if each:
            check_figure(run["exposed_vs_gloo"], each)


@needs_torch
def test_fsdp_memory_and_parameters(fsdp):
    """At 2 ranks each rank holds half of DDP's parameters and gradients (SGD without momentum
    keeps no state), exactly here (every dimension even); the parameters, put together by each
    run's own all-gather, are the same on both ranks and equal DDP's (noop's differ: its
    all-gather moves nothing)."""
    proc, document = fsdp
    ddp_bytes = 2 * PARAMETERS * 4  # parameters + gradients, fp32
    for run in document["fsdp_runs"]:
        memory = run["memory"]
        assert memory["ddp_total"] == ddp_bytes and memory["optimizer"] == 0
        assert memory["parameters"] == memory["gradients"] == PARAMETERS * 4 // 2
        assert memory["total"] <= ddp_bytes / 2 * 1.1 and memory["vs_ddp"] == 0.5 and memory["expected"] == 0.5
        if run["algorithm"] == "noop":
            assert run["params_identical"] is False and run["vs_ddp_max_rel_diff"] is None
        else:
            assert run["params_identical"] is True and run["vs_ddp_max_rel_diff"] <= 1e-6
    assert document["wrong"] == []
    from bench.train.fsdp import CHECKS, PARTS_COLUMNS, TIMES  # torch's

    table = fsdp_rows(proc.stdout)
    keys = sorted((label(r), "on" if r["reshard_after_forward"] else "off") for r in document["fsdp_runs"])
    assert sorted(table) == keys
    for run in document["fsdp_runs"]:
        cells = table[label(run), "on" if run["reshard_after_forward"] else "off"]
        assert set(cells) == set(TIMES[3:] + PARTS_COLUMNS[3:] + CHECKS[3:])
        assert cells["held/ddp"] == "0.500 (0.500)"
        assert cells["params"] == ("differ" if run["algorithm"] == "noop" else "same")
        ratio = run["exposed_vs_gloo"]
        assert cells["exposed/gloo"] == "-" if ratio is None else (
            cells["exposed/gloo"].endswith(" tie") == (ratio["verdict"] == "tie"))
        if ratio is not None:
            assert cell_figure(cells["exposed/gloo"].removesuffix(" tie")) == pytest.approx(
                [ratio["median"], ratio["ci_low"], ratio["ci_high"]], rel=6e-3, abs=1e-9), cells
        for name, figure in (("step", run["step"]), ("exposed", run["exposed"]),
                             ("AG fwd", run["exposed_all_gather"]["forward"]),
                             ("AG bwd", run["exposed_all_gather"]["backward"]),
                             ("RS", run["exposed_reduce_scatter"])):  # 3 significant digits
            assert cell_figure(cells[name]) == pytest.approx([figure["median"], figure["ci_low"], figure["ci_high"]],
                                                             rel=6e-3, abs=1e-9), (name, cells)
    assert max(len(line) for line in proc.stdout.splitlines()) <= 120


@needs_torch
def test_fsdp_prediction_from_the_noop_profile(fsdp):
    """noop exposes nothing; a synchronous run's predicted parts are its all-gathers (in the
    forward, and again in the backward only with reshard-after-forward on) and reduce-scatters,
    every one on the critical path; the error is predicted over measured."""
    _, document = fsdp
    for run in document["fsdp_runs"]:
        parts = run["predicted_parts_ms"]
        assert run["predicted_exposed_ms"] == pytest.approx(sum(parts.values()))
        if run["algorithm"] == "noop":
            assert run["predicted_exposed_ms"] == 0 and run["prediction_error"] is None
            continue
        kinds = [c["kind"] for c in run["predicted_collectives"]]
        assert kinds.count("all_gather") == LAYERS * (2 if run["reshard_after_forward"] else 1)
        assert kinds.count("reduce_scatter") == LAYERS
        assert parts["all_gather_forward"] > 0 and parts["reduce_scatter"] > 0
        if not run["prefetch"]:
            assert run["predicted_exposed_ms"] == pytest.approx(run["predicted_synchronous_ms"])
            assert parts["all_gather_backward"] == pytest.approx(
                parts["all_gather_forward"] if run["reshard_after_forward"] else 0)
        measured = statistics.median(run["rounds"]["exposed_ms"])
        if measured > 0:
            assert run["prediction_error"] == pytest.approx(run["predicted_exposed_ms"] / measured - 1)


def fsdp_rows(text):
    """{(label, reshard): {column: cell}} of the FSDP section's tables (times, exposed parts, and
    the ratio to gloo, memory and parameters)."""
    return {(cells[0], cells[2]): columns for cells, columns in table_cells(text.split("# FSDP (", 1)[1]).items()}


@pytest.mark.parametrize("args,message", [
    (["--strategy", "ddp,zero"], "--strategy ddp,zero: a comma list of ddp, fsdp"),
    (["--strategy", "fsdp", "--reshard-after-forward", "maybe"],
     "--reshard-after-forward maybe: a comma list of on, off"),
    (["--strategy", "fsdp", "--algo", "ring,{whole}"],
     "--strategy fsdp: no all-gather and reduce-scatter in --algo {whole}; choices: ring,"),
])
def test_bad_fsdp_flags_end_every_rank_with_one_line(args, message):
    """{whole}: an algorithm without an all-gather and a reduce-scatter of its own."""
    whole = next((a for a in algorithms.ALGORITHMS if a not in algorithms.HALVES["all_gather"]), None)
    if "{whole}" in message and whole is None:
        pytest.skip("every algorithm has an all-gather")
    args, message = [a.format(whole=whole) for a in args], message.format(whole=whole)
    proc = run_mpi(2, ["-m", "bench", "train", *args], timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"python -m bench train: error: {message}"), proc.stderr
    assert proc.stdout == ""


# ---------------------------------------------------------------- the model in closed form

def constant(seconds):
    return lambda nbytes: seconds


@pytest.mark.parametrize("reshard", [True, False])
def test_synchronous_exposes_every_collective(reshard):
    """Nothing overlaps: exposed = sum a_k (forward) + sum a_k (backward, reshard on) + sum r_k,
    whatever the compute; the step is the compute plus that."""
    profile = Profile((3.0, 1.0, 2.0), (5.0, 2.0, 4.0), (10, 20, 30), 0.5)
    made = predict(profile, lambda b: b / 10, lambda b: b / 20, reshard)
    assert made.exposed == pytest.approx({"all_gather_forward": 6.0, "all_gather_backward": 6.0 if reshard else 0.0,
                                          "reduce_scatter": 3.0})
    assert made.step_s == pytest.approx(profile.compute_s + made.exposed_s) and profile.compute_s == 17.5


@pytest.mark.parametrize("overlap_rs", [True, False])
def test_one_unit_hides_nothing(overlap_rs):
    """One unit: no layer to prefetch behind, no backward to reduce-scatter behind: 2a + r with
    reshard on, a + r off, overlapped or not."""
    profile = Profile((4.0,), (6.0,), (1,))
    for reshard, expected in ((True, 2 * 1.5 + 2.5), (False, 1.5 + 2.5)):
        for overlap in (False, True):
            made = predict(profile, constant(1.5), constant(2.5), reshard, overlap, overlap and overlap_rs)
            assert made.exposed_s == pytest.approx(expected)


def test_with_compute_to_hide_behind_only_the_first_gathers_and_last_scatter_show():
    """Each unit computes longer than any collective: the forward exposes its first all-gather, the
    backward its first (reshard on) and its last reduce-scatter (overlapped), or every
    reduce-scatter where they are not overlapped (FSDP2 on CPU)."""
    profile = Profile((10.0,) * 4, (20.0,) * 4, (1,) * 4, 1.0)
    made = predict(profile, constant(1.0), constant(2.0), True, True, True)
    assert made.exposed == pytest.approx({"all_gather_forward": 1.0, "all_gather_backward": 1.0,
                                          "reduce_scatter": 2.0})
    made = predict(profile, constant(1.0), constant(2.0), True, True, False)
    assert made.exposed == pytest.approx({"all_gather_forward": 1.0, "all_gather_backward": 1.0,
                                          "reduce_scatter": 4 * 2.0})
    made = predict(profile, constant(1.0), constant(2.0), False, True, True)
    assert made.exposed == pytest.approx({"all_gather_forward": 1.0, "all_gather_backward": 0.0,
                                          "reduce_scatter": 2.0})


@pytest.mark.parametrize("overlap_rs", [True, False])
def test_a_slow_network_makes_the_step_the_wire_time(overlap_rs):
    """Collectives far longer than the compute (a = r = 10 s, f = b = 1 s, K = 3): the wire never
    idles but in the last unit's forward; the forward takes K a + f (that forward after its
    all-gather), the backward K (a + r), plus b where reduce-scatters stall it (the first unit's
    backward waits for the reduce-scatter before it), then the tail."""
    units, f, b, a, r, tail = 3, 1.0, 1.0, 10.0, 10.0, 0.5
    profile = Profile((f,) * units, (b,) * units, (1,) * units, tail)
    made = predict(profile, constant(a), constant(r), True, True, overlap_rs)
    assert made.step_s == pytest.approx(units * a + f + units * (a + r) + (0 if overlap_rs else b) + tail)
    assert made.exposed["all_gather_forward"] == pytest.approx(units * a + f - units * f)
    spans = sorted(made.spans, key=lambda s: s[2])
    forward, backward = spans[:units], spans[units:]
    assert forward[0][2] == 0 and backward[0][2] == pytest.approx(units * a + f)  # the wire idles in the last forward
    gaps = [later[2] - earlier[3] for part in (forward, backward) for earlier, later in zip(part, part[1:])]
    # and nowhere else, but in the first unit's backward where reduce-scatters stall it
    assert gaps == pytest.approx([0.0] * (len(gaps) - 1) + [0.0 if overlap_rs else b])


def test_shared_cores_make_an_overlapped_step_synchronous():
    """Where every collective's time is processor work on cores the compute needs (taken = 1),
    overlapping hides nothing: the synchronous schedule's exposure."""
    profile = Profile((10.0,) * 3, (20.0,) * 3, (1,) * 3, 1.0)
    synchronous = predict(profile, constant(1.0), constant(2.0), True)
    shared = predict(profile, constant(1.0), constant(2.0), True, True, False, taken=1.0)
    assert shared.exposed == pytest.approx(synchronous.exposed)
    spare = predict(profile, constant(1.0), constant(2.0), True, True, False, taken=0.0)
    assert spare.exposed_s < shared.exposed_s


@needs_torch
def test_the_profile_comes_from_the_reference_calls():
    """Two layers, reshard-after-forward on, times in seconds from the step's start: the forward
    gathers layer 0 at 1 (the lead counted to layer 0) and layer 1 at 4, the loss at 9; the
    backward gathers layer 1 (10) and prefetches layer 0 (11), reduce-scatters layer 1 (14-15),
    then layer 0 (19-20), the step ends at 22. Each layer's forward runs from its gather's call
    to the next one's, its backward from the previous reduce-scatter's return to its own; they
    add up to the step."""
    from bench.train.fsdp import Call, marks

    calls = [Call("all_gather", "forward", 100, 1.0, 1.5), Call("all_gather", "forward", 200, 4.0, 4.5),
             Call("all_gather", "backward", 200, 10.0, 10.5), Call("all_gather", "backward", 100, 11.0, 11.5),
             Call("reduce_scatter", "backward", 200, 14.0, 15.0), Call("reduce_scatter", "backward", 100, 19.0, 20.0)]
    forward, backward, nbytes, tail = marks(calls, 0.0, 9.0, 22.0)
    assert forward == (4.0, 5.0) and backward == (5.0, 6.0) and nbytes == (100, 200) and tail == 2.0
    assert sum(forward) + sum(backward) + tail == 22.0
    assert marks([], 0.0, 9.0, 22.0) == ((), (), (), 22.0)  # one rank: FSDP calls no collective
    assert calls[0].blocked == 0.5 and Call("all_gather", "forward", 1, 0.0, 0.5, waited=2.0).blocked == 2.5
