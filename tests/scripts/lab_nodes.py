"""An MPI job for a network lab with several ranks per node (``python -m bench.lab exec --
tests/scripts/lab_nodes.py``): what each rank sees of its node, and which HTB classes the
bytes between ranks go through.

Rank 0 prints one JSON object: ``ranks`` (each rank's hostname, processor name, veth and
the world ranks of its Split_type(COMM_TYPE_SHARED) communicator), ``nodes`` (how many such
communicators there are), and ``phases``: for each (src, dst) of PAIRS, after ``src`` sent
``dst`` 8 MiB, the bytes each node's shaped classes gained (node leader's veth: class id ->
bytes, and "lo": its loopback), keyed by the leader's world rank.
"""

import json
import os
import re
import socket
import subprocess

import numpy as np
from mpi4py import MPI

BYTES = 8 << 20


def class_bytes(iface):
    """class id -> bytes sent, of the HTB classes on ``iface``; "lo": the bytes the namespace's
    loopback sent (TCP between ranks of one node would show there)."""
    out = subprocess.run(["tc", "-s", "class", "show", "dev", iface], capture_output=True, text=True, check=True).stdout
    counts = {block.split()[0]: int(re.search(r"Sent (\d+) bytes", block).group(1))
              for block in out.split("class htb ")[1:]}
    with open("/sys/class/net/lo/statistics/tx_bytes") as f:
        counts["lo"] = int(f.read())
    return counts


def main():
    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    leader = node.rank == 0
    iface = os.environ["FI_TCP_IFACE"]
    me = {"hostname": socket.gethostname(), "processor": MPI.Get_processor_name(), "iface": iface,
          "shared": node.allgather(comm.rank)}
    ranks = comm.gather(me)
    nodes = comm.allreduce(1 if leader else 0)
    last = comm.size - 1
    pairs = [(0, 1), (0, last), (last, 0), (1, last - 1)] if comm.size >= 4 else [(0, 1)]
    phases = []
    buf = np.ones(BYTES, dtype=np.uint8)
    for src, dst in pairs:
        comm.Barrier()
        before = class_bytes(iface) if leader else None
        comm.Barrier()
        if comm.rank == src:
            comm.Send(buf, dst, tag=7)
        elif comm.rank == dst:
            got = np.zeros(BYTES, dtype=np.uint8)
            comm.Recv(got, src, tag=7)
            assert got.all()
        comm.Barrier()
        delta = None
        if leader:
            after = class_bytes(iface)
            delta = {c: after[c] - before.get(c, 0) for c in after}
        deltas = comm.gather((comm.rank, delta))
        if comm.rank == 0:
            phases.append({"src": src, "dst": dst, "bytes": BYTES,
                           "classes": {str(r): d for r, d in deltas if d is not None}})
    if comm.rank == 0:
        print(json.dumps({"size": comm.size, "nodes": nodes, "ranks": ranks, "phases": phases}), flush=True)


if __name__ == "__main__":
    main()
