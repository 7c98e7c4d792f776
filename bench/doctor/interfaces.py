"""Check 3, the interface that carries the traffic between nodes, against the fastest one that
reaches the same peer.

For each node and the next (node leaders, the first rank of each, in a ring of the nodes):

1. **Which interface carried MPI's bytes**: the leader's interface counters
   (``/sys/class/net/*/statistics/tx_bytes``, and the RDMA ports' ``port_xmit_data``) read
   around :data:`PAYLOAD` bytes sent to the next leader by ``MPI_Sendrecv``; the carrier is
   the interface whose count grew by at least :data:`SEEN` of them.
2. **What each interface gives**: every interface of the leader with an IPv4 address in a
   subnet where the next leader has one is measured over TCP, the sender bound to its own
   address, for :data:`SECONDS` (bytes over the time until the receiver's count comes back),
   the ``speed`` the driver reports beside it.
3. A carrier that gives less than :data:`SLOWER` of the fastest interface to the same peer is a
   finding, and so is an interface that ``NCCL_SOCKET_IFNAME`` or ``GLOO_SOCKET_IFNAME`` names
   that does.
"""

import ipaddress
import socket
import time

import numpy as np

from .facts import counters
from .finding import Finding, Unchecked

CHECK = "interfaces"
PAYLOAD = 2 << 20  # bytes MPI sends to the next node while the counters watch
SEEN = 0.8  # share of the payload an interface's count must grow by to be the carrier
SECONDS = 0.25  # each interface's TCP measurement
SLOWER = 0.7  # a carrier below this share of the fastest interface is a finding
CHUNK = 256 << 10
TOLD = ("FI_TCP_IFACE", "UCX_NET_DEVICES", "MPIR_CVAR_CH4_OFI_IFNAME", "OMPI_MCA_btl_tcp_if_include",
        "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _reaching(mine, theirs):
    """[(interface, my address, peer address)] for each of my interfaces with an IPv4 address in
    a subnet where the peer has one."""
    found = []
    for iface in mine:
        if iface["loopback"] or iface["state"] not in ("up", "unknown"):
            continue
        for text in iface["addresses"]:
            net = ipaddress.ip_interface(text).network
            peer = next((ipaddress.ip_interface(t).ip for i in theirs for t in i["addresses"]
                         if not i["loopback"] and ipaddress.ip_interface(t).ip in net), None)
            if peer is not None:
                found.append((iface["name"], str(ipaddress.ip_interface(text).ip), str(peer)))
                break
    return found


def _send(comm, peer, local, remote):
    """Bytes per second over TCP from ``local`` to ``remote`` (the peer listening), or None."""
    port = comm.recv(source=peer, tag=71)
    if port is None:
        return None
    rate = None
    try:
        with socket.create_connection((remote, port), timeout=3, source_address=(local, 0)) as s:
            chunk = bytes(CHUNK)
            start = time.perf_counter()
            while time.perf_counter() - start < SECONDS:
                s.sendall(chunk)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(60)
            received = int(s.makefile().readline() or 0)
            rate = received / (time.perf_counter() - start)
    except (OSError, ValueError):  # refused, timed out, or no count came back
        rate = None
    comm.send(rate is not None, dest=peer, tag=72)
    return rate


def _receive(comm, peer, address):
    """The other end of :func:`_send`: listen on this rank's ``address``, count what arrives."""
    try:
        listener = socket.create_server((address, 0))
    except OSError:
        comm.send(None, dest=peer, tag=71)
        return
    with listener:
        listener.settimeout(5)
        comm.send(listener.getsockname()[1], dest=peer, tag=71)
        try:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(60)
                total = 0
                while data := conn.recv(1 << 20):
                    total += len(data)
                conn.sendall(f"{total}\n".encode())
        except OSError:
            pass
    comm.recv(source=peer, tag=72)


def _carriers(comm, pairs):
    """{sender leader: (carrier or None, {interface: bytes sent})} after MPI's payload."""
    rank = comm.Get_rank()
    before = counters()
    payload, incoming = np.ones(PAYLOAD, np.uint8), np.empty(PAYLOAD, np.uint8)
    comm.Barrier()
    for a, b in pairs:  # one pair at a time: a leader's counters then hold what went to b alone
        if rank == a:
            comm.Send(payload, dest=b, tag=70)
            comm.Recv(incoming[:1], source=b, tag=73)
        elif rank == b:
            comm.Recv(incoming, source=a, tag=70)
            comm.Send(payload[:1], dest=a, tag=73)
        if rank == a:
            after = counters()
            grown = {n: after[n][0] - before.get(n, after[n])[0] for n in after}
            best = max(grown, key=grown.get, default=None)
            found = (best if best is not None and grown[best] >= SEEN * PAYLOAD else None, grown)
        before = counters() if rank == a else before
        comm.Barrier()
        if rank == a:
            yield a, found


def measure(comm, job):
    """Every pair's carrier and rates, on rank 0 (collective): [{"from", "to", "carrier",
    "sent", "rates"}] and the rates in bytes/s per interface; None where there is one node."""
    leaders = [node[0] for node in job.nodes]
    if len(leaders) < 2:
        return None
    pairs = [(leaders[i], leaders[(i + 1) % len(leaders)]) for i in range(len(leaders))]
    rank = comm.Get_rank()
    mine = dict(_carriers(comm, pairs))
    results = []
    for a, b in pairs:
        routes = _reaching(job.ranks[a]["interfaces"], job.ranks[b]["interfaces"])
        rates = {}
        for name, local, remote in routes:
            if rank == a:
                rates[name] = _send(comm, b, local, remote)
            elif rank == b:
                _receive(comm, a, remote)
        comm.Barrier()
        if rank == a:
            carrier, sent = mine[a]
            results.append({"from": a, "to": b, "carrier": carrier, "sent": {n: v for n, v in sent.items() if v > 0},
                            "rates": rates, "routes": routes})
    gathered = comm.gather(results, root=0)
    return None if rank else [r for part in gathered for r in part]


def _speed(job, rank, name):
    iface = next((i for i in job.ranks[rank]["interfaces"] if i["name"] == name), None)
    return iface and iface["speed_mbit"]


def _rate_text(job, rank, name, rates):
    rate, speed = rates.get(name), _speed(job, rank, name)
    parts = ([f"{rate * 8 / 1e6:.3g} Mbit/s measured"] if rate else []) + ([f"{speed} Mbit/s link"] if speed else [])
    return f"{name} ({', '.join(parts) or 'not measured'})"


def _told(job, rank):
    return {v: job.env(rank, v) for v in TOLD if job.env(rank, v)}


def check(job, measured):
    """Check 3's findings, what it could not check, and {rank: carriers} for the binding check."""
    if measured is None:
        return [], [Unchecked(CHECK, "the interface between nodes", "one node: no traffic leaves it")], {}
    found, unchecked, carriers = [], [], {}
    for pair in measured:
        a, b = pair["from"], pair["to"]
        node = job.node_of(a)
        peer = job.hosts([b])[0]
        rates = {n: r for n, r in pair["rates"].items() if r}
        carrier = pair["carrier"]
        told = _told(job, a)
        if carrier is None:
            unchecked.append(Unchecked(CHECK, f"the interface carrying {job.hosts([a])[0]}'s traffic to {peer}",
                                       f"no interface's counter grew by {SEEN:.0%} of the {PAYLOAD >> 20} MiB sent "
                                       "(a fabric whose bytes the kernel does not count)"))
        else:
            for rank in node:
                carriers.setdefault(rank, set()).add(carrier)
        if not rates:
            unchecked.append(Unchecked(CHECK, f"the rates of {job.hosts([a])[0]}'s interfaces to {peer}",
                                       "no interface has an IPv4 address in a subnet of the peer's, or TCP failed"))
            continue
        best = max(rates, key=rates.get)
        for name, why in ([(carrier, "MPI's traffic")] if carrier in rates else []) + \
                [(told[v], v) for v in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
                 if told.get(v) in rates and told[v] != carrier]:  # one naming the carrier: in its finding
            if name == best or rates[name] >= SLOWER * rates[best]:
                continue
            named = [f"{v}={value}" for v, value in told.items() if value == name]
            evidence = (f"{why} to {peer} leaves through {_rate_text(job, a, name, rates)}, while "
                        f"{_rate_text(job, a, best, rates)} is up and reaches it"
                        + (f"; {', '.join(named)}" if named else ""))
            fix = (f"set {', '.join(f'{v}={best}' for v, value in told.items() if value == name)}" if named else
                   f"tell the library to use {best}: FI_TCP_IFACE={best} (MPICH over libfabric), UCX_NET_DEVICES={best} "
                   f"(UCX), --mca btl_tcp_if_include {best} (Open MPI), NCCL_SOCKET_IFNAME={best}")
            found.append(Finding(CHECK, f"{why} to {peer} takes a slower interface", "high", node, evidence,
                                 f"bytes between the nodes move {rates[best] / rates[name]:.1f}x slower than "
                                 f"{best} carries them", fix, job.hosts(node), rates[best] / rates[name]))
    return found, unchecked, carriers
