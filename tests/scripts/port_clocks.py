"""Times three concurrent transfers into rank 0 ((1, 0), (2, 0), (3, 0)) and three out of it
((0, 1), (0, 2), (0, 3)) with topology.probe._concurrent under each clock, rank 3 leaving
every barrier LATE seconds after the others; rank 0 prints {"into sender": [the shortest
time of each transfer over the repetitions], ...} as JSON. Run on 4 ranks (one host: every rank reads the same clock)."""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from topology.probe import _concurrent

LATE = float(sys.argv[1])


class LateLeaver(MPI.Intracomm):
    """COMM_WORLD whose Barrier keeps rank 3 LATE seconds longer: a busy core's skew."""

    def Barrier(self):
        super().Barrier()
        if self.Get_rank() == 3:
            time.sleep(LATE)


comm = LateLeaver(MPI.COMM_WORLD)
ways = {"into": [(1, 0), (2, 0), (3, 0)], "out of": [(0, 1), (0, 2), (0, 3)]}
payload = np.zeros(1 << 16, dtype=np.uint8)
found = {f"{way} {clock}": _concurrent(comm, transfers, payload, reps=3, warmup=1, clock=clock).min(axis=0).tolist()
         for way, transfers in ways.items() for clock in ("sender", "receiver")}
if comm.Get_rank() == 0:
    print(json.dumps(found))
