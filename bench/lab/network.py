"""An emulated cluster on one machine: K network namespaces (the nodes) on Linux bridges,
every ordered pair of nodes shaped to its own rate with HTB, optionally a NIC cap on each
node's total egress and ingress, and racks joined through shaped uplinks.

Node i is the namespace ``<tag>-ns<i>``, with one veth, ``<tag>-v<i>``, whose peer
``<tag>-h<i>`` is enslaved to a bridge in the root namespace; its address is host i+1 of a
private /24 that exists only inside the namespaces (no bridge has an address). Without racks
every node is on one bridge, ``<tag>-br``; with ``racks`` (the rack of each node) rack r's
nodes are on ``<tag>-br<r>``, and each rack bridge is joined to a core bridge ``<tag>-core``
by a veth pair, ``<tag>-u<r>`` (rack side) and ``<tag>-c<r>`` (core side). With
``second_mbit`` every node has a second, slower interface: a veth ``<tag>-w<i>`` (host side
``<tag>-x<i>``) on a bridge of its own, ``<tag>-sbr``, with host i+1 of a second /24
(``DEFAULT_SECOND_SUBNET``); ``mpmd_command(..., iface="second")`` points MPI and gloo at it.

Shaping (HTB; each qdisc's default class 1:1 is unshaped, and pure TCP ACKs skip the shaped
classes):

* on ``<tag>-v<i>`` (what node i sends), one class per destination j, ``1:<j+16>``, at the
  configured i -> j rate, chosen by a u32 filter on j's address. With a NIC egress cap the
  per-destination classes are children of a class ``1:2`` at the NIC rate and borrow from it
  (child rate = the NIC rate / (K-1), ceil = the link rate), so their sum is capped;
* on ``<tag>-h<i>`` (what the bridge delivers into node i), with a NIC ingress cap, a class
  ``1:2`` at that rate over one class per sending node j, ``1:<j+16>`` (a u32 filter on j's
  address), so the senders share the cap in turn (max-min fair, as ``topology.model.phases``
  takes a port); on ``<tag>-u<r>`` (leaving rack r) and ``<tag>-c<r>`` (entering it) the same;
* on ``<tag>-w<i>`` (node i's second interface), the default class is ``1:2`` at ``second_mbit``.

HTB counts whole Ethernet frames, so TCP goodput is about 1448/1514 = 0.956 of the configured
rate (``GOODPUT``). A node runs ``ranks_per_node`` MPI ranks (:func:`mpmd_command`), each in
its own UTS namespace with the node's hostname; with more than one, they share memory as on a
real node and MPICH is told that there are K nodes (:func:`mpi_environment`).

Every name is recorded in a state file as soon as it is created, and :func:`down` deletes
exactly those, so teardown never touches anything this module did not make. :func:`up` refuses
to start when any of its names, or its subnets, are already in use. Needs root, iproute2
(``ip``, ``tc``) and ``unshare`` (util-linux).
"""

import ipaddress
import json
import math
import numbers
import os
import re
import shutil
import subprocess

import numpy as np

GOODPUT = 1448 / 1514
STATE_DIR = "/run/allreduce-lab"
DEFAULT_TAG = "arlab"
DEFAULT_SUBNET = "10.231.47.0/24"
DEFAULT_SECOND_SUBNET = "10.231.48.0/24"
MAX_NODES = 64
_UNSHAPED = "10gbit"
# The shell that gives a rank its node's hostname inside its own UTS namespace ($0 = the name).
_SET_HOSTNAME = 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"'


class LabError(RuntimeError):
    """The lab cannot be built or used here (a clear, single-line reason)."""


def names(tag, k, racks=None, second=False):
    """The names a lab of ``k`` nodes with ``tag`` (and ``racks`` racks, a number, or None for
    one bridge; ``second``: a second interface per node) uses: namespaces, bridges, host veths,
    inner veths, uplinks, and the second bridge (or None) and veths (or [])."""
    n, s = 0 if racks is None else int(racks), k if second else 0
    return {"netns": [f"{tag}-ns{i}" for i in range(k)],
            "bridge": f"{tag}-br" if racks is None else f"{tag}-core",
            "rack_bridges": [f"{tag}-br{r}" for r in range(n)],
            "uplinks": [f"{tag}-u{r}" for r in range(n)], "core_ports": [f"{tag}-c{r}" for r in range(n)],
            "host_veths": [f"{tag}-h{i}" for i in range(k)], "veths": [f"{tag}-v{i}" for i in range(k)],
            "second_bridge": f"{tag}-sbr" if second else None,
            "second_host_veths": [f"{tag}-x{i}" for i in range(s)], "second_veths": [f"{tag}-w{i}" for i in range(s)]}


def _links_of(planned):
    """The root-namespace link names of a :func:`names` dict."""
    return [planned["bridge"], *planned["rack_bridges"], *planned["uplinks"], *planned["core_ports"],
            *planned["host_veths"], *filter(None, [planned["second_bridge"]]), *planned["second_host_veths"]]


def requirements():
    """None when this process can build a lab, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces, veths, tc)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"the network lab needs {package}: '{tool}' is not on PATH (apt-get install {package})"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"'ip netns' does not work here: {probe.stderr.strip()}"
    return None


def _run(args, stdin=None, check=True):
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(args[:6])}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _state_path(tag):
    return os.path.join(STATE_DIR, f"{tag}.json")


def _validate_tag(tag):
    if not re.fullmatch(r"[a-z][a-z0-9]{0,6}", tag):
        raise LabError(f"lab tag {tag!r}: use 1-7 lowercase letters or digits, starting with a letter")


def _taken(tag, k, subnet, racks=None, second_subnet=None):
    """What is already in use among this lab's names and subnets (the second's, when given)."""
    planned = names(tag, k, racks, second_subnet is not None)
    existing_ns = set(_run(["ip", "netns", "list"]).stdout.split())
    existing_links = {line.split(":")[1].strip().split("@")[0]
                      for line in _run(["ip", "-o", "link", "show"]).stdout.splitlines() if ":" in line}
    taken = [n for n in planned["netns"] if n in existing_ns]
    taken += [n for n in _links_of(planned) if n in existing_links]
    if os.path.exists(_state_path(tag)):
        taken.append(f"state file {_state_path(tag)} (a lab with tag {tag!r} is up; 'down' it first)")
    for net in [subnet] + ([second_subnet] if second_subnet is not None else []):
        for line in _run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
            if ipaddress.ip_interface(line.split()[3]).network.overlaps(ipaddress.ip_network(net)):
                taken.append(f"subnet {net} (already on {line.split()[1]})")
    return taken


def _rate(value, what):
    """A positive finite Mbit/s, or None (unshaped)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise LabError(f"{what}: {value!r} is not a positive number of Mbit/s")
    return float(value)


def _two_way(spec, count, what):
    """``spec`` (None, a number for all, or a list of ``count`` entries, each None, a number, or
    a pair (out, in)) as ``count`` [out, in] pairs of Mbit/s or None; None when nothing is set."""
    if spec is None:
        return None
    if isinstance(spec, numbers.Real) and not isinstance(spec, bool):
        entries = [spec] * count
    else:
        entries = list(spec)
        if len(entries) != count:
            raise LabError(f"{what}: {len(entries)} entries for {count} {'racks' if 'uplink' in what else 'nodes'}")
    pairs = []
    for n, entry in enumerate(entries):
        if entry is None or isinstance(entry, numbers.Real):
            pair = [entry, entry]
        else:
            pair = list(entry)
            if len(pair) != 2:
                raise LabError(f"{what}[{n}]: give one number or a pair (egress, ingress), got {entry!r}")
        pairs.append([_rate(pair[0], f"{what}[{n}]"), _rate(pair[1], f"{what}[{n}]")])
    return None if all(p == [None, None] for p in pairs) else pairs


def validate_rates(rates_mbit):
    """A K x K matrix of positive finite rates in Mbit/s (diagonal ignored), K >= 2."""
    rates = np.asarray(rates_mbit, dtype=float)
    if rates.ndim != 2 or rates.shape[0] != rates.shape[1] or rates.shape[0] < 2:
        raise LabError(f"the rate matrix must be K x K with K >= 2, got shape {rates.shape}")
    off = ~np.eye(len(rates), dtype=bool)
    if not np.all(np.isfinite(rates[off])) or np.any(rates[off] <= 0):
        raise LabError("every off-diagonal rate must be a positive number of Mbit/s")
    if len(rates) > MAX_NODES:
        raise LabError(f"{len(rates)} namespaces: at most {MAX_NODES}")
    return rates


def validate_racks(racks, k):
    """The rack of each of ``k`` nodes: racks numbered 0..n-1, each with a node; or None."""
    if racks is None:
        return None
    racks = list(racks)
    if len(racks) != k or not all(isinstance(r, numbers.Integral) and not isinstance(r, bool) and r >= 0 for r in racks):
        raise LabError(f"racks: give the rack (0, 1, ...) of each of the {k} nodes, got {racks!r}")
    racks = [int(r) for r in racks]
    missing = sorted(set(range(max(racks) + 1)) - set(racks))
    if missing:
        raise LabError(f"racks: rack {missing[0]} has no node (number the racks 0..n-1)")
    return racks


class Lab:
    """A lab that is up: its nodes, ranks, names, addresses and the configured rates (Mbit/s)."""

    def __init__(self, tag, rates_mbit, subnet, ranks_per_node=1, nic_mbit=None, racks=None, uplink_mbit=None,
                 second_mbit=None, second_subnet=DEFAULT_SECOND_SUBNET):
        self.tag = tag
        self.rates = validate_rates(rates_mbit)
        self.k = len(self.rates)
        if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, numbers.Integral) or ranks_per_node < 1:
            raise LabError(f"ranks per node: {ranks_per_node!r} is not a positive whole number")
        self.ranks_per_node = int(ranks_per_node)
        self.ranks = self.k * self.ranks_per_node
        self.subnet = subnet
        # [egress, ingress] Mbit/s per node (None: not capped), or None: no NIC caps at all
        self.nic = _two_way(nic_mbit, self.k, "nic_mbit")
        self.racks = validate_racks(racks, self.k)
        self.n_racks = 0 if self.racks is None else max(self.racks) + 1
        if uplink_mbit is not None and self.racks is None:
            raise LabError("uplink_mbit needs racks (the rack of each node)")
        # [up (out of the rack), down (into it)] Mbit/s per rack, or None
        self.uplinks = _two_way(uplink_mbit, self.n_racks, "uplink_mbit") if self.racks is not None else None
        self.second_mbit = _rate(second_mbit, "second_mbit")  # None: no second interface
        self.second_subnet = None if self.second_mbit is None else second_subnet
        self.names = names(tag, self.k, None if self.racks is None else self.n_racks, self.second_mbit is not None)
        self.addresses = _addresses(subnet, self.k)
        self.second_addresses = None if self.second_subnet is None else _addresses(second_subnet, self.k, subnet)

    def netns(self, i):
        return self.names["netns"][i]

    def veth(self, i):
        return self.names["veths"][i]

    def host_veth(self, i):
        return self.names["host_veths"][i]

    def second_veth(self, i):
        if self.second_mbit is None:
            raise LabError(f"lab {self.tag} has no second interface (up with second_mbit, --second-mbit)")
        return self.names["second_veths"][i]

    def hostname(self, i):
        """The hostname every rank of node i sees."""
        return f"{self.tag}-node{i}"

    def node_of(self, rank):
        """The node (namespace) that runs ``rank``: ranks are numbered node by node."""
        if not 0 <= rank < self.ranks:
            raise LabError(f"rank {rank}: the lab has ranks 0..{self.ranks - 1}")
        return rank // self.ranks_per_node

    def bridge_of(self, i):
        """The bridge node i's host veth is on."""
        return self.names["bridge"] if self.racks is None else self.names["rack_bridges"][self.racks[i]]

    def nic_of(self, i):
        """Node i's NIC cap, [egress, ingress] Mbit/s (None: not capped)."""
        return [None, None] if self.nic is None else list(self.nic[i])

    def uplink_of(self, r):
        """Rack r's uplink, [up, down] Mbit/s (None: not shaped)."""
        return [None, None] if self.uplinks is None else list(self.uplinks[r])

    def class_id(self, j):
        """The HTB class (``1:<hex>``) that carries traffic to namespace j."""
        return f"1:{j + 16:x}"

    def shape(self):
        """Everything configured, as plain JSON-ready values: the record of what the lab emulates:
        ``nodes`` (K), ``ranks_per_node`` (R), ``ranks`` (K x R), ``hostnames``, ``rates_mbit`` (K x K,
        node to node), ``nic_mbit`` ([egress, ingress] per node, None entries uncapped; None: no NIC
        caps), ``racks`` (rack of each node, or None: one bridge), ``uplink_mbit`` ([up, down] per
        rack, or None), ``oversubscription`` (per rack: its nodes' egress capacity, NIC or else fastest
        link, over the uplink's up rate; None: unshaped), ``second_mbit``, ``goodput_factor``."""
        over = None if self.racks is None else []
        for r in range(self.n_racks):  # none without racks
            up_rate = self.uplink_of(r)[0]
            capacity = sum(_egress_capacity(self, i) for i in range(self.k) if self.racks[i] == r)
            over.append(None if up_rate is None else round(capacity / up_rate, 4))
        return {"nodes": self.k, "ranks_per_node": self.ranks_per_node, "ranks": self.ranks,
                "hostnames": [self.hostname(i) for i in range(self.k)], "rates_mbit": self.rates.tolist(),
                "nic_mbit": None if self.nic is None else [list(p) for p in self.nic],
                "racks": None if self.racks is None else list(self.racks),
                "uplink_mbit": None if self.uplinks is None else [list(p) for p in self.uplinks],
                "oversubscription": over, "second_mbit": self.second_mbit, "goodput_factor": GOODPUT}

    def class_bytes(self):
        """Bytes each shaped class has sent: a K x K matrix (i -> j), from ``tc -s class show``."""
        sent = np.zeros((self.k, self.k), dtype=np.int64)
        for i in range(self.k):
            counts = _htb_bytes(self.veth(i), self.netns(i))
            sent[i] = [0 if j == i else counts.get(self.class_id(j), 0) for j in range(self.k)]
        return sent

    def nic_bytes(self):
        """Bytes through each node's NIC caps: K x 2 (egress class 1:2 on its veth, ingress class
        1:2 on its host veth); 0 where not capped."""
        sent = np.zeros((self.k, 2), dtype=np.int64)
        for i in range(self.k):
            egress, ingress = self.nic_of(i)
            if egress is not None:
                sent[i, 0] = _htb_bytes(self.veth(i), self.netns(i)).get("1:2", 0)
            if ingress is not None:
                sent[i, 1] = _htb_bytes(self.host_veth(i)).get("1:2", 0)
        return sent

    def uplink_bytes(self):
        """Bytes through each rack's shaped uplink: n_racks x 2 (up, down); 0 where unshaped."""
        sent = np.zeros((self.n_racks, 2), dtype=np.int64)
        for r in range(self.n_racks):
            for d, dev in enumerate((self.names["uplinks"][r], self.names["core_ports"][r])):
                if self.uplink_of(r)[d] is not None:
                    sent[r, d] = _htb_bytes(dev).get("1:2", 0)
        return sent


def _addresses(subnet, k, apart=None):
    """Hosts 1..k of ``subnet`` (which must not overlap the subnet ``apart``)."""
    if apart is not None and ipaddress.ip_network(subnet).overlaps(ipaddress.ip_network(apart)):
        raise LabError(f"second subnet {subnet} overlaps the subnet {apart}")
    hosts = list(ipaddress.ip_network(subnet).hosts())
    if len(hosts) < k:
        raise LabError(f"subnet {subnet} has {len(hosts)} addresses for {k} nodes")
    return [str(hosts[i]) for i in range(k)]


def _egress_capacity(lab, i):
    """The most node i can send: its NIC egress cap, else its fastest link."""
    egress = lab.nic_of(i)[0]
    return egress if egress is not None else float(max(lab.rates[i, j] for j in range(lab.k) if j != i))


def _htb_bytes(dev, netns=None):
    """class id -> bytes sent, of the HTB classes on ``dev`` (in ``netns``, or the root namespace)."""
    prefix = [] if netns is None else ["ip", "netns", "exec", netns]
    out = _run([*prefix, "tc", "-s", "class", "show", "dev", dev]).stdout
    counts = {}
    for block in out.split("class htb ")[1:]:
        if match := re.search(r"Sent (\d+) bytes", block):
            counts[block.split()[0]] = int(match.group(1))
    return counts


def rack_layout(nodes, racks):
    """The rack of each of ``nodes`` nodes in ``racks`` racks of consecutive nodes (as even as can be)."""
    if not 1 <= racks <= nodes:
        raise LabError(f"{racks} racks for {nodes} nodes: give 1 to {nodes}")
    return [i * racks // nodes for i in range(nodes)]


def oversubscribed(nodes, racks, nic_mbit, oversubscription=1.0, rates_mbit=None):
    """``racks`` and ``uplink_mbit`` for :func:`up`: ``racks`` racks of consecutive nodes, each
    uplink = (the rack's nodes x the NIC rate) / ``oversubscription``, both directions, e.g. 400
    Mbit/s by ``oversubscribed(8, 2, 200, 2)`` (2 racks of 4 nodes, 200 Mbit/s NICs, 2:1). ``nic_mbit``:
    a number, or per node (egress rates summed; without one, the node's fastest link in ``rates_mbit``)."""
    layout = rack_layout(nodes, racks)
    if isinstance(oversubscription, bool) or not isinstance(oversubscription, numbers.Real) \
            or not math.isfinite(oversubscription) or oversubscription <= 0:
        raise LabError(f"oversubscription {oversubscription!r}: give a positive ratio (2 for 2:1)")
    nic = _two_way(nic_mbit, nodes, "nic_mbit") or [[None, None] for _ in range(nodes)]
    capacity = []
    for i in range(nodes):
        if nic[i][0] is not None:
            capacity.append(nic[i][0])
        elif rates_mbit is not None:
            capacity.append(float(max(rates_mbit[i][j] for j in range(nodes) if j != i)))
        else:
            raise LabError(f"an oversubscribed uplink needs node {i}'s NIC egress rate (or the link rates)")
    uplinks = [sum(capacity[i] for i in range(nodes) if layout[i] == r) / oversubscription for r in range(racks)]
    return {"racks": layout, "uplink_mbit": uplinks}


def slow_nic(nic_mbit, nodes, node, mbit):
    """``nic_mbit`` (as :func:`up` takes it) with node ``node``'s NIC at ``mbit`` both ways: one slow NIC."""
    pairs = _two_way(nic_mbit, nodes, "nic_mbit") or [[None, None] for _ in range(nodes)]
    if not 0 <= node < nodes:
        raise LabError(f"slow NIC on node {node}: the lab has nodes 0..{nodes - 1}")
    pairs[node] = [_rate(mbit, "slow NIC"), _rate(mbit, "slow NIC")]
    return pairs


def slow_pair(rates_mbit, a, b, mbit):
    """A copy of the K x K ``rates_mbit`` with the link a <-> b at ``mbit`` both ways: one slow pair."""
    rates = np.array(rates_mbit, dtype=float)
    if a == b or not (0 <= a < len(rates) and 0 <= b < len(rates)):
        raise LabError(f"slow pair {a}:{b}: give two different nodes of 0..{len(rates) - 1}")
    rates[a, b] = rates[b, a] = _rate(mbit, "slow pair")
    return rates


def up(rates_mbit, tag=DEFAULT_TAG, subnet=DEFAULT_SUBNET, owner=None, ranks_per_node=1, nic_mbit=None,
       racks=None, uplink_mbit=None, second_mbit=None, second_subnet=DEFAULT_SECOND_SUBNET):
    """Build the lab; returns a :class:`Lab`. On any failure, what was built is torn down.

    ``rates_mbit``: K x K node-to-node rates. ``ranks_per_node``: MPI ranks per node (namespace).
    ``nic_mbit``: each node's cap on its total egress and ingress (a number for all, or per node a
    number or (egress, ingress); None: no cap). ``racks``: the rack of each node (None: one bridge).
    ``uplink_mbit``: each rack's uplink to the core, per direction (a number, or per rack a number
    or (up, down); None: unshaped). ``second_mbit``: a second interface on every node, on its own
    bridge and ``second_subnet``, each node's egress on it shaped to that rate (None: none).
    ``owner`` (any string) is recorded, so that ``down(tag, owner)`` leaves other owners' labs alone."""
    if reason := requirements():
        raise LabError(reason)
    _validate_tag(tag)
    lab = Lab(tag, rates_mbit, subnet, ranks_per_node, nic_mbit, racks, uplink_mbit, second_mbit, second_subnet)
    k = lab.k
    taken = _taken(tag, k, subnet, None if lab.racks is None else lab.n_racks, lab.second_subnet)
    if taken:
        raise LabError("refusing to start, already in use: " + ", ".join(taken))
    os.makedirs(STATE_DIR, exist_ok=True)
    created = {"tag": tag, "owner": owner, "subnet": subnet, "rates_mbit": lab.rates.tolist(),
               "ranks_per_node": lab.ranks_per_node, "nic_mbit": lab.nic, "racks": lab.racks,
               "uplink_mbit": lab.uplinks, "second_mbit": lab.second_mbit, "second_subnet": lab.second_subnet,
               "netns": [], "links": []}

    def record(kind, *new):
        created[kind].extend(new)
        tmp = _state_path(tag) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(created, f)
        os.replace(tmp, _state_path(tag))

    try:
        bridge = lab.names["bridge"]
        for name in filter(None, (bridge, lab.names["second_bridge"], *lab.names["rack_bridges"])):
            _run(["ip", "link", "add", name, "type", "bridge"])
            record("links", name)
            _run(["ip", "link", "set", name, "up"])
        for r in range(lab.n_racks):
            rack, uplink, port = (lab.names[key][r] for key in ("rack_bridges", "uplinks", "core_ports"))
            _run(["ip", "link", "add", uplink, "type", "veth", "peer", "name", port])
            record("links", uplink, port)
            inside = [j for j in range(k) if lab.racks[j] == r]
            outside = [j for j in range(k) if lab.racks[j] != r]
            for dev, master, rate, senders in ((uplink, rack, lab.uplink_of(r)[0], inside),
                                               (port, bridge, lab.uplink_of(r)[1], outside)):
                _run(["ip", "link", "set", dev, "master", master])
                _run(["ip", "link", "set", dev, "up"])
                if rate is not None:
                    _run(["tc", "-batch", "-"], stdin=_shared_cap(lab, dev, rate, senders))
        for i in range(k):
            ns = lab.netns(i)
            _run(["ip", "netns", "add", ns])
            record("netns", ns)
            for host, inner, master, address, shaping in _interfaces(lab, i):
                _run(["ip", "link", "add", host, "type", "veth", "peer", "name", inner, "netns", ns])
                record("links", host)
                _run(["ip", "link", "set", host, "master", master])
                _run(["ip", "link", "set", host, "up"])
                commands = ["link set lo up", f"link set {inner} up", f"addr add {address} dev {inner}"]
                _run(["ip", "-n", ns, "-batch", "-"], stdin="\n".join(commands) + "\n")
                _run(["ip", "netns", "exec", ns, "tc", "-batch", "-"], stdin=shaping)
            # a pipelined collective leaves a link idle between segments: keep TCP's window then
            _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0"])
            ingress = lab.nic_of(i)[1]
            if ingress is not None:
                senders = [j for j in range(k) if j != i]
                _run(["tc", "-batch", "-"], stdin=_shared_cap(lab, lab.host_veth(i), ingress, senders))
        return lab
    except BaseException:
        down(tag, owner)
        raise


# pure TCP ACKs (20-byte IP header, length < 64, flags ACK only) skip the shaped queues:
# behind a full queue they would throttle the opposite direction of the same pair
def _ack_bypass(dev):
    return (f"filter add dev {dev} parent 1: protocol ip prio 0 u32 match ip protocol 6 0xff "
            "match u8 0x05 0x0f at 0 match u16 0x0000 0xffc0 at 2 match u8 0x10 0xff at 33 flowid 1:1")


def _mbit(rate):
    return f"{rate:.6g}mbit"


def _interfaces(lab, i):
    """Node i's veths: (host side, inner side, bridge, address/prefix, tc batch of the inner HTB) each."""
    yield (lab.host_veth(i), lab.veth(i), lab.bridge_of(i),
           f"{lab.addresses[i]}/{ipaddress.ip_network(lab.subnet).prefixlen}", _shaping(lab, i))
    if lab.second_mbit is not None:
        dev, rate = lab.second_veth(i), _mbit(lab.second_mbit)
        yield (lab.names["second_host_veths"][i], dev, lab.names["second_bridge"],
               f"{lab.second_addresses[i]}/{ipaddress.ip_network(lab.second_subnet).prefixlen}",
               f"qdisc add dev {dev} root handle 1: htb default 2\n"
               f"class add dev {dev} parent 1: classid 1:1 htb rate {_UNSHAPED} ceil {_UNSHAPED}\n"
               f"class add dev {dev} parent 1: classid 1:2 htb rate {rate} ceil {rate}\n{_ack_bypass(dev)}\n")


def _shaping(lab, i):
    """tc batch commands: HTB on namespace i's veth, one class and u32 filter per destination,
    under a class at the NIC's egress rate when node i has one."""
    dev = lab.veth(i)
    lines = [f"qdisc add dev {dev} root handle 1: htb default 1",
             f"class add dev {dev} parent 1: classid 1:1 htb rate {_UNSHAPED} ceil {_UNSHAPED}",
             _ack_bypass(dev)]
    nic = lab.nic_of(i)[0]
    parent = "1:"
    if nic is not None:
        lines.append(f"class add dev {dev} parent 1: classid 1:2 htb rate {_mbit(nic)} ceil {_mbit(nic)}")
        parent = "1:2"
    for j in [j for j in range(lab.k) if j != i]:
        ceil = float(lab.rates[i, j]) if nic is None else min(float(lab.rates[i, j]), nic)
        # HTB does not cap the sum of children's guaranteed rates: under a NIC they must borrow
        rate = ceil if nic is None else min(ceil, nic / (lab.k - 1))
        lines.append(f"class add dev {dev} parent {parent} classid {lab.class_id(j)} htb "
                     f"rate {_mbit(rate)} ceil {_mbit(ceil)}")
        lines.append(f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dst "
                     f"{lab.addresses[j]}/32 flowid {lab.class_id(j)}")
    return "\n".join(lines) + "\n"


def _shared_cap(lab, dev, rate, senders):
    """tc batch commands: every packet from the nodes ``senders`` leaving ``dev`` (root namespace:
    a node's ingress, or a rack's uplink either way) capped at ``rate`` Mbit/s by class 1:2, over
    one class per sender j (``1:<j+16>``, a u32 filter on j's address, borrowing from 1:2), so they
    share the cap in turn, max-min fair as ``topology.model.phases`` takes a port or an uplink; pure
    TCP ACKs and non-IP frames (ARP) unshaped. (One queue for all, tried first, shared unevenly: a
    flow starting behind 1000 frames, 60 ms at 200 Mbit/s, grows its window slowly; the double
    binary tree ran 27% slower than the max-min model, 12-17% with these classes.)"""
    lines = [f"qdisc add dev {dev} root handle 1: htb default 1",
             f"class add dev {dev} parent 1: classid 1:1 htb rate {_UNSHAPED} ceil {_UNSHAPED}",
             f"class add dev {dev} parent 1: classid 1:2 htb rate {_mbit(rate)} ceil {_mbit(rate)}",
             _ack_bypass(dev)]
    for j in senders:
        lines.append(f"class add dev {dev} parent 1:2 classid {lab.class_id(j)} htb "
                     f"rate {_mbit(rate / len(senders))} ceil {_mbit(rate)}")
        lines.append(f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip src "
                     f"{lab.addresses[j]}/32 flowid {lab.class_id(j)}")
    return "\n".join(lines) + "\n"


def down(tag=DEFAULT_TAG, owner=None):
    """Delete exactly what the state file of ``tag`` records (namespaces first: their veths go
    with them), then the file. Returns the names removed; no-op without a state file or when
    ``owner`` (when given) did not build it."""
    path = _state_path(tag)
    try:
        with open(path) as f:
            created = json.load(f)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise LabError(f"cannot read the lab state {path}: {exc}") from None
    if owner is not None and created.get("owner") != owner:
        return []
    removed = []
    existing_ns = set(_run(["ip", "netns", "list"], check=False).stdout.split())
    for ns in created.get("netns", []):
        if ns in existing_ns and _run(["ip", "netns", "delete", ns], check=False).returncode == 0:
            removed.append(ns)
    for link in reversed(created.get("links", [])):
        if _run(["ip", "link", "show", link], check=False).returncode == 0:
            if _run(["ip", "link", "delete", link], check=False).returncode == 0:
                removed.append(link)
    os.remove(path)
    return removed


def load(tag=DEFAULT_TAG):
    """The :class:`Lab` that is up with ``tag`` (from its state file)."""
    try:
        with open(_state_path(tag)) as f:
            created = json.load(f)
    except FileNotFoundError:
        raise LabError(f"no lab with tag {tag!r} is up (no {_state_path(tag)})") from None
    return Lab(tag, created["rates_mbit"], created["subnet"], created.get("ranks_per_node", 1),
               created.get("nic_mbit"), created.get("racks"), created.get("uplink_mbit"),
               created.get("second_mbit"), created.get("second_subnet") or DEFAULT_SECOND_SUBNET)


def mpmd_command(lab, mpiexec, argv, ranks=None, iface="first"):
    """An ``mpiexec`` MPMD command line: node i runs ``ranks_per_node`` ranks of ``argv`` inside
    namespace i, each in its own UTS namespace with the node's hostname (:meth:`Lab.hostname`),
    the node's veth (``iface="second"``: its second veth) as the libfabric TCP interface and
    gloo's (``GLOO_SOCKET_IFNAME``), node 0's address on it as torch.distributed's rendezvous
    (``MASTER_ADDR``; the lab's hostnames resolve nowhere); ranks are numbered node by node.
    ``ranks``: only the first that many (default all). Set :func:`mpi_environment` for mpiexec."""
    if iface not in ("first", "second"):
        raise LabError(f"interface {iface!r}: give 'first' or 'second'")
    veth = lab.veth if iface == "first" else lab.second_veth
    veth(0)  # no second interface: say so
    master = lab.addresses[0] if iface == "first" else lab.second_addresses[0]
    total = lab.ranks if ranks is None else ranks
    if not 1 <= total <= lab.ranks or total % lab.ranks_per_node:
        raise LabError(f"{total} ranks: the lab has {lab.ranks}, {lab.ranks_per_node} on each node "
                       "(run whole nodes)")
    command = [mpiexec]
    for i in range(lab.node_of(total - 1) + 1):
        count = min(lab.ranks_per_node, total - i * lab.ranks_per_node)
        if i:
            command.append(":")
        command += ["-n", str(count), "ip", "netns", "exec", lab.netns(i),
                    "unshare", "--uts", "sh", "-c", _SET_HOSTNAME, lab.hostname(i),
                    "env", f"FI_TCP_IFACE={veth(i)}", f"GLOO_SOCKET_IFNAME={veth(i)}", f"MASTER_ADDR={master}", *argv]
    return command


def mpi_environment(lab=None, ranks=None):
    """MPICH's settings for a job in ``lab`` (of ``ranks`` ranks, as :func:`mpmd_command`'s;
    default all): over libfabric TCP. One rank per node (or no lab): never shared memory, so every
    byte crosses the shaped veths. More: a node's ranks share memory, and MPICH sees one node per
    namespace, blocks of R consecutive ranks (cliques), so only bytes between nodes cross them."""
    env = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
    if lab is None:
        return {"MPIR_CVAR_NOLOCAL": "1", **env}
    nodes = lab.k if ranks is None else -(-ranks // lab.ranks_per_node)
    cliques = {"MPIR_CVAR_NUM_CLIQUES": str(nodes), "MPIR_CVAR_CLIQUES_BY_BLOCK": "1", **env}
    if lab.ranks_per_node == 1:  # a node per rank for Split_type(SHARED) too
        return {"MPIR_CVAR_NOLOCAL": "1", **cliques}
    return {"MPIR_CVAR_NOLOCAL": "0", **cliques}
