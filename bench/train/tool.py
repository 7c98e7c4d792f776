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

The prediction (bench.train.predict, docs/training.md) takes the compute profile of the noop
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

--strategy fsdp (bench.train.fsdp) trains the same model sharded by FSDP2 (fully_shard on
each layer, then the root), per dtype and --reshard-after-forward choice: noop (collectives that
move nothing between ranks: its step is the compute), gloo (FSDP's own) and ours through
algorithms.torch.shard_with; per run the step, the exposed all-gathers (forward, backward) and
reduce-scatters beside their prediction (bench.train.predict_fsdp), the memory a rank holds
against DDP's (1/N expected) and the parameters against DDP's, in the same rounds.
"""

import argparse
import sys
import time
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

import algorithms
from plumbing.cli import Parser, comma_names
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
from ..formats.tables import comment, description, epilog, plural
from .figures import mib
from .timeline import draw as timeline
from .timeline import trace_path

PROG = "python -m bench train"
SPECIAL = ("gloo", "noop")
TRAINED = tuple(t for t in algorithms.TYPES if t.train)  # the types DDP trains in here, from the table: fp32, bf16
VERSION = 2  # of the -J document (2: every figure over rounds, with its interval)
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
    """:func:`plumbing.cli.comma_names` of ``text``, each made a ``kind``."""
    return [kind(name) for name in comma_names(text)]


class Flags(NamedTuple):
    """The checked flags, each list without repeats, in the order given."""

    algos: list
    buckets: list  # MiB
    dtypes: list  # bench train's names: fp32, bf16
    overlaps: list  # bools
    strategies: list  # ddp, fsdp
    reshards: list  # bools


def check_flags(args):
    """The :class:`Flags` of ``args``, or raise ValueError saying what is wrong."""
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
    return Flags(list(dict.fromkeys(algos)), list(dict.fromkeys(buckets)), list(dict.fromkeys(dtypes)),
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


# ---------------------------------------------------------------- text

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


def strategies_of(names):
    """The strategy modules of ``--strategy``'s names, each with the same calls: ``KEY`` (where
    its entries go in -J), ``specs(flags)``, ``start(comm, model, specs, warmup)`` (its runs),
    ``predictor(comm, matrix, shared)``, ``entries(specs, measured, predictor, comm, shared)``,
    ``finish(comm, specs, entries, runs, places)`` (the wrong runs, named), ``lines(entries,
    rounds)``, ``picture(doc, path)`` and ``pictures(path)`` (--plot's files). Imported here:
    they need torch."""
    from . import ddp, fsdp
    return [{"ddp": ddp, "fsdp": fsdp}[name] for name in names]


def main(argv=None):
    args = parser().parse_args(argv)
    comm = MPI.COMM_WORLD
    problem = None
    try:
        flags = check_flags(args)
    except ValueError as exc:
        problem = str(exc)
    if fail_together(comm, PROG, problem) or fail_together(comm, PROG, torch_problem()):
        return 2
    import torch

    from . import model as tm  # needs torch
    torch.set_num_threads(args.threads)
    strategies = strategies_of(flags.strategies)
    ours = [a for a in flags.algos if a not in SPECIAL]
    outputs = [p for p in (args.json, args.timeline, args.timeline and trace_path(args.timeline)) if p]
    outputs += [p for s in strategies for p in (s.pictures(args.plot) if args.plot else [])]
    if refused(comm, PROG, outputs, tuning="auto" in ours):
        return 2
    if fail_together(comm, PROG, probe_problem(comm, ours, flags.dtypes, tm)):
        return 2
    matrix, problem = None, None
    if args.topology:
        try:
            matrix = shared_topology(comm, args.topology)
        except ValueError as exc:
            problem = f"--topology: {exc}"
    if fail_together(comm, PROG, problem):
        return 2
    model = tm.Model(args.model, args.layers, args.width, args.batch, args.seed)
    shared = tm.shared_cores(comm, args.threads)
    text, count = model.describe()
    doc = {**results_header("train", VERSION, comm, ["train", *(sys.argv[1:] if argv is None else argv)]),
           "torch": torch.__version__, "threads": args.threads, "warmup": args.warmup, "rounds": args.rounds,
           "steps": args.steps, "coverage": round(stats.coverage(args.rounds), 4),
           "model": {"kind": args.model, "layers": args.layers, "width": args.width, "batch": args.batch,
                     "seed": args.seed, "parameters": count, "fp32_gradient_bytes": count * 4, "description": text},
           "cores_shared": shared, "complete": False, "runs": []}
    if matrix is None:
        matrix = probe(comm, PROBE_BYTES, reps=3, warmup=1)
    predictors = {s: s.predictor(comm, matrix, shared is not None) for s in strategies}
    doc["predicted_from"] = (f"the links of {args.topology}" if args.topology else
                             f"a probe of these ranks ({PROBE_BYTES >> 20} MiB messages)") + \
        f", {plural(matrix.node_count, 'node')}"
    rank0 = comm.Get_rank() == 0
    if rank0:
        print("\n".join(header_lines(doc)), flush=True)
    configs = {s: s.specs(flags) for s in strategies}
    every = [spec for s in strategies for spec in configs[s]]
    measured = {spec: [] for spec in every}
    runs, wrong = {}, []
    gloo = GlooBaseline()
    gloo.start(comm)
    try:
        for s in strategies:
            runs.update(s.start(comm, model, configs[s], args.warmup))
        began = time.perf_counter()

        def measure(spec, index):
            measured[spec].append(runs[spec].round(args.steps))
            if all(len(rounds) == index + 1 for rounds in measured.values()):  # the round's last
                for s in strategies:
                    doc[s.KEY] = s.entries(configs[s], measured, predictors[s], comm, shared)
                if rank0:
                    print(comment(f"round {index + 1} of {args.rounds}: {time.perf_counter() - began:.1f} s"),
                          flush=True)
                    if args.json:
                        write_json_atomically(args.json, {**doc, "end_time": now()})

        _, places = interleaved(every, args.rounds, measure)
        for s in strategies:
            wrong += s.finish(comm, configs[s], doc[s.KEY], runs, places)
    finally:
        for run in runs.values():
            run.close()
        gloo.close()
    doc["complete"], doc["wrong"] = True, wrong
    if rank0:
        for s in strategies:
            text = s.lines(doc[s.KEY], args.rounds)
            if text:
                print("\n".join(text), flush=True)
        if args.json:
            write_json_atomically(args.json, {**doc, "end_time": now()})
            print(f"# wrote {args.json}")
        for s in strategies:
            for picture in s.picture(doc, args.plot) if args.plot else []:
                print(f"# wrote {picture}")
        if args.timeline and doc["runs"]:
            timeline(doc, args.timeline)
            print(f"# wrote {args.timeline} and {trace_path(args.timeline)}")
        if doc["wrong"]:
            sys.stderr.write(f"{PROG}: error: parameters differ across ranks after the steps: "
                             f"{', '.join(doc['wrong'])}\n")
            sys.stderr.flush()
    return 1 if doc["wrong"] else 0
