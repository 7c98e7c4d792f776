"""What both strategies of ``python -m bench train`` train and check: the synthetic model (an MLP
of ``layers`` square ``nn.Linear`` + ReLU, or ``nn.TransformerEncoderLayer`` blocks), the same
parameters on every rank (``torch.manual_seed``), each rank's own synthetic batches (a generator
seeded with the seed and the rank), cycled, so that every configuration sees the same data; the
element types it trains in; whether the ranks' cores are shared; the bytes a rank holds; and
whether the parameters came out the same on every rank, or how far from another run's."""

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from mpi4py import MPI

import algorithms
import algorithms.torch as art
from topology.machine import crowding

#: --dtype -> (torch dtype, NumPy dtype of the same bits)
DTYPES = {t.train: (getattr(torch, t.name), t.dtype) for t in algorithms.TYPES if t.train}
#: a run whose collectives are torch's own (gloo); one whose collectives move nothing
GLOO, NOOP = "gloo", "noop"
#: set to a rank, that rank's first parameter is changed after every all-reducing run's steps,
#: so that the check that parameters agree across ranks has something to find (its tests)
DISTURB = "BENCH_TRAIN_DISTURB_RANK"
SEQUENCE = 32  # tokens per sample of the transformer
BATCHES = 4  # distinct batches per rank, cycled


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


def auto_pick(comm):
    """``pick(nbytes, dtype, collective)``: the algorithm auto runs on ``comm`` for a call of
    ``nbytes`` of ``dtype`` (bench train's name), what both strategies' predictions price."""
    def pick(nbytes, dtype, collective="allreduce"):
        return algorithms.auto.choice(nbytes, DTYPES[dtype][1], comm=comm, collective=collective)[0]
    return pick


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
