"""``mpiexec -n N python -m bench train``: what all-reduce costs a PyTorch DDP training step, per
algorithm, bucket size and dtype, measured on a synthetic model in interleaved rounds (every
figure with its 95% interval, every comparison with gloo paired by round) and set beside its
prediction from a compute profile and the cost model.

Each configuration trains the same synthetic model (an MLP, or transformer encoder layers) from
the same parameters under DDP (forward, backward, SGD), its gradients all-reduced by one of: our
algorithms through the DDP hook of algorithms.torch (synchronous, or overlapping on a
communication thread with --overlap on), DDP's own gloo all-reduce (gloo), or nothing (noop: the
hook returns each bucket untouched, so the step is computation alone, the compute time T_c).

How it measures: every configuration is built once and runs its --warmup steps; then come
--rounds rounds, and in each every configuration runs --steps timed steps and then has each of
its bucket sizes' all-reduces timed alone. The configurations take their turns in an order
rotated by one each round, so a slow moment of a shared machine falls on all of them alike and
none always runs first. A round's step time is the median of its steps, each the slowest rank's.
Every figure is the median over the rounds with its 95% confidence interval [low, high] (order
statistics of the rounds, no normality assumed; from 6 rounds on, fewer give their whole range
and say what it holds). Every comparison is paired: the ratio of two configurations in each
round, then the median and interval of those ratios; where that interval holds 1 the two tie.

Per configuration: step time, compute (the noop run's step of the same bucket cap and dtype, in
the same round), exposed communication (each round's step - compute), the exposed communication
over gloo's (paired by round: tie, lower or higher), its prediction and the error, the 95th
percentile of every step, the step's measured parts, busbw of the bucket all-reduces, the share of all-reduce time hidden behind
the backward pass (overlap mode), and whether the parameters came out bit for bit the same on
every rank. Per bucket size of our algorithms, the synchronous hook's time over a bare
algorithms.allreduce of the same bytes, paired by round, against the target of at most 1.05x:
met where the interval's upper end is at most 1.05, missed where its lower end is above 1.05,
undecided by the measurement otherwise.

The prediction (bench.tools.step_model, docs/training.md) takes the compute profile of the noop
run of the same bucket cap, dtype and round (its step, the backward time, when each bucket became
ready) and each bucket's all-reduce time from the cost model (bench model's) on the links of
--topology, or of a probe of the ranks run first: nothing timed in the run it predicts. A
synchronous hook stalls the backward pass for every bucket (exposed = the sum of their times);
DDP's own all-reduce and the overlapping hook send bucket k at max(its ready time, the end of
bucket k-1), and only what ends after the backward pass is exposed; where a rank has no core to
spare beside its torch threads, an asynchronous all-reduce's processor work (all of it on one
node's shared memory) comes out of the backward pass. error: predicted / measured - 1 of the
exposed time. parts (model_step_ms in -J): the same round's measurements added up, a check.

Overlap is measured: the hook records when it got each bucket and when its all-reduce started
and ended; what ends after the last bucket came is exposed, the rest hidden (the hidden column,
median over steps, then rounds; --timeline draws them).

Parameters: a run that all-reduces must leave every rank with bit-identical parameters after its
last round; vs gloo is the largest max|p - g| / max|g| over the parameters against the gloo run
of the same bucket size and dtype (close, not equal: DDP's gloo path divides each gradient by
the rank count before summing, ours sums, then divides). noop's differ across ranks by
construction (each rank keeps its own gradients). Any all-reducing run whose parameters differ
is wrong: every run finishes, then one line says which, and the exit status is 1 (as nccl-tests'
#wrong). Exit status 2: bad flags or settings.

--strategy fsdp (bench.tools.train_fsdp) trains the same model sharded by FSDP2 (fully_shard on
each layer, then the root), per dtype and --reshard-after-forward choice: noop (collectives that
move nothing between ranks: its step is the compute), gloo (FSDP's own) and ours through
algorithms.torch.shard_with; per run the step, the exposed all-gathers (forward, backward) and
reduce-scatters beside their prediction (bench.tools.step_model_fsdp), the memory a rank holds
against DDP's (1/N expected) and the parameters against DDP's, in the same rounds.
"""

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import algorithms
from plumbing.cli import Parser
from plumbing.ending import fail_together
from plumbing.files import write_json_atomically
from topology.probe import probe

from ..baselines.gloo import GlooBaseline
from ..baselines.gloo import problem as gloo_problem
from ..core.cli import add_algo_flag, add_dtype_flag, algos_in
from ..core.machine import now, results_header
from ..core.options import shared_topology
from ..core.startup import refused
from ..core.timing import interleaved
from ..formats import stats
from ..formats.tables import comment, description, epilog, plural, significant
from .step_model import Predictor, exposed_after, prediction_fields
from .train_figures import against_gloo, figure, gloo_ratio_cell, mib, number, percentile, ratios, span, table_lines
from .train_fsdp_plot import fsdp_path
from .train_fsdp_plot import plot as fsdp_plot
from .train_plot import plot
from .train_timeline import draw as timeline
from .train_timeline import trace_path

PROG = "python -m bench train"
SPECIAL = ("gloo", "noop")
TRAINED = tuple(t for t in algorithms.TYPES if t.train)  # the types DDP trains in here, from the table: fp32, bf16
VERSION = 2  # of the -J document (2: every figure over rounds, with its interval)
HOOK_BOUND = 1.05  # the target: the hook at most 5% over a bare all-reduce of the same bytes
PROBE_BYTES = 4 << 20  # the probe's messages, where no --topology is given


def parser():
    p = Parser(prog=PROG, description=description(__doc__), epilog=epilog(__doc__),
               formatter_class=argparse.RawDescriptionHelpFormatter)
    add_algo_flag(p, "auto,ring,gloo,noop", f"comma list of all-reduces: our algorithms "
                  f"({','.join(algorithms.ALGORITHMS)}) through the DDP hook, gloo (DDP's own all-reduce, no hook), "
                  "noop (no all-reduce: the compute time; it always runs) (default auto,ring,gloo,noop)")
    p.add_argument("--bucket-mb", default="25",
                   help="comma list of DDP bucket caps (bucket_cap_mb), in MiB (default 25)")
    add_dtype_flag(p, "fp32", "comma list of parameter and gradient types", flags=("--dtype",), many=True,
                   among=TRAINED)
    p.add_argument("--overlap", default="off",
                   help="comma list of off (the hook reduces each bucket before backward goes on), on (on a "
                        "communication thread while backward goes on); our algorithms run once for each "
                        "(default off)")
    p.add_argument("--strategy", default="ddp",
                   help="comma list of ddp (DistributedDataParallel), fsdp (FSDP2's fully_shard on each layer, then "
                        "the root: all-gathers and reduce-scatters; our algorithms through "
                        "algorithms.torch.shard_with, gloo FSDP's own, noop moving nothing) (default ddp)")
    p.add_argument("--reshard-after-forward", default="on",
                   help="comma list of on, off: whether FSDP frees each layer's gathered parameters after its "
                        "forward (and gathers them again in the backward); fsdp runs once for each (default on)")
    p.add_argument("--model", default="mlp", choices=("mlp", "transformer"),
                   help="the synthetic model: mlp (Linear + ReLU layers) or transformer (nn.TransformerEncoderLayer "
                        "blocks, 32 tokens a sample) (default mlp)")
    p.add_argument("--layers", type=int, default=6, help="layers (or encoder blocks) of the model (default 6)")
    p.add_argument("--width", type=int, default=2048,
                   help="width of each layer (the transformer's d_model) (default 2048: about 25 M parameters)")
    p.add_argument("--batch", type=int, default=32, help="samples a rank per step (default 32)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps of each configuration, once, before the rounds (default 2)")
    p.add_argument("--rounds", type=int, default=10,
                   help="rounds, each running every configuration once in an order rotated by one each round; "
                        "from 6 on the intervals are 95%% ones (default 10)")
    p.add_argument("--steps", type=int, default=2, help="timed steps of each configuration a round (default 2)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initial parameters (the same on every rank) and of the data (its rank "
                        "added: each rank's own) (default 0)")
    p.add_argument("--topology", metavar="FILE",
                   help="the links the prediction models, a bandwidth matrix from python -m topology probe -o FILE "
                        "(default: a probe of these ranks, 4 MiB messages, before the rounds)")
    p.add_argument("-J", "--json", metavar="FILE",
                   help="write the header and every run as JSON, after every round (default: none)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw step time against bucket size, measured and predicted, with the compute time; "
                        "the FSDP runs' parts of a step, measured and predicted, as FILE-fsdp.png (default: none)")
    p.add_argument("--timeline", metavar="FILE.png",
                   help="draw each run's buckets against the backward pass, measured beside predicted, and write "
                        "them as a Chrome trace, FILE.trace.json (default: none)")
    return p


def comma_list(text, kind=str):
    return [kind(item.strip()) for item in text.split(",") if item.strip()]


def check_flags(args):
    """(algorithms, bucket sizes, dtypes, overlap choices, strategies, reshard choices), or raise
    ValueError saying what is wrong."""
    try:
        buckets = comma_list(args.bucket_mb, float)
    except ValueError:
        raise ValueError(f"--bucket-mb {args.bucket_mb}: not a comma list of numbers") from None
    names = [*algorithms.ALGORITHMS, *SPECIAL]
    algos = algos_in(args.algo, dict(zip(names, names)), every=None)
    dtypes = [row.train for row in args.dtype.rows]
    overlaps = comma_list(args.overlap)
    if not overlaps or any(o not in ("off", "on") for o in overlaps):
        raise ValueError(f"--overlap {args.overlap}: a comma list of off, on")
    if not buckets or min(buckets) <= 0:
        raise ValueError("--bucket-mb: sizes must be positive")
    for flag in ("layers", "width", "batch", "threads", "steps", "rounds"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be at least 1")
    if args.warmup < 1:
        raise ValueError("--warmup must be at least 1 (DDP settles its buckets in the first step)")
    strategies, reshards = comma_list(args.strategy), comma_list(args.reshard_after_forward)
    if not strategies or any(s not in ("ddp", "fsdp") for s in strategies):
        raise ValueError(f"--strategy {args.strategy}: a comma list of ddp, fsdp")
    if not reshards or any(r not in ("on", "off") for r in reshards):
        raise ValueError(f"--reshard-after-forward {args.reshard_after_forward}: a comma list of on, off")
    halves = [a for a in algorithms.HALVES["all_gather"] if a in algorithms.HALVES["reduce_scatter"]]
    if "fsdp" in strategies and [a for a in algos if a not in (*halves, *SPECIAL)]:
        raise ValueError(f"--strategy fsdp: no all-gather and reduce-scatter in --algo "
                         f"{','.join(a for a in algos if a not in (*halves, *SPECIAL))}; choices: {','.join(halves)}")
    return (list(dict.fromkeys(algos)), list(dict.fromkeys(buckets)), list(dict.fromkeys(dtypes)),
            [o == "on" for o in dict.fromkeys(overlaps)], list(dict.fromkeys(strategies)),
            [r == "on" for r in dict.fromkeys(reshards)])


def torch_problem():
    """Why this tool cannot run here (text), else None."""
    try:
        import torch  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"needs PyTorch: pip install -e '.[gloo]' ({type(exc).__name__}: {exc})"
    return gloo_problem()


def probe_problem(comm, ours, dtypes, ts):
    """Whether each of our algorithms reduces each dtype here: one tiny all-reduce of each
    (collective); the first refusal as text, else None."""
    for name in ours:
        for dtype in dtypes:
            x = np.zeros(1, ts.DTYPES[dtype][1])
            try:
                algorithms.allreduce(x, x, op="avg", algorithm=name, comm=comm)
            except (TypeError, ValueError) as exc:
                return f"--algo {name} --dtype {dtype}: {exc}"
    return None


def specs(algos, buckets, dtypes, overlaps, ts):
    """Every run, in order: per dtype and bucket size, noop first, then gloo, then ours (each overlap choice)."""
    ours = [a for a in algos if a not in SPECIAL]
    runs = []
    for dtype in dtypes:
        for bucket in buckets:
            runs.append(ts.Spec(ts.NOOP, False, bucket, dtype))
            if ts.GLOO in algos:
                runs.append(ts.Spec(ts.GLOO, True, bucket, dtype))
            runs += [ts.Spec(a, overlap, bucket, dtype) for a in ours for overlap in overlaps]
    return runs


# ---------------------------------------------------------------- text

TIMES = ("algorithm", "bucket", "dtype", "step", "exposed", "predicted", "error")  # compute: noop's
TIMES_UNITS = ("", "(MiB)", "", "(ms)", "(ms)", "(ms)", "")
CHECKS = ("algorithm", "bucket", "dtype", "exposed/gloo", "p95", "parts", "busbw", "hidden", "params", "vs gloo")
CHECKS_UNITS = ("", "(MiB)", "", "", "(ms)", "(ms)", "(GB/s)", "", "", "")


def label(run):
    """ "ring", "ring+ovl" (the communication thread), "gloo"."""
    return run["algorithm"] + ("+ovl" if run["overlap"] and run["algorithm"] != "gloo" else "")


def time_cells(run):
    """The cells of a run's row in the table of times: step, exposed, predicted exposed, error."""
    error = run.get("prediction_error")
    return (label(run), f"{run['bucket_mb']:g}", run["dtype"], span(run["step"]), span(run["exposed"]),
            number(run["predicted_exposed_ms"]) if run.get("predicted_exposed_ms") is not None else "-",
            "-" if error is None else f"{error * 100:+.0f}%" + (" in" if run["prediction_within"] else ""))


def check_cells(run):
    """The cells of a run's row in the second table: exposed over gloo's ("tie" after a ratio whose
    interval holds 1), p95, parts, busbw, hidden, parameters."""
    params = "same" if run["params_identical"] else ("differ" if run["algorithm"] == "noop" else "WRONG")
    hidden = "-" if run["overlap_reached"] is None else f"{run['overlap_reached'] * 100:.0f}%"
    rel = run["vs_gloo_max_rel_diff"]
    return (label(run), f"{run['bucket_mb']:g}", run["dtype"], gloo_ratio_cell(run["exposed_vs_gloo"]),
            number(run["step_p95_ms"]), span(run["model_step"]),
            "-" if run["busbw"] is None else significant(run["busbw"]), hidden, params,
            "-" if rel is None else f"{rel:.1e}")


def header_lines(doc):
    m, info = doc["model"], doc["machine"]
    crowded = doc["oversubscribed"]
    texts = [
        f"{PROG}: {plural(doc['ranks'], 'rank')} on {plural(doc['nodes'], 'node')} ({info['host']}), "
        f"torch {doc['torch']}, MPI: {' '.join(info['mpi'].split())}, commit {info['commit']}",
        f"model: {m['description']}: {m['parameters']:,} parameters ({mib(m['parameters'] * 4)} of fp32 gradients "
        f"a step); batch {m['batch']} a rank, {plural(doc['threads'], 'torch thread')} a rank, seed {m['seed']}",
        f"each configuration: {plural(doc['warmup'], 'warm-up step')}, then {doc['rounds']} rounds of "
        f"{plural(doc['steps'], 'timed step')} (forward, MSE loss, backward, SGD) and its buckets' all-reduces timed "
        "alone; every configuration once a round, in an order rotated by one each round; a step's time is the "
        "slowest rank's, a round's the median of its steps; DDP over a gloo process group",
        "every figure: the median over the rounds [its 95% confidence interval]; every ratio paired by round, a tie "
        "where its interval holds 1",
        "noop: no all-reduce (compute only); gloo: DDP's own all-reduce (asynchronous); +ovl: our hook on a "
        "communication thread; hidden: its all-reduce time before the backward pass ended, from its records",
        f"predicted: the exposed communication from the noop run's compute profile of the same round (compute, "
        f"backward, each bucket's ready time) and the cost model of each algorithm on {doc['predicted_from']}, nothing "
        "timed in the run predicted; gloo as DDP's ring, asynchronous; error: predicted / measured - 1, 'in' where "
        "the prediction lies in the measured interval",
        "parts: compute + the buckets' all-reduces timed alone in the same round, sent as DDP sends them: an account "
        "of the run's step (a consistency check), not a prediction",
    ]
    held = stats.coverage(doc["rounds"])
    if held < stats.LEVEL:
        texts.append(f"warning: {plural(doc['rounds'], 'round')} reach no 95% interval: each interval is the whole "
                     f"range of the rounds and holds the median with {held * 100:.1f}%; 6 rounds reach 95%")
    if doc["cores_shared"]:
        texts.append(f"cores shared: {doc['cores_shared']}: an asynchronous all-reduce's processor time comes out of "
                     "the backward pass; the prediction counts its processor work as exposed, the parts its measured CPU "
                     "share")
    if crowded:
        texts.append(f"warning: {crowded}: the times measure the scheduler as much as the all-reduces")
    return [comment(text) for text in texts]


def group_line(run):
    sizes = ", ".join(mib(b["bytes"]) for b in run["buckets"])
    return comment(f"bucket cap {run['bucket_mb']:g} MiB, {run['dtype']}: {plural(len(run['buckets']), 'bucket')} "
                   f"({sizes}), {mib(run['bytes_per_step'])} a step; the last ready {span(run['backward'])} ms "
                   "into the backward pass")


def hook_target(ratio, bound=HOOK_BOUND):
    """The target "at most ``bound`` x" judged on a ratio's :class:`stats.Interval`: "met" where
    its upper end is at most ``bound``, "missed" where its lower end is above it, else
    "undecided" (the measurement cannot tell)."""
    if ratio.high <= bound:
        return "met"
    return "missed" if ratio.low > bound else "undecided"


def hook_lines(runs, listed=8):
    """The summary's lines on the hook over a bare all-reduce: the count met, missed and
    undecided, then each (all where there are at most ``listed``, else those not met)."""
    pairs = {}
    for run in runs:
        for b in run["buckets"]:
            if b.get("hook_over_bare") is not None:
                pairs.setdefault((label(run), run["bucket_mb"], run["dtype"], b["bytes"]), b["hook_over_bare"])
    if not pairs:
        return []
    verdicts = [ratio["target"] for ratio in pairs.values()]
    texts = [f"the hook over a bare algorithms.allreduce of the same bytes, paired by round, against the target of at "
             f"most {HOOK_BOUND}x (met: the interval's upper end at most {HOOK_BOUND}; missed: its lower end above; "
             f"else undecided): {verdicts.count('met')} met, {verdicts.count('missed')} missed, "
             f"{verdicts.count('undecided')} undecided of {len(pairs)}"]
    for (name, bucket, dtype, nbytes), ratio in pairs.items():
        if len(pairs) <= listed or ratio["target"] != "met":
            texts.append(f"  {name}, {mib(nbytes)} {dtype} (cap {bucket:g} MiB): {span(ratio, 'x')}: {ratio['target']}")
    return texts


def summary_lines(runs):
    """The summary's lines, and the all-reducing runs whose parameters differ across ranks."""
    texts = ["", "Summary: per bucket cap and dtype, the compute time, the fastest all-reduce's step (and those that "
                 "tie with it), its efficiency E = compute / step, predicted and measured, paired by round"]
    groups = {}
    for run in runs:
        groups.setdefault((run["bucket_mb"], run["dtype"]), []).append(run)
    for (bucket, dtype), group in groups.items():
        reducing = {label(r): r for r in group if r["algorithm"] != "noop"}
        head = f"  {bucket:g} MiB {dtype}: compute {span(group[0]['compute'])} ms"
        if not reducing:
            texts.append(head)
            continue
        best, ties = stats.fastest({name: r["rounds"]["step_ms"] for name, r in reducing.items()})
        run = reducing[best]
        efficiency = stats.paired_ratio(run["rounds"]["compute_ms"], run["rounds"]["step_ms"]).as_dict()
        tied = f" (tie: {', '.join(ties[1:])})" if len(ties) > 1 else ""
        texts.append(f"{head}; fastest {best} {span(run['step'])} ms a step{tied}, {span(run['exposed'])} ms exposed, "
                     f"E = {span(efficiency)}" + (f", predicted {span(run['predicted_efficiency'])}"
                                                  if run.get("predicted_efficiency") else ""))
    texts += hook_lines(runs)
    if any(r["algorithm"] == "noop" and not r["params_identical"] for r in runs):
        texts.append("noop's parameters differ across ranks by construction: each rank keeps its own gradients")
    wrong = [r for r in runs if r["algorithm"] != "noop" and not r["params_identical"]]
    if not wrong:
        texts.append("parameters: bit for bit the same on every rank after every run that all-reduces")
    return [comment(text) if text else "#" for text in texts], wrong


# ---------------------------------------------------------------- rounds

def bucket_entries(spec, rounds, reference, size):
    """Per bucket in DDP's order ({"index", "bytes", then each figure's median and interval, and
    "rounds": each figure's values per round}), from the rounds as :func:`entry` takes them."""
    factor = 2 * (size - 1) / size
    hooked = bool(rounds[-1]["buckets"])  # gloo: no hook, the noop run's buckets
    made = []
    for b in (rounds if hooked else reference)[-1]["buckets"]:
        index, nbytes = b["index"], b["bytes"]
        per = {"ready_ms": [next(r["ready_ms"] for r in one["buckets"] if r["index"] == index) for one in reference],
               "allreduce_ms": [one["times"][nbytes] * 1e3 for one in rounds],
               "cpu_share": [one["shares"][nbytes] for one in rounds]}
        row = {"index": index, "bytes": nbytes}
        for name, values in per.items():
            row[name] = stats.median(values)
        row["ready"], row["allreduce"] = figure(per["ready_ms"]), figure(per["allreduce_ms"])
        row["busbw"] = nbytes / row["allreduce_ms"] * 1e3 * factor / 1e9 if spec.reduces and row["allreduce_ms"] \
            else None
        if hooked:
            per["hook_ms"] = [next(r["hook_ms"] for r in one["buckets"] if r["index"] == index) for one in rounds]
            row["hook_ms"], row["timeline_ms"] = stats.median(per["hook_ms"]), b["timeline_ms"]
        hook = [one["hooked"][nbytes] for one in rounds]
        row["hook_over_bare"] = None
        if None not in hook:  # our algorithms: the synchronous hook timed alone, in turn with the bare all-reduce
            per["hook_alone_ms"] = [t * 1e3 for t in hook]
            row["hook_alone_ms"] = stats.median(per["hook_alone_ms"])
            per["hook_over_bare"], ratio = ratios(hook, [one["times"][nbytes] for one in rounds])
            row["hook_over_bare"] = {**ratio.as_dict(), "target": hook_target(ratio)}
        row["rounds"] = per
        made.append(row)
    return made


def entry(spec, rounds, reference, gloo, shared, size, predictor=None):
    """One run's entry of the -J document from what each round measured (``rounds``:
    :meth:`train_step.Run.round`'s, one a round), beside the rounds of the noop run of the same
    bucket cap and dtype (``reference``; None for the noop run itself) and of its gloo run
    (``gloo``; None where none ran, and for gloo and noop); ``shared``: why the cores are shared
    (:func:`train_step.shared_cores`), None when each rank has one to spare. Every figure is the
    median over the rounds with its interval, the model's included (each round's from that
    round's measurements); every ratio is paired by round."""
    reference = rounds if reference is None else reference
    step = [stats.median(one["steps_s"]) * 1e3 for one in rounds]
    compute = [stats.median(one["steps_s"]) * 1e3 for one in reference]
    exposed = [s - c for s, c in zip(step, compute)]
    backward = [one["backward_ms"] for one in reference]
    buckets = bucket_entries(spec, rounds, reference, size)
    taken = spec.asynchronous and shared is not None  # its processor time comes out of the backward pass
    model_exposed = []
    for i, backward_ms in enumerate(backward):
        times = [b["rounds"]["allreduce_ms"][i] for b in buckets]
        shares = [b["rounds"]["cpu_share"][i] if taken else 0.0 for b in buckets]
        model_exposed.append(sum(t * c for t, c in zip(times, shares)) + exposed_after(
            [b["rounds"]["ready_ms"][i] for b in buckets], [t * (1 - c) for t, c in zip(times, shares)], backward_ms,
            blocking=not spec.asynchronous))
    model_step = [c + m for c, m in zip(compute, model_exposed)]
    per_step = [sum(b["rounds"]["allreduce_ms"][i] for b in buckets) for i in range(len(rounds))]
    nbytes = sum(b["bytes"] for b in buckets)
    total = stats.median(per_step)
    overlaps = [one["overlap"] for one in rounds]
    per = {"steps_ms": [[t * 1e3 for t in one["steps_s"]] for one in rounds], "step_ms": step, "compute_ms": compute,
           "exposed_ms": exposed, "model_step_ms": model_step, "model_exposed_ms": model_exposed,
           "backward_ms": backward, "allreduce_ms_per_step": per_step}
    made = {"algorithm": spec.algorithm, "overlap": spec.asynchronous, "bucket_mb": spec.bucket_mb,
            "dtype": spec.dtype, "step_ms": stats.median(step), "step": figure(step),
            "step_p95_ms": percentile([t * 1e3 for one in rounds for t in one["steps_s"]], 95)}
    for name in ("compute", "exposed", "model_step", "model_exposed", "backward"):
        made[f"{name}_ms"], made[name] = stats.median(per[f"{name}_ms"]), figure(per[f"{name}_ms"])
    made.update({
        "bytes_per_step": nbytes, "buckets": buckets, "allreduce_ms_per_step": total,
        "hook_ms_per_step": sum(b["hook_ms"] for b in buckets) if buckets and "hook_ms" in buckets[0] else None,
        "busbw": nbytes / total * 1e3 * 2 * (size - 1) / size / 1e9 if spec.reduces and total else None,
        "overlap_reached": None if None in overlaps else stats.median(overlaps),
        "step_vs_gloo": None, "exposed_vs_gloo": None, "params_identical": None, "vs_gloo_max_rel_diff": None,
        "rounds": per})
    made.update(prediction_fields(predictor, spec, reference, exposed))
    against_gloo(made, per, step, compute, gloo)
    return made


def entries(configs, measured, shared, size, pick, predictor=None):
    """Every run's entry (:func:`entry`) from ``measured`` ({spec: its rounds so far}); ``pick(bytes,
    dtype)``: what auto runs for a bucket; ``predictor``: a :class:`step_model.Predictor`."""
    made = []
    for spec in configs:
        group = {s.algorithm: measured[s] for s in configs if (s.bucket_mb, s.dtype) == (spec.bucket_mb, spec.dtype)}
        ours = spec.algorithm not in SPECIAL
        made.append(entry(spec, measured[spec], None if spec.algorithm == "noop" else group["noop"],
                          group.get("gloo") if ours else None, shared, size, predictor))
        if spec.algorithm == "auto":
            for b in made[-1]["buckets"]:
                b["auto_picked"] = pick(b["bytes"], spec.dtype)
    return made


def main(argv=None):
    args = parser().parse_args(argv)
    comm = MPI.COMM_WORLD
    problem = None
    try:
        algos, buckets, dtypes, overlaps, strategies, reshards = check_flags(args)
    except ValueError as exc:
        problem = str(exc)
    if fail_together(comm, PROG, problem) or fail_together(comm, PROG, torch_problem()):
        return 2
    import torch

    from . import train_step as ts  # needs torch
    torch.set_num_threads(args.threads)
    ours = [a for a in algos if a not in SPECIAL]
    outputs = [p for p in (args.json, args.plot, args.timeline, args.timeline and trace_path(args.timeline),
                           args.plot and "fsdp" in args.strategy and fsdp_path(args.plot)) if p]
    if refused(comm, PROG, outputs, tuning="auto" in ours):
        return 2
    if fail_together(comm, PROG, probe_problem(comm, ours, dtypes, ts)):
        return 2
    matrix, problem = None, None
    if args.topology:
        try:
            matrix = shared_topology(comm, args.topology)
        except ValueError as exc:
            problem = f"--topology: {exc}"
    if fail_together(comm, PROG, problem):
        return 2
    model = ts.Model(args.model, args.layers, args.width, args.batch, args.seed)
    shared = ts.shared_cores(comm, args.threads)
    text, count = model.describe()
    doc = {**results_header("train", VERSION, comm, ["train", *(sys.argv[1:] if argv is None else argv)]),
           "torch": torch.__version__, "threads": args.threads, "warmup": args.warmup, "rounds": args.rounds,
           "steps": args.steps, "coverage": round(stats.coverage(args.rounds), 4),
           "model": {"kind": args.model, "layers": args.layers, "width": args.width, "batch": args.batch,
                     "seed": args.seed, "parameters": count, "fp32_gradient_bytes": count * 4, "description": text},
           "cores_shared": shared, "complete": False, "runs": []}
    size = comm.Get_size()

    def pick(nbytes, dtype):
        return algorithms.auto.choice(nbytes, ts.DTYPES[dtype][1], comm=comm)[0]

    if matrix is None:
        matrix = probe(comm, PROBE_BYTES, reps=3, warmup=1)
    predictor = Predictor(matrix, pick, shared is not None)
    doc["predicted_from"] = (f"the links of {args.topology}" if args.topology else
                             f"a probe of these ranks ({PROBE_BYTES >> 20} MiB messages)") + \
        f", {plural(matrix.node_count, 'node')}"
    rank0 = comm.Get_rank() == 0
    if rank0:
        print("\n".join(header_lines(doc)), flush=True)
    configs = specs(algos, buckets, dtypes, overlaps, ts) if "ddp" in strategies else []
    if "fsdp" in strategies:
        from . import train_fsdp as tf  # needs torch
    sharded = tf.specs(algos, dtypes, overlaps, reshards) if "fsdp" in strategies else []
    sharded_model = sharded and tf.predictor(comm, matrix, shared is not None)
    measured = {spec: [] for spec in configs + sharded}
    runs = {}
    gloo = GlooBaseline()
    gloo.start(comm)
    try:
        for spec in configs:  # each built once, the noop run of its bucket cap and dtype before it
            noop = ts.Spec(ts.NOOP, False, spec.bucket_mb, spec.dtype)
            runs[spec] = ts.Run(comm, model, spec, args.warmup, runs.get(noop) if spec != noop else None)
        runs.update({spec: tf.Run(comm, model, spec, args.warmup) for spec in sharded})
        began = time.perf_counter()

        def measure(spec, index):
            measured[spec].append(runs[spec].round(args.steps))
            if all(len(rounds) == index + 1 for rounds in measured.values()):  # the round's last
                doc["runs"] = entries(configs, measured, shared, size, pick, predictor)
                if sharded:
                    doc["fsdp_runs"] = tf.entries(sharded, measured, sharded_model)
                if rank0:
                    print(comment(f"round {index + 1} of {args.rounds}: {time.perf_counter() - began:.1f} s"),
                          flush=True)
                    if args.json:
                        write_json_atomically(args.json, {**doc, "end_time": now()})

        _, places = interleaved(configs + sharded, args.rounds, measure)
        gloo_params = {}
        for spec, run in zip(configs, doc["runs"]):  # gloo before ours in each bucket cap and dtype
            key = (spec.bucket_mb, spec.dtype)
            parameters = runs[spec].parameters()
            if spec.algorithm == ts.GLOO:
                gloo_params[key] = parameters
            run["rounds"]["place"] = places[spec]
            run["ddp_logger"] = runs[spec].ddp_logger()
            run["params_identical"] = ts.identical(comm, parameters)
            if key in gloo_params and spec.algorithm not in SPECIAL:
                run["vs_gloo_max_rel_diff"] = ts.max_rel_diff(comm, parameters, gloo_params[key])
        wrong_sharded = sharded and tf.finish(comm, sharded, doc["fsdp_runs"], runs, {s: runs[s] for s in configs},
                                              places)
    finally:
        for run in runs.values():
            run.close()
        gloo.close()
    lines, wrong = summary_lines(doc["runs"])
    doc["complete"] = True
    doc["wrong"] = [label(r) + f" ({r['bucket_mb']:g} MiB, {r['dtype']})" for r in wrong]
    doc["wrong"] += [tf.describe(r) for r in wrong_sharded or []]
    if rank0:
        groups = [r for r in doc["runs"] if r["algorithm"] == "noop"]
        if doc["runs"]:
            print("\n".join([*map(group_line, groups),
                             comment(f"median [95% interval] over {plural(args.rounds, 'round')}; exposed = step - "
                                     "compute in each round; exposed/gloo: paired by round, a tie where the interval "
                                     "holds 1"),
                             *table_lines(TIMES, TIMES_UNITS, [time_cells(r) for r in doc["runs"]]), "#",
                             *table_lines(CHECKS, CHECKS_UNITS, [check_cells(r) for r in doc["runs"]]), *lines]),
                  flush=True)
        if sharded:
            print("\n".join(tf.lines(doc["fsdp_runs"], args.rounds)), flush=True)
        if args.json:
            write_json_atomically(args.json, {**doc, "end_time": now()})
            print(f"# wrote {args.json}")
        for picture, draw_it in ((args.plot, plot), (args.timeline, timeline)):
            if picture and doc["runs"]:
                draw_it(doc, picture)
                print(f"# wrote {picture}" + (f" and {trace_path(picture)}" if draw_it is timeline else ""))
        if args.plot and sharded:
            fsdp_plot(doc, fsdp_path(args.plot))
            print(f"# wrote {fsdp_path(args.plot)}")
        if doc["wrong"]:
            sys.stderr.write(f"{PROG}: error: parameters differ across ranks after the steps: "
                             f"{', '.join(doc['wrong'])}\n")
            sys.stderr.flush()
    return 1 if doc["wrong"] else 0
