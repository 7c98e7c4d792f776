"""An emulated cluster on one machine: K network namespaces on a Linux bridge, every ordered
pair of them shaped to its own rate with HTB.

Namespace i (``<tag>-ns<i>``) has one veth, ``<tag>-v<i>``, whose peer ``<tag>-h<i>`` is
enslaved to the bridge ``<tag>-br`` in the root namespace; its address is host i+1 of a
private /24 that exists only inside the namespaces (the bridge has no address). On each
``<tag>-v<i>``, an HTB qdisc has one class per destination j, rate = ceil = the configured
i -> j rate, selected by a u32 filter on j's address; everything else (ARP) goes to an
unshaped default class. HTB counts whole Ethernet frames, so TCP goodput is about
1448/1514 = 0.956 of the configured rate (``GOODPUT``).

Every name is recorded in a state file as soon as it is created, and :func:`down` deletes
exactly the recorded names, so teardown never touches anything this module did not make.
:func:`up` refuses to start when any of its names, or its subnet, is already in use.
Needs root and iproute2 (``ip``, ``tc``).
"""

import ipaddress
import json
import os
import re
import shutil
import subprocess

import numpy as np

GOODPUT = 1448 / 1514
STATE_DIR = "/run/allreduce-lab"
DEFAULT_TAG = "arlab"
DEFAULT_SUBNET = "10.231.47.0/24"
_UNSHAPED = "10gbit"


class LabError(RuntimeError):
    """The lab cannot be built or used here (a clear, single-line reason)."""


def names(tag, k):
    """The names a lab of ``k`` namespaces with ``tag`` uses: namespaces, bridge, host veths, inner veths."""
    return {"netns": [f"{tag}-ns{i}" for i in range(k)], "bridge": f"{tag}-br",
            "host_veths": [f"{tag}-h{i}" for i in range(k)], "veths": [f"{tag}-v{i}" for i in range(k)]}


def requirements():
    """None when this process can build a lab, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces, veths, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the network lab needs iproute2: '{tool}' is not on PATH (apt-get install iproute2)"
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


def _taken(tag, k, subnet):
    """What is already in use among this lab's names and subnet."""
    planned = names(tag, k)
    existing_ns = set(_run(["ip", "netns", "list"]).stdout.split())
    existing_links = {line.split(":")[1].strip().split("@")[0]
                      for line in _run(["ip", "-o", "link", "show"]).stdout.splitlines() if ":" in line}
    taken = [n for n in planned["netns"] if n in existing_ns]
    taken += [n for n in [planned["bridge"], *planned["host_veths"]] if n in existing_links]
    if os.path.exists(_state_path(tag)):
        taken.append(f"state file {_state_path(tag)} (a lab with tag {tag!r} is up; 'down' it first)")
    network = ipaddress.ip_network(subnet)
    for line in _run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
        address = ipaddress.ip_interface(line.split()[3])
        if address.network.overlaps(network):
            taken.append(f"subnet {subnet} (already on {line.split()[1]})")
    return taken


class Lab:
    """A lab that is up: its size, names, addresses and the configured rates (Mbit/s)."""

    def __init__(self, tag, rates_mbit, subnet):
        self.tag = tag
        self.rates = np.asarray(rates_mbit, dtype=float)
        self.k = len(self.rates)
        self.subnet = subnet
        self.names = names(tag, self.k)
        hosts = list(ipaddress.ip_network(subnet).hosts())
        self.addresses = [str(hosts[i]) for i in range(self.k)]

    def netns(self, i):
        return self.names["netns"][i]

    def veth(self, i):
        return self.names["veths"][i]

    def class_id(self, j):
        """The HTB class (``1:<hex>``) that carries traffic to namespace j."""
        return f"1:{j + 16:x}"

    def class_bytes(self):
        """Bytes each shaped class has sent: a K x K matrix (i -> j), from ``tc -s class show``."""
        sent = np.zeros((self.k, self.k), dtype=np.int64)
        ids = {self.class_id(j): j for j in range(self.k)}
        for i in range(self.k):
            out = _run(["ip", "netns", "exec", self.netns(i), "tc", "-s", "class", "show", "dev", self.veth(i)]).stdout
            for block in out.split("class htb ")[1:]:
                j = ids.get(block.split()[0])
                match = re.search(r"Sent (\d+) bytes", block)
                if j is not None and match:
                    sent[i, j] = int(match.group(1))
        return sent


def validate_rates(rates_mbit):
    """A K x K matrix of positive finite rates in Mbit/s (diagonal ignored), K >= 2."""
    rates = np.asarray(rates_mbit, dtype=float)
    if rates.ndim != 2 or rates.shape[0] != rates.shape[1] or rates.shape[0] < 2:
        raise LabError(f"the rate matrix must be K x K with K >= 2, got shape {rates.shape}")
    off = ~np.eye(len(rates), dtype=bool)
    if not np.all(np.isfinite(rates[off])) or np.any(rates[off] <= 0):
        raise LabError("every off-diagonal rate must be a positive number of Mbit/s")
    if len(rates) > 64:
        raise LabError(f"{len(rates)} namespaces: at most 64")
    return rates


def up(rates_mbit, tag=DEFAULT_TAG, subnet=DEFAULT_SUBNET, owner=None):
    """Build the lab; returns a :class:`Lab`. On any failure, what was built is torn down.
    ``owner`` (any string) is recorded, so that ``down(tag, owner)`` leaves other owners' labs alone."""
    reason = requirements()
    if reason:
        raise LabError(reason)
    _validate_tag(tag)
    rates = validate_rates(rates_mbit)
    k = len(rates)
    taken = _taken(tag, k, subnet)
    if taken:
        raise LabError("refusing to start, already in use: " + ", ".join(taken))
    lab = Lab(tag, rates, subnet)
    os.makedirs(STATE_DIR, exist_ok=True)
    created = {"tag": tag, "owner": owner, "subnet": subnet, "rates_mbit": rates.tolist(), "netns": [], "links": []}

    def record(kind, name):
        created[kind].append(name)
        tmp = _state_path(tag) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(created, f)
        os.replace(tmp, _state_path(tag))

    try:
        bridge = lab.names["bridge"]
        _run(["ip", "link", "add", bridge, "type", "bridge"])
        record("links", bridge)
        _run(["ip", "link", "set", bridge, "up"])
        prefix = ipaddress.ip_network(subnet).prefixlen
        for i in range(k):
            ns, host, inner = lab.netns(i), lab.names["host_veths"][i], lab.veth(i)
            _run(["ip", "netns", "add", ns])
            record("netns", ns)
            _run(["ip", "link", "add", host, "type", "veth", "peer", "name", inner, "netns", ns])
            record("links", host)
            _run(["ip", "link", "set", host, "master", bridge])
            _run(["ip", "link", "set", host, "up"])
            commands = ["link set lo up", f"link set {inner} up", f"addr add {lab.addresses[i]}/{prefix} dev {inner}"]
            _run(["ip", "-n", ns, "-batch", "-"], stdin="\n".join(commands) + "\n")
            # a pipelined collective leaves a link idle between segments: keep TCP's window then
            _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0"])
            _run(["ip", "netns", "exec", ns, "tc", "-batch", "-"], stdin=_shaping(lab, i))
        return lab
    except BaseException:
        down(tag, owner)
        raise


def _shaping(lab, i):
    """tc batch commands: HTB on namespace i's veth, one class and u32 filter per destination."""
    dev = lab.veth(i)
    lines = [f"qdisc add dev {dev} root handle 1: htb default 1",
             f"class add dev {dev} parent 1: classid 1:1 htb rate {_UNSHAPED} ceil {_UNSHAPED}",
             # pure TCP ACKs (20-byte IP header, length < 64, flags ACK only) skip the shaped queues:
             # behind a full queue they would throttle the opposite direction of the same pair
             f"filter add dev {dev} parent 1: protocol ip prio 0 u32 match ip protocol 6 0xff "
             "match u8 0x05 0x0f at 0 match u16 0x0000 0xffc0 at 2 match u8 0x10 0xff at 33 flowid 1:1"]
    for j in range(lab.k):
        if j == i:
            continue
        rate = f"{lab.rates[i, j]:g}mbit"
        lines.append(f"class add dev {dev} parent 1: classid {lab.class_id(j)} htb rate {rate} ceil {rate}")
        lines.append(f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dst "
                     f"{lab.addresses[j]}/32 flowid {lab.class_id(j)}")
    return "\n".join(lines) + "\n"


def down(tag=DEFAULT_TAG, owner=None):
    """Delete exactly what the state file of ``tag`` records (namespaces first: their veths
    go with them), then the file. Returns the names removed; a missing state file is a no-op,
    and so is a lab that ``owner`` (when given) did not build."""
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
    return Lab(tag, created["rates_mbit"], created["subnet"])


def mpmd_command(lab, mpiexec, argv, ranks=None):
    """An ``mpiexec`` MPMD command line: rank i runs ``argv`` inside namespace i with its veth as
    the libfabric TCP interface. Set :func:`mpi_environment` in the launcher's environment."""
    command = [mpiexec]
    for i in range(lab.k if ranks is None else ranks):
        if i:
            command.append(":")
        command += ["-n", "1", "ip", "netns", "exec", lab.netns(i), "env", f"FI_TCP_IFACE={lab.veth(i)}", *argv]
    return command


def mpi_environment():
    """MPICH over libfabric TCP and never shared memory, so every byte crosses the shaped veths."""
    return {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
