"""What a result was measured on: machine, MPI library, commit, the settings that matter."""

import os
import platform
import socket
import subprocess

import numpy
from mpi4py import MPI

from algorithms.ops import kernels
from algorithms.transports.pages import thp_mode
from topology.ending import thread_level_name
from topology.probe import node_numbers
from topology.shm import free_bytes, mib, total_bytes


def relevant_env():
    """The settings that change what is measured (malloc tuning, transport, MPICH and UCX knobs)."""
    names = sorted(k for k in os.environ if k.startswith(("MALLOC_", "ALLREDUCE_", "MPIR_CVAR_", "UCX_", "OMP_")))
    return " ".join(f"{k}={os.environ[k]}" for k in names) or "(none set)"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def shm_text():
    """``/dev/shm``'s size and free space ("64.0 MiB, 52.3 MiB free"), or "none"."""
    total = total_bytes()
    return "none" if total is None else f"{mib(total)}, {mib(free_bytes() or 0)} free"


def describe():
    """A dict for results files: host, CPU, cores, Python, MPI library, commit, the settings
    that matter (environment; transparent huge pages, which set the speed of MPI's kernel copy:
    `algorithms.transports.pages`; the size of /dev/shm, which holds the shared windows; the kernel
    that reduces each dtype on the CPU: `algorithms.ops.kernels`)."""
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
        "thread_level": thread_level_name(),  # what MPI_Init gave: MPI_THREAD_SINGLE, or more where a tool asked
        "commit": commit(),
        "env": relevant_env(),
        "transparent_hugepages": thp_mode(),
        "dev_shm": shm_text(),
        "kernels": kernels(),
    }


def oversubscription(comm):
    """"R ranks on C cores of HOST" for the first node whose ranks outnumber the cores they may
    run on (the union of their CPU affinities), else None; the same on every rank (collective).
    Timings from such a node measure the operating system's scheduler, not the algorithms."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        cores = set().union(*node.allgather(os.sched_getaffinity(0)))
        ranks = node.Get_size()
    finally:
        node.Free()
    found = comm.allgather(f"{ranks} ranks on {len(cores)} cores of {socket.gethostname()}"
                           if ranks > len(cores) else None)
    return next((text for text in found if text), None)


def tuning_path(comm):
    """Where ``python -m bench tune`` writes the tuning table of ``comm`` by default:
    ``results/tuning-<host>-<N>r.json`` (``<host>-<K>nodes`` when the ranks span K nodes; collective)."""
    nodes = len(set(node_numbers(comm)))
    host = socket.gethostname() if nodes == 1 else f"{socket.gethostname()}-{nodes}nodes"
    return os.path.join("results", f"tuning-{host}-{comm.Get_size()}r.json")
