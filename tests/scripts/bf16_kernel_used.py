"""Which kernel ``algorithms.allreduce`` reduced bfloat16 with, seen from outside it: run under
mpiexec as ``python bf16_kernel_used.py ALGORITHM OP``. The first call runs with PyTorch not
imported by this script; then, with PyTorch imported and set to 2 threads, a second call runs
under PyTorch's profiler, which records every ATen operator that ran. Rank 0 prints one JSON
line with every rank's view: whether the first call left PyTorch imported, the ATen operators
the second call ran, the thread setting after it, and whether both results are exact."""

import json
import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

import algorithms
from algorithms.ops import TORCH_FROM

algorithm, op = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
count = 4 * TORCH_FROM * size  # every rank's part of the ring is long enough for PyTorch's kernels
values = np.arange(count) % 7  # small integers: every order of additions or products is exact in bfloat16
x = (values + rank).astype(ml_dtypes.bfloat16)
parts = np.array([values + r for r in range(size)], dtype=np.float64)
expected = {"sum": parts.sum(0), "avg": parts.sum(0) / size, "prod": parts.prod(0)}[op].astype(ml_dtypes.bfloat16)

imported_before = "torch" in sys.modules
y = algorithms.allreduce(x, np.empty_like(x), op=op, algorithm=algorithm)
view = {"torch_before": imported_before, "torch_after_first_call": "torch" in sys.modules,
        "first_exact": bool(np.array_equal(y.view(np.uint16), expected.view(np.uint16)))}

import torch  # noqa: E402  (the second call: PyTorch imported, as a training program has it)
from torch.profiler import ProfilerActivity, profile  # noqa: E402

torch.set_num_threads(2)
with profile(activities=[ProfilerActivity.CPU]) as recorded:
    y = algorithms.allreduce(x, np.empty_like(x), op=op, algorithm=algorithm)
ran = {}
for event in recorded.events():
    if event.name in ("aten::add", "aten::mul", "aten::div"):
        ran[event.name] = ran.get(event.name, 0) + 1
view.update(aten=ran, threads_after=torch.get_num_threads(),
            second_exact=bool(np.array_equal(y.view(np.uint16), expected.view(np.uint16))))
views = comm.gather(view, root=0)
if rank == 0:
    print(json.dumps(views))
