"""A user's own MPI program for the ending tests: MPI at $LEVEL (mpi4py.rc.thread_level), under
``algorithms.run_together``; every rank prints its pid, then its main thread waits, inside MPI
($WAIT=mpi: a receive no rank sends to) or in Python ($WAIT=python: short sleeps), until a
signal ends the job. With $ABORT_LOG set, a rank that calls ``MPI_Abort`` on COMM_WORLD first
appends "rank R: THREAD" (the calling thread's name) to that file, then aborts as before: MPICH's
own "Abort(" line can be lost when the launcher tears the job down before forwarding it. ``thread`` as the argument: a Python tool run by ``python -m bench``, that
prints the thread level it runs at."""

import os
import sys
import threading
import time

import mpi4py

if __name__ == "__main__":
    mpi4py.rc.thread_level = os.environ.get("LEVEL", "single")
from mpi4py import MPI  # noqa: E402

import algorithms  # noqa: E402
from plumbing.ending import thread_level_name  # noqa: E402


class TracedWorld(MPI.Intracomm):
    """COMM_WORLD whose Abort says, in $ABORT_LOG, which thread called it, then calls MPI_Abort."""

    def Abort(self, errorcode=0):
        with open(os.environ["ABORT_LOG"], "a") as log:
            log.write(f"rank {self.Get_rank()}: {threading.current_thread().name}\n")
        super().Abort(errorcode)


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
    if os.environ.get("ABORT_LOG"):
        MPI.COMM_WORLD = TracedWorld(MPI.COMM_WORLD)
    sys.exit(algorithms.run_together(wait, "end_in_mpi"))
