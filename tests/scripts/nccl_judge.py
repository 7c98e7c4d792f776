"""Every rank judges NCCL's start-up facts together (bench.baselines.nccl.judge): each case's
facts per rank come from argv as JSON, ``{case: [[problem or null, bus id or null], ...]}``
indexed by rank; rank 0 prints ``{case: [the message each rank raised, or null]}``."""

import json
import sys

from mpi4py import MPI

from bench.baselines.base import Unavailable
from bench.baselines.nccl import judge

comm = MPI.COMM_WORLD
raised = {}
for case, facts in json.loads(sys.argv[1]).items():
    problem, bus = facts[comm.Get_rank()]
    try:
        judge(comm, problem, bus)
        raised[case] = None
    except Unavailable as exc:
        raised[case] = str(exc)
every = comm.gather(raised)
if comm.Get_rank() == 0:
    print(json.dumps({case: [mine[case] for mine in every] for case in raised}))
