"""``mpiexec -n N python -m bench train``: what all-reduce costs a PyTorch DDP training step, per
algorithm, bucket size and dtype, measured on a synthetic model and set against a model built
from this run's own measurements.

Each run trains the same synthetic model (an MLP, or transformer encoder layers) from the same
parameters for --warmup then --steps steps (forward, backward, SGD) under DDP, its gradients
all-reduced by one of: our algorithms through the DDP hook of algorithms.torch (synchronous, or
overlapping on a communication thread with --overlap on), DDP's own gloo all-reduce (gloo), or
nothing (noop: the hook returns each bucket untouched, so the step is computation alone). The
noop run of each bucket size and dtype runs first: its median step is the compute time T_c.

Per run: step time (median and p95 of the slowest rank's steps), compute (T_c), exposed
communication = step - compute, the model's step time, busbw of the bucket all-reduces, the
share of all-reduce time hidden behind the backward pass (overlap mode), and whether the
parameters came out bit for bit the same on every rank.

The model: with all-reduce time T_m a step, E = T_c / (T_c + T_m) when nothing overlaps. A
synchronous hook blocks the backward pass while it reduces, so step = T_c + the sum of the
buckets' all-reduce times. DDP's own all-reduce and the overlapping hook send bucket k at
max(the time it became ready, the end of bucket k-1) while the backward pass goes on; only
what ends after the backward pass is exposed: step = T_c + exposed (bench scaling's model,
bench.tools.scaling.exposed_after). Where the ranks of a machine have no core to spare beside
their torch threads, an asynchronous all-reduce's processor time is taken from the backward
pass: the model then counts the share of each bucket's time that the all-reduce spends on a
processor (its process's CPU time over its wall time, measured while timing it) as exposed,
and overlaps only the rest, its waiting. Its inputs are measured in this invocation: T_c and the
time each bucket became ready after the backward pass began come from the noop run (the hook
records when DDP calls it); each bucket's all-reduce time comes from the suite's timing loop
on a vector of that bucket's bytes and dtype, right after the run's steps (gloo's through
torch.distributed.all_reduce).

How overlap is measured, not assumed: the overlapping hook records when it handed each bucket
over, when its all-reduce started and when it finished. The backward computation ends when the
last bucket is handed over; the all-reduce time after that is exposed, the rest hidden. The
hidden column is that share (median over steps; the synchronous hook hides none).

Parameters: a run that all-reduces must leave every rank with bit-identical parameters
(SHA-256 of them, gathered); vs gloo is the largest max|p - g| / max|g| over the parameters
against the gloo run of the same bucket size and dtype (close, not equal: DDP's gloo path
divides each gradient by the rank count before summing, ours sums, then divides). The noop
run's parameters differ across ranks by construction (each rank keeps its own gradients). Any
all-reducing run whose parameters differ is wrong: every run finishes, then one line says
which, and the exit status is 1 (as nccl-tests' #wrong). Exit status 2: bad flags or settings.
"""

import argparse
import datetime
import statistics
import sys

import numpy as np
from mpi4py import MPI

import algorithms
from topology.ending import fail_together
from topology.files import write_json_atomically
from topology.probe import node_numbers

from ..baselines.gloo import GlooBaseline
from ..baselines.gloo import problem as gloo_problem
from ..core.machine import describe, oversubscription
from ..core.options import Parser
from ..core.startup import refused
from ..formats.tables import comment, description, epilog, plural, significant
from .scaling import exposed_after
from .train_plot import plot

PROG = "python -m bench train"
SPECIAL = ("gloo", "noop")
DTYPE_NAMES = ("fp32", "bf16")
VERSION = 1  # of the -J document


def parser():
    p = Parser(prog=PROG, description=description(__doc__), epilog=epilog(__doc__),
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", default="auto,ring,gloo,noop",
                   help=f"comma list of all-reduces: our algorithms ({','.join(algorithms.ALGORITHMS)}) through the "
                        "DDP hook, gloo (DDP's own all-reduce, no hook), noop (no all-reduce: the compute time; it "
                        "always runs, first) (default auto,ring,gloo,noop)")
    p.add_argument("--bucket-mb", default="25",
                   help="comma list of DDP bucket caps (bucket_cap_mb), in MiB (default 25)")
    p.add_argument("--dtype", default="fp32", help="comma list of parameter and gradient types: fp32, bf16 "
                                                   "(default fp32)")
    p.add_argument("--overlap", default="off",
                   help="comma list of off (the hook reduces each bucket before backward goes on), on (on a "
                        "communication thread while backward goes on); our algorithms run once for each "
                        "(default off)")
    p.add_argument("--model", default="mlp", choices=("mlp", "transformer"),
                   help="the synthetic model: mlp (Linear + ReLU layers) or transformer (nn.TransformerEncoderLayer "
                        "blocks, 32 tokens a sample) (default mlp)")
    p.add_argument("--layers", type=int, default=6, help="layers (or encoder blocks) of the model (default 6)")
    p.add_argument("--width", type=int, default=2048,
                   help="width of each layer (the transformer's d_model) (default 2048: about 25 M parameters)")
    p.add_argument("--batch", type=int, default=32, help="samples a rank per step (default 32)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per run, first (default 2)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run (default 20)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initial parameters (the same on every rank) and of the data (its rank "
                        "added: each rank's own) (default 0)")
    p.add_argument("-J", "--json", metavar="FILE",
                   help="write the header and every run as JSON, after every run (default: none)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw step time against bucket size, measured and modelled, with the compute time "
                        "(default: none)")
    return p


def comma_list(text, kind=str):
    return [kind(item.strip()) for item in text.split(",") if item.strip()]


def check_flags(args):
    """(algorithms, bucket sizes, dtypes, overlap choices), or raise ValueError saying what is wrong."""
    try:
        buckets = comma_list(args.bucket_mb, float)
    except ValueError:
        raise ValueError(f"--bucket-mb {args.bucket_mb}: not a comma list of numbers") from None
    algos = comma_list(args.algo)
    unknown = [a for a in algos if a not in algorithms.ALGORITHMS and a not in SPECIAL]
    if unknown or not algos:
        raise ValueError(f"--algo: unknown {','.join(unknown) or 'empty list'}; choices: "
                         f"{','.join([*algorithms.ALGORITHMS, *SPECIAL])}")
    dtypes = comma_list(args.dtype)
    if not dtypes or any(d not in DTYPE_NAMES for d in dtypes):
        raise ValueError(f"--dtype {args.dtype}: choices are {', '.join(DTYPE_NAMES)}")
    overlaps = comma_list(args.overlap)
    if not overlaps or any(o not in ("off", "on") for o in overlaps):
        raise ValueError(f"--overlap {args.overlap}: a comma list of off, on")
    if not buckets or min(buckets) <= 0:
        raise ValueError("--bucket-mb: sizes must be positive")
    for flag in ("layers", "width", "batch", "threads", "steps"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be at least 1")
    if args.warmup < 1:
        raise ValueError("--warmup must be at least 1 (DDP settles its buckets in the first step)")
    return (list(dict.fromkeys(algos)), list(dict.fromkeys(buckets)), list(dict.fromkeys(dtypes)),
            [o == "on" for o in dict.fromkeys(overlaps)])


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

COLUMNS = ("algorithm", "bucket", "dtype", "step", "p95", "compute", "exposed", "model", "busbw", "hidden", "params",
           "vs gloo")
UNITS = ("", "(MiB)", "", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(GB/s)", "", "", "")
WIDTHS = (15, 6, 5, 8, 8, 8, 8, 8, 7, 6, 8, 8)


def line(cells, lead="  "):
    """A table line: ``lead`` ("# " for the header), then the cells in :data:`WIDTHS` columns."""
    return lead + "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                            for i, (c, w) in enumerate(zip(cells, WIDTHS))).rstrip()


def mib(nbytes):
    """ "96.0 MiB", "16.3 KiB", "512 B"."""
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.1f} MiB"
    return f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{nbytes} B"


def number(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def row_cells(run):
    params = "same" if run["params_identical"] else ("differ" if run["algorithm"] == "noop" else "WRONG")
    hidden = "-" if run["overlap_reached"] is None else f"{run['overlap_reached'] * 100:.0f}%"
    label = run["algorithm"] + ("+ovl" if run["overlap"] and run["algorithm"] != "gloo" else "")
    rel = run["vs_gloo_max_rel_diff"]
    return (label, f"{run['bucket_mb']:g}", run["dtype"], number(run["step_ms"]), number(run["step_p95_ms"]),
            number(run["compute_ms"]), number(run["exposed_ms"]), number(run["model_step_ms"]),
            "-" if run["busbw"] is None else significant(run["busbw"]), hidden, params,
            "-" if rel is None else f"{rel:.1e}")


def header_lines(comm, doc):
    m, info = doc["model"], doc["machine"]
    crowded = oversubscription(comm)
    texts = [
        f"{PROG}: {plural(doc['ranks'], 'rank')} on {plural(doc['nodes'], 'node')} ({info['host']}), "
        f"torch {doc['torch']}, MPI: {' '.join(info['mpi'].split())}, commit {info['commit']}",
        f"model: {m['description']}: {m['parameters']:,} parameters ({mib(m['parameters'] * 4)} of fp32 gradients "
        f"a step); batch {m['batch']} a rank, {plural(doc['threads'], 'torch thread')} a rank, seed {m['seed']}",
        f"each run: {doc['warmup']} warm-up + {doc['steps']} timed steps (forward, MSE loss, backward, SGD); a "
        "step's time is the slowest rank's; DDP over a gloo process group",
        "noop: no all-reduce (compute only); gloo: DDP's own all-reduce (asynchronous); +ovl: our hook on a "
        "communication thread; hidden: its all-reduce time before the backward pass ended, from its records",
    ]
    if doc["cores_shared"]:
        texts.append(f"cores shared: {doc['cores_shared']}: an asynchronous all-reduce's processor time comes out of "
                     "the backward pass; the model counts that part (its CPU share, measured) as exposed")
    if crowded:
        texts.append(f"warning: {crowded}: the times measure the scheduler as much as the all-reduces")
    return [comment(text) for text in texts]


def group_line(run):
    sizes = ", ".join(mib(b["bytes"]) for b in run["buckets"])
    return comment(f"bucket cap {run['bucket_mb']:g} MiB, {run['dtype']}: {plural(len(run['buckets']), 'bucket')} "
                   f"({sizes}), {mib(run['bytes_per_step'])} a step; the last ready {number(run['backward_ms'])} ms "
                   "into the backward pass")


def summary_lines(runs):
    """The summary's lines, and the all-reducing runs whose parameters differ across ranks."""
    texts = ["", "Summary: per bucket cap and dtype, the compute time, the fastest all-reduce's step, and its "
                 "efficiency E = compute / step"]
    groups = {}
    for run in runs:
        groups.setdefault((run["bucket_mb"], run["dtype"]), []).append(run)
    for (bucket, dtype), group in groups.items():
        reducing = [r for r in group if r["algorithm"] != "noop"]
        compute = group[0]["compute_ms"]
        if not reducing:
            texts.append(f"  {bucket:g} MiB {dtype}: compute {compute:.1f} ms")
            continue
        best = min(reducing, key=lambda r: r["step_ms"])
        error = (best["model_step_ms"] - best["step_ms"]) / best["step_ms"] * 100
        texts.append(f"  {bucket:g} MiB {dtype}: compute {compute:.1f} ms; fastest {row_cells(best)[0]} "
                     f"{best['step_ms']:.1f} ms a step, {best['exposed_ms']:.1f} ms exposed, E = "
                     f"{compute / best['step_ms'] * 100:.0f}%; its model {best['model_step_ms']:.1f} ms "
                     f"({error:+.0f}%)")
    over = [(b["hook_over_bare"], r, b) for r in runs for b in r["buckets"] if b.get("hook_over_bare") is not None]
    if over:
        most, run, bucket = max(over, key=lambda item: item[0])
        texts.append(f"the hook over a bare algorithms.allreduce of the same bytes, timed in turn: median "
                     f"{statistics.median(o for o, _, _ in over) * 100:+.1f}%, at most {most * 100:+.1f}% "
                     f"({run['algorithm']}, {mib(bucket['bytes'])} {run['dtype']})")
    if any(r["algorithm"] == "noop" and not r["params_identical"] for r in runs):
        texts.append("noop's parameters differ across ranks by construction: each rank keeps its own gradients")
    wrong = [r for r in runs if r["algorithm"] != "noop" and not r["params_identical"]]
    if not wrong:
        texts.append("parameters: bit for bit the same on every rank after every run that all-reduces")
    return [comment(text) if text else "#" for text in texts], wrong


# ---------------------------------------------------------------- runs

def measure(comm, model, spec, ts, reference, gloo_params, warmup, steps, shared=None):
    """One run's entry of the -J document (collective). ``reference``: the noop run of the same bucket cap
    and dtype ({"compute_ms", "backward_ms", "buckets"}), None for the noop run itself; ``shared``: why
    the cores are shared (:func:`train_step.shared_cores`), None when each rank has one to spare."""
    parameters, seconds, calls, begun = ts.train(comm, model, spec, warmup, steps)
    median, p95 = ts.step_stats(comm, seconds)
    buckets, backward_ms = ts.bucket_rows(comm, calls, begun)
    if reference is not None:
        ready = {b["index"]: b["ready_ms"] for b in reference["buckets"]}
        if not buckets:  # gloo: no hook, the same buckets as the noop run
            buckets = [{k: v for k, v in b.items() if k in ("index", "bytes")} for b in reference["buckets"]]
        backward_ms = reference["backward_ms"]
    else:
        ready = {b["index"]: b["ready_ms"] for b in buckets}
    times, cpu, hooked = ts.time_buckets(comm, spec, sorted({b["bytes"] for b in buckets}))
    size = comm.Get_size()
    factor = 2 * (size - 1) / size
    for b in buckets:
        b["ready_ms"] = ready[b["index"]]
        b["allreduce_ms"] = times[b["bytes"]] * 1e3
        b["busbw"] = b["bytes"] / times[b["bytes"]] * factor / 1e9 if spec.reduces and times[b["bytes"]] else None
        b["cpu_share"] = cpu[b["bytes"]]
        b["hook_over_bare"] = hooked[b["bytes"]] / times[b["bytes"]] - 1 if hooked[b["bytes"]] else None
        if spec.algorithm == "auto":
            b["auto_picked"] = algorithms.auto.choice(b["bytes"], ts.DTYPES[spec.dtype][1], comm=comm)[0]
    compute_ms = median * 1e3 if reference is None else reference["compute_ms"]
    taken = spec.asynchronous and shared is not None  # its processor time comes out of the backward pass
    stolen = sum(b["allreduce_ms"] * b["cpu_share"] for b in buckets) if taken else 0.0
    model_exposed = stolen + exposed_after(
        [b["ready_ms"] for b in buckets], [b["allreduce_ms"] * (1 - b["cpu_share"] if taken else 1) for b in buckets],
        backward_ms, blocking=not spec.asynchronous)
    total = sum(times[b["bytes"]] for b in buckets)
    nbytes = sum(b["bytes"] for b in buckets)
    entry = {
        "algorithm": spec.algorithm, "overlap": spec.asynchronous, "bucket_mb": spec.bucket_mb, "dtype": spec.dtype,
        "step_ms": median * 1e3, "step_p95_ms": p95 * 1e3, "compute_ms": compute_ms,
        "exposed_ms": median * 1e3 - compute_ms, "model_step_ms": compute_ms + model_exposed,
        "model_exposed_ms": model_exposed, "backward_ms": backward_ms, "bytes_per_step": nbytes,
        "buckets": buckets, "allreduce_ms_per_step": total * 1e3,
        "hook_ms_per_step": sum(b["hook_ms"] for b in buckets) if buckets and "hook_ms" in buckets[0] else None,
        "busbw": nbytes / total * factor / 1e9 if spec.reduces and total else None,
        "overlap_reached": ts.overlap_of(comm, calls) if spec.reduces and spec.algorithm != ts.GLOO else None,
        "params_identical": ts.identical(comm, parameters),
        "vs_gloo_max_rel_diff": (ts.max_rel_diff(comm, parameters, gloo_params)
                                 if gloo_params is not None and spec.reduces and spec.algorithm != ts.GLOO else None),
    }
    return entry, parameters


def main(argv=None):
    args = parser().parse_args(argv)
    comm = MPI.COMM_WORLD
    problem = None
    try:
        algos, buckets, dtypes, overlaps = check_flags(args)
    except ValueError as exc:
        problem = str(exc)
    if fail_together(comm, PROG, problem) or fail_together(comm, PROG, torch_problem()):
        return 2
    import torch

    from . import train_step as ts  # needs torch
    torch.set_num_threads(args.threads)
    ours = [a for a in algos if a not in SPECIAL]
    if refused(comm, PROG, [p for p in (args.json, args.plot) if p], tuning="auto" in ours):
        return 2
    if fail_together(comm, PROG, probe_problem(comm, ours, dtypes, ts)):
        return 2
    model = ts.Model(args.model, args.layers, args.width, args.batch, args.seed)
    shared = ts.shared_cores(comm, args.threads)
    text, count = model.describe()
    doc = {"benchmark": "train", "version": VERSION, "start_time": now(), "args": list(sys.argv[1:] if argv is None
                                                                                        else argv),
           "machine": describe(), "ranks": comm.Get_size(), "nodes": len(set(node_numbers(comm))),
           "torch": torch.__version__, "threads": args.threads, "warmup": args.warmup, "steps": args.steps,
           "model": {"kind": args.model, "layers": args.layers, "width": args.width, "batch": args.batch,
                     "seed": args.seed, "parameters": count, "fp32_gradient_bytes": count * 4, "description": text},
           "cores_shared": shared, "complete": False, "runs": []}
    rank0 = comm.Get_rank() == 0
    if rank0:
        print("\n".join(header_lines(comm, doc)), flush=True)
    else:
        oversubscription(comm)  # collective
    gloo = GlooBaseline()
    gloo.start(comm)
    try:
        references, gloo_params, printed = {}, {}, False
        for spec in specs(algos, buckets, dtypes, overlaps, ts):
            key = (spec.bucket_mb, spec.dtype)
            entry, parameters = measure(comm, model, spec, ts, references.get(key), gloo_params.get(key),
                                        args.warmup, args.steps, shared)
            if spec.algorithm == ts.NOOP:
                references[key] = entry
                if rank0:
                    print(group_line(entry))
                    if not printed:
                        print(line(COLUMNS, "# ") + "\n" + line(UNITS, "# "))
                        printed = True
            elif spec.algorithm == ts.GLOO:
                gloo_params[key] = [p.detach().clone() for p in parameters]
            doc["runs"].append(entry)
            if rank0:
                print(line(row_cells(entry)), flush=True)
                if args.json:
                    write_json_atomically(args.json, {**doc, "end_time": now()})
    finally:
        gloo.close()
    lines, wrong = summary_lines(doc["runs"])
    doc["complete"] = True
    doc["wrong"] = [row_cells(r)[0] + f" ({r['bucket_mb']:g} MiB, {r['dtype']})" for r in wrong]
    if rank0:
        print("\n".join(lines), flush=True)
        if args.json:
            write_json_atomically(args.json, {**doc, "end_time": now()})
            print(f"# wrote {args.json}")
        if args.plot:
            plot(doc, args.plot)
            print(f"# wrote {args.plot}")
        if wrong:
            sys.stderr.write(f"{PROG}: error: parameters differ across ranks after all-reducing: "
                             f"{', '.join(doc['wrong'])}\n")
            sys.stderr.flush()
    return 1 if wrong else 0


def now():
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
