"""One configuration of ``python -m bench train``, built once and run in every round: the
synthetic model, DDP over gloo, the timed steps, each bucket's all-reduce timed alone, and the
parameters checked across ranks.

The model (:mod:`.model`) starts from the same parameters on every rank and trains on each
rank's own batches. DDP's process group is gloo's, set up as the gloo baseline does
(:meth:`bench.baselines.gloo.GlooBaseline.start`); the gradients travel by DDP's own gloo
all-reduce (``gloo``), by :func:`algorithms.torch.allreduce_hook` (our algorithms, synchronous
or overlapping) or not at all (``noop``, :func:`algorithms.torch.noop_hook`: the compute time).

A :class:`Run` builds its model, DDP and hook once and runs its warm-up steps; each round then
calls :meth:`Run.round`: a few steps (forward, MSE loss, backward, SGD step, timed with
``time.perf_counter`` on every rank; a step's time is the slowest rank's), then each bucket
size's all-reduce timed alone with the suite's timing loop (:func:`bench.core.timing.timed`):
ours through ``algorithms.allreduce`` on a NumPy view of a tensor of the bucket's bytes and
dtype, in turn with the synchronous hook on the same tensor, gloo's through
``torch.distributed.all_reduce`` on a tensor of that size. The hooks record when each bucket was
handed over, so the noop run measures when each bucket becomes ready after the backward pass
begins, and the overlapping hook when its all-reduces ran (the overlap reached,
:func:`algorithms.torch.overlap_reached`). A round's times and the noop run's ready times of
the same round are the model's inputs (:func:`.predict.exposed_after`).
"""

import os
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel

import algorithms
import algorithms.torch as art

from ..core.timing import iterations_for, timed
from ..formats import stats
from ..formats.tables import comment, plural, significant
from .figures import (against_gloo, figure, gloo_ratio_cell, mib, number, percentile, ratios, run_label, span,
                      table_lines)
from .model import DISTURB, DTYPES, GLOO, NOOP, auto_pick, held_bytes, identical, max_rel_diff
from .plot import plot
from .predict import Predictor, exposed_after, prediction_fields

MOST_ITERS = 20  # cap on the iterations of one bucket size's timing loop
TURN_SECONDS = 0.05  # and on its length: a bucket over a slow network takes fewer
#: DDP's logger: our names -> its fields (nanoseconds)
DDP_LOGGER = {"backward_compute_ms": "avg_backward_compute_time", "backward_comm_ms": "avg_backward_comm_time",
              "backward_overlap_ms": "avg_backward_compute_comm_overlap_time"}
HOOK_BOUND = 1.05  # the target: the hook at most 5% over a bare all-reduce of the same bytes
REPEATS = 2  # turns of that loop a round, the order of bare and hook swapped between them, the median kept


@dataclass(frozen=True)
class Spec:
    """One run: the all-reduce (ours by name, gloo, noop), overlapped or not, DDP's bucket cap, dtype."""

    algorithm: str
    overlap: bool
    bucket_mb: float
    dtype: str

    @property
    def reduces(self):
        return self.algorithm != NOOP

    @property
    def asynchronous(self):
        """Whether buckets go out while the backward pass goes on (gloo's own, or the hook's thread)."""
        return self.algorithm == GLOO or self.overlap

    def label(self):
        return f"{self.algorithm}{' (overlap)' if self.overlap and self.algorithm != GLOO else ''}"


class Run:
    """One configuration (a :class:`Spec`), built once and kept for every round: its model under
    DDP, the hook's state, the optimizer and data, and the tensors its buckets are timed alone
    on. Made collectively (DDP broadcasts the parameters); its ``warmup`` steps run at once (DDP
    rebuilds its buckets after the first). ``reference``: the noop :class:`Run` of the same
    bucket cap and dtype, whose buckets a run without a hook (gloo) times alone."""

    def __init__(self, comm, model, spec, warmup, reference=None):
        self.comm, self.spec, self.reference = comm, spec, reference
        self.module = model.build(spec.dtype)
        self.ddp = DistributedDataParallel(self.module, bucket_cap_mb=spec.bucket_mb)
        self.state = None
        if spec.algorithm != GLOO:
            self.state = art.HookState(algorithm="auto" if spec.algorithm == NOOP else spec.algorithm, comm=comm,
                                       overlap=spec.overlap)
            self.ddp.register_comm_hook(self.state, art.noop_hook if spec.algorithm == NOOP else art.allreduce_hook)
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=0.01)
        self.data = model.batches(spec.dtype, comm.Get_rank())
        self.done = 0  # steps run so far, the warm-up's included: which batch comes next
        self.sizes = None  # the buckets' bytes, from the last round's records
        self.timer = art.HookState(algorithm=spec.algorithm, comm=comm) if spec.reduces and spec.algorithm != GLOO \
            else None  # the synchronous hook, timed beside the bare all-reduce
        self.turns = {}  # bucket bytes -> (its calls to time, iterations a turn)
        self.held = None  # held_bytes after the first step's optimizer step
        self.steps(warmup)

    def steps(self, count):
        """``count`` steps after a barrier: (per-step seconds on this rank, per-step hook calls,
        per-step backward start times)."""
        seconds, calls, begun = [], [], []
        clock = time.perf_counter
        self.comm.Barrier()
        for _ in range(count):
            x, y = self.data[self.done % len(self.data)]
            self.done += 1
            start = clock()
            loss = torch.nn.functional.mse_loss(self.ddp(x), y)
            backward = clock()
            loss.backward()
            self.optimizer.step()
            self.held = self.held or held_bytes(self.module.parameters(), self.optimizer)
            self.optimizer.zero_grad()
            end = clock()
            seconds.append(end - start)
            calls.append(self.state.take() if self.state is not None else [])
            begun.append(backward)
        return seconds, calls, begun

    def round(self, steps):
        """One round of this configuration (collective): ``steps`` steps, then each bucket size's
        all-reduce timed alone. {"steps_s": [each step's seconds, the slowest rank's], "buckets":
        :func:`bucket_rows`' rows, "backward_ms", "overlap": :func:`overlap_of`, and "times",
        "shares", "hooked": :meth:`time_buckets`' dicts}."""
        seconds, calls, begun = self.steps(steps)
        worst = np.max(np.array(self.comm.allgather(seconds)), axis=0).tolist()
        rows, backward_ms = bucket_rows(self.comm, calls, begun)
        if rows:
            self.sizes = sorted({r["bytes"] for r in rows})
        sizes = self.sizes if self.reference is None else self.reference.sizes
        if sizes is None:
            raise RuntimeError(f"{self.spec.label()}: no bucket sizes yet (its noop run goes first in round 0)")
        times, shares, hooked = self.time_buckets(sizes)
        return {"steps_s": worst, "buckets": rows, "backward_ms": backward_ms, "overlap": overlap_of(self.comm, calls),
                "times": times, "shares": shares, "hooked": hooked}

    def time_buckets(self, sizes):
        """Per bucket size: ({bytes: seconds} of one all-reduce with this run's all-reduce, {bytes:
        CPU share}, {bytes: seconds} of the synchronous hook on it, or None), this round's. The CPU
        share is the process's processor time over the loop's wall time (every thread: gloo
        reduces on threads of its own; at most 1). Timed alone (:func:`bench.core.timing.timed`:
        one warm-up call, then the slowest rank, mean over the iterations, median of
        :data:`REPEATS` turns of at most :data:`MOST_ITERS` calls or :data:`TURN_SECONDS`, the
        number fixed in the first round), our algorithms in turn with
        :func:`algorithms.torch.allreduce_hook` on the same tensor (the hook's own cost is the
        difference). In place, as the hook and DDP reduce, on memory from PyTorch's allocator,
        made once: a transport may route a message by the pages it lies in
        (:mod:`algorithms.runtime.transports.pages`), and NumPy's own large arrays get huge pages where
        PyTorch's need not."""
        if not self.spec.reduces:
            return dict.fromkeys(sizes, 0.0), dict.fromkeys(sizes, 0.0), dict.fromkeys(sizes)
        times, shares, hooked = {}, {}, dict.fromkeys(sizes)
        for nbytes in sizes:  # one at a time: each size's iterations fit its own size
            if nbytes not in self.turns:
                self.turns[nbytes] = self._calls(nbytes, len(self.turns))
            calls, iters = self.turns[nbytes]
            wall, cpu = time.perf_counter(), time.process_time()
            result = {name: statistics.median(rounds) for name, rounds in timed(self.comm, calls, iters, 1,
                                                                                 REPEATS).items()}
            share = (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
            times[nbytes], hooked[nbytes] = result["bare"], result.get("hook")
            shares[nbytes] = max(self.comm.allgather(min(share, 1.0)))
            if self.timer is not None:
                self.timer.take()
        return times, shares, hooked

    def _calls(self, nbytes, index):
        """({"bare": ..., "hook": ...} on a tensor of ``nbytes`` (gloo: "bare" alone), the
        iterations of a turn of about :data:`TURN_SECONDS`): made once per size (collective)."""
        torch_dtype, np_dtype = DTYPES[self.spec.dtype]
        tensor = torch.zeros(nbytes // np_dtype.itemsize, dtype=torch_dtype)
        comm, algorithm = self.comm, self.spec.algorithm
        if self.timer is None:
            calls = {"bare": lambda: dist.all_reduce(tensor)}
        else:  # a NumPy view of a tensor: memory from PyTorch's allocator, in the pages DDP's buckets get
            bucket = _Bucket(tensor, index)
            vector = self.timer.view_of(bucket)[1]
            calls = {"bare": lambda: algorithms.allreduce(vector, vector, op="avg", algorithm=algorithm, comm=comm),
                     "hook": lambda: art.allreduce_hook(self.timer, bucket).wait()}
        calls["bare"]()  # once, untimed: then how many a turn of about TURN_SECONDS holds
        began = time.perf_counter()
        calls["bare"]()
        once = comm.allreduce(time.perf_counter() - began, op=MPI.MAX)
        return calls, max(1, min(iterations_for(nbytes), MOST_ITERS, int(TURN_SECONDS / max(once, 1e-9))))

    def ddp_logger(self):
        """DDP's own record of its backward pass (``DistributedDataParallel._get_ddp_logging_data``,
        averages over the steps it samples: the first ten and every hundredth, the warm-up's
        included), in ms, the slowest rank's (collective): "backward_compute_ms" (from the
        backward pass's start to its end), "backward_comm_ms" (from the first bucket's all-reduce
        start to the last one's end) and "backward_overlap_ms" (the part of the two that overlaps)."""
        data = self.ddp._get_ddp_logging_data()
        mine = {name: data.get(key, 0) / 1e6 for name, key in DDP_LOGGER.items()}
        every = self.comm.allgather(mine)
        return {name: max(rank[name] for rank in every) for name in DDP_LOGGER}

    def parameters(self):
        """The module's parameters (after the last round); where BENCH_TRAIN_DISTURB_RANK names
        this rank, an all-reducing run's first one is changed first."""
        if self.spec.reduces and os.environ.get(DISTURB, "") == str(self.comm.Get_rank()):
            with torch.no_grad():
                next(self.module.parameters()).view(-1)[0] += 1
        return list(self.module.parameters())

    def close(self):
        """Stop the hooks' communication threads."""
        for state in (self.state, self.timer):
            if state is not None:
                state.close()


def bucket_rows(comm, calls, begun):
    """Per bucket, in the order DDP handed them over: {"index", "bytes", "ready_ms" (after the
    backward pass began; median over steps, the latest rank), "hook_ms" (the all-reduce's time inside
    the hook; median over steps, the least over ranks: the rank that came last waited for no
    other), "timeline_ms" ({"ready", "start", "end"}: when it was handed over and its all-reduce
    started and ended after the backward pass began, in the last step, on rank 0)}, and the
    backward time in ms (the last bucket's ready time)."""
    if not calls or not calls[-1]:
        return [], None
    order = [c.index for c in calls[-1]]
    ready = {i: [] for i in order}
    took = {i: [] for i in order}
    for made, start in zip(calls, begun):
        if [c.index for c in made] != order:
            continue  # a step whose buckets differ (never expected once DDP has rebuilt them)
        for c in made:
            ready[c.index].append((c.called - start) * 1e3)
            took[c.index].append(c.seconds * 1e3)
    last = {c.index: tuple((t - begun[-1]) * 1e3 for t in (c.called, c.started, c.finished)) for c in calls[-1]}
    mine = [(statistics.median(ready[i]), statistics.median(took[i]), *last[i]) for i in order]
    every = comm.allgather(mine)
    sizes = {c.index: c.nbytes for c in calls[-1]}
    rows = [{"index": i, "bytes": sizes[i], "ready_ms": max(r[k][0] for r in every),
             "hook_ms": min(r[k][1] for r in every),
             "timeline_ms": dict(zip(("ready", "start", "end"), every[0][k][2:]))}
            for k, i in enumerate(order)]
    return rows, max(r["ready_ms"] for r in rows)


def overlap_of(comm, calls):
    """The median over steps of the share of all-reduce time hidden behind the backward pass,
    the lowest rank's (None for runs whose hooks reduce nothing)."""
    shares = [s for s in (art.overlap_reached(made) for made in calls) if s is not None]
    mine = statistics.median(shares) if shares else None
    every = comm.allgather(mine)
    return None if None in every else min(every)


class _Bucket:
    """What the hook reads of DDP's ``GradBucket`` (its tensor and index), for timing the hook
    alone on a tensor of a bucket's size."""

    def __init__(self, tensor, index):
        self._tensor, self._index = tensor, index

    def buffer(self):
        return self._tensor

    def index(self):
        return self._index


# ---------------------------------------------------------------- text

TIMES = ("algorithm", "bucket", "dtype", "step", "exposed", "predicted", "error")  # compute: noop's
TIMES_UNITS = ("", "(MiB)", "", "(ms)", "(ms)", "(ms)", "")
CHECKS = ("algorithm", "bucket", "dtype", "exposed/gloo", "p95", "parts", "busbw", "hidden", "params", "vs gloo")
CHECKS_UNITS = ("", "(MiB)", "", "", "(ms)", "(ms)", "(GB/s)", "", "", "")


def time_cells(run):
    """The cells of a run's row in the table of times: step, exposed, predicted exposed, error."""
    error = run.get("prediction_error")
    return (run_label(run), f"{run['bucket_mb']:g}", run["dtype"], span(run["step"]), span(run["exposed"]),
            number(run["predicted_exposed_ms"]) if run.get("predicted_exposed_ms") is not None else "-",
            "-" if error is None else f"{error * 100:+.0f}%" + (" in" if run["prediction_within"] else ""))


def check_cells(run):
    """The cells of a run's row in the second table: exposed over gloo's ("tie" after a ratio whose
    interval holds 1), p95, parts, busbw, hidden, parameters."""
    params = "same" if run["params_identical"] else ("differ" if run["algorithm"] == "noop" else "WRONG")
    hidden = "-" if run["overlap_reached"] is None else f"{run['overlap_reached'] * 100:.0f}%"
    rel = run["vs_gloo_max_rel_diff"]
    return (run_label(run), f"{run['bucket_mb']:g}", run["dtype"], gloo_ratio_cell(run["exposed_vs_gloo"]),
            number(run["step_p95_ms"]), span(run["model_step"]),
            "-" if run["busbw"] is None else significant(run["busbw"]), hidden, params,
            "-" if rel is None else f"{rel:.1e}")


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
                pairs.setdefault((run_label(run), run["bucket_mb"], run["dtype"], b["bytes"]), b["hook_over_bare"])
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
    """The summary's lines: per bucket cap and dtype the fastest, the hook against its target, the parameters."""
    texts = ["", "Summary: per bucket cap and dtype, the compute time, the fastest all-reduce's step (and those that "
                 "tie with it), its efficiency E = compute / step, predicted and measured, paired by round"]
    groups = {}
    for run in runs:
        groups.setdefault((run["bucket_mb"], run["dtype"]), []).append(run)
    for (bucket, dtype), group in groups.items():
        reducing = {run_label(r): r for r in group if r["algorithm"] != "noop"}
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
    if not [r for r in runs if r["algorithm"] != "noop" and not r["params_identical"]]:
        texts.append("parameters: bit for bit the same on every rank after every run that all-reduces")
    return [comment(text) if text else "#" for text in texts]


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
    :meth:`Run.round`'s, one a round), beside the rounds of the noop run of the same
    bucket cap and dtype (``reference``; None for the noop run itself) and of its gloo run
    (``gloo``; None where none ran, and for gloo and noop); ``shared``: why the cores are shared
    (:func:`.model.shared_cores`), None when each rank has one to spare. Every figure is the
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


def entries(configs, measured, predictor, comm, shared):
    """Every run's entry (:func:`entry`) from ``measured`` ({spec: its rounds so far});
    ``predictor``: a :class:`.predict.Predictor` (its ``pick``: what auto runs for a bucket);
    ``shared``: why the cores are shared, or None."""
    size, pick = comm.Get_size(), predictor.pick
    made = []
    for spec in configs:
        group = {s.algorithm: measured[s] for s in configs if (s.bucket_mb, s.dtype) == (spec.bucket_mb, spec.dtype)}
        ours = spec.algorithm not in (GLOO, NOOP)
        made.append(entry(spec, measured[spec], None if spec.algorithm == "noop" else group["noop"],
                          group.get("gloo") if ours else None, shared, size, predictor))
        if spec.algorithm == "auto":
            for b in made[-1]["buckets"]:
                b["auto_picked"] = pick(b["bytes"], spec.dtype)
    return made


# ---------------------------------------------------------------- the strategy (bench/train/tool.py runs it)

KEY = "runs"  # its runs' entries in the -J document


def specs(flags):
    """Every run, in order: per dtype and bucket size, noop first, then gloo, then ours (each overlap
    choice); ``flags``: the checked flags (``algos``, ``buckets``, ``dtypes``, ``overlaps``)."""
    ours = [a for a in flags.algos if a not in (GLOO, NOOP)]
    runs = []
    for dtype in flags.dtypes:
        for bucket in flags.buckets:
            runs.append(Spec(NOOP, False, bucket, dtype))
            if GLOO in flags.algos:
                runs.append(Spec(GLOO, True, bucket, dtype))
            runs += [Spec(a, overlap, bucket, dtype) for a in ours for overlap in flags.overlaps]
    return runs


def start(comm, model, configs, warmup):
    """{spec: its :class:`Run`}, each built once (collective), the noop run of its bucket cap and
    dtype before it."""
    runs = {}
    for spec in configs:
        noop = Spec(NOOP, False, spec.bucket_mb, spec.dtype)
        runs[spec] = Run(comm, model, spec, warmup, runs.get(noop) if spec != noop else None)
    return runs


def predictor(comm, matrix, shared):
    """The :class:`.predict.Predictor` of these ranks on ``matrix`` (auto's choices asked of ``comm``)."""
    return Predictor(matrix, auto_pick(comm), shared)


def finish(comm, configs, made, runs, places):
    """After the rounds (collective): each entry's place in the rounds, DDP's logger, whether its
    parameters are the same on every rank and how far from the gloo run's of its bucket cap and
    dtype (gloo runs before ours in each); the all-reducing runs whose parameters differ, named."""
    gloo_params = {}
    for spec, run in zip(configs, made):
        key = (spec.bucket_mb, spec.dtype)
        parameters = runs[spec].parameters()
        if spec.algorithm == GLOO:
            gloo_params[key] = parameters
        run["rounds"]["place"] = places[spec]
        run["ddp_logger"] = runs[spec].ddp_logger()
        run["params_identical"] = identical(comm, parameters)
        if key in gloo_params and spec.algorithm not in (GLOO, NOOP):
            run["vs_gloo_max_rel_diff"] = max_rel_diff(comm, parameters, gloo_params[key])
    return [run_label(r) + f" ({r['bucket_mb']:g} MiB, {r['dtype']})" for r in made
            if r["algorithm"] != NOOP and not r["params_identical"]]


def lines(made, rounds):
    """The DDP section of the text output: each bucket cap's buckets, the two tables, the summary."""
    if not made:
        return []
    return [*map(group_line, [r for r in made if r["algorithm"] == NOOP]),
            comment(f"median [95% interval] over {plural(rounds, 'round')}; exposed = step - compute in each round; "
                    "exposed/gloo: paired by round, a tie where the interval holds 1"),
            *table_lines(TIMES, TIMES_UNITS, [time_cells(r) for r in made]), "#",
            *table_lines(CHECKS, CHECKS_UNITS, [check_cells(r) for r in made]), *summary_lines(made)]


def picture(doc, path):
    """Draw ``--plot``'s DDP picture at ``path``; the paths written."""
    if not doc[KEY]:
        return []
    plot(doc, path)
    return [path]


def pictures(path):
    """The files :func:`picture` writes for ``--plot path``."""
    return [path]
