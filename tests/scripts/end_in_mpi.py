"""A user's own MPI program for the ending tests: MPI at $LEVEL (mpi4py.rc.thread_level), under
``algorithms.run_together``; every rank prints its pid, then its main thread waits, inside MPI
($WAIT=mpi: a receive no rank sends to) or in Python ($WAIT=python: short sleeps), until a
signal ends the job. ``thread`` as the argument: a Python tool run by ``python -m bench``, that
prints the thread level it runs at."""

import os
import sys
import time

import mpi4py

if __name__ == "__main__":
    mpi4py.rc.thread_level = os.environ.get("LEVEL", "single")
from mpi4py import MPI  # noqa: E402

import algorithms  # noqa: E402
from topology.ending import thread_level_name  # noqa: E402


def wait():
    comm = MPI.COMM_WORLD
    comm.Barrier()
    print(f"#  Rank {comm.Get_rank():2d} Group  0 Pid {os.getpid():6d} at {thread_level_name()}", flush=True)
    comm.Barrier()
    if os.environ.get("WAIT", "mpi") == "mpi":
        comm.recv(source=MPI.ANY_SOURCE)
    while True:
        time.sleep(0.01)


def main(argv):
    """The tool: print the level this rank's MPI runs at."""
    print(f"rank {MPI.COMM_WORLD.Get_rank()}: {thread_level_name()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(algorithms.run_together(wait, "end_in_mpi"))
