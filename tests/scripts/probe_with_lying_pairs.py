"""The probe under mpiexec with two faulty measurements injected (``python -m topology probe``
otherwise): pair (0, 1) always reports 0 -> 1 at 1e18 B/s, an impossible figure that stays;
pair (1, 2) reports 1 -> 2 at 1e18 B/s in its first measurement only, as a latency outlier
did once. Writes the matrix to argv[1]."""

import sys

from mpi4py import MPI

from topology import probe as probing

real = probing._measure_pair
calls = {}


def lying(comm, a, b, *args):
    latency, ab, ba = real(comm, a, b, *args)
    calls[a, b] = calls.get((a, b), 0) + 1
    if (a, b) == (0, 1) or ((a, b) == (1, 2) and calls[a, b] == 1):
        ab = 1e18
    return latency, ab, ba


probing._measure_pair = lying
matrix = probing.probe(MPI.COMM_WORLD, 1 << 16, reps=3, warmup=1, warn=probing.stderr_progress)
if MPI.COMM_WORLD.Get_rank() == 0:
    matrix.save(sys.argv[1])
