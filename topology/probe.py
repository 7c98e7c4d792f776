"""Pairwise link probe: latency and bandwidth between every pair of ranks, both directions.

Pairs are scheduled as a round-robin tournament (the circle method): each
round is a set of disjoint pairs measured at the same time, so N ranks take
N-1 rounds (N rounds with a bye each when N is odd) instead of N(N-1)/2.
``mode="each"`` measures every pair alone instead (N(N-1)/2 rounds), for
links that share a bottleneck.

Within a pair (a, b), every figure is a low percentile (:data:`PERCENTILE`) of
the repetitions' times, since noise on a shared machine only ever makes a
repetition slower: the latency is half that of an 8-byte ping-pong; the
bandwidth a -> b is ``bytes / (t - latency)``, with ``t`` the time for a to send
``bytes`` to b and get a 1-byte acknowledgement back, and the latency (the
acknowledgement's way back) subtracted only when it is at most
:data:`LATENCY_SHARE` of ``t`` (a noisy latency as large as the transfer once
made 8 MiB in 1 ns, 8 PB/s); likewise b -> a.

No figure is taken on trust. A pair whose bandwidth in one direction is more than
:data:`DISAGREE` times off the other direction, or off the median of its rank's row, or
whose latency is that far above its row's, is measured :data:`RETRIES` more times, alone,
and the median of its measurements kept. A bandwidth above what the hosts' own memory
copies reach (:func:`copy_bandwidth`, one lone copy per host: no message moves faster than
a copy of it) is impossible: it is stored as that copy bandwidth, flagged in
``measured["flagged"]`` and said on stderr.
"""

import ctypes
import datetime
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

from .matrix import BandwidthMatrix

_TAG = 11
PERCENTILE = 25  # of the repetitions' times
LATENCY_SHARE = 0.1  # the latency is subtracted from a transfer's time when at most this share of it
DISAGREE = 4.0  # a figure this many times off its reverse direction or its row is measured again
RETRIES = 2  # extra measurements of such a pair, the median of all kept


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


def low(times):
    """The robust time of a set of repetitions: their :data:`PERCENTILE`-th percentile."""
    return float(np.percentile(times, PERCENTILE))


def rate(nbytes, seconds, latency):
    """Bytes per second of a transfer that took ``seconds`` including an acknowledgement of
    one ``latency``, subtracted only when it is small against the transfer."""
    if 0 < latency <= LATENCY_SHARE * seconds:
        seconds -= latency
    return nbytes / seconds


def _exchange(comm, peer, leads, message, answer, reps, warmup):
    """The robust time (s) for the leading rank to send ``message`` to ``peer`` and get
    ``answer`` back: a ping-pong when both are small, a one-way stream with an
    acknowledgement when ``message`` is large."""
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
    return low(times)


def _measure_pair(comm, a, b, payload, small, ack, reps, warmup):
    """(latency s, bandwidth a->b B/s, bandwidth b->a B/s), on both ranks of the pair."""
    me = comm.Get_rank()
    peer = b if me == a else a
    latency = _exchange(comm, peer, me == a, small, small, reps, warmup) / 2
    t_ab = _exchange(comm, peer, me == a, payload, ack, reps, warmup)
    t_ba = _exchange(comm, peer, me == b, payload, ack, reps, warmup)
    return latency, rate(payload.nbytes, t_ab, latency), rate(payload.nbytes, t_ba, latency)


def _run_schedule(comm, schedule, payload, reps, warmup, progress=None, label="round"):
    """Measure each round's pairs at once; every rank gets {(a, b): (latency, ab, ba)}."""
    rank, mine, started = comm.Get_rank(), [], time.perf_counter()
    small, ack = np.zeros(8, dtype=np.uint8), np.zeros(1, dtype=np.uint8)
    for number, pairs in enumerate(schedule, 1):
        for a, b in pairs:
            if rank in (a, b):
                measured = _measure_pair(comm, a, b, payload, small, ack, reps, warmup)
                if rank == a:
                    mine.append(((a, b), measured))
        comm.Barrier()
        if progress and rank == 0:
            progress(f"probe: {label} {number}/{len(schedule)} done, {time.perf_counter() - started:.1f} s")
    return dict(pair for rows in comm.allgather(mine) for pair in rows)


def copy_bandwidth(comm, nbytes, least=10, seconds=0.05):
    """Bytes per second of the fastest lone copy of ``nbytes`` on each host: a user-space
    copy (``numpy.copyto``) or the kernel's (``process_vm_readv``, MPI's single-copy path,
    which beats the first on some sizes), the best of at least ``least`` copies and
    ``seconds`` of each (a core's first copies run at a fraction of its speed), by one rank
    per host while the others wait: {host: B/s} on every rank."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        best = None
        if node.Get_rank() == 0:
            source, target = np.ones(nbytes, np.uint8), np.ones(nbytes, np.uint8)
            copies = [lambda: np.copyto(target, source)]
            kernel = _kernel_copy(source, target)
            copies += [kernel] if kernel else []
            best = max(nbytes / _fastest(copy, least, seconds) for copy in copies)
        node.Barrier()
    finally:
        node.Free()
    found = {}
    for host, value in comm.allgather((socket.gethostname(), best)):
        if value is not None:
            found[host] = max(found.get(host, 0.0), value)
    return found


def _fastest(call, least, seconds):
    """The shortest time of at least ``least`` calls and ``seconds`` of them (at most 1000)."""
    fastest, count, began = np.inf, 0, time.perf_counter()
    while count < least or (time.perf_counter() - began < seconds and count < 1000):
        start = time.perf_counter()
        call()
        fastest = min(fastest, time.perf_counter() - start)
        count += 1
    return fastest


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _kernel_copy(source, target):
    """A call that copies ``source`` into ``target`` by ``process_vm_readv`` on this process,
    or None where the kernel refuses it."""
    try:
        readv = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    readv.restype = ctypes.c_ssize_t
    readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec),
                      ctypes.c_ulong, ctypes.c_ulong]
    local, remote = _Iovec(target.ctypes.data, target.nbytes), _Iovec(source.ctypes.data, source.nbytes)
    pid = os.getpid()

    def copy():
        return readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return copy if copy() == source.nbytes else None


def suspicious(bandwidth, latency, factor=DISAGREE):
    """Pairs (a, b), a < b, with a figure more than ``factor`` off: a bandwidth against its
    reverse direction or the median of its row, a latency above its row's median."""
    size = len(bandwidth)
    off = ~np.eye(size, dtype=bool)
    found = set()
    for i in range(size):
        row = bandwidth[i][off[i]]
        lat = latency[i][off[i]]
        median, median_latency = (float(np.median(row)), float(np.median(lat))) if size > 2 else (None, None)
        for j in range(size):
            if i == j:
                continue
            b, back = bandwidth[i, j], bandwidth[j, i]
            if _off(b, back, factor) or (median is not None and _off(b, median, factor)) or \
                    (median_latency is not None and latency[i, j] > factor * median_latency > 0):
                found.add((min(i, j), max(i, j)))
    return sorted(found)


def _off(x, y, factor):
    return x > factor * y or y > factor * x


def probe(comm=None, nbytes=8 << 20, reps=5, warmup=2, mode="rounds", progress=None, warn=None):
    """Measure every pair of ranks of ``comm``; every rank returns the same :class:`BandwidthMatrix`.

    ``progress(text)`` is called on rank 0 after each round, ``warn(text)`` for each figure
    that stays impossible (flagged), when given.
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
        started = time.perf_counter()
        copies = copy_bandwidth(comm, nbytes)
        comm.Barrier()
        samples = {pair: [m] for pair, m in _run_schedule(comm, schedule, payload, reps, warmup, progress).items()}
        bandwidth, latency = _matrices(size, samples)
        hosts = comm.allgather(socket.gethostname())
        bounds = _bounds(hosts, copies)
        again = sorted(set(suspicious(bandwidth, latency)) | _above(bandwidth, bounds))
        for _ in range(RETRIES if again else 0):
            for pair, m in _run_schedule(comm, [[pair] for pair in again], payload, reps, warmup).items():
                samples[pair].append(m)
        if again:
            bandwidth, latency = _matrices(size, samples)
        flagged = _cap(bandwidth, bounds)
        if warn and rank == 0:
            for f in flagged:
                warn(f"probe: warning: bandwidth {f['from']} -> {f['to']} measured {f['measured_GBps']:.6g} GB/s, "
                     f"above the copy bandwidth of its hosts ({f['stored_GBps']:.6g} GB/s) after {RETRIES} more "
                     "measurements; stored as that, and flagged in the file")
        elapsed = time.perf_counter() - started
        measured = {
            "method": f"the {PERCENTILE}th percentile of the repetitions' times; latency: half an 8-byte "
                      "ping-pong; bandwidth: bytes / (send + 1-byte ack - latency), the latency subtracted "
                      f"when at most {LATENCY_SHARE:g} of the time; pairs more than {DISAGREE:g}x off their "
                      f"reverse direction or row measured {RETRIES} more times alone, median kept; "
                      "bandwidths above the hosts' copy bandwidth stored as it and flagged",
            "mode": mode,
            "bytes": int(nbytes),
            "reps": int(reps),
            "warmup": int(warmup),
            "rounds": len(schedule),
            "seconds": round(elapsed, 3),
            "copy_GBps": {host: round(value / 1e9, 3) for host, value in copies.items()},
            "remeasured": [list(pair) for pair in again],
            "flagged": flagged,
            "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        return BandwidthMatrix(bandwidth, latency, hosts, measured)
    finally:
        comm.Free()


def _matrices(size, samples):
    """Bandwidth (GB/s) and latency (us) matrices from each pair's measurements (their median)."""
    bandwidth, latency = np.zeros((size, size)), np.zeros((size, size))
    for (a, b), measurements in samples.items():
        lat, ab, ba = np.median(np.array(measurements), axis=0)
        bandwidth[a, b], bandwidth[b, a] = ab / 1e9, ba / 1e9
        latency[a, b] = latency[b, a] = lat * 1e6
    return bandwidth, latency


def _bounds(hosts, copies):
    """The bandwidth no link can exceed (GB/s): the copy bandwidth of the slower of its hosts."""
    copy = np.array([copies.get(host, np.inf) for host in hosts]) / 1e9
    return np.minimum(copy[:, None], copy[None, :])


def _above(bandwidth, bounds):
    """Pairs (a, b), a < b, with a bandwidth above its bound."""
    return {(int(min(a, b)), int(max(a, b))) for a, b in zip(*np.nonzero(bandwidth > bounds)) if a != b}


def _cap(bandwidth, bounds):
    """Store every bandwidth above its bound as that bound; the flags."""
    flagged = []
    for a, b in zip(*np.nonzero(bandwidth > bounds)):
        if a != b:
            flagged.append({"from": int(a), "to": int(b), "measured_GBps": float(bandwidth[a, b]),
                            "stored_GBps": float(bounds[a, b]), "reason": "above the copy bandwidth of its hosts"})
            bandwidth[a, b] = bounds[a, b]
    return flagged


def stderr_progress(text):
    print(text, file=sys.stderr, flush=True)
