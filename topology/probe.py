"""Pairwise link probe: latency and bandwidth between every pair of ranks, both directions,
and each node's network port (NIC).

Nodes are the groups of ranks ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` makes (ranks
that share memory), numbered in the order of their first ranks (their leaders); MPICH's
cliques (``MPIR_CVAR_NUM_CLIQUES=K MPIR_CVAR_CLIQUES_BY_BLOCK=1``) split one machine into K
blocks of consecutive ranks, to try a multi-node layout on one machine. Every pair of ranks on
one node is measured (the nodes' pairs at the same time: they are disjoint); between two nodes
a and b one pair is measured, their leaders, and the figure stored for every pair of a rank on
a and a rank on b (a message between the nodes crosses the same ports whichever ranks send
it). With one rank per node (or one node) this is the pairwise probe below, unchanged.

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
and the median of its measurements kept. The machines under the ranks and their cores
(:func:`machines`) are stored in ``measured["machines"]``: where ranks outnumber their
machine's cores, their shared-memory figures are noise, and the health report says so instead
of judging them. A bandwidth above what the hosts' own memory copies reach (:func:`copy_bandwidth`,
one lone copy per host, timed up to :data:`RETRIES` more times where a link seems faster, as a busy core cuts a best-of
figure: no message moves faster than a copy of it) is impossible: it is stored as that copy bandwidth, flagged in
``measured["flagged"]`` and said on stderr. The checks against the reverse direction and
the row compare like with like: the links between nodes among themselves (the leaders'
K x K matrix), and each node's links within it among themselves.

The lower bound's figures (:mod:`.floor`, ``measured["floor"]``): after the pairs, every pair of
the same schedule times a 1-byte ping-pong in C through MPI, and within a node a flag on a cache
line of shared memory; each host times its fastest copy at sizes from 4 KiB to 64 MiB.

Ports (K >= 2 nodes; :func:`probe_ports`): node k's egress is measured by sending to
``min(K-1, PORT_PEERS)`` other nodes at once (node k's ranks in turn, each sending ``bytes``
to a different node's leader), its ingress by as many other nodes' leaders sending to it at
once (to node k's ranks in turn). Node k's own ranks keep the time on their host's clock,
from the first of them to start after the barrier (for egress to each 1-byte
acknowledgement; for ingress, the senders starting on a 1-byte go from the receiver, to each
arrival), so no rank's lateness leaving the barrier can shorten it. Each repetition's port
is :func:`port_rate` of its times: the rate of the transfers held by their own links plus the
bytes of the rest over the last of their times; the port kept is the ``100 - PERCENTILE``-th
percentile of the repetitions' (noise only slows a repetition). The shares of a port move
from one repetition to the next, so each transfer's own best repetition, put together, would
make a port faster than any repetition had. One node at a time; a port more than
:data:`DISAGREE` times off the median of its direction is measured :data:`RETRIES` more
times and the median kept, and one above ``peers`` copies at its host's copy bandwidth
stored as that and flagged.
"""

import datetime
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

from . import floor
from .copy_rate import copy_bandwidth
from .machine import machines, members, node_numbers
from .matrix import BandwidthMatrix

_TAG = 11
PERCENTILE = 25  # of the repetitions' times
LATENCY_SHARE = 0.1  # the latency is subtracted from a transfer's time when at most this share of it
DISAGREE = 4.0  # a figure this many times off its reverse direction or its row is measured again
RETRIES = 2  # extra measurements of such a pair, the median of all kept
PORT_PEERS = 7  # a port is measured against at most this many other nodes at once


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


def node_schedule(nodes, mode="rounds"):
    """(within, between): rounds of disjoint rank pairs (a, b), a < b. ``within``: every pair
    of ranks on one node, round i of each node's own tournament together; ``between``: the
    leaders of every pair of nodes, a tournament of the nodes. ``mode="each"``: a pair a round."""
    groups = members(nodes)
    per_node = [tournament(len(g)) for g in groups]
    within = [sorted((g[a], g[b]) for g, rounds in zip(groups, per_node) if i < len(rounds) for a, b in rounds[i])
              for i in range(max(len(rounds) for rounds in per_node))]
    lead = [g[0] for g in groups]
    between = [[(lead[a], lead[b]) for a, b in round_] for round_ in tournament(len(groups))]
    if mode == "each":
        within = [[pair] for round_ in within for pair in round_]
        between = [[pair] for round_ in between for pair in round_]
    return within, between


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
    """Measure every pair of ranks of ``comm`` (between nodes, their leaders) and each node's
    ports; every rank returns the same :class:`BandwidthMatrix`.

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
        nodes = node_numbers(comm)
        count = max(nodes) + 1
        within, between = node_schedule(nodes, mode)
        schedule = within + between
        payload = np.zeros(nbytes, dtype=np.uint8)
        started = time.perf_counter()
        if progress and rank == 0 and count > 1:
            progress(f"probe: {size} ranks on {count} nodes: {len(within)} rounds within nodes, "
                     f"{len(between)} between their leaders, then {2 * count} port measurements")
        copies = copy_bandwidth(comm, nbytes)
        sharing = machines(comm)
        comm.Barrier()
        samples = {pair: [m] for pair, m in _run_schedule(comm, schedule, payload, reps, warmup, progress).items()}
        bandwidth, latency = _matrices(size, samples, nodes)
        hosts = comm.allgather(socket.gethostname())
        bounds = _bounds(hosts, copies)
        again = sorted(_suspicious_pairs(bandwidth, latency, nodes) | _measured_pairs(_above(bandwidth, bounds), nodes))
        for _ in range(RETRIES if again else 0):
            for pair, m in _run_schedule(comm, [[pair] for pair in again], payload, reps, warmup).items():
                samples[pair].append(m)
        if again:
            bandwidth, latency = _matrices(size, samples, nodes)
        for _ in range(RETRIES):  # the copy is a best-of figure a busy core may have cut: as pairs, again
            if not _above(bandwidth, bounds):
                break
            copies = {host: max(value, copies.get(host, 0.0)) for host, value in copy_bandwidth(comm, nbytes).items()}
            bounds = _bounds(hosts, copies)
        flagged = [f for f in _cap(bandwidth, bounds) if (min(f["from"], f["to"]), max(f["from"], f["to"])) in samples]
        for f in flagged:
            if nodes[f["from"]] != nodes[f["to"]]:
                f["nodes"] = [nodes[f["from"]], nodes[f["to"]]]  # stored for every rank pair of these nodes
        ports, port_record = None, None
        if count > 1:
            ports, port_record = probe_ports(comm, nodes, payload, reps, warmup, copies, hosts, progress, bandwidth)
        least = floor.measure(comm, nodes, schedule)  # the lower bound's C-timed latencies and copies
        if warn and rank == 0:
            for f in flagged:
                warn(f"probe: warning: bandwidth {f['from']} -> {f['to']} measured {f['measured_GBps']:.6g} GB/s, "
                     f"above the copy bandwidth of its hosts ({f['stored_GBps']:.6g} GB/s) after {RETRIES} more "
                     "measurements; stored as that, and flagged in the file")
            for f in (port_record or {}).get("flagged", []):
                warn(f"probe: warning: {f['direction']} port of node {f['node']} measured {f['measured_GBps']:.6g} "
                     f"GB/s, above {f['reason']} ({f['stored_GBps']:.6g} GB/s); stored as that, and flagged in "
                     "the file")
        elapsed = time.perf_counter() - started
        measured = {
            "method": f"the {PERCENTILE}th percentile of the repetitions' times; latency: half an 8-byte "
                      "ping-pong; bandwidth: bytes / (send + 1-byte ack - latency), the latency subtracted "
                      f"when at most {LATENCY_SHARE:g} of the time; pairs more than {DISAGREE:g}x off their "
                      f"reverse direction or row measured {RETRIES} more times alone, median kept; "
                      "bandwidths above the hosts' copy bandwidth stored as it and flagged; nodes from "
                      "MPI_Comm_split_type(SHARED), every pair within a node measured, between two nodes "
                      "their leaders (first ranks) and the figure stored for every rank pair of the two",
            "mode": mode,
            "bytes": int(nbytes),
            "reps": int(reps),
            "warmup": int(warmup),
            "rounds": len(schedule),
            "rounds_within_nodes": len(within),
            "rounds_between_nodes": len(between),
            "seconds": round(elapsed, 3),
            "copy_GBps": {host: round(value / 1e9, 3) for host, value in copies.items()},
            "machines": sharing,
            "remeasured": [list(pair) for pair in again],
            "flagged": flagged,
            "ports": port_record,
            "floor": least,
            "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        return BandwidthMatrix(bandwidth, latency, hosts, measured, nodes, ports)
    finally:
        comm.Free()


CLOCK = {"egress": "sender", "ingress": "receiver"}  # the measured node's ranks keep the time


def port_plan(nodes, node, direction, peers=None):
    """The transfers (sender, receiver) that measure ``node``'s ``direction`` ("egress" or
    "ingress") port at once, and the other nodes they reach: the next ``peers`` nodes
    (default ``min(K-1, PORT_PEERS)``), each to (or from) its leader, from (or to) ``node``'s
    ranks in turn."""
    groups = members(nodes)
    count = len(groups)
    peers = min(count - 1, PORT_PEERS) if peers is None else peers
    others = [(node + d) % count for d in range(1, peers + 1)]
    ours = groups[node]
    transfers = []
    for p, other in enumerate(others):
        here, there = ours[p % len(ours)], groups[other][0]
        transfers.append((here, there) if direction == "egress" else (there, here))
    return transfers, others


def _concurrent(comm, transfers, payload, reps, warmup, clock="sender"):
    """Each repetition's time (s) of each of ``transfers`` (sender, receiver) run all at once,
    on every rank: a ``reps`` x ``len(transfers)`` array, the transfers in their order.

    The side named by ``clock`` keeps the time: ``"sender"``, each transfer ending at the
    receiver's 1-byte acknowledgement, sent as soon as the message is in; ``"receiver"``, at
    the message's arrival, after the receiver sent the sender a 1-byte go (the sender starts
    on it). That side's ranks must share a host (the measured node), whose monotonic clock they
    all read: each repetition's times run from the first of them to start after the barrier,
    so one of them leaving the barrier late cannot shorten anything."""
    if clock not in ("sender", "receiver"):
        raise ValueError(f"unknown clock {clock!r}; choices: sender, receiver")
    rank = comm.Get_rank()
    targets = [r for s, r in transfers if s == rank]
    sources = [s for s, r in transfers if r == rank]
    inbox = [np.empty_like(payload) for _ in sources]
    signals = [np.zeros(1, dtype=np.uint8) for _ in targets]
    signal = np.zeros(1, dtype=np.uint8)
    timing = bool(targets) if clock == "sender" else bool(sources)
    starts, ends = [], {(rank, t): [] for t in targets} if clock == "sender" else {(s, rank): [] for s in sources}
    for i in range(warmup + reps):
        comm.Barrier()
        start = time.perf_counter()
        if clock == "sender":
            if sources:  # each sender's acknowledgement as soon as its message is in
                arrivals = [comm.Irecv(buf, source, _TAG) for buf, source in zip(inbox, sources)]
                answered = [comm.Isend(signal, sources[MPI.Request.Waitany(arrivals)], _TAG) for _ in sources]
                MPI.Request.Waitall(answered)
            if targets:
                answers = [comm.Irecv(a, target, _TAG) for a, target in zip(signals, targets)]
                sends = [comm.Isend(payload, target, _TAG) for target in targets]
                for _ in targets:
                    index = MPI.Request.Waitany(answers)
                    ends[rank, targets[index]].append(time.perf_counter())
                MPI.Request.Waitall(sends)
        else:
            if sources:  # the go to every sender, then each arrival timed
                arrivals = [comm.Irecv(buf, source, _TAG) for buf, source in zip(inbox, sources)]
                gone = [comm.Isend(signal, source, _TAG) for source in sources]
                for _ in sources:
                    index = MPI.Request.Waitany(arrivals)
                    ends[sources[index], rank].append(time.perf_counter())
                MPI.Request.Waitall(gone)
            if targets:
                waiting = [comm.Irecv(s, target, _TAG) for s, target in zip(signals, targets)]
                sends = [comm.Isend(payload, targets[MPI.Request.Waitany(waiting)], _TAG) for _ in targets]
                MPI.Request.Waitall(sends)
        if timing:
            starts.append(start)
    gathered = comm.allgather((starts, ends))
    first = np.min([s for s, _ in gathered if s], axis=0)  # per repetition, the timing side's first start
    found = {pair: (np.array(times) - first)[warmup:] for _, rows in gathered for pair, times in rows.items()}
    return np.stack([found[pair] for pair in transfers], axis=1)


HELD_SHARE = 0.75  # a transfer through a port that reached this share of its link's lone rate was held by its link


def port_rate(nbytes, times, links):
    """A port's capacity (B/s) from transfers of ``nbytes`` through it at once, their ``times``
    and their links' own bandwidths (B/s), under max-min sharing: a transfer that reached at
    least :data:`HELD_SHARE` of its link's lone rate was held by its link, ran at its own rate
    throughout and contributes that rate (``nbytes / time``); the others shared the rest of
    the port and ended together, so they add their bytes over the last of their times. All
    held by their links: the port carried their sum (it may be faster)."""
    held = [nbytes / t >= HELD_SHARE * link for t, link in zip(times, links)]
    rate = sum(nbytes / t for t, h in zip(times, held) if h)
    shared = [t for t, h in zip(times, held) if not h]
    return rate + (len(shared) * nbytes / max(shared) if shared else 0.0)


def repeated_port_rate(nbytes, times, links):
    """The port (B/s) of repetitions of transfers through it at once (``times``: repetitions x
    transfers): each repetition's :func:`port_rate`, and of those the ``100 - PERCENTILE``-th
    percentile (noise only slows a repetition). The shares move from one repetition to the
    next, so each transfer's own best time, put together, would make a port faster than any
    repetition had."""
    return float(np.percentile([port_rate(nbytes, rep, links) for rep in times], 100 - PERCENTILE))


def probe_ports(comm, nodes, payload, reps, warmup, copies=None, hosts=None, progress=None, bandwidth=None):
    """Each node's egress and ingress port (GB/s) by :func:`port_plan`, :func:`_concurrent` and
    :func:`port_rate` over the links of ``bandwidth`` (GB/s; unknown links: none held by its
    link), one node and direction at a time; (ports, what was done), on every rank of ``comm``."""
    count = max(nodes) + 1
    peers = min(count - 1, PORT_PEERS)
    rank, started = comm.Get_rank(), time.perf_counter()
    plans = {(d, k): port_plan(nodes, k, d, peers) for d in ("egress", "ingress") for k in range(count)}
    samples = {key: [] for key in plans}

    def measure(keys, report=False):
        for number, key in enumerate(keys, 1):
            transfers = plans[key][0]
            times = _concurrent(comm, transfers, payload, reps, warmup, clock=CLOCK[key[0]])
            links = [bandwidth[a, b] * 1e9 if bandwidth is not None and bandwidth[a, b] > 0 else np.inf
                     for a, b in transfers]
            samples[key].append(repeated_port_rate(payload.nbytes, times, links))
            if report and progress and rank == 0:
                progress(f"probe: ports {number}/{len(keys)} done, {time.perf_counter() - started:.1f} s")

    measure(list(plans), report=True)
    ports = {d: np.array([samples[d, k][0] for k in range(count)]) for d in ("egress", "ingress")}
    again = [(d, k) for d in ports for k in range(count) if _off(ports[d][k], float(np.median(ports[d])), DISAGREE)]
    for _ in range(RETRIES if again else 0):
        measure(again)
    ports = {d: np.array([np.median(samples[d, k]) for k in range(count)]) / 1e9 for d in ports}
    flagged = []
    for d in ports:
        for k in range(count):
            host = hosts[members(nodes)[k][0]] if hosts else None
            bound = peers * copies.get(host, np.inf) / 1e9 if copies and host else np.inf
            if ports[d][k] > bound:
                flagged.append({"node": k, "direction": d, "measured_GBps": float(ports[d][k]),
                                "stored_GBps": float(bound),
                                "reason": f"{peers} copies at the copy bandwidth of its host"})
                ports[d][k] = bound
    record = {
        "method": f"one node at a time: egress, the node's ranks in turn each sending bytes to a different "
                  f"one of the next {peers} nodes' leaders at once; ingress, those nodes' leaders sending to "
                  f"the node's ranks at once, timed by the node's own ranks on their host's clock from the first of them to start (egress: to "
                  f"each 1-byte ack; ingress: senders start on a 1-byte go, to each arrival); each repetition's port: "
                  f"the rates of the transfers that reached {HELD_SHARE:g} of their link's lone rate, plus the bytes "
                  f"of the others over the last of their times; the port: the {100 - PERCENTILE}th percentile of "
                  "the repetitions' ports; ports more than "
                  f"{DISAGREE:g}x off the median of their direction measured {RETRIES} more times, median kept",
        "peers": peers,
        "bytes": int(payload.nbytes),
        "reps": int(reps),
        "warmup": int(warmup),
        "peer_nodes": [plans["egress", k][1] for k in range(count)],
        "remeasured": [{"node": k, "direction": d} for d, k in again],
        "flagged": flagged,
    }
    return ports, record


def _matrices(size, samples, nodes=None):
    """Bandwidth (GB/s) and latency (us) matrices from each pair's measurements (their median);
    a pair of ranks on two nodes (their leaders) stands for every rank pair of those nodes."""
    bandwidth, latency = np.zeros((size, size)), np.zeros((size, size))
    node = np.asarray(nodes if nodes is not None else range(size))
    for (a, b), measurements in samples.items():
        lat, ab, ba = np.median(np.array(measurements), axis=0)
        if node[a] != node[b]:
            rows, cols = np.flatnonzero(node == node[a]), np.flatnonzero(node == node[b])
        else:
            rows, cols = np.array([a]), np.array([b])
        bandwidth[np.ix_(rows, cols)], bandwidth[np.ix_(cols, rows)] = ab / 1e9, ba / 1e9
        latency[np.ix_(rows, cols)] = latency[np.ix_(cols, rows)] = lat * 1e6
    return bandwidth, latency


def _suspicious_pairs(bandwidth, latency, nodes):
    """:func:`suspicious` pairs, like compared with like: the leaders' K x K matrix (the pairs
    between nodes) and each node's own ranks."""
    groups = members(nodes)
    alike = [g for g in groups if len(g) > 1] + ([[g[0] for g in groups]] if len(groups) > 1 else [])
    found = set()
    for ranks in alike:
        block = np.ix_(ranks, ranks)
        found |= {(ranks[a], ranks[b]) for a, b in suspicious(bandwidth[block], latency[block])}
    return found


def _measured_pairs(pairs, nodes):
    """The measured pair behind each rank pair: itself within a node, the nodes' leaders between two."""
    lead = [g[0] for g in members(nodes)]
    found = set()
    for a, b in pairs:
        if nodes[a] != nodes[b]:
            a, b = sorted((lead[nodes[a]], lead[nodes[b]]))
        found.add((a, b))
    return found


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
