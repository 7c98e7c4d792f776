"""A user's own MPI program for the fault tests: ring all-reduces in a loop, and rank
$FAIL_RANK raises after $FAIL_AFTER calls while the others carry on into the next one.

``python fail_midway.py`` runs it under ``algorithms.run_together``; ``python -m mpi4py
fail_midway.py plain`` runs it bare, under mpi4py's own runner (as the README advises for
one's own scripts)."""

import os
import sys

import numpy as np
from mpi4py import MPI

import algorithms


def main():
    comm = MPI.COMM_WORLD
    fail_rank, fail_after = int(os.environ["FAIL_RANK"]), int(os.environ.get("FAIL_AFTER", "20"))
    x = np.ones(1 << 14, np.float32)
    for call in range(1 << 30):
        algorithms.allreduce(x, np.empty_like(x), algorithm="ring")
        if comm.rank == fail_rank and call == fail_after:
            raise RuntimeError(f"injected failure after {call} calls")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["plain"]:
        main()
    else:
        sys.exit(algorithms.run_together(main, "fail_midway"))
