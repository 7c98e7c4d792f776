"""What one rank can see of itself, gathered before any check: its host and kernel, the
variables that steer the libraries, the CPUs it may run on and their cores and NUMA nodes,
the network interfaces of its namespace, ``/dev/shm``, transparent huge pages, the CPU
frequency governor and the GPUs ``nvidia-smi`` lists. Plain data, the same shape on every
rank, read from ``/proc``, ``/sys``, ``ip -j addr`` and ``nvidia-smi``; a figure that cannot be
read is None."""

import contextlib
import glob
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import threading
import time

from algorithms.runtime.transports.pages import thp_mode
from plumbing.launcher import local_rank
from plumbing.shm import free_bytes, total_bytes
from topology.machine import affinity, boot_id

#: the variables the checks read: every one of these prefixes, and these names
PREFIXES = ("NCCL_", "MPIR_CVAR_", "FI_", "OMPI_MCA_", "UCX_", "ALLREDUCE_", "I_MPI_")
NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")
SYS_CPU = "/sys/devices/system/cpu"
SYS_NODE = "/sys/devices/system/node"
SYS_NET = "/sys/class/net"
SYS_IB = "/sys/class/infiniband"


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_list(text):
    """The CPUs of a kernel list ("0-3,8,10-11")."""
    found = set()
    for part in (text or "").split(","):
        if part.strip():
            low, _, high = part.strip().partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return sorted(found)


def steering_env(env=os.environ):
    return {k: v for k, v in sorted(env.items()) if k.startswith(PREFIXES) or k in NAMES}


def cores():
    """{cpu: the CPUs of its core (its hyperthread siblings)} for every online CPU."""
    found = {}
    for cpu in cpu_list(read(f"{SYS_CPU}/online")) or range(os.cpu_count() or 1):
        siblings = cpu_list(read(f"{SYS_CPU}/cpu{cpu}/topology/thread_siblings_list"))
        found[cpu] = siblings or [cpu]
    return found


def numa_nodes():
    """{numa node: its CPUs} ({} where the kernel shows none)."""
    found = {}
    for path in sorted(glob.glob(f"{SYS_NODE}/node[0-9]*")):
        found[int(os.path.basename(path)[4:])] = cpu_list(read(f"{path}/cpulist"))
    return found


def _number(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def interfaces():
    """Each network interface of this namespace: name, state, speed (Mbit/s; None where the
    driver gives none), NUMA node of its PCI device (None for a virtual one), IPv4 addresses
    with their prefix length, and whether it is physical; plus the RDMA devices' ports."""
    addresses = {}
    if shutil.which("ip"):
        done = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True)
        try:
            for entry in json.loads(done.stdout or "[]"):
                addresses[entry["ifname"]] = [f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", [])]
        except (ValueError, KeyError):
            addresses = {}
    found = []
    for path in sorted(glob.glob(f"{SYS_NET}/*")):
        name = os.path.basename(path)
        speed = _number(read(f"{path}/speed"))
        found.append({"name": name, "state": read(f"{path}/operstate"), "speed_mbit": speed if speed and speed > 0 else None,
                      "numa_node": _number(read(f"{path}/device/numa_node")), "physical": os.path.exists(f"{path}/device"),
                      "loopback": name == "lo", "addresses": addresses.get(name, [])})
    for port in sorted(glob.glob(f"{SYS_IB}/*/ports/*")):
        device = port.split("/")[-3]
        rate = read(f"{port}/rate") or ""  # "100 Gb/sec (4X EDR)"
        gbit = _number(rate.split()[0]) if rate.split() else None
        found.append({"name": f"{device}/{os.path.basename(port)}", "state": (read(f"{port}/state") or "").split(":")[-1].strip().lower(),
                      "speed_mbit": gbit * 1000 if gbit else None, "numa_node": _number(read(f"{SYS_IB}/{device}/device/numa_node")),
                      "physical": True, "loopback": False, "addresses": [], "rdma": True})
    return found


def counters():
    """Bytes each interface has sent and received so far: {name: [tx, rx]} (RDMA ports' data
    counters are in 4-byte words)."""
    found = {}
    for path in glob.glob(f"{SYS_NET}/*"):
        tx, rx = (_number(read(f"{path}/statistics/{d}_bytes")) for d in ("tx", "rx"))
        if tx is not None and rx is not None:
            found[os.path.basename(path)] = [tx, rx]
    for port in glob.glob(f"{SYS_IB}/*/ports/*"):
        tx, rx = (_number(read(f"{port}/counters/port_{d}_data")) for d in ("xmit", "rcv"))
        if tx is not None and rx is not None:
            found[f"{port.split('/')[-3]}/{os.path.basename(port)}"] = [4 * tx, 4 * rx]
    return found


def governors(cpus):
    """{cpu: its frequency governor} of ``cpus`` where cpufreq shows one."""
    return {cpu: g for cpu in cpus if (g := read(f"{SYS_CPU}/cpu{cpu}/cpufreq/scaling_governor"))}


GPU_FIELDS = ("index", "pci.bus_id", "persistence_mode", "clocks_event_reasons.active", "pcie.link.gen.current",
              "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max")


def gpus():
    """The GPUs ``nvidia-smi`` lists, each a dict of :data:`GPU_FIELDS` and the NUMA node of its
    PCI device, or None where there is no ``nvidia-smi`` (or it fails: no driver, no GPU)."""
    if shutil.which("nvidia-smi") is None:
        return None
    with busy_gpu():  # an idle GPU lowers its PCIe generation to save power: read it copying
        rows = _query()
    if rows is None:
        return None
    found = []
    for row in rows:
        gpu = dict(zip(GPU_FIELDS, row))
        bus = gpu.get("pci.bus_id", "").lower()
        bus = bus[-12:] if len(bus) > 12 else bus  # 00000000:3B:00.0 -> 0000:3b:00.0
        gpu["numa_node"] = _number(read(f"/sys/bus/pci/devices/{bus}/numa_node"))
        found.append(gpu)
    return found


def _query():
    for fields in (GPU_FIELDS, tuple(f.replace("clocks_event", "clocks_throttle") for f in GPU_FIELDS)):
        done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True)
        if done.returncode == 0:
            return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    return None


@contextlib.contextmanager
def busy_gpu(nbytes=64 << 20):
    """Copies between pinned host memory and this rank's current GPU (CuPy) in a thread while
    the body runs; nothing where CuPy is not installed or finds no GPU."""
    stop = threading.Event()

    def copy():
        try:
            import cupy
            host = cupy.cuda.alloc_pinned_memory(nbytes)
            device = cupy.empty(nbytes, dtype=cupy.uint8)
            while not stop.is_set():
                device.data.copy_from_host(host.ptr, nbytes)
                cupy.cuda.Device().synchronize()
        except Exception:  # no GPU, no driver: the query then reads the idle link
            return

    worker = None
    if importlib.util.find_spec("cupy") is not None:
        worker = threading.Thread(target=copy, daemon=True)
        worker.start()
        time.sleep(0.2)
    try:
        yield
    finally:
        stop.set()
        if worker is not None:
            worker.join(timeout=10)


def peer_access():
    """``nvidia-smi topo -p2p r``: {(i, j): "OK" or why not} between the GPUs, or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", "topo", "-p2p", "r"], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    found = {}
    for line in done.stdout.splitlines():
        cells = line.split()
        if cells and cells[0].startswith("GPU") and cells[0][3:].isdigit():
            i = int(cells[0][3:])
            for j, cell in enumerate(cells[1:]):
                if cell != "X" and i != j:
                    found[f"{i},{j}"] = cell
    return found


def gather():
    """This rank's facts (the module docstring), a dict of plain values."""
    cpus = affinity()
    return {
        "host": socket.gethostname(), "kernel": boot_id(), "local_rank": local_rank(),
        "env": steering_env(), "affinity": cpus, "cores": cores(), "numa": numa_nodes(),
        "interfaces": interfaces(), "shm_total": total_bytes(), "shm_free": free_bytes(), "thp": thp_mode(),
        "governors": governors(cpus), "torch": importlib.util.find_spec("torch") is not None,
        # the node's GPUs, read once a node (its first local rank; the others take them from it)
        "gpus": gpus() if local_rank() == 0 else None, "peer_access": peer_access() if local_rank() == 0 else None,
    }


class Job:
    """Every rank's facts, with the nodes (ranks of one host name on one running kernel) and
    the machines (ranks on one running kernel: the network lab's nodes share one, and its cores)."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.nodes = self._groups(lambda f: (f["kernel"], f["host"]))
        self.machines = self._groups(lambda f: f["kernel"])
        for node in self.nodes:  # what the node's first local rank read of its GPUs
            reader = next((r for r in node if ranks[r]["local_rank"] == 0), node[0])
            for rank in node:
                ranks[rank].update(gpus=ranks[reader]["gpus"], peer_access=ranks[reader]["peer_access"])

    def _groups(self, key):
        found = {}
        for rank, f in enumerate(self.ranks):
            found.setdefault(key(f), []).append(rank)
        return list(found.values())

    def node_of(self, rank):
        return next(group for group in self.nodes if rank in group)

    def hosts(self, ranks):
        """The host names of ``ranks``, in rank order, each once."""
        return list(dict.fromkeys(self.ranks[r]["host"] for r in ranks))

    def env(self, rank, name):
        return self.ranks[rank]["env"].get(name)
