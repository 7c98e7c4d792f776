"""Which all-reduce MPICH ran, told by its rounding: float32 inputs whose sum depends on the order
the ranks' values are added in (each algorithm adds them in its own order). Rank 0 prints
{bytes: sha1 of the result} for each size given on the command line."""

import hashlib
import json
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
prints = {}
for nbytes in map(int, sys.argv[1:]):
    rng = np.random.default_rng(1000 + comm.rank)
    x = (rng.standard_normal(nbytes // 4) * 10.0 ** rng.integers(-6, 6, nbytes // 4)).astype(np.float32)
    y = np.empty_like(x)
    comm.Allreduce(x, y, op=MPI.SUM)
    prints[nbytes] = hashlib.sha1(y.tobytes()).hexdigest()
if comm.rank == 0:
    print(json.dumps(prints))
