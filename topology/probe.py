"""Pairwise link probe: latency and bandwidth between every pair of ranks, both directions.

Pairs are scheduled as a round-robin tournament (the circle method): each
round is a set of disjoint pairs measured at the same time, so N ranks take
N-1 rounds (N rounds with a bye each when N is odd) instead of N(N-1)/2.
``mode="each"`` measures every pair alone instead (N(N-1)/2 rounds), for
links that share a bottleneck.

Within a pair (a, b): the latency is half the median round trip of an
8-byte ping-pong; the bandwidth a -> b is ``bytes / (t - latency)``, where
``t`` is the median time for a to send ``bytes`` to b and get a 1-byte
acknowledgement back, and likewise b -> a.
"""

import datetime
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

from .matrix import BandwidthMatrix

_TAG = 11


def tournament(size):
    """Rounds of disjoint (a, b) pairs, a < b, covering every pair once (circle method)."""
    players = list(range(size)) + ([None] if size % 2 else [])
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [(players[i], players[-1 - i]) for i in range(half)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        players = [players[0], players[-1], *players[1:-1]]
    return [r for r in rounds if r]


def _exchange(comm, peer, leads, message, answer, reps, warmup):
    """Median time (s) for the leading rank to send ``message`` to ``peer`` and get ``answer``
    back: an 8-byte ping-pong when both are small, a one-way stream with an acknowledgement
    when ``message`` is large."""
    times = []
    for i in range(warmup + reps):
        start = time.perf_counter()
        if leads:
            comm.Send(message, peer, _TAG)
            comm.Recv(answer, peer, _TAG)
        else:
            comm.Recv(message, peer, _TAG)
            comm.Send(answer, peer, _TAG)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def _measure_pair(comm, a, b, payload, small, ack, reps, warmup):
    """(latency s, bandwidth a->b B/s, bandwidth b->a B/s), on both ranks of the pair."""
    me = comm.Get_rank()
    peer = b if me == a else a
    latency = _exchange(comm, peer, me == a, small, small, reps, warmup) / 2
    t_ab = _exchange(comm, peer, me == a, payload, ack, reps, warmup)
    t_ba = _exchange(comm, peer, me == b, payload, ack, reps, warmup)
    nbytes = payload.nbytes

    def rate(t):
        return nbytes / max(t - latency, 1e-9)

    return latency, rate(t_ab), rate(t_ba)


def probe(comm=None, nbytes=8 << 20, reps=5, warmup=2, mode="rounds", progress=None):
    """Measure every pair of ranks of ``comm``; every rank returns the same :class:`BandwidthMatrix`.

    ``progress(text)`` is called on rank 0 after each round when given.
    """
    if mode not in ("rounds", "each"):
        raise ValueError(f"unknown probe mode {mode!r}; choices: rounds, each")
    if nbytes < 1 or reps < 1 or warmup < 0:
        raise ValueError("the probe needs bytes >= 1, reps >= 1 and warmup >= 0")
    comm = (comm or MPI.COMM_WORLD).Dup()
    try:
        size, rank = comm.Get_size(), comm.Get_rank()
        schedule = tournament(size)
        if mode == "each":
            schedule = [[pair] for round_ in schedule for pair in round_]
        payload = np.zeros(nbytes, dtype=np.uint8)
        small = np.zeros(8, dtype=np.uint8)
        ack = np.zeros(1, dtype=np.uint8)
        mine = []
        started = time.perf_counter()
        comm.Barrier()
        for number, pairs in enumerate(schedule, 1):
            for a, b in pairs:
                if rank in (a, b):
                    latency, ab, ba = _measure_pair(comm, a, b, payload, small, ack, reps, warmup)
                    if rank == a:
                        mine.append((a, b, latency, ab, ba))
            comm.Barrier()
            if progress and rank == 0:
                progress(f"probe: round {number}/{len(schedule)} done, {time.perf_counter() - started:.1f} s")
        elapsed = time.perf_counter() - started
        bandwidth = np.zeros((size, size))
        latency = np.zeros((size, size))
        for rows in comm.allgather(mine):
            for a, b, lat, ab, ba in rows:
                bandwidth[a, b], bandwidth[b, a] = ab / 1e9, ba / 1e9
                latency[a, b] = latency[b, a] = lat * 1e6
        hosts = comm.allgather(socket.gethostname())
        measured = {
            "method": "latency: half the median 8-byte ping-pong; bandwidth: bytes / "
                      "(median send + 1-byte ack - latency), each direction",
            "mode": mode,
            "bytes": int(nbytes),
            "reps": int(reps),
            "warmup": int(warmup),
            "rounds": len(schedule),
            "seconds": round(elapsed, 3),
            "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        return BandwidthMatrix(bandwidth, latency, hosts, measured)
    finally:
        comm.Free()


def stderr_progress(text):
    print(text, file=sys.stderr, flush=True)
