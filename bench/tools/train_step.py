"""One configuration of ``python -m bench train``, built once and run in every round: the
synthetic model, DDP over gloo, the timed steps, each bucket's all-reduce timed alone, and the
parameters checked across ranks.

The model (an MLP of ``layers`` square ``nn.Linear`` + ReLU, or ``nn.TransformerEncoderLayer``
blocks) starts from the same parameters on every rank (``torch.manual_seed``); each rank
trains on its own synthetic batches (a generator seeded with the seed and the rank), cycled, so
every configuration sees the same data. DDP's process group is gloo's, set up as the gloo baseline does
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
the same round are the model's inputs (:func:`bench.tools.scaling.exposed_after`).
"""

import hashlib
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

from topology.machine import crowding
from ..core.timing import iterations_for, timed

#: --dtype -> (torch dtype, NumPy dtype of the same bits)
DTYPES = {t.train: (getattr(torch, t.name), t.dtype) for t in algorithms.TYPES if t.train}
#: a run whose all-reduce is DDP's own; one with none
GLOO, NOOP = "gloo", "noop"
#: set to a rank, that rank's first parameter is changed after every all-reducing run's steps,
#: so that the check that parameters agree across ranks has something to find (its tests)
DISTURB = "BENCH_TRAIN_DISTURB_RANK"
SEQUENCE = 32  # tokens per sample of the transformer
BATCHES = 4  # distinct batches per rank, cycled
MOST_ITERS = 20  # cap on the iterations of one bucket size's timing loop
TURN_SECONDS = 0.05  # and on its length: a bucket over a slow network takes fewer
#: DDP's logger: our names -> its fields (nanoseconds)
DDP_LOGGER = {"backward_compute_ms": "avg_backward_compute_time", "backward_comm_ms": "avg_backward_comm_time",
              "backward_overlap_ms": "avg_backward_compute_comm_overlap_time"}
REPEATS = 2  # turns of that loop a round, the order of bare and hook swapped between them, the median kept


@dataclass(frozen=True)
class Model:
    kind: str  # mlp or transformer
    layers: int
    width: int
    batch: int
    seed: int

    def build(self, dtype):
        torch.manual_seed(self.seed)
        if self.kind == "mlp":
            blocks = [m for _ in range(self.layers) for m in (torch.nn.Linear(self.width, self.width), torch.nn.ReLU())]
        else:
            heads = self.width // 64 if self.width % 64 == 0 else 1
            blocks = [torch.nn.TransformerEncoderLayer(self.width, heads, 4 * self.width, dropout=0.0,
                                                       batch_first=True) for _ in range(self.layers)]
        return torch.nn.Sequential(*blocks).to(DTYPES[dtype][0])

    def batches(self, dtype, rank):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + rank + 1)
        shape = (self.batch, self.width) if self.kind == "mlp" else (self.batch, SEQUENCE, self.width)
        return [tuple(torch.randn(shape, generator=generator).to(DTYPES[dtype][0]) for _ in range(2))
                for _ in range(BATCHES)]

    def describe(self):
        """("mlp, 6 layers of width 2048", parameters)."""
        shape = "MLP" if self.kind == "mlp" else f"transformer ({SEQUENCE} tokens a sample)"
        count = sum(p.numel() for p in self.build("fp32").parameters())
        return f"{shape}, {self.layers} layers of width {self.width}", count


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


def shared_cores(comm, threads):
    """Why an all-reduce running beside the backward pass takes its processor time from it (text),
    else None: the ranks of a machine need more cores than they may use, one per torch thread
    and one for the all-reduce (:func:`topology.machine.crowding`; collective)."""
    found = crowding(comm, threads + 1)
    if found is None:
        return None
    ranks, cores, _ = found
    return (f"{ranks} rank{'s' if ranks != 1 else ''} x ({threads} torch thread{'s' if threads != 1 else ''} + "
            f"1 all-reduce) on {cores} core{'s' if cores != 1 else ''}")


class _Bucket:
    """What the hook reads of DDP's ``GradBucket`` (its tensor and index), for timing the hook
    alone on a tensor of a bucket's size."""

    def __init__(self, tensor, index):
        self._tensor, self._index = tensor, index

    def buffer(self):
        return self._tensor

    def index(self):
        return self._index


def held_bytes(parameters, optimizer):
    """{"parameters", "gradients", "optimizer"}: the bytes of the tensors this rank holds of each
    (a sharded parameter's, its gradient's and its state's local shard alone)."""
    def size(tensors):
        local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in local)
    kept = list(parameters)
    return {"parameters": size(kept), "gradients": size(p.grad for p in kept),
            "optimizer": size(v for state in optimizer.state.values() for v in state.values())}


def as_bits(parameter):
    """The parameter's bytes as a NumPy vector (bfloat16 through its int16 view)."""
    return art.as_numpy(parameter.detach().contiguous().reshape(-1)).view(np.uint8)


def identical(comm, parameters):
    """Whether every rank holds bit for bit the same parameters (a SHA-256 of them, gathered)."""
    digest = hashlib.sha256()
    for p in parameters:
        digest.update(as_bits(p))
    return len(set(comm.allgather(digest.hexdigest()))) == 1


def max_rel_diff(comm, parameters, reference):
    """The largest over parameters of max|p - r| / max|r| (float64), the largest over ranks."""
    worst = 0.0
    for p, r in zip(parameters, reference):
        p, r = p.detach().double(), r.double()
        scale = r.abs().max().item()
        worst = max(worst, (p - r).abs().max().item() / (scale or 1.0))
    return comm.allreduce(worst, op=MPI.MAX)
