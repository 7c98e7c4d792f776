"""The FSDP runs of ``python -m bench train --strategy fsdp``: the same synthetic model, data and
optimizer as the DDP runs, sharded by PyTorch's FSDP2 (``fully_shard`` on each layer, an MLP's
``nn.Linear`` or a transformer block, then on the root), in the same interleaved rounds.

Runs, per dtype and reshard-after-forward choice:

- noop, the reference: FSDP whose all-gathers and reduce-scatters move nothing between ranks
  (the all-gather's output holds this rank's shard at its place and zeros elsewhere, in buffers
  kept from call to call; the reduce-scatter copies this rank's chunk of its input). Everything
  else FSDP does (the copies in and out of its flat buffers, the resharding, the optimizer step
  on 1/N of the parameters) runs as in the other runs, so step - the reference's step is the
  communication exposed, nothing of FSDP's own work; against DDP's noop run (the unsharded
  model's compute) it would count FSDP's bookkeeping as communication ("compute_vs_ddp" says
  how much that is). Each rank keeps its own gradients: its parameters differ across ranks.
- gloo: FSDP's own collectives over its gloo process group (the baseline), all-gathers issued
  ahead (FSDP's prefetch schedule: the module's unshard asynchronous, each layer's forward
  prefetching the next layer's parameters, the backward prefetching the previous layer's).
- ours by name (``algorithms.torch.shard_with``), synchronous, or with --overlap on on a
  communication thread in the same prefetch schedule as gloo's.

FSDP2 issues the reduce-scatter of CPU tensors without ``async_op`` and reads its output at
once, so reduce-scatters stall the backward pass in every run.

Measured per step, on the rank whose step was slowest: the step, its forward (up to the loss),
and the time the training thread was blocked in each kind of collective (each call, and the wait on the
``Work`` of one issued ahead). Per round, paired with the reference's same round: exposed =
step - reference step; exposed all-gather in the forward = forward - reference forward;
exposed reduce-scatter = blocked in reduce-scatters - the reference's; exposed all-gather in the
backward = the rest (with reshard-after-forward off, FSDP gathers nothing in the backward and
it ties with 0). The reference's calls give the compute profile the prediction takes
(:mod:`bench.train.predict_fsdp`): each layer's forward (from its all-gather's call to the
next one's) and backward (from one reduce-scatter's return to the next one's).

Memory per rank: the bytes of the parameters, gradients and optimizer state this rank holds
after its first step (local shards), against the DDP run's of the same dtype: 1/N expected.
Parameters after the last round: put together by the run's own all-gather (each layer unsharded),
bit for bit the same on every rank for every run but noop (whose all-gather moves nothing), and
their largest relative difference from the DDP run's (gloo's, else the first that all-reduces)
of the same dtype.
"""

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import algorithms.torch as art

from ..formats import stats
from ..formats.tables import comment, significant
from . import ddp
from .model import GLOO, NOOP, auto_pick, held_bytes, identical, max_rel_diff
from .plot import fsdp_path, fsdp_plot
from .predict_fsdp import PARTS, Predictor, Profile, prediction_fields
from .figures import (against_gloo, figure, gloo_ratio_cell, number, percentile, ratios, run_label, span,
                      table_lines)

KEY = "fsdp_runs"  # its runs' entries in the -J document
POOL = 4  # buffers kept per size by the reference's all-gather (FSDP holds at most two at a time)
_clock = time.perf_counter


@dataclass(frozen=True)
class Spec:
    """One FSDP run: the collectives (ours by name, gloo, noop), ours overlapped or not, the
    dtype, reshard-after-forward."""

    algorithm: str
    overlap: bool
    dtype: str
    reshard: bool

    @property
    def prefetch(self):
        """Whether all-gathers are issued ahead (gloo's, or ours on the communication thread)."""
        return self.algorithm == GLOO or self.overlap

    def label(self):
        return f"fsdp {self.algorithm}{'+ovl' if self.overlap and self.algorithm != GLOO else ''}"


def specs(flags):
    """Every FSDP run, in order: per dtype and reshard choice, noop, then gloo, then ours;
    ``flags``: the checked flags (``algos``, ``dtypes``, ``overlaps``, ``reshards``)."""
    ours = [a for a in flags.algos if a not in (GLOO, NOOP)]
    made = []
    for dtype in flags.dtypes:
        for reshard in flags.reshards:
            made.append(Spec(NOOP, False, dtype, reshard))
            made += [Spec(GLOO, False, dtype, reshard)] if GLOO in flags.algos else []
            made += [Spec(a, overlap, dtype, reshard) for a in ours for overlap in flags.overlaps]
    return made


def start(comm, model, configs, warmup):
    """{spec: its :class:`Run`}, each built once (collective)."""
    return {spec: Run(comm, model, spec, warmup) for spec in configs}


# ---------------------------------------------------------------- collectives

@dataclass
class Call:
    """One collective FSDP called: ``kind``, the step's ``phase`` (forward, backward), its whole
    ``nbytes``, ``time.perf_counter()`` when ``called`` and when it ``returned``, and the seconds
    ``waited`` on its ``Work`` afterwards."""

    kind: str
    phase: str
    nbytes: int
    called: float
    returned: float
    waited: float = 0.0

    @property
    def blocked(self):
        return self.returned - self.called + self.waited


class _Waited(dist.Work):
    """A collective's ``Work`` whose ``wait()`` adds to its :class:`Call`'s ``waited``."""

    def __init__(self, inner, call):
        super().__init__()
        self._inner, self._call = inner, call

    def wait(self, timeout=None):
        start = _clock()
        self._inner.wait()
        self._call.waited += _clock() - start
        return True

    def is_completed(self):
        return self._inner.is_completed()


class Timed:
    """An FSDP comm object (``allocate``, ``__call__``) whose calls are recorded in ``run.calls``
    as :class:`Call`, in the phase ``run.phase``."""

    def __init__(self, inner, kind, run):
        self.inner, self.kind, self.run = inner, kind, run

    def allocate(self, size, *, dtype, device):
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, **rest):
        called = _clock()
        work = self.inner(output_tensor=output_tensor, input_tensor=input_tensor, group=group, **rest)
        whole = output_tensor if self.kind == "all_gather" else input_tensor
        call = Call(self.kind, self.run.phase, whole.numel() * whole.element_size(), called, _clock())
        self.run.calls.append(call)
        return _Waited(work, call) if isinstance(work, dist.Work) else work


class GlooAllGather:
    """FSDP's own all-gather (``dist.all_gather_single`` on its process group)."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        return dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)


class GlooReduceScatter(GlooAllGather):
    """FSDP's own reduce-scatter (``dist.reduce_scatter_single``)."""

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


class LocalAllGather:
    """The reference's all-gather: moves nothing. FSDP has put this rank's shard at its place;
    the other shards stay zeros (:data:`POOL` buffers a size, taken in turn: no value is
    garbage, whose denormals could slow the compute, and no new memory is touched a call)."""

    def __init__(self):
        self.pools = {}

    def allocate(self, size, *, dtype, device):
        pool = self.pools.setdefault((tuple(size), dtype), [0])
        if len(pool) <= POOL:
            pool.append(torch.zeros(*size, dtype=dtype, device=device))
        pool[0] = pool[0] % POOL + 1
        return pool[pool[0]]

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        return None


class LocalReduceScatter:
    """The reference's reduce-scatter: this rank's chunk of its own input (what FSDP does on one rank)."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        output_tensor.copy_(input_tensor.view(group.size(), -1)[group.rank()])


# ---------------------------------------------------------------- a run

def units_of(module):
    """The layers FSDP shards one by one: an MLP's ``nn.Linear``, a transformer's blocks."""
    return [m for m in module if not isinstance(m, torch.nn.ReLU)]


class Run:
    """One FSDP configuration (a :class:`Spec`), built once (collective) and kept for every
    round; its ``warmup`` steps run at once."""

    def __init__(self, comm, model, spec, warmup):
        self.comm, self.spec = comm, spec
        self.module = model.build(spec.dtype)
        units = units_of(self.module)
        for unit in units:
            fully_shard(unit, reshard_after_forward=spec.reshard)
        fully_shard(self.module)
        self.ours = ()
        if spec.algorithm == NOOP:
            inner = LocalAllGather(), LocalReduceScatter()
        elif spec.algorithm == GLOO:
            inner = GlooAllGather(), GlooReduceScatter()
        else:
            inner = self.ours = art.shard_with(self.module, spec.algorithm, comm, overlap=spec.overlap)
        self.calls, self.phase = [], "forward"
        timed = Timed(inner[0], "all_gather", self), Timed(inner[1], "reduce_scatter", self)
        for unit in (*units, self.module):
            unit.set_custom_all_gather(timed[0])
            unit.set_custom_reduce_scatter(timed[1])
        if spec.prefetch:  # FSDP's prefetch schedule: unshard asynchronous, the next layer's forward prefetched
            self.module._set_unshard_async_op(True)
            for unit, following in zip(units, units[1:]):
                unit.set_modules_to_forward_prefetch([following])
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.01)
        self.data = model.batches(spec.dtype, comm.Get_rank())
        self.done, self.held = 0, None
        self.steps(warmup)

    def steps(self, count):
        """``count`` steps after a barrier: per step on this rank (step, forward, blocked in
        each part of :data:`PARTS`) seconds, and the profile's marks (:func:`marks`)."""
        made = []
        self.comm.Barrier()
        for _ in range(count):
            x, y = self.data[self.done % len(self.data)]
            self.done += 1
            self.calls, self.phase = [], "forward"
            start = _clock()
            loss = torch.nn.functional.mse_loss(self.module(x), y)
            forward, self.phase = _clock(), "backward"
            loss.backward()
            self.optimizer.step()
            self.held = self.held or held_bytes(self.module.parameters(), self.optimizer)
            self.optimizer.zero_grad()
            end = _clock()
            for made_by in self.ours:
                made_by.take()
            blocked = [sum(c.blocked for c in self.calls if (c.kind, c.phase) == part) for part in
                       (("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "backward"))]
            made.append(((end - start, forward - start, *blocked), marks(self.calls, start, forward, end)))
        return made

    def round(self, steps):
        """One round (collective): {"steps_s", "forward_s", "blocked_s" ({part: seconds}): each
        step's, of the rank whose step was slowest (the parts of the step it took), "units" (per
        layer: "bytes", "forward_ms", "backward_ms", the median over steps, the latest rank) and
        "tail_ms"}."""
        made = self.steps(steps)
        every = self.comm.allgather([m[0] for m in made])
        worst = list(zip(*(max((rank[i] for rank in every), key=lambda t: t[0]) for i in range(steps))))
        units, tail = profile_rows(self.comm, [m[1] for m in made])
        return {"steps_s": worst[0], "forward_s": worst[1], "blocked_s": dict(zip(PARTS, worst[2:])),
                "units": units, "tail_ms": tail}

    def parameters(self):
        """The parameters as this run's own all-gather puts them together (collective): each
        layer unsharded, copied, resharded."""
        units = units_of(self.module)
        for unit in units:
            unit.unshard()
        whole = [p.detach().clone() for p in self.module.parameters()]
        for unit in units:
            unit.reshard()
        return whole

    def close(self):
        for made_by in self.ours:
            made_by.close()


def marks(calls, start, forward, end):
    """(per layer forward seconds, per layer backward seconds, its bytes, the tail) of one step
    from its calls: a layer's forward runs from its all-gather's call to the next one's (the
    first from the step's start, the last to the loss); its backward from the previous
    reduce-scatter's return (the first from the loss) to its own; the tail after the last."""
    gathers = [c for c in calls if (c.kind, c.phase) == ("all_gather", "forward")]
    scatters = [c for c in calls if c.kind == "reduce_scatter"][::-1]  # the backward runs the layers in reverse
    if not gathers or len(scatters) != len(gathers):
        return (), (), (), end - start  # one rank: FSDP calls no collective
    at = [start] + [c.called for c in gathers[1:]] + [forward]
    back = [forward] + [c.returned for c in scatters[::-1]]
    backward = [b - a for a, b in zip(back, back[1:])][::-1]
    return (tuple(b - a for a, b in zip(at, at[1:])), tuple(backward), tuple(c.nbytes for c in gathers),
            end - back[-1])


def profile_rows(comm, step_marks):
    """Per layer {"index", "bytes", "forward_ms", "backward_ms"} (the median over steps, the
    most over ranks) and the tail ms (the same) (collective)."""
    forward, backward = ([[m[j][k] for m in step_marks] for k in range(len(step_marks[-1][j]))] for j in (0, 1))
    mine = ([stats.median(v) * 1e3 for v in forward], [stats.median(v) * 1e3 for v in backward],
            stats.median([m[3] for m in step_marks]) * 1e3)
    every = comm.allgather(mine)
    rows = [{"index": k, "bytes": nbytes, "forward_ms": max(r[0][k] for r in every),
             "backward_ms": max(r[1][k] for r in every)} for k, nbytes in enumerate(step_marks[-1][2])]
    return rows, max(r[2] for r in every)


# ---------------------------------------------------------------- the -J entries

def entry(spec, rounds, reference, gloo, predictor):
    """One FSDP run's -J entry from its rounds beside the reference's (noop of the same dtype and
    reshard) and gloo's (None for gloo and noop, or where none ran): every figure the median over
    the rounds with its interval, the ratios paired by round (module docstring)."""
    def per(one):
        return stats.median(one["steps_s"]) * 1e3, stats.median(one["forward_s"]) * 1e3

    step, forward = zip(*map(per, rounds))
    compute, base = zip(*map(per, reference))
    blocked = {p: [stats.median(one["blocked_s"][p]) * 1e3 for one in rounds] for p in PARTS}
    ref_blocked = {p: [stats.median(one["blocked_s"][p]) * 1e3 for one in reference] for p in PARTS}
    exposed = [s - c for s, c in zip(step, compute)]
    parts = {"all_gather_forward": [f - b for f, b in zip(forward, base)],
             "reduce_scatter": [b - r for b, r in zip(blocked[PARTS[2]], ref_blocked[PARTS[2]])]}
    parts["all_gather_backward"] = [e - f - r for e, f, r in zip(exposed, parts[PARTS[0]], parts[PARTS[2]])]
    per_round = {"steps_ms": [[t * 1e3 for t in one["steps_s"]] for one in rounds], "step_ms": list(step),
                 "compute_ms": list(compute), "exposed_ms": exposed, "forward_ms": list(forward),
                 **{f"exposed_{p}_ms": parts[p] for p in PARTS}, **{f"blocked_{p}_ms": blocked[p] for p in PARTS}}
    made = {"strategy": "fsdp", "algorithm": spec.algorithm, "overlap": spec.overlap, "prefetch": spec.prefetch,
            "dtype": spec.dtype, "reshard_after_forward": spec.reshard,
            "step_p95_ms": percentile([t * 1e3 for one in rounds for t in one["steps_s"]], 95)}
    for name in ("step", "compute", "exposed", "forward"):
        made[f"{name}_ms"], made[name] = stats.median(per_round[f"{name}_ms"]), figure(per_round[f"{name}_ms"])
    for kind, names in (("all_gather", {"forward": PARTS[0], "backward": PARTS[1]}), ("reduce_scatter", None)):
        if names:
            made[f"exposed_{kind}_ms"] = {k: stats.median(parts[p]) for k, p in names.items()}
            made[f"exposed_{kind}"] = {k: figure(parts[p]) for k, p in names.items()}
        else:
            made[f"exposed_{kind}_ms"], made[f"exposed_{kind}"] = stats.median(parts[PARTS[2]]), figure(parts[PARTS[2]])
    made["blocked_ms"] = {p: stats.median(blocked[p]) for p in PARTS}
    last = reference[-1]
    made["units"], made["tail_ms"] = last["units"], last["tail_ms"]
    made.update(predictions(predictor, spec, reference, exposed))
    made.update({"step_vs_gloo": None, "exposed_vs_gloo": None, "memory": None, "params_identical": None,
                 "vs_ddp_max_rel_diff": None, "rounds": per_round})
    against_gloo(made, per_round, step, compute, gloo)
    return made


def predictions(predictor, spec, reference, exposed):
    """:func:`.predict_fsdp.prediction_fields` of ``spec`` from the reference's rounds."""
    profiles = [Profile.of_units(one["units"], one["tail_ms"]) for one in reference]
    if predictor is None:
        return prediction_fields(None, None, None, exposed)
    return prediction_fields(predictor.rounds(spec, profiles), predictor.rounds(spec, profiles, False),
                             predictor.rounds(spec, profiles, True), exposed)


def entries(configs, measured, predictor, comm=None, shared=None):
    """Every FSDP run's entry (:func:`entry`), from ``measured`` ({spec: its rounds so far}, the
    DDP runs' among them), with "compute_vs_ddp": the reference's step over the DDP noop run's of
    the same dtype (its first bucket cap), paired by round: what FSDP's own work costs."""
    made = []
    for spec in configs:
        group = {s.algorithm: measured[s] for s in configs if (s.dtype, s.reshard) == (spec.dtype, spec.reshard)}
        ours = spec.algorithm not in (GLOO, NOOP)
        made.append(entry(spec, measured[spec], group[NOOP], group.get(GLOO) if ours else None, predictor))
        ddp_noop = next((r for s, r in measured.items()
                         if isinstance(s, ddp.Spec) and (s.algorithm, s.dtype) == (NOOP, spec.dtype)), None)
        ratio = ddp_noop and ratios(made[-1]["rounds"]["compute_ms"],
                                    [stats.median(one["steps_s"]) * 1e3 for one in ddp_noop])[1]
        made[-1]["compute_vs_ddp"] = ratio.as_dict() if ratio else None
    return made


def predictor(comm, matrix, shared):
    """The :class:`.predict_fsdp.Predictor` of these ranks (auto's choices asked of ``comm``)."""
    return Predictor(matrix, auto_pick(comm), shared)


def finish(comm, configs, entries_made, runs, places):
    """After the rounds (collective): each entry's place in the rounds, memory against the DDP
    run's of its dtype (``runs``: every strategy's), parameters identical across ranks and against
    that DDP run's; the FSDP runs (not noop) whose parameters differ across ranks, named."""
    size, wrong = comm.Get_size(), []
    ddp_runs = {s: r for s, r in runs.items() if isinstance(s, ddp.Spec)}
    for spec, made in zip(configs, entries_made):
        run = runs[spec]
        made["rounds"]["place"] = places[spec]
        ddp_run = next((r for s, r in ddp_runs.items() if s.dtype == spec.dtype and s.algorithm == GLOO),
                       next((r for s, r in ddp_runs.items() if s.dtype == spec.dtype and s.reduces), None))
        held = {k: max(v) for k, v in zip(run.held, zip(*(r.values() for r in comm.allgather(run.held))))}
        held["total"] = sum(held.values())
        theirs = None if ddp_run is None else max(sum(h.values()) for h in comm.allgather(ddp_run.held))
        made["memory"] = {**held, "ddp_total": theirs, "vs_ddp": held["total"] / theirs if theirs else None,
                          "expected": 1 / size}
        parameters = run.parameters()
        made["params_identical"] = identical(comm, parameters)
        if ddp_run is not None and spec.algorithm != NOOP:
            made["vs_ddp_max_rel_diff"] = max_rel_diff(comm, parameters, list(ddp_run.module.parameters()))
        if spec.algorithm != NOOP and not made["params_identical"]:
            wrong.append(describe(made))
    return wrong


def picture(doc, path):
    """Draw ``--plot``'s FSDP picture beside ``path`` (:func:`.plot.fsdp_path`); the paths written."""
    if not doc.get(KEY):
        return []
    fsdp_plot(doc, fsdp_path(path))
    return [fsdp_path(path)]


def pictures(path):
    """The files :func:`picture` writes for ``--plot path``."""
    return [fsdp_path(path)]


# ---------------------------------------------------------------- text

TIMES = ("fsdp", "dtype", "reshard", "step", "exposed", "predicted", "error")
TIMES_UNITS = ("", "", "", "(ms)", "(ms)", "(ms)", "")
PARTS_COLUMNS = ("fsdp", "dtype", "reshard", "AG fwd", "AG bwd", "RS", "predicted parts")
PARTS_UNITS = ("", "", "", "(ms)", "(ms)", "(ms)", "(ms: AG fwd, bwd, RS)")
CHECKS = ("fsdp", "dtype", "reshard", "exposed/gloo", "p95", "param mem", "grad mem", "optim mem", "held/ddp",
          "params", "vs ddp")
CHECKS_UNITS = ("", "", "", "", "(ms)", "(MiB)", "(MiB)", "(MiB)", "(1/N)", "", "")


def describe(made):
    """A wrong run's name: "fsdp ring (fp32, reshard on)"."""
    return f"fsdp {run_label(made)} ({made['dtype']}, reshard {'on' if made['reshard_after_forward'] else 'off'})"


def time_cells(run):
    error = run["prediction_error"]
    return (*key_cells(run), span(run["step"]), span(run["exposed"]), number(run["predicted_exposed_ms"]),
            "-" if error is None else f"{error * 100:+.0f}%" + (" in" if run["prediction_within"] else ""))


def part_cells(run):
    predicted = run["predicted_parts_ms"]
    return (*key_cells(run), span(run["exposed_all_gather"]["forward"]), span(run["exposed_all_gather"]["backward"]),
            span(run["exposed_reduce_scatter"]),
            "-" if predicted is None else ", ".join(number(predicted[p]) for p in PARTS))


def key_cells(run):
    return run_label(run), run["dtype"], "on" if run["reshard_after_forward"] else "off"


def check_cells(run):
    memory, rel = run["memory"], run["vs_ddp_max_rel_diff"]
    params = "same" if run["params_identical"] else ("differ" if run["algorithm"] == NOOP else "WRONG")
    held = "-" if memory["vs_ddp"] is None else f"{significant(memory['vs_ddp'])} ({significant(memory['expected'])})"
    sizes = (f"{memory[k] / (1 << 20):.2f}" for k in ("parameters", "gradients", "optimizer"))
    return (*key_cells(run), gloo_ratio_cell(run["exposed_vs_gloo"]), number(run["step_p95_ms"]), *sizes, held, params,
            "-" if rel is None else f"{rel:.1e}")


def lines(runs, rounds):
    """The FSDP section of the text output."""
    if not runs:
        return []
    texts = [
        "", "FSDP (fully_shard on each layer, then the root; the same model, data and SGD as the DDP runs): noop is "
        "FSDP whose collectives move nothing between ranks, its step the compute; exposed = step - noop's step, AG "
        "fwd = forward - noop's, RS = time blocked in reduce-scatters - noop's, AG bwd = the rest (0 with reshard "
        "off); gloo and +ovl issue all-gathers ahead (FSDP's prefetch), reduce-scatters stall the backward on CPU",
        f"predicted: from noop's per-layer profile of the same round and the cost model of each all-gather and "
        f"reduce-scatter (gloo as the ring); held: the parameters, gradients and optimizer state of a rank, over "
        f"the DDP run's, 1/N expected; vs ddp: max|p - d| / max|d| against the DDP run's parameters; median [95% "
        f"interval] over {rounds} rounds"]
    made = [comment(t) if t else "#" for t in texts]
    made += table_lines(TIMES, TIMES_UNITS, [time_cells(r) for r in runs]) + ["#"]
    made += table_lines(PARTS_COLUMNS, PARTS_UNITS, [part_cells(r) for r in runs]) + ["#"]
    made += table_lines(CHECKS, CHECKS_UNITS, [check_cells(r) for r in runs])
    for run in runs:
        if run["algorithm"] == NOOP and run["compute_vs_ddp"]:
            made.append(comment(f"{run['dtype']}, reshard {'on' if run['reshard_after_forward'] else 'off'}: FSDP's "
                                f"own work: noop's step over DDP's noop step {span(run['compute_vs_ddp'], 'x')}, "
                                "paired by round"))
    if any(r["algorithm"] == NOOP and not r["params_identical"] for r in runs):
        made.append(comment("noop's parameters differ across ranks by construction: its all-gather moves nothing, "
                            "each rank keeps its own gradients"))
    return made
